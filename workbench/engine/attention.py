"""Attention over a KV cache that is split by position blocks between workers.

Each worker owns every W-th block of `BLOCK` positions (round robin), stored in
memory that the worker itself touched first, so its attention reads stay on
its own node whatever the context length. Keys are kept as [kv_head, slot, dim]
and values transposed as [kv_head, dim, slot], both f16, so both products are
the F16 matrix kernels (queries and probabilities rounded to f16 on the way in,
f32 accumulation), which is llama.cpp's non-flash attention, numerically.

Two passes make the result independent of the number of workers:
1. each worker: scores over its slots, then its max and sum of exps per query;
2. global max M and sum L are merged; each worker multiplies
   f16(exp(s - M) / L) by its values; the partial outputs are summed.
A prompt over a one-owner cache (one node) needs no merge: each piece of query
rows runs its scores, softmax and values in one pass (`ONE_PASS_PROMPT`), with
each row's numbers those of the two passes.
"""

from __future__ import annotations

import math
import threading

import numba as nb
import numpy as np

from typing import Callable

from . import handoff, kernels
from .crew import (C_HI, C_SPAN, C_TASK, CHUNK_ARGS, CHUNK_FIELDS, CHUNK_FN, T_FN, T_FULLROWS, T_N0, T_NCOL,
                   T_OSTRIDE, T_OUTADDR, T_OUTROW, T_ROWLEN, T_X0, T_XLEN, T_XOFF, T_XROW, TASK_FIELDS, CrewError,
                   Job, address, array_at, compiled_address)
# the cache owns its slot layout; slot_position and store_f16 are used by the compiled kernels here
from .kv_cache import BLOCK, KVCache, filled_slots, owner_slots, slot_position, store_f16  # noqa: F401
from .ops import ggml_expf, softmax_group_sum
from .kernels.activations import empty_aligned
from .kernels.intrinsics.scalars import round_f16
from .kernels.llama_build import SOFTMAX_LANES

F16 = kernels.F16  # its type id (kernels.type_ids)

from .kernels.jitcache import JIT as _JIT
# a max reduction LLVM vectorizes only without NaNs and signed zeros (`_scale_max`)
_JIT_MAX = dict(_JIT, fastmath={"nnan", "nsz"})


@nb.njit(**_JIT)
def softmax_stats(scores: np.ndarray, w: int, n_workers: int, n_slots: int, pos0: int, group: int,
                  window: int, scale: float, mx: np.ndarray, sm: np.ndarray, row0: int) -> None:
    """scores [n_kv, rows, >=n_slots] raw dots -> scaled, masked (-inf); per row max and sum of exps.

    Row r here is query row row0 + r of its kv head, which holds query token (row0 + r) // group. A key at position g is visible
    from query position p when g <= p and (window == 0 or p - g < window).
    """
    n_kv, rows, _ = scores.shape
    sc = np.float32(scale)
    lanes = SOFTMAX_LANES
    n16 = -(-n_slots // lanes) * lanes
    ex = np.zeros(n16, dtype=np.float32)  # exps of one row, zero-padded to whole groups of lanes
    row = np.empty(n_slots, dtype=np.float32)  # one row, contiguous (scores may be a strided view)
    for h in range(n_kv):
        for r in range(rows):
            p = pos0 + (row0 + r) // group
            if n_workers == 1:
                # one owner: slot j holds position j, the visible keys are the slots [lo, hi):
                # the rest masked without a test per slot, the visible ones scaled and their
                # max taken in a vectorized loop (`_scale_max`)
                lo = min(max(p - window + 1, 0), n_slots) if window > 0 else 0
                hi = max(min(p + 1, n_slots), lo)
                for j in range(lo):
                    scores[h, r, j] = -np.inf
                    row[j] = -np.inf
                for j in range(hi, n_slots):
                    scores[h, r, j] = -np.inf
                    row[j] = -np.inf
                m = _scale_max(scores[h, r], row, lo, hi, sc)
            else:
                lo, hi = n_slots, 0
                m = np.float32(-np.inf)
                for j in range(n_slots):
                    g = slot_position(j, w, n_workers)
                    v = np.float32(-np.inf)
                    if g <= p and (window <= 0 or p - g < window):
                        v = scores[h, r, j] * sc
                        if v > m:
                            m = v
                        lo = min(lo, j)
                        hi = j + 1
                    scores[h, r, j] = v
                    row[j] = v
            # as ggml_vec_soft_max_f32: exps (ggml_v_expf) of 16 (AVX2 build: 8) positions at a
            # time (a block of slots holds whole aligned groups of them) summed in float32 by the
            # build's tree (_mm512_reduce_add_ps or the 256-bit one), each group sum added in float64;
            # the exps of the visible slots only (a masked slot's is 0: causal rows mask half)
            s = 0.0
            if m > -np.inf:
                ex[:lo] = 0.0
                ex[hi:] = 0.0
                _exps(row[lo:hi], hi - lo, m, ex[lo:hi])
                for j0 in range(0, n16, lanes):
                    s += np.float64(softmax_group_sum(ex, j0))
            mx[h, r] = m
            sm[h, r] = s


@nb.njit(**_JIT_MAX)
def _scale_max(scores: np.ndarray, row: np.ndarray, lo: int, hi: int, sc: np.float32) -> np.float32:
    """scores[j] *= sc (also into row) for j in [lo, hi), and their max (-inf: none). The max of
    finite scores whatever the order of comparisons (the flags let LLVM vectorize the reduction;
    the sign of a zero max does not change x - max)."""
    m = np.float32(-np.inf)
    for j in range(lo, hi):
        v = scores[j] * sc
        scores[j] = v
        row[j] = v
        m = v if v > m else m
    return m


@nb.njit(**_JIT)
def _exps(v: np.ndarray, n: int, m: np.float32, out: np.ndarray) -> None:
    """out[j] = exp(v[j] - m) for j < n (masked -inf: 0).

    A select-only loop in a function of its own: LLVM vectorizes it here, not when inlined in
    the callers' loop nests."""
    for j in range(n):
        x = v[j]
        e = ggml_expf(x - m)
        out[j] = e if x > -np.inf else np.float32(0.0)


@nb.njit(**_JIT)
def merge_stats(mxs: np.ndarray, sms: np.ndarray, big_m: np.ndarray, inv_l: np.ndarray) -> None:
    """Per-worker max/sum [W, n_kv, rows] -> global max and 1/sum."""
    n_w, n_kv, rows = mxs.shape
    for h in range(n_kv):
        for r in range(rows):
            m = np.float32(-np.inf)
            for w in range(n_w):
                if mxs[w, h, r] > m:
                    m = mxs[w, h, r]
            s = 0.0
            for w in range(n_w):
                mw = mxs[w, h, r]
                if mw == m:
                    s += sms[w, h, r]
                elif mw > -np.inf:
                    s += sms[w, h, r] * math.exp(np.float64(mw) - np.float64(m))
            big_m[h, r] = m
            inv_l[h, r] = np.float32(1.0 / s) if s > 0 else np.float32(0.0)


@nb.njit(**_JIT)
def probabilities(scores: np.ndarray, n_slots: int, width: int, big_m: np.ndarray, inv_l: np.ndarray) -> np.ndarray:
    """exp(s - M) * (1/L) as float32 [n_kv, rows, width] (masked slots and slots >= n_slots give 0)."""
    n_kv, rows, _ = scores.shape
    out = np.zeros((n_kv, rows, width), dtype=np.float32)
    row = np.empty(n_slots, dtype=np.float32)  # one row, contiguous (scores may be a strided view)
    for h in range(n_kv):
        for r in range(rows):
            m = big_m[h, r]
            il = inv_l[h, r]
            o = out[h, r]
            for j in range(n_slots):  # (a slice copy would compile a shape check's message: 3.6 s)
                row[j] = scores[h, r, j]
            _probs(row, n_slots, m, il, o)
    return out


@nb.njit(**_JIT)
def _probs(v: np.ndarray, n: int, m: np.float32, il: np.float32, out: np.ndarray) -> None:
    """out[j] = exp(v[j] - m) * il for j < n (masked -inf: 0); vectorizes like _exps."""
    for j in range(n):
        s = v[j]
        e = ggml_expf(s - m) * il
        out[j] = np.float32(0.0) if s == -np.inf else e


@nb.njit(**_JIT)
def _scale_probs(e: np.ndarray, n: int, il: np.float32) -> None:
    """e[j] = f16(e[j] * il) for j < n: an exp to its probability rounded to f16 (a loop of its own,
    which LLVM vectorizes)."""
    for j in range(n):
        e[j] = round_f16(e[j] * il)


@nb.njit(**_JIT)
def _owner_row_probs(v: np.ndarray, row: np.ndarray, e: np.ndarray, n_slots: int, n16: int, pos0: int, window: int,
                     sc: np.float32) -> None:
    """One query row of `one_owner_probs`: its raw dots v (>= n_slots) -> e (f16-rounded
    probabilities, 0 past n_slots and where masked); row: n_slots scratch (may be v itself)."""
    lo = min(max(pos0 - window + 1, 0), n_slots) if window > 0 else 0
    hi = max(min(pos0 + 1, n_slots), lo)
    m = _scale_max(v, row, lo, hi, sc)
    for j in range(lo):
        e[j] = 0.0
    for j in range(hi, e.shape[0]):
        e[j] = 0.0
    s = 0.0
    if m > -np.inf:
        _exps(row[lo:hi], hi - lo, m, e[lo:hi])
        for j0 in range(0, n16, SOFTMAX_LANES):
            s += np.float64(softmax_group_sum(e, j0))
    il = np.float32(1.0 / s) if s > 0 else np.float32(0.0)
    _scale_probs(e, hi, il)


@nb.njit(**_JIT)
def one_owner_probs(scores: np.ndarray, n_slots: int, width: int, pos0: int, window: int,
                    scale: float) -> np.ndarray:
    """A decoded token's f16 probabilities over a one-owner cache: scores [n_kv, rows, >=n_slots]
    (raw dots of the query rows of position pos0, slots counted from the caller's base) -> float32
    [n_kv * rows, width] on a 64-byte line (0 past n_slots and where masked).

    The numbers of `softmax_stats`, `merge_stats` (one owner: the row's own max and 1/sum),
    `probabilities` and `round_to_f16`, called one after another, to the bit, in one pass over a
    row: each exp computed once (`probabilities` computed them again from the scores), kept in
    the output row, then scaled and rounded in place. At depth 4096 on V3's attention widths
    (16 heads) those four took ~210 us a layer on the caller alone while the workers waited."""
    n_kv, rows, _ = scores.shape
    sc = np.float32(scale)
    n16 = -(-n_slots // SOFTMAX_LANES) * SOFTMAX_LANES
    out = empty_aligned(n_kv * rows, max(width, n16))
    row = np.empty(n_slots, dtype=np.float32)   # one row's scaled scores, contiguous
    for h in range(n_kv):
        for r in range(rows):
            _owner_row_probs(scores[h, r], row, out[h * rows + r], n_slots, n16, pos0, window, sc)
    return _width(out, width)


@nb.njit(**_JIT)
def _width(out: np.ndarray, width: int) -> np.ndarray:
    """out's first `width` columns on 64-byte lines (out itself when that is all of it)."""
    if out.shape[1] == width:
        return out
    probs = empty_aligned(out.shape[0], width)   # a cache whose capacity is no multiple of the lanes
    for i in range(out.shape[0]):
        for j in range(width):
            probs[i, j] = out[i, j]
    return probs


@nb.njit(**_JIT)
def prompt_rows_probs(scores: np.ndarray, probs: np.ndarray, n_slots: int, rows: int, pos0: int, row0: int,
                      group: int, window: int, scale: float) -> None:
    """A prompt piece's f16 probabilities over a one-owner cache: scores [n_kv, >= rows, >= n_slots]
    (raw dots of query rows row0.., row r holding token (row0 + r) // group at pos0 + that) ->
    probs [n_kv, >= rows, >= n16] (0 past n_slots and where masked). Each row by `_owner_row_probs`,
    the numbers of `softmax_stats`, `merge_stats`, `probabilities` and `round_to_f16` to the bit
    (one owner), in one pass over the row; the scores are overwritten."""
    sc = np.float32(scale)
    n16 = -(-n_slots // SOFTMAX_LANES) * SOFTMAX_LANES
    for h in range(scores.shape[0]):
        for r in range(rows):
            v = scores[h, r]
            _owner_row_probs(v, v, probs[h, r, :n16], n_slots, n16, pos0 + (row0 + r) // group, window, sc)


# A decoded token's softmax over a one-owner cache runs between its scores job and its values job,
# on the caller alone while the workers wait: on the R1 shape (8 query rows over one latent row a
# position) at depth 8192 and 2 threads, 280-300 us a block between a 350-372 us scores job and a
# 168-172 us values job (`crew_timeline --depth 8192 --jobs`, AMD EPYC Zen 4), 61 blocks. From
# PROBS_JOB_MIN scores on, the rows go to the crew as a job of their own (`probs_chunk`: each row
# whole on one worker, `_owner_row_probs` as the caller computes it, so the same bits; ggml's
# soft_max shares its rows out between threads the same way).
PROBS_JOB_MIN = 32768


@nb.njit(**_JIT)
def probs_chunk(tasks, t, span, lo, hi):
    """The crew's chunk function for a softmax job (`owner_probs_job`): task u is query row u, its
    dots at T_X0 (T_N0 of them, from the caller's base), its probabilities to T_OUTADDR (T_ROWLEN
    floats), the position T_NCOL, the window T_OSTRIDE, the f32 scale at address T_FULLROWS."""
    for u in range(t, t + span):
        n_slots = tasks[u, T_N0]
        v = array_at(tasks[u, T_X0], n_slots, np.float32)
        e = array_at(tasks[u, T_OUTADDR], tasks[u, T_ROWLEN], np.float32)
        sc = array_at(tasks[u, T_FULLROWS], 1, np.float32)[0]
        n16 = -(-n_slots // SOFTMAX_LANES) * SOFTMAX_LANES
        _owner_row_probs(v, v, e, n_slots, n16, tasks[u, T_NCOL], tasks[u, T_OSTRIDE], sc)


_PROBS_FN: list[int] = []


def probs_chunk_address() -> int:
    """`probs_chunk`'s compiled address (this process's: kept in the keys job's first task, never
    in compiled code, which the disk cache would carry to another process)."""
    if not _PROBS_FN:
        _PROBS_FN.append(compiled_address(probs_chunk, CHUNK_ARGS))
    return _PROBS_FN[0]


@nb.njit(**_JIT)
def owner_probs_job(n_rows: int, base: int, n_slots: int, width: int, pos0: int, window: int, scale_at: int):
    """The task and chunk tables of a softmax job over n_rows query rows (`probs_chunk`): row u
    reads input row u from element `base` on (n_slots of them), writes output row u (`width`
    floats); one shared chunk a row."""
    tasks = np.zeros((n_rows, TASK_FIELDS), dtype=np.int64)
    chunks = np.zeros((n_rows, CHUNK_FIELDS), dtype=np.int64)
    for u in range(n_rows):
        tasks[u, T_ROWLEN] = width
        tasks[u, T_XROW] = u
        tasks[u, T_OUTROW] = u
        tasks[u, T_XOFF] = base
        tasks[u, T_XLEN] = n_slots
        tasks[u, T_NCOL] = pos0
        tasks[u, T_OSTRIDE] = window
        tasks[u, T_FULLROWS] = scale_at
        chunks[u, C_TASK] = u
        chunks[u, C_HI] = 1
        chunks[u, C_SPAN] = 1
    return tasks, chunks


_DECODERS: dict = {}


def one_token_attention(lead):
    """The whole one-token attention of one layer over a one-owner cache, compiled around the
    crew's `lead` (crew.py): store k/v, queries to f16, scores as a crew job, softmax, merged
    max/sum, probabilities to f16, weighted values as a crew job. The same functions in the same
    order as `Runtime.attention`'s general path, in one call instead of some twenty."""
    fn = _DECODERS.get(lead)
    if fn is not None:
        return fn
    from .kernels.activations import round_to_f16

    @nb.njit(**_JIT)
    def attend(ctl, n_workers, keys_job, values_job, q, k, v, kc, vc, pos0, window, scale, lo, base, cap):
        """q [n_head, hd], k/v [n_kv, hd] of the token at pos0 -> (out [n_head, hdv], crew ok); keys
        from slot lo (window), softmax and probabilities from slot base (lo's 64-slot boundary)."""
        n_head, hd = q.shape
        n_kv = kc.shape[0]
        hdv = vc.shape[1]
        rows = n_head // n_kv
        store_f16(kc, vc, k.reshape(1, n_kv, hd), v.reshape(1, n_kv, v.shape[1]), pos0)
        ns = pos0 + 1
        xq = round_to_f16(q)
        scores = np.empty((n_kv, rows, ns), dtype=np.float32)
        kt, kch, kown = keys_job
        ok = lead(ctl, n_workers, kt, kch, kown, (xq,), (xq,), (scores.reshape(n_kv * rows, ns),), lo, ns, 0)
        kp = min(-(-ns // 64) * 64, cap)
        pfn = kt[0, T_FN]   # `probs_chunk`'s address, when the job tables carry it
        if pfn != 0 and n_workers > 1 and n_kv * rows * (ns - base) >= PROBS_JOB_MIN:
            n_slots = ns - base
            n16 = -(-n_slots // SOFTMAX_LANES) * SOFTMAX_LANES
            xw = empty_aligned(n_kv * rows, max(kp - base, n16))
            sc = np.full(1, scale, dtype=np.float32)
            pt, pc = owner_probs_job(n_kv * rows, base, n_slots, xw.shape[1], pos0 - base, window, address(sc))
            keep = ctl[CHUNK_FN]
            ctl[CHUNK_FN] = pfn
            s2 = scores.reshape(n_kv * rows, ns)
            ok = lead(ctl, n_workers, pt, pc, 0, (s2,), (s2,), (xw,), 0, 1, -1) and ok
            ctl[CHUNK_FN] = keep
            xp = _width(xw, kp - base)
        else:
            xp = one_owner_probs(scores[:, :, base:], ns - base, kp - base, pos0 - base, window, scale)
        out = np.zeros((n_kv * rows, hdv), dtype=np.float32)
        vt, vch, vown = values_job
        ok = lead(ctl, n_workers, vt, vch, vown, (xp,), (xp,), (out,), 0, 1 << 62, 2 * base) and ok
        return out, ok

    _DECODERS[lead] = attend
    return attend


def rows_token_attention(lead):
    """A decode batch's attention, row r its own sequence on its own one-owner cache, compiled
    around the crew's `lead` in two crew jobs a layer: every row's scores as one job and every
    row's weighted values as one job (`combine_row_jobs`: row r's one-token tasks, reading its
    own cache, numbered after the rows before it), each row's softmax between them by
    `one_owner_probs`. Row r's numbers are `one_token_attention`'s for its sequence alone (each
    output is the same kernel call on the same rows); a pass of n rows posted 2 n jobs a layer,
    each a hand-off between the workers that a descheduled one holds up."""
    fn = _DECODERS.get(("rows", lead))
    if fn is not None:
        return fn
    from .crew import NO_LIMIT, T_HI, T_LO, T_WSHIFT, T_XLEN, T_XOFF
    from .kernels.activations import round_to_f16

    @nb.njit(**_JIT)
    def attend(ctl, n_workers, keys_job, values_job, q, k, v, caches, pos0s, window, skip_slid, scale):
        """q [n, n_head, hd], k / v [n, n_kv, hd / hdv]: row r's token at pos0s[r] on caches[r]
        (keys job, values job, keys, values, capacity; its own jobs unused here); keys_job,
        values_job: the rows' jobs combined -> (out [n * n_head, hdv], ok)."""
        n, n_head, hd = q.shape
        n_kv = k.shape[1]
        hdv = v.shape[2]
        rows = n_head // n_kv
        per = n_kv * rows
        starts = np.empty(n, dtype=np.int64)
        bases = np.empty(n, dtype=np.int64)
        kps = np.empty(n, dtype=np.int64)
        width = 1
        wv = 1
        for r in range(n):
            _kj, _vj, kc, vc, cap = caches[r]
            pos0 = pos0s[r]
            store_f16(kc, vc, k[r:r + 1], v[r:r + 1], pos0)
            starts[r] = max(pos0 - window + 1, 0) if window else 0
            bases[r] = starts[r] // 64 * 64 if skip_slid else 0
            kps[r] = min(-(-(pos0 + 1) // 64) * 64, cap)
            width = max(width, pos0 + 1)
            wv = max(wv, kps[r] - bases[r])
        xq = round_to_f16(q.reshape(n * n_head, hd))
        scores = np.empty((n * per, width), dtype=np.float32)
        kt, kch, kown = keys_job
        for r in range(n):
            for t in range(r * per, (r + 1) * per):
                kt[t, T_LO] = starts[r]
                kt[t, T_HI] = pos0s[r] + 1
        ok = lead(ctl, n_workers, kt, kch, kown, (xq,), (xq,), (scores,), 0, -1, -1)
        xp = empty_aligned(n * per, wv)
        vt, vch, vown = values_job
        for r in range(n):
            base = bases[r]
            sc = scores[r * per:(r + 1) * per].reshape(n_kv, rows, width)
            p = one_owner_probs(sc[:, :, base:], pos0s[r] + 1 - base, kps[r] - base, pos0s[r] - base, window, scale)
            m = kps[r] - base
            for i in range(per):
                for j in range(m):
                    xp[r * per + i, j] = p[i, j]
                for j in range(m, wv):
                    xp[r * per + i, j] = 0.0
            for t in range(r * per, (r + 1) * per):
                vt[t, T_LO] = 0
                vt[t, T_HI] = NO_LIMIT
                vt[t, T_WSHIFT] = 2 * base
                vt[t, T_XOFF] = 0
                vt[t, T_XLEN] = m
        out = np.zeros((n * per, hdv), dtype=np.float32)
        ok = lead(ctl, n_workers, vt, vch, vown, (xp,), (xp,), (out,), 0, -1, -1) and ok
        return out, ok

    _DECODERS[("rows", lead)] = attend
    return attend


def combine_row_jobs(jobs: list[tuple[np.ndarray, np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray, int]:
    """One crew job from the one-owner attention jobs (tasks, chunks, n_owned) of a batch's rows
    (`rows_token_attention`): row r's tasks renumbered after the rows before it (their input and
    output rows too), each chunk of the first row's table taken for every row in turn, so the
    filled positions' chunks still come first; the links to a next job (a decoded token's) and
    the write-ahead cleared, as `crew.rows_job` does."""
    from .crew import C_TASK, T_NEXT_C, T_NEXT_NC, T_NEXT_NO, T_NEXT_T, T_OUTROW, T_WA_N, T_XROW
    per = jobs[0][0].shape[0]
    if any(n_owned for _t, _c, n_owned in jobs) or any(t.shape[0] != per for t, _c, _n in jobs):
        raise ValueError("rows of one-owner caches with the same jobs' layout only")
    tasks = np.concatenate([t for t, _c, _n in jobs])
    for r in range(len(jobs)):
        tasks[r * per:(r + 1) * per, T_XROW] += r * per
        tasks[r * per:(r + 1) * per, T_OUTROW] += r * per
    tasks[:, [T_NEXT_T, T_NEXT_C, T_NEXT_NC, T_NEXT_NO, T_WA_N]] = 0
    first = jobs[0][1]
    chunks = np.repeat(first, len(jobs), axis=0)
    chunks[:, C_TASK] += np.tile(np.arange(len(jobs), dtype=np.int64) * per, first.shape[0])
    return tasks, chunks, 0


def owners_token_attention(lead):
    """One token over a cache split between several owners (one per node), compiled around the
    crew's `lead` like `one_token_attention`: each owner's scores and weighted values are chunks
    pinned to that owner's workers (they read only their node's part of the cache); softmax
    statistics are merged across owners and the owners' outputs added in order, as in
    `Runtime.attention`'s general path."""
    fn = _DECODERS.get(("owners", lead))
    if fn is not None:
        return fn
    from .crew import T_HI, T_LO, T_WSHIFT, T_XLEN, T_XOFF
    from .kernels.activations import round_to_f16

    @nb.njit(**_JIT)
    def attend(ctl, n_workers, keys_job, values_job, q, k, v, kcs, vcs, pos0, owner, slot, window, scale,
               ns, lo, lo64, cap):
        """q [n_head, hd], k/v [n_kv, hd] of the token at pos0 (stored in `owner`'s `slot`);
        per owner o: ns[o] filled slots, keys from lo[o], values from lo64[o] -> (out, ok)."""
        n_head, hd = q.shape
        no = len(kcs)
        n_kv = kcs[0].shape[0]
        hdv = vcs[0].shape[1]
        rows = n_head // n_kv
        per = n_kv * rows
        store_f16(kcs[owner], vcs[owner], k.reshape(1, n_kv, hd), v.reshape(1, n_kv, hdv), slot)
        xq = round_to_f16(q)
        width = max(ns.max(), 1)
        scores = np.empty((no * per, width), dtype=np.float32)
        kt, kch, kown = keys_job
        for o in range(no):
            for t in range(o * per, (o + 1) * per):
                kt[t, T_LO] = lo[o]
                kt[t, T_HI] = ns[o]
        ok = lead(ctl, n_workers, kt, kch, kown, (xq,), (xq,), (scores,), 0, -1, -1)
        mxs = np.full((no, n_kv, rows), -np.inf, dtype=np.float32)
        sms = np.zeros((no, n_kv, rows), dtype=np.float64)
        for o in range(no):
            if ns[o] > 0:
                sc = scores[o * per:(o + 1) * per].reshape(n_kv, rows, width)
                softmax_stats(sc, o, no, ns[o], pos0, rows, window, scale, mxs[o], sms[o], 0)
        big_m = np.empty((n_kv, rows), dtype=np.float32)
        inv_l = np.empty((n_kv, rows), dtype=np.float32)
        merge_stats(mxs, sms, big_m, inv_l)
        kp_max = min(-(-max(ns.max(), 1) // 64) * 64, cap)
        probs = np.zeros((no * per, kp_max), dtype=np.float32)
        vt, vch, vown = values_job
        for o in range(no):
            if ns[o] == 0:
                continue
            kp = min(-(-ns[o] // 64) * 64, cap)
            sc = scores[o * per:(o + 1) * per].reshape(n_kv, rows, width)
            probs[o * per:(o + 1) * per, :kp] = probabilities(sc, ns[o], kp, big_m, inv_l).reshape(per, kp)
            for t in range(o * per, (o + 1) * per):
                vt[t, T_XOFF] = lo64[o]
                vt[t, T_XLEN] = kp - lo64[o]
                vt[t, T_WSHIFT] = 2 * lo64[o]
        xp = round_to_f16(probs)
        outs = np.zeros((no * per, hdv), dtype=np.float32)
        # owners without filled slots get no value products (their chunks see an empty range)
        for o in range(no):
            hi = NO_ROWS if ns[o] > 0 else 0
            for t in range(o * per, (o + 1) * per):
                vt[t, T_HI] = hi
        ok = lead(ctl, n_workers, vt, vch, vown, (xp,), (xp,), (outs,), 0, -1, -1) and ok
        out = outs[:per].copy()
        for o in range(1, no):
            out += outs[o * per:(o + 1) * per]
        return out, ok

    _DECODERS[("owners", lead)] = attend
    return attend


NO_ROWS = 1 << 62


def owners_attention(lead):
    """`owners_token_attention` with `one_token_attention`'s arguments (kc, vc: the owners' tuples;
    lo: the window's first position, base unused): the owner and slot of pos0 and each owner's
    filled, first and first-value slots are worked out here, as `Runtime._attend_token` does in
    Python, so the compiled token calls run on a cache split between nodes too."""
    fn = _DECODERS.get(("owners args", lead))
    if fn is not None:
        return fn
    inner = owners_token_attention(lead)
    skip = SKIP_SLID_VALUES

    @nb.njit(**_JIT)
    def attend(ctl, n_workers, keys_job, values_job, q, k, v, kcs, vcs, pos0, window, scale, lo, base, cap):
        no = len(kcs)
        blk = pos0 // BLOCK
        owner, slot = blk % no, (blk // no) * BLOCK + pos0 % BLOCK
        ns = np.empty(no, dtype=np.int64)
        los = np.empty(no, dtype=np.int64)
        lo64 = np.zeros(no, dtype=np.int64)
        for o in range(no):
            ns[o] = filled_slots(pos0 + 1, o, no)
            los[o] = filled_slots(lo, o, no)
            if skip:
                lo64[o] = los[o] // 64 * 64
        return inner(ctl, n_workers, keys_job, values_job, q, k, v, kcs, vcs, pos0, owner, slot, window, scale,
                     ns, los, lo64, cap)

    _DECODERS[("owners args", lead)] = attend
    return attend


SKIP_SLID_VALUES = True  # decode: no value products for keys outside the sliding window
SKIP_SLID_PROMPT = True  # the prompt: neither dots nor value products for keys out of a piece's window
CAUSAL_ROWS = 64  # prompt: query rows per attention piece (each piece stops at its last visible key)
# prompt on one worker: rows a piece, CAUSAL_ROWS multiples whose scores take at most this many bytes
# (Gemma 3 270M, one kv head, 512 tokens: 512 rows a piece; Qwen3-MoE's 4 kv heads: 128)
SOLO_PIECE_BYTES = 1 << 20
# a prompt over a one-owner cache: each piece of rows in one pass (scores, softmax, values) in its
# thread's own buffers (`AttentionPaths.attention`); False: the whole prompt's scores first, then
# the values (the path of several owners; the same bits)
ONE_PASS_PROMPT = True
CREW_KEYS = 128  # key positions per chunk of a one-token attention's scores
CREW_DIMS = 32   # value dimensions per chunk of its weighted sum


def token_window(pos0: int, window: int) -> tuple[int, int]:
    """A token at pos0 on a one-owner cache: the first key slot it sees (its window's first
    position), and the slot its softmax, probabilities and values start from (that slot's 64-slot
    boundary, see the general path); on one owner slot j holds position j."""
    start = max(pos0 - window + 1, 0) if window else 0
    return start, (start // 64 * 64 if SKIP_SLID_VALUES else 0)


def values_from(values: np.ndarray, slot: int) -> np.ndarray:
    """V^T rows [dim, slots] (f16 as uint16) seen from `slot` on: the same row stride, the start
    moved by `slot` slots (each row is then read for its first slots only, never past the buffer)."""
    if not slot:
        return values
    return np.lib.stride_tricks.as_strided(values.reshape(-1)[slot * 2:], values.shape, values.strides)


class AttentionPaths:
    """Attention as the Runtime runs it: the general path (scores, softmax and values spread over
    the workers in Python hand-offs, by key owner and query rows) and the compiled paths (one
    token's attention as crew jobs; MLA's latent attention). Mixed into ``Runtime``, whose pool,
    crew and ``each_worker`` it uses."""

    def mla_attention(self, q: np.ndarray, rows: np.ndarray, kv, il: int, pos0: int, scale: float) -> np.ndarray:
        """Multi-head latent attention with the absorption (llama.cpp's MQA form): q [n, n_head,
        kv_lora + n_rot] against the cache's rows [latent, rotary key], values = the latent.
        Stores `rows` [n, kv_lora + n_rot] at pos0.. first; returns [n, n_head, kv_lora].

        A decoded token is `KVCache`'s one-token attention with one KV head (the cache keeps the
        latent transposed beside the rows): the scores' chunks split the positions and the weighted
        sum's the latent dimensions, every head's query row sharing each read, so each cache byte
        is read once a token whatever the workers (the heads split between workers read it once
        per worker)."""
        n = q.shape[0]
        if n == 1 and self.crewing:
            lora = kv.kv_lora
            return self._attend_token(q, rows.reshape(1, 1, -1), rows[:, :lora].reshape(1, 1, lora), kv, il, pos0,
                                      0, scale)
        kv.store(il, rows, pos0)
        view = kv.attention_view(il, pos0 + n)
        return self.attention(q, rows.reshape(n, 1, -1), rows.reshape(n, 1, -1), view, il, pos0, 0, scale,
                              compiled=False)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, kv: KVCache, il: int, pos0: int,
                  window: int, scale: float, compiled: bool = True) -> np.ndarray:
        """Store K/V at pos0.. and attend; each node's workers read only their node's part of the cache.

        The cache is split between owners (one per node); within an owner, the query rows are
        split between the node's workers, so each output is one worker's dot over the owner's
        positions in order. On one node that is exactly llama.cpp's order, whatever the threads.
        """
        n, n_head, hd = q.shape
        if n == 1 and self.crewing and compiled:
            return self._attend_token(q, k, v, kv, il, pos0, window, scale)
        kv.store(il, k, v, pos0)
        n_kv = kv.cfg.n_head_kv
        group = n_head // n_kv
        rows = n * group
        no = kv.n_workers
        n_slots = [filled_slots(pos0 + n, o, no) for o in range(no)]
        # queries grouped by their kv head: [n_kv, n * group, hd]
        qg = np.ascontiguousarray(q.reshape(n, n_kv, group, hd).transpose(1, 0, 2, 3)).reshape(n_kv, rows, hd)
        xq = kernels.prepare(F16, qg.reshape(n_kv * rows, hd))[0].reshape(n_kv, rows, hd)
        # a prompt over one owner: each piece of rows runs its scores, softmax and values in turn in
        # buffers of its own (`piece` below); several owners need every owner's scores before any values
        two_pass = no > 1 or n == 1 or not ONE_PASS_PROMPT
        scores = [np.empty((n_kv, rows, max(ns, 1)), dtype=np.float32) for ns in n_slots] if two_pass else []
        mxs = np.full((no, n_kv, rows), -np.inf, dtype=np.float32)
        sms = np.zeros((no, n_kv, rows), dtype=np.float64)
        kb, vb = kv.k_bytes[il], kv.v_bytes[il]
        hdv = kv.cfg.head_dim_v
        # ggml takes llamafile's tinyBLAS for products with >= 2 columns (tokens) and
        # ggml_vec_dot_f16 for one: our F16 matmat / matvec follow those two summation orders
        decode = n == 1

        def window_start(o: int, align: int = 1) -> int:
            """One token: owner o's first slot inside the sliding window (rounded down to `align`)."""
            return filled_slots(max(pos0 - window + 1, 0), o, no) // align * align if decode and window else 0
        # one token, one owner: the softmax and the probabilities start from the window's first
        # 64-slot boundary too (slots before it hold whole groups of 16 masked positions, whose
        # exps add exactly 0 to the sums); on one owner slot j holds position j
        base = window_start(0, 64) if decode and no == 1 and SKIP_SLID_VALUES else 0

        def visible(o: int, r1: int) -> int:
            """Owner o's slots that query rows < r1 can see (causal: up to token (r1 - 1) // group)."""
            return min(filled_slots(pos0 + (r1 - 1) // group + 1, o, no), n_slots[o])

        def slid(o: int, r0: int, align: int = 1) -> int:
            """The prompt: owner o's slots that slid out of the window of query row r0 and of every
            row after it (rounded down to `align`): no dots and no value products for them."""
            if decode or not window or not SKIP_SLID_PROMPT:
                return 0
            return min(filled_slots(max(pos0 + r0 // group - window + 1, 0), o, no), n_slots[o]) // align * align

        def scores_rows(o: int, r0: int, r1: int, buf: np.ndarray | None = None, off: int = 0,
                        stats: bool = True) -> None:
            """Owner o's scores of rows [r0, r1) into buf [n_kv, >= r1 - off, ns], row r at r - off
            (default: scores[o]), and (stats) their softmax statistics."""
            ns = n_slots[o]
            if not ns or r1 <= r0:
                return
            buf = scores[o] if buf is None else buf
            # one token: no dots for keys that slid out of the window (softmax_stats masks them)
            lo = window_start(o)
            for h in range(n_kv):
                keys, sc = kb[o][h], buf[h]
                if decode:
                    for r in range(r0, r1 if lo < ns else r0):
                        kernels.matvec(F16, keys, (xq[h, r],), sc[r - off], lo, ns)
                else:  # the prompt, in pieces of rows: no dots for keys in a piece's future, nor for
                    # keys that slid out of its first row's window (softmax_stats masks both)
                    for a in range(r0, r1, CAUSAL_ROWS):
                        b = min(a + CAUSAL_ROWS, r1)
                        kernels.matmat(F16, keys, (xq[h, a:b],), sc[a - off:b - off], slid(o, a), visible(o, b))
            if stats:
                softmax_stats(buf[:, r0 - off:r1 - off, base:], o, no, ns - base, pos0 - base, group, window, scale,
                              mxs[o][:, r0:r1], sms[o][:, r0:r1], r0)

        big_m = np.empty((n_kv, rows), dtype=np.float32)
        inv_l = np.empty((n_kv, rows), dtype=np.float32)
        outs = np.zeros((no, n_kv, rows, hdv), dtype=np.float32)

        def values_rows(o: int, r0: int, r1: int) -> None:
            ns = n_slots[o]
            if not ns or r1 <= r0:
                return
            # llama.cpp sums over its whole (256-padded) cache row, masked positions with
            # probability 0: pad with zeros to whole 16-lane (64 for one token) steps
            step = 64 if decode else 16
            kp = min(-(-ns // step) * step, kv.cap)
            # the prompt: the piece's probabilities from the first slot of its first row's window
            # (on a 64-slot boundary, like `base` for one token); xp starts at slot base + first
            first = slid(o, r0, 64)
            probs = probabilities(scores[o][:, r0:r1, base + first:], ns - base - first, kp - base - first,
                                  big_m[:, r0:r1], inv_l[:, r0:r1])
            xp = kernels.prepare(F16, probs.reshape(n_kv * (r1 - r0), kp - base - first))[0].reshape(
                n_kv, r1 - r0, kp - base - first)
            # one token: skip values of keys that slid out of the window, from a 64-slot boundary:
            # they have probability 0, and starting on the 64-wide step keeps every remaining
            # product in the same accumulator lane, so the sum is the same to the bit
            # (xp starts at slot `base`; the values are read from slot `lo`)
            lo = window_start(o, 64) if SKIP_SLID_VALUES else 0
            for h in range(n_kv):
                values, out = values_from(vb[o][h], lo), outs[o][h]   # (rows read for kp - lo slots only)
                if decode:
                    for r in range(r1 - r0):
                        kernels.matvec(F16, values, (xp[h, r, lo - base:],), out[r0 + r], 0, hdv)
                else:
                    # per piece of rows, the sums stop at the last visible key's 16-slot step:
                    # the dropped terms are 0 x v added last to accumulators that are never -0;
                    # and they start at the 64-slot step of the piece's first visible key: the
                    # terms before it are 0 x v added to accumulators still +0, which stay +0,
                    # and every other term keeps its lane (test_engine_api.py::test_prompt_skips_slid_out_keys_without_changing_a_bit)
                    for a in range(r0, r1, CAUSAL_ROWS):
                        b = min(a + CAUSAL_ROWS, r1)
                        width = min(-(-visible(o, b) // 16) * 16, kp)
                        s0 = max(slid(o, a, 64), first)
                        x = empty_aligned(b - a, max(width - s0, 0))   # whole 64-byte lines for the tiles' loads
                        x[:] = xp[h, a - r0:b - r0, s0 - first:width - first]
                        kernels.matmat(F16, values_from(values, s0), (x,), out[a:b], 0, hdv)

        spread = handoff.attention_seconds(n_kv * rows, sum(n_slots), hd, hdv) >= handoff.HANDOFF_SECONDS
        # one worker: pieces whose scores (f32, every kv head) fit in SOLO_PIECE_BYTES
        solo = max(CAUSAL_ROWS, SOLO_PIECE_BYTES // (4 * n_kv * max(max(n_slots), 1)) // CAUSAL_ROWS * CAUSAL_ROWS)
        if not two_pass:
            n16 = -(-n_slots[0] // SOFTMAX_LANES) * SOFTMAX_LANES
            scratch: dict[int, tuple] = {}   # each thread's buffers, kept for its pieces

            def piece(o: int, r0: int, r1: int) -> None:
                """One owner, the prompt: a piece's scores, probabilities and values one after
                another in buffers of the piece's size, kept by the thread. The whole prompt's
                scores at once (R1's widths, 512 tokens at depth 16384: 277 MB a block) went to
                memory and came back, and each piece's fresh probability arrays were paged in:
                with 64-row pieces that way the attention took 1.2x its time at 32 rows (AMD
                EPYC Zen 4, 1 thread). Every row's arithmetic is its own: the same bits."""
                ns = n_slots[o]
                if not ns or r1 <= r0:
                    return
                bufs = scratch.get(threading.get_ident())
                if bufs is None or bufs[0].shape[1] < r1 - r0:
                    bufs = scratch[threading.get_ident()] = (
                        np.empty((n_kv, r1 - r0, ns), dtype=np.float32),
                        empty_aligned(n_kv * (r1 - r0), n16).reshape(n_kv, r1 - r0, n16),
                        empty_aligned(1, min(CAUSAL_ROWS, r1 - r0) * n16).reshape(-1))
                buf, probs, xs = bufs
                scores_rows(o, r0, r1, buf, r0, stats=False)
                prompt_rows_probs(buf, probs, ns, r1 - r0, pos0, r0, group, window, scale)
                for h in range(n_kv):
                    out = outs[o][h]
                    for a in range(r0, r1, CAUSAL_ROWS):
                        b = min(a + CAUSAL_ROWS, r1)
                        width = min(-(-visible(o, b) // 16) * 16, kv.cap, n16)
                        s0 = slid(o, a, 64)
                        # whole 64-byte lines for the tiles' loads: the rows copied to one buffer
                        x = xs[:(b - a) * max(width - s0, 0)].reshape(b - a, max(width - s0, 0))
                        x[:] = probs[h, a - r0:b - r0, s0:width]
                        kernels.matmat(F16, values_from(vb[o][h], s0), (x,), out[a:b], 0, hdv)
            self._attention_pass(kv, rows, spread, piece, solo)
        else:
            self._attention_pass(kv, rows, spread, scores_rows, solo)
            merge_stats(mxs, sms, big_m, inv_l)
            self._attention_pass(kv, rows, spread, values_rows, solo)
        out = outs[0] if no == 1 else outs.sum(axis=0)
        return np.ascontiguousarray(out.reshape(n_kv, n, group, hdv).transpose(1, 0, 2, 3)).reshape(n, n_head, hdv)

    def _attend_token(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, kv: KVCache, il: int, pos0: int,
                      window: int, scale: float) -> np.ndarray:
        """One token with the crew: the general path's steps in one compiled call around the
        crew's jobs (attention.one_token_attention, or owners_token_attention for a cache split
        between nodes, whose chunks run on each owner's own workers)."""
        crew = self._crew
        keys, values = self._token_jobs(kv, il, q.shape[1] // kv.cfg.n_head_kv)
        start, base = token_window(pos0, window)
        no = kv.n_workers
        if no == 1:
            out, ok = one_token_attention(crew.lead)(
                crew.ctl, crew.n_workers, keys, values, q[0], k[0], v[0], kv.keys3(il, 0), kv.v[il][0],
                pos0, window, scale, start, base, kv.cap)
        else:
            owner, slot = (int(a[0]) for a in owner_slots(np.array([pos0]), no))
            ns = np.array([filled_slots(pos0 + 1, o, no) for o in range(no)], dtype=np.int64)
            lo = np.array([filled_slots(start, o, no) for o in range(no)], dtype=np.int64)
            lo64 = lo // 64 * 64 if SKIP_SLID_VALUES else np.zeros_like(lo)
            out, ok = owners_token_attention(crew.lead)(
                crew.ctl, crew.n_workers, keys, values, q[0], k[0], v[0],
                tuple(kv.keys3(il, o) for o in range(no)), tuple(kv.v[il]),
                pos0, owner, slot, window, scale, ns, lo, lo64, kv.cap)
        if not ok:
            crew.stop()
            raise CrewError("a worker failed during attention")
        return out.reshape(1, q.shape[1], -1)

    def _token_jobs(self, kv: KVCache, il: int, rows: int) -> tuple[tuple, tuple]:
        """Layer il's one-token attention jobs (keys, values) as the compiled calls take them."""
        jobs = kv.jobs.get(il)
        if jobs is None:
            jobs = kv.jobs[il] = self._attention_jobs(kv, il, rows)
        keys, values = ((job.tasks, job.chunks, job.n_owned) for job in jobs)
        return keys, values

    def _attention_jobs(self, kv: KVCache, il: int, rows: int) -> tuple[Job, Job]:
        """Crew jobs of a one-token attention over layer il: tasks per (owner, kv head, query
        row) for the scores (key positions) and the weighted values (V^T rows = value
        dimensions). A chunk is one piece of the keys or values for all query rows of a kv head,
        run by one `kernels.f16_heads` call: each row read and converted once for the group. One
        owner: chunks are shared, position-major so that the filled ones come first; several owners
        (nodes): an owner's chunks are dealt in turn to that owner's workers, which read only its
        part."""
        n_kv, hdv = kv.cfg.n_head_kv, kv.cfg.head_dim_v
        per = n_kv * rows
        idx = [(o, h, r) for o in range(kv.n_workers) for h in range(n_kv) for r in range(rows)]

        def chunks(step: int, end: int) -> tuple[list, list]:
            pieces = [(lo, min(lo + step, end)) for lo in range(0, end, step)]
            if kv.n_workers == 1:
                return [], [(h * rows, lo, hi, rows) for lo, hi in pieces for h in range(n_kv)]
            return [(o * per + h * rows, lo, hi, ws[p % len(ws)], rows) for o, ws in enumerate(kv.owner_workers)
                    for p, (lo, hi) in enumerate(pieces) for h in range(n_kv)], []
        keys = Job([(F16, kv.k_bytes[il][o][h], 0, 0, 0, h * rows + r, o * per + h * rows + r) for o, h, r in idx],
                   *chunks(CREW_KEYS, kv.cap))
        values = Job([(F16, kv.v_bytes[il][o][h], 0, 0, 0, o * per + h * rows + r, o * per + h * rows + r)
                      for o, h, r in idx], *chunks(CREW_DIMS, hdv))
        if kv.n_workers == 1 and self.n_workers > 1:   # a long softmax may go to the crew (PROBS_JOB_MIN)
            keys.tasks[0, T_FN] = probs_chunk_address()
        return keys, values

    def _attention_pass(self, kv: KVCache, rows: int, spread: bool, fn: Callable[[int, int, int], None],
                        solo_rows: int = CAUSAL_ROWS) -> None:
        """fn(owner, r0, r1) over every owner's rows; spread: in pieces of CAUSAL_ROWS rows, the
        owner's workers taking turns (later rows see more keys: taking turns keeps the work even).
        One worker takes `solo_rows` rows at a time: the whole prompt's scores and probabilities
        at once (Qwen3-MoE shape, 512 tokens: 16 MB of each, 8 MB of f16 probabilities) ran from
        memory, where a piece's stay in the caches (the same bits: each row's work is its own)."""
        if not spread:
            for o in range(kv.n_workers):
                fn(o, 0, rows)
            return
        if self.n_workers == 1:
            for o in range(kv.n_workers):
                for a in range(0, rows, solo_rows):
                    fn(o, a, min(a + solo_rows, rows))
            return
        pieces = [(a, min(a + CAUSAL_ROWS, rows)) for a in range(0, rows, CAUSAL_ROWS)]
        shares = {w: [(o, a, b) for a, b in pieces[i::len(ws)]]
                  for o, ws in enumerate(kv.owner_workers) for i, w in enumerate(ws)}

        def work(w: int) -> None:
            for share in shares.get(w, ()):
                fn(*share)
        self.each_worker(work)

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
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .kv_cache import BLOCK, slot_position, store_f16  # noqa: F401  (the cache owns its slot layout)
from .ops import ggml_expf, tree16

_JIT = dict(nogil=True, cache=True)


@nb.njit(**_JIT)
def softmax_stats(scores: np.ndarray, w: int, n_workers: int, n_slots: int, pos0: int, group: int,
                  window: int, scale: float, mx: np.ndarray, sm: np.ndarray, row0: int) -> None:
    """scores [n_kv, rows, >=n_slots] raw dots -> scaled, masked (-inf); per row max and sum of exps.

    Row r here is query row row0 + r of its kv head, which holds query token (row0 + r) // group. A key at position g is visible
    from query position p when g <= p and (window == 0 or p - g < window).
    """
    n_kv, rows, _ = scores.shape
    sc = np.float32(scale)
    n16 = -(-n_slots // 16) * 16
    ex = np.zeros(n16, dtype=np.float32)  # exps of one row, zero-padded to whole groups of 16
    row = np.empty(n_slots, dtype=np.float32)  # one row, contiguous (scores may be a strided view)
    for h in range(n_kv):
        for r in range(rows):
            p = pos0 + (row0 + r) // group
            m = np.float32(-np.inf)
            for j in range(n_slots):
                g = slot_position(j, w, n_workers)
                v = np.float32(-np.inf)
                if g <= p and (window <= 0 or p - g < window):
                    v = scores[h, r, j] * sc
                    if v > m:
                        m = v
                scores[h, r, j] = v
                row[j] = v
            # as ggml_vec_soft_max_f32 on AVX-512: exps (ggml_v_expf) of 16 positions at a time
            # (a block of slots holds whole aligned groups of 16 positions) summed in float32
            # by the _mm512_reduce_add_ps tree, each group sum added in float64
            s = 0.0
            if m > -np.inf:
                _exps(row, n_slots, m, ex)
                for j0 in range(0, n16, 16):
                    s += np.float64(tree16(ex, j0))
            mx[h, r] = m
            sm[h, r] = s


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
            row[:] = scores[h, r, :n_slots]
            _probs(row, n_slots, m, il, o)
    return out


@nb.njit(**_JIT)
def _probs(v: np.ndarray, n: int, m: np.float32, il: np.float32, out: np.ndarray) -> None:
    """out[j] = exp(v[j] - m) * il for j < n (masked -inf: 0); vectorizes like _exps."""
    for j in range(n):
        s = v[j]
        e = ggml_expf(s - m) * il
        out[j] = np.float32(0.0) if s == -np.inf else e


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
        mxs = np.full((1, n_kv, rows), -np.inf, dtype=np.float32)
        sms = np.zeros((1, n_kv, rows), dtype=np.float64)
        softmax_stats(scores[:, :, base:], 0, 1, ns - base, pos0 - base, rows, window, scale, mxs[0], sms[0], 0)
        big_m = np.empty((n_kv, rows), dtype=np.float32)
        inv_l = np.empty((n_kv, rows), dtype=np.float32)
        merge_stats(mxs, sms, big_m, inv_l)
        kp = min(-(-ns // 64) * 64, cap)
        probs = probabilities(scores[:, :, base:], ns - base, kp - base, big_m, inv_l)
        xp = round_to_f16(probs.reshape(n_kv * rows, kp - base))
        out = np.zeros((n_kv * rows, hdv), dtype=np.float32)
        vt, vch, vown = values_job
        ok = lead(ctl, n_workers, vt, vch, vown, (xp,), (xp,), (out,), 0, 1 << 62, 2 * base) and ok
        return out, ok

    _DECODERS[lead] = attend
    return attend


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

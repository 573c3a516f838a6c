"""Batched decoding: several sequences, each with its own KV cache, advance one token per pass.

`decode_batch` runs one forward pass for N sequences (one new token each): the products
are matrix-matrix over the N rows, so the weights are read once for all of them. A
sequence's numbers must not depend on what else is in the batch, and ggml's multi-column
products (which ours follow) take other float orders than its one-column ones for some types
(`EXACT_COLUMNS`): those products are cut into pieces small enough to keep the one-column
order. Attention is per sequence (its own cache and position), by the one-token path. So a
greedy sequence decoded in any batch gives `Session.generate`'s tokens, to the bit.

`Scheduler` is continuous batching over that pass: up to `n_parallel` slots (one `Session`
each), a bounded queue, requests that join and leave between passes, prompts processed in
the same 512-token pieces as `Session.prefill`, and cancellation at the next pass; each
request's token loop (sampling, stop ids and strings, budget, context) is a
`engine.generation.Generation`, as in `Session.generate`. The passes themselves are a model's:
`LocalModel` over an `Engine` here, or anything with its methods (a pipeline over Ray hosts,
workbench.cluster, whose hosts run `stage_batch`). It knows nothing about HTTP (the server
builds on it).
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numba
import numpy as np

from .kernels.jitcache import JIT
from . import kernels, ops
from .kernels.intrinsics import VNNI, dot_us, f16_to_f32, f_zero, fmadd_i, hsum_f, i_shl, i_sub, i_zero, load_b32
from .engine import Engine, Session
from .events import ContextFullError, DoneEvent, Stats
from .attention import SKIP_SLID_VALUES, one_token_attention, token_window
from .crew import Crew
from .kv_cache import KVCache
from .runtime import USE_CREW, After, AttentionSpec, Before, MLASpec, RoutedSpec, SharedSpec, then_after
from .rows_attention import rows_block_runner
from .rows_mla import rows_mla_runner
from .token_layer import typed_layers
from .crew import CrewError, rows_job
from .generation import Generation, Picker, reusable_prefix
from .sampling import SamplingParams
from ..errors import UserError

PREFILL_BATCH = 512  # prompt tokens per forward pass (Session.prefill's batch, so the same numbers)


# ----------------------------------------------------------------------------- the batched pass
# Most types' matrix-matrix kernels give each column exactly the one-column (matvec) result;
# these take other float orders from some column count on (ggml's, which ours follow): Q4_K
# (in the file's layout or llama.cpp's repacked one) the gemm for whole tiles of 4 columns, Q6_K,
# Q5_K, Q3_K and IQ4_XS the tiled matmul from 8 columns, F32 tinyBLAS from 2, F16 tinyBLAS from 1.
# A batch is cut into pieces of at most this many rows for them (F16: row by row, which takes the
# one-token path). tests/test_server_batch.py checks the table on every type.
EXACT_COLUMNS = {kernels.Q4_K: 3, kernels.Q4_K_X8: 3, kernels.Q6_K: 7, kernels.Q5_K: 7, kernels.Q3_K: 7,
                 kernels.IQ4_XS: 7, kernels.F32: 1, kernels.F16: 0}


def exact_columns(types) -> int:
    """Rows a product over weights of these types may take at once and stay per-row exact
    (0: one row at a time)."""
    return min([EXACT_COLUMNS.get(int(t), 1 << 30) for t in types])


# ----------------------------------------------------------------------------- Q8_0, many rows
_ONES = np.ones(32, dtype=np.uint8)


@numba.njit(**JIT)
def q8_0_rows_vnni(w, xu, xd, ones, out, r0, r1):
    """out[c, i] = the Q8_0 matvec's dot of weight row i with activation row c, for every c.

    matvec's integer lanes come from the sign trick (|w| . sign(w) x); here each activation row
    is stored offset as u8 (xu = x + 128) and one vpdpbusd per block gives the same exact lanes
    from an accumulator started at -128 * (sum of the lane's weights), computed once per block
    for all rows. The float operations (lanes to f32, one FMA by d_w * d_x per block, the
    pairwise hsum) are matvec's, so every output is matvec's to the bit, at about half the
    instructions per row and block (the output matrix dominates a decode pass). AVX512-VNNI
    only: AVX2's pmaddubsw would saturate u8 x s8 pairs."""
    n, k = xu.shape
    nb = xd.shape[1]
    rb = w.shape[1]
    xf = xu.reshape(-1)
    one = load_b32(ones, 0)
    for i in range(r0, r1):
        base = i * rb
        c = 0
        while c + 8 <= n:
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            a4 = f_zero(); a5 = f_zero(); a6 = f_zero(); a7 = f_zero()
            for b in range(nb):
                o = base + b * 34
                wv = load_b32(w, o + 2)
                dw = f16_to_f32(w, o)
                corr = i_sub(i_zero(), i_shl(dot_us(VNNI, i_zero(), one, wv), 7))
                xo = c * k + b * 32
                a0 = fmadd_i(a0, dot_us(VNNI, corr, load_b32(xf, xo), wv), dw * xd[c, b])
                a1 = fmadd_i(a1, dot_us(VNNI, corr, load_b32(xf, xo + k), wv), dw * xd[c + 1, b])
                a2 = fmadd_i(a2, dot_us(VNNI, corr, load_b32(xf, xo + 2 * k), wv), dw * xd[c + 2, b])
                a3 = fmadd_i(a3, dot_us(VNNI, corr, load_b32(xf, xo + 3 * k), wv), dw * xd[c + 3, b])
                a4 = fmadd_i(a4, dot_us(VNNI, corr, load_b32(xf, xo + 4 * k), wv), dw * xd[c + 4, b])
                a5 = fmadd_i(a5, dot_us(VNNI, corr, load_b32(xf, xo + 5 * k), wv), dw * xd[c + 5, b])
                a6 = fmadd_i(a6, dot_us(VNNI, corr, load_b32(xf, xo + 6 * k), wv), dw * xd[c + 6, b])
                a7 = fmadd_i(a7, dot_us(VNNI, corr, load_b32(xf, xo + 7 * k), wv), dw * xd[c + 7, b])
            out[c, i] = hsum_f(a0)
            out[c + 1, i] = hsum_f(a1)
            out[c + 2, i] = hsum_f(a2)
            out[c + 3, i] = hsum_f(a3)
            out[c + 4, i] = hsum_f(a4)
            out[c + 5, i] = hsum_f(a5)
            out[c + 6, i] = hsum_f(a6)
            out[c + 7, i] = hsum_f(a7)
            c += 8
        while c + 4 <= n:
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            for b in range(nb):
                o = base + b * 34
                wv = load_b32(w, o + 2)
                dw = f16_to_f32(w, o)
                corr = i_sub(i_zero(), i_shl(dot_us(VNNI, i_zero(), one, wv), 7))
                xo = c * k + b * 32
                a0 = fmadd_i(a0, dot_us(VNNI, corr, load_b32(xf, xo), wv), dw * xd[c, b])
                a1 = fmadd_i(a1, dot_us(VNNI, corr, load_b32(xf, xo + k), wv), dw * xd[c + 1, b])
                a2 = fmadd_i(a2, dot_us(VNNI, corr, load_b32(xf, xo + 2 * k), wv), dw * xd[c + 2, b])
                a3 = fmadd_i(a3, dot_us(VNNI, corr, load_b32(xf, xo + 3 * k), wv), dw * xd[c + 3, b])
            out[c, i] = hsum_f(a0)
            out[c + 1, i] = hsum_f(a1)
            out[c + 2, i] = hsum_f(a2)
            out[c + 3, i] = hsum_f(a3)
            c += 4
        while c < n:
            acc = f_zero()
            for b in range(nb):
                o = base + b * 34
                wv = load_b32(w, o + 2)
                corr = i_sub(i_zero(), i_shl(dot_us(VNNI, i_zero(), one, wv), 7))
                acc = fmadd_i(acc, dot_us(VNNI, corr, load_b32(xf, c * k + b * 32), wv), f16_to_f32(w, o) * xd[c, b])
            out[c, i] = hsum_f(acc)
            c += 1


def q8_0_batch(w: np.ndarray, x: np.ndarray, out: np.ndarray, r0: int, r1: int) -> None:
    """out[:, r0:r1] = each row of x (float32 [n, k]) times Q8_0 weight rows r0..r1-1, every row
    with the one-token (matvec) numbers; the VNNI kernel when the active path has it."""
    xq, xd, _ = kernels.prepare(kernels.Q8_0, x)
    if kernels.kernel_path() == "avx512-vnni":
        q8_0_rows_vnni(w, xq.view(np.uint8) ^ np.uint8(0x80), xd, _ONES, out, r0, r1)
    else:
        kernels.matmat(kernels.Q8_0, w, (xq, xd, _), out, r0, r1)


class _BatchRuntime:
    """The runtime as `Decoder._forward` sees it during a batched pass: products through
    `_Products`, attention per row on that row's own cache; everything else is the runtime's."""

    def __init__(self, rt, caches: list[KVCache]):
        self._rt, self._caches = rt, caches

    def __getattr__(self, name: str):
        return getattr(self._rt, name)

    def linear(self, x: np.ndarray, names: tuple[str, ...], after: After | None = None) -> list[np.ndarray]:
        """A group of products over n rows in one hand-off to the workers (each its own row
        range of each weight, as `Runtime.linear`): Q8_0 by q8_0_rows_vnni on VNNI; other types
        by matmat in pieces of at most `exact_columns` rows (F16: matvec row by row); then
        `after` over all rows (`Runtime.linear`'s token-wise work)."""
        return then_after(after, self._linear(x, names))

    def _linear(self, x: np.ndarray, names: tuple[str, ...]) -> list[np.ndarray]:
        rt = self._rt
        x = np.ascontiguousarray(x)
        n = x.shape[0]
        group = rt._group(names)
        outs = rt.rows_products(group, x)   # the crew's workers: one job, each weight piece read once
        if outs is not None:
            return outs
        if x.shape[1] != group.ne0:
            raise ValueError(f"input width {x.shape[1]} != row length {group.ne0}")
        types = [t for t, _, _ in group.jobs]
        xps = [kernels.prepare(t, x) for t in group.prep_types]
        outs = [np.empty((n, rows), dtype=np.float32) for rows in group.rows]
        if set(types) == {kernels.Q8_0} and kernels.kernel_path() == "avx512-vnni":
            xq, xd, _ = xps[0]
            xu = xq.view(np.uint8) ^ np.uint8(0x80)

            def work(wk: int) -> None:
                for (_, plan, _), out in zip(group.jobs, outs):
                    arr, first, lo, hi = plan[wk]
                    if hi > lo:
                        q8_0_rows_vnni(arr, xu, xd, _ONES, out[:, first:first + arr.shape[0]], lo - first,
                                       hi - first)
            rt.each_worker(work)
            return outs
        step = exact_columns(types)
        if n < 8 and set(types) <= {kernels.Q4_0, kernels.Q5_0}:
            step = 0  # their matmat tiles are 8 columns wide: below that, row by row is cheaper
        pieces = [(a, min(a + max(step, 1), n)) for a in range(0, n, max(step, 1))]

        def work(wk: int) -> None:
            for (qtype, plan, p), out in zip(group.jobs, outs):
                arr, first, lo, hi = plan[wk]
                if hi <= lo:
                    continue
                part = out[:, first:first + arr.shape[0]]
                for a, b in pieces:
                    if step == 0:  # one row: the one-token kernel
                        kernels.matvec(qtype, arr, tuple(t[a] for t in xps[p]), part[a], lo - first, hi - first)
                    else:
                        kernels.matmat(qtype, arr, tuple(t[a:b] for t in xps[p]), part[a:b], lo - first,
                                       hi - first)
        rt.each_worker(work)
        return outs

    def rows_ffn(self, spec, h: np.ndarray) -> np.ndarray | None:
        """A mixture-of-experts FFN (`RoutedSpec`, or `SharedSpec` with shared experts) over every
        row in one compiled call (`rows_ffn`: the one-token call's steps per row, experts grouped
        over the rows); None where the one-token call has no compiled form (the caller's steps)."""
        rt = self._rt
        if not rt._crewing or not isinstance(spec, (RoutedSpec, SharedSpec)):
            return None
        fused = isinstance(spec, SharedSpec)
        parts = rt._fused_parts(spec) if fused else rt._routed_parts(spec)
        if parts is None or parts.rows is None:
            return None
        n = h.shape[0]
        key = ("ffn", id(parts), n)
        hit = rt._rows_jobs.get(key)
        if hit is None or hit[0] is not parts:
            hit = rt._rows_jobs[key] = (parts, _rows_ffn_args(parts.head, n, fused))
        args = hit[1]
        crew = rt._crew
        if not parts.rows(crew.ctl, crew.n_workers, np.ascontiguousarray(h, dtype=np.float32), *args):
            crew.stop()
            raise CrewError("a worker failed during an expert product")
        if rt.routing is not None and parts.routing:
            names = parts.routing[1]
            rt.routing.record(names[-2], args[9] if fused else args[8], names)
        return args[-6] if fused else args[-4]

    def gated(self, x: np.ndarray, gate: str, up: str, activation: str, before: Before | None = None):
        if before is not None:
            before(0, x.shape[0])
        g, u = self._linear(x, (gate, up))
        a = np.empty_like(g)
        if activation == "gelu":
            ops.gelu_mul(g, u, a, ops.GELU_F16)
        else:
            ops.silu_mul(g, u, a)
        return g, u, a

    def attention(self, q, k, v, kv, il, pos0, window, scale):
        # (pos0 is the batch stand-in; each row attends at its own cache position)
        return np.concatenate([self._one(q[i:i + 1], k[i:i + 1], v[i:i + 1], c, il, window, scale)
                               for i, c in enumerate(self._caches)])

    def mla_attention(self, q, rows, kv, il, pos0, scale):
        """DeepSeek's latent attention, each row on its own cache at its own position (the
        runtime's one-token call: the single-sequence decode's operations in its order)."""
        return np.concatenate([self._rt.mla_attention(q[i:i + 1], rows[i:i + 1], c, il, c.n, scale)
                               for i, c in enumerate(self._caches)])

    def rows_attention(self, spec: AttentionSpec, h: np.ndarray, il: int, rope: np.ndarray) -> np.ndarray | None:
        """The shared attention sub-layer over every row in one compiled call (`rows_attention`),
        each row on layer il of its own one-owner cache at its own position (rope [n, rot / 2, 2]
        or size 0); None where the one-token call has none (the caller's steps)."""
        rt = self._rt
        caches = self._caches
        if not rt._crewing or any(c.n_workers != 1 for c in caches):
            return None
        parts = [rt._attention_parts(spec, c, il) for c in caches]
        if any(p is None for p in parts):
            return None
        fn, args = self._rows_args(("rows-attn", spec.output, il), parts,
                                   lambda: self._rows_attention_args(spec, parts))
        crew = rt._crew
        pos0s = np.array([c.n for c in caches], dtype=np.int64)
        if not fn(crew.ctl, crew.n_workers, np.ascontiguousarray(h, dtype=np.float32), *args[:10], rope, *args[10:13],
                  pos0s, *args[13:]):
            crew.stop()
            raise CrewError("a worker failed during attention")
        return args[-2]

    def _rows_args(self, key: tuple, parts: list, build: Callable[[], tuple]) -> tuple:
        """A rows call and its arguments for this batch's caches, kept with the first cache's
        one-token parts until the batch's sequences or the crew change (one entry per layer)."""
        caches = self._caches
        per = self._rt._tparts.setdefault(caches[0], {})
        key = key + (len(caches),)
        hit = per.get(key)
        if hit is None or any(r() is not c for r, c in zip(hit[0], caches)) or hit[1] is not parts[0].head[0]:
            per[key] = hit = (tuple(weakref.ref(c) for c in caches), parts[0].head[0], build())
        return hit[2]

    def _rows_attention_args(self, spec: AttentionSpec, parts: list) -> tuple[Callable, tuple]:
        rt = self._rt
        n = len(parts)
        g_qkv, g_out = rt._group(spec.qkv), rt._group((spec.output,))
        run_qkv, run_out = rt.product_runner(g_qkv, rows=True), rt.product_runner(g_out, rows=True)
        attend, _kc, _vc = rt._cache_args(self._caches[0], 0)
        (jq, q, k, v, bq, bk, bv, q_norm, k_norm, eps) = parts[0].head
        (neox, prescale, *_rest) = parts[0].mid
        (window, scale) = parts[0].win
        (_cap, jo, o, bo) = parts[0].tail
        caches = typed_layers(tuple((p.mid[2], p.mid[3], p.mid[4], p.mid[5], p.tail[0]) for p in parts))
        fn = rows_block_runner(run_qkv, attend, run_out)
        return fn, (_rows_table(jq, n), np.empty((n,) + q.shape, np.float32), np.empty((n,) + k.shape, np.float32),
                    np.empty((n,) + v.shape, np.float32), bq, bk, bv, q_norm, k_norm, eps, neox, prescale, caches,
                    int(window), bool(SKIP_SLID_VALUES), float(scale), _rows_table(jo, n),
                    np.empty((n, q.shape[0] * v.shape[1]), np.float32), np.empty((n, o.shape[-1]), np.float32), bo)

    def rows_mla(self, spec: MLASpec, h: np.ndarray, il: int, rope: np.ndarray) -> np.ndarray | None:
        """DeepSeek's MLA sub-layer over every row in one compiled call (`rows_mla`), each row on
        layer il of its own latent cache at its own position (rope [n, rot / 2, 2]); None where the
        one-token call has none (the caller's steps)."""
        rt = self._rt
        caches = self._caches
        if not rt._crewing or len({c.n_workers for c in caches}) != 1:
            return None
        parts = [rt._mla_parts(spec, c, il) for c in caches]
        if any(p is None for p in parts):
            return None
        fn, args = self._rows_args(("rows-mla", spec.output, il), parts,
                                   lambda: self._rows_mla_args(spec, parts, len(caches)))
        crew = rt._crew
        pos0s = np.array([c.n for c in caches], dtype=np.int64)
        o = args[-1]
        if not fn(crew.ctl, crew.n_workers, np.ascontiguousarray(h, dtype=np.float32), *args[:10], rope, *args[10:14],
                  pos0s, *args[14:]):
            crew.stop()
            raise CrewError("a worker failed during attention")
        return o

    def _rows_mla_args(self, spec: MLASpec, parts: list, n: int) -> tuple[Callable, tuple]:
        """`rows_mla_runner` and its arguments but the input, RoPE and positions: the one-token
        parts' jobs as rows jobs, their caches' per-row arguments, scratch for n rows."""
        rt = self._rt
        (j1, _qa, _ckv, qa_norm, eps, jqb, _q, jkb, qn, q_abs) = parts[0].head
        (neox, nope, kv_norm, _k, _v, _kc, _vc, _qcat, _krow, _lat) = parts[0].mid
        (cap, jvb, vb_out, jo, o) = parts[0].tail
        g1, g_out = rt._group(spec.first), rt._group((spec.output,))
        g_qb = rt._group((spec.q_b,)) if spec.q_b else None
        run1, run_out = rt.product_runner(g1, rows=True), rt.product_runner(g_out, rows=True)
        run_qb = rt.product_runner(g_qb, rows=True) if g_qb is not None else run1
        preps = [kernels.preparer(rt.weights[nm].ggml_type, floats=True) for nm in (spec.k_b, spec.v_b)]
        attend, _kc, _vc = rt._cache_args(self._caches[0], 0)
        H = q_abs.shape[0]

        def job(j, stride: int = 1) -> tuple:
            return _rows_table(j, n, stride)
        qa = np.empty((n, g1.rows[0]), np.float32)
        q = np.empty((n, g_qb.rows[0]), np.float32) if g_qb is not None else qa
        caches = typed_layers(tuple((p.mid[3], p.mid[4], p.mid[5], p.mid[6], p.tail[0]) for p in parts))
        fn = rows_mla_runner(run1, run_qb, rt._crew.lead, preps[0], preps[1], attend, run_out)
        return fn, (job(j1), qa, np.empty((n, g1.rows[1]), np.float32), qa_norm, eps,
                    job(jqb) if g_qb is not None else job(j1), q, job(jkb, H), np.empty((n * H, qn.shape[1]), np.float32),
                    np.empty((n, q_abs.size), np.float32), neox, nope, kv_norm, caches, float(spec.scale), job(jvb, H),
                    np.empty((n * H, q_abs.shape[1]), np.float32), np.empty((n, vb_out.size), np.float32), job(jo),
                    np.empty((n, o.shape[-1]), np.float32))

    def sub_products(self, name: str, x: np.ndarray) -> np.ndarray:
        """x [m, n, ne0] through sub-matrix i of 3-D `name` for x[i] (MLA's attn_k_b / attn_v_b
        per head): one matvec per (head, row) as one token's, all in one job (`Runtime.moe`'s
        expert products), never the prompt's matmat."""
        rt = self._rt
        m, n, k = x.shape
        if n == 1:
            return rt.sub_products(name, x)
        heads = np.arange(m * n, dtype=np.int64).reshape(m, n)
        (out,) = rt._expert_products((name,), x.reshape(m * n, k), [(i, heads[i], heads[i]) for i in range(m)], m * n)
        return out.reshape(m, n, -1)

    def _one(self, q, k, v, kv: KVCache, il: int, window: int, scale: float) -> np.ndarray:
        """One row's attention over its own cache at its own position: the one-token attention in
        one compiled call (with the crew's workers when they run the pass, else on this thread
        for a cache on one node), else the runtime's general path for one token; all are the
        single-sequence decode's operations in its order."""
        rt = self._rt
        pos0 = kv.n
        if rt._crewing:
            return rt.attention(q, k, v, kv, il, pos0, window, scale)
        if kv.n_workers != 1 or not USE_CREW:
            return rt.attention(q, k, v, kv, il, pos0, window, scale)
        keys, values = rt._token_jobs(kv, il, q.shape[1] // kv.cfg.n_head_kv)
        start, base = token_window(pos0, window)
        crew = _solo_crew(rt.pool)
        out, ok = one_token_attention(crew.lead)(crew.ctl, 1, keys, values, q[0], k[0], v[0], kv.k[il][0],
                                                 kv.v[il][0], pos0, window, scale, start, base, kv.cap)
        if not ok:
            raise RuntimeError("attention failed")
        return out.reshape(1, q.shape[1], -1)


def _rows_table(job: tuple, n: int, x_stride: int = 1) -> tuple:
    """A one-token job (tasks, chunks, n_owned) over n rows as the compiled calls take it."""
    t = rows_job(job, n, x_stride)
    return t.tasks, t.chunks, t.n_owned


def _rows_ffn_args(head: tuple, n: int, fused: bool) -> tuple:
    """The arguments of `rows_ffn`'s runners for n rows, from the one-token call's (`head` of
    `Runtime._fused_parts` / `_routed_parts`): its jobs as rows jobs, its expert tables, scratch
    n times as big."""
    def job(j) -> tuple:
        return _rows_table(j, n)

    def flat(size: int) -> np.ndarray:
        return np.empty((1, size), dtype=np.float32)
    if fused:
        (on, j1, logits, kind, k, bias, n_groups, n_group_used, norm, scale, _ids, _wts, *tables) = head[:20]
        (sd, g, u, act, d, gs, _us, _acts, ds, out, n_ff, act_kind, gelu, fam_x, fam_a) = head[20:]
        pairs = n * k
        sh = gs.shape[1]
        return (on, job(j1), np.empty((n, logits.shape[0]), np.float32), kind, bias, n_groups, n_group_used,
                norm, scale, np.empty((n, k), np.int64), np.empty((n, k), np.float32), *tables, job(sd),
                flat(pairs * n_ff), flat(pairs * n_ff), np.empty((pairs, n_ff), np.float32), flat(pairs * ds.shape[0]),
                np.empty((n, sh), np.float32), np.empty((n, sh), np.float32), np.empty((n, sh), np.float32),
                np.empty((n, ds.shape[0]), np.float32), np.empty((n, out.shape[1]), np.float32), n_ff, act_kind,
                gelu, fam_x, fam_a)
    (rt_, rc_, ro_, logits, kind, k, bias, n_groups, n_group_used, norm, scale, _ids, _wts, *rest) = head
    tables = rest[:8]
    g, u, d, out, n_ff, act_kind, gelu = rest[8], rest[9], *rest[11:]   # (rest[10]: the one-token act)
    pairs = n * k
    return (job((rt_, rc_, ro_)), np.empty((n, logits.shape[0]), np.float32), kind, bias, n_groups, n_group_used,
            norm, scale, np.empty((n, k), np.int64), np.empty((n, k), np.float32), *tables,
            flat(pairs * (g.shape[0] // k)), flat(1 if u.shape[0] == 1 else pairs * n_ff),
            np.empty((pairs, n_ff), np.float32), flat(pairs * (d.shape[0] // k)),
            np.empty((n, out.shape[0]), np.float32), n_ff, act_kind, gelu)


_SOLO: dict[int, Crew] = {}


def _solo_crew(pool) -> Crew:
    """A one-worker crew: its compiled jobs run on the calling thread (no workers launched)."""
    crew = _SOLO.get(id(pool))
    if crew is None or crew.pool is not pool:
        crew = _SOLO[id(pool)] = Crew(pool, 1)
        crew.start()
    return crew


class _BatchKV:
    """Stands in for the cache in `Decoder._forward`: row i is at its own cache's position;
    the forward's final `kv.n = pos0 + n` advances every cache by its one token."""

    n_ctx = 1 << 62

    def __init__(self, caches: list[KVCache]):
        self.caches = caches

    def positions(self, n: int) -> np.ndarray:
        return np.array([c.n for c in self.caches], dtype=np.int64)

    @property
    def n(self) -> int:
        return 0

    @n.setter
    def n(self, value: int) -> None:
        assert value == len(self.caches)
        for c in self.caches:
            c.n += 1


def batchable(model) -> bool:
    """Whether one forward pass can carry several sequences: the shared attention runs each row on
    its own cache (`_BatchRuntime.attention`), DeepSeek's MLA each row on its latent cache
    (`_BatchRuntime.mla_attention`); another attention of its own decodes its rows one after
    another instead (the same bits)."""
    return model.shares_attention() or model.rows_attention


def decode_batch(engine: Engine, sessions: list[Session], tokens: list[int]) -> np.ndarray:
    """Append one token to each session's cache in one forward pass; logits [n, n_vocab].

    Row i's logits are those `sessions[i].eval([tokens[i]])` gives, to the bit, whatever the
    other rows. The caller holds `engine.lock` (one pass at a time).
    """
    if len(sessions) != len(tokens) or not sessions:
        raise ValueError("one token per session, at least one session")
    for s in sessions:
        if s.kv.n + 1 > s.kv.n_ctx:
            raise ContextFullError(f"context full: {s.kv.n} + 1 tokens exceed n_ctx {s.kv.n_ctx}")
    if len(sessions) == 1 or not batchable(engine.model):
        return np.stack([s.eval([int(t)]) for s, t in zip(sessions, tokens)])
    model, rt = engine.model, engine.rt
    caches = [s.kv for s in sessions]
    view = copy.copy(model)
    view.rt = _BatchRuntime(rt, caches)
    ids = np.asarray(tokens, dtype=np.int64)
    with rt.step(len(ids), rows=True):
        logits = view._forward(ids, _BatchKV(caches), slice(0, len(ids)))
    for s, t in zip(sessions, tokens):
        s.tokens.append(int(t))
    return logits


def stage_batch(engine: Engine, sessions: list[Session], inp: np.ndarray) -> np.ndarray:
    """`decode_batch` for a pipeline stage (`Engine.load(layers=...)`): one new position per
    session, `inp` token ids on the first stage, else the previous stage's hidden rows
    [n, n_embd]; returns this stage's hidden rows, or on the last stage the logits [n, n_vocab].
    Row i's numbers are those of `sessions[i].forward_stage` for its row alone. The caller holds
    `engine.lock`."""
    if len(sessions) != len(inp) or not sessions:
        raise ValueError("one input row per session, at least one session")
    for s in sessions:
        if s.kv.n + 1 > s.kv.n_ctx:
            raise ContextFullError(f"context full: {s.kv.n} + 1 tokens exceed n_ctx {s.kv.n_ctx}")
    if len(sessions) == 1 or not batchable(engine.model):
        return np.concatenate([s.forward_stage(inp[i:i + 1], s.kv.n) for i, s in enumerate(sessions)])
    model, rt = engine.model, engine.rt
    caches = [s.kv for s in sessions]
    view = copy.copy(model)
    view.rt = _BatchRuntime(rt, caches)
    with rt.step(len(inp), rows=True):
        return view._forward(inp, _BatchKV(caches), slice(0, len(inp)))


# ----------------------------------------------------------------------------- requests
@dataclass
class ErrorEvent:
    message: str


class QueueFullError(RuntimeError):
    """Every slot is busy and the queue is full: try again later."""


class ShuttingDownError(RuntimeError):
    """The scheduler no longer accepts requests."""


@dataclass
class Request:
    """One generation: prompt ids, sampling, limits; events go to `on_event` (from the
    scheduler's thread: TokenEvent with new text, then exactly one DoneEvent or ErrorEvent)."""

    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1                  # -1: until the context is full
    stop: list[str] = field(default_factory=list)
    stop_ids: set[int] | None = None     # default: the model's end-of-generation ids
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    on_event: Callable[[object], None] = lambda ev: None
    id: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    # -- state (scheduler thread)
    slot: int = -1
    state: str = "queued"                # queued | prompt | decode | done
    stats: Stats = field(default_factory=Stats)
    t_submit: float = 0.0
    reused: int = 0                      # prompt tokens found in the slot's cache
    kv_nodes: tuple[int, ...] = ()
    _fed: int = 0                        # prompt tokens in the cache so far
    _next: int = -1                      # picked token to feed at the next pass
    _gen: Generation | None = None       # the token loop's bookkeeping (engine/generation.py)

    @property
    def out(self) -> list[int]:
        """Tokens generated so far."""
        return self._gen.out if self._gen is not None else []

    @property
    def t_first(self) -> float:
        return self._gen.t_first if self._gen is not None else 0.0


@dataclass(frozen=True)
class ActiveRequest:
    """What a dashboard shows about one request (see `Scheduler.active`)."""

    id: str
    state: str
    slot: int
    prompt_tokens: int
    reused_tokens: int
    tokens: int
    tps: float
    kv_nodes: tuple[int, ...]
    age: float


class LocalModel:
    """The passes a `Scheduler` runs, over an `Engine` in this process: the logits stay here and
    each request's `Picker` samples them. A model pipelined over hosts (workbench.cluster) offers
    the same methods and samples on its last host; the scheduler cannot tell them apart."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.n_ctx_train = engine.cfg.n_ctx_train

    def open(self, n_ctx: int) -> Session:
        """A sequence slot: a KV cache of n_ctx positions (`.tokens` lists what it holds)."""
        return self.engine.new_session(n_ctx)

    def truncate(self, seq: Session, n: int) -> None:
        """Keep the first n cached positions."""
        seq.kv.truncate(n)
        del seq.tokens[n:]

    def prefill(self, seq: Session, piece: list[int], picker: Picker, first: bool, last: bool) -> int | None:
        """Append a piece of a prompt to the cache; on its last piece, the first token picked."""
        with self.engine.lock:
            logits = seq.eval(piece, batch=PREFILL_BATCH)
        return picker.pick(logits) if last else None

    def decode(self, seqs: list[Session], tokens: list[int], pickers: list[Picker]) -> list[int]:
        """Feed one token to each sequence in one pass; the next token picked for each."""
        with self.engine.lock:
            logits = decode_batch(self.engine, seqs, tokens)
        return [p.pick(lg) for p, lg in zip(pickers, logits)]

    def kv_nodes(self, seq: Session) -> tuple[int, ...]:
        return tuple(sorted({n for b in seq.kv_layout.buffers() for n in b.intended}))

    def close(self, seqs: list[Session]) -> None:
        with self.engine.lock:  # the slots' KV caches go back now, not at garbage collection
            for s in seqs:
                s.close()


@dataclass
class _Slot:
    index: int
    session: Any                          # the model's sequence handle (a Session for LocalModel)
    request: Request | None = None
    prompt: list[int] = field(default_factory=list)  # the last request's prompt (for reuse)
    used: float = 0.0


class Scheduler:
    """Continuous batching over `n_parallel` slots; `submit` from any thread.

    One thread runs the loop: take queued requests into free slots, process one piece of one
    prompt, then one batched pass for every slot that is decoding; requests leave between passes.
    A request that continues a slot's previous request (its prompt starts with that whole
    prompt and goes on, as the next turn of a chat does) reuses the slot's cache, as `Chat`
    does; any other prompt is processed in full, so its numbers are those of
    `Session.generate` on a fresh session.
    """

    def __init__(self, engine: Any, n_parallel: int = 4, n_ctx: int = 4096, max_queue: int = 64):
        """`n_parallel` slots of `n_ctx` tokens each (KV caches placed as the engine's sessions);
        up to `max_queue` requests may wait for a slot. `engine` is an Engine, or any model
        with `LocalModel`'s methods (a pipeline over Ray hosts)."""
        if n_parallel < 1:
            raise ValueError(f"n_parallel must be >= 1 (got {n_parallel})")
        self.engine = engine
        self.model = LocalModel(engine) if isinstance(engine, Engine) else engine
        self.n_ctx = min(n_ctx, self.model.n_ctx_train)
        self.max_queue = max_queue
        self.slots = [_Slot(i, self.model.open(self.n_ctx)) for i in range(n_parallel)]
        self._queue: deque[Request] = deque()
        self._cv = threading.Condition()
        self._accepting = True
        self._stop = False
        self._ids = itertools.count(1)
        self._rr = 0
        # counters (read by metrics; ints and floats written by the loop thread only)
        self.requests_done = 0
        self.requests_failed = 0
        self.requests_cancelled = 0
        self.prompt_tokens_total = 0
        self.decode_tokens_total = 0
        self.passes = 0
        self.pass_rows = 0
        self.busy_seconds = 0.0
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent passes
        self._thread = threading.Thread(target=self._run, name="numawb-scheduler", daemon=True)
        self._thread.start()

    # -- public, any thread ------------------------------------------------------
    @property
    def n_parallel(self) -> int:
        return len(self.slots)

    def submit(self, req: Request) -> Request:
        """Queue a request; raises QueueFullError, ShuttingDownError or ContextFullError."""
        if not req.prompt:
            raise ValueError("empty prompt: nothing to continue from")
        if len(req.prompt) >= self.n_ctx:
            raise ContextFullError(f"the prompt ({len(req.prompt)} tokens) does not fit the context "
                                   f"of {self.n_ctx} tokens per slot")
        req.params.validate()
        with self._cv:
            if not self._accepting:
                raise ShuttingDownError("the server is shutting down")
            if self.running + len(self._queue) >= self.n_parallel + self.max_queue:
                raise QueueFullError(f"all {self.n_parallel} slots are busy and {len(self._queue)} "
                                     "requests are waiting")
            if not req.id:
                req.id = f"req-{next(self._ids)}"
            req.t_submit = time.perf_counter()
            self._queue.append(req)
            self._cv.notify()
        return req

    def cancel(self, req: Request) -> None:
        """Stop a request at the next pass (its slot is freed then)."""
        req.cancel.set()
        with self._cv:
            self._cv.notify()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return sum(1 for s in self.slots if s.request is not None)

    def decode_rate(self, window: float = 5.0) -> float:
        """Tokens per second generated over the last `window` seconds (all requests)."""
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= window]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1e-3)
        return sum(n for _, n in recent) / span

    def active(self) -> list[ActiveRequest]:
        """A thread-safe snapshot of the requests in slots and in the queue, for dashboards."""
        now = time.perf_counter()
        out = []
        with self._cv:
            reqs = [s.request for s in self.slots if s.request is not None] + list(self._queue)
        for r in reqs:
            dt = now - r.t_first if r.t_first else 0.0
            tps = (len(r.out) - 1) / dt if dt > 0 and len(r.out) > 1 else 0.0
            out.append(ActiveRequest(r.id, r.state, r.slot, len(r.prompt), r.reused, len(r.out), tps,
                                     r.kv_nodes, now - r.t_submit))
        return out

    def stop_accepting(self) -> None:
        with self._cv:
            self._accepting = False

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting; let requests finish for up to `timeout` seconds, cancel the rest, and
        release the slots' KV caches."""
        self.stop_accepting()
        deadline = time.perf_counter() + timeout
        while (self.running or self.queued) and time.perf_counter() < deadline and self._thread.is_alive():
            time.sleep(0.02)
        with self._cv:
            for r in list(self._queue) + [s.request for s in self.slots if s.request is not None]:
                r.cancel.set()
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.model.close([s.session for s in self.slots])

    # -- the loop ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._queue and all(s.request is None for s in self.slots):
                    self._cv.wait()
                if self._stop and not self._queue and all(s.request is None for s in self.slots):
                    return
                self._admit()
            try:
                self._iteration()
            except Exception as e:  # noqa: BLE001 - a failed pass fails its requests, not the server
                # a user-facing error (a pipeline host that stopped) is its one line as it is
                msg = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
                for s in self.slots:
                    if s.request is not None:
                        self._finish(s, error=msg)

    def _admit(self) -> None:
        """Queued requests into free slots (under the lock); cancelled queued ones leave."""
        for r in [r for r in self._queue if r.cancel.is_set()]:
            self._queue.remove(r)
            r.state = "done"
            r.stats.stop_reason = "cancelled"
            self.requests_cancelled += 1
            r.on_event(DoneEvent(r.stats, [], ""))
        while self._queue:
            free = [s for s in self.slots if s.request is None]
            if not free:
                break
            req = self._queue.popleft()
            slot = max(free, key=lambda s: (self._reusable(s, req.prompt), -s.used))
            self._start(slot, req)

    def _reusable(self, slot: _Slot, prompt: list[int]) -> int:
        """Cached tokens a prompt may reuse: only when it continues the slot's last request (starts
        with its whole prompt and goes on). Any other prompt, the same one again included, is
        processed in full, so that its numbers are those of a fresh `Session.generate`."""
        if not slot.prompt or len(prompt) <= len(slot.prompt) or prompt[:len(slot.prompt)] != slot.prompt:
            return 0
        return reusable_prefix(slot.session.tokens, prompt)

    def _start(self, slot: _Slot, req: Request) -> None:
        s = slot.session
        keep = self._reusable(slot, req.prompt)
        self.model.truncate(s, keep)
        req.slot, req.state, req.reused, req._fed = slot.index, "prompt", keep, keep
        budget = self.n_ctx - len(req.prompt)
        req.n_predict = budget if req.n_predict < 0 else min(req.n_predict, budget)
        req._gen = Generation(self.model.tokenizer, req.prompt, req.params, req.n_predict, self.n_ctx, req.stop,
                              req.stop_ids, req.frequency_penalty, req.presence_penalty, t0=req.t_submit,
                              stats=req.stats)
        req.stop_ids = req._gen.stop_ids
        req.stats.prompt_tokens = len(req.prompt) - keep
        req.kv_nodes = self.model.kv_nodes(s)
        slot.request, slot.prompt, slot.used = req, list(req.prompt), time.perf_counter()

    def _iteration(self) -> None:
        model = self.model
        # cancelled requests leave first
        for s in self.slots:
            if s.request is not None and s.request.cancel.is_set():
                self._finish(s, reason="cancelled")
        # one piece of one prompt (round robin), so decoding sequences wait at most one piece
        prompts = [s for s in self.slots if s.request is not None and s.request.state == "prompt"]
        if prompts:
            slot = prompts[self._rr % len(prompts)]
            self._rr += 1
            req = slot.request
            t0 = time.perf_counter()
            piece = req.prompt[req._fed:req._fed + PREFILL_BATCH]
            last = req._fed + len(piece) >= len(req.prompt)
            tok = model.prefill(slot.session, piece, req._gen.picker, req._fed == req.reused, last)
            req._fed += len(piece)
            dt = time.perf_counter() - t0
            req.stats.prompt_seconds += dt
            self.busy_seconds += dt
            if last:
                self.prompt_tokens_total += req.stats.prompt_tokens
                req.state = "decode"
                req._gen.begin_decode()
                if req._gen.done:  # the prompt only (as generate -n 0)
                    self._finish(slot)
                else:
                    self._take(slot, tok)
        # one pass for every sequence with a token to feed
        rows = [s for s in self.slots if s.request is not None and s.request.state == "decode"
                and s.request._next >= 0]
        if rows:
            t0 = time.perf_counter()
            picked = model.decode([s.session for s in rows], [s.request._next for s in rows],
                                  [s.request._gen.picker for s in rows])
            dt = time.perf_counter() - t0
            now = time.perf_counter()
            self.busy_seconds += dt
            self.passes += 1
            self.pass_rows += len(rows)
            self.decode_tokens_total += len(rows)
            self._recent.append((now, len(rows)))
            while self._recent and now - self._recent[0][0] > 30:
                self._recent.popleft()
            for s, tok in zip(rows, picked):
                s.request._next = -1
                self._take(s, tok)

    def _take(self, slot: _Slot, tok: int) -> None:
        """The token picked next for a slot's request: give out its text, or finish."""
        req = slot.request
        for ev in req._gen.accept(tok, len(slot.session.tokens)):
            req.on_event(ev)
        if req._gen.done:
            self._finish(slot)
        else:
            req._next = tok

    def _finish(self, slot: _Slot, reason: str = "", error: str = "") -> None:
        req = slot.request
        slot.request = None
        slot.used = time.perf_counter()
        if req._fed < len(req.prompt):  # an unfinished prompt: nothing in the cache to reuse
            slot.prompt = []
        req.state = "done"
        if error:
            self.requests_failed += 1
            req.on_event(ErrorEvent(error))
            return
        events = req._gen.finish(reason or None)
        if req._gen.reason == "cancelled":
            self.requests_cancelled += 1
        else:
            self.requests_done += 1
        for ev in events:
            req.on_event(ev)

"""Float weights (F32, F16, BF16) as explicit SIMD (ggml-cpu vec.cpp / llamafile sgemm orders).

F16 and F32 follow the orders of the llama.cpp build of this host exactly (`llama_build.WIDE`: the
AVX-512 build's 16 lanes, else the AVX2 build's 8); BF16 uses 4 accumulators of 8 lanes.
"""
from __future__ import annotations

import numba
import numpy as np

from ..intrinsics.lanes import f_add, f_zero, f_zero16, fma_f
from ..intrinsics.load_store import (load_bf16x8, load_f16x16, load_f16x8, load_f32x16, load_f32x8, store_f32x16,
                                     store_f32x8)
from ..intrinsics.reductions import hsum16, hsum_f, hsum_hadd_f
from ..intrinsics.scalars import bf16_to_f32, f16_to_f32, fma_s
from ..intrinsics.streams import prefetch
from ..llama_build import WIDE
from .f16_tiles import prompt_tiles, tiled_heads

from ..jitcache import JIT as _NB
f32 = np.float32


def kernels(mode: int) -> dict:
    """(matvec, matmat) of F32, F16, BF16 for one instruction-set mode."""
    def build(load, es, tail):
        @numba.njit(inline="always")
        def dot(w, o, x, xo, k):
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            j = 0
            while j + 32 <= k:
                a0 = fma_f(a0, load(w, o + j * es), load_f32x8(x, xo + j))
                a1 = fma_f(a1, load(w, o + (j + 8) * es), load_f32x8(x, xo + j + 8))
                a2 = fma_f(a2, load(w, o + (j + 16) * es), load_f32x8(x, xo + j + 16))
                a3 = fma_f(a3, load(w, o + (j + 24) * es), load_f32x8(x, xo + j + 24))
                j += 32
            while j + 8 <= k:
                a0 = fma_f(a0, load(w, o + j * es), load_f32x8(x, xo + j))
                j += 8
            s = (hsum_f(a0) + hsum_f(a1)) + (hsum_f(a2) + hsum_f(a3))
            while j < k:
                s += tail(w, o + j * es) * x[xo + j]
                j += 1
            return s

        return _rowwise(dot, dot)

    f16_matvec, f16_matmat, f32_matvec, f32_matmat, _ = _orders512() if WIDE else _orders256()
    return dict(F32=(f32_matvec, f32_matmat), F16=(f16_matvec, f16_matmat),
                BF16=build(load_bf16x8, 2, _bf16_at))


_HEADS: list = []


def heads_kernel():
    """The F16 product of one matrix with several inputs (`kernels.f16_heads`), in the order of
    this host's llama.cpp build (mode-independent: float kernels use no integer dot products)."""
    if not _HEADS:
        _HEADS.append((_orders512() if WIDE else _orders256())[4])
    return _HEADS[0]


# ---- one F16 matrix against several inputs: the query heads that share a KV head (grouped-query
# attention) read the same key rows, and their probabilities the same V^T rows. A row's F16 vectors
# are converted once for a group of 4 inputs instead of once per input; per input the lanes, their
# order and the reduction are the one-column dot's (ggml_vec_dot_f16), so each output is the
# matvec's to the bit. The AVX-512 orders keep a group's 16 accumulators in zmm registers in one
# pass; the AVX2 orders' accumulators are independent along the row, so a group runs them two at a
# time (8 registers for 4 inputs) and combines them in the dot's order at the end. Rows longer
# than HEADS_MAX_K take the inputs two at a time (2 x 16 KB at 4096 values stay in L1).
HEADS_PREFETCH = 2048  # bytes of rows ahead that a row's lines are prefetched (at least one row)
HEADS_MAX_K = 1024  # longer rows: the 4 inputs (4 x 4 KB+) leave L1; one input at a time


@numba.njit(inline="always")
def _pass4(w, o, x, xo, xs, n, oa, ob, step):
    """Two accumulators of a one-column F16 dot (8 lanes at element offsets oa and ob of every
    `step` elements of [0, n)) for the inputs at x[xo], x[xo + xs], x[xo + 2 xs], x[xo + 3 xs]."""
    l0 = f_zero(); h0 = f_zero(); l1 = f_zero(); h1 = f_zero()
    l2 = f_zero(); h2 = f_zero(); l3 = f_zero(); h3 = f_zero()
    j = 0
    while j < n:
        wl = load_f16x8(w, o + (j + oa) * 2)
        wh = load_f16x8(w, o + (j + ob) * 2)
        xa = xo + j + oa
        xb = xo + j + ob
        l0 = fma_f(l0, wl, load_f32x8(x, xa)); h0 = fma_f(h0, wh, load_f32x8(x, xb))
        l1 = fma_f(l1, wl, load_f32x8(x, xa + xs)); h1 = fma_f(h1, wh, load_f32x8(x, xb + xs))
        l2 = fma_f(l2, wl, load_f32x8(x, xa + 2 * xs)); h2 = fma_f(h2, wh, load_f32x8(x, xb + 2 * xs))
        l3 = fma_f(l3, wl, load_f32x8(x, xa + 3 * xs)); h3 = fma_f(h3, wh, load_f32x8(x, xb + 3 * xs))
        j += step
    return l0, h0, l1, h1, l2, h2, l3, h3


@numba.njit(inline="always")
def _tail16(w, o, x, xo, j, k, v):
    """The F16 dot's leftovers (elements j..k-1) added to its vector part in float64, as ggml."""
    s = np.float64(v)
    while j < k:
        s += np.float64(f16_to_f32(w, o + j * 2) * x[xo + j])
        j += 1
    return f32(s)


@numba.njit(inline="always")
def _prefetch_step(w, pf, j):
    """The two lines of row `pf` (a byte offset; < 0: none) that a dot's step of 64 values at
    value j reads: a row prefetched in step with the dot over another."""
    if pf >= 0:
        prefetch(w, pf + j * 2)
        prefetch(w, pf + j * 2 + 64)


@numba.njit(inline="always")
def _prefetch_rest(w, pf, n, k):
    """The lines of values n..k-1 of row `pf` (< 0: none): a dot's leftovers past its steps of 64."""
    if pf >= 0:
        for b in range(2 * n, 2 * k, 64):
            prefetch(w, pf + b)


@numba.njit(inline="always")
def _prefetch_row(w, o, k):
    """Prefetch the k F16 values at byte o of w (the part of a key / V^T row a product reads)."""
    for b in range(0, 2 * k, 64):
        prefetch(w, o + b)


@numba.njit(inline="always")
def _tails4(w, o, x, xo, xs, j, k, v0, v1, v2, v3):
    """`_tail16` of 4 inputs (at x[xo], x[xo + xs], ...) over the same row, their four float64
    chains interleaved: each input's leftovers are added in its own order, as ggml's loop, but the
    four sums' adds overlap instead of waiting on each other (a 160-wide MLA key row's 32 leftovers
    were a quarter of R1's decode at 512 positions)."""
    s0 = np.float64(v0); s1 = np.float64(v1); s2 = np.float64(v2); s3 = np.float64(v3)
    while j < k:
        wj = f16_to_f32(w, o + j * 2)
        s0 += np.float64(wj * x[xo + j])
        s1 += np.float64(wj * x[xo + xs + j])
        s2 += np.float64(wj * x[xo + 2 * xs + j])
        s3 += np.float64(wj * x[xo + 3 * xs + j])
        j += 1
    return f32(s0), f32(s1), f32(s2), f32(s3)


def _heads(dot4, dot2, dot1, unit: int, max_k: int, any_k: bool = False):
    """`kernels.f16_heads` over `dot4` (one row against 4 inputs), `dot2` (against 2) and `dot1`
    (the matvec's dot), all prefetching the row at their argument `pf` (>= 0) as they go; groups
    of 4 inputs for rows of at most `max_k` values (a multiple of `unit`, or any length with
    `any_k`: dot4 takes the leftovers), pairs for longer ones.

    Rows read from memory (a global layer's keys at depth 4096, cold after the token's weights
    went through the caches) are prefetched `HEADS_PREFETCH` bytes ahead in step with the dot: all
    of a row's lines prefetched at once before it, most were dropped (AMD EPYC host, Zen 5, with
    the zmm dots: the scores of 4096 keys 110-114 us a global layer -> 80 us in 2 processes of 5,
    116-119 in the others; what decides between the two is not known)."""
    @numba.njit(**_NB)
    def heads(w, x, xs, k, nh, out, os, r0, r1):
        rb = w.shape[1]
        ahead = max(1, HEADS_PREFETCH // (2 * k))
        for i in range(r0, min(r0 + ahead, r1)):   # (intrinsics.streams.prime_streams)
            _prefetch_row(w, i * rb, k)
        if (k % unit and not any_k) or k > max_k:
            p2 = nh // 2 * 2
            for h in range(0, p2, 2):   # pairs of inputs (the first brings the rows in)
                for i in range(r0, r1):
                    o = i * rb
                    dot2(w, o, x, h * xs, xs, k, out, h * os + i, os, o + ahead * rb if h == 0 else -1)
            for h in range(p2, nh):
                for i in range(r0, r1):
                    o = i * rb
                    out[h * os + i] = dot1(w, o, x, h * xs, k, o + ahead * rb if h == 0 else -1)
            return
        g = nh // 4 * 4
        for i in range(r0, r1):
            o = i * rb
            pf = o + ahead * rb
            for h in range(0, g, 4):
                dot4(w, o, x, h * xs, xs, k, out, h * os + i, os, pf)
                pf = -1   # the row's lines are on their way
            for h in range(g, nh):
                out[h * os + i] = dot1(w, o, x, h * xs, k, pf)
                pf = -1
    return heads


def _orders512():
    """F16 and F32 (matvec, matmat) in the orders of llama.cpp's AVX-512 build (16-lane vectors)."""
    # F16 follows ggml's AVX-512 orders exactly (f16*f16 products are exact in f32, so only the
    # order of the additions matters): matmat = llamafile tinyBLAS<16> (used by ggml for >= 2
    # columns): lane j % 16 accumulates in order, then GCC's _mm512_reduce_add_ps tree;
    # matvec = ggml_vec_dot_f16: 4 accumulators x 16 lanes over steps of 64, (0+2)+(1+3), the
    # same tree, leftovers (k % 64) added in float64.
    @numba.njit(inline="always")
    def red16(lo, hi):
        return hsum_f(f_add(lo, hi))

    @numba.njit(inline="always")
    def dot16_pf(w, o, x, xo, k, pf):
        """dot16_vec, the row at byte pf (>= 0) prefetched two lines a step as it goes."""
        # the 4 accumulators of 16 lanes in zmm registers (one conversion and one FMA per 16 values;
        # the f32x8 halves of each took two)
        a0 = f_zero16(); a1 = f_zero16(); a2 = f_zero16(); a3 = f_zero16()
        j = 0
        while j + 64 <= k:
            _prefetch_step(w, pf, j)
            a0 = fma_f(a0, load_f16x16(w, o + j * 2), load_f32x16(x, xo + j))
            a1 = fma_f(a1, load_f16x16(w, o + (j + 16) * 2), load_f32x16(x, xo + j + 16))
            a2 = fma_f(a2, load_f16x16(w, o + (j + 32) * 2), load_f32x16(x, xo + j + 32))
            a3 = fma_f(a3, load_f16x16(w, o + (j + 48) * 2), load_f32x16(x, xo + j + 48))
            j += 64
        _prefetch_rest(w, pf, j, k)
        return _tail16(w, o, x, xo, j, k, hsum16(f_add(f_add(a0, a2), f_add(a1, a3))))

    @numba.njit(inline="always")
    def dot16_vec(w, o, x, xo, k):
        return dot16_pf(w, o, x, xo, k, -1)

    @numba.njit(inline="always")
    def dot16_pair(w, o, x, xo, xs, k, out, oo, os, pf):
        """dot16_pf of one row with the inputs at x[xo] and x[xo + xs] (rows too long for 4 inputs in
        L1: 2 x 16 KB at 4096 values fit), each 16 values of the row converted once for both."""
        a0 = f_zero16(); a1 = f_zero16(); a2 = f_zero16(); a3 = f_zero16()
        b0 = f_zero16(); b1 = f_zero16(); b2 = f_zero16(); b3 = f_zero16()
        n = k // 64 * 64
        j = 0
        while j < n:
            _prefetch_step(w, pf, j)
            wp = o + j * 2
            w0 = load_f16x16(w, wp); w1 = load_f16x16(w, wp + 32)
            w2 = load_f16x16(w, wp + 64); w3 = load_f16x16(w, wp + 96)
            a0, a1, a2, a3 = acc4(a0, a1, a2, a3, w0, w1, w2, w3, x, xo + j)
            b0, b1, b2, b3 = acc4(b0, b1, b2, b3, w0, w1, w2, w3, x, xo + xs + j)
            j += 64
        _prefetch_rest(w, pf, n, k)
        out[oo] = _tail16(w, o, x, xo, n, k, hsum16(f_add(f_add(a0, a2), f_add(a1, a3))))
        out[oo + os] = _tail16(w, o, x, xo + xs, n, k, hsum16(f_add(f_add(b0, b2), f_add(b1, b3))))

    @numba.njit(inline="always")
    def dot16_tiny(w, o, x, xo, k):
        if k % 16:
            return dot16_vec(w, o, x, xo, k)
        a = f_zero16()
        j = 0
        while j < k:
            a = fma_f(a, load_f16x16(w, o + j * 2), load_f32x16(x, xo + j))
            j += 16
        return hsum16(a)

    # ---- F16 matmat in register tiles of 3 rows x 4 columns (attention in prefill: keys or V^T rows
    # against query or probability columns).  A dot of 16 lanes is a chain of FMAs (4 cycles each):
    # one dot at a time waits on that latency, 12 independent ones keep both FMA pipes busy, and each
    # row's 16 values are converted once for 4 columns.  Per output the lanes, their order and the
    # final tree are dot16_tiny's, so results do not depend on the tiling.
    f16_tile, f16_row4 = _tiles(load_f16x16, 2, load_f32x16, f_zero16, hsum16, 16)
    f16_matmat = prompt_tiles(load_f16x16, 2, load_f32x16, store_f32x16, f_zero16, hsum16, 16,
                              _tiled_matmat(16, dot16_vec, f16_tile, f16_row4, dot16_tiny))
    f16_matvec = _rowwise(dot16_vec, dot16_tiny)[0]

    @numba.njit(inline="always")
    def acc4(s0, s1, s2, s3, w0, w1, w2, w3, x, xo):
        """One input's 4 accumulators of dot16_vec over one step of 64 (x at element xo)."""
        return (fma_f(s0, w0, load_f32x16(x, xo)), fma_f(s1, w1, load_f32x16(x, xo + 16)),
                fma_f(s2, w2, load_f32x16(x, xo + 32)), fma_f(s3, w3, load_f32x16(x, xo + 48)))

    @numba.njit(inline="always")
    def dot16_heads4(w, o, x, xo, xs, k, out, oo, os, pf):
        """dot16_vec of one row with 4 inputs in one pass: 16 accumulators, each 16 values of the row
        converted once for the 4 inputs; the row at byte pf (>= 0) prefetched in step, two lines
        a step (a row's lines prefetched all at once before the row, most were dropped)."""
        n = k // 64 * 64
        _prefetch_rest(w, pf, n, k)
        a0 = f_zero16(); a1 = f_zero16(); a2 = f_zero16(); a3 = f_zero16()
        b0 = f_zero16(); b1 = f_zero16(); b2 = f_zero16(); b3 = f_zero16()
        c0 = f_zero16(); c1 = f_zero16(); c2 = f_zero16(); c3 = f_zero16()
        d0 = f_zero16(); d1 = f_zero16(); d2 = f_zero16(); d3 = f_zero16()
        j = 0
        while j < n:
            wp = o + j * 2
            _prefetch_step(w, pf, j)
            w0 = load_f16x16(w, wp); w1 = load_f16x16(w, wp + 32)
            w2 = load_f16x16(w, wp + 64); w3 = load_f16x16(w, wp + 96)
            a0, a1, a2, a3 = acc4(a0, a1, a2, a3, w0, w1, w2, w3, x, xo + j)
            b0, b1, b2, b3 = acc4(b0, b1, b2, b3, w0, w1, w2, w3, x, xo + xs + j)
            c0, c1, c2, c3 = acc4(c0, c1, c2, c3, w0, w1, w2, w3, x, xo + 2 * xs + j)
            d0, d1, d2, d3 = acc4(d0, d1, d2, d3, w0, w1, w2, w3, x, xo + 3 * xs + j)
            j += 64
        r0, r1, r2, r3 = _tails4(w, o, x, xo, xs, n, k, hsum16(f_add(f_add(a0, a2), f_add(a1, a3))),
                                 hsum16(f_add(f_add(b0, b2), f_add(b1, b3))),
                                 hsum16(f_add(f_add(c0, c2), f_add(c1, c3))),
                                 hsum16(f_add(f_add(d0, d2), f_add(d1, d3))))
        out[oo] = r0
        out[oo + os] = r1
        out[oo + 2 * os] = r2
        out[oo + 3 * os] = r3

    f16_heads = tiled_heads(_heads(dot16_heads4, dot16_pair, dot16_pf, 64, HEADS_MAX_K, any_k=True), _tail16,
                            HEADS_PREFETCH)

    # F32 in ggml's AVX-512 orders (the structure of F16's, products rounded by the FMAs): one column
    # = ggml_vec_dot_f32 (4 accumulators x 16 lanes over steps of 64, (0+2)+(1+3), GCC's
    # _mm512_reduce_add_ps tree, leftovers k % 64 accumulated in f32); >= 2 columns = llamafile's
    # tinyBLAS<16> when k % 16 == 0 and the weight's rows % 4 == 0 (16 lanes in order, the same tree),
    # else ggml's vec_dot per column.  (The router's ffn_gate_inp of a mixture of experts.)
    @numba.njit(inline="always")
    def dot32_vec(w, o, x, xo, k):
        a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
        a4 = f_zero(); a5 = f_zero(); a6 = f_zero(); a7 = f_zero()
        j = 0
        while j + 64 <= k:
            a0 = fma_f(a0, load_f32x8(w, o + j * 4), load_f32x8(x, xo + j))
            a1 = fma_f(a1, load_f32x8(w, o + (j + 8) * 4), load_f32x8(x, xo + j + 8))
            a2 = fma_f(a2, load_f32x8(w, o + (j + 16) * 4), load_f32x8(x, xo + j + 16))
            a3 = fma_f(a3, load_f32x8(w, o + (j + 24) * 4), load_f32x8(x, xo + j + 24))
            a4 = fma_f(a4, load_f32x8(w, o + (j + 32) * 4), load_f32x8(x, xo + j + 32))
            a5 = fma_f(a5, load_f32x8(w, o + (j + 40) * 4), load_f32x8(x, xo + j + 40))
            a6 = fma_f(a6, load_f32x8(w, o + (j + 48) * 4), load_f32x8(x, xo + j + 48))
            a7 = fma_f(a7, load_f32x8(w, o + (j + 56) * 4), load_f32x8(x, xo + j + 56))
            j += 64
        lo = f_add(f_add(a0, a4), f_add(a2, a6))
        hi = f_add(f_add(a1, a5), f_add(a3, a7))
        s = red16(lo, hi)
        while j < k:
            s = fma_s(_f32_at(w, o + j * 4), x[xo + j], s)
            j += 1
        return s

    @numba.njit(inline="always")
    def dot32_tiny(w, o, x, xo, k):
        lo = f_zero(); hi = f_zero()
        j = 0
        while j < k:
            lo = fma_f(lo, load_f32x8(w, o + j * 4), load_f32x8(x, xo + j))
            hi = fma_f(hi, load_f32x8(w, o + (j + 8) * 4), load_f32x8(x, xo + j + 8))
            j += 16
        return red16(lo, hi)

    # the tiles of F16's tinyBLAS: each output's lanes, order and tree are dot32_tiny's (its f32x8
    # halves are a zmm register's), so an output does not depend on the tiling. One dot at a time
    # waited on its FMAs' latency: the router of a mixture of experts (512 tokens x 1024 x 128 a
    # layer) ran 40-45 GFLOP/s, 3 % of the synthetic Qwen3-MoE prefill
    f32_tile, f32_row4 = _tiles(load_f32x16, 4, load_f32x16, f_zero16, hsum16, 16)
    f32_matvec, f32_matmat = _f32_products(16, dot32_vec, dot32_tiny, f32_tile, f32_row4)
    return f16_matvec, f16_matmat, f32_matvec, f32_matmat, f16_heads


def _rowwise(dot_vec, dot_mat):
    """matvec / matmat of float weights: one dot per output (dot_vec for one column)."""
    @numba.njit(**_NB)
    def matvec(w, xp, out, r0, r1):
        x = xp[0]
        k = x.shape[0]
        rb = w.shape[1]
        # one stream: a row of each half in turn (intrinsics.streams.TWO_STREAMS_MIN) read F16 / F32 rows
        # of 1.3-8 KB no faster (Intel Xeon host, K = 640 / 2048 from memory: F16 12.4 -> 12.0 /
        # 12.4 -> 11.6 GB/s, F32 15.5 -> 15.4 / 15.8 -> 14.1)
        for i in range(r0, r1):
            out[i] = dot_vec(w, i * rb, x, 0, k)

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        x = xp[0]
        k = x.shape[1]
        xf = x.reshape(-1)
        rb = w.shape[1]
        for i in range(r0, r1):
            for c in range(x.shape[0]):
                out[c, i] = dot_mat(w, i * rb, xf, c * k, k)

    return matvec, matmat


def _orders256():
    """F16 and F32 (matvec, matmat) in the orders of llama.cpp's AVX2 build (8-lane vectors):
    one column = ggml_vec_dot_f16 / _f32 with 4 accumulators x 8 lanes over steps of 32, reduced
    by GGML_F32x8_REDUCE ((0+2)+(1+3), then the halves added and two hadds: `hsum_hadd_f`),
    leftovers (k % 32) added in float64 (F16) or by FMA in float32 (F32); >= 2 columns =
    tinyBLAS<8> (one 8-lane accumulator per output in order, then its hsum: `hsum_f`) when
    k % 8 == 0 (F32: and the weight's rows % 4 == 0), else the one-column order."""
    @numba.njit(inline="always")
    def dot_vec(w, o, x, xo, k, es):
        a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
        j = 0
        while j + 32 <= k:
            if es == 2:
                a0 = fma_f(a0, load_f16x8(w, o + j * 2), load_f32x8(x, xo + j))
                a1 = fma_f(a1, load_f16x8(w, o + (j + 8) * 2), load_f32x8(x, xo + j + 8))
                a2 = fma_f(a2, load_f16x8(w, o + (j + 16) * 2), load_f32x8(x, xo + j + 16))
                a3 = fma_f(a3, load_f16x8(w, o + (j + 24) * 2), load_f32x8(x, xo + j + 24))
            else:
                a0 = fma_f(a0, load_f32x8(w, o + j * 4), load_f32x8(x, xo + j))
                a1 = fma_f(a1, load_f32x8(w, o + (j + 8) * 4), load_f32x8(x, xo + j + 8))
                a2 = fma_f(a2, load_f32x8(w, o + (j + 16) * 4), load_f32x8(x, xo + j + 16))
                a3 = fma_f(a3, load_f32x8(w, o + (j + 24) * 4), load_f32x8(x, xo + j + 24))
            j += 32
        return hsum_hadd_f(f_add(f_add(a0, a2), f_add(a1, a3))), j

    @numba.njit(inline="always")
    def dot16_vec(w, o, x, xo, k):
        r, j = dot_vec(w, o, x, xo, k, 2)
        return _tail16(w, o, x, xo, j, k, r)

    @numba.njit(inline="always")
    def dot32_vec(w, o, x, xo, k):
        s, j = dot_vec(w, o, x, xo, k, 4)
        while j < k:
            s = fma_s(_f32_at(w, o + j * 4), x[xo + j], s)
            j += 1
        return s

    @numba.njit(inline="always")
    def dot_tiny(w, o, x, xo, k, es):
        a = f_zero()
        j = 0
        while j < k:
            if es == 2:
                a = fma_f(a, load_f16x8(w, o + j * 2), load_f32x8(x, xo + j))
            else:
                a = fma_f(a, load_f32x8(w, o + j * 4), load_f32x8(x, xo + j))
            j += 8
        return hsum_f(a)

    # F16 and F32 matmat in register tiles of 3 rows x 4 columns (attention in prefill; a mixture of
    # experts' router), as the 16-lane tiles above: per output the lanes, their order and the final
    # tree are dot_tiny's
    f16_tile, f16_row4 = _tiles(load_f16x8, 2, load_f32x8, f_zero, hsum_f, 8)
    f32_tile, f32_row4 = _tiles(load_f32x8, 4, load_f32x8, f_zero, hsum_f, 8)

    @numba.njit(inline="always")
    def dot16_tiny(w, o, x, xo, k):
        return dot_tiny(w, o, x, xo, k, 2)

    @numba.njit(inline="always")
    def dot32_tiny(w, o, x, xo, k):
        return dot_tiny(w, o, x, xo, k, 4)

    @numba.njit(inline="always")
    def dot16_heads4(w, o, x, xo, xs, k, out, oo, os, pf):
        """dot16_vec of one row with 4 inputs: accumulators a0 + a2, then a1 + a3 of each (the row
        at byte pf >= 0 prefetched first)."""
        if pf >= 0:
            _prefetch_row(w, pf, k)
        n = k // 32 * 32
        a0, b0, a1, b1, a2, b2, a3, b3 = _pass4(w, o, x, xo, xs, n, 0, 16, 32)
        c0, d0, c1, d1, c2, d2, c3, d3 = _pass4(w, o, x, xo, xs, n, 8, 24, 32)
        out[oo] = _tail16(w, o, x, xo, n, k, hsum_hadd_f(f_add(f_add(a0, b0), f_add(c0, d0))))
        out[oo + os] = _tail16(w, o, x, xo + xs, n, k, hsum_hadd_f(f_add(f_add(a1, b1), f_add(c1, d1))))
        out[oo + 2 * os] = _tail16(w, o, x, xo + 2 * xs, n, k, hsum_hadd_f(f_add(f_add(a2, b2), f_add(c2, d2))))
        out[oo + 3 * os] = _tail16(w, o, x, xo + 3 * xs, n, k, hsum_hadd_f(f_add(f_add(a3, b3), f_add(c3, d3))))

    @numba.njit(inline="always")
    def dot16_pf(w, o, x, xo, k, pf):
        if pf >= 0:
            _prefetch_row(w, pf, k)
        return dot16_vec(w, o, x, xo, k)

    @numba.njit(inline="always")
    def dot16_pair(w, o, x, xo, xs, k, out, oo, os, pf):
        out[oo] = dot16_pf(w, o, x, xo, k, pf)
        out[oo + os] = dot16_vec(w, o, x, xo + xs, k)

    f16_matvec = _rowwise(dot16_vec, dot16_tiny)[0]
    f16_matmat = prompt_tiles(load_f16x8, 2, load_f32x8, store_f32x8, f_zero, hsum_f, 8,
                              _tiled_matmat(8, dot16_vec, f16_tile, f16_row4, dot16_tiny))
    f32_matvec, f32_matmat = _f32_products(8, dot32_vec, dot32_tiny, f32_tile, f32_row4)
    return f16_matvec, f16_matmat, f32_matvec, f32_matmat, _heads(dot16_heads4, dot16_pair, dot16_pf, 32, HEADS_MAX_K)


@numba.njit(inline="always")
def _f32_at(w, off):
    return w.reshape(-1)[off:off + 4].view(np.float32)[0]


@numba.njit(inline="always")
def _bf16_at(w, off):
    return bf16_to_f32(w, off)


def _tiled_matmat(lanes: int, dot_vec, tile, row4, tiny):
    """F16 (and AVX-512 F32) matmat in register tiles of 3 rows x 4 columns when k % lanes == 0 (tinyBLAS<lanes>), one
    row against 4 columns for the rows left, `tiny` for the columns left; else `dot_vec` per output."""
    @numba.njit(**_NB)
    def f16_matmat(w, xp, out, r0, r1):
        x = xp[0]
        n, k = x.shape
        xf = x.reshape(-1)
        rb = w.shape[1]
        if k % lanes:
            for i in range(r0, r1):
                for c in range(n):
                    out[c, i] = dot_vec(w, i * rb, xf, c * k, k)
            return
        c = 0
        while c + 4 <= n:
            i = r0
            while i + 3 <= r1:
                tile(w, i * rb, rb, xf, c * k, k, out, c, i)
                i += 3
            while i < r1:
                row4(w, i * rb, xf, c * k, k, out, c, i)
                i += 1
            c += 4
        while c < n:
            for i in range(r0, r1):
                out[c, i] = tiny(w, i * rb, xf, c * k, k)
            c += 1

    return f16_matmat


def _tiles(load, es: int, load_x, zero, hsum, lanes: int):
    """(tile, row4) of a tinyBLAS over float weights of `es` bytes, `lanes` at a time (`load` reads
    the weights' lanes at a byte offset, `load_x` the inputs', `zero` / `hsum` make and reduce an
    accumulator): register tiles of 3 rows x 4 columns, 12 independent accumulators (one dot at a
    time waits on the FMA latency, 12 keep both FMA pipes busy; each row's values loaded -- and for
    F16 converted -- once for 4 columns), and one row against 4 columns. Per output the lanes,
    their order and the final tree are those of one dot of `lanes` lanes (`hsum`)."""
    @numba.njit(inline="always")
    def tile(w, o, rb, x, xo, k, out, c, i):
        """out[c:c+4, i:i+3] (weights rows i.. at byte o, stride rb; x columns c.. at xo, stride k)."""
        p0 = zero(); p1 = zero(); p2 = zero(); p3 = zero()
        q0 = zero(); q1 = zero(); q2 = zero(); q3 = zero()
        s0 = zero(); s1 = zero(); s2 = zero(); s3 = zero()
        j = 0
        while j < k:
            wp = o + j * es
            a = load(w, wp); b = load(w, wp + rb); d = load(w, wp + 2 * rb)
            x0 = xo + j
            xv = load_x(x, x0)
            p0 = fma_f(p0, a, xv); q0 = fma_f(q0, b, xv); s0 = fma_f(s0, d, xv)
            xv = load_x(x, x0 + k)
            p1 = fma_f(p1, a, xv); q1 = fma_f(q1, b, xv); s1 = fma_f(s1, d, xv)
            xv = load_x(x, x0 + 2 * k)
            p2 = fma_f(p2, a, xv); q2 = fma_f(q2, b, xv); s2 = fma_f(s2, d, xv)
            xv = load_x(x, x0 + 3 * k)
            p3 = fma_f(p3, a, xv); q3 = fma_f(q3, b, xv); s3 = fma_f(s3, d, xv)
            j += lanes
        out[c, i] = hsum(p0); out[c + 1, i] = hsum(p1)
        out[c + 2, i] = hsum(p2); out[c + 3, i] = hsum(p3)
        out[c, i + 1] = hsum(q0); out[c + 1, i + 1] = hsum(q1)
        out[c + 2, i + 1] = hsum(q2); out[c + 3, i + 1] = hsum(q3)
        out[c, i + 2] = hsum(s0); out[c + 1, i + 2] = hsum(s1)
        out[c + 2, i + 2] = hsum(s2); out[c + 3, i + 2] = hsum(s3)

    @numba.njit(inline="always")
    def row4(w, o, x, xo, k, out, c, i):
        """out[c:c+4, i]: one row against 4 columns."""
        p0 = zero(); p1 = zero(); p2 = zero(); p3 = zero()
        j = 0
        while j < k:
            a = load(w, o + j * es)
            p0 = fma_f(p0, a, load_x(x, xo + j))
            p1 = fma_f(p1, a, load_x(x, xo + j + k))
            p2 = fma_f(p2, a, load_x(x, xo + j + 2 * k))
            p3 = fma_f(p3, a, load_x(x, xo + j + 3 * k))
            j += lanes
        out[c, i] = hsum(p0); out[c + 1, i] = hsum(p1)
        out[c + 2, i] = hsum(p2); out[c + 3, i] = hsum(p3)

    return tile, row4


def _f32_products(lanes: int, dot_vec, tiny, tile=None, row4=None):
    """F32 matvec (ggml_vec_dot_f32) and matmat: tinyBLAS<lanes> when there are >= 2 columns, k % lanes
    == 0 and the weight's rows % 4 == 0 (in `tile` / `row4` register tiles when given, else `tiny`
    per output), else vec_dot per column."""
    f32_matvec = _rowwise(dot_vec, tiny)[0]
    tiled = None if tile is None else _tiled_matmat(lanes, dot_vec, tile, row4, tiny)

    @numba.njit(**_NB)
    def f32_matmat(w, xp, out, r0, r1):
        x = xp[0]
        n, k = x.shape
        use_tiny = n >= 2 and k % lanes == 0 and w.shape[0] % 4 == 0
        if use_tiny and tiled is not None:
            tiled(w, xp, out, r0, r1)
            return
        xf = x.reshape(-1)
        rb = w.shape[1]
        for i in range(r0, r1):
            for c in range(n):
                if use_tiny:
                    out[c, i] = tiny(w, i * rb, xf, c * k, k)
                else:
                    out[c, i] = dot_vec(w, i * rb, xf, c * k, k)

    return f32_matvec, f32_matmat

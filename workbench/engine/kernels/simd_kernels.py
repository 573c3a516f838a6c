"""Explicit-SIMD kernels (256-bit) for the "avx2" and "avx512-vnni" paths.

Each kernel factory closes over ``mode`` (simd.AVX2 or simd.VNNI); Numba treats the closure
value as a compile-time constant and the primitives emit only that instruction set, so one source
gives two separately compiled (and separately cached) implementations.

Integer work per block is exact and follows ggml: Q8_0 uses the sign trick (|w| . sign(w)*x);
Q4_0/Q5_0 multiply unsigned quants and remove the offset inside the i32 lanes with the
precomputed group-of-4 activation sums (``n4``); K-quants use pmaddubsw then pmaddwd/vpdpwssd
with the sub-block scales.  Lanes are converted to f32 and fused-multiply-added with the block
scale product, like ggml's AVX2 code.

matvec streams one row at a time with one f32 chain per row in block order.  matmat loops over
column tiles outermost (the tile's activations stay in L1 while the weight rows stream past) and
reuses each unpacked weight block for every column of the tile: Q4_0/Q5_0 in 2 rows x 8 columns
register tiles, F16 in 3 x 4, Q4_K/Q6_K with 8 rows in the lanes of a vector (weights regrouped
once per call) and 4 columns.  Per output the accumulation order never depends on the tiling.
For Q8_0 and Q5_0 that order is llama.cpp's (ggml_vec_dot_q{8,5}_0_q8_0 / tinyBLAS_Q0_AVX): the
results are bit-identical to it.

K-quant sub-block scales are gathered into one i16x16 vector per super-block and selected with
constant shuffles (``madd_sv``) rather than moved one scalar at a time into vector registers.

The compiled kernels are cached on disk with a process-independent key (``_StableCache``).
"""
from __future__ import annotations

import hashlib
import os

import numba
import numpy as np
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher

from . import k_quants as _kq
from .simd import (AVX2, VNNI, b_add, b_and, bf16_to_f32, b_or, b_shl, b_shr, dot_ss, dot_us, f16_to_f32, f_zero,
                   f_add, fma_f, fmadd_i, hsum_f, i_add0, i_zero, load_b32, load_bf16x8, load_bits16,
                   load_f16x8, load_f32x8, load_i8, load_nib, madd_sv, ld_u32, mins_dot, scales_i8, scales_k4,
                   fma_s, hsum_i, i_sub, q6_offset, reduce4, load_i32x4, load_f32x4, f4_zero, i4_mul_add,
                   f4_scale, fma4_i, f4_sub, f4_lane, i_shl,
                   fmadd_im, store_f32x4, bcast_b4, bcast_i32, madd16, i_add, i_mul, fmadd_v, f_scale, f_sub, f_lane,
                   fma_sv)

_NB = dict(nogil=True, cache=True)
f32 = np.float32
_MODES = {"avx2": AVX2, "avx512-vnni": VNNI}
# Q4_K / Q6_K prompts regroup 8 weight rows per call (rows in vector lanes) from this many
# columns on; fewer columns take the per-row code, whose float order is the same
REGROUP_COLUMNS = 32


# ============================================================================= legacy quants
@numba.njit(**_NB)
def _pack_q8_0(xq, xd, n4, shift):
    """Q8_0 activations of columns [0, n - n % 8) regrouped by tiles of 8 columns, block by block:
    xt [tile, block, column, 32] quants, mt [tile, block, column, 8] = n4 << shift (the lanes'
    initial values), st [tile, block, column] scales.  A tile's block is then 3 short contiguous
    runs: few pointers (no register spills) and vector loads of the columns' scales."""
    n = xq.shape[0]
    nb = xd.shape[1]
    nt = n // 8
    xt = np.empty(nt * nb * 256, np.int8)
    mt = np.empty(nt * nb * 64, np.int32)
    st = np.empty(nt * nb * 8, np.float32)
    for t in range(nt):
        for b in range(nb):
            e = (t * nb + b) * 8
            for j in range(8):
                c = 8 * t + j
                xt[(e + j) * 32:(e + j + 1) * 32] = xq[c, b * 32:(b + 1) * 32]
                for q in range(8):
                    mt[(e + j) * 8 + q] = np.int32(n4[c, b * 8 + q]) << shift
                st[e + j] = xd[c, b]
    return xt, mt, st


@numba.njit(**_NB)
def _block_scales(w, r0, r1, nb, bsz):
    """float32 [(r1 - r0) * nb]: the f16 scale (first field) of every block of rows r0..r1-1."""
    out = np.empty((r1 - r0) * nb, np.float32)
    rb = w.shape[1]
    for i in range(r0, r1):
        for b in range(nb):
            out[(i - r0) * nb + b] = f16_to_f32(w, i * rb + b * bsz)
    return out


def _legacy(mode):
    @numba.njit(inline="always")
    def q8_0_lanes(w, o, xq, xo):
        return dot_ss(mode, i_zero(), load_b32(w, o + 2), load_b32(xq, xo))

    @numba.njit(inline="always")
    def q4_1_lanes(w, o, xq, xo):
        return dot_us(mode, i_zero(), load_nib(w, o + 4), load_b32(xq, xo))

    @numba.njit(inline="always")
    def q5_1_lanes(w, o, xq, xo):
        q = b_or(load_nib(w, o + 8), load_bits16(w, o + 4))
        return dot_us(mode, i_zero(), q, load_b32(xq, xo))

    # ---- matvec: per-block (lanes, scale, extra) functions and one 4-accumulator driver
    @numba.njit(inline="always")
    def q4_1_blk(w, base, b, xq, xd, xa):
        o = base + b * 20
        return q4_1_lanes(w, o, xq, b * 32), f16_to_f32(w, o) * xd[b], f16_to_f32(w, o + 2) * xa[b]

    @numba.njit(inline="always")
    def q5_1_blk(w, base, b, xq, xd, xa):
        o = base + b * 24
        return q5_1_lanes(w, o, xq, b * 32), f16_to_f32(w, o) * xd[b], f16_to_f32(w, o + 2) * xa[b]

    def make_matvec(blk):
        # one f32x8 accumulator in block order, then hsum (+ the min terms summed in block order):
        # exactly ggml's x86 vec_dot_q*_q8_* (acc = fmadd(d, q, acc); hsum_float_8(acc) + summs),
        # which llama.cpp runs for one-token products; several accumulators would be faster but
        # round differently from llama.cpp
        @numba.njit(**_NB)
        def matvec(w, xp, out, r0, r1):
            xq, xd, xa = xp
            nb = xd.shape[0]
            rb = w.shape[1]
            for i in range(r0, r1):
                base = i * rb
                a0 = f_zero()
                e0 = f32(0.0)
                for b in range(nb):
                    l, s, e = blk(w, base, b, xq, xd, xa)
                    a0 = fmadd_i(a0, l, s); e0 += e
                out[i] = hsum_f(a0) + e0
        return matvec

    q4_1_matvec = make_matvec(q4_1_blk)
    q5_1_matvec = make_matvec(q5_1_blk)

    # Q4_0/Q5_0 matvec: one row at a time, ONE f32 chain per row in block order -- llama.cpp's order
    # (ggml_vec_dot_q5_0_q8_0: acc = fma(f32(lanes), d_w * d_x, acc), hsum_float_8), so results are
    # bit-identical to it; offsets pre-shifted once per call (see make_matmat).  (Interleaving 2 or 4
    # rows to break the FMA chain measured slower here: the single sequential stream wins.)
    def make_offset_matvec(unpack, bsz, shift):
        @numba.njit(**_NB)
        def matvec(w, xp, out, r0, r1):
            xq, xd, n4 = xp
            nb = xd.shape[0]
            rb = w.shape[1]
            ns = (n4 << shift).astype(np.int32)
            for i in range(r0, r1):
                a0 = f_zero()
                base = i * rb
                for b in range(nb):
                    o0 = base + b * bsz
                    a0 = fmadd_i(a0, dot_us(mode, load_i8(ns, b * 8), unpack(w, o0), load_b32(xq, b * 32)),
                                 f16_to_f32(w, o0) * xd[b])
                out[i] = hsum_f(a0)
        return matvec

    # ---- matmat: register tiles of 2 rows x 8 columns over activations regrouped per tile
    # (_pack_q8_0).  The loop over column tiles is outermost, so a tile's activations (~10 KB at
    # k=640) stay in L1 while the weight rows stream past.  Per dot the loop issues just the VNNI
    # dot, the int -> float conversion and the FMA (its scale d_w * d_x an embedded-broadcast load
    # from a per-tile table made 4 products per multiply); a weight block is unpacked once for 8
    # columns.  (The FP pipes are the limit: 2 x 8 beats 4 x 4, which unpacks twice as often.)
    # Per (row, column) the block order and the f32 accumulation are those of the single-column
    # loop, so results do not depend on the tiling.
    #
    # Q4_0/Q5_0: lanes = dpbusd(init, u, x) with u the unsigned quants (nibble, nibble | bit5 << 4) and
    # init = n4 << shift (n4 = -sum of each group of 4 activation quants; shift 3 or 4 = log2 of the
    # offset), the shift done once per call instead of per block.  (Q8_0 keeps the sign trick: with
    # u = q + 128 AVX2's pmaddubsw would saturate.)
    @numba.njit(inline="always")
    def u_q4_0(w, o):
        return load_nib(w, o + 2)

    @numba.njit(inline="always")
    def u_q5_0(w, o):
        # nibble + 16 where the 5th bit is set (= nibble | 16): one masked vpaddb on AVX-512
        return b_add(load_nib(w, o + 6), load_bits16(w, o + 2))

    @numba.njit(inline="always")
    def col2(a0, a1, u0, u1, xt, xo, mt, mo, sc, so, j):
        """Column j of a tile: both rows' accumulators after one block (scale products at sc[so:])."""
        x = load_b32(xt, xo + 32 * j)
        m = load_i8(mt, mo + 8 * j)
        return fmadd_im(a0, dot_us(mode, m, u0, x), sc, so + j), fmadd_im(a1, dot_us(mode, m, u1, x), sc, so + 8 + j)

    @numba.njit(inline="always")
    def col1(a0, u0, xt, xo, mt, mo, sc, so, j):
        return fmadd_im(a0, dot_us(mode, load_i8(mt, mo + 8 * j), u0, load_b32(xt, xo + 32 * j)), sc, so + j)

    @numba.njit(inline="always")
    def tile_scales(sc, st, t, nb, dws, r, rows):
        """sc[b * 16 + 8 * q + j] = d_w(row r + q, block b) * d_x(column j of tile t, block b) for
        q < rows: a tile's scale products, before its block loop."""
        for b in range(nb):
            lo = load_f32x4(st, (t * nb + b) * 8)
            hi = load_f32x4(st, (t * nb + b) * 8 + 4)
            for q in range(rows):
                d = dws[(r + q) * nb + b]
                store_f32x4(sc, b * 16 + 8 * q, f4_scale(lo, d))
                store_f32x4(sc, b * 16 + 8 * q + 4, f4_scale(hi, d))

    @numba.njit(inline="always")
    def put8(out, c, i, a0, a1, a2, a3, a4, a5, a6, a7):
        out[c, i] = hsum_f(a0); out[c + 1, i] = hsum_f(a1)
        out[c + 2, i] = hsum_f(a2); out[c + 3, i] = hsum_f(a3)
        out[c + 4, i] = hsum_f(a4); out[c + 5, i] = hsum_f(a5)
        out[c + 6, i] = hsum_f(a6); out[c + 7, i] = hsum_f(a7)

    def make_matmat(unpack, bsz, shift):
        @numba.njit(**_NB)
        def matmat(w, xp, out, r0, r1):
            xq, xd, n4 = xp
            n = xq.shape[0]
            nb = xd.shape[1]
            rb = w.shape[1]
            k = xq.shape[1]
            k4 = k // 4
            xt, mt, st = _pack_q8_0(xq, xd, n4, shift)
            dws = _block_scales(w, r0, r1, nb, bsz)
            sc = np.empty(nb * 16, np.float32)
            for t in range(n // 8):
                c = 8 * t
                i = r0
                while i < r1:
                    two = i + 2 <= r1
                    tile_scales(sc, st, t, nb, dws, i - r0, 2 if two else 1)
                    a00 = f_zero(); a01 = f_zero(); a02 = f_zero(); a03 = f_zero()
                    a04 = f_zero(); a05 = f_zero(); a06 = f_zero(); a07 = f_zero()
                    if two:
                        a10 = f_zero(); a11 = f_zero(); a12 = f_zero(); a13 = f_zero()
                        a14 = f_zero(); a15 = f_zero(); a16 = f_zero(); a17 = f_zero()
                        for b in range(nb):
                            o0 = i * rb + b * bsz
                            u0 = unpack(w, o0)
                            u1 = unpack(w, o0 + rb)
                            e = t * nb + b
                            xo = e * 256
                            mo = e * 64
                            so = b * 16
                            a00, a10 = col2(a00, a10, u0, u1, xt, xo, mt, mo, sc, so, 0)
                            a01, a11 = col2(a01, a11, u0, u1, xt, xo, mt, mo, sc, so, 1)
                            a02, a12 = col2(a02, a12, u0, u1, xt, xo, mt, mo, sc, so, 2)
                            a03, a13 = col2(a03, a13, u0, u1, xt, xo, mt, mo, sc, so, 3)
                            a04, a14 = col2(a04, a14, u0, u1, xt, xo, mt, mo, sc, so, 4)
                            a05, a15 = col2(a05, a15, u0, u1, xt, xo, mt, mo, sc, so, 5)
                            a06, a16 = col2(a06, a16, u0, u1, xt, xo, mt, mo, sc, so, 6)
                            a07, a17 = col2(a07, a17, u0, u1, xt, xo, mt, mo, sc, so, 7)
                        put8(out, c, i + 1, a10, a11, a12, a13, a14, a15, a16, a17)
                    else:
                        for b in range(nb):
                            u0 = unpack(w, i * rb + b * bsz)
                            e = t * nb + b
                            xo = e * 256
                            mo = e * 64
                            so = b * 16
                            a00 = col1(a00, u0, xt, xo, mt, mo, sc, so, 0)
                            a01 = col1(a01, u0, xt, xo, mt, mo, sc, so, 1)
                            a02 = col1(a02, u0, xt, xo, mt, mo, sc, so, 2)
                            a03 = col1(a03, u0, xt, xo, mt, mo, sc, so, 3)
                            a04 = col1(a04, u0, xt, xo, mt, mo, sc, so, 4)
                            a05 = col1(a05, u0, xt, xo, mt, mo, sc, so, 5)
                            a06 = col1(a06, u0, xt, xo, mt, mo, sc, so, 6)
                            a07 = col1(a07, u0, xt, xo, mt, mo, sc, so, 7)
                    put8(out, c, i, a00, a01, a02, a03, a04, a05, a06, a07)
                    i += 2 if two else 1
            xf = xq.reshape(-1)
            ns = n4.reshape(-1)
            for c in range(n - n % 8, n):
                for i in range(r0, r1):
                    acc = f_zero()
                    for b in range(nb):
                        o0 = i * rb + b * bsz
                        m = i_shl(load_i8(ns, c * k4 + b * 8), shift)
                        acc = fmadd_i(acc, dot_us(mode, m, unpack(w, o0), load_b32(xf, c * k + b * 32)),
                                      f16_to_f32(w, o0) * xd[c, b])
                    out[c, i] = hsum_f(acc)
        return matmat

    # Q8_0: 1 row x 4 columns (sign trick per pair)
    @numba.njit(**_NB)
    def q8_0_matmat(w, xp, out, r0, r1):
        xq, xd, _ = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        rb = w.shape[1]
        k = xq.shape[1]
        xf = xq.reshape(-1)
        for i in range(r0, r1):
            base = i * rb
            c = 0
            while c + 4 <= n:
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                for b in range(nb):
                    o = base + b * 34
                    wv = load_b32(w, o + 2)
                    dw = f16_to_f32(w, o)
                    xo = c * k + b * 32
                    a0 = fmadd_i(a0, dot_ss(mode, i_zero(), wv, load_b32(xf, xo)), dw * xd[c, b])
                    a1 = fmadd_i(a1, dot_ss(mode, i_zero(), wv, load_b32(xf, xo + k)), dw * xd[c + 1, b])
                    a2 = fmadd_i(a2, dot_ss(mode, i_zero(), wv, load_b32(xf, xo + 2 * k)), dw * xd[c + 2, b])
                    a3 = fmadd_i(a3, dot_ss(mode, i_zero(), wv, load_b32(xf, xo + 3 * k)), dw * xd[c + 3, b])
                out[c, i] = hsum_f(a0); out[c + 1, i] = hsum_f(a1)
                out[c + 2, i] = hsum_f(a2); out[c + 3, i] = hsum_f(a3)
                c += 4
            while c < n:
                acc = f_zero()
                for b in range(nb):
                    o = base + b * 34
                    acc = fmadd_i(acc, q8_0_lanes(w, o, xf, c * k + b * 32), f16_to_f32(w, o) * xd[c, b])
                out[c, i] = hsum_f(acc)
                c += 1

    q4_0_matmat = make_matmat(u_q4_0, 18, 3)
    q5_0_matmat = make_matmat(u_q5_0, 22, 4)
    q4_0_matvec = make_offset_matvec(u_q4_0, 18, 3)
    q5_0_matvec = make_offset_matvec(u_q5_0, 22, 4)

    # Q8_0 matvec: one f32 chain per row in block order, written out (llama.cpp's ggml_vec_dot_q8_0_q8_0
    # order; make_matvec's four accumulators happened to compile to one chain, which is not a guarantee)
    @numba.njit(**_NB)
    def q8_0_matvec(w, xp, out, r0, r1):
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        for i in range(r0, r1):
            acc = f_zero()
            base = i * rb
            for b in range(nb):
                o = base + b * 34
                acc = fmadd_i(acc, q8_0_lanes(w, o, xq, b * 32), f16_to_f32(w, o) * xd[b])
            out[i] = hsum_f(acc)

    def make_min_matmat(lanes, bsz):
        # Q4_1 / Q5_1 (blocks with a min): one f32x8 accumulator plus the min terms, per column
        @numba.njit(**_NB)
        def matmat(w, xp, out, r0, r1):
            xq, xd, xs = xp
            n = xq.shape[0]
            nb = xd.shape[1]
            rb = w.shape[1]
            k = xq.shape[1]
            xf = xq.reshape(-1)
            for i in range(r0, r1):
                base = i * rb
                for c in range(n):
                    acc = f_zero()
                    accm = f32(0.0)
                    for b in range(nb):
                        o = base + b * bsz
                        acc = fmadd_i(acc, lanes(w, o, xf, c * k + b * 32), f16_to_f32(w, o) * xd[c, b])
                        accm += f16_to_f32(w, o + 2) * xs[c, b]
                    out[c, i] = hsum_f(acc) + accm
        return matmat

    q4_1_matmat = make_min_matmat(q4_1_lanes, 20)
    q5_1_matmat = make_min_matmat(q5_1_lanes, 24)

    return dict(Q8_0=(q8_0_matvec, q8_0_matmat), Q4_0=(q4_0_matvec, q4_0_matmat),
                Q5_0=(q5_0_matvec, q5_0_matmat), Q4_1=(q4_1_matvec, q4_1_matmat),
                Q5_1=(q5_1_matvec, q5_1_matmat))


# ============================================================================= K quants
@numba.njit(inline="always")
def _k4_scales(wf, o):
    """The 12 packed Q4_K/Q5_K scale bytes at wf[o:] -> (scales 0-3, scales 4-7, mins 0-3, mins 4-7),
    one 6-bit value per byte of four uint32 (ggml's kmask word trick)."""
    u0 = ld_u32(wf, o)
    u1 = ld_u32(wf, o + 4)
    u2 = ld_u32(wf, o + 8)
    m6 = np.uint32(0x3F3F3F3F)
    m4 = np.uint32(0x0F0F0F0F)
    m2 = np.uint32(0x03030303)
    sl = u0 & m6
    sh = (u2 & m4) | (((u0 >> np.uint32(6)) & m2) << np.uint32(4))
    ml = u1 & m6
    mh = ((u2 >> np.uint32(4)) & m4) | (((u1 >> np.uint32(6)) & m2) << np.uint32(4))
    return sl, sh, ml, mh


@numba.njit(**_NB)
def _repack_q4_K(w, r0, ng, nb):
    """Q4_K rows r0 .. r0 + 8 * ng regrouped by 8 rows, for dot products whose lanes are rows.

    qt (bytes) [group, block, sub-block j, chunk e, row, 4]: quants 4e..4e+3 of sub-block j (one byte
    each); sc [group, block, j, row] scales; mn [group, block, pair p, row] = m_2p | m_2p+1 << 16;
    dw, dm [group, block, row] the f16 d and dmin as float32."""
    rb = w.shape[1]
    wf = w.reshape(-1)
    qt = np.empty(ng * nb * 2048, np.uint8)
    q32 = qt.view(np.uint32)
    sc = np.empty(ng * nb * 64, np.int32)
    mn = np.empty(ng * nb * 32, np.int32)
    dw = np.empty(ng * nb * 8, np.float32)
    dm = np.empty(ng * nb * 8, np.float32)
    lo4 = np.uint32(0x0F0F0F0F)
    for g in range(ng):
        for b in range(nb):
            gb = g * nb + b
            for r in range(8):
                o = (r0 + 8 * g + r) * rb + b * 144
                dw[gb * 8 + r] = f16_to_f32(w, o)
                dm[gb * 8 + r] = f16_to_f32(w, o + 2)
                sl, sh, ml, mh = _k4_scales(wf, o + 4)
                for j in range(4):
                    sc[(gb * 8 + j) * 8 + r] = np.int32((sl >> np.uint32(8 * j)) & np.uint32(0xFF))
                    sc[(gb * 8 + 4 + j) * 8 + r] = np.int32((sh >> np.uint32(8 * j)) & np.uint32(0xFF))
                mn[(gb * 4 + 0) * 8 + r] = np.int32((ml & np.uint32(0xFF)) | ((ml & np.uint32(0xFF00)) << np.uint32(8)))
                mn[(gb * 4 + 1) * 8 + r] = np.int32(((ml >> np.uint32(16)) & np.uint32(0xFF)) | ((ml >> np.uint32(24)) << np.uint32(16)))
                mn[(gb * 4 + 2) * 8 + r] = np.int32((mh & np.uint32(0xFF)) | ((mh & np.uint32(0xFF00)) << np.uint32(8)))
                mn[(gb * 4 + 3) * 8 + r] = np.int32(((mh >> np.uint32(16)) & np.uint32(0xFF)) | ((mh >> np.uint32(24)) << np.uint32(16)))
                for p in range(4):
                    for e in range(8):
                        u = ld_u32(wf, o + 16 + 32 * p + 4 * e)
                        q32[((gb * 8 + 2 * p) * 8 + e) * 8 + r] = u & lo4
                        q32[((gb * 8 + 2 * p + 1) * 8 + e) * 8 + r] = (u >> np.uint32(4)) & lo4
    return qt, sc, mn, dw, dm


@numba.njit(**_NB)
def _bsum_pairs(xb, nb):
    """int32 [n, nb, 4]: per pair p of 32-element sub-blocks, bsum_2p | bsum_2p+1 << 16 (i16 pairs for
    pmaddwd; |bsum| <= 32 * 127 fits)."""
    n = xb.shape[0]
    out = np.empty(n * nb * 4, np.uint32)
    for c in range(n):
        for b in range(nb):
            for p in range(4):
                j = b * 16 + 4 * p
                s0 = np.uint32(np.int32(xb[c, j] + xb[c, j + 1]) & 0xFFFF)
                s1 = np.uint32(np.int32(xb[c, j + 2] + xb[c, j + 3]) & 0xFFFF)
                out[(c * nb + b) * 4 + p] = s0 | (s1 << np.uint32(16))
    return out.view(np.int32)


@numba.njit(**_NB)
def _repack_q6_K(w, r0, ng, nb):
    """Q6_K rows r0 .. r0 + 8 * ng regrouped by 8 rows (see _repack_q4_K).

    qt (bytes) [group, block, chunk e, row, 4]: unsigned 6-bit quants 4e..4e+3 of the block;
    sc [group, block, j, row] the 16 signed sub-block scales; sp [group, block, pair, row] the same
    as i16 pairs (sc_2p, sc_2p+1); dw [group, block, row] d as float32."""
    rb = w.shape[1]
    wf = w.reshape(-1)
    ws = w.view(np.int8).reshape(-1)
    qt = np.empty(ng * nb * 2048, np.uint8)
    q32 = qt.view(np.uint32)
    sc = np.empty(ng * nb * 128, np.int32)
    sp = np.empty(ng * nb * 64, np.uint32)
    dw = np.empty(ng * nb * 8, np.float32)
    lo4 = np.uint32(0x0F0F0F0F)
    lo2 = np.uint32(0x03030303)
    for g in range(ng):
        for b in range(nb):
            gb = g * nb + b
            for r in range(8):
                o = (r0 + 8 * g + r) * rb + b * 210
                dw[gb * 8 + r] = f16_to_f32(w, o + 208)
                for j in range(16):
                    sc[(gb * 16 + j) * 8 + r] = np.int32(ws[o + 192 + j])
                for p in range(8):
                    lo = np.uint32(np.int32(ws[o + 192 + 2 * p]) & 0xFFFF)
                    hi = np.uint32(np.int32(ws[o + 193 + 2 * p]) & 0xFFFF)
                    sp[(gb * 8 + p) * 8 + r] = lo | (hi << np.uint32(16))
                for h in range(2):
                    for i in range(8):
                        l1 = ld_u32(wf, o + 64 * h + 4 * i)
                        l2 = ld_u32(wf, o + 64 * h + 32 + 4 * i)
                        hh = ld_u32(wf, o + 128 + 32 * h + 4 * i)
                        e = 32 * h + i
                        q32[((gb * 64 + e) * 8 + r)] = (l1 & lo4) | ((hh & lo2) << np.uint32(4))
                        q32[((gb * 64 + e + 8) * 8 + r)] = (l2 & lo4) | (((hh >> np.uint32(2)) & lo2) << np.uint32(4))
                        q32[((gb * 64 + e + 16) * 8 + r)] = ((l1 >> np.uint32(4)) & lo4) | (((hh >> np.uint32(4)) & lo2) << np.uint32(4))
                        q32[((gb * 64 + e + 24) * 8 + r)] = ((l2 >> np.uint32(4)) & lo4) | (((hh >> np.uint32(6)) & lo2) << np.uint32(4))
    return qt, sc, sp.view(np.int32), dw


@numba.njit(**_NB)
def _bsum16_pairs(xb):
    """int32 [n, k / 32]: bsum_2p | bsum_2p+1 << 16 of the 16-element bsums (i16 pairs for pmaddwd)."""
    n, k16 = xb.shape
    out = np.empty(n * (k16 // 2), np.uint32)
    for c in range(n):
        for p in range(k16 // 2):
            s0 = np.uint32(xb[c, 2 * p] & 0xFFFF)
            s1 = np.uint32(xb[c, 2 * p + 1] & 0xFFFF)
            out[c * (k16 // 2) + p] = s0 | (s1 << np.uint32(16))
    return out.view(np.int32)


def _kquants(mode):
    # Sub-block scales: one i16x16 vector per super-block (Q4_K/Q5_K: lanes 0-7 scales, 8-15 mins;
    # Q6_K: its 16 int8 scales); madd_sv picks a pair of lanes with a constant shuffle.
    @numba.njit(inline="always")
    def k4_pair(l, lo, hi, xq, xo, sv, j0, j1):
        l = madd_sv(mode, l, lo, load_b32(xq, xo), sv, j0, j0)
        return madd_sv(mode, l, hi, load_b32(xq, xo + 32), sv, j1, j1)

    @numba.njit(inline="always")
    def q4_K_unpack(wf, o, jp):
        raw = load_b32(wf, o + 16 + 32 * jp)
        return b_and(raw, 15), b_shr(raw, 4)

    @numba.njit(inline="always")
    def q5_K_unpack(wf, o, qh, jp):
        raw = load_b32(wf, o + 48 + 32 * jp)
        h = b_shr(qh, 2 * jp)
        return b_or(b_and(raw, 15), b_shl(b_and(h, 1), 4)), b_or(b_shr(raw, 4), b_shl(b_and(h, 2), 3))

    @numba.njit(inline="always")
    def q4_K_dot(wf, o, xq, xo, xd, xb, bo):
        """(integer lanes of sum_j sc_j*dot_j, sum_j m_j*bsum_j) of one super-block."""
        sl, sh, ml, mh = _k4_scales(wf, o + 4)
        sv = scales_k4(sl, sh, ml, mh)
        acc = i_zero()
        lo, hi = q4_K_unpack(wf, o, 0)
        acc = k4_pair(acc, lo, hi, xq, xo, sv, 0, 1)
        lo, hi = q4_K_unpack(wf, o, 1)
        acc = k4_pair(acc, lo, hi, xq, xo + 64, sv, 2, 3)
        lo, hi = q4_K_unpack(wf, o, 2)
        acc = k4_pair(acc, lo, hi, xq, xo + 128, sv, 4, 5)
        lo, hi = q4_K_unpack(wf, o, 3)
        acc = k4_pair(acc, lo, hi, xq, xo + 192, sv, 6, 7)
        return acc, mins_dot(ml, mh, xb, bo)

    @numba.njit(inline="always")
    def q5_K_dot(wf, o, xq, xo, xd, xb, bo):
        sl, sh, ml, mh = _k4_scales(wf, o + 4)
        sv = scales_k4(sl, sh, ml, mh)
        qh = load_b32(wf, o + 16)
        acc = i_zero()
        lo, hi = q5_K_unpack(wf, o, qh, 0)
        acc = k4_pair(acc, lo, hi, xq, xo, sv, 0, 1)
        lo, hi = q5_K_unpack(wf, o, qh, 1)
        acc = k4_pair(acc, lo, hi, xq, xo + 64, sv, 2, 3)
        lo, hi = q5_K_unpack(wf, o, qh, 2)
        acc = k4_pair(acc, lo, hi, xq, xo + 128, sv, 4, 5)
        lo, hi = q5_K_unpack(wf, o, qh, 3)
        acc = k4_pair(acc, lo, hi, xq, xo + 192, sv, 6, 7)
        return acc, mins_dot(ml, mh, xb, bo)

    @numba.njit(inline="always")
    def q6_K_unpack(wf, o, h):
        ql0 = load_b32(wf, o + 64 * h)
        ql1 = load_b32(wf, o + 64 * h + 32)
        qh = load_b32(wf, o + 128 + 32 * h)
        q1 = b_or(b_and(ql0, 15), b_shl(b_and(qh, 3), 4))
        q2 = b_or(b_and(ql1, 15), b_shl(b_and(qh, 12), 2))
        q3 = b_or(b_shr(ql0, 4), b_and(qh, 48))
        q4 = b_or(b_shr(ql1, 4), b_shr(b_and(qh, 192), 2))
        return q1, q2, q3, q4

    @numba.njit(inline="always")
    def k6_half0(l, q1, q2, q3, q4, xq, x0, sv):
        l = madd_sv(mode, l, q1, load_b32(xq, x0), sv, 0, 1)
        l = madd_sv(mode, l, q2, load_b32(xq, x0 + 32), sv, 2, 3)
        l = madd_sv(mode, l, q3, load_b32(xq, x0 + 64), sv, 4, 5)
        return madd_sv(mode, l, q4, load_b32(xq, x0 + 96), sv, 6, 7)

    @numba.njit(inline="always")
    def k6_half1(l, q1, q2, q3, q4, xq, x0, sv):
        l = madd_sv(mode, l, q1, load_b32(xq, x0), sv, 8, 9)
        l = madd_sv(mode, l, q2, load_b32(xq, x0 + 32), sv, 10, 11)
        l = madd_sv(mode, l, q3, load_b32(xq, x0 + 64), sv, 12, 13)
        return madd_sv(mode, l, q4, load_b32(xq, x0 + 96), sv, 14, 15)

    @numba.njit(inline="always")
    def q6_K_dot(wf, ws, o, xq, xo, xb, bo):
        """Integer lanes of sum_j sc_j * sum (q-32)*x, laid out like ggml_vec_dot_q6_K_q8_K's AVX2 lanes
        (unsigned quants, then the -32 offset per lane via the bsums)."""
        sv = scales_i8(wf, o + 192)
        q1, q2, q3, q4 = q6_K_unpack(wf, o, 0)
        acc = k6_half0(i_zero(), q1, q2, q3, q4, xq, xo, sv)
        q1, q2, q3, q4 = q6_K_unpack(wf, o, 1)
        acc = k6_half1(acc, q1, q2, q3, q4, xq, xo + 128, sv)
        return i_sub(acc, q6_offset(sv, xb, bo))   # ggml's per-lane offset: lane m gets sc[2m], sc[2m+1]

    @numba.njit(**_NB)
    def q4_K_matvec(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        for i in range(r0, r1):
            acc = f32(0.0)
            accm = f32(0.0)
            for b in range(nb):
                o = i * rb + b * 144
                lanes, summ = q4_K_dot(wf, o, xq, b * 256, xd, xb, b * 16)
                # ggml_gemv_q4_K_8x8_q8_K's order: one FMA per super-block on the exact integer sums
                acc = fma_s(f32(hsum_i(lanes)), f16_to_f32(w, o) * xd[b], acc)
                accm = fma_s(f32(summ), f16_to_f32(w, o + 2) * xd[b], accm)
            out[i] = acc - accm

    @numba.njit(**_NB)
    def q5_K_matvec(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        for i in range(r0, r1):
            acc = f_zero()
            accm = f32(0.0)
            for b in range(nb):
                o = i * rb + b * 176
                lanes, summ = q5_K_dot(wf, o, xq, b * 256, xd, xb, b * 16)
                acc = fmadd_i(acc, lanes, f16_to_f32(w, o) * xd[b])
                accm += (f16_to_f32(w, o + 2) * xd[b]) * f32(summ)
            out[i] = hsum_f(acc) - accm

    @numba.njit(**_NB)
    def q6_K_matvec(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        ws = w.view(np.int8).reshape(-1)
        for i in range(r0, r1):
            acc = f_zero()
            for b in range(nb):
                o = i * rb + b * 210
                acc = fmadd_i(acc, q6_K_dot(wf, ws, o, xq, b * 256, xb, b * 16), f16_to_f32(w, o + 208) * xd[b])
            out[i] = hsum_f(acc)

    # ---- matmat: column tiles of 4 outermost (the tile's activations stay in L1), then rows; each
    # super-block is unpacked once per row and used for the 4 columns.  Per column the integer
    # lanes (exact) and the f32 accumulation order are those of the single-column loop below.
    def make_k4_matmat(q5, bsz):
        @numba.njit(**_NB)
        def matmat(w, xp, out, r0, r1):
            xq, xd, xb = xp
            n = xq.shape[0]
            nb = xd.shape[1]
            rb = w.shape[1]
            k = xq.shape[1]
            k16 = xb.shape[1]
            wf = w.reshape(-1)
            xf = xq.reshape(-1)
            xbf = xb.reshape(-1)
            c = 0
            while c + 4 <= n:
                for i in range(r0, r1):
                    a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                    m0 = f32(0.0); m1 = f32(0.0); m2 = f32(0.0); m3 = f32(0.0)
                    for b in range(nb):
                        o = i * rb + b * bsz
                        sl, sh, ml, mh = _k4_scales(wf, o + 4)
                        sv = scales_k4(sl, sh, ml, mh)
                        qh = load_b32(wf, o + 16)  # (Q5_K's high bits; unused for Q4_K)
                        xo = c * k + b * 256
                        lo, hi = q5_K_unpack(wf, o, qh, 0) if q5 else q4_K_unpack(wf, o, 0)
                        l0 = k4_pair(i_zero(), lo, hi, xf, xo, sv, 0, 1)
                        l1 = k4_pair(i_zero(), lo, hi, xf, xo + k, sv, 0, 1)
                        l2 = k4_pair(i_zero(), lo, hi, xf, xo + 2 * k, sv, 0, 1)
                        l3 = k4_pair(i_zero(), lo, hi, xf, xo + 3 * k, sv, 0, 1)
                        lo, hi = q5_K_unpack(wf, o, qh, 1) if q5 else q4_K_unpack(wf, o, 1)
                        l0 = k4_pair(l0, lo, hi, xf, xo + 64, sv, 2, 3)
                        l1 = k4_pair(l1, lo, hi, xf, xo + 64 + k, sv, 2, 3)
                        l2 = k4_pair(l2, lo, hi, xf, xo + 64 + 2 * k, sv, 2, 3)
                        l3 = k4_pair(l3, lo, hi, xf, xo + 64 + 3 * k, sv, 2, 3)
                        lo, hi = q5_K_unpack(wf, o, qh, 2) if q5 else q4_K_unpack(wf, o, 2)
                        l0 = k4_pair(l0, lo, hi, xf, xo + 128, sv, 4, 5)
                        l1 = k4_pair(l1, lo, hi, xf, xo + 128 + k, sv, 4, 5)
                        l2 = k4_pair(l2, lo, hi, xf, xo + 128 + 2 * k, sv, 4, 5)
                        l3 = k4_pair(l3, lo, hi, xf, xo + 128 + 3 * k, sv, 4, 5)
                        lo, hi = q5_K_unpack(wf, o, qh, 3) if q5 else q4_K_unpack(wf, o, 3)
                        l0 = k4_pair(l0, lo, hi, xf, xo + 192, sv, 6, 7)
                        l1 = k4_pair(l1, lo, hi, xf, xo + 192 + k, sv, 6, 7)
                        l2 = k4_pair(l2, lo, hi, xf, xo + 192 + 2 * k, sv, 6, 7)
                        l3 = k4_pair(l3, lo, hi, xf, xo + 192 + 3 * k, sv, 6, 7)
                        dw = f16_to_f32(w, o)
                        dm = f16_to_f32(w, o + 2)
                        bo = c * k16 + b * 16
                        a0 = fmadd_i(a0, l0, dw * xd[c, b])
                        m0 += (dm * xd[c, b]) * f32(mins_dot(ml, mh, xbf, bo))
                        a1 = fmadd_i(a1, l1, dw * xd[c + 1, b])
                        m1 += (dm * xd[c + 1, b]) * f32(mins_dot(ml, mh, xbf, bo + k16))
                        a2 = fmadd_i(a2, l2, dw * xd[c + 2, b])
                        m2 += (dm * xd[c + 2, b]) * f32(mins_dot(ml, mh, xbf, bo + 2 * k16))
                        a3 = fmadd_i(a3, l3, dw * xd[c + 3, b])
                        m3 += (dm * xd[c + 3, b]) * f32(mins_dot(ml, mh, xbf, bo + 3 * k16))
                    out[c, i] = hsum_f(a0) - m0
                    out[c + 1, i] = hsum_f(a1) - m1
                    out[c + 2, i] = hsum_f(a2) - m2
                    out[c + 3, i] = hsum_f(a3) - m3
                c += 4
            while c < n:
                xqc = xq[c]; xbc = xb[c]
                for i in range(r0, r1):
                    acc = f_zero()
                    accm = f32(0.0)
                    for b in range(nb):
                        o = i * rb + b * bsz
                        if q5:
                            lanes, summ = q5_K_dot(wf, o, xqc, b * 256, xd, xbc, b * 16)
                        else:
                            lanes, summ = q4_K_dot(wf, o, xqc, b * 256, xd, xbc, b * 16)
                        acc = fmadd_i(acc, lanes, f16_to_f32(w, o) * xd[c, b])
                        accm += (f16_to_f32(w, o + 2) * xd[c, b]) * f32(summ)
                    out[c, i] = hsum_f(acc) - accm
                c += 1
        return matmat

    q5_K_matmat = make_k4_matmat(True, 176)

    # Q6_K matmat in llama.cpp's orders: fewer than 8 columns -> ggml_vec_dot_q6_K_q8_K per column (f32x8
    # lanes, as matvec); 8 or more -> the tiled matmul: per column one scalar chain over super-blocks,
    # out = fma(f32(S) * d_w, d_x, out) with S the block's exact integer sum.
    @numba.njit(inline="always")
    def q6_tiled(a, l, d, xdv):
        return fma_s(f32(hsum_i(l)) * d, xdv, a)

    @numba.njit(**_NB)
    def q6_K_matmat_rows(w, xp, out, r0, r1):
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        rb = w.shape[1]
        k = xq.shape[1]
        k16 = xb.shape[1]
        wf = w.reshape(-1)
        ws = w.view(np.int8).reshape(-1)
        xf = xq.reshape(-1)
        xbf = xb.reshape(-1)
        tiled = n >= 8
        c = 0
        while c + 4 <= n:
            for i in range(r0, r1):
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                t0 = f32(0.0); t1 = f32(0.0); t2 = f32(0.0); t3 = f32(0.0)
                for b in range(nb):
                    o = i * rb + b * 210
                    sv = scales_i8(wf, o + 192)
                    x0 = c * k + b * 256
                    q1, q2, q3, q4 = q6_K_unpack(wf, o, 0)
                    l0 = k6_half0(i_zero(), q1, q2, q3, q4, xf, x0, sv)
                    l1 = k6_half0(i_zero(), q1, q2, q3, q4, xf, x0 + k, sv)
                    l2 = k6_half0(i_zero(), q1, q2, q3, q4, xf, x0 + 2 * k, sv)
                    l3 = k6_half0(i_zero(), q1, q2, q3, q4, xf, x0 + 3 * k, sv)
                    q1, q2, q3, q4 = q6_K_unpack(wf, o, 1)
                    l0 = k6_half1(l0, q1, q2, q3, q4, xf, x0 + 128, sv)
                    l1 = k6_half1(l1, q1, q2, q3, q4, xf, x0 + 128 + k, sv)
                    l2 = k6_half1(l2, q1, q2, q3, q4, xf, x0 + 128 + 2 * k, sv)
                    l3 = k6_half1(l3, q1, q2, q3, q4, xf, x0 + 128 + 3 * k, sv)
                    d = f16_to_f32(w, o + 208)
                    bo = c * k16 + b * 16
                    l0 = i_sub(l0, q6_offset(sv, xbf, bo))
                    l1 = i_sub(l1, q6_offset(sv, xbf, bo + k16))
                    l2 = i_sub(l2, q6_offset(sv, xbf, bo + 2 * k16))
                    l3 = i_sub(l3, q6_offset(sv, xbf, bo + 3 * k16))
                    if tiled:
                        t0 = q6_tiled(t0, l0, d, xd[c, b]); t1 = q6_tiled(t1, l1, d, xd[c + 1, b])
                        t2 = q6_tiled(t2, l2, d, xd[c + 2, b]); t3 = q6_tiled(t3, l3, d, xd[c + 3, b])
                    else:
                        a0 = fmadd_i(a0, l0, d * xd[c, b]); a1 = fmadd_i(a1, l1, d * xd[c + 1, b])
                        a2 = fmadd_i(a2, l2, d * xd[c + 2, b]); a3 = fmadd_i(a3, l3, d * xd[c + 3, b])
                if tiled:
                    out[c, i] = t0; out[c + 1, i] = t1; out[c + 2, i] = t2; out[c + 3, i] = t3
                else:
                    out[c, i] = hsum_f(a0); out[c + 1, i] = hsum_f(a1)
                    out[c + 2, i] = hsum_f(a2); out[c + 3, i] = hsum_f(a3)
            c += 4
        while c < n:
            xqc = xq[c]; xbc = xb[c]
            for i in range(r0, r1):
                acc = f_zero()
                t0 = f32(0.0)
                for b in range(nb):
                    o = i * rb + b * 210
                    l0 = q6_K_dot(wf, ws, o, xqc, b * 256, xbc, b * 16)
                    d = f16_to_f32(w, o + 208)
                    if tiled:
                        t0 = q6_tiled(t0, l0, d, xd[c, b])
                    else:
                        acc = fmadd_i(acc, l0, d * xd[c, b])
                out[c, i] = t0 if tiled else hsum_f(acc)
            c += 1

    # Q4_K matmat in llama.cpp's orders: columns [0, n - n % 4) as ggml_gemm_q4_K_8x8_q8_K (one FMA per
    # pair of sub-blocks on the exact integer pair sums, for the scaled and the min parts), the last
    # n % 4 columns as the gemv (one FMA per super-block).  Tiles of 4 columns are exactly the gemm ones.
    # Whole groups of 8 rows go through q4_K_gemm_rows8 (rows in lanes); the rest, row by row, here.
    @numba.njit(**_NB)
    def q4_K_gemm_rows(w, xp, out, r0, r1):
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        rb = w.shape[1]
        k = xq.shape[1]
        k16 = xb.shape[1]
        wf = w.reshape(-1)
        xf = xq.reshape(-1)
        # once per call, columns innermost so a tile's 4 values are contiguous:
        # xdT[b, col] = d_x; b32T[b * 8 + j, col] = bsum of sub-block j (32 elements)
        xdT = np.ascontiguousarray(xd.T).reshape(-1)
        b32T = np.ascontiguousarray((xb[:, 0::2] + xb[:, 1::2]).T).reshape(-1)
        c = 0
        while c + 4 <= n:
            for i in range(r0, r1):
                acc = f4_zero(); accm = f4_zero()
                for b in range(nb):
                    o = i * rb + b * 144
                    sl, sh, ml, mh = _k4_scales(wf, o + 4)
                    sv = scales_k4(sl, sh, ml, mh)
                    x4 = load_f32x4(xdT, b * n + c)
                    dd = f4_scale(x4, f16_to_f32(w, o))          # d_w * d_x per column (rounded once)
                    dm = f4_scale(x4, f16_to_f32(w, o + 2))
                    xo = c * k + b * 256
                    bt = (b * 8) * n + c
                    # pair g = sub-blocks 2g, 2g+1: integer pair sums of the 4 columns, then one FMA each
                    lo, hi = q4_K_unpack(wf, o, 0)
                    acc = fma4_i(acc, reduce4(k4_pair(i_zero(), lo, hi, xf, xo, sv, 0, 1),
                                              k4_pair(i_zero(), lo, hi, xf, xo + k, sv, 0, 1),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 2 * k, sv, 0, 1),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 3 * k, sv, 0, 1)), dd)
                    accm = fma4_i(accm, i4_mul_add(load_i32x4(b32T, bt), ml & np.uint32(0xFF),
                                                   load_i32x4(b32T, bt + n), (ml >> np.uint32(8)) & np.uint32(0xFF)), dm)
                    lo, hi = q4_K_unpack(wf, o, 1)
                    acc = fma4_i(acc, reduce4(k4_pair(i_zero(), lo, hi, xf, xo + 64, sv, 2, 3),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 64 + k, sv, 2, 3),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 64 + 2 * k, sv, 2, 3),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 64 + 3 * k, sv, 2, 3)), dd)
                    accm = fma4_i(accm, i4_mul_add(load_i32x4(b32T, bt + 2 * n), (ml >> np.uint32(16)) & np.uint32(0xFF),
                                                   load_i32x4(b32T, bt + 3 * n), ml >> np.uint32(24)), dm)
                    lo, hi = q4_K_unpack(wf, o, 2)
                    acc = fma4_i(acc, reduce4(k4_pair(i_zero(), lo, hi, xf, xo + 128, sv, 4, 5),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 128 + k, sv, 4, 5),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 128 + 2 * k, sv, 4, 5),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 128 + 3 * k, sv, 4, 5)), dd)
                    accm = fma4_i(accm, i4_mul_add(load_i32x4(b32T, bt + 4 * n), mh & np.uint32(0xFF),
                                                   load_i32x4(b32T, bt + 5 * n), (mh >> np.uint32(8)) & np.uint32(0xFF)), dm)
                    lo, hi = q4_K_unpack(wf, o, 3)
                    acc = fma4_i(acc, reduce4(k4_pair(i_zero(), lo, hi, xf, xo + 192, sv, 6, 7),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 192 + k, sv, 6, 7),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 192 + 2 * k, sv, 6, 7),
                                              k4_pair(i_zero(), lo, hi, xf, xo + 192 + 3 * k, sv, 6, 7)), dd)
                    accm = fma4_i(accm, i4_mul_add(load_i32x4(b32T, bt + 6 * n), (mh >> np.uint32(16)) & np.uint32(0xFF),
                                                   load_i32x4(b32T, bt + 7 * n), mh >> np.uint32(24)), dm)
                r = f4_sub(acc, accm)
                out[c, i] = f4_lane(r, 0); out[c + 1, i] = f4_lane(r, 1)
                out[c + 2, i] = f4_lane(r, 2); out[c + 3, i] = f4_lane(r, 3)
            c += 4

    @numba.njit(**_NB)
    def q4_K_gemv_rows(w, xp, out, r0, r1):
        """Gemv-order columns of rows r0..r1-1: the last n % 4, or all of them when n < 4."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        rb = w.shape[1]
        wf = w.reshape(-1)
        c = n - n % 4 if n >= 4 else 0
        while c < n:
            xqc = xq[c]; xbc = xb[c]
            for i in range(r0, r1):
                acc = f32(0.0)
                accm = f32(0.0)
                for b in range(nb):
                    o = i * rb + b * 144
                    lanes, summ = q4_K_dot(wf, o, xqc, b * 256, xd, xbc, b * 16)
                    acc = fma_s(f32(hsum_i(lanes)), f16_to_f32(w, o) * xd[c, b], acc)
                    accm = fma_s(f32(summ), f16_to_f32(w, o + 2) * xd[c, b], accm)
                out[c, i] = acc - accm
            c += 1

    # ---- rows in lanes: 8 rows regrouped (_repack_q4_K) so that a vpdpbusd lane is a row: a 32-byte
    # vector holds 4 quants of each of 8 rows, the activations are broadcast 4 bytes at a time, and a
    # sub-block's dot products of 8 rows come out in 8 lanes with no horizontal sums.  Then per pair
    # of sub-blocks, per column: S = dot_2g * sc_2g + dot_2g+1 * sc_2g+1 (vpmulld, exact), the mins'
    # M = m_2g * bsum_2g + m_2g+1 * bsum_2g+1 (one vpdpwssd on i16 pairs), and the gemm's two FMAs
    # with d_w * d_x and dmin * d_x -- the float operations of q4_K_gemm_rows, 8 rows at once.
    @numba.njit(inline="always")
    def k4_sub2(d0, d1, w0, w1, xq, xo):
        """Sub-blocks 2g, 2g+1 (weights w0, w1: one chunk of 4 quants x 8 rows) of one column."""
        return dot_us(mode, d0, w0, bcast_b4(xq, xo)), dot_us(mode, d1, w1, bcast_b4(xq, xo + 32))

    @numba.njit(inline="always")
    def k4_fmas(acc, accm, d0, d1, s0, s1, mn, bs, bo, dv, mv, dx):
        """The gemm's two FMAs of one pair of sub-blocks, one column, 8 rows."""
        acc = fmadd_v(acc, i_add(i_mul(d0, s0), i_mul(d1, s1)), f_scale(dv, dx))
        accm = fmadd_v(accm, madd16(mode, i_zero(), mn, bcast_i32(bs, bo)), f_scale(mv, dx))
        return acc, accm

    @numba.njit(inline="always")
    def put_rows8(out, c, i, acc, accm):
        r = f_sub(acc, accm)
        for q in range(8):
            out[c, i + q] = f_lane(r, q)

    @numba.njit(**_NB)
    def q4_K_gemm_rows8(w, xp, out, r0, r1):
        """Columns [0, n - n % 4) of rows r0..r1-1 ((r1 - r0) % 8 == 0), gemm order."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        k = xq.shape[1]
        ng = (r1 - r0) // 8
        qt, sc, mn, dw, dm = _repack_q4_K(w, r0, ng, nb)
        bs = _bsum_pairs(xb, nb)
        xf = xq.reshape(-1)
        for t in range(n // 4):
            c = 4 * t
            for g in range(ng):
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                m0 = f_zero(); m1 = f_zero(); m2 = f_zero(); m3 = f_zero()
                for b in range(nb):
                    gb = g * nb + b
                    dv = load_f32x8(dw, gb * 8)
                    mv = load_f32x8(dm, gb * 8)
                    for p in range(4):
                        d00 = i_zero(); d01 = i_zero(); d02 = i_zero(); d03 = i_zero()
                        d10 = i_zero(); d11 = i_zero(); d12 = i_zero(); d13 = i_zero()
                        wo = (gb * 8 + 2 * p) * 256
                        xo = c * k + b * 256 + 64 * p
                        for e in range(8):
                            w0 = load_b32(qt, wo + 32 * e)
                            w1 = load_b32(qt, wo + 256 + 32 * e)
                            d00, d10 = k4_sub2(d00, d10, w0, w1, xf, xo + 4 * e)
                            d01, d11 = k4_sub2(d01, d11, w0, w1, xf, xo + k + 4 * e)
                            d02, d12 = k4_sub2(d02, d12, w0, w1, xf, xo + 2 * k + 4 * e)
                            d03, d13 = k4_sub2(d03, d13, w0, w1, xf, xo + 3 * k + 4 * e)
                        s0 = load_i8(sc, (gb * 8 + 2 * p) * 8)
                        s1 = load_i8(sc, (gb * 8 + 2 * p + 1) * 8)
                        mp = load_i8(mn, (gb * 4 + p) * 8)
                        bo = (c * nb + b) * 4 + p
                        a0, m0 = k4_fmas(a0, m0, d00, d10, s0, s1, mp, bs, bo, dv, mv, xd[c, b])
                        a1, m1 = k4_fmas(a1, m1, d01, d11, s0, s1, mp, bs, bo + nb * 4, dv, mv, xd[c + 1, b])
                        a2, m2 = k4_fmas(a2, m2, d02, d12, s0, s1, mp, bs, bo + nb * 8, dv, mv, xd[c + 2, b])
                        a3, m3 = k4_fmas(a3, m3, d03, d13, s0, s1, mp, bs, bo + nb * 12, dv, mv, xd[c + 3, b])
                i = r0 + 8 * g
                put_rows8(out, c, i, a0, m0); put_rows8(out, c + 1, i, a1, m1)
                put_rows8(out, c + 2, i, a2, m2); put_rows8(out, c + 3, i, a3, m3)

    @numba.njit(**_NB)
    def q4_K_matmat(w, xp, out, r0, r1):
        n = xp[0].shape[0]
        r8 = r0 + (r1 - r0) // 8 * 8
        if n >= REGROUP_COLUMNS:
            q4_K_gemm_rows8(w, xp, out, r0, r8)
            q4_K_gemm_rows(w, xp, out, r8, r1)
        elif n >= 4:
            q4_K_gemm_rows(w, xp, out, r0, r1)
        q4_K_gemv_rows(w, xp, out, r0, r1)

    # ---- Q6_K tiled order (n >= 8) with rows in lanes (_repack_q6_K, as for Q4_K): per column and
    # block, S = sum_j sc_j * (dot(q_j, x_j) - 32 * bsum_j) exact for 8 rows at once (vpdpbusd on the
    # unsigned 6-bit quants, vpmulld by the sub-block scales, the offsets by vpdpwssd on i16 pairs),
    # then q6_tiled's out = fma(f32(S) * d_w, d_x, out) per lane.
    @numba.njit(inline="always")
    def q6_sub2(d0, d1, w0, w1, xq, xo):
        return dot_us(mode, d0, w0, bcast_b4(xq, xo)), dot_us(mode, d1, w1, bcast_b4(xq, xo + 16))

    @numba.njit(inline="always")
    def q6_block_end(acc, sacc, offs, dv, dx):
        return fma_sv(acc, i_sub(sacc, i_shl(offs, 5)), dv, dx)

    @numba.njit(inline="always")
    def q6_offsets(sp, so, bs, bo):
        """sum_j sc_j * bsum_j (8 rows) from the i16 pairs of scales and bsums."""
        o = i_zero()
        for jp in range(8):
            o = madd16(mode, o, load_i8(sp, so + 8 * jp), bcast_i32(bs, bo + jp))
        return o

    @numba.njit(**_NB)
    def q6_K_tiled_rows8(w, xp, out, r0, r1):
        """All columns (n >= 8) of rows r0..r1-1 ((r1 - r0) % 8 == 0), tiled order."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        k = xq.shape[1]
        ng = (r1 - r0) // 8
        qt, sc, sp, dw = _repack_q6_K(w, r0, ng, nb)
        bs = _bsum16_pairs(xb)
        xf = xq.reshape(-1)
        c = 0
        while c < n:
            four = c + 4 <= n
            for g in range(ng):
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                for b in range(nb):
                    gb = g * nb + b
                    t0 = i_zero(); t1 = i_zero(); t2 = i_zero(); t3 = i_zero()
                    xo = c * k + b * 256
                    for jp in range(8):
                        d00 = i_zero(); d01 = i_zero(); d02 = i_zero(); d03 = i_zero()
                        d10 = i_zero(); d11 = i_zero(); d12 = i_zero(); d13 = i_zero()
                        wo = (gb * 64 + 8 * jp) * 32
                        xj = xo + 32 * jp
                        for e in range(4):
                            w0 = load_b32(qt, wo + 32 * e)
                            w1 = load_b32(qt, wo + 128 + 32 * e)
                            d00, d10 = q6_sub2(d00, d10, w0, w1, xf, xj + 4 * e)
                            if four:
                                d01, d11 = q6_sub2(d01, d11, w0, w1, xf, xj + k + 4 * e)
                                d02, d12 = q6_sub2(d02, d12, w0, w1, xf, xj + 2 * k + 4 * e)
                                d03, d13 = q6_sub2(d03, d13, w0, w1, xf, xj + 3 * k + 4 * e)
                        s0 = load_i8(sc, (gb * 16 + 2 * jp) * 8)
                        s1 = load_i8(sc, (gb * 16 + 2 * jp + 1) * 8)
                        t0 = i_add(t0, i_add(i_mul(d00, s0), i_mul(d10, s1)))
                        if four:
                            t1 = i_add(t1, i_add(i_mul(d01, s0), i_mul(d11, s1)))
                            t2 = i_add(t2, i_add(i_mul(d02, s0), i_mul(d12, s1)))
                            t3 = i_add(t3, i_add(i_mul(d03, s0), i_mul(d13, s1)))
                    dv = load_f32x8(dw, gb * 8)
                    so = gb * 64
                    bo = (c * nb + b) * 8
                    a0 = q6_block_end(a0, t0, q6_offsets(sp, so, bs, bo), dv, xd[c, b])
                    if four:
                        a1 = q6_block_end(a1, t1, q6_offsets(sp, so, bs, bo + nb * 8), dv, xd[c + 1, b])
                        a2 = q6_block_end(a2, t2, q6_offsets(sp, so, bs, bo + nb * 16), dv, xd[c + 2, b])
                        a3 = q6_block_end(a3, t3, q6_offsets(sp, so, bs, bo + nb * 24), dv, xd[c + 3, b])
                i = r0 + 8 * g
                for q in range(8):
                    out[c, i + q] = f_lane(a0, q)
                if four:
                    for q in range(8):
                        out[c + 1, i + q] = f_lane(a1, q)
                        out[c + 2, i + q] = f_lane(a2, q)
                        out[c + 3, i + q] = f_lane(a3, q)
            c += 4 if four else 1

    @numba.njit(**_NB)
    def q6_K_matmat(w, xp, out, r0, r1):
        r8 = r0 + (r1 - r0) // 8 * 8
        if xp[0].shape[0] >= REGROUP_COLUMNS:
            q6_K_tiled_rows8(w, xp, out, r0, r8)
            q6_K_matmat_rows(w, xp, out, r8, r1)
        else:
            q6_K_matmat_rows(w, xp, out, r0, r1)

    return dict(Q4_K=(q4_K_matvec, q4_K_matmat), Q5_K=(q5_K_matvec, q5_K_matmat),
                Q6_K=(q6_K_matvec, q6_K_matmat))


# ============================================================================= float types
def _floats(mode):
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

        return rowwise(dot, dot)

    def rowwise(dot_vec, dot_mat):
        """matvec / matmat of float weights: one dot per output (dot_vec for one column)."""
        @numba.njit(**_NB)
        def matvec(w, xp, out, r0, r1):
            x = xp[0]
            k = x.shape[0]
            rb = w.shape[1]
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

    # F16 follows ggml's AVX-512 orders exactly (f16*f16 products are exact in f32, so only the
    # order of the additions matters): matmat = llamafile tinyBLAS<16> (used by ggml for >= 2
    # columns): lane j % 16 accumulates in order, then GCC's _mm512_reduce_add_ps tree;
    # matvec = ggml_vec_dot_f16: 4 accumulators x 16 lanes over steps of 64, (0+2)+(1+3), the
    # same tree, leftovers (k % 64) added in float64.
    @numba.njit(inline="always")
    def red16(lo, hi):
        return hsum_f(f_add(lo, hi))

    @numba.njit(inline="always")
    def dot16_vec(w, o, x, xo, k):
        a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
        a4 = f_zero(); a5 = f_zero(); a6 = f_zero(); a7 = f_zero()
        j = 0
        while j + 64 <= k:
            a0 = fma_f(a0, load_f16x8(w, o + j * 2), load_f32x8(x, xo + j))
            a1 = fma_f(a1, load_f16x8(w, o + (j + 8) * 2), load_f32x8(x, xo + j + 8))
            a2 = fma_f(a2, load_f16x8(w, o + (j + 16) * 2), load_f32x8(x, xo + j + 16))
            a3 = fma_f(a3, load_f16x8(w, o + (j + 24) * 2), load_f32x8(x, xo + j + 24))
            a4 = fma_f(a4, load_f16x8(w, o + (j + 32) * 2), load_f32x8(x, xo + j + 32))
            a5 = fma_f(a5, load_f16x8(w, o + (j + 40) * 2), load_f32x8(x, xo + j + 40))
            a6 = fma_f(a6, load_f16x8(w, o + (j + 48) * 2), load_f32x8(x, xo + j + 48))
            a7 = fma_f(a7, load_f16x8(w, o + (j + 56) * 2), load_f32x8(x, xo + j + 56))
            j += 64
        lo = f_add(f_add(a0, a4), f_add(a2, a6))
        hi = f_add(f_add(a1, a5), f_add(a3, a7))
        s = np.float64(red16(lo, hi))
        while j < k:
            s += np.float64(f16_to_f32(w, o + j * 2) * x[xo + j])
            j += 1
        return f32(s)

    @numba.njit(inline="always")
    def dot16_tiny(w, o, x, xo, k):
        if k % 16:
            return dot16_vec(w, o, x, xo, k)
        lo = f_zero(); hi = f_zero()
        j = 0
        while j < k:
            lo = fma_f(lo, load_f16x8(w, o + j * 2), load_f32x8(x, xo + j))
            hi = fma_f(hi, load_f16x8(w, o + (j + 8) * 2), load_f32x8(x, xo + j + 8))
            j += 16
        return red16(lo, hi)

    # ---- F16 matmat in register tiles of 3 rows x 4 columns (attention in prefill: keys or V^T rows
    # against query or probability columns).  A dot of 16 lanes is a chain of FMAs (4 cycles each):
    # one dot at a time waits on that latency, 12 independent ones keep both FMA pipes busy, and each
    # row's halves are converted once for 4 columns.  Per output the lanes, their order and the
    # final tree are dot16_tiny's, so results do not depend on the tiling.
    @numba.njit(inline="always")
    def fma16(lo, hi, wl, wh, x, xo):
        return fma_f(lo, wl, load_f32x8(x, xo)), fma_f(hi, wh, load_f32x8(x, xo + 8))

    @numba.njit(inline="always")
    def f16_tile(w, o, rb, x, xo, k, out, c, i):
        """out[c:c+4, i:i+3] (weights rows i.. at byte o, stride rb; x columns c.. at xo, stride k)."""
        p0l = f_zero(); p0h = f_zero(); p1l = f_zero(); p1h = f_zero()
        p2l = f_zero(); p2h = f_zero(); p3l = f_zero(); p3h = f_zero()
        q0l = f_zero(); q0h = f_zero(); q1l = f_zero(); q1h = f_zero()
        q2l = f_zero(); q2h = f_zero(); q3l = f_zero(); q3h = f_zero()
        s0l = f_zero(); s0h = f_zero(); s1l = f_zero(); s1h = f_zero()
        s2l = f_zero(); s2h = f_zero(); s3l = f_zero(); s3h = f_zero()
        j = 0
        while j < k:
            wp = o + j * 2
            al = load_f16x8(w, wp); ah = load_f16x8(w, wp + 16)
            bl = load_f16x8(w, wp + rb); bh = load_f16x8(w, wp + rb + 16)
            dl = load_f16x8(w, wp + 2 * rb); dh = load_f16x8(w, wp + 2 * rb + 16)
            x0 = xo + j
            p0l, p0h = fma16(p0l, p0h, al, ah, x, x0)
            q0l, q0h = fma16(q0l, q0h, bl, bh, x, x0)
            s0l, s0h = fma16(s0l, s0h, dl, dh, x, x0)
            p1l, p1h = fma16(p1l, p1h, al, ah, x, x0 + k)
            q1l, q1h = fma16(q1l, q1h, bl, bh, x, x0 + k)
            s1l, s1h = fma16(s1l, s1h, dl, dh, x, x0 + k)
            p2l, p2h = fma16(p2l, p2h, al, ah, x, x0 + 2 * k)
            q2l, q2h = fma16(q2l, q2h, bl, bh, x, x0 + 2 * k)
            s2l, s2h = fma16(s2l, s2h, dl, dh, x, x0 + 2 * k)
            p3l, p3h = fma16(p3l, p3h, al, ah, x, x0 + 3 * k)
            q3l, q3h = fma16(q3l, q3h, bl, bh, x, x0 + 3 * k)
            s3l, s3h = fma16(s3l, s3h, dl, dh, x, x0 + 3 * k)
            j += 16
        out[c, i] = red16(p0l, p0h); out[c + 1, i] = red16(p1l, p1h)
        out[c + 2, i] = red16(p2l, p2h); out[c + 3, i] = red16(p3l, p3h)
        out[c, i + 1] = red16(q0l, q0h); out[c + 1, i + 1] = red16(q1l, q1h)
        out[c + 2, i + 1] = red16(q2l, q2h); out[c + 3, i + 1] = red16(q3l, q3h)
        out[c, i + 2] = red16(s0l, s0h); out[c + 1, i + 2] = red16(s1l, s1h)
        out[c + 2, i + 2] = red16(s2l, s2h); out[c + 3, i + 2] = red16(s3l, s3h)

    @numba.njit(inline="always")
    def f16_row4(w, o, x, xo, k, out, c, i):
        """out[c:c+4, i]: one row against 4 columns."""
        p0l = f_zero(); p0h = f_zero(); p1l = f_zero(); p1h = f_zero()
        p2l = f_zero(); p2h = f_zero(); p3l = f_zero(); p3h = f_zero()
        j = 0
        while j < k:
            al = load_f16x8(w, o + j * 2); ah = load_f16x8(w, o + j * 2 + 16)
            p0l, p0h = fma16(p0l, p0h, al, ah, x, xo + j)
            p1l, p1h = fma16(p1l, p1h, al, ah, x, xo + j + k)
            p2l, p2h = fma16(p2l, p2h, al, ah, x, xo + j + 2 * k)
            p3l, p3h = fma16(p3l, p3h, al, ah, x, xo + j + 3 * k)
            j += 16
        out[c, i] = red16(p0l, p0h); out[c + 1, i] = red16(p1l, p1h)
        out[c + 2, i] = red16(p2l, p2h); out[c + 3, i] = red16(p3l, p3h)

    @numba.njit(**_NB)
    def f16_matmat(w, xp, out, r0, r1):
        x = xp[0]
        n, k = x.shape
        xf = x.reshape(-1)
        rb = w.shape[1]
        if k % 16:
            for i in range(r0, r1):
                for c in range(n):
                    out[c, i] = dot16_vec(w, i * rb, xf, c * k, k)
            return
        c = 0
        while c + 4 <= n:
            i = r0
            while i + 3 <= r1:
                f16_tile(w, i * rb, rb, xf, c * k, k, out, c, i)
                i += 3
            while i < r1:
                f16_row4(w, i * rb, xf, c * k, k, out, c, i)
                i += 1
            c += 4
        while c < n:
            for i in range(r0, r1):
                out[c, i] = dot16_tiny(w, i * rb, xf, c * k, k)
            c += 1

    f16_matvec = rowwise(dot16_vec, dot16_tiny)[0]
    return dict(F32=build(load_f32x8, 4, _f32_at), F16=(f16_matvec, f16_matmat),
                BF16=build(load_bf16x8, 2, _bf16_at))


@numba.njit(inline="always")
def _f32_at(w, off):
    return w.reshape(-1)[off:off + 4].view(np.float32)[0]


@numba.njit(inline="always")
def _bf16_at(w, off):
    return bf16_to_f32(w, off)


# ============================================================================= on-disk cache
class _StableCache(FunctionCache):
    """Numba's FunctionCache with an index key that is the same in every process.

    The stock key hashes ``pickle.dumps`` of the closure cells; the kernels above close over helper
    dispatchers whose pickles carry a per-process uuid, so every process missed the cache,
    recompiled (seconds per kernel) and appended yet another entry.  Here a dispatcher in a cell is
    described by its code and, recursively, its own cells; the digest of the kernel package's
    sources is added so an edit of any kernel module (e.g. the intrinsics in simd.py, which the
    stock source-file stamp would not see) invalidates the entries.
    """

    def _index_key(self, sig, codegen):
        f = self._py_func
        return (sig, codegen.magic_tuple(), (_PKG_DIGEST, _describe(f)))


def _describe(v) -> str:
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, Dispatcher):
            x = x.py_func
        if callable(x) and hasattr(x, "__code__"):
            c = x.__code__
            h.update(f"fn:{x.__module__}.{x.__qualname__}:".encode())
            h.update(c.co_code)
            h.update(repr(c.co_consts).encode())
            for cell in x.__closure__ or ():
                walk(cell.cell_contents)
        elif isinstance(x, (tuple, list)):
            h.update(b"(")
            for y in x:
                walk(y)
            h.update(b")")
        else:
            h.update(f"{type(x).__name__}:{x!r};".encode())

    walk(v)
    return h.hexdigest()


def _package_digest() -> str:
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as fh:
                h.update(name.encode() + fh.read())
    return h.hexdigest()


_PKG_DIGEST = _package_digest()


def _stable_cache(disp) -> None:
    if isinstance(disp, Dispatcher) and disp._cache is not None and not disp.overloads:
        disp._cache = _StableCache(disp.py_func)


# ============================================================================= tables
_TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
             "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}
_cache: dict[str, tuple[dict, dict]] = {}


def tables(path: str) -> tuple[dict, dict]:
    """(matvec, matmat) dicts keyed by ggml type id for a SIMD path (functions compile on first call)."""
    if path not in _cache:
        mode = _MODES[path]
        fns = {**_legacy(mode), **_kquants(mode), **_floats(mode)}
        for pair in fns.values():
            for disp in pair:
                _stable_cache(disp)
        mv = {_TYPE_IDS[n]: f[0] for n, f in fns.items()}
        mm = {_TYPE_IDS[n]: f[1] for n, f in fns.items()}
        _cache[path] = (mv, mm)
    return _cache[path]

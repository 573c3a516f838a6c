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
column tiles of 4 outermost (the tile's activations stay in L1 while the weight rows stream past)
and reuses each unpacked weight block for the 4 columns (Q4_0/Q5_0: 2 rows x 4 columns register
tiles, sharing activation loads between the 2 rows); per output the accumulation order is the
single-column one, so matmat equals matvec column by column.  For Q8_0 and Q5_0 that order is
llama.cpp's (ggml_vec_dot_q{8,5}_0_q8_0 / tinyBLAS_Q0_AVX): the results are bit-identical to it.

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
                   f4_scale, fma4_i, f4_sub, f4_lane)

_NB = dict(nogil=True, cache=True)
f32 = np.float32
_MODES = {"avx2": AVX2, "avx512-vnni": VNNI}


# ============================================================================= legacy quants
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

    # ---- matmat: 2 rows x 4 columns register tiles.  The loop over column tiles is outermost, so a
    # tile's activations (4 columns: quants + offset sums, ~13 KB at k=640) stay in L1 while the
    # weight rows stream past; every unpacked weight block is reused for 4 columns and every
    # activation load for 2 rows.  Per (row, column) the block order and the f32 accumulation are
    # those of the single-column loop, so results do not depend on the tiling.
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

    def make_matmat(unpack, bsz, shift):
        @numba.njit(**_NB)
        def matmat(w, xp, out, r0, r1):
            xq, xd, n4 = xp
            n = xq.shape[0]
            nb = xd.shape[1]
            rb = w.shape[1]
            k = xq.shape[1]
            k4 = k // 4
            xf = xq.reshape(-1)
            ns = (n4.reshape(-1) << shift).astype(np.int32)   # n4 << shift, once per call
            c = 0
            while c + 4 <= n:
                i = r0
                while i + 2 <= r1:
                    a00 = f_zero(); a01 = f_zero(); a02 = f_zero(); a03 = f_zero()
                    a10 = f_zero(); a11 = f_zero(); a12 = f_zero(); a13 = f_zero()
                    for b in range(nb):
                        o0 = i * rb + b * bsz
                        o1 = o0 + rb
                        u0 = unpack(w, o0)
                        u1 = unpack(w, o1)
                        d0 = f16_to_f32(w, o0)
                        d1 = f16_to_f32(w, o1)
                        xo = c * k + b * 32
                        no = c * k4 + b * 8
                        x = load_b32(xf, xo); m = load_i8(ns, no); s = xd[c, b]
                        a00 = fmadd_i(a00, dot_us(mode, m, u0, x), d0 * s)
                        a10 = fmadd_i(a10, dot_us(mode, m, u1, x), d1 * s)
                        x = load_b32(xf, xo + k); m = load_i8(ns, no + k4); s = xd[c + 1, b]
                        a01 = fmadd_i(a01, dot_us(mode, m, u0, x), d0 * s)
                        a11 = fmadd_i(a11, dot_us(mode, m, u1, x), d1 * s)
                        x = load_b32(xf, xo + 2 * k); m = load_i8(ns, no + 2 * k4); s = xd[c + 2, b]
                        a02 = fmadd_i(a02, dot_us(mode, m, u0, x), d0 * s)
                        a12 = fmadd_i(a12, dot_us(mode, m, u1, x), d1 * s)
                        x = load_b32(xf, xo + 3 * k); m = load_i8(ns, no + 3 * k4); s = xd[c + 3, b]
                        a03 = fmadd_i(a03, dot_us(mode, m, u0, x), d0 * s)
                        a13 = fmadd_i(a13, dot_us(mode, m, u1, x), d1 * s)
                    out[c, i] = hsum_f(a00); out[c + 1, i] = hsum_f(a01)
                    out[c + 2, i] = hsum_f(a02); out[c + 3, i] = hsum_f(a03)
                    out[c, i + 1] = hsum_f(a10); out[c + 1, i + 1] = hsum_f(a11)
                    out[c + 2, i + 1] = hsum_f(a12); out[c + 3, i + 1] = hsum_f(a13)
                    i += 2
                if i < r1:
                    a00 = f_zero(); a01 = f_zero(); a02 = f_zero(); a03 = f_zero()
                    for b in range(nb):
                        o0 = i * rb + b * bsz
                        u0 = unpack(w, o0)
                        d0 = f16_to_f32(w, o0)
                        xo = c * k + b * 32
                        no = c * k4 + b * 8
                        a00 = fmadd_i(a00, dot_us(mode, load_i8(ns, no), u0, load_b32(xf, xo)), d0 * xd[c, b])
                        a01 = fmadd_i(a01, dot_us(mode, load_i8(ns, no + k4), u0, load_b32(xf, xo + k)),
                                      d0 * xd[c + 1, b])
                        a02 = fmadd_i(a02, dot_us(mode, load_i8(ns, no + 2 * k4), u0, load_b32(xf, xo + 2 * k)),
                                      d0 * xd[c + 2, b])
                        a03 = fmadd_i(a03, dot_us(mode, load_i8(ns, no + 3 * k4), u0, load_b32(xf, xo + 3 * k)),
                                      d0 * xd[c + 3, b])
                    out[c, i] = hsum_f(a00); out[c + 1, i] = hsum_f(a01)
                    out[c + 2, i] = hsum_f(a02); out[c + 3, i] = hsum_f(a03)
                c += 4
            while c < n:
                for i in range(r0, r1):
                    acc = f_zero()
                    for b in range(nb):
                        o0 = i * rb + b * bsz
                        acc = fmadd_i(acc, dot_us(mode, load_i8(ns, c * k4 + b * 8), unpack(w, o0),
                                                  load_b32(xf, c * k + b * 32)), f16_to_f32(w, o0) * xd[c, b])
                    out[c, i] = hsum_f(acc)
                c += 1
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
    def q6_K_matmat(w, xp, out, r0, r1):
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
    @numba.njit(**_NB)
    def q4_K_matmat_exact(w, xp, out, r0, r1):
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

    q4_K_matmat = q4_K_matmat_exact

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

    return dict(F32=build(load_f32x8, 4, _f32_at), F16=rowwise(dot16_vec, dot16_tiny),
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

"""K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) as explicit SIMD (ggml-cpu arch/x86/quants.c and repack.cpp orders).

pmaddubsw then pmaddwd/vpdpwssd with the sub-block scales; the sub-block scales are gathered into one
i16x16 vector per super-block and selected with constant shuffles (``madd_sv``) rather than moved one
scalar at a time into vector registers.  matmat loops over column tiles of 4 outermost and reuses each
unpacked super-block for the tile's columns; whole groups of 8 rows of Q4_K/Q6_K go through the
rows-in-lanes kernels of ``repack``.  Per output the float order never depends on the tiling.
"""
from __future__ import annotations

import numba
import numpy as np

from ..intrinsics.dots import madd_sc, madd_sc_s, madd_sv, mins_dot, q2_mins_lanes, q6_offset, scales_i8, scales_k4
from ..intrinsics.lanes import (b_add, b_and, b_or, b_shl, b_shr, f4_lane, f4_scale, f4_sub, f4_zero, f_zero, fma4_i,
                                fmadd_i, i4_mul_add, i_add, i_sub, i_zero)
from ..intrinsics.load_store import load_b32, load_f32x4, load_i32x4
from ..intrinsics.quant_blocks import k4_lanes512, q6_K_lanes512
from ..intrinsics.reductions import hsum_f, hsum_i, reduce4
from ..intrinsics.scalars import f16_to_f32, fma_s
from ..intrinsics.streams import prefetch, PREFETCH_MAX_K, PREFETCH_NEAR, prime_streams, stream_halves, stream_row
from ..llvm_ir import VNNI

from . import k4_rows, repack
from .blocks import k4_scales
from ..k_quants import q3_K_scale, q3_K_scales


from ..jitcache import JIT as _NB
f32 = np.float32
# Q4_K / Q6_K prompts regroup 8 weight rows per call (rows in vector lanes, ``repack``) from this many
# columns on; fewer columns take the per-row code, whose float order is the same
REGROUP_COLUMNS = 32


def kernels(mode: int) -> dict:
    """(matvec, matmat) of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K for one instruction-set mode."""
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
    def q4_K_lanes(wf, o, xq, xo, sv):
        """Integer lanes sum_j sc_j*dot_j of one Q4_K super-block (ggml's AVX2 lanes)."""
        if mode == VNNI:   # a 64-weight group a zmm register: the same integer lanes
            return k4_lanes512(wf, o, xq, xo, sv, 0)
        acc = i_zero()
        lo, hi = q4_K_unpack(wf, o, 0)
        acc = k4_pair(acc, lo, hi, xq, xo, sv, 0, 1)
        lo, hi = q4_K_unpack(wf, o, 1)
        acc = k4_pair(acc, lo, hi, xq, xo + 64, sv, 2, 3)
        lo, hi = q4_K_unpack(wf, o, 2)
        acc = k4_pair(acc, lo, hi, xq, xo + 128, sv, 4, 5)
        lo, hi = q4_K_unpack(wf, o, 3)
        return k4_pair(acc, lo, hi, xq, xo + 192, sv, 6, 7)

    @numba.njit(inline="always")
    def q4_K_dot(wf, o, xq, xo, xd, xb, bo):
        """(integer lanes of sum_j sc_j*dot_j, sum_j m_j*bsum_j) of one super-block."""
        sl, sh, ml, mh = k4_scales(wf, o + 4)
        return q4_K_lanes(wf, o, xq, xo, scales_k4(sl, sh, ml, mh)), mins_dot(ml, mh, xb, bo)

    @numba.njit(inline="always")
    def k4_tiled(a, l, summ, dw, dm, dx):
        """ggml's tiled mul_mat (Q4_K/Q5_K: HAS_MIN, no bias), one super-block of one output:
        r = f32(S) * d_w; r = fma(-dmin, f32(M), r) (vfnmadd); out = fma(r, d_x, out) (GCC contracts
        the source's mul + add)."""
        r = f32(hsum_i(l)) * dw
        r = fma_s(-dm, f32(summ), r)
        return fma_s(r, dx, a)

    @numba.njit(inline="always")
    def k4_vmins(v0, v1, v2, v3, ml, mh, xb, bo, dmn):
        """ggml_vec_dot_q4_K_q8_K's mins: 4 f32 lanes, lane l += dmn * f32(m_2l * bs_2l + m_2l+1 * bs_2l+1)
        (bs_j the bsum of 32-element sub-block j; dmn = -d_x * dmin; vfmadd)."""
        f = np.uint32(0xFF)
        l0 = np.int32(ml & f) * (xb[bo] + xb[bo + 1]) + np.int32((ml >> np.uint32(8)) & f) * (xb[bo + 2] + xb[bo + 3])
        l1 = (np.int32((ml >> np.uint32(16)) & f) * (xb[bo + 4] + xb[bo + 5])
              + np.int32(ml >> np.uint32(24)) * (xb[bo + 6] + xb[bo + 7]))
        l2 = np.int32(mh & f) * (xb[bo + 8] + xb[bo + 9]) + np.int32((mh >> np.uint32(8)) & f) * (xb[bo + 10] + xb[bo + 11])
        l3 = (np.int32((mh >> np.uint32(16)) & f) * (xb[bo + 12] + xb[bo + 13])
              + np.int32(mh >> np.uint32(24)) * (xb[bo + 14] + xb[bo + 15]))
        return (fma_s(dmn, f32(l0), v0), fma_s(dmn, f32(l1), v1), fma_s(dmn, f32(l2), v2),
                fma_s(dmn, f32(l3), v3))

    @numba.njit(inline="always")
    def q4_K_vec(wf, w, base, nb, xq, xo, xd, xb, xbo):
        """ggml_vec_dot_q4_K_q8_K (AVX2) of one row: scaled lanes fma(d_x * d_w, f32(lanes), acc) in
        8 f32 lanes, mins in 4 (k4_vmins); hsum_float_8(acc) + ((m0 + m2) + (m1 + m3))."""
        acc = f_zero()
        v0 = f32(0.0); v1 = f32(0.0); v2 = f32(0.0); v3 = f32(0.0)
        for b in range(nb):
            o = base + b * 144
            sl, sh, ml, mh = k4_scales(wf, o + 4)
            sv = scales_k4(sl, sh, ml, mh)
            l = q4_K_lanes(wf, o, xq, xo + b * 256, sv)
            acc = fmadd_i(acc, l, xd[b] * f16_to_f32(wf, o))
            v0, v1, v2, v3 = k4_vmins(v0, v1, v2, v3, ml, mh, xb, xbo + b * 16, -(xd[b] * f16_to_f32(wf, o + 2)))
        return hsum_f(acc) + ((v0 + v2) + (v1 + v3))

    @numba.njit(inline="always")
    def q5_K_dot(wf, o, xq, xo, xd, xb, bo):
        sl, sh, ml, mh = k4_scales(wf, o + 4)
        sv = scales_k4(sl, sh, ml, mh)
        if mode == VNNI:
            return k4_lanes512(wf, o, xq, xo, sv, 1), mins_dot(ml, mh, xb, bo)
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
        if mode == VNNI:   # two 32-weight vectors a zmm register: the same integer lanes
            return i_sub(q6_K_lanes512(wf, o, xq, xo), q6_offset(sv, xb, bo))
        q1, q2, q3, q4 = q6_K_unpack(wf, o, 0)
        acc = k6_half0(i_zero(), q1, q2, q3, q4, xq, xo, sv)
        q1, q2, q3, q4 = q6_K_unpack(wf, o, 1)
        acc = k6_half1(acc, q1, q2, q3, q4, xq, xo + 128, sv)
        return i_sub(acc, q6_offset(sv, xb, bo))   # ggml's per-lane offset: lane m gets sc[2m], sc[2m+1]

    @numba.njit(**_NB)
    def q4_K_plain_matvec(w, xp, out, r0, r1):
        """ggml_vec_dot_q4_K_q8_K, row by row: a weight llama.cpp does not repack (rows % 8 != 0, or a
        3-D mul_mat weight: kernels.Q4_K_PLAIN)."""
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        for i in range(r0, r1):
            out[i] = q4_K_vec(wf, w, i * rb, nb, xq, 0, xd, xb, 0)

    @numba.njit(**_NB)
    def q4_K_matvec_rows(w, xp, out, r0, r1):
        """Row by row (the rows past the last whole group of 8)."""
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        if w.shape[0] % 8:  # not repacked by llama.cpp: ggml_vec_dot_q4_K_q8_K
            q4_K_plain_matvec(w, xp, out, r0, r1)
            return
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

    q4_K_gemv_rows8 = k4_rows.q4_K_gemv_rows8(mode)

    @numba.njit(**_NB)
    def q4_K_matvec(w, xp, out, r0, r1):
        # whole groups of 8 rows with rows in lanes (k4_rows), the rest row by row: same float order
        # (a matrix llama.cpp does not repack, rows % 8 != 0, takes vec_dot's order, row by row)
        r8 = r0 + (r1 - r0) // 8 * 8 if w.shape[0] % 8 == 0 else r0
        q4_K_gemv_rows8(w, xp, out, r0, r8)
        q4_K_matvec_rows(w, xp, out, r8, r1)

    @numba.njit(inline="always")
    def q5_K_mins(summs, dm, dx, summ):
        """ggml_vec_dot_q5_K_q8_K's mins term of one super-block: `summs += dmin * M` with
        dmin = -d_x * dmin_w, which GCC (-ffp-contract=fast, the build's -std=gnu11) contracts to one
        vfmadd: the product M * dmin is not rounded on its own (issue 46 (c): rounding it put 876 of
        the 2560 outputs of a Q5_K_M Gemma 3's blk.0.attn_output an ulp off for a 4-token batch, and
        every decoded token's Q5_K products off too)."""
        return fma_s(-(dx * dm), f32(summ), summs)

    @numba.njit(**_NB)
    def q5_K_matvec(w, xp, out, r0, r1):
        """ggml_vec_dot_q5_K_q8_K row by row: acc = fma(f32(lanes), d_x * d_w, acc) in 8 f32 lanes,
        summs = fma(-d_x * dmin, f32(M), summs); hsum_float_8(acc) + summs."""
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        mid = stream_halves(r0, r1, 1, rb)   # two streams: a row of each half in turn
        for j in range(r1 - r0):
            i = stream_row(j, r0, mid, 1)
            acc = f_zero()
            summs = f32(0.0)
            for b in range(nb):
                o = i * rb + b * 176
                lanes, summ = q5_K_dot(wf, o, xq, b * 256, xd, xb, b * 16)
                acc = fmadd_i(acc, lanes, f16_to_f32(w, o) * xd[b])
                summs = q5_K_mins(summs, f16_to_f32(w, o + 2), xd[b], summ)
            out[i] = hsum_f(acc) + summs

    @numba.njit(**_NB)
    def q6_K_matvec(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        ws = w.view(np.int8).reshape(-1)
        pf = nb * 256 <= PREFETCH_MAX_K
        mid = stream_halves(r0, r1, 1, rb)   # two streams: a row of each half in turn
        if pf:
            prime_streams(wf, r0, mid, rb, PREFETCH_NEAR)
        for j in range(r1 - r0):
            i = stream_row(j, r0, mid, 1)
            acc = f_zero()
            for b in range(nb):
                o = i * rb + b * 210
                if pf:
                    prefetch(wf, o + PREFETCH_NEAR)
                    prefetch(wf, o + PREFETCH_NEAR + 64)
                    prefetch(wf, o + PREFETCH_NEAR + 128)
                    prefetch(wf, o + PREFETCH_NEAR + 192)
                acc = fmadd_i(acc, q6_K_dot(wf, ws, o, xq, b * 256, xb, b * 16), f16_to_f32(w, o + 208) * xd[b])
            out[i] = hsum_f(acc)

    # ---- matmat: column tiles of 4 outermost (the tile's activations stay in L1), then rows; each
    # super-block is unpacked once per row and used for the 4 columns.  Per column the integer
    # lanes (exact) and the f32 accumulation order are those of the single-column loop below.
    # llama.cpp's order for Q5_K (never repacked on x86) and for a Q4_K weight it does not repack
    # (rows % 8 != 0): from 8 columns on ggml's tiled matmul (k4_tiled), below 8 the type's vec_dot.
    @numba.njit(inline="always")
    def k4_col(a, mm, v0, v1, v2, v3, l, ml, mh, xb, bo, dw, dm, dx, q5, tiled):
        """One super-block of one column into its accumulators in the order of the chosen kernel."""
        if tiled:
            return a, k4_tiled(mm, l, mins_dot(ml, mh, xb, bo), dw, dm, dx), v0, v1, v2, v3
        a = fmadd_i(a, l, dw * dx) if q5 else fmadd_i(a, l, dx * dw)
        if q5:
            return a, q5_K_mins(mm, dm, dx, mins_dot(ml, mh, xb, bo)), v0, v1, v2, v3
        v0, v1, v2, v3 = k4_vmins(v0, v1, v2, v3, ml, mh, xb, bo, -(dx * dm))
        return a, mm, v0, v1, v2, v3

    @numba.njit(inline="always")
    def k4_pairs4(l0, l1, l2, l3, lo, hi, xf, xo, k, sv, j0, j1, four):
        """Sub-blocks j0, j1 (unpacked once) of the tile's first column, or of its four."""
        l0 = k4_pair(l0, lo, hi, xf, xo, sv, j0, j1)
        if four:
            l1 = k4_pair(l1, lo, hi, xf, xo + k, sv, j0, j1)
            l2 = k4_pair(l2, lo, hi, xf, xo + 2 * k, sv, j0, j1)
            l3 = k4_pair(l3, lo, hi, xf, xo + 3 * k, sv, j0, j1)
        return l0, l1, l2, l3

    @numba.njit(inline="always")
    def k4_result(a, mm, v0, v1, v2, v3, q5, tiled):
        if tiled:
            return mm
        if q5:
            return hsum_f(a) + mm
        return hsum_f(a) + ((v0 + v2) + (v1 + v3))

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
            tiled = n >= 8
            c = 0
            while c < n:
                four = c + 4 <= n
                for i in range(r0, r1):
                    a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                    m0 = f32(0.0); m1 = f32(0.0); m2 = f32(0.0); m3 = f32(0.0)
                    v00 = f32(0.0); v01 = f32(0.0); v02 = f32(0.0); v03 = f32(0.0)
                    v10 = f32(0.0); v11 = f32(0.0); v12 = f32(0.0); v13 = f32(0.0)
                    v20 = f32(0.0); v21 = f32(0.0); v22 = f32(0.0); v23 = f32(0.0)
                    v30 = f32(0.0); v31 = f32(0.0); v32 = f32(0.0); v33 = f32(0.0)
                    for b in range(nb):
                        o = i * rb + b * bsz
                        sl, sh, ml, mh = k4_scales(wf, o + 4)
                        sv = scales_k4(sl, sh, ml, mh)
                        qh = load_b32(wf, o + 16)  # (Q5_K's high bits; unused for Q4_K)
                        xo = c * k + b * 256
                        l0 = i_zero(); l1 = i_zero(); l2 = i_zero(); l3 = i_zero()
                        lo, hi = q5_K_unpack(wf, o, qh, 0) if q5 else q4_K_unpack(wf, o, 0)
                        l0, l1, l2, l3 = k4_pairs4(l0, l1, l2, l3, lo, hi, xf, xo, k, sv, 0, 1, four)
                        lo, hi = q5_K_unpack(wf, o, qh, 1) if q5 else q4_K_unpack(wf, o, 1)
                        l0, l1, l2, l3 = k4_pairs4(l0, l1, l2, l3, lo, hi, xf, xo + 64, k, sv, 2, 3, four)
                        lo, hi = q5_K_unpack(wf, o, qh, 2) if q5 else q4_K_unpack(wf, o, 2)
                        l0, l1, l2, l3 = k4_pairs4(l0, l1, l2, l3, lo, hi, xf, xo + 128, k, sv, 4, 5, four)
                        lo, hi = q5_K_unpack(wf, o, qh, 3) if q5 else q4_K_unpack(wf, o, 3)
                        l0, l1, l2, l3 = k4_pairs4(l0, l1, l2, l3, lo, hi, xf, xo + 192, k, sv, 6, 7, four)
                        dw = f16_to_f32(w, o)
                        dm = f16_to_f32(w, o + 2)
                        bo = c * k16 + b * 16
                        a0, m0, v00, v01, v02, v03 = k4_col(a0, m0, v00, v01, v02, v03, l0, ml, mh, xbf, bo,
                                                            dw, dm, xd[c, b], q5, tiled)
                        if four:
                            a1, m1, v10, v11, v12, v13 = k4_col(a1, m1, v10, v11, v12, v13, l1, ml, mh, xbf, bo + k16,
                                                                dw, dm, xd[c + 1, b], q5, tiled)
                            a2, m2, v20, v21, v22, v23 = k4_col(a2, m2, v20, v21, v22, v23, l2, ml, mh, xbf, bo + 2 * k16,
                                                                dw, dm, xd[c + 2, b], q5, tiled)
                            a3, m3, v30, v31, v32, v33 = k4_col(a3, m3, v30, v31, v32, v33, l3, ml, mh, xbf, bo + 3 * k16,
                                                                dw, dm, xd[c + 3, b], q5, tiled)
                    out[c, i] = k4_result(a0, m0, v00, v01, v02, v03, q5, tiled)
                    if four:
                        out[c + 1, i] = k4_result(a1, m1, v10, v11, v12, v13, q5, tiled)
                        out[c + 2, i] = k4_result(a2, m2, v20, v21, v22, v23, q5, tiled)
                        out[c + 3, i] = k4_result(a3, m3, v30, v31, v32, v33, q5, tiled)
                c += 4 if four else 1
        return matmat

    # from 8 columns the tiled order with 8 rows in lanes (`repack.q4_K_gemv_rows8` with q5)
    q5_K_matmat = repack.tiled_from8(repack.q4_K_gemv_rows8(mode, q5=True), make_k4_matmat(True, 176),
                                     wide=repack.rows16_tiled(repack.Q5_K_TILED) if mode == VNNI else None)
    q4_K_plain_matmat = make_k4_matmat(False, 144)

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
                    sl, sh, ml, mh = k4_scales(wf, o + 4)
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
        n = xp[0].shape[0]
        q4_K_gemv_cols(w, xp, out, r0, r1, n - n % 4 if n >= 4 else 0)

    @numba.njit(**_NB)
    def q4_K_gemv_cols(w, xp, out, r0, r1, c):
        """Gemv-order columns [c, n) of rows r0..r1-1, one row and column at a time."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        rb = w.shape[1]
        wf = w.reshape(-1)
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

    q4_K_gemm_rows8 = repack.q4_K_rows8(mode)

    @numba.njit(**_NB)
    def q4_K_matmat(w, xp, out, r0, r1):
        n = xp[0].shape[0]
        if w.shape[0] % 8:  # not repacked by llama.cpp: tiled matmul (n >= 8) or vec_dot
            q4_K_plain_matmat(w, xp, out, r0, r1)
            return
        r8 = r0 + (r1 - r0) // 8 * 8
        if n >= REGROUP_COLUMNS:
            q4_K_gemm_rows8(w, xp, out, r0, r8)
            q4_K_gemm_rows(w, xp, out, r8, r1)
        elif n >= 4:
            q4_K_gemm_rows(w, xp, out, r0, r1)
        q4_K_gemv_rows(w, xp, out, r0, r1)

    # ---- mul_mat_id (the tokens routed to one expert, prepared rows gathered): ggml-cpu's order per
    # (row, token).  A repacked Q4_K expert (rows % 8 == 0) runs ggml_gemv_q4_K_8x8_q8_K once per token
    # (repack.cpp forward_mul_mat_id): q4_K_gemv_rows8 computes those outputs for all tokens at once.
    # Otherwise ggml_compute_forward_mul_mat_id: the tiled matmul for an expert with >= 8 tokens, else
    # vec_dot per (row, token) -- what the plain matmat does for that many columns.
    q4_K_gemv_rows8_all = repack.q4_K_gemv_rows8(mode)

    @numba.njit(**_NB)
    def q4_K_id(w, xp, out, r0, r1, rows):
        if rows % 8:
            q4_K_plain_matmat(w, xp, out, r0, r1)
            return
        r8 = r0 + (r1 - r0) // 8 * 8
        q4_K_gemv_rows8_all(w, xp, out, r0, r8)
        q4_K_gemv_cols(w, xp, out, r8, r1, 0)

    @numba.njit(**_NB)
    def q4_K_plain_id(w, xp, out, r0, r1, rows):
        q4_K_plain_matmat(w, xp, out, r0, r1)

    @numba.njit(**_NB)
    def q5_K_id(w, xp, out, r0, r1, rows):
        q5_K_matmat(w, xp, out, r0, r1)

    q6_K_tiled_rows8 = repack.q6_K_rows8(mode)

    @numba.njit(**_NB)
    def q6_K_matmat(w, xp, out, r0, r1):
        r8 = r0 + (r1 - r0) // 8 * 8
        if xp[0].shape[0] >= REGROUP_COLUMNS:
            q6_K_tiled_rows8(w, xp, out, r0, r8)
            q6_K_matmat_rows(w, xp, out, r8, r1)
        else:
            q6_K_matmat_rows(w, xp, out, r0, r1)

    @numba.njit(**_NB)
    def q6_K_id(w, xp, out, r0, r1, rows):
        q6_K_matmat(w, xp, out, r0, r1)

    # ---- Q3_K: never repacked nor taken by llamafile's sgemm on x86: below 8 columns every output is
    # ggml_vec_dot_q3_K_q8_K (AVX2): per super-block exact i32 lanes (lane l: elements 4l..4l+3 of each
    # 32-element chunk, pair products times the 16-element sub-block scales), one FMA with
    # d_x * d_w into an f32x8 accumulator, hsum_float_8 at the end; from 8 columns ggml's tiled matmul
    # (q3_K_tiled: out = fma(f32(S) * d_w, d_x, out) per super-block)
    @numba.njit(inline="always")
    def q3_K_lanes(wf, o, xq, xo):
        s0, s1, s2, s3 = q3_K_scales(wf, o)
        hm = load_b32(wf, o)
        acc = i_zero()
        for j in range(2):
            raw = load_b32(wf, o + 32 + 32 * j)
            for i in range(4):
                q = b_add(b_or(b_and(b_shr(raw, 2 * i), 3), b_shl(b_and(b_shr(hm, 4 * j + i), 1), 2)), 252)
                sb = 8 * j + 2 * i
                acc = madd_sc_s(mode, acc, q, load_b32(xq, xo + 128 * j + 32 * i),
                                q3_K_scale(s0, s1, s2, s3, sb), q3_K_scale(s0, s1, s2, s3, sb + 1))
        return acc

    @numba.njit(inline="always")
    def q3_K_dot(wf, base, nb, xq, xo, xd):
        acc = f_zero()
        for b in range(nb):
            o = base + b * 110
            acc = fmadd_i(acc, q3_K_lanes(wf, o, xq, xo + b * 256), xd[b] * f16_to_f32(wf, o + 108))
        return hsum_f(acc)

    @numba.njit(**_NB)
    def q3_K_matvec(w, xp, out, r0, r1):
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        for i in range(r0, r1):
            out[i] = q3_K_dot(wf, i * rb, nb, xq, 0, xd)

    @numba.njit(inline="always")
    def q3_K_tiled(wf, base, nb, xq, xo, xd):
        """ggml's tiled matmul (no mins): per super-block out = fma(f32(S) * d_w, d_x, out), S exact."""
        acc = f32(0.0)
        for b in range(nb):
            o = base + b * 110
            acc = fma_s(f32(hsum_i(q3_K_lanes(wf, o, xq, xo + b * 256))) * f16_to_f32(wf, o + 108), xd[b], acc)
        return acc

    q3_K_rows_matmat = repack.vec_or_tiled(q3_K_dot, q3_K_tiled)   # (Q3_K is never repacked)

    # from 8 columns the tiled order with 8 rows in lanes (`repack.k16_rows8`)
    q3_K_matmat = repack.tiled_from8(repack.k16_rows8(mode, repack.K16_Q3_TILED), q3_K_rows_matmat,
                                     wide=repack.rows16_tiled(repack.K16_Q3_TILED) if mode == VNNI else None)

    @numba.njit(**_NB)
    def q3_K_id(w, xp, out, r0, r1, rows):
        q3_K_matmat(w, xp, out, r0, r1)

    # ---- Q2_K.  Not repacked (AVX2 machines, or a row count that is not a multiple of 8): from 8 columns
    # ggml's tiled matmul (q2_K_tiled), below every output is ggml_vec_dot_q2_K_q8_K (AVX2): per super-block acc = fma(-d_x * dmin, f32(min lanes), acc), then
    # acc = fma(d_x * d_w, f32(scaled lanes), acc), hsum_float_8 at the end.  Repacked (ggml-cpu repacks
    # Q2_K to q2_K_8x8 on AVX-512 when rows % 8 == 0; the "avx512-vnni" path): one scalar chain per
    # output for the scaled part and one for the mins, out = acc - accm, with one FMA per super-block
    # (gemv: the last n % 4 columns, or all when n < 4) or per half super-block (gemm: the others).
    repacks = mode == VNNI

    @numba.njit(inline="always")
    def q2_K_half(wf, o, xq, xo, j):
        """i32x8 lanes of half j (values 128 j ..) of the Q2_K block at o: pmaddubsw + pmaddwd by scale."""
        raw = load_b32(wf, o + 16 + 32 * j)
        acc = i_zero()
        for i in range(4):
            s = o + 8 * j + 2 * i
            acc = madd_sc(mode, acc, b_and(b_shr(raw, 2 * i), 3), load_b32(xq, xo + 128 * j + 32 * i),
                          np.int32(wf[s]) & 15, np.int32(wf[s + 1]) & 15)
        return acc

    @numba.njit(inline="always")
    def q2_K_vec(wf, base, nb, xq, xo, xd, xb, xbo):
        acc = f_zero()
        for b in range(nb):
            o = base + b * 84
            acc = fmadd_i(acc, q2_mins_lanes(wf, o, xb, xbo + b * 16), -xd[b] * f16_to_f32(wf, o + 82))
            acc = fmadd_i(acc, i_add(q2_K_half(wf, o, xq, xo + b * 256, 0), q2_K_half(wf, o, xq, xo + b * 256, 1)),
                          xd[b] * f16_to_f32(wf, o + 80))
        return hsum_f(acc)

    @numba.njit(inline="always")
    def q2_K_gemv(wf, base, nb, xq, xo, xd, xb, xbo):
        acc = f32(0.0)
        accm = f32(0.0)
        for b in range(nb):
            o = base + b * 84
            s = hsum_i(i_add(q2_K_half(wf, o, xq, xo + b * 256, 0), q2_K_half(wf, o, xq, xo + b * 256, 1)))
            m = hsum_i(q2_mins_lanes(wf, o, xb, xbo + b * 16))
            acc = fma_s(f32(s), f16_to_f32(wf, o + 80) * xd[b], acc)
            accm = fma_s(f32(m), f16_to_f32(wf, o + 82) * xd[b], accm)
        return acc - accm

    @numba.njit(inline="always")
    def q2_K_gemm(wf, base, nb, xq, xo, xd, xb, xbo):
        acc = f32(0.0)
        accm = f32(0.0)
        for b in range(nb):
            o = base + b * 84
            dd = f16_to_f32(wf, o + 80) * xd[b]
            dm = f16_to_f32(wf, o + 82) * xd[b]
            for j in range(2):
                s = hsum_i(q2_K_half(wf, o, xq, xo + b * 256, j))
                m = np.int32(0)
                for t in range(8 * j, 8 * j + 8):
                    m += (np.int32(wf[o + t]) >> 4) * xb[xbo + b * 16 + t]
                acc = fma_s(f32(s), dd, acc)
                accm = fma_s(f32(m), dm, accm)
        return acc - accm

    @numba.njit(inline="always")
    def q2_K_tiled(wf, base, nb, xq, xo, xd, xb, xbo):
        """ggml's tiled matmul (HAS_MIN): r = f32(S) * d_w; r = fma(-dmin, f32(M), r); out = fma(r, d_x, out)."""
        acc = f32(0.0)
        for b in range(nb):
            o = base + b * 84
            s = hsum_i(i_add(q2_K_half(wf, o, xq, xo + b * 256, 0), q2_K_half(wf, o, xq, xo + b * 256, 1)))
            m = hsum_i(q2_mins_lanes(wf, o, xb, xbo + b * 16))
            r = f32(s) * f16_to_f32(wf, o + 80)
            r = fma_s(-f16_to_f32(wf, o + 82), f32(m), r)
            acc = fma_s(r, xd[b], acc)
        return acc

    @numba.njit(**_NB)
    def q2_K_matvec(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        rep = repacks and w.shape[0] % 8 == 0
        for i in range(r0, r1):
            if rep:
                out[i] = q2_K_gemv(wf, i * rb, nb, xq, 0, xd, xb, 0)
            else:
                out[i] = q2_K_vec(wf, i * rb, nb, xq, 0, xd, xb, 0)

    @numba.njit(**_NB)
    def q2_K_plain_vec(w, xp, out, r0, r1):
        """ggml_vec_dot_q2_K_q8_K, row by row (rows_lowbit gives the plain id a faster one)."""
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        for i in range(r0, r1):
            out[i] = q2_K_vec(wf, i * rb, nb, xq, 0, xd, xb, 0)

    q2_K_rows8 = repack.k16_rows8(mode, repack.K16_Q2_REPACKED)
    q2_K_tiled_rows8 = repack.k16_rows8(mode, repack.K16_Q2_TILED)
    q2_K_gemv_rows8 = repack.k16_rows8(mode, repack.K16_Q2_GEMV)

    def q2_K_products(repacked: bool) -> tuple:
        """(matmat, mul_mat_id) of Q2_K; `repacked`: whether llama.cpp repacks a matrix of it whose rows
        are a multiple of 8 (AVX-512; never a 3-D mul_mat weight: kernels.Q2_K_PLAIN)."""
        @numba.njit(**_NB)
        def q2_K_matmat(w, xp, out, r0, r1):
            """The whole groups of 8 rows with the rows in lanes (`repack.k16_rows8`: the repacked gemm /
            gemv where llama.cpp repacks, else ggml's tiled matmul from 8 columns), the rest row by row
            (below 8 columns of a weight llama.cpp does not repack: vec_dot, row by row)."""
            rep = repacked and w.shape[0] % 8 == 0
            n = xp[0].shape[0]
            r8 = r0 + (r1 - r0) // 8 * 8 if rep or n >= 8 else r0
            if r8 > r0:
                if rep:
                    q2_K_rows8(w, xp, out, r0, r8)
                else:
                    q2_K_tiled_rows8(w, xp, out, r0, r8)
            q2_K_rows_matmat(w, xp, out, r8, r1)

        @numba.njit(**_NB)
        def q2_K_rows_matmat(w, xp, out, r0, r1):
            xq, xd, xb = xp
            n, k = xq.shape
            nb = xd.shape[1]
            rb = w.shape[1]
            k16 = xb.shape[1]
            wf = w.reshape(-1)
            xf = xq.reshape(-1)
            xbf = xb.reshape(-1)
            rep = repacked and w.shape[0] % 8 == 0
            n_gemm = n - n % 4 if n > 3 else 0
            tiled = n >= 8  # (not repacked) ggml's tiled matmul
            for i in range(r0, r1):
                for c in range(n):
                    if not rep and tiled:
                        out[c, i] = q2_K_tiled(wf, i * rb, nb, xf, c * k, xd[c], xbf, c * k16)
                    elif not rep:
                        out[c, i] = q2_K_vec(wf, i * rb, nb, xf, c * k, xd[c], xbf, c * k16)
                    elif c < n_gemm:
                        out[c, i] = q2_K_gemm(wf, i * rb, nb, xf, c * k, xd[c], xbf, c * k16)
                    else:
                        out[c, i] = q2_K_gemv(wf, i * rb, nb, xf, c * k, xd[c], xbf, c * k16)

        @numba.njit(**_NB)
        def q2_K_id(w, xp, out, r0, r1, rows):
            """mul_mat_id: the repacked gemv per token (AVX-512, rows % 8 == 0), else the plain orders."""
            if repacked and rows % 8 == 0:
                r8 = r0 + (r1 - r0) // 8 * 8
                q2_K_gemv_rows8(w, xp, out, r0, r8)
                xq, xd, xb = xp
                n, k = xq.shape
                nb = xd.shape[1]
                rb = w.shape[1]
                wf = w.reshape(-1)
                xf = xq.reshape(-1)
                xbf = xb.reshape(-1)
                k16 = xb.shape[1]
                for i in range(r8, r1):
                    for c in range(n):
                        out[c, i] = q2_K_gemv(wf, i * rb, nb, xf, c * k, xd[c], xbf, c * k16)
                return
            q2_K_matmat(w, xp, out, r0, r1)  # (rows % 8 != 0: the expert array's rows as well)
        return q2_K_matmat, q2_K_id

    q2_K_matmat, q2_K_id = q2_K_products(repacks)
    q2_K_plain_matmat, q2_K_plain_id = q2_K_products(False)

    return dict(Q2_K=(q2_K_matvec, q2_K_matmat, q2_K_id), Q3_K=(q3_K_matvec, q3_K_matmat, q3_K_id), Q4_K=(q4_K_matvec, q4_K_matmat, q4_K_id), Q5_K=(q5_K_matvec, q5_K_matmat, q5_K_id),
                Q6_K=(q6_K_matvec, q6_K_matmat, q6_K_id),
                # 3-D mul_mat weights (kernels.PLAIN_TYPES): the orders of a weight llama.cpp does not repack
                Q2_K_plain=(q2_K_plain_vec, q2_K_plain_matmat, q2_K_plain_id),
                Q4_K_plain=(q4_K_plain_matvec, q4_K_plain_matmat, q4_K_plain_id))


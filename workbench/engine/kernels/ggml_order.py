"""Kernels that reproduce, per output value, the float operation order of llama.cpp's CPU kernels.

Integer parts of ggml's quantized dot products are exact, so any grouping gives the same integers;
what decides the float result is which integers are converted to float, which float products and
fused multiply-adds follow and in which order partial sums are added.  For the types of the
default model (Gemma 3 270M Q4_K_M) on an x86 machine with AVX2 / AVX512-VNNI, llama.cpp 0c1e570
runs (see docs in tests/test_kernels_exact.py, which re-implements each order in NumPy):

* Q8_0, Q5_0 (vec_dot type Q8_0) -- decode: ``ggml_vec_dot_q8_0_q8_0`` / ``ggml_vec_dot_q5_0_q8_0``
  (AVX2 branch); prompt: llamafile's ``tinyBLAS_Q0_AVX``.  Both keep, per output, one f32x8
  accumulator: lane l of block b holds the exact integer dot of elements 4l..4l+3 (Q5_0 quants
  offset by -16), and ``acc = fma(f32(lanes), d_w * d_x, acc)`` in block order, then
  hsum_float_8 ((lanes l + l+4), then (0+2), (1+3), then the two).
* Q4_K (repacked to block_q4_Kx8 because rows % 8 == 0) -- one column: ``ggml_gemv_q4_K_8x8_q8_K``:
  per super-block the integer I = sum_j sc_j dot_j and M = sum_j m_j bsum_j (8 sub-blocks),
  ``acc = fma(f32(I), d*d_x, acc)``, ``accm = fma(f32(M), dmin*d_x, accm)``, result ``acc - accm``.
  Several columns: the first n - n%4 by ``ggml_gemm_q4_K_8x8_q8_K``, which does the same per
  *pair* of sub-blocks (4 FMAs per super-block instead of 1); the last n%4 columns by the gemv.
* Q6_K (not repacked on x86) -- one column, or fewer than 8: ``ggml_vec_dot_q6_K_q8_K`` (AVX2
  branch): lane m = sum over the 8 chunks of 32 of sc * (4-element dot of bytes 4m..4m+3 of the
  chunk, unsigned 6-bit quants) - 32 * (sc[2m] bsum[2m] + sc[2m+1] bsum[2m+1]);
  ``acc = fma(f32(lanes), d_x * d, acc)``; hsum_float_8.  Eight or more columns: the "tiled"
  matmul (ggml-cpu/tiled, VNNI micro-kernel): per super-block the exact integer S, then
  ``out = fma(f32(S) * d, d_x, out)`` in super-block order starting from 0 (the source has a
  separate multiply and add; the compiler fuses them, see TILED_FUSED).

Each kernel keeps those per-output chains, never regrouping one: matmat kernels unpack a weight
block once and run the chains of several columns side by side; the legacy matvec runs one row at
a time (interleaving rows measured slower than the single sequential weight stream).
Disable with NUMAWB_EXACT=0 (kernels/__init__.py then keeps simd_kernels' tables).
"""
from __future__ import annotations

import numba
import numpy as np

from .ggml_order_intrinsics import fma32, i_hsum, q6_bsum_lanes
from .simd import (AVX2, VNNI, b_and, b_or, b_shl, b_shr, dot_ss, dot_us, f16_to_f32, f_zero, fmadd_i,
                   hsum_f, i_shl, i_zero, load_b32, load_bits16, load_i8, load_nib, madd_sc)
from .simd import i_add as _iadd  # exact i32x8 lane add

_NB = dict(nogil=True, cache=True)
f32 = np.float32
_MODES = {"avx2": AVX2, "avx512-vnni": VNNI}
Q8_0, Q5_0, Q4_K, Q6_K = 8, 6, 12, 14

#: the tiled Q6_K micro-kernel ends with ``buf + result * d_x`` written as separate
#: _mm512_mul_ps / _mm512_add_ps; GCC (gnu++17: -ffp-contract=fast) contracts them into one FMA
#: in the llama.cpp build, as the tensor dumps confirm (False reproduces an uncontracted build)
TILED_FUSED = True


@numba.njit(inline="always")
def _s8(v):
    """uint8 byte -> signed int32."""
    x = np.int32(v)
    return x - ((x >> 7) << 8)


@numba.njit(inline="always")
def _k4_sc(w, s, j):
    """6-bit scale of sub-block j of a Q4_K block whose 12 scale bytes start at s."""
    if j < 4:
        return np.int32(w[s + j] & 63)
    return np.int32((w[s + j + 4] & 15) | ((w[s + j - 4] >> 6) << 4))


@numba.njit(inline="always")
def _k4_m(w, s, j):
    """6-bit min of sub-block j."""
    if j < 4:
        return np.int32(w[s + j + 4] & 63)
    return np.int32((w[s + j + 4] >> 4) | ((w[s + j] >> 6) << 4))


def _build(mode):
    # ------------------------------------------------------------------ Q8_0 / Q5_0
    @numba.njit(inline="always")
    def q8_0_w(w, o):
        return load_b32(w, o + 2)

    @numba.njit(inline="always")
    def q8_0_dot(wv, xv, n4, no):
        return dot_ss(mode, i_zero(), wv, xv)

    @numba.njit(inline="always")
    def q5_0_w(w, o):
        return b_or(load_nib(w, o + 6), load_bits16(w, o + 2))

    @numba.njit(inline="always")
    def q5_0_dot(wv, xv, n4, no):
        # unsigned quants 0..31; the lane starts at -16 * (sum of its 4 activations), so it ends
        # as the exact integer dot of (q - 16) with x, the lane value of ggml's signed kernel
        return dot_us(mode, i_shl(load_i8(n4, no), 4), wv, xv)

    def make_legacy(unpack, dot, bsz):
        @numba.njit(**_NB)
        def matvec(w, xp, out, r0, r1):
            # one row at a time, one f32x8 chain per row (interleaving rows measured slower: the
            # single sequential weight stream wins on this memory-bound loop)
            xq, xd, n4 = xp
            nb = xd.shape[0]
            rb = w.shape[1]
            for i in range(r0, r1):
                base = i * rb
                a0 = f_zero()
                for b in range(nb):
                    ob = base + b * bsz
                    a0 = fmadd_i(a0, dot(unpack(w, ob), load_b32(xq, b * 32), n4, b * 8), f16_to_f32(w, ob) * xd[b])
                out[i] = hsum_f(a0)

        @numba.njit(**_NB)
        def matmat(w2, xp, out, r0, r1):
            w = w2.reshape(-1)  # flat byte offsets
            rb = w2.shape[1]
            xq2, xd, n42 = xp
            n, nb = xd.shape
            k = nb * 32
            xq = xq2.reshape(-1)
            n4 = n42.reshape(-1)
            for i in range(r0, r1):
                orow = i * rb
                j = 0
                while j + 4 <= n:
                    x0 = j * k
                    a0 = f_zero()
                    a1 = f_zero()
                    a2 = f_zero()
                    a3 = f_zero()
                    for b in range(nb):
                        ob = orow + b * bsz
                        wv = unpack(w, ob)
                        dw = f16_to_f32(w, ob)
                        xo = x0 + b * 32
                        no = xo >> 2
                        a0 = fmadd_i(a0, dot(wv, load_b32(xq, xo), n4, no), dw * xd[j, b])
                        a1 = fmadd_i(a1, dot(wv, load_b32(xq, xo + k), n4, no + (k >> 2)), dw * xd[j + 1, b])
                        a2 = fmadd_i(a2, dot(wv, load_b32(xq, xo + 2 * k), n4, no + 2 * (k >> 2)), dw * xd[j + 2, b])
                        a3 = fmadd_i(a3, dot(wv, load_b32(xq, xo + 3 * k), n4, no + 3 * (k >> 2)), dw * xd[j + 3, b])
                    out[j, i] = hsum_f(a0)
                    out[j + 1, i] = hsum_f(a1)
                    out[j + 2, i] = hsum_f(a2)
                    out[j + 3, i] = hsum_f(a3)
                    j += 4
                while j < n:
                    x0 = j * k
                    a0 = f_zero()
                    for b in range(nb):
                        ob = orow + b * bsz
                        xo = x0 + b * 32
                        a0 = fmadd_i(a0, dot(unpack(w, ob), load_b32(xq, xo), n4, xo >> 2), f16_to_f32(w, ob) * xd[j, b])
                    out[j, i] = hsum_f(a0)
                    j += 1

        return matvec, matmat

    # ------------------------------------------------------------------ Q4_K
    @numba.njit(inline="always")
    def q4k_pair(w, o, g, xq, xb):
        """Exact integer sc_{2g} dot_{2g} + sc_{2g+1} dot_{2g+1} as 8 lanes (64 elements)."""
        s = o + 4
        raw = load_b32(w, o + 16 + 32 * g)
        iv = madd_sc(mode, i_zero(), b_and(raw, 15), load_b32(xq, xb + 64 * g), _k4_sc(w, s, 2 * g), _k4_sc(w, s, 2 * g))
        return madd_sc(mode, iv, b_shr(raw, 4), load_b32(xq, xb + 64 * g + 32), _k4_sc(w, s, 2 * g + 1), _k4_sc(w, s, 2 * g + 1))

    @numba.njit(inline="always")
    def q4k_mins(w, o, g, bs, bo):
        """m_{2g} bsum32_{2g} + m_{2g+1} bsum32_{2g+1} (bo = offset of the block's 16 bsums)."""
        s = o + 4
        return (_k4_m(w, s, 2 * g) * (bs[bo + 4 * g] + bs[bo + 4 * g + 1])
                + _k4_m(w, s, 2 * g + 1) * (bs[bo + 4 * g + 2] + bs[bo + 4 * g + 3]))

    @numba.njit(inline="always")
    def q4k_gemv(w, orow, nb, xq, xo, xd, xdo, bs, bso):
        acc = f32(0.0)
        accm = f32(0.0)
        for b in range(nb):
            o = orow + b * 144
            xb = xo + b * 256
            bo = bso + b * 16
            iv = q4k_pair(w, o, 0, xq, xb)
            iv = _iadd(iv, q4k_pair(w, o, 1, xq, xb))
            iv = _iadd(iv, q4k_pair(w, o, 2, xq, xb))
            iv = _iadd(iv, q4k_pair(w, o, 3, xq, xb))
            tot = i_hsum(iv)
            mn = q4k_mins(w, o, 0, bs, bo) + q4k_mins(w, o, 1, bs, bo) + q4k_mins(w, o, 2, bs, bo) + q4k_mins(w, o, 3, bs, bo)
            dx = xd[xdo + b]
            acc = fma32(f32(tot), f16_to_f32(w, o) * dx, acc)
            accm = fma32(f32(mn), f16_to_f32(w, o + 2) * dx, accm)
        return acc - accm

    @numba.njit(**_NB)
    def q4_K_matmat(w2, xp, out, r0, r1):
        # per row and super-block the weights are unpacked once and reused for every column; each
        # column keeps its own (acc, accm) chain in gemm order (columns < ng) or gemv order
        w = w2.reshape(-1)  # flat byte offsets
        rb = w2.shape[1]
        xq2, xd2, bs2 = xp
        n, nb = xd2.shape
        k = nb * 256
        xq = xq2.reshape(-1)
        xd = xd2.reshape(-1)
        bs = bs2.reshape(-1)
        ng = n - n % 4  # llama.cpp: gemm for whole groups of 4 columns, gemv for the rest
        acc = np.zeros(n, np.float32)
        accm = np.zeros(n, np.float32)
        for i in range(r0, r1):
            orow = i * rb
            acc[:] = 0
            accm[:] = 0
            for b in range(nb):
                o = orow + b * 144
                s = o + 4
                dw = f16_to_f32(w, o)
                dmn = f16_to_f32(w, o + 2)
                c0, c1, c2, c3 = _k4_sc(w, s, 0), _k4_sc(w, s, 1), _k4_sc(w, s, 2), _k4_sc(w, s, 3)
                c4, c5, c6, c7 = _k4_sc(w, s, 4), _k4_sc(w, s, 5), _k4_sc(w, s, 6), _k4_sc(w, s, 7)
                m0, m1, m2, m3 = _k4_m(w, s, 0), _k4_m(w, s, 1), _k4_m(w, s, 2), _k4_m(w, s, 3)
                m4, m5, m6, m7 = _k4_m(w, s, 4), _k4_m(w, s, 5), _k4_m(w, s, 6), _k4_m(w, s, 7)
                raw0 = load_b32(w, o + 16)
                raw1 = load_b32(w, o + 48)
                raw2 = load_b32(w, o + 80)
                raw3 = load_b32(w, o + 112)
                l0, h0 = b_and(raw0, 15), b_shr(raw0, 4)
                l1, h1 = b_and(raw1, 15), b_shr(raw1, 4)
                l2, h2 = b_and(raw2, 15), b_shr(raw2, 4)
                l3, h3 = b_and(raw3, 15), b_shr(raw3, 4)
                for j in range(n):
                    xb = j * k + b * 256
                    bo = j * (k >> 4) + b * 16
                    dx = xd[j * nb + b]
                    p0 = madd_sc(mode, madd_sc(mode, i_zero(), l0, load_b32(xq, xb), c0, c0), h0, load_b32(xq, xb + 32), c1, c1)
                    p1 = madd_sc(mode, madd_sc(mode, i_zero(), l1, load_b32(xq, xb + 64), c2, c2), h1, load_b32(xq, xb + 96), c3, c3)
                    p2 = madd_sc(mode, madd_sc(mode, i_zero(), l2, load_b32(xq, xb + 128), c4, c4), h2, load_b32(xq, xb + 160), c5, c5)
                    p3 = madd_sc(mode, madd_sc(mode, i_zero(), l3, load_b32(xq, xb + 192), c6, c6), h3, load_b32(xq, xb + 224), c7, c7)
                    n0 = m0 * (bs[bo] + bs[bo + 1]) + m1 * (bs[bo + 2] + bs[bo + 3])
                    n1 = m2 * (bs[bo + 4] + bs[bo + 5]) + m3 * (bs[bo + 6] + bs[bo + 7])
                    n2 = m4 * (bs[bo + 8] + bs[bo + 9]) + m5 * (bs[bo + 10] + bs[bo + 11])
                    n3 = m6 * (bs[bo + 12] + bs[bo + 13]) + m7 * (bs[bo + 14] + bs[bo + 15])
                    dd = dw * dx
                    dm = dmn * dx
                    a = acc[j]
                    am = accm[j]
                    if j < ng:  # gemm: one FMA per pair of sub-blocks
                        a = fma32(f32(i_hsum(p0)), dd, a)
                        am = fma32(f32(n0), dm, am)
                        a = fma32(f32(i_hsum(p1)), dd, a)
                        am = fma32(f32(n1), dm, am)
                        a = fma32(f32(i_hsum(p2)), dd, a)
                        am = fma32(f32(n2), dm, am)
                        a = fma32(f32(i_hsum(p3)), dd, a)
                        am = fma32(f32(n3), dm, am)
                    else:  # gemv: one FMA per super-block
                        a = fma32(f32(i_hsum(_iadd(_iadd(p0, p1), _iadd(p2, p3)))), dd, a)
                        am = fma32(f32(n0 + n1 + n2 + n3), dm, am)
                    acc[j] = a
                    accm[j] = am
            for j in range(n):
                out[j, i] = acc[j] - accm[j]

    @numba.njit(**_NB)
    def q4_K_matvec(w2, xp, out, r0, r1):
        w = w2.reshape(-1)  # flat byte offsets
        rb = w2.shape[1]
        xq, xd, bs = xp
        nb = xd.shape[0]
        for i in range(r0, r1):
            out[i] = q4k_gemv(w, i * rb, nb, xq, 0, xd, 0, bs, 0)

    # ------------------------------------------------------------------ Q6_K
    @numba.njit(inline="always")
    def q6k_lanes(w, o, xq, xb, bs, bo):
        iv = q6_bsum_lanes(w, o + 192, bs, bo)
        for h in range(2):
            ql1 = load_b32(w, o + 64 * h)
            ql2 = load_b32(w, o + 64 * h + 32)
            qh = load_b32(w, o + 128 + 32 * h)
            sc = o + 192 + 8 * h
            xh = xb + 128 * h
            q0 = b_or(b_and(ql1, 15), b_shl(b_and(qh, 3), 4))
            q1 = b_or(b_and(ql2, 15), b_shl(b_and(b_shr(qh, 2), 3), 4))
            q2 = b_or(b_shr(ql1, 4), b_shl(b_and(b_shr(qh, 4), 3), 4))
            q3 = b_or(b_shr(ql2, 4), b_shl(b_shr(qh, 6), 4))
            iv = madd_sc(mode, iv, q0, load_b32(xq, xh), _s8(w[sc]), _s8(w[sc + 1]))
            iv = madd_sc(mode, iv, q1, load_b32(xq, xh + 32), _s8(w[sc + 2]), _s8(w[sc + 3]))
            iv = madd_sc(mode, iv, q2, load_b32(xq, xh + 64), _s8(w[sc + 4]), _s8(w[sc + 5]))
            iv = madd_sc(mode, iv, q3, load_b32(xq, xh + 96), _s8(w[sc + 6]), _s8(w[sc + 7]))
        return iv

    @numba.njit(inline="always")
    def q6k_vecdot(w, orow, nb, xq, xo, xd, xdo, bs, bso):
        acc = f_zero()
        for b in range(nb):
            o = orow + b * 210
            acc = fmadd_i(acc, q6k_lanes(w, o, xq, xo + b * 256, bs, bso + b * 16), xd[xdo + b] * f16_to_f32(w, o + 208))
        return hsum_f(acc)

    @numba.njit(inline="always")
    def q6k_tiled(w, orow, nb, xq, xo, xd, xdo, bs, bso):
        acc = f32(0.0)
        for b in range(nb):
            o = orow + b * 210
            r = f32(i_hsum(q6k_lanes(w, o, xq, xo + b * 256, bs, bso + b * 16))) * f16_to_f32(w, o + 208)
            if TILED_FUSED:
                acc = fma32(r, xd[xdo + b], acc)
            else:
                acc = acc + r * xd[xdo + b]
        return acc

    @numba.njit(**_NB)
    def q6_K_matvec(w2, xp, out, r0, r1):
        w = w2.reshape(-1)  # flat byte offsets
        rb = w2.shape[1]
        xq, xd, bs = xp
        nb = xd.shape[0]
        for i in range(r0, r1):
            out[i] = q6k_vecdot(w, i * rb, nb, xq, 0, xd, 0, bs, 0)

    @numba.njit(**_NB)
    def q6_K_matmat(w2, xp, out, r0, r1):
        w = w2.reshape(-1)  # flat byte offsets
        rb = w2.shape[1]
        xq2, xd2, bs2 = xp
        n, nb = xd2.shape
        k = nb * 256
        xq = xq2.reshape(-1)
        xd = xd2.reshape(-1)
        bs = bs2.reshape(-1)
        if n < 8:  # llama.cpp: vec_dot per column below 8 columns
            for i in range(r0, r1):
                for j in range(n):
                    out[j, i] = q6k_vecdot(w, i * rb, nb, xq, j * k, xd, j * nb, bs, j * (k >> 4))
            return
        # tiled matmul order; per row and super-block the quants are unpacked once for all columns
        acc = np.zeros(n, np.float32)
        for i in range(r0, r1):
            orow = i * rb
            acc[:] = 0
            for b in range(nb):
                o = orow + b * 210
                dw = f16_to_f32(w, o + 208)
                sc = o + 192
                ql1 = load_b32(w, o)
                ql2 = load_b32(w, o + 32)
                qh = load_b32(w, o + 128)
                q0 = b_or(b_and(ql1, 15), b_shl(b_and(qh, 3), 4))
                q1 = b_or(b_and(ql2, 15), b_shl(b_and(b_shr(qh, 2), 3), 4))
                q2 = b_or(b_shr(ql1, 4), b_shl(b_and(b_shr(qh, 4), 3), 4))
                q3 = b_or(b_shr(ql2, 4), b_shl(b_shr(qh, 6), 4))
                ql1 = load_b32(w, o + 64)
                ql2 = load_b32(w, o + 96)
                qh = load_b32(w, o + 160)
                q4 = b_or(b_and(ql1, 15), b_shl(b_and(qh, 3), 4))
                q5 = b_or(b_and(ql2, 15), b_shl(b_and(b_shr(qh, 2), 3), 4))
                q6 = b_or(b_shr(ql1, 4), b_shl(b_and(b_shr(qh, 4), 3), 4))
                q7 = b_or(b_shr(ql2, 4), b_shl(b_shr(qh, 6), 4))
                s0, s1, s2, s3 = _s8(w[sc]), _s8(w[sc + 1]), _s8(w[sc + 2]), _s8(w[sc + 3])
                s4, s5, s6, s7 = _s8(w[sc + 4]), _s8(w[sc + 5]), _s8(w[sc + 6]), _s8(w[sc + 7])
                s8, s9, s10, s11 = _s8(w[sc + 8]), _s8(w[sc + 9]), _s8(w[sc + 10]), _s8(w[sc + 11])
                s12, s13, s14, s15 = _s8(w[sc + 12]), _s8(w[sc + 13]), _s8(w[sc + 14]), _s8(w[sc + 15])
                for j in range(n):
                    xb = j * k + b * 256
                    iv = q6_bsum_lanes(w, sc, bs, j * (k >> 4) + b * 16)
                    iv = madd_sc(mode, iv, q0, load_b32(xq, xb), s0, s1)
                    iv = madd_sc(mode, iv, q1, load_b32(xq, xb + 32), s2, s3)
                    iv = madd_sc(mode, iv, q2, load_b32(xq, xb + 64), s4, s5)
                    iv = madd_sc(mode, iv, q3, load_b32(xq, xb + 96), s6, s7)
                    iv = madd_sc(mode, iv, q4, load_b32(xq, xb + 128), s8, s9)
                    iv = madd_sc(mode, iv, q5, load_b32(xq, xb + 160), s10, s11)
                    iv = madd_sc(mode, iv, q6, load_b32(xq, xb + 192), s12, s13)
                    iv = madd_sc(mode, iv, q7, load_b32(xq, xb + 224), s14, s15)
                    r = f32(i_hsum(iv)) * dw
                    if TILED_FUSED:
                        acc[j] = fma32(r, xd[j * nb + b], acc[j])
                    else:
                        acc[j] = acc[j] + r * xd[j * nb + b]
            for j in range(n):
                out[j, i] = acc[j]

    q8mv, q8mm = make_legacy(q8_0_w, q8_0_dot, 34)
    q5mv, q5mm = make_legacy(q5_0_w, q5_0_dot, 22)
    return {Q8_0: (q8mv, q8mm), Q5_0: (q5mv, q5mm), Q4_K: (q4_K_matvec, q4_K_matmat), Q6_K: (q6_K_matvec, q6_K_matmat)}


_cache: dict[str, tuple[dict, dict]] = {}


def tables(path: str) -> tuple[dict, dict]:
    """(matvec, matmat) dicts {ggml type id: kernel} of the llama.cpp-ordered kernels for a SIMD path."""
    if path not in _cache:
        fns = _build(_MODES[path])
        try:  # process-stable on-disk cache keys (see simd_kernels._StableCache)
            from .simd_kernels import _stable_cache
            for pair in fns.values():
                for disp in pair:
                    _stable_cache(disp)
        except ImportError:
            pass
        _cache[path] = ({t: f[0] for t, f in fns.items()}, {t: f[1] for t, f in fns.items()})
    return _cache[path]

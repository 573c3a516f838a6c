"""Explicit-SIMD kernels (256-bit) for the "avx2" and "avx512-vnni" paths.

Each kernel factory closes over ``mode`` (simd.AVX2 or simd.VNNI); Numba treats the closure
value as a compile-time constant and the primitives emit only that instruction set, so one source
gives two separately compiled (and separately cached) implementations.

Integer work per block is exact and follows ggml: Q8_0 uses the sign trick (|w| . sign(w)*x);
Q4_0/Q5_0 multiply unsigned quants and remove the offset inside the i32 lanes with the
precomputed group-of-4 activation sums (``n4``); K-quants use pmaddubsw then pmaddwd/vpdpwssd
with the sub-block scales.  Lanes are converted to f32 and fused-multiply-added with the block
scale product, like ggml's AVX2 code.

matmat processes one weight row against 4 activation columns at a time, so every unpacked weight
block is reused 4 times from registers.
"""
from __future__ import annotations

import numba
import numpy as np

from . import k_quants as _kq
from .simd import (AVX2, VNNI, b_and, b_xor, bf16_to_f32, b_or, b_shl, b_shr, dot_ss, dot_us, f16_to_f32, f_zero,
                   f_add, fma_f, fmadd_i, hsum_f, i_add, i_add0, i_shl, i_zero, load_b32, load_bf16x8,
                   load_bits16, load_f16x8, load_f32x8, load_i8, load_nib, madd_sc, ld_u32, mins_dot, sdot16)

_NB = dict(nogil=True, cache=True)
f32 = np.float32
_MODES = {"avx2": AVX2, "avx512-vnni": VNNI}


# ============================================================================= legacy quants
def _legacy(mode):
    @numba.njit(inline="always")
    def q8_0_lanes(w, o, xq, xo):
        return dot_ss(mode, i_zero(), load_b32(w, o + 2), load_b32(xq, xo))

    @numba.njit(inline="always")
    def q4_0_lanes(w, o, xq, xo, n4, no):
        return dot_us(mode, i_shl(load_i8(n4, no), 3), load_nib(w, o + 2), load_b32(xq, xo))

    @numba.njit(inline="always")
    def q5_0_lanes(w, o, xq, xo, n4, no):
        q = b_or(load_nib(w, o + 6), load_bits16(w, o + 2))
        return dot_us(mode, i_shl(load_i8(n4, no), 4), q, load_b32(xq, xo))

    @numba.njit(inline="always")
    def q4_1_lanes(w, o, xq, xo):
        return dot_us(mode, i_zero(), load_nib(w, o + 4), load_b32(xq, xo))

    @numba.njit(inline="always")
    def q5_1_lanes(w, o, xq, xo):
        q = b_or(load_nib(w, o + 8), load_bits16(w, o + 4))
        return dot_us(mode, i_zero(), q, load_b32(xq, xo))

    # ---- matvec: per-block (lanes, scale, extra) functions and one 4-accumulator driver
    @numba.njit(inline="always")
    def q8_0_blk(w, base, b, xq, xd, xa):
        o = base + b * 34
        return q8_0_lanes(w, o, xq, b * 32), f16_to_f32(w, o) * xd[b], f32(0.0)

    @numba.njit(inline="always")
    def q4_0_blk(w, base, b, xq, xd, xa):
        o = base + b * 18
        return q4_0_lanes(w, o, xq, b * 32, xa, b * 8), f16_to_f32(w, o) * xd[b], f32(0.0)

    @numba.njit(inline="always")
    def q5_0_blk(w, base, b, xq, xd, xa):
        o = base + b * 22
        return q5_0_lanes(w, o, xq, b * 32, xa, b * 8), f16_to_f32(w, o) * xd[b], f32(0.0)

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

    q8_0_matvec = make_matvec(q8_0_blk)
    q4_0_matvec = make_matvec(q4_0_blk)
    q5_0_matvec = make_matvec(q5_0_blk)
    q4_1_matvec = make_matvec(q4_1_blk)
    q5_1_matvec = make_matvec(q5_1_blk)

    # ---- matmat: 2 rows x 4 columns register tiles.  The loop over column tiles is outermost, so a
    # tile's activations (4 columns: quants + offset sums, ~13 KB at k=640) stay in L1 while the
    # weight rows stream past; every unpacked weight block is reused for 4 columns and every
    # activation load for 2 rows.  Per (row, column) the block order and the f32 accumulation are
    # those of the single-column loop, so results do not depend on the tiling.
    #
    # Unsigned-weight formulation for all three: lanes = dpbusd(init, u, x) with u = unsigned quants
    # (Q4_0: nibble, Q5_0: nibble | bit5 << 4, Q8_0: q + 128 via xor 0x80) and init = n4 << shift
    # (n4 = -sum of each group of 4 activation quants, shift = log2 of the offset: 3, 4, 7) — exact
    # in int32 (|128 * 4 * 127| < 2^16), and the offset shift is done once per call, not per block.
    @numba.njit(inline="always")
    def u_q8_0(w, o):
        return b_xor(load_b32(w, o + 2), 128)

    @numba.njit(inline="always")
    def u_q4_0(w, o):
        return load_nib(w, o + 2)

    @numba.njit(inline="always")
    def u_q5_0(w, o):
        return b_or(load_nib(w, o + 6), load_bits16(w, o + 2))

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
            ns = np.left_shift(n4.reshape(-1), shift)       # n4 << shift, once per call
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

    q8_0_matmat = make_matmat(u_q8_0, 34, 7)
    q4_0_matmat = make_matmat(u_q4_0, 18, 3)
    q5_0_matmat = make_matmat(u_q5_0, 22, 4)

    @numba.njit(**_NB)
    def q4_1_matmat(w, xp, out, r0, r1):
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
                    o = base + b * 20
                    acc = fmadd_i(acc, q4_1_lanes(w, o, xf, c * k + b * 32), f16_to_f32(w, o) * xd[c, b])
                    accm += f16_to_f32(w, o + 2) * xs[c, b]
                out[c, i] = hsum_f(acc) + accm

    @numba.njit(**_NB)
    def q5_1_matmat(w, xp, out, r0, r1):
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
                    o = base + b * 24
                    acc = fmadd_i(acc, q5_1_lanes(w, o, xf, c * k + b * 32), f16_to_f32(w, o) * xd[c, b])
                    accm += f16_to_f32(w, o + 2) * xs[c, b]
                out[c, i] = hsum_f(acc) + accm

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
    @numba.njit(inline="always")
    def q4_K_dot(wf, o, xq, xo, xd, xb, bo):
        """(integer lanes of sum_j sc_j*dot_j, sum_j m_j*bsum_j) of one super-block."""
        sl, sh, ml, mh = _k4_scales(wf, o + 4)
        acc = i_zero()
        acc1 = i_zero()
        for jp in range(4):
            sc0 = np.int32(((sl if jp < 2 else sh) >> np.uint32(16 * (jp & 1))) & np.uint32(0xFF))
            sc1 = np.int32(((sl if jp < 2 else sh) >> np.uint32(16 * (jp & 1) + 8)) & np.uint32(0xFF))
            raw = load_b32(wf, o + 16 + 32 * jp)
            acc = madd_sc(mode, acc, b_and(raw, 15), load_b32(xq, xo + 64 * jp), sc0, sc0)
            acc1 = madd_sc(mode, acc1, b_shr(raw, 4), load_b32(xq, xo + 64 * jp + 32), sc1, sc1)
        return i_add(acc, acc1), mins_dot(ml, mh, xb, bo)

    @numba.njit(inline="always")
    def q5_K_dot(wf, o, xq, xo, xd, xb, bo):
        sl, sh, ml, mh = _k4_scales(wf, o + 4)
        acc = i_zero()
        acc1 = i_zero()
        qh = load_b32(wf, o + 16)
        for jp in range(4):
            sc0 = np.int32(((sl if jp < 2 else sh) >> np.uint32(16 * (jp & 1))) & np.uint32(0xFF))
            sc1 = np.int32(((sl if jp < 2 else sh) >> np.uint32(16 * (jp & 1) + 8)) & np.uint32(0xFF))
            raw = load_b32(wf, o + 48 + 32 * jp)
            h = b_shr(qh, 2 * jp)
            q0 = b_or(b_and(raw, 15), b_shl(b_and(h, 1), 4))
            q1 = b_or(b_shr(raw, 4), b_shl(b_and(h, 2), 3))
            acc = madd_sc(mode, acc, q0, load_b32(xq, xo + 64 * jp), sc0, sc0)
            acc1 = madd_sc(mode, acc1, q1, load_b32(xq, xo + 64 * jp + 32), sc1, sc1)
        return i_add(acc, acc1), mins_dot(ml, mh, xb, bo)

    @numba.njit(inline="always")
    def q6_K_dot(wf, ws, o, xq, xo, xb, bo):
        """Integer lanes of sum_j sc_j * sum (q-32)*x (offset removed via bsums)."""
        acc = i_zero()
        acc1 = i_zero()
        for h in range(2):
            ql0 = load_b32(wf, o + 64 * h)
            ql1 = load_b32(wf, o + 64 * h + 32)
            qh = load_b32(wf, o + 128 + 32 * h)
            sc = o + 192 + 8 * h
            s0 = np.int32(ws[sc]); s1 = np.int32(ws[sc + 1]); s2 = np.int32(ws[sc + 2]); s3 = np.int32(ws[sc + 3])
            s4 = np.int32(ws[sc + 4]); s5 = np.int32(ws[sc + 5]); s6 = np.int32(ws[sc + 6]); s7 = np.int32(ws[sc + 7])
            x0 = xo + 128 * h
            q1 = b_or(b_and(ql0, 15), b_shl(b_and(qh, 3), 4))
            q2 = b_or(b_and(ql1, 15), b_shl(b_and(qh, 12), 2))
            q3 = b_or(b_shr(ql0, 4), b_and(qh, 48))
            q4 = b_or(b_shr(ql1, 4), b_shr(b_and(qh, 192), 2))
            acc = madd_sc(mode, acc, q1, load_b32(xq, x0), s0, s1)
            acc1 = madd_sc(mode, acc1, q2, load_b32(xq, x0 + 32), s2, s3)
            acc = madd_sc(mode, acc, q3, load_b32(xq, x0 + 64), s4, s5)
            acc1 = madd_sc(mode, acc1, q4, load_b32(xq, x0 + 96), s6, s7)
        return i_add0(i_add(acc, acc1), -32 * sdot16(wf, o + 192, xb, bo))

    @numba.njit(**_NB)
    def q4_K_matvec(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        for i in range(r0, r1):
            acc = f_zero()
            accm = f32(0.0)
            for b in range(nb):
                o = i * rb + b * 144
                lanes, summ = q4_K_dot(wf, o, xq, b * 256, xd, xb, b * 16)
                acc = fmadd_i(acc, lanes, f16_to_f32(w, o) * xd[b])
                accm += (f16_to_f32(w, o + 2) * xd[b]) * f32(summ)
            out[i] = hsum_f(acc) - accm

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

    @numba.njit(**_NB)
    def q4_K_matmat(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[1]
        rb = w.shape[1]
        wf = w.reshape(-1)
        for i in range(r0, r1):
            for c in range(xq.shape[0]):
                acc = f_zero()
                accm = f32(0.0)
                xqc = xq[c]; xbc = xb[c]
                for b in range(nb):
                    o = i * rb + b * 144
                    lanes, summ = q4_K_dot(wf, o, xqc, b * 256, xd, xbc, b * 16)
                    acc = fmadd_i(acc, lanes, f16_to_f32(w, o) * xd[c, b])
                    accm += (f16_to_f32(w, o + 2) * xd[c, b]) * f32(summ)
                out[c, i] = hsum_f(acc) - accm

    @numba.njit(**_NB)
    def q5_K_matmat(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[1]
        rb = w.shape[1]
        wf = w.reshape(-1)
        for i in range(r0, r1):
            for c in range(xq.shape[0]):
                acc = f_zero()
                accm = f32(0.0)
                xqc = xq[c]; xbc = xb[c]
                for b in range(nb):
                    o = i * rb + b * 176
                    lanes, summ = q5_K_dot(wf, o, xqc, b * 256, xd, xbc, b * 16)
                    acc = fmadd_i(acc, lanes, f16_to_f32(w, o) * xd[c, b])
                    accm += (f16_to_f32(w, o + 2) * xd[c, b]) * f32(summ)
                out[c, i] = hsum_f(acc) - accm

    @numba.njit(**_NB)
    def q6_K_matmat(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[1]
        rb = w.shape[1]
        wf = w.reshape(-1)
        ws = w.view(np.int8).reshape(-1)
        for i in range(r0, r1):
            for c in range(xq.shape[0]):
                acc = f_zero()
                xqc = xq[c]; xbc = xb[c]
                for b in range(nb):
                    o = i * rb + b * 210
                    acc = fmadd_i(acc, q6_K_dot(wf, ws, o, xqc, b * 256, xbc, b * 16), f16_to_f32(w, o + 208) * xd[c, b])
                out[c, i] = hsum_f(acc)

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

        @numba.njit(**_NB)
        def matvec(w, xp, out, r0, r1):
            x = xp[0]
            k = x.shape[0]
            rb = w.shape[1]
            for i in range(r0, r1):
                out[i] = dot(w, i * rb, x, 0, k)

        @numba.njit(**_NB)
        def matmat(w, xp, out, r0, r1):
            x = xp[0]
            k = x.shape[1]
            xf = x.reshape(-1)
            rb = w.shape[1]
            for i in range(r0, r1):
                for c in range(x.shape[0]):
                    out[c, i] = dot(w, i * rb, xf, c * k, k)

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

    @numba.njit(**_NB)
    def f16_matvec(w, xp, out, r0, r1):
        x = xp[0]
        k = x.shape[0]
        rb = w.shape[1]
        for i in range(r0, r1):
            out[i] = dot16_vec(w, i * rb, x, 0, k)

    @numba.njit(**_NB)
    def f16_matmat(w, xp, out, r0, r1):
        x = xp[0]
        k = x.shape[1]
        xf = x.reshape(-1)
        rb = w.shape[1]
        for i in range(r0, r1):
            for c in range(x.shape[0]):
                out[c, i] = dot16_tiny(w, i * rb, xf, c * k, k)

    return dict(F32=build(load_f32x8, 4, _f32_at), F16=(f16_matvec, f16_matmat),
                BF16=build(load_bf16x8, 2, _bf16_at))


@numba.njit(inline="always")
def _f32_at(w, off):
    return w.reshape(-1)[off:off + 4].view(np.float32)[0]


@numba.njit(inline="always")
def _bf16_at(w, off):
    return bf16_to_f32(w, off)


# ============================================================================= tables
_TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
             "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}
_cache: dict[str, tuple[dict, dict]] = {}


def tables(path: str) -> tuple[dict, dict]:
    """(matvec, matmat) dicts keyed by ggml type id for a SIMD path (functions compile on first call)."""
    if path not in _cache:
        mode = _MODES[path]
        fns = {**_legacy(mode), **_kquants(mode), **_floats(mode)}
        mv = {_TYPE_IDS[n]: f[0] for n, f in fns.items()}
        mm = {_TYPE_IDS[n]: f[1] for n, f in fns.items()}
        _cache[path] = (mv, mm)
    return _cache[path]

"""Q4_K, Q5_K, Q6_K weights (super-blocks of 256) against Q8_K activations.

Layouts (bytes): Q4_K = d f16 | dmin f16 | scales[12] | qs[128]  (144);
Q5_K = d | dmin | scales[12] | qh[32] | qs[128]  (176);
Q6_K = ql[128] | qh[64] | scales int8[16] | d f16  (210).
Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scale/min packed in 12 bytes (see ``_scale_min``);
value = d*sc*q - dmin*m.  Q6_K: 16 sub-blocks of 16 with int8 scales; value = d*sc*(q-32).
Per super-block ggml takes the exact integer sums ``sum_j sc_j*dot_j`` and ``sum_j m_j*bsum_j``
and accumulates ``d_w*d_x*sumi - dmin_w*d_x*summ`` in f32, as done here.

This module holds the portable (plain Numba loop) kernels; the SIMD ones are in ``x86``.
"""
from __future__ import annotations

import numba
import numpy as np

from .intrinsics.scalars import f16_to_f32

from .rowwise import blockwise_dequant, rowwise_products
f32 = np.float32

BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


@numba.njit(inline="always")
def _scale_min(row, o, j):
    """6-bit (scale, min) of sub-block j from the 12 scale bytes at row[o:o+12]."""
    if j < 4:
        sc = np.int32(row[o + j]) & 63
        m = np.int32(row[o + j + 4]) & 63
    else:
        sc = (np.int32(row[o + j + 4]) & 15) | ((np.int32(row[o + j - 4]) >> 6) << 4)
        m = (np.int32(row[o + j + 4]) >> 4) | ((np.int32(row[o + j]) >> 6) << 4)
    return sc, m


# ----------------------------------------------------------------------------- row dots
@numba.njit(inline="always")
def _k_pair(row, o, qs, qh, jp, l):
    """Quants l of sub-blocks 2 jp and 2 jp + 1 of a Q4_K / Q5_K super-block at byte o: the nibbles
    of byte qs + 32 jp + l, with Q5_K's fifth bits from byte qh + l (qh < 0: Q4_K, none)."""
    v = np.int32(row[o + qs + 32 * jp + l])
    q0 = v & 15
    q1 = v >> 4
    if qh >= 0:
        h = np.int32(row[o + qh + l])
        q0 = q0 | (((h >> (2 * jp)) & 1) << 4)
        q1 = q1 | (((h >> (2 * jp + 1)) & 1) << 4)
    return q0, q1


@numba.njit(inline="always")
def _dot_k_mins(row, xq, xd, xb, bsz, qs, qh):
    """A Q4_K (qh < 0) or Q5_K (qh: where its fifth bits are) row against Q8_K activations: the
    sub-blocks' scaled sums and the mins times the activation's 16-element sums, in ggml's order."""
    acc = f32(0.0)
    for b in range(xd.shape[0]):
        o = b * bsz
        sumi = np.int32(0)
        summ = np.int32(0)
        for jp in range(4):
            sc0, m0 = _scale_min(row, o + 4, 2 * jp)
            sc1, m1 = _scale_min(row, o + 4, 2 * jp + 1)
            s0 = np.int32(0)
            s1 = np.int32(0)
            for l in range(32):
                q0, q1 = _k_pair(row, o, qs, qh, jp, l)
                s0 += q0 * np.int32(xq[b * 256 + 64 * jp + l])
                s1 += q1 * np.int32(xq[b * 256 + 64 * jp + 32 + l])
            sumi += sc0 * s0 + sc1 * s1
            summ += m0 * (xb[b * 16 + 4 * jp] + xb[b * 16 + 4 * jp + 1])
            summ += m1 * (xb[b * 16 + 4 * jp + 2] + xb[b * 16 + 4 * jp + 3])
        acc += (f16_to_f32(row, o) * xd[b]) * f32(sumi) - (f16_to_f32(row, o + 2) * xd[b]) * f32(summ)
    return acc


@numba.njit(inline="always")
def _dot_q4_K(row, xq, xd, xb):
    return _dot_k_mins(row, xq, xd, xb, 144, 16, -1)


@numba.njit(inline="always")
def _dot_q5_K(row, xq, xd, xb):
    return _dot_k_mins(row, xq, xd, xb, 176, 48, 16)


@numba.njit(inline="always")
def _dot_q6_K(row, xq, xd, xb):
    acc = f32(0.0)
    rs = row.view(np.int8)
    for b in range(xd.shape[0]):
        o = b * 210
        sumi = np.int32(0)
        for h in range(2):  # two halves of 128 elements
            ql = o + 64 * h
            qh = o + 128 + 32 * h
            xo = b * 256 + 128 * h
            p0 = np.int32(0); p1 = np.int32(0); p2 = np.int32(0); p3 = np.int32(0)
            p4 = np.int32(0); p5 = np.int32(0); p6 = np.int32(0); p7 = np.int32(0)
            for l in range(32):
                a = np.int32(row[ql + l])
                c = np.int32(row[ql + 32 + l])
                hh = np.int32(row[qh + l])
                q1 = ((a & 15) | ((hh & 3) << 4)) - 32
                q2 = ((c & 15) | (((hh >> 2) & 3) << 4)) - 32
                q3 = ((a >> 4) | (((hh >> 4) & 3) << 4)) - 32
                q4 = ((c >> 4) | (((hh >> 6) & 3) << 4)) - 32
                t1 = q1 * np.int32(xq[xo + l])
                t2 = q2 * np.int32(xq[xo + 32 + l])
                t3 = q3 * np.int32(xq[xo + 64 + l])
                t4 = q4 * np.int32(xq[xo + 96 + l])
                if l < 16:
                    p0 += t1; p2 += t2; p4 += t3; p6 += t4
                else:
                    p1 += t1; p3 += t2; p5 += t3; p7 += t4
            sc = o + 192 + 8 * h
            sumi += (np.int32(rs[sc]) * p0 + np.int32(rs[sc + 1]) * p1 + np.int32(rs[sc + 2]) * p2
                     + np.int32(rs[sc + 3]) * p3 + np.int32(rs[sc + 4]) * p4 + np.int32(rs[sc + 5]) * p5
                     + np.int32(rs[sc + 6]) * p6 + np.int32(rs[sc + 7]) * p7)
        acc += (f16_to_f32(row, o + 208) * xd[b]) * f32(sumi)
    return acc


# ----------------------------------------------------------------------------- dequantize
@numba.njit(inline="always")
def _deq_k_mins(row, o, dst, e, qs, qh):
    """A Q4_K (qh < 0) or Q5_K (qh: where its fifth bits are) super-block: 8 sub-blocks of 32 with a
    6-bit scale and min each, d * sc * q - dmin * m; the quants' nibbles at byte qs of the block."""
    d = f16_to_f32(row, o)
    dmin = f16_to_f32(row, o + 2)
    for jp in range(4):
        sc0, m0 = _scale_min(row, o + 4, 2 * jp)
        sc1, m1 = _scale_min(row, o + 4, 2 * jp + 1)
        d0 = d * f32(sc0); mm0 = dmin * f32(m0)
        d1 = d * f32(sc1); mm1 = dmin * f32(m1)
        for l in range(32):
            q0, q1 = _k_pair(row, o, qs, qh, jp, l)
            dst[e + 64 * jp + l] = d0 * f32(q0) - mm0
            dst[e + 64 * jp + 32 + l] = d1 * f32(q1) - mm1


@numba.njit(inline="always")
def _deq_q4_K(row, o, dst, e):
    _deq_k_mins(row, o, dst, e, 16, -1)


dequant_q4_K = blockwise_dequant(_deq_q4_K, 144, 256)


@numba.njit(inline="always")
def _deq_q5_K(row, o, dst, e):
    _deq_k_mins(row, o, dst, e, 48, 16)


dequant_q5_K = blockwise_dequant(_deq_q5_K, 176, 256)


@numba.njit(inline="always")
def _deq_q6_K(row, o, dst, e0):
    rs = row.view(np.int8)
    d = f16_to_f32(row, o + 208)
    for h in range(2):
        ql = o + 64 * h
        qh = o + 128 + 32 * h
        sc = o + 192 + 8 * h
        e = e0 + 128 * h
        for l in range(32):
            a = np.int32(row[ql + l])
            c = np.int32(row[ql + 32 + l])
            hh = np.int32(row[qh + l])
            isc = l // 16
            dst[e + l] = (d * f32(rs[sc + isc])) * f32(((a & 15) | ((hh & 3) << 4)) - 32)
            dst[e + 32 + l] = (d * f32(rs[sc + isc + 2])) * f32(((c & 15) | (((hh >> 2) & 3) << 4)) - 32)
            dst[e + 64 + l] = (d * f32(rs[sc + isc + 4])) * f32(((a >> 4) | (((hh >> 4) & 3) << 4)) - 32)
            dst[e + 96 + l] = (d * f32(rs[sc + isc + 6])) * f32(((c >> 4) | (((hh >> 6) & 3) << 4)) - 32)


dequant_q6_K = blockwise_dequant(_deq_q6_K, 210, 256)


# ----------------------------------------------------------------------------- Q3_K
# Q3_K = hmask[32] | qs[64] | scales[12] | d f16  (110 bytes, 256 values): element 128 j + 32 i + l
# (l < 32) has low bits (qs[32 j + l] >> 2 i) & 3 and high bit (hmask[l] >> (4 j + i)) & 1;
# q = low + 4 high - 4; 16 sub-blocks of 16 with 6-bit scales packed in 12 bytes (``q3_K_scales``),
# value = d * (sc - 32) * q.
@numba.njit(inline="always")
def q3_K_scales(w, o):
    """The 16 6-bit scales of the Q3_K block at byte o of a 1-D uint8 array as 4 uint32 (byte s % 4 of
    word s // 4 = scale s + 32), like ggml's kmask unpacking."""
    a0 = np.uint32(w[o + 96]) | (np.uint32(w[o + 97]) << 8) | (np.uint32(w[o + 98]) << 16) | (np.uint32(w[o + 99]) << 24)
    a1 = np.uint32(w[o + 100]) | (np.uint32(w[o + 101]) << 8) | (np.uint32(w[o + 102]) << 16) | (np.uint32(w[o + 103]) << 24)
    a2 = np.uint32(w[o + 104]) | (np.uint32(w[o + 105]) << 8) | (np.uint32(w[o + 106]) << 16) | (np.uint32(w[o + 107]) << 24)
    k1 = np.uint32(0x03030303)
    k2 = np.uint32(0x0F0F0F0F)
    s0 = (a0 & k2) | ((a2 & k1) << np.uint32(4))
    s1 = (a1 & k2) | (((a2 >> np.uint32(2)) & k1) << np.uint32(4))
    s2 = ((a0 >> np.uint32(4)) & k2) | (((a2 >> np.uint32(4)) & k1) << np.uint32(4))
    s3 = ((a1 >> np.uint32(4)) & k2) | (((a2 >> np.uint32(6)) & k1) << np.uint32(4))
    return s0, s1, s2, s3


@numba.njit(inline="always")
def q3_K_scale(s0, s1, s2, s3, s):
    """Scale s (0..15) minus 32 from q3_K_scales' words."""
    word = s0 if s < 4 else s1 if s < 8 else s2 if s < 12 else s3
    return np.int32((word >> np.uint32(8 * (s % 4))) & np.uint32(0xFF)) - 32


@numba.njit(inline="always")
def _q3_K_q(w, o, e):
    """Quant e (0..255) of the Q3_K block at byte o, in -4..3."""
    j, r = e // 128, e % 128
    i, l = r // 32, r % 32
    low = (np.int32(w[o + 32 + 32 * j + l]) >> (2 * i)) & 3
    high = (np.int32(w[o + l]) >> (4 * j + i)) & 1
    return low + 4 * high - 4


@numba.njit(inline="always")
def _dot_q3_K(row, xq, xd, _x3):
    acc = f32(0.0)
    for b in range(xd.shape[0]):
        o = b * 110
        s0, s1, s2, s3 = q3_K_scales(row, o)
        s = np.int32(0)
        for sb in range(16):
            t = np.int32(0)
            for e in range(16 * sb, 16 * sb + 16):
                t += _q3_K_q(row, o, e) * np.int32(xq[b * 256 + e])
            s += q3_K_scale(s0, s1, s2, s3, sb) * t
        acc += f32(s) * (f16_to_f32(row, o + 108) * xd[b])
    return acc


# ggml's dequantize_row_q3_K (and gguf.quants): dl = d * (sc - 32), then dl * q
@numba.njit(inline="always")
def _deq_q3_K(row, o, dst, e0):
    d = f16_to_f32(row, o + 108)
    s0, s1, s2, s3 = q3_K_scales(row, o)
    for sb in range(16):
        dl = d * f32(q3_K_scale(s0, s1, s2, s3, sb))
        for e in range(16 * sb, 16 * sb + 16):
            dst[e0 + e] = dl * f32(_q3_K_q(row, o, e))


dequant_q3_K = blockwise_dequant(_deq_q3_K, 110, 256)


# ----------------------------------------------------------------------------- Q2_K
# Q2_K = scales[16] | qs[64] | d f16 | dmin f16  (84 bytes, 256 values): element 128 j + 32 i + l
# (l < 32) is (qs[32 j + l] >> 2 i) & 3; sub-block s (16 values) has scale scales[s] & 15 and min
# scales[s] >> 4; value = d * sc * q - dmin * m.
@numba.njit(inline="always")
def _dot_q2_K(row, xq, xd, xb):
    acc = f32(0.0)
    for b in range(xd.shape[0]):
        o = b * 84
        s = np.int32(0)
        m = np.int32(0)
        for sb in range(16):
            t = np.int32(0)
            for e in range(16 * sb, 16 * sb + 16):
                j, r = e // 128, e % 128
                q = (np.int32(row[o + 16 + 32 * j + r % 32]) >> (2 * (r // 32))) & 3
                t += q * np.int32(xq[b * 256 + e])
            s += (np.int32(row[o + sb]) & 15) * t
            m += (np.int32(row[o + sb]) >> 4) * np.int32(xb[b * 16 + sb])
        acc += f32(s) * (f16_to_f32(row, o + 80) * xd[b]) - f32(m) * (f16_to_f32(row, o + 82) * xd[b])
    return acc


# gguf.quants' dequantize (and ggml's dequantize_row_q2_K): dl = d * sc, ml = dmin * m, dl * q - ml
@numba.njit(inline="always")
def _deq_q2_K(row, o, dst, e0):
    d = f16_to_f32(row, o + 80)
    dmin = f16_to_f32(row, o + 82)
    for e in range(256):
        sb = e // 16
        dl = d * f32(np.int32(row[o + sb]) & 15)
        ml = dmin * f32(np.int32(row[o + sb]) >> 4)
        j, r = e // 128, e % 128
        q = (np.int32(row[o + 16 + 32 * j + r % 32]) >> (2 * (r // 32))) & 3
        dst[e0 + e] = dl * f32(q) - ml


dequant_q2_K = blockwise_dequant(_deq_q2_K, 84, 256)


# ----------------------------------------------------------------------------- products
#: each type's portable (matvec, matmat) around its row dot; xp = (qs int8 [.., k], d f32 [.., k/256],
#: bsums int32 [.., k/16])
PRODUCTS = {name: rowwise_products(dot) for name, dot in (("Q4_K", _dot_q4_K), ("Q5_K", _dot_q5_K),
                                                          ("Q6_K", _dot_q6_K), ("Q3_K", _dot_q3_K),
                                                          ("Q2_K", _dot_q2_K))}

"""I-quants with a non-linear 4-bit grid: IQ4_NL (blocks of 32, against Q8_0 activations) and IQ4_XS
(super-blocks of 256, against Q8_K activations).

Layouts (bytes): IQ4_NL = d f16 | qs[16] (18); element j < 16 is ``KVALUES[qs[j] & 15]``, element
j + 16 is ``KVALUES[qs[j] >> 4]``, times d.  IQ4_XS = d f16 | scales_h u16 | scales_l[4] | qs[128]
(136): 8 sub-blocks of 32 laid out like IQ4_NL blocks, sub-block j scaled by
``ls_j - 32`` with ls_j = (scales_l[j / 2] >> 4 (j % 2)) & 15 | ((scales_h >> 2 j) & 3) << 4.
Per (super-)block ggml takes the exact integer dot of the grid values with the activation quants
and accumulates it times ``d_w * d_x`` in f32.

This module holds the portable (plain Numba loop) kernels and the dequantization; the SIMD ones,
in llama.cpp's float orders, are in ``x86.i_quants``.
"""
from __future__ import annotations

import numba
import numpy as np

from .intrinsics.quant_blocks import KVALUES_IQ4NL
from .intrinsics.scalars import f16_to_f32

from .jitcache import JIT as _NB
from .legacy_quants import dequant_x8
from .rowwise import blockwise_dequant, rowwise_products
f32 = np.float32
KVALUES = np.array(KVALUES_IQ4NL, np.int32)


@numba.njit(inline="always")
def _dot_iq4_nl(row, xq, xd, _x3):
    kv = KVALUES
    acc = f32(0.0)
    for b in range(xd.shape[0]):
        o = b * 18
        s = np.int32(0)
        for j in range(16):
            v = np.int32(row[o + 2 + j])
            s += kv[v & 15] * np.int32(xq[b * 32 + j]) + kv[v >> 4] * np.int32(xq[b * 32 + 16 + j])
        acc += f32(s) * (f16_to_f32(row, o) * xd[b])
    return acc


# Same f32 operation order as ggml's dequantize_row_iq4_nl (and gguf.quants): d * value, exact.
@numba.njit(inline="always")
def _deq_iq4_nl(row, o, dst, e):
    kv = KVALUES
    d = f16_to_f32(row, o)
    for j in range(16):
        v = np.int32(row[o + 2 + j])
        dst[e + j] = d * f32(kv[v & 15])
        dst[e + 16 + j] = d * f32(kv[v >> 4])


dequant_iq4_nl = blockwise_dequant(_deq_iq4_nl, 18, 32)


@numba.njit(**_NB)
def dequant_iq4_nl_x8(w, r0, r1):
    """`dequant_iq4_nl`'s numbers from a matrix kept in 8-row groups (`legacy_quants.dequant_x8`)."""
    return dequant_x8(w, r0, r1, KVALUES)


# ----------------------------------------------------------------------------- IQ4_XS
@numba.njit(inline="always")
def iq4_xs_scale(w, o, j):
    """ls_j - 32 of sub-block j of the IQ4_XS super-block at byte o of the uint8 array w."""
    sh = np.int32(w[o + 2]) | (np.int32(w[o + 3]) << 8)
    lo = (np.int32(w[o + 4 + j // 2]) >> (4 * (j % 2))) & 15
    return (lo | (((sh >> (2 * j)) & 3) << 4)) - 32


@numba.njit(inline="always")
def _dot_iq4_xs(row, xq, xd, _x3):
    kv = KVALUES
    acc = f32(0.0)
    for b in range(xd.shape[0]):
        o = b * 136
        s = np.int32(0)
        for j in range(8):
            t = np.int32(0)
            for e in range(16):
                v = np.int32(row[o + 8 + 16 * j + e])
                t += kv[v & 15] * np.int32(xq[b * 256 + 32 * j + e]) + kv[v >> 4] * np.int32(xq[b * 256 + 32 * j + 16 + e])
            s += iq4_xs_scale(row, o, j) * t
        acc += f32(s) * (f16_to_f32(row, o) * xd[b])
    return acc


# ggml's dequantize_row_iq4_xs (and gguf.quants): dl = d * (ls - 32), then dl * value
@numba.njit(inline="always")
def _deq_iq4_xs(row, o, dst, e):
    kv = KVALUES
    d = f16_to_f32(row, o)
    for j in range(8):
        dl = d * f32(iq4_xs_scale(row, o, j))
        for t in range(16):
            v = np.int32(row[o + 8 + 16 * j + t])
            dst[e + 32 * j + t] = dl * f32(kv[v & 15])
            dst[e + 32 * j + 16 + t] = dl * f32(kv[v >> 4])


dequant_iq4_xs = blockwise_dequant(_deq_iq4_xs, 136, 256)


# ----------------------------------------------------------------------------- products
#: each type's portable (matvec, matmat) around its row dot (IQ4_NL against Q8_0, IQ4_XS against Q8_K)
PRODUCTS = {name: rowwise_products(dot) for name, dot in (("IQ4_NL", _dot_iq4_nl), ("IQ4_XS", _dot_iq4_xs))}

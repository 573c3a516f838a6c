"""I-quants with a non-linear 4-bit grid: IQ4_NL (blocks of 32, against Q8_0 activations).

Layout (bytes): IQ4_NL = d f16 | qs[16] (18); element j < 16 is ``KVALUES[qs[j] & 15]``, element
j + 16 is ``KVALUES[qs[j] >> 4]``, times d.  Per block ggml takes the exact integer dot of the grid
values with the activation quants and accumulates it times ``d_w * d_x`` in f32.

This module holds the portable (plain Numba loop) kernels and the dequantization; the SIMD ones,
in llama.cpp's float orders, are in ``x86.i_quants``.
"""
from __future__ import annotations

import numba
import numpy as np

from .intrinsics import KVALUES_IQ4NL, f16_to_f32

_NB = dict(nogil=True, cache=True)
f32 = np.float32
KVALUES = np.array(KVALUES_IQ4NL, np.int32)


@numba.njit(inline="always")
def _dot_iq4_nl(row, xq, xd, kv):
    acc = f32(0.0)
    for b in range(xd.shape[0]):
        o = b * 18
        s = np.int32(0)
        for j in range(16):
            v = np.int32(row[o + 2 + j])
            s += kv[v & 15] * np.int32(xq[b * 32 + j]) + kv[v >> 4] * np.int32(xq[b * 32 + 16 + j])
        acc += f32(s) * (f16_to_f32(row, o) * xd[b])
    return acc


@numba.njit(**_NB)
def iq4_nl_matvec(w, xp, out, r0, r1):
    xq, xd, _ = xp
    kv = KVALUES
    for i in range(r0, r1):
        out[i] = _dot_iq4_nl(w[i], xq, xd, kv)


@numba.njit(**_NB)
def iq4_nl_matmat(w, xp, out, r0, r1):
    xq, xd, _ = xp
    kv = KVALUES
    for i in range(r0, r1):
        for c in range(xq.shape[0]):
            out[c, i] = _dot_iq4_nl(w[i], xq[c], xd[c], kv)


# Same f32 operation order as ggml's dequantize_row_iq4_nl (and gguf.quants): d * value, exact.
@numba.njit(**_NB)
def dequant_iq4_nl(w, r0, r1):
    nb = w.shape[1] // 18
    kv = KVALUES
    out = np.empty((r1 - r0, nb * 32), np.float32)
    for i in range(r0, r1):
        for b in range(nb):
            o = b * 18
            d = f16_to_f32(w[i], o)
            for j in range(16):
                v = np.int32(w[i, o + 2 + j])
                out[i - r0, b * 32 + j] = d * f32(kv[v & 15])
                out[i - r0, b * 32 + 16 + j] = d * f32(kv[v >> 4])
    return out

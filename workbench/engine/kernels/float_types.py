"""F32, F16 and BF16 weights, passed as uint8 byte views [rows, ne0 * elem_size].

ggml converts the activations to the weight type first (F16 -> f16, BF16 -> bf16, done in
``activations``) and accumulates products in f32.  Activations arrive as float32 holding the
rounded values.  Portable (plain Numba loop) kernels; SIMD ones are in ``x86``.
"""
from __future__ import annotations

import numba
import numpy as np

from .intrinsics.scalars import bf16_to_f32, f16_to_f32

from .jitcache import JIT as _NB
from .rowwise import blockwise_dequant, float_products
f32 = np.float32


@numba.njit(inline="always")
def _dot_f32(row, x):
    rf = row.view(np.float32)
    acc = f32(0.0)
    for j in range(x.shape[0]):
        acc += rf[j] * x[j]
    return acc


@numba.njit(inline="always")
def _tree16(v):
    """Sum of 16 lanes in the order of GCC's _mm512_reduce_add_ps (8+8, 4+4, (0+2)+(1+3))."""
    a = np.empty(8, np.float32)
    for i in range(8):
        a[i] = v[i] + v[i + 8]
    b0 = a[0] + a[4]; b1 = a[1] + a[5]; b2 = a[2] + a[6]; b3 = a[3] + a[7]
    return (b0 + b2) + (b1 + b3)


@numba.njit(inline="always")
def _dot_f16(row, x):
    """llamafile tinyBLAS<16> order (ggml's F16 products of >= 2 columns on AVX-512): lane j % 16
    accumulates in order, then the 16 lanes are tree-summed.  f16*f16 products are exact in f32.
    Rows whose length is not a multiple of 16 take ggml_vec_dot_f16's order."""
    k = x.shape[0]
    if k % 16:
        return _dot_f16_vec(row, x)
    lanes = np.zeros(16, np.float32)
    for j in range(k):
        lanes[j % 16] += f16_to_f32(row, 2 * j) * x[j]
    return _tree16(lanes)


@numba.njit(inline="always")
def _dot_f16_vec(row, x):
    """ggml_vec_dot_f16 order on AVX-512 (one column): 4 accumulators of 16 lanes over steps
    of 64, combined (0+2)+(1+3), tree-summed; the k % 64 leftovers are added in float64."""
    k = x.shape[0]
    kb = k - k % 64
    acc = np.zeros(64, np.float32)
    for j in range(kb):
        acc[j % 64] += f16_to_f32(row, 2 * j) * x[j]
    lanes = np.empty(16, np.float32)
    for i in range(16):
        lanes[i] = (acc[i] + acc[32 + i]) + (acc[16 + i] + acc[48 + i])
    s = np.float64(_tree16(lanes))
    for j in range(kb, k):
        s += np.float64(f16_to_f32(row, 2 * j) * x[j])
    return f32(s)


@numba.njit(inline="always")
def _dot_bf16(row, x):
    acc = f32(0.0)
    for j in range(x.shape[0]):
        acc += bf16_to_f32(row, 2 * j) * x[j]
    return acc


# xp = (x,) with x float32 [k] or [n, k]; one column of F16 in ggml_vec_dot_f16's order
f32_matvec, f32_matmat = float_products(_dot_f32)
f16_matvec, f16_matmat = float_products(_dot_f16, _dot_f16_vec)
bf16_matvec, bf16_matmat = float_products(_dot_bf16)


@numba.njit(**_NB)
def dequant_f32(w, r0, r1):
    return w[r0:r1].view(np.float32).copy()


@numba.njit(inline="always")
def _deq_f16(row, o, dst, e):
    dst[e] = f16_to_f32(row, o)


dequant_f16 = blockwise_dequant(_deq_f16, 2, 1)


@numba.njit(inline="always")
def _deq_bf16(row, o, dst, e):
    dst[e] = bf16_to_f32(row, o)


dequant_bf16 = blockwise_dequant(_deq_bf16, 2, 1)

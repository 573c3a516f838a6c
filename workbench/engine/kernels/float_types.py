"""F32, F16 and BF16 weights, passed as uint8 byte views [rows, ne0 * elem_size].

ggml converts the activations to the weight type first (F16 -> f16, BF16 -> bf16, done in
``activations``) and accumulates products in f32.  Activations arrive as float32 holding the
rounded values.  Portable (plain Numba loop) kernels; SIMD ones are in ``simd_kernels``.
"""
from __future__ import annotations

import numba
import numpy as np

from .simd import bf16_to_f32, f16_to_f32

_NB = dict(nogil=True, cache=True)
f32 = np.float32


@numba.njit(inline="always")
def _dot_f32(row, x):
    rf = row.view(np.float32)
    acc = f32(0.0)
    for j in range(x.shape[0]):
        acc += rf[j] * x[j]
    return acc


@numba.njit(inline="always")
def _dot_f16(row, x):
    acc = f32(0.0)
    for j in range(x.shape[0]):
        acc += f16_to_f32(row, 2 * j) * x[j]
    return acc


@numba.njit(inline="always")
def _dot_bf16(row, x):
    acc = f32(0.0)
    for j in range(x.shape[0]):
        acc += bf16_to_f32(row, 2 * j) * x[j]
    return acc


# xp = (x,) with x float32 [k] or [n, k]
@numba.njit(**_NB)
def f32_matvec(w, xp, out, r0, r1):
    x = xp[0]
    for i in range(r0, r1):
        out[i] = _dot_f32(w[i], x)


@numba.njit(**_NB)
def f32_matmat(w, xp, out, r0, r1):
    x = xp[0]
    for i in range(r0, r1):
        for c in range(x.shape[0]):
            out[c, i] = _dot_f32(w[i], x[c])


@numba.njit(**_NB)
def f16_matvec(w, xp, out, r0, r1):
    x = xp[0]
    for i in range(r0, r1):
        out[i] = _dot_f16(w[i], x)


@numba.njit(**_NB)
def f16_matmat(w, xp, out, r0, r1):
    x = xp[0]
    for i in range(r0, r1):
        for c in range(x.shape[0]):
            out[c, i] = _dot_f16(w[i], x[c])


@numba.njit(**_NB)
def bf16_matvec(w, xp, out, r0, r1):
    x = xp[0]
    for i in range(r0, r1):
        out[i] = _dot_bf16(w[i], x)


@numba.njit(**_NB)
def bf16_matmat(w, xp, out, r0, r1):
    x = xp[0]
    for i in range(r0, r1):
        for c in range(x.shape[0]):
            out[c, i] = _dot_bf16(w[i], x[c])


@numba.njit(**_NB)
def dequant_f32(w, r0, r1):
    return w[r0:r1].view(np.float32).copy()


@numba.njit(**_NB)
def dequant_f16(w, r0, r1):
    k = w.shape[1] // 2
    out = np.empty((r1 - r0, k), np.float32)
    for i in range(r0, r1):
        for j in range(k):
            out[i - r0, j] = f16_to_f32(w[i], 2 * j)
    return out


@numba.njit(**_NB)
def dequant_bf16(w, r0, r1):
    k = w.shape[1] // 2
    out = np.empty((r1 - r0, k), np.float32)
    for i in range(r0, r1):
        for j in range(k):
            out[i - r0, j] = bf16_to_f32(w[i], 2 * j)
    return out

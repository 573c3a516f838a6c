"""The portable products of a block-quantized type, made from the type's row dot product, and
every plain layout's dequantization, made from the type's block decoder.

On the portable path every quantized type computes each output as one row's dot product with one
column's prepared activations. `rowwise_products(dot)` compiles the one-token product (matvec) and
the prompt product (matmat) around a type's dot, so a family module lists its dots
(`legacy_quants`, `k_quants`, `i_quants`: ``PRODUCTS``) instead of a hand-written pair of loops
per type; `float_products(dot, dot_one)` does the same for the float types (`float_types`), whose
one column may take another order than several. `blockwise_dequant(block, ...)` compiles a
dequantization around a type's block decoder (every plain layout of every path uses it).
"""
from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np

from .jitcache import JIT as _NB


def rowwise_products(dot: Callable) -> tuple[Callable, Callable]:
    """(matvec, matmat) compiled around ``dot(row, xq, xd, x3)``: a weight row (uint8 blocks)
    against one column's prepared activations -- quants, block scales, and the preparation's
    third array (Q8_0's n4, Q8_1's block sums, Q8_K's bsums; a dot that needs none ignores it).

    ``matvec(w, xp, out, r0, r1)``: out[i] for rows r0..r1 of one column;
    ``matmat(w, xp, out, r0, r1)``: out[c, i] for every column c of xp."""

    @numba.njit(**_NB)
    def matvec(w, xp, out, r0, r1):
        xq, xd, x3 = xp
        for i in range(r0, r1):
            out[i] = dot(w[i], xq, xd, x3)

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        xq, xd, x3 = xp
        for i in range(r0, r1):
            for c in range(xq.shape[0]):
                out[c, i] = dot(w[i], xq[c], xd[c], x3[c])

    return matvec, matmat


def float_products(dot: Callable, dot_one: Callable | None = None) -> tuple[Callable, Callable]:
    """(matvec, matmat) of a float type (xp = (x,), x float32 [k] or [n, k] holding the type's
    rounded values) around ``dot(row, x)``; the one-column product takes ``dot_one`` when given
    (ggml's F16 vec_dot order for one column, tinyBLAS's for several)."""
    one = dot if dot_one is None else dot_one

    @numba.njit(**_NB)
    def matvec(w, xp, out, r0, r1):
        x = xp[0]
        for i in range(r0, r1):
            out[i] = one(w[i], x)

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        x = xp[0]
        for i in range(r0, r1):
            for c in range(x.shape[0]):
                out[c, i] = dot(w[i], x[c])

    return matvec, matmat


def blockwise_dequant(block: Callable, block_bytes: int, qk: int) -> Callable:
    """``dequant(w, r0, r1)``: rows r0..r1 of a weight matrix as float32 [r1 - r0, blocks * qk],
    compiled around ``block(row, o, dst, e)``, which writes the ``qk`` values of the block at byte
    ``o`` of a row to ``dst[e:e + qk]`` (each in ggml's dequantize_row_* operation order)."""

    @numba.njit(**_NB)
    def dequant(w, r0, r1):
        nb = w.shape[1] // block_bytes
        out = np.empty((r1 - r0, nb * qk), np.float32)
        for i in range(r0, r1):
            row = w[i]
            dst = out[i - r0]
            for b in range(nb):
                block(row, b * block_bytes, dst, b * qk)
        return out

    return dequant

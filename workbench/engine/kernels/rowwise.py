"""The portable products of a block-quantized type, made from the type's row dot product.

On the portable path every quantized type computes each output as one row's dot product with one
column's prepared activations. `rowwise_products(dot)` compiles the one-token product (matvec) and
the prompt product (matmat) around a type's dot, so a family module lists its dots
(`legacy_quants`, `k_quants`, `i_quants`: ``PRODUCTS``) instead of a hand-written pair of loops
per type.
"""
from __future__ import annotations

from collections.abc import Callable

import numba

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

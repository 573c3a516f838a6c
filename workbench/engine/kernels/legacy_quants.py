"""Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 weights (blocks of 32) against Q8_0 / Q8_1 activations.

Per block ggml computes an exact integer dot ``sumi`` and accumulates ``sumi * (d_w * d_x)`` in
f32 (plus ``m_w * s_x`` for the ``_1`` types); these kernels do the same.  Block layouts
(bytes): Q4_0 = d f16 | qs[16];  Q4_1 = d | m | qs[16];  Q5_0 = d | qh u32 | qs[16];
Q5_1 = d | m | qh | qs[16];  Q8_0 = d | qs int8[32].  In the 4/5-bit types element ``j < 16``
is the low nibble of ``qs[j]`` and element ``j + 16`` the high nibble; bit ``j`` of ``qh`` is the
5th bit of element ``j``.

This module holds the portable (plain Numba loop) kernels; the SIMD ones are in ``x86``.
"""
from __future__ import annotations

import numba
import numpy as np

from .intrinsics.scalars import f16_to_f32

from .jitcache import JIT as _NB
from .rowwise import blockwise_dequant, rowwise_products
f32 = np.float32

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}


# ----------------------------------------------------------------------------- row dots
# Q4_0, Q4_1, Q5_0, Q5_1: a block is d f16 [| m f16] [| qh u32] | qs[16], so its nibbles start at
# byte bsz - 16 and a 5-bit type's fifth bits just before them.
@numba.njit(inline="always")
def _fifth_bits(row, o):
    """The u32 of fifth bits (bit j: quant j's) at byte o."""
    return (np.uint32(row[o]) | (np.uint32(row[o + 1]) << 8) | (np.uint32(row[o + 2]) << 16)
            | (np.uint32(row[o + 3]) << 24))


@numba.njit(inline="always")
def _quant_pair(row, qs, qh, j):
    """Unsigned quants j and j + 16 of a block whose nibbles start at byte qs (qh: its fifth bits,
    0 for a 4-bit type)."""
    v = np.int32(row[qs + j])
    h0 = np.int32((qh >> j) & 1) << 4
    h1 = np.int32((qh >> (j + 16)) & 1) << 4
    return (v & 15) | h0, (v >> 4) | h1


@numba.njit(inline="always")
def _block_qh(row, o, bsz, five):
    return _fifth_bits(row, o + bsz - 20) if five else np.uint32(0)


@numba.njit(inline="always")
def _dot_nibbles(row, xq, xd, xs, bsz, five, offset, has_min):
    """A Q4_0 / Q5_0 (quant - offset, no min) or Q4_1 / Q5_1 (a min times the activation block
    sums, summed apart) row against Q8_0 / Q8_1 activations, in ggml's order."""
    acc = f32(0.0)
    accm = f32(0.0)
    for b in range(xd.shape[0]):
        o = b * bsz
        qh = _block_qh(row, o, bsz, five)
        s = np.int32(0)
        for j in range(16):
            q0, q1 = _quant_pair(row, o + bsz - 16, qh, j)
            s += (q0 - offset) * np.int32(xq[b * 32 + j]) + (q1 - offset) * np.int32(xq[b * 32 + 16 + j])
        acc += f32(s) * (f16_to_f32(row, o) * xd[b])
        if has_min:
            accm += f16_to_f32(row, o + 2) * xs[b]
    if has_min:
        return acc + accm
    return acc


@numba.njit(inline="always")
def _dot_q8_0(row, xq, xd, _x3):
    acc = f32(0.0)
    rs = row.view(np.int8)
    for b in range(xd.shape[0]):
        o = b * 34
        s = np.int32(0)
        for j in range(32):
            s += np.int32(rs[o + 2 + j]) * np.int32(xq[b * 32 + j])
        acc += f32(s) * (f16_to_f32(row, o) * xd[b])
    return acc


# ----------------------------------------------------------------------------- dequantize
# Each block as ggml's dequantize_row_* (and gguf.quants) computes it, in the same f32 operation
# order, so results are exact (`rowwise.blockwise_dequant` makes a type's dequant(w, r0, r1)).
@numba.njit(inline="always")
def _deq_nibbles(row, o, dst, e, bsz, five, offset, has_min):
    """A Q4_0 / Q5_0 block (d * (q - offset)) or a Q4_1 / Q5_1 one (d * q + m)."""
    d = f16_to_f32(row, o)
    m = f16_to_f32(row, o + 2) if has_min else f32(0.0)
    qh = _block_qh(row, o, bsz, five)
    for j in range(16):
        q0, q1 = _quant_pair(row, o + bsz - 16, qh, j)
        if has_min:
            dst[e + j] = d * f32(q0) + m
            dst[e + 16 + j] = d * f32(q1) + m
        else:
            dst[e + j] = d * f32(q0 - offset)
            dst[e + 16 + j] = d * f32(q1 - offset)


def _nibble_type(bsz: int, five: bool, offset: int, has_min: bool):
    """(row dot, block decoder) of Q4_0 (18, False, 8, False), Q4_1 (20, False, 0, True), Q5_0
    (22, True, 16, False) or Q5_1 (24, True, 0, True)."""
    if has_min:
        @numba.njit(inline="always")
        def dot(row, xq, xd, xs):
            return _dot_nibbles(row, xq, xd, xs, bsz, five, offset, True)
    else:
        @numba.njit(inline="always")
        def dot(row, xq, xd, _x3):
            return _dot_nibbles(row, xq, xd, xd, bsz, five, offset, False)

    @numba.njit(inline="always")
    def block(row, o, dst, e):
        _deq_nibbles(row, o, dst, e, bsz, five, offset, has_min)

    return dot, block


_dot_q4_0, _deq_q4_0 = _nibble_type(18, False, 8, False)
_dot_q4_1, _deq_q4_1 = _nibble_type(20, False, 0, True)
_dot_q5_0, _deq_q5_0 = _nibble_type(22, True, 16, False)
_dot_q5_1, _deq_q5_1 = _nibble_type(24, True, 0, True)
dequant_q4_0 = blockwise_dequant(_deq_q4_0, 18, 32)
dequant_q4_1 = blockwise_dequant(_deq_q4_1, 20, 32)
dequant_q5_0 = blockwise_dequant(_deq_q5_0, 22, 32)
dequant_q5_1 = blockwise_dequant(_deq_q5_1, 24, 32)


@numba.njit(inline="always")
def dequant_x8(w, r0, r1, grid):
    """Rows [r0, r1) of a matrix of 18-byte blocks (Q4_0, IQ4_NL) kept in 8-row groups
    (`x86.q4_x8`: per block column the rows' 8 scales, then bytes 0-7 of rows 0..7, then bytes
    8-15 of rows 0..7): d * grid[nibble], the numbers the file layout's dequantization gives.
    Plain code, so a tied output matrix kept in groups is still looked up inside a token's call."""
    nb = w.shape[1] // 18
    out = np.empty((r1 - r0, nb * 32), np.float32)
    wf = w.reshape(-1)
    rb = w.shape[1]
    for i in range(r0, r1):
        r = i % 8
        base = (i - r) * rb
        for b in range(nb):
            o = base + b * 144
            d = f16_to_f32(wf, o + 2 * r)
            for j in range(16):
                v = np.int32(wf[o + 16 + 64 * (j // 8) + 8 * r + j % 8])
                out[i - r0, b * 32 + j] = d * f32(grid[v & 15])
                out[i - r0, b * 32 + 16 + j] = d * f32(grid[v >> 4])
    return out


Q4_0_GRID = np.arange(-8, 8, dtype=np.int32)   # a Q4_0 nibble's value


@numba.njit(**_NB)
def dequant_q4_0_x8(w, r0, r1):
    """`dequant_q4_0`'s numbers from a matrix kept in 8-row groups (`dequant_x8`)."""
    return dequant_x8(w, r0, r1, Q4_0_GRID)


@numba.njit(**_NB)
def dequant_q8_0_x2(w, r0, r1):
    """Rows [r0, r1) of a Q8_0 matrix kept in row pairs (`x86.q8_pairs`: per pair and block, the two
    f16 scales, then row 0's 32 quants, row 1's): the numbers `dequant_q8_0` gives the file's bytes.
    Plain code, so a tied output matrix kept in pairs is still looked up inside a token's call."""
    nb = w.shape[1] // 34
    out = np.empty((r1 - r0, nb * 32), np.float32)
    wf = w.reshape(-1)
    ws = wf.view(np.int8)
    rb = w.shape[1]
    for i in range(r0, r1):
        r = i % 2
        base = (i - r) * rb
        for b in range(nb):
            o = base + b * 68
            d = f16_to_f32(wf, o + 2 * r)
            for j in range(32):
                out[i - r0, b * 32 + j] = d * f32(ws[o + 4 + 32 * r + j])
    return out


@numba.njit(inline="always")
def _deq_q8_0(row, o, dst, e):
    d = f16_to_f32(row, o)
    rs = row.view(np.int8)
    for j in range(32):
        dst[e + j] = d * f32(rs[o + 2 + j])


dequant_q8_0 = blockwise_dequant(_deq_q8_0, 34, 32)


# ----------------------------------------------------------------------------- products
#: each type's portable (matvec, matmat) around its row dot; xp: Q8_0 -> (qs, d, n4), Q8_1 -> (qs, d, s)
PRODUCTS = {name: rowwise_products(dot) for name, dot in (("Q4_0", _dot_q4_0), ("Q4_1", _dot_q4_1),
                                                          ("Q5_0", _dot_q5_0), ("Q5_1", _dot_q5_1),
                                                          ("Q8_0", _dot_q8_0))}

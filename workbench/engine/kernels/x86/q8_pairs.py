"""Q8_0 kept in a row-pair layout (internal type Q8_0_x2): both rows of a pair in one zmm register.

The file layout's one-token Q8_0 product keeps ggml's order, one f32x8 chain per row
(`ggml_vec_dot_q8_0_q8_0`), so a row's blocks wait on each other's FMA: on the AMD EPYC host
(Zen 5) it read 44 GB/s from the L2 and from memory alike, bound by that chain, not by the memory.
Gemma 3 270M's tied output matrix is Q8_0 and 72 % of a token's bytes, so this one product sets
most of a decoded token's time. Here a pair of rows keeps each column of 32 weights' two blocks
side by side, so a block pair is one 64-byte load (both rows' quants, offset by 128 with one XOR),
one broadcast load of the activation block, one dot, one conversion, one scale product and one
FMA, and a step takes a pair from each of two streams: four rows' chains in flight instead of
one. `kernels_bench.py --k 640`, one core: 43.5 -> 82.6-92 GB/s in the L2; from memory both read
the memory's ~42 GB/s there (the AMD host's core out-computes its memory either way). Where a core
computes less per byte (the Intel Xeon host's file-layout Q8_0: 29.6 GB/s in the caches, 18 from a
memory that gives 21-23) the kernel, not the memory, held this product back. Per row pair and
block, 68 bytes (the two blocks'):

    d0, d1 (f16) | row 0's 32 quants | row 1's 32 quants

Lanes 0-7 of the register are row 0's f32x8 chain (lane j: weights 4j..4j+3, as ggml's), 8-15 row
1's; the quants are offset by 128 (`intrinsics.quant_blocks.q8_offset`) with the activation's group sums << 7
as the dot's initial lanes: the same exact integer sums as ggml's sign trick (the activations'
quants lie in -127..127). Every lane does what its row's chain does in the file's layout (the
same dot, conversion, scale product and FMA), and each row's hsum takes its 8 lanes in ggml's
order: the same bits.

A matrix keeps its size and each pair of rows its own bytes, so a placement that moves whole pairs
moves it unchanged (`..packing` packs only tensors whose pieces are whole 8-row groups). A tied
output matrix is the token embedding too: its rows are looked up through
`legacy_quants.dequant_q8_0_x2`. The prompt product runs the Q8_0 prompt tiles with each row's
block read from its pair.
"""
from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..llvm_ir import BYTE_DTYPES, check_array, array_ptr, ll, v16f, v32b, v64b, VNNI
from ..intrinsics.dots import dot_fma16, spread_scales
from ..intrinsics.lanes import half_f
from ..intrinsics.quant_blocks import q8_offset_bytes
from . import repack
from .blocks import pair_layout, pair_matvec, pair_movers

BSZ = 34            # a Q8_0 block
PAIR = 2 * BSZ      # a pair of rows' blocks of one column of 32 weights
SHIFT = 7           # log2 of the quants' offset (128): the activations' group sums are scaled by it


@intrinsic
def pair_step(typingctx, acc, w, o, xq, xo, n4, no, xs):
    """acc + float(dot) * (d * xs) for the block pair at byte o of a Q8_0_x2 matrix, lane-wise as
    each row's f32x8 chain in the file's layout; xq[xo..+32], n4[no..+8]: the activation block and
    its group sums (negated, as `quantize_q8_0` gives them)."""
    check_array(w, BYTE_DTYPES)
    check_array(n4, (types.int32,))
    sig = v16f(acc, w, o, xq, xo, n4, no, types.float32)

    def cg(context, builder, sig, args):
        acc, wa, o, xa, xo, na, no, xs = args
        q = builder.load(array_ptr(context, builder, sig.args[1], wa, builder.add(o, ir.Constant(o.type, 4)), ll.v64i8),
                         align=1)
        q = builder.xor(q, ir.Constant(ll.v64i8, [-128] * 64))   # both rows' quants + 128
        x = builder.load(array_ptr(context, builder, sig.args[3], xa, xo, ir.VectorType(ir.IntType(8), 32)), align=1)
        x = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ll.i32, 64), list(range(32)) * 2))
        s8 = builder.load(array_ptr(context, builder, sig.args[5], na, no, ir.VectorType(ll.i32, 8)), align=4)
        init = builder.shl(builder.shuffle_vector(s8, s8, ir.Constant(ir.VectorType(ll.i32, 16), list(range(8)) * 2)),
                           ir.Constant(ll.v16i32, [SHIFT] * 16))
        h4 = builder.load(array_ptr(context, builder, sig.args[1], wa, o, ir.VectorType(ll.f16, 4)), align=1)
        sc = spread_scales(builder, h4, xs, [0] * 8 + [1] * 8)   # (the halves after d0, d1: quants)
        return dot_fma16(builder, init, q, x, sc, acc)

    return sig, cg


def _row_quants(context, builder, sig, args, halves):
    """Row r's 32 quants + 128 of the block pair at byte o (args: w, o, r) in `halves` 256-bit
    halves, as `intrinsics.quant_blocks.q8_offset(_x2)` gives a file-layout block's."""
    w, o, r = args
    r64 = builder.sext(r, o.type) if r.type.width < o.type.width else r
    at = builder.add(o, builder.add(ir.Constant(o.type, 2), builder.mul(r64, ir.Constant(o.type, 32))))
    return q8_offset_bytes(context, builder, sig, [w, at], halves)


@intrinsic
def row_x2(typingctx, w, o, r):
    """Row r's quants of the block pair at byte o in both 256-bit halves of a zmm register (the
    prompt tiles' two columns)."""
    check_array(w, BYTE_DTYPES)
    return v64b(w, o, r), lambda context, builder, sig, args: _row_quants(context, builder, sig, args, 2)


@intrinsic
def row_x1(typingctx, w, o, r):
    """Row r's quants of the block pair at byte o in a ymm register (a tile's leftover columns)."""
    check_array(w, BYTE_DTYPES)
    return v32b(w, o, r), lambda context, builder, sig, args: _row_quants(context, builder, sig, args, 1)


pair_rows, _row_scales = pair_layout(PAIR)


# ----------------------------------------------------------------------------- layout
@numba.njit(inline="always")
def _place(r, e):
    """Where byte e of row r's Q8_0 block sits in its pair's record: the scales, then the quants."""
    return 2 * r + e if e < 2 else 4 + 32 * r + e - 2


# file layout <-> pairs, in place (`..packing.movers`), and pairs back to the file's layout
repack_rows, unpack_rows, _ = pair_movers(_place, BSZ)


# ----------------------------------------------------------------------------- products
@numba.njit(inline="always")
def _as_is(xq, n4, nb):
    return xq, n4


matvec, few_columns = pair_matvec(PAIR, pair_step, half_f, _as_is, 32, 8)


def kernels(mode: int) -> dict:
    """{"Q8_0_x2": (matvec, matmat, mul_mat_id)} on AVX-512 VNNI (the layout is not used elsewhere).

    The prompt product (`repack.pair_products`): the Q8_0 prompt tiles (quants offset by 128)
    reading each row's blocks where this layout keeps them for whole tiles of 8 columns,
    `few_columns` for the rest and for a large range times a few columns (a server batch's logits):
    every column the numbers the one-token product gives it, as the file layout's prompt product."""
    if mode != VNNI:
        return {}
    matmat, mul_mat_id = repack.pair_products(few_columns, row_x1, row_x2, pair_rows, _row_scales, SHIFT)
    return {"Q8_0_x2": (matvec, matmat, mul_mat_id)}

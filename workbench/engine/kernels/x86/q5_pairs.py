"""Q5_0 kept in a row-pair layout (internal type Q5_0_x2): both rows of a pair in one zmm register.

The one-token Q5_0 product on AVX-512 (`legacy_quants.make_pair_matvec`) was bound by its vector
instructions on the AMD EPYC host (Zen 5): ~36 GB/s from the L2 and from memory alike, where Q8_0
reads 44-47 and the memory ~44 at one thread; a quarter of Gemma 3 270M's layer bytes are Q5_0
(its 640-wide q, k, gate and up). Most of a block's work was arranging two rows' bytes from two
places into one register: two 16-byte loads and a shuffle for the nibbles, the high bits of two
blocks joined in general registers, the scales converted from two halves. Here a pair of rows
keeps its two blocks of each column of 32 weights side by side, arranged for the register, so a
block pair is a broadcast load, one GFNI affine transform (the nibbles; a shift and an AND without
GFNI), one mask load and masked add (high bits), one dot, one conversion, the scales' product and
one FMA (`pair_step`). Per row pair and block, 44 bytes (the two blocks'):

    d0, d1 (f16) | u16 x 4: row 0's high bits 0-15, row 1's 0-15, row 0's 16-31, row 1's 16-31 |
    row 0's 16 nibble bytes | row 1's 16

The register's quarters are row 0's low nibbles (weights 0-15), row 1's, row 0's high nibbles
(16-31), row 1's, so the mask is the 8 bytes as they are, and a row's 8 lanes of ggml's Q5_0 dot
(`ggml_vec_dot_q5_0_q8_0`: lane j sums weights 4j..4j+3) are lanes 0-3 and 8-11 (row 0) or 4-7
and 12-15 (row 1); the activation block is arranged to match once per call (`_pair_inputs`). Every
lane does what its row's f32x8 chain does in the file's layout (the same dot, conversion, scale
product and FMA), and the rows' hsums take their lanes in ggml's order: the same bits.

A matrix keeps its size and each pair of rows its own bytes, so a placement that moves whole pairs
(`..packing` packs a tensor only when every piece and range is in 8-row multiples) moves it
unchanged. The prompt product runs the Q5_0 prompt tiles with each row's block read from its
pair (`row_x2`: the same register contents as the file layout's unpack, so the same bits).
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..cpu import cpu_flags
from ..llvm_ir import BYTE_DTYPES, check_array, declare, array_ptr, ll, v16f, v32b, v64b, v8f, VNNI
from ..intrinsics.dots import dot_fma16, spread_scales
from ..intrinsics.load_store import copy_bytes
from ..jitcache import JIT as _NB
from ..legacy_quants import dequant_q5_0
from . import repack
from .blocks import pair_layout, pair_matvec, pair_movers

BSZ = 22            # a Q5_0 block
PAIR = 2 * BSZ      # a pair of rows' blocks of one column of 32 weights
SHIFT = 4           # log2 of Q5_0's offset (16): the activations' group sums are scaled by it
_V8I64 = ir.VectorType(ll.i64, 8)


#: GFNI's affine byte transform takes a nibble out of each byte in one instruction (the shift and
#: the AND it replaces were two); CPUs with AVX-512 VNNI but no GFNI (Cascade Lake) shift and mask.
GFNI = "gfni" in cpu_flags()
_NIBBLES = ir.Constant(_V8I64, [0x0102040800000000] * 4 + [0x1020408000000000] * 4)  # bits 0-3, 4-7 -> 0-3


def _step(gfni: bool):
    """The signature and code of a block-pair step (`pair_step`), nibbles by GFNI or shift and mask."""
    def typer(typingctx, acc, w, o, x64, xo, ns, no, xs):
        check_array(w, BYTE_DTYPES)
        check_array(x64, BYTE_DTYPES)
        check_array(ns, (types.int32,))
        sig = v16f(acc, w, o, x64, xo, ns, no, types.float32)

        def cg(context, builder, sig, args):
            acc, wa, o, xa, xo, na, no, xs = args

            def at(extra, ty):
                return builder.load(array_ptr(context, builder, sig.args[1], wa, builder.add(o, ir.Constant(o.type, extra)),
                                         ty), align=1)
            q32 = at(12, ir.VectorType(ll.i64, 4))           # both rows' nibble bytes, in both 256-bit halves
            q = builder.shuffle_vector(q32, q32, ir.Constant(ir.VectorType(ll.i32, 8), [0, 1, 2, 3, 0, 1, 2, 3]))
            if gfni:     # qwords 0-3 keep each byte's bits 0-3, qwords 4-7 move bits 4-7 down
                aff = declare(builder, "llvm.x86.vgf2p8affineqb.512", ll.v64i8, [ll.v64i8, ll.v64i8, ll.i8])
                q = builder.call(aff, [builder.bitcast(q, ll.v64i8), builder.bitcast(_NIBBLES, ll.v64i8),
                                       ir.Constant(ll.i8, 0)])
            else:
                q = builder.lshr(q, ir.Constant(_V8I64, [0, 0, 0, 0, 4, 4, 4, 4]))
                q = builder.and_(builder.bitcast(q, ll.v64i8), ir.Constant(ll.v64i8, [15] * 64))
            m = builder.bitcast(at(4, ll.i64), ir.VectorType(ll.i1, 64))
            q = builder.select(m, builder.add(q, ir.Constant(ll.v64i8, [16] * 64)), q)   # one masked add
            sc = spread_scales(builder, at(0, ir.VectorType(ll.f16, 4)), xs, ([0] * 4 + [1] * 4) * 2)
            init = builder.load(array_ptr(context, builder, sig.args[5], na, no, ll.v16i32), align=4)
            x = builder.load(array_ptr(context, builder, sig.args[3], xa, xo, ll.v64i8), align=1)
            return dot_fma16(builder, init, q, x, sc, acc)

        return sig, cg
    return typer


@intrinsic
def pair_step_gfni(typingctx, acc, w, o, x64, xo, ns, no, xs):
    """`pair_step` taking the nibbles out with GFNI's affine transform."""
    return _step(True)(typingctx, acc, w, o, x64, xo, ns, no, xs)


@intrinsic
def pair_step_shift(typingctx, acc, w, o, x64, xo, ns, no, xs):
    """`pair_step` taking the nibbles out with a shift and a mask (CPUs without GFNI)."""
    return _step(False)(typingctx, acc, w, o, x64, xo, ns, no, xs)


#: acc + float(dot) * (d * xs) for the block pair at byte o of a Q5_0_x2 matrix, lane-wise as each
#: row's f32x8 chain in the file's layout; x64[xo..+64], ns[no..+16]: the activation block and its
#: group sums (<< SHIFT) arranged as the register's quarters (`_pair_inputs`). A step is a
#: broadcast load, a nibble transform, a masked add (high bits), a converting load and an xmm
#: product (scales), a permute, one dot, one conversion and one FMA: 13.5 instructions a block
#: pair against 16.5 with the scales spread before their product and the nibbles shifted and
#: masked (`kernels_bench.py --k 640`, AMD EPYC Zen 5, one core: 44.4 -> 55.6 GB/s in the L2,
#: 42.3 -> 44.9 from memory).
pair_step = pair_step_gfni if GFNI else pair_step_shift


@intrinsic
def row_lanes(typingctx, v, r):
    """Row r's 8 lanes of a pair's f32x16 in ggml's lane order (r a compile-time 0 or 1)."""
    if not isinstance(r, types.IntegerLiteral) or r.literal_value not in (0, 1):
        raise TypingError("row_lanes: the row must be a compile-time 0 or 1")
    idx = [0, 1, 2, 3, 8, 9, 10, 11] if r.literal_value == 0 else [4, 5, 6, 7, 12, 13, 14, 15]
    sig = v8f(v, r)

    def cg(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(ll.i32, 8), idx))

    return sig, cg


def _row_quants(context, builder, wt, wa, o, r, n):
    """Row r's (0 / 1, a runtime value) 32 unsigned quants of the block pair at byte o as the file
    layout's unpack gives them (16 low nibbles, then the high ones, + 16 where the 5th bit is set),
    n / 32 times over (n = 32: a ymm register; 64: both halves of a zmm)."""
    i64 = o.type

    def at(off, ty):
        return builder.load(array_ptr(context, builder, wt, wa, off, ty), align=1)
    r64 = builder.sext(r, i64) if r.type.width < 64 else r
    nib = at(builder.add(o, builder.add(ir.Constant(i64, 12), builder.mul(r64, ir.Constant(i64, 16)))), ir.VectorType(ll.i8, 16))
    q = builder.shuffle_vector(nib, nib, ir.Constant(ir.VectorType(ll.i32, n), list(range(16)) * (n // 16)))
    vi = ir.VectorType(ll.i32, n // 4)
    q = builder.lshr(builder.bitcast(q, vi), ir.Constant(vi, ([0] * 4 + [4] * 4) * (n // 32)))
    vb = ir.VectorType(ll.i8, n)
    q = builder.and_(builder.bitcast(q, vb), ir.Constant(vb, [15] * n))
    # the pair's four u16 of high bits in one load, shifted to row r's: its bits 0-15 then 16-31
    v = builder.lshr(at(builder.add(o, ir.Constant(i64, 4)), ll.i64), builder.mul(r64, ir.Constant(i64, 16)))
    bits = builder.or_(builder.and_(v, ir.Constant(ll.i64, 0xFFFF)),
                       builder.and_(builder.lshr(v, ir.Constant(ll.i64, 16)), ir.Constant(ll.i64, 0xFFFF0000)))
    if n == 64:
        bits = builder.or_(bits, builder.shl(bits, ir.Constant(ll.i64, 32)))
    else:
        bits = builder.trunc(bits, ll.i32)
    m = builder.bitcast(bits, ir.VectorType(ll.i1, n))
    return builder.select(m, builder.or_(q, ir.Constant(vb, [16] * n)), q)


@intrinsic
def row_x2(typingctx, w, o, r):
    """Row r's quants of the block pair at byte o in both 256-bit halves of a zmm register (the
    prompt tiles' two columns), as `intrinsics.quant_blocks.unpack_q45x2` gives a file-layout block's."""
    check_array(w, BYTE_DTYPES)
    sig = v64b(w, o, r)
    return sig, lambda context, builder, sig, args: _row_quants(context, builder, sig.args[0], *args, 64)


@intrinsic
def row_x1(typingctx, w, o, r):
    """Row r's quants of the block pair at byte o in a ymm register (a tile's leftover columns)."""
    check_array(w, BYTE_DTYPES)
    sig = v32b(w, o, r)
    return sig, lambda context, builder, sig, args: _row_quants(context, builder, sig.args[0], *args, 32)


pair_rows, _row_scales = pair_layout(PAIR)


# ----------------------------------------------------------------------------- layout
@numba.njit(inline="always")
def _place(r, e):
    """Where byte e of row r's Q5_0 block sits in its pair's record (the layout above)."""
    if e < 2:                                           # the scale
        return 2 * r + e
    if e < 6:                                           # the high bits' low, then high, 16 bits
        return (4 if e < 4 else 6) + 2 * r + e - 2
    return 12 + 16 * r + e - 6                          # the nibble bytes


# file layout <-> pairs, in place (`..packing.movers`), and pairs back to the file's layout
repack_rows, unpack_rows, rows_to_file = pair_movers(_place, BSZ)


@numba.njit(**_NB)
def dequant(w, r0, r1):
    """Rows [r0, r1) of a Q5_0_x2 matrix dequantized: the file layout's, on those rows' pairs."""
    a0, a1 = r0 - r0 % 2, r1 + r1 % 2
    t = np.empty((a1 - a0, w.shape[1]), np.uint8)
    rows_to_file(w, a0, a1, t)
    return dequant_q5_0(t, r0 - a0, r1 - a0)


# ----------------------------------------------------------------------------- products
@numba.njit(**_NB)
def _pair_inputs(xq, n4, nb):
    """The activation blocks as the register's quarters (weights 0-15 twice, then 16-31 twice) and
    their group-of-4 sums << SHIFT as the dot's initial lanes (groups 0-3 twice, 4-7 twice). The
    quarters copied 16 bytes at a time (`copy_bytes`; byte by byte it took 0.30 us a call at K =
    640, about five calls a layer, against 0.15-0.17)."""
    x64 = np.empty(nb * 64, np.uint8)
    ns = np.empty(nb * 16, np.int32)
    xu = xq.view(np.uint8)
    for q in range(nb * 4):   # quarter q of the blocks' registers: 16 weights, then 4 group sums
        src = (q // 4) * 32 + ((q % 4) // 2) * 16
        copy_bytes(x64, q * 16, xu, src, 16)
        for j in range(4):
            ns[q * 4 + j] = np.int32(n4[src // 4 + j]) << SHIFT
    return x64, ns


matvec, few_columns = pair_matvec(PAIR, pair_step, row_lanes, _pair_inputs, 64, 16)


def kernels(mode: int) -> dict:
    """{"Q5_0_x2": (matvec, matmat, mul_mat_id)} on AVX-512 VNNI (the layout is not used elsewhere).

    The prompt product (`repack.pair_products`): the Q5_0 prompt tiles reading each row's blocks
    where this layout keeps them for whole tiles of 8 columns, `few_columns` for the rest and for a
    large range times a few columns: every column the numbers the one-token product gives it, as
    the file layout's prompt product."""
    if mode != VNNI:
        return {}
    matmat, mul_mat_id = repack.pair_products(few_columns, row_x1, row_x2, pair_rows, _row_scales, SHIFT)
    return {"Q5_0_x2": (matvec, matmat, mul_mat_id)}

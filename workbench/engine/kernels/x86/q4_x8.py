"""Q4_0 and IQ4_NL kept in 8-row groups (internal types Q4_0_x8, IQ4_NL_x8), the AVX-512 VNNI path.

llama.cpp repacks a Q4_0 (or IQ4_NL) matrix whose rows are a multiple of 8 into block_q4_0x8 on
x86 and runs ggml_gemv_q4_0_8x8_q8_0 on it: one f32 chain per row over the 32-weight blocks,
``acc = fma(f32(S), d_w * d_x, acc)`` with S the block's exact integer dot product. The file
layout's kernel (`rows_lowbit`) keeps that order but reads the 8 rows one after another, stores
each block's lanes and reduces them in a second pass: compute-bound at ~21 GB/s in the L2 and
12.6-13.2 GB/s from memory on the AMD EPYC Zen 5 host (K = 640 and 2048, one core), a third of
what the memory gives. Here a group's 8 rows are interleaved per block column as block_q4_0x8
interleaves them with 8-byte chunks (without its XOR by 0x88), a 144-byte record:

    d (f16) of rows 0..7 | rows 0..7 quant bytes 0-7 | rows 0..7 quant bytes 8-15

so a record is one converting load of the scales and two zmm loads of the quants, whose lanes 2r
and 2r + 1 are row r's. Low nibbles (weights 0-7, 8-15) and high ones (16-23, 24-31) are dotted
with the activation's 8-byte runs broadcast (vpdpbusd), the lane pairs summed into an i32x8 (lane
r: row r's block sum), the activation's offset term added (Q4_0: -8 * sum(x); IQ4_NL's grid values
+ 128 through vpshufb: -128 * sum(x)) and one FMA per record runs the 8 rows' chains: per lane the
operations of ggml's repacked gemv, the same bits.

A matrix keeps its size and each group its own bytes, so a placement at 8-row boundaries moves
whole groups (`..packing`). The prompt product runs the same record steps for 4 columns per
unpacked record, each (row, column) the one-token chain, as ggml_gemm_q4_0_8x8_q8_0 gives it.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..cpu import cpu_flags
from ..llvm_ir import BYTE_DTYPES, check_array, declare, array_ptr, ll, splat, v64b, v8i, VNNI
from ..intrinsics.lanes import f_lane, f_scale, f_zero, fmadd_v
from ..intrinsics.load_store import load_f16x8
from ..intrinsics.quant_blocks import KVALUES_IQ4NL
from ..intrinsics.streams import prefetch, PREFETCH_NEAR, prime_streams, stream_halves
from ..jitcache import JIT as _NB
from .blocks import pair_movers

BSZ = 18            # a Q4_0 / IQ4_NL block
REC = 8 * BSZ       # an 8-row group's record of one column of 32 weights
#: GFNI's affine byte transform moves the high nibbles down in one instruction (a shift and an
#: AND without it: AVX-512 VNNI CPUs without GFNI, Cascade Lake)
GFNI = "gfni" in cpu_flags()
_V8I64 = ir.VectorType(ll.i64, 8)
_HIGH = ir.Constant(_V8I64, [0x1020408000000000] * 8)   # bits 4-7 -> 0-3 (vgf2p8affineqb's matrix)


def _literal(v, name):
    if not isinstance(v, types.IntegerLiteral) or v.literal_value not in (0, 1):
        raise TypingError(f"nibbles64: {name} must be a compile-time 0 or 1")
    return v.literal_value


@intrinsic
def nibbles64(typingctx, w, o, half, lut, gfni):
    """The 64 quant bytes at byte o of w as unsigned values: their low nibbles (half 0) or high
    ones (half 1); lut 1: IQ4_NL's grid values + 128 (vpshufb); gfni 1: the high nibbles by GFNI's
    affine transform, else a shift and a mask (all compile-time 0 / 1)."""
    check_array(w, BYTE_DTYPES)
    h, lu, gf = _literal(half, "half"), _literal(lut, "lut"), _literal(gfni, "gfni")
    sig = v64b(w, o, half, lut, gfni)

    def cg(context, builder, sig, args):
        raw = builder.load(array_ptr(context, builder, sig.args[0], args[0], args[1], ll.v64i8), align=1)
        if h == 0:
            q = builder.and_(raw, ir.Constant(ll.v64i8, [15] * 64))
        elif gf:
            aff = declare(builder, "llvm.x86.vgf2p8affineqb.512", ll.v64i8, [ll.v64i8, ll.v64i8, ir.IntType(8)])
            q = builder.call(aff, [raw, builder.bitcast(_HIGH, ll.v64i8), ir.Constant(ir.IntType(8), 0)])
        else:
            q = builder.lshr(builder.bitcast(raw, ir.VectorType(ir.IntType(16), 32)),
                             ir.Constant(ir.VectorType(ir.IntType(16), 32), [4] * 32))
            q = builder.and_(builder.bitcast(q, ll.v64i8), ir.Constant(ll.v64i8, [15] * 64))
        if lu:
            table = ir.Constant(ll.v64i8, [(x + 128) & 0xFF for x in KVALUES_IQ4NL] * 4)
            q = builder.call(declare(builder, "llvm.x86.avx512.pshuf.b.512", ll.v64i8, [ll.v64i8, ll.v64i8]), [table, q])
        return q

    return sig, cg


@intrinsic
def dots8(typingctx, lo0, hi0, lo1, hi1, xq, xo, ofs):
    """i32x8: lane r = row r's exact integer dot product of a record's quants (lo0 / hi0: the low
    and high nibbles of bytes 0-7 of each row, lo1 / hi1 of bytes 8-15) with the activation block
    xq[xo..xo + 32], plus ofs (the offset term)."""
    check_array(xq, BYTE_DTYPES)
    sig = v8i(lo0, hi0, lo1, hi1, xq, xo, ofs)

    def cg(context, builder, sig, args):
        lo0, hi0, lo1, hi1, xa, xo, ofs = args
        dp = declare(builder, "llvm.x86.avx512.vpdpbusd.512", ll.v16i32, [ll.v16i32, ll.v64i8, ll.v64i8])

        def run(at):   # activations xo + at .. + 8 in every qword
            v = builder.load(array_ptr(context, builder, sig.args[4], xa, builder.add(xo, ir.Constant(xo.type, at)), ll.i64),
                             align=1)
            v8 = builder.insert_element(ir.Constant(_V8I64, ir.Undefined), v, ir.Constant(ll.i32, 0))
            return builder.bitcast(builder.shuffle_vector(v8, v8, ir.Constant(ll.v8i32, [0] * 8)), ll.v64i8)
        s = ir.Constant(ll.v16i32, [0] * 16)
        for q, at in ((lo0, 0), (hi0, 16), (lo1, 8), (hi1, 24)):
            s = builder.call(dp, [s, q, run(at)])
        t = builder.add(s, builder.shuffle_vector(s, s, ir.Constant(ll.v16i32, [i ^ 1 for i in range(16)])))
        r = builder.shuffle_vector(t, t, ir.Constant(ll.v8i32, list(range(0, 16, 2))))
        o32 = builder.trunc(ofs, ll.i32) if ofs.type.width > 32 else builder.sext(ofs, ll.i32) if ofs.type.width < 32 else ofs
        return builder.add(r, splat(builder, o32, ll.v8i32))

    return sig, cg


# ----------------------------------------------------------------------------- layout
@numba.njit(inline="always")
def _place(r, e):
    """Where byte e of row r's block sits in its group's record: the scales, then the quants'
    two 8-byte halves, rows 0..7 each."""
    if e < 2:
        return 2 * r + e
    m = e - 2
    return 16 + 64 * (m // 8) + 8 * r + m % 8


# file layout <-> 8-row groups, in place (`..packing.movers`)
repack_rows, unpack_rows, _ = pair_movers(_place, BSZ, 8)


@numba.njit(**_NB)
def _offsets(n4, shift):
    """int32 [nb]: each activation block's offset term, the sum of its group sums (negated, as
    `quantize_q8_0` gives them) << shift (3: Q4_0's -8; 7: IQ4_NL's -128)."""
    nb = n4.shape[0] // 8
    out = np.empty(nb, np.int32)
    for b in range(nb):
        s = np.int32(0)
        for j in range(8):
            s += n4[8 * b + j]
        out[b] = s << shift
    return out


# ----------------------------------------------------------------------------- products
def _products(lut: int, gfni: int):
    """(matvec, matmat) of one of the two types (lut 1: IQ4_NL), nibbles by GFNI or not."""
    shift = 7 if lut else 3

    @numba.njit(inline="always")
    def record(acc, wf, o, xq, xo, ofs, xs):
        """acc + the record at byte o's 8 block sums times (d_w * xs), the rows' chains."""
        s = dots8(nibbles64(wf, o + 16, 0, lut, gfni), nibbles64(wf, o + 16, 1, lut, gfni),
                  nibbles64(wf, o + 80, 0, lut, gfni), nibbles64(wf, o + 80, 1, lut, gfni), xq, xo, ofs)
        return fmadd_v(acc, s, f_scale(load_f16x8(wf, o), xs))

    @numba.njit(inline="always")
    def put(out, g, r0, r1, acc):
        for q in range(8):
            if r0 <= 8 * g + q < r1:
                out[8 * g + q] = f_lane(acc, q)

    @numba.njit(**_NB)
    def matvec(w, xp, out, r0, r1):
        """out[r0:r1] (a range that cuts a group computes the group and writes its own rows); two
        streams: a group of each half of the range, record by record in turn."""
        xq, xd, n4 = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        ofs = _offsets(n4, shift)
        g0, g1 = r0 // 8, (r1 + 7) // 8
        gm = stream_halves(g0, g1, 1, 8 * rb)
        prime_streams(wf, g0, gm, 8 * rb, PREFETCH_NEAR)
        for g in range(g0, gm):
            h = g + gm - g0
            a, c = f_zero(), f_zero()
            oa, oc = 8 * g * rb, 8 * h * rb
            for b in range(nb):
                o = b * REC
                for j in range(0, REC, 48):   # every line of both records (48 < 64 apart)
                    prefetch(wf, oa + o + PREFETCH_NEAR + j)
                    prefetch(wf, oc + o + PREFETCH_NEAR + j)
                a = record(a, wf, oa + o, xq, 32 * b, ofs[b], xd[b])
                c = record(c, wf, oc + o, xq, 32 * b, ofs[b], xd[b])
            put(out, g, r0, r1, a)
            put(out, h, r0, r1, c)
        for g in range(2 * gm - g0, g1):
            a = f_zero()
            for b in range(nb):
                o = 8 * g * rb + b * REC
                for j in range(0, REC, 48):
                    prefetch(wf, o + PREFETCH_NEAR + j)
                a = record(a, wf, o, xq, 32 * b, ofs[b], xd[b])
            put(out, g, r0, r1, a)

    @numba.njit(inline="always")
    def put_col(out, c, g, r0, r1, acc):
        for q in range(8):
            if r0 <= 8 * g + q < r1:
                out[c, 8 * g + q] = f_lane(acc, q)

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        """out[c, r0:r1] for every column c: per group, 4 columns per unpacked record, each
        (row, column) the one-token product's chain."""
        xq, xd, n4 = xp
        n, k = xq.shape
        nb = xd.shape[1]
        rb = w.shape[1]
        wf = w.reshape(-1)
        xf = xq.reshape(-1)
        ofs = np.empty((n, nb), np.int32)
        for c in range(n):
            ofs[c] = _offsets(n4[c], shift)
        for g in range(r0 // 8, (r1 + 7) // 8):
            for c in range(0, n, 4):
                m = min(4, n - c)
                a0, a1, a2, a3 = f_zero(), f_zero(), f_zero(), f_zero()
                for b in range(nb):
                    o = 8 * g * rb + b * REC
                    lo0, hi0 = nibbles64(wf, o + 16, 0, lut, gfni), nibbles64(wf, o + 16, 1, lut, gfni)
                    lo1, hi1 = nibbles64(wf, o + 80, 0, lut, gfni), nibbles64(wf, o + 80, 1, lut, gfni)
                    d = load_f16x8(wf, o)
                    xo = c * k + 32 * b
                    a0 = fmadd_v(a0, dots8(lo0, hi0, lo1, hi1, xf, xo, ofs[c, b]), f_scale(d, xd[c, b]))
                    if m > 1:
                        a1 = fmadd_v(a1, dots8(lo0, hi0, lo1, hi1, xf, xo + k, ofs[c + 1, b]), f_scale(d, xd[c + 1, b]))
                    if m > 2:
                        a2 = fmadd_v(a2, dots8(lo0, hi0, lo1, hi1, xf, xo + 2 * k, ofs[c + 2, b]),
                                     f_scale(d, xd[c + 2, b]))
                    if m > 3:
                        a3 = fmadd_v(a3, dots8(lo0, hi0, lo1, hi1, xf, xo + 3 * k, ofs[c + 3, b]),
                                     f_scale(d, xd[c + 3, b]))
                put_col(out, c, g, r0, r1, a0)
                if m > 1:
                    put_col(out, c + 1, g, r0, r1, a1)
                if m > 2:
                    put_col(out, c + 2, g, r0, r1, a2)
                if m > 3:
                    put_col(out, c + 3, g, r0, r1, a3)

    return matvec, matmat


def kernels(mode: int) -> dict:
    """{"Q4_0_x8": ..., "IQ4_NL_x8": ...: (matvec, matmat, mul_mat_id)} on AVX-512 VNNI (the layout
    is not used elsewhere); an expert's tokens take the prompt product (ggml's repacked mul_mat_id
    runs the gemv per token: the same chains)."""
    if mode != VNNI:
        return {}
    out = {}
    for name, lut in (("Q4_0_x8", 0), ("IQ4_NL_x8", 1)):
        matvec, matmat = _products(lut, int(GFNI))

        def make_id(mm):
            @numba.njit(**_NB)
            def mul_mat_id(w, xp, out, r0, r1, rows):
                mm(w, xp, out, r0, r1)
            return mul_mat_id
        out[name] = (matvec, matmat, make_id(matmat))
    return out

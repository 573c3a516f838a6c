"""One-token products (matvec) of Q2_K, Q3_K, Q4_0, IQ4_NL and IQ4_XS, faster and bit-identical.

The per-row kernels of ``legacy_quants`` / ``k_quants`` / ``i_quants`` follow llama.cpp's float orders
but were compute-bound: a horizontal integer sum per row and block (the repacked orders), scalar
sub-block scale extraction, the sign trick, one FMA chain per row.  Here each order's per-row float
operations are kept exactly; only the (exact) integer work is rearranged.  Memory layouts are
untouched: rows are read in their GGUF block layout.

    repacked orders (one f32 chain per row over the blocks: Q4_0 / IQ4_NL when rows % 8 == 0, Q2_K on
    "avx512-vnni" when rows % 8 == 0): 8 rows per group, in two passes.  Pass 1 reads the group's
    rows one after another (a single ascending stream: 8 rows read interleaved ran at a few GB/s from
    memory on the tested EPYC, software prefetch did not help) and stores each block's integer lanes
    (Q4_0 / IQ4_NL: two blocks per vector; Q2_K: the scaled and the min lanes folded into one).
    Pass 2, per block: a transpose-add tree (``reduce8_lo`` / ``reduce8_hi``) gives one i32x8 whose
    lane r is row r's exact sum -- no per-row horizontal sum --, the 8 rows' f16 scales are converted
    with one vcvtph2ps (``gather_f16x8``), and ``acc = fma(f32(S), d_w * d_x, acc)`` runs for the 8
    rows in one vector FMA: per lane the operations of the per-row code.
    vec_dot orders (an f32x8 accumulator per row, hsum at the end): Q4_0 (rows % 8 != 0) 4 rows in two
    passes (lanes stored, then 4 FMA chains side by side: one chain per 32 quants is bound by the FMA
    latency); Q2_K (AVX2, or rows % 8 != 0), Q3_K and IQ4_XS one row at a time with cheaper integer
    work: sub-block scales as one i16x16 vector picked by constant shuffles, Q2_K's q * scale by a
    vpshufb table and vpdpbusd (VNNI), Q3_K's unsigned quants with the offset removed from the i16
    pair sums; on AVX-512 VNNI two 32-weight vectors per zmm register (`q2_lanes512`,
    `q3_lanes512`, `xs_lanes512`).  IQ4_NL's vec_dot order (rows % 8 != 0) stays the per-row kernel.

Rows past the last whole group go through the per-row kernel (same float order).  ``kernels``
returns the new matvec functions; the matmat functions are the family modules'.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..llvm_ir import BYTE_DTYPES, check_array, declare, array_ptr, literal_mode, ll, v16s, v32b, v8i, VNNI
from ..intrinsics.dots import add_word_products, dot_ss, dot_us, madd_sv, q2_mins_lanes
from ..intrinsics.lanes import b_and, b_or, b_shl, b_shr, f_scale, f_sub, f_zero, fmadd_i, fmadd_v, i_add, i_zero
from ..intrinsics.load_store import gather_f16x8, load_b32, load_i8, store_f32x8, store_i32x8
from ..intrinsics.quant_blocks import (bits_per_half, both_halves, fold16, KVALUES_IQ4NL, load_nib, lut_iq4nl,
                                       scale_words, word_ops)
from ..intrinsics.reductions import hsum_f
from ..intrinsics.scalars import f16_to_f32
from ..intrinsics.streams import group_steps, step_groups, stream_halves, stream_row

from ..jitcache import JIT as _NB
f32 = np.float32


# ============================================================================= primitives
@intrinsic
def madd_svs(typingctx, mode, acc, a, b, sv, i0, i1):
    """acc + per i32 lane, elements 0-15 of a.b weighted by lane i0 of the i16x16 ``sv`` and elements
    16-31 by lane i1 (compile-time ints), for SIGNED a: vpabsb / vpsignb, pmaddubsw (exact while
    2 * |a| * 128 < 32768), then pmaddwd / vpdpwssd with the shuffled scales (ggml's mul_add_epi8 +
    madd_epi16).  Per lane the same integer as madd_sc_s or dot_ss times a scale."""
    m = literal_mode(mode)
    if not isinstance(i0, types.IntegerLiteral) or not isinstance(i1, types.IntegerLiteral):
        raise TypingError("madd_svs lanes must be compile-time ints")
    j0, j1 = i0.literal_value, i1.literal_value
    sig = v8i(mode, acc, a, b, sv, i0, i1)

    def cg(context, builder, sig, args):
        acc, a, b, sv = args[1:5]
        absa = builder.call(declare(builder, "llvm.abs.v32i8", ll.v32i8, [ll.v32i8, ir.IntType(1)]), [a, ir.Constant(ir.IntType(1), 0)])
        sb = builder.call(declare(builder, "llvm.x86.avx2.psign.b", ll.v32i8, [ll.v32i8, ll.v32i8]), [b, a])
        p16 = builder.call(declare(builder, "llvm.x86.avx2.pmadd.ub.sw", ll.v16i16, [ll.v32i8, ll.v32i8]), [absa, sb])
        sc = builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(ll.i32, 16), [j0] * 8 + [j1] * 8))
        return add_word_products(builder, m, acc, p16, sc)

    return sig, cg


@intrinsic
def q2_scales(typingctx, a, off):
    """i16x16 of the 16 Q2_K sub-block scales (low nibbles of the 16 bytes at ``off``)."""
    check_array(a, BYTE_DTYPES)
    sig = v16s(a, off)

    def cg(context, builder, sig, args):
        raw = builder.load(array_ptr(context, builder, sig.args[0], args[0], args[1], ll.v16i8), align=1)
        return builder.zext(builder.and_(raw, ir.Constant(ll.v16i8, [15] * 16)), ll.v16i16)

    return sig, cg


@intrinsic
def q3_scales_m32(typingctx, a, off):
    """i16x16 of the 16 Q3_K scales minus 32 of the super-block at byte ``off`` (`k_quants.q3_K_scales`,
    ggml's kmask unpacking) in vector registers: the low nibbles of bytes 96-103 then their high
    nibbles, each with two bits of the word at 104 shifted by 0, 2, 4, 6 per group of four."""
    check_array(a, BYTE_DTYPES)
    sig = v16s(a, off)

    def cg(context, builder, sig, args):
        V2Q, V4I = ir.VectorType(ll.i64, 2), ir.VectorType(ll.i32, 4)
        lo8 = builder.load(array_ptr(context, builder, sig.args[0], args[0], builder.add(args[1], ir.Constant(args[1].type, 96)),
                                ll.i64), align=1)
        hi4 = builder.load(array_ptr(context, builder, sig.args[0], args[0], builder.add(args[1], ir.Constant(args[1].type, 104)),
                                ll.i32), align=1)
        lo = builder.insert_element(ir.Constant(V2Q, None), lo8, ir.Constant(ll.i32, 0))
        lo = builder.lshr(builder.shuffle_vector(lo, lo, ir.Constant(ir.VectorType(ll.i32, 2), [0, 0])),
                          ir.Constant(V2Q, [0, 4]))
        lo = builder.and_(builder.bitcast(lo, ll.v16i8), ir.Constant(ll.v16i8, [15] * 16))
        hi = builder.insert_element(ir.Constant(V4I, None), hi4, ir.Constant(ll.i32, 0))
        hi = builder.lshr(builder.shuffle_vector(hi, hi, ir.Constant(V4I, [0] * 4)), ir.Constant(V4I, [0, 2, 4, 6]))
        hi = builder.shl(builder.and_(builder.bitcast(hi, ll.v16i8), ir.Constant(ll.v16i8, [3] * 16)),
                         ir.Constant(ll.v16i8, [4] * 16))
        return builder.sub(builder.zext(builder.or_(lo, hi), ll.v16i16), ir.Constant(ll.v16i16, [32] * 16))

    return sig, cg


@intrinsic
def iq4_xs_scales(typingctx, a, off):
    """i16x16, lanes 0-7 = ls_j - 32 of the IQ4_XS super-block at byte ``off`` (6-bit scales: low
    nibbles at off + 4, two high bits each in the u16 at off + 2), lanes 8-15 a copy."""
    check_array(a, BYTE_DTYPES)
    sig = v16s(a, off)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        pl = builder.bitcast(builder.gep(ary.data, [builder.add(args[1], ir.Constant(args[1].type, 4))]),
                             ir.VectorType(ir.IntType(8), 4).as_pointer())
        ph = builder.bitcast(builder.gep(ary.data, [builder.add(args[1], ir.Constant(args[1].type, 2))]), ll.i16.as_pointer())
        V8S = ir.VectorType(ll.i16, 8)
        lo4 = builder.load(pl, align=1)
        lo8 = builder.zext(builder.shuffle_vector(lo4, lo4, ir.Constant(ir.VectorType(ll.i32, 8), [0, 0, 1, 1, 2, 2, 3, 3])), V8S)
        lo = builder.and_(builder.lshr(lo8, ir.Constant(V8S, [0, 4] * 4)), ir.Constant(V8S, [15] * 8))
        h = builder.load(ph, align=1)
        hv = builder.insert_element(ir.Constant(V8S, None), h, ir.Constant(ll.i32, 0))
        hv = builder.shuffle_vector(hv, hv, ir.Constant(ir.VectorType(ll.i32, 8), [0] * 8))
        hi = builder.shl(builder.and_(builder.lshr(hv, ir.Constant(V8S, [0, 2, 4, 6, 8, 10, 12, 14])),
                                      ir.Constant(V8S, [3] * 8)), ir.Constant(V8S, [4] * 8))
        s8 = builder.sub(builder.or_(lo, hi), ir.Constant(V8S, [32] * 8))
        return builder.shuffle_vector(s8, s8, ir.Constant(ir.VectorType(ll.i32, 16), list(range(8)) * 2))

    return sig, cg


@intrinsic
def pairs_of(typingctx, v):
    """i16x16 [v0, v0, v1, v1, ..., v7, v7]: IQ4_XS's 8 scales (`iq4_xs_scales`) once per 16-element half."""
    sig = v16s(v)
    return sig, lambda context, builder, sig, args: builder.shuffle_vector(
        args[0], args[0], ir.Constant(ir.VectorType(ll.i32, 16), [j // 2 for j in range(16)]))


@intrinsic
def load_2x16(typingctx, a, off0, off1):
    """32 bytes: the 16 at byte off0 of a uint8 array in the low half, the 16 at off1 in the high half
    (vinserti128): the same block of two rows in one vector."""
    check_array(a, BYTE_DTYPES)
    sig = v32b(a, types.intp, types.intp)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        lo = builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), ll.v16i8.as_pointer()), align=1)
        hi = builder.load(builder.bitcast(builder.gep(ary.data, [args[2]]), ll.v16i8.as_pointer()), align=1)
        return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(ll.i32, 32), list(range(32))))

    return sig, cg


@intrinsic
def lut_iq4nl_u(typingctx, v):
    """Bytes 0..15 of ``v`` -> the IQ4_NL values + 128 as unsigned bytes (1..241; vpshufb)."""
    sig = v32b(v)

    def cg(context, builder, sig, args):
        table = ir.Constant(ll.v32i8, [(x + 128) & 0xFF for x in KVALUES_IQ4NL] * 2)
        return builder.call(declare(builder, "llvm.x86.avx2.pshuf.b", ll.v32i8, [ll.v32i8, ll.v32i8]), [table, args[0]])

    return sig, cg


@intrinsic
def madd_off(typingctx, mode, acc, a, b, o16, oi, sv, i0, i1):
    """acc + per i32 lane, pairs of (pmaddubsw(a, b) - o16[oi:oi + 16]) weighted by lane i0 of the
    i16x16 ``sv`` (elements 0-15) and i1 (elements 16-31): unsigned quants a with their offset
    removed in the i16 pair sums (o16: the offset times each pair's activation sum), exact while
    |pairs| < 32768; the same integers as the sign trick on the signed quants."""
    m = literal_mode(mode)
    if not isinstance(i0, types.IntegerLiteral) or not isinstance(i1, types.IntegerLiteral):
        raise TypingError("madd_off lanes must be compile-time ints")
    check_array(o16, (types.int16,))
    j0, j1 = i0.literal_value, i1.literal_value
    sig = v8i(mode, acc, a, b, o16, oi, sv, i0, i1)

    def cg(context, builder, sig, args):
        acc, a, b, o16, oi, sv = args[1:7]
        p16 = builder.call(declare(builder, "llvm.x86.avx2.pmadd.ub.sw", ll.v16i16, [ll.v32i8, ll.v32i8]), [a, b])
        off = builder.load(array_ptr(context, builder, sig.args[4], o16, oi, ll.v16i16), align=2)
        p16 = builder.sub(p16, off)
        sc = builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(ll.i32, 16), [j0] * 8 + [j1] * 8))
        return add_word_products(builder, m, acc, p16, sc)

    return sig, cg


# ----------------------------------------------------------------------------- 512-bit lanes
# The one-token products of Q2_K, Q3_K and IQ4_XS on AVX-512 VNNI, two 32-weight vectors per zmm
# register (as `k4_lanes512` / `q6_K_lanes512` for Q4_K / Q6_K): every instruction of the integer
# work does two of the ymm code's, and folding the halves at the end gives the same i32 lanes
# (lane l: weights 4l..4l+3 of every 32-weight vector; IQ4_XS: of every sub-block) -- integers,
# so the float steps after them are untouched. The ymm code was compute-bound at 22-23 GB/s for
# all three from the L2 and from memory alike (kernels_bench K = 2048, AMD EPYC Zen 5, one core).
def _pshufb512(builder, table, idx):
    return builder.call(declare(builder, "llvm.x86.avx512.pshuf.b.512", ll.v64i8, [ll.v64i8, ll.v64i8]), [table, idx])


@intrinsic
def q2_lanes512(typingctx, a, o, xq, xo):
    """i32x8: the scaled part of the Q2_K super-block at byte o of a against xq[xo..+256] in the
    lanes of the ymm `q2_lanes` (exact). Per half, two quarters a zmm register: the 32 quant bytes
    in both halves shifted by 2i and 2i + 2, q * sc (<= 45, a byte) by one vpshufb from the half's
    64-byte table (byte 4i + v of 128-bit lane L: sc[8 half + 2i + L % 2] * v, the sub-blocks of
    each lane) and one vpdpbusd against 64 consecutive activations: per i32 lane the integer of
    pmaddubsw(q, x) then pmaddwd by the scale."""
    check_array(a, BYTE_DTYPES)
    check_array(xq, BYTE_DTYPES)
    sig = v8i(a, o, xq, xo)

    def cg(context, builder, sig, args):
        wa, o, xa, xo = args
        at, _mub, _dpw = word_ops(context, builder, o)
        dp = declare(builder, "llvm.x86.avx512.vpdpbusd.512", ll.v16i32, [ll.v16i32, ll.v64i8, ll.v64i8])
        sc = builder.and_(at(wa, sig.args[0], o, 0, ll.v16i8), ir.Constant(ll.v16i8, [15] * 16))
        acc = ir.Constant(ll.v16i32, [0] * 16)
        for h in range(2):
            idx = [8 * h + 2 * (p // 4) + L % 2 for L in range(4) for p in range(16)]
            rep = builder.shuffle_vector(sc, sc, ir.Constant(ir.VectorType(ll.i32, 64), idx))
            one = builder.and_(rep, ir.Constant(ll.v64i8, [0, 255, 0, 255] * 16))
            two = builder.and_(builder.add(rep, rep), ir.Constant(ll.v64i8, [0, 0, 255, 255] * 16))
            table = builder.add(one, two)                  # byte 4i + v of lane L: sc[8h + 2i + L % 2] * v
            raw = both_halves(builder, at, wa, sig.args[0], o, 16 + 32 * h)
            for p in range(2):
                q = bits_per_half(builder, raw, (4 * p, 4 * p + 2), 3)
                q = builder.or_(q, ir.Constant(ll.v64i8, [8 * p] * 32 + [8 * p + 4] * 32))
                x = at(xa, sig.args[2], xo, 128 * h + 64 * p, ll.v64i8)
                acc = builder.call(dp, [acc, _pshufb512(builder, table, q), x])
        return fold16(builder, acc)

    return sig, cg


@intrinsic
def q3_lanes512(typingctx, a, o, xq, xo, sv, o16):
    """i32x8: the Q3_K super-block at byte o of a against xq[xo..+256] in the lanes of the ymm
    `q3_lanes` (exact); sv: its scales - 32 (`q3_scales_m32`), o16: 4 x each activation pair's
    sum (`_pair_offsets(xq, 4)`). Two quarters a zmm register: the low bits and the high bit
    shifted per half (into bit 2: + 4), pmaddubsw of the unsigned quants, the offset pairs
    subtracted, one vpdpwssd by four sub-blocks' scales."""
    check_array(a, BYTE_DTYPES)
    check_array(xq, BYTE_DTYPES)
    check_array(o16, (types.int16,))
    sig = v8i(a, o, xq, xo, sv, o16)

    def cg(context, builder, sig, args):
        wa, o, xa, xo, sv, oa = args
        at, mub, dpw = word_ops(context, builder, o)
        hm = both_halves(builder, at, wa, sig.args[0], o, 0)
        v8q = ir.VectorType(ll.i64, 8)
        acc = ir.Constant(ll.v16i32, [0] * 16)
        for h in range(2):
            raw = both_halves(builder, at, wa, sig.args[0], o, 32 + 32 * h)
            for p in range(2):
                q = bits_per_half(builder, raw, (4 * p, 4 * p + 2), 3)
                k = 4 * h + 2 * p          # the high bits of this quarter (k + 1: the next) -> bit 2
                if k >= 2:
                    hb = builder.lshr(hm, ir.Constant(v8q, [k - 2] * 4 + [k - 1] * 4))
                else:
                    hb = builder.shl(hm, ir.Constant(v8q, [2 - k] * 4 + [1 - k] * 4))
                q = builder.or_(q, builder.and_(builder.bitcast(hb, ll.v64i8), ir.Constant(ll.v64i8, [4] * 64)))
                x = at(xa, sig.args[2], xo, 128 * h + 64 * p, ll.v64i8)
                xi = builder.sdiv(builder.add(xo, ir.Constant(xo.type, 128 * h + 64 * p)), ir.Constant(xo.type, 2))
                off = builder.load(array_ptr(context, builder, sig.args[5], oa, xi, ir.VectorType(ll.i16, 32)), align=2)
                p16 = builder.sub(builder.call(mub, [q, x]), off)
                acc = builder.call(dpw, [acc, p16, scale_words(builder, sv, 8 * h + 4 * p)])
        return fold16(builder, acc)

    return sig, cg


@intrinsic
def xs_lanes512(typingctx, a, o, xr, xo, sv):
    """i32x8: the IQ4_XS super-block at byte o of a against the regrouped activations xr[xo..+256]
    (`_xs_regroup`) in the lanes of the ymm `xs_lanes` (exact); sv: `iq4_xs_scales`. Four
    sub-blocks a zmm register: 64 quant bytes, their low nibbles (each sub-block's weights 0-15)
    and high ones (16-31); the sign trick as ggml's (|q| by one vpshufb, the activations negated
    where the nibble is below 8, IQ4_NL's negative half), pmaddubsw, one vpdpwssd by the four
    scales; lanes 0-3 from the low nibbles' vectors, 4-7 from the high ones'."""
    check_array(a, BYTE_DTYPES)
    check_array(xr, BYTE_DTYPES)
    sig = v8i(a, o, xr, xo, sv)

    def cg(context, builder, sig, args):
        wa, o, xa, xo, sv = args
        at, mub, dpw = word_ops(context, builder, o)
        absv = ir.Constant(ll.v64i8, [abs(v) for v in KVALUES_IQ4NL] * 4)
        m15, eight = ir.Constant(ll.v64i8, [15] * 64), ir.Constant(ll.v64i8, [8] * 64)
        zero = ir.Constant(ll.v64i8, [0] * 64)
        accs = [ir.Constant(ll.v16i32, [0] * 16), ir.Constant(ll.v16i32, [0] * 16)]
        for g in range(2):
            raw = at(wa, sig.args[0], o, 8 + 64 * g, ll.v64i8)
            for part in range(2):
                nib = builder.and_(raw if part == 0 else builder.lshr(raw, ir.Constant(ll.v64i8, [4] * 64)), m15)
                x = at(xa, sig.args[2], xo, 128 * g + 64 * part, ll.v64i8)
                sx = builder.select(builder.icmp_unsigned("<", nib, eight), builder.sub(zero, x), x)
                p16 = builder.call(mub, [_pshufb512(builder, absv, nib), sx])
                accs[part] = builder.call(dpw, [accs[part], p16, scale_words(builder, sv, 4 * g)])

        def quarter_sums(acc):   # i32x4: dword l summed over the four 128-bit lanes
            v8 = fold16(builder, acc)
            v4 = ir.VectorType(ll.i32, 4)
            return builder.add(builder.shuffle_vector(v8, v8, ir.Constant(v4, [0, 1, 2, 3])),
                               builder.shuffle_vector(v8, v8, ir.Constant(v4, [4, 5, 6, 7])))
        lo, hi = quarter_sums(accs[0]), quarter_sums(accs[1])
        return builder.shuffle_vector(lo, hi, ir.Constant(ll.v8i32, list(range(8))))

    return sig, cg


@numba.njit(**_NB)
def _xs_regroup(xq):
    """int8 [k]: per 128 activations (four IQ4_XS sub-blocks), the first 16 of each sub-block, then
    the last 16 of each: the order of `xs_lanes512`'s low- and high-nibble vectors."""
    out = np.empty_like(xq)
    for g in range(xq.shape[0] // 128):
        for j in range(4):
            for e in range(16):
                out[128 * g + 16 * j + e] = xq[128 * g + 32 * j + e]
                out[128 * g + 64 + 16 * j + e] = xq[128 * g + 32 * j + 16 + e]
    return out


@numba.njit(**_NB)
def _pair_offsets(xq, c):
    """int16 [k / 2]: c * (x[2p] + x[2p + 1]), the offset term of each pmaddubsw pair."""
    n = xq.shape[0] // 2
    out = np.empty(n, np.int16)
    for p in range(n):
        out[p] = np.int16(c * (np.int32(xq[2 * p]) + np.int32(xq[2 * p + 1])))
    return out


def _reduce8_halves(builder, args, upper):
    def sh(x, y, idx):
        return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(ll.i32, len(idx)), idx))

    ev, od = [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15]
    p = [builder.add(sh(args[2 * j], args[2 * j + 1], ev), sh(args[2 * j], args[2 * j + 1], od)) for j in range(4)]
    lo, hi = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    q0 = builder.add(sh(p[0], p[1], lo), sh(p[0], p[1], hi))
    q1 = builder.add(sh(p[2], p[3], lo), sh(p[2], p[3], hi))
    return sh(q0, q1, [4, 5, 6, 7, 12, 13, 14, 15] if upper else [0, 1, 2, 3, 8, 9, 10, 11])


@intrinsic
def reduce8_lo(typingctx, a0, a1, a2, a3, a4, a5, a6, a7):
    """i32x8 whose lane r is the sum of lanes 0-3 of a_r (exact; transpose-add tree)."""
    sig = v8i(a0, a1, a2, a3, a4, a5, a6, a7)
    return sig, lambda context, builder, sig, args: _reduce8_halves(builder, args, False)


@intrinsic
def reduce8_hi(typingctx, a0, a1, a2, a3, a4, a5, a6, a7):
    """i32x8 whose lane r is the sum of lanes 4-7 of a_r (the same tree as reduce8_lo: LLVM shares it)."""
    sig = v8i(a0, a1, a2, a3, a4, a5, a6, a7)
    return sig, lambda context, builder, sig, args: _reduce8_halves(builder, args, True)


@numba.njit(**_NB)
def _pairs_prep(xq, n4, shift):
    """Activations and initial lanes for two Q8_0 blocks (2p, 2p + 1) per vector: xp2[64 p:] = first
    16 quants of block 2p, first 16 of 2p + 1, last 16 of 2p, last 16 of 2p + 1 (zeros past the last
    block); mp[8 p:] = lanes 0-3 summing to block 2p's offset sum(n4 << shift), lanes 4-7 to 2p + 1's."""
    nb = xq.shape[0] // 32
    npairs = (nb + 1) // 2
    xp2 = np.zeros(npairs * 64, np.int8)
    mp = np.zeros(npairs * 8, np.int32)
    for b in range(nb):
        p, h = b // 2, b % 2
        for e in range(16):
            xp2[p * 64 + 16 * h + e] = xq[b * 32 + e]
            xp2[p * 64 + 32 + 16 * h + e] = xq[b * 32 + 16 + e]
        for l in range(4):
            mp[p * 8 + 4 * h + l] = (np.int32(n4[b * 8 + l]) << shift) + (np.int32(n4[b * 8 + l + 4]) << shift)
    return xp2, mp


@intrinsic
def fold_halves(typingctx, a, b):
    """i32x8: lanes 0-3 = a's lanes 0-3 + 4-7 (their sum is a's total), lanes 4-7 likewise for b."""
    sig = v8i(a, b)

    def cg(context, builder, sig, args):
        def sh(idx):
            return builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(ll.i32, 8), idx))
        return builder.add(sh([0, 1, 2, 3, 8, 9, 10, 11]), sh([4, 5, 6, 7, 12, 13, 14, 15]))

    return sig, cg


def kernels(mode: int, per_row: dict) -> dict:
    """{type name: (matvec, matmat)} of Q2_K, Q3_K, Q4_0, IQ4_NL, IQ4_XS for one instruction-set mode:
    the grouped-rows matvec, with ``per_row``'s (the family modules' table) matvec for the rows after
    the last whole group and its matmat unchanged."""
    repacks_q2 = mode == VNNI

    # ------------------------------------------------------------------ Q4_0 / IQ4_NL, repacked order
    # Only each row's block total counts in this order, so a vector holds two consecutive blocks of a
    # row: the 16 quant bytes of block 2p in the low half and of 2p + 1 in the high half; low nibbles
    # against the blocks' first 16 activations, high nibbles against the last 16 (activations regrouped
    # once per call, _pairs_prep).  Offsets (Q4_0: -8; IQ4_NL on VNNI: grid value + 128 unsigned, -128)
    # start in the lanes; IQ4_NL on AVX2 (pmaddubsw would saturate at 241 * 128) takes the sign trick.
    iq4_unsigned = mode == VNNI

    def make_q0_rows8(signed):
        shift = (7 if iq4_unsigned else 0) if signed else 3

        @numba.njit(inline="always")
        def two_blocks(wf, o, o1, m, xlo, xhi):
            """i32x8: lanes 0-3 sum to the block at o's dot product, lanes 4-7 to the block at o1's."""
            raw = load_2x16(wf, o + 2, o1 + 2)
            lo = b_and(raw, 15)
            hi = b_and(b_shr(raw, 4), 15)
            if signed and iq4_unsigned:
                return dot_us(mode, dot_us(mode, m, lut_iq4nl_u(lo), xlo), lut_iq4nl_u(hi), xhi)
            if signed:
                return dot_ss(mode, dot_ss(mode, i_zero(), lut_iq4nl(lo), xlo), lut_iq4nl(hi), xhi)
            return dot_us(mode, dot_us(mode, m, lo, xlo), hi, xhi)

        @numba.njit(inline="always")
        def ld(sc, p, r):
            return load_i8(sc, (p * 8 + r) * 8)

        @numba.njit(**_NB)
        def rows8(w, xp, out, r0, r1):
            """ggml_gemv_q4_0_8x8_q8_0's order (see repack.q4_0_repacked) for rows r0.. in groups of 8.

            Two passes per group: the rows one after another (a single ascending stream, which the
            hardware prefetcher follows: 8 rows read interleaved ran at a few GB/s from memory), each
            vector two consecutive blocks of a row, its lanes stored; then per pair of blocks the 8
            rows' lanes reduced by the transpose-add tree and the 8 rows' FMAs in block order."""
            xq, xd, n4 = xp
            nb = xd.shape[0]
            rb = w.shape[1]
            wf = w.reshape(-1)
            npairs = (nb + 1) // 2
            xp2, mp = _pairs_prep(xq, n4, shift)
            # two streams (intrinsics.streams.TWO_STREAMS_MIN): a group of each half, row by row in turn
            sc2 = np.empty(2 * npairs * 64, np.int32)
            n_pairs, n_steps = group_steps(r0, r1, 8, rb)
            mid = r0 + 8 * n_pairs
            for st in range(n_steps):
                ga, gb, nh = step_groups(st, r0, mid, n_pairs, 8)
                for r in range(8):
                    for h in range(nh):
                        base = ((ga if h == 0 else gb) + r) * rb
                        for p in range(npairs):
                            o = base + p * 36
                            o1 = o + 18 if 2 * p + 1 < nb else o
                            store_i32x8(sc2, h * npairs * 64 + (p * 8 + r) * 8,
                                        two_blocks(wf, o, o1, load_i8(mp, p * 8), load_b32(xp2, p * 64),
                                                   load_b32(xp2, p * 64 + 32)))
                for h in range(nh):
                    i = ga if h == 0 else gb
                    sc = sc2[h * npairs * 64:]
                    acc = f_zero()
                    for p in range(npairs):
                        b = 2 * p
                        o = i * rb + b * 18
                        acc = fmadd_v(acc, reduce8_lo(ld(sc, p, 0), ld(sc, p, 1), ld(sc, p, 2), ld(sc, p, 3),
                                                      ld(sc, p, 4), ld(sc, p, 5), ld(sc, p, 6), ld(sc, p, 7)),
                                      f_scale(gather_f16x8(wf, o, rb), xd[b]))
                        if b + 1 < nb:
                            acc = fmadd_v(acc, reduce8_hi(ld(sc, p, 0), ld(sc, p, 1), ld(sc, p, 2), ld(sc, p, 3),
                                                          ld(sc, p, 4), ld(sc, p, 5), ld(sc, p, 6), ld(sc, p, 7)),
                                          f_scale(gather_f16x8(wf, o + 18, rb), xd[b + 1]))
                    store_f32x8(out, i, acc)
        return rows8

    q4_0_rows8 = make_q0_rows8(False)
    iq4_nl_rows8 = make_q0_rows8(True)

    # ------------------------------------------------------------------ Q4_0, vec_dot order (rows % 8 != 0)
    @numba.njit(**_NB)
    def q4_0_vec4(w, xp, out, r0, r1):
        """ggml_vec_dot_q4_0_q8_0's order (legacy_quants.make_offset_matvec: one f32x8 chain per row,
        one FMA per block), 4 rows at a time in two passes: the rows one after another (one ascending
        stream) storing each block's lanes, then the 4 rows' FMA chains side by side (one chain alone
        is bound by the FMA latency)."""
        xq, xd, n4 = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        ns = (n4 << 3).astype(np.int32)
        sc2 = np.empty(2 * nb * 32, np.int32)   # two streams: 4 rows of each half, row by row in turn
        n_pairs, n_steps = group_steps(r0, r1, 4, rb)
        mid = r0 + 4 * n_pairs
        for st in range(n_steps):
            ga, gb, nh = step_groups(st, r0, mid, n_pairs, 4)
            for r in range(4):
                for h in range(nh):
                    base = ((ga if h == 0 else gb) + r) * rb
                    for b in range(nb):
                        store_i32x8(sc2, h * nb * 32 + (b * 4 + r) * 8,
                                    dot_us(mode, load_i8(ns, b * 8), load_nib(mode, wf, base + b * 18 + 2),
                                           load_b32(xq, b * 32)))
            for h in range(nh):
                i = ga if h == 0 else gb
                sc = sc2[h * nb * 32:]
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                for b in range(nb):
                    o = i * rb + b * 18
                    a0 = fmadd_i(a0, load_i8(sc, b * 32), f16_to_f32(wf, o) * xd[b])
                    a1 = fmadd_i(a1, load_i8(sc, b * 32 + 8), f16_to_f32(wf, o + rb) * xd[b])
                    a2 = fmadd_i(a2, load_i8(sc, b * 32 + 16), f16_to_f32(wf, o + 2 * rb) * xd[b])
                    a3 = fmadd_i(a3, load_i8(sc, b * 32 + 24), f16_to_f32(wf, o + 3 * rb) * xd[b])
                out[i] = hsum_f(a0); out[i + 1] = hsum_f(a1); out[i + 2] = hsum_f(a2); out[i + 3] = hsum_f(a3)

    # ------------------------------------------------------------------ Q2_K
    @numba.njit(inline="always")
    def q2_quarter(acc, raw, xq, xo, sv, i, j0, j1):
        return madd_sv(mode, acc, b_and(b_shr(raw, 2 * i), 3), load_b32(xq, xo + 32 * i), sv, j0, j1)

    @numba.njit(inline="always")
    def q2_lanes(wf, o, xq, xo):
        """i32x8 of the scaled part of the Q2_K super-block at o: the lanes of k_quants.q2_K_half(0) +
        q2_K_half(1) (exact).  VNNI: q * sc by table lookup, two quarters per vpdpbusd (q2_lanes512);
        AVX2: pmaddubsw then pmaddwd by scales picked from one i16x16 vector."""
        if mode == VNNI:
            return q2_lanes512(wf, o, xq, xo)
        sv = q2_scales(wf, o)
        raw = load_b32(wf, o + 16)
        a = q2_quarter(i_zero(), raw, xq, xo, sv, 0, 0, 1)
        a = q2_quarter(a, raw, xq, xo, sv, 1, 2, 3)
        a = q2_quarter(a, raw, xq, xo, sv, 2, 4, 5)
        a = q2_quarter(a, raw, xq, xo, sv, 3, 6, 7)
        raw = load_b32(wf, o + 48)
        a = q2_quarter(a, raw, xq, xo + 128, sv, 0, 8, 9)
        a = q2_quarter(a, raw, xq, xo + 128, sv, 1, 10, 11)
        a = q2_quarter(a, raw, xq, xo + 128, sv, 2, 12, 13)
        return q2_quarter(a, raw, xq, xo + 128, sv, 3, 14, 15)

    @numba.njit(inline="always")
    def ldq(sc, b, r):
        return load_i8(sc, (b * 8 + r) * 8)

    @numba.njit(**_NB)
    def q2_K_rows8(w, xp, out, r0, r1):
        """ggml_gemv_q2_K_8x8_q8_K's order (k_quants.q2_K_gemv: a scalar chain for the scaled part and
        one for the mins, one FMA each per super-block, out = acc - accm), 8 rows in lanes.  Two passes
        per group as in the Q4_0 rows8: the rows one after another (one ascending stream), each
        super-block's scaled and min lanes folded into one stored vector; then per super-block the
        8 rows' totals by the transpose-add tree and the 8 rows' two FMAs."""
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        sc2 = np.empty(2 * nb * 64, np.int32)   # two streams: a group of each half, row by row in turn
        n_pairs, n_steps = group_steps(r0, r1, 8, rb)
        mid = r0 + 8 * n_pairs
        for st in range(n_steps):
            ga, gb, nh = step_groups(st, r0, mid, n_pairs, 8)
            for r in range(8):
                for h in range(nh):
                    base = ((ga if h == 0 else gb) + r) * rb
                    for b in range(nb):
                        o = base + b * 84
                        store_i32x8(sc2, h * nb * 64 + (b * 8 + r) * 8,
                                    fold_halves(q2_lanes(wf, o, xq, b * 256), q2_mins_lanes(wf, o, xb, b * 16)))
            for h in range(nh):
                i = ga if h == 0 else gb
                sc = sc2[h * nb * 64:]
                acc = f_zero()
                accm = f_zero()
                for b in range(nb):
                    o = i * rb + b * 84
                    v0 = ldq(sc, b, 0); v1 = ldq(sc, b, 1); v2 = ldq(sc, b, 2); v3 = ldq(sc, b, 3)
                    v4 = ldq(sc, b, 4); v5 = ldq(sc, b, 5); v6 = ldq(sc, b, 6); v7 = ldq(sc, b, 7)
                    acc = fmadd_v(acc, reduce8_lo(v0, v1, v2, v3, v4, v5, v6, v7), f_scale(gather_f16x8(wf, o + 80, rb), xd[b]))
                    accm = fmadd_v(accm, reduce8_hi(v0, v1, v2, v3, v4, v5, v6, v7), f_scale(gather_f16x8(wf, o + 82, rb), xd[b]))
                store_f32x8(out, i, f_sub(acc, accm))

    @numba.njit(inline="always")
    def q2_vec_blk(acc, wf, o, xq, xo, xb, bo, dx):
        acc = fmadd_i(acc, q2_mins_lanes(wf, o, xb, bo), -dx * f16_to_f32(wf, o + 82))
        return fmadd_i(acc, q2_lanes(wf, o, xq, xo), dx * f16_to_f32(wf, o + 80))

    @numba.njit(**_NB)
    def q2_K_vec1(w, xp, out, r0, r1):
        """ggml_vec_dot_q2_K_q8_K's order (k_quants.q2_K_vec: per super-block the mins' FMA with
        -d_x * dmin, then the scaled lanes' FMA with d_x * d_w, hsum at the end), one row at a time:
        one FMA chain per 256 quants is no limit, and a single stream keeps the hardware prefetcher."""
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        mid = stream_halves(r0, r1, 1, rb)   # two streams: a row of each half in turn
        for j in range(r1 - r0):
            i = stream_row(j, r0, mid, 1)
            a0 = f_zero()
            for b in range(nb):
                a0 = q2_vec_blk(a0, wf, i * rb + b * 84, xq, b * 256, xb, b * 16, xd[b])
            out[i] = hsum_f(a0)

    # ------------------------------------------------------------------ Q3_K (always the vec_dot order)
    # The quants q = u - 4 with u = low 2 bits | high bit << 2 in 0..7: pmaddubsw(u, x) minus 4 * the
    # pair sums of x (_pair_offsets, once per call) are q * x pair sums -- the sign trick's integers
    # (activations are in [-127, 127]) in 2 fewer operations per 32 quants.
    @numba.njit(inline="always")
    def q3_quarter(acc, raw, hm, xq, xo, x4, sv, j, i, s0, s1):
        u = b_or(b_and(b_shr(raw, 2 * i), 3), b_shl(b_and(b_shr(hm, 4 * j + i), 1), 2))
        return madd_off(mode, acc, u, load_b32(xq, xo + 32 * i), x4, (xo + 32 * i) // 2, sv, s0, s1)

    @numba.njit(inline="always")
    def q3_lanes(wf, o, xq, xo, x4):
        """The i32x8 lanes of k_quants.q3_K_lanes (exact), scales as one i16x16 vector; on the VNNI
        path two quarters a zmm register (`q3_lanes512`), on AVX2 a quarter a ymm one."""
        sv = q3_scales_m32(wf, o)
        if mode == VNNI:
            return q3_lanes512(wf, o, xq, xo, sv, x4)
        hm = load_b32(wf, o)
        raw = load_b32(wf, o + 32)
        a = q3_quarter(i_zero(), raw, hm, xq, xo, x4, sv, 0, 0, 0, 1)
        a = q3_quarter(a, raw, hm, xq, xo, x4, sv, 0, 1, 2, 3)
        a = q3_quarter(a, raw, hm, xq, xo, x4, sv, 0, 2, 4, 5)
        a = q3_quarter(a, raw, hm, xq, xo, x4, sv, 0, 3, 6, 7)
        raw = load_b32(wf, o + 64)
        c = q3_quarter(i_zero(), raw, hm, xq, xo + 128, x4, sv, 1, 0, 8, 9)
        c = q3_quarter(c, raw, hm, xq, xo + 128, x4, sv, 1, 1, 10, 11)
        c = q3_quarter(c, raw, hm, xq, xo + 128, x4, sv, 1, 2, 12, 13)
        return i_add(a, q3_quarter(c, raw, hm, xq, xo + 128, x4, sv, 1, 3, 14, 15))

    @numba.njit(**_NB)
    def q3_K_vec1(w, xp, out, r0, r1):
        """ggml_vec_dot_q3_K_q8_K's order (k_quants.q3_K_dot), one row at a time (see q2_K_vec1)."""
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        x4 = _pair_offsets(xq, 4)
        mid = stream_halves(r0, r1, 1, rb)   # two streams: a row of each half in turn
        for j in range(r1 - r0):
            i = stream_row(j, r0, mid, 1)
            a0 = f_zero()
            for b in range(nb):
                o = i * rb + b * 110
                a0 = fmadd_i(a0, q3_lanes(wf, o, xq, b * 256, x4), xd[b] * f16_to_f32(wf, o + 108))
            out[i] = hsum_f(a0)

    # ------------------------------------------------------------------ IQ4_XS (always the vec_dot order)
    @numba.njit(inline="always")
    def xs_sub(acc, wf, o, xq, xo, sv, j):
        return madd_svs(mode, acc, lut_iq4nl(load_nib(mode, wf, o + 8 + 16 * j)), load_b32(xq, xo + 32 * j), sv, j, j)

    @numba.njit(inline="always")
    def xs_lanes(wf, o, xq, xo):
        """The i32x8 lanes of i_quants.xs_lanes (exact): sign trick, pmaddubsw, then pmaddwd by the
        sub-block scale (ggml's order of integer operations), scales as one i16x16 vector; on the
        VNNI path four sub-blocks a zmm register (`xs_lanes512`), on AVX2 one a ymm one."""
        sv = iq4_xs_scales(wf, o)
        if mode == VNNI:   # xq: the activations regrouped by _xs_regroup
            return xs_lanes512(wf, o, xq, xo, sv)
        a = xs_sub(i_zero(), wf, o, xq, xo, sv, 0)
        a = xs_sub(a, wf, o, xq, xo, sv, 1)
        a = xs_sub(a, wf, o, xq, xo, sv, 2)
        a = xs_sub(a, wf, o, xq, xo, sv, 3)
        c = xs_sub(i_zero(), wf, o, xq, xo, sv, 4)
        c = xs_sub(c, wf, o, xq, xo, sv, 5)
        c = xs_sub(c, wf, o, xq, xo, sv, 6)
        return i_add(a, xs_sub(c, wf, o, xq, xo, sv, 7))

    @numba.njit(**_NB)
    def iq4_xs_vec1(w, xp, out, r0, r1):
        """ggml_vec_dot_iq4_xs_q8_K's order (i_quants.xs_dot), one row at a time (see q2_K_vec1)."""
        xq, xd, _ = xp
        if mode == VNNI:
            xq = _xs_regroup(xq)
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        mid = stream_halves(r0, r1, 1, rb)   # two streams: a row of each half in turn
        for j in range(r1 - r0):
            i = stream_row(j, r0, mid, 1)
            a0 = f_zero()
            for b in range(nb):
                o = i * rb + b * 136
                a0 = fmadd_i(a0, xs_lanes(wf, o, xq, b * 256), f16_to_f32(wf, o) * xd[b])
            out[i] = hsum_f(a0)

    # ------------------------------------------------------------------ dispatch
    q4_0_row = per_row["Q4_0"][0]
    iq4_nl_row = per_row["IQ4_NL"][0]
    q2_K_row = per_row["Q2_K"][0]

    @numba.njit(**_NB)
    def q4_0_matvec(w, xp, out, r0, r1):
        if w.shape[0] % 8 == 0:   # llama.cpp's repacked q4_0_8x8 gemv
            r = r0 + (r1 - r0) // 8 * 8
            q4_0_rows8(w, xp, out, r0, r)
        else:
            r = r0 + (r1 - r0) // 4 * 4
            q4_0_vec4(w, xp, out, r0, r)
        q4_0_row(w, xp, out, r, r1)

    q4_0_plain_row = per_row["Q4_0_plain"][0]

    @numba.njit(**_NB)
    def q4_0_plain_matvec(w, xp, out, r0, r1):
        """A 3-D mul_mat weight (never repacked): ggml_vec_dot_q4_0_q8_0's order at any row count."""
        r = r0 + (r1 - r0) // 4 * 4
        q4_0_vec4(w, xp, out, r0, r)
        q4_0_plain_row(w, xp, out, r, r1)

    @numba.njit(**_NB)
    def iq4_nl_matvec(w, xp, out, r0, r1):
        if w.shape[0] % 8 == 0:   # llama.cpp's repacked iq4_nl_8x8 gemv
            r = r0 + (r1 - r0) // 8 * 8
            iq4_nl_rows8(w, xp, out, r0, r)
        else:   # ggml_vec_dot_iq4_nl_q8_0's order: 4 rows interleaved measured no faster than one
            r = r0
        iq4_nl_row(w, xp, out, r, r1)

    @numba.njit(**_NB)
    def q2_K_matvec(w, xp, out, r0, r1):
        if repacks_q2 and w.shape[0] % 8 == 0:   # llama.cpp's repacked q2_K_8x8 gemv (AVX-512)
            r = r0 + (r1 - r0) // 8 * 8
            q2_K_rows8(w, xp, out, r0, r)
        else:
            r = r1
            q2_K_vec1(w, xp, out, r0, r1)
        q2_K_row(w, xp, out, r, r1)

    @numba.njit(**_NB)
    def q3_K_matvec(w, xp, out, r0, r1):
        q3_K_vec1(w, xp, out, r0, r1)

    @numba.njit(**_NB)
    def iq4_xs_matvec(w, xp, out, r0, r1):
        iq4_xs_vec1(w, xp, out, r0, r1)

    # only the matvec is replaced: the family's matmat (and mul_mat_id kernel, if any) stay. The plain
    # ids' vec_dot orders (kernels.PLAIN_TYPES): Q4_0's 4 rows at a time, Q2_K's one row at a time
    # (IQ4_NL's stays the per-row kernel)
    grouped = dict(Q4_0=q4_0_matvec, IQ4_NL=iq4_nl_matvec, Q2_K=q2_K_matvec, Q3_K=q3_K_matvec, IQ4_XS=iq4_xs_matvec,
                   Q4_0_plain=q4_0_plain_matvec, Q2_K_plain=q2_K_vec1)
    return {name: (fn, *per_row[name][1:]) for name, fn in grouped.items()}

"""One-token products (matvec) of Q2_K, Q3_K, Q4_0, IQ4_NL and IQ4_XS with several rows at a time.

The per-row kernels of ``legacy_quants`` / ``k_quants`` / ``i_quants`` follow llama.cpp's float orders
but were compute-bound: one row at a time, a horizontal integer sum per row and block (the repacked
orders), scalar scale conversions and FMAs, one FMA chain per row.  Here, per type and order, the
same per-row float operations run for a group of rows at once; the integer work (exact) is arranged
freely.  Memory layouts are untouched: rows are read in their GGUF block layout.

    repacked orders (one f32 chain per row over the blocks: Q4_0 / IQ4_NL when rows % 8 == 0, Q2_K on
    "avx512-vnni" when rows % 8 == 0): 8 rows in the lanes of one vector.  Each row's integer lanes
    of a block are summed with the other rows' by a transpose-add tree (``reduce8``: one i32x8 whose
    lane r is row r's exact block sum, no per-row horizontal sum), the 8 rows' f16 scales are
    converted with one vcvtph2ps (``gather_f16x8``), and ``acc = fma(f32(S), d_w * d_x, acc)`` runs
    for the 8 rows in one vector FMA -- per lane the operations of the per-row code.
    vec_dot orders (an f32x8 accumulator per row, hsum at the end: everything else): 4 rows
    interleaved (4 independent FMA chains, the activations loaded once for 4 rows), each row's
    lanes and FMAs exactly as the per-row code; the K-quants' and IQ4_XS's sub-block scales become
    one i16x16 vector per super-block, picked by constant shuffles, instead of scalar extractions.

Rows past the last whole group go through the per-row kernel (same float order).  ``kernels``
returns the new matvec functions; the matmat functions are the family modules'.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..intrinsics import (VNNI, _V16B, _V16S, _V32B, _V8F, _V8I, _check_array, _fn, _i16, _i32, _mode, _ptr, _BYTES,
                          b_and, b_or, b_shl, b_shr, b_add, dot_ss, dot_us, f16_to_f32, f_add, f_sub, f_scale, f_zero,
                          fma_s, fmadd_i, fmadd_v, hsum_f, hsum_i, i_add, i_zero, load_b32, load_i8, load_nib,
                          lut_iq4nl, madd_sv, q2_mins_lanes, v16s, v32b, v8f, v8i)
from ..intrinsics import ld_u32

_NB = dict(nogil=True, cache=True)
f32 = np.float32
_V8H = ir.VectorType(ir.HalfType(), 8)


# ============================================================================= primitives
@numba.njit(inline="always")
def q3_K_scales(w, o):
    """k_quants.q3_K_scales (the 16 6-bit Q3_K scales + 32 as the bytes of 4 uint32, ggml's kmask
    unpacking) with unchecked 32-bit loads: Numba's indexing of single bytes kept a negative-index
    check per byte in the loop."""
    a0 = ld_u32(w, o + 96)
    a1 = ld_u32(w, o + 100)
    a2 = ld_u32(w, o + 104)
    k1 = np.uint32(0x03030303)
    k2 = np.uint32(0x0F0F0F0F)
    s0 = (a0 & k2) | ((a2 & k1) << np.uint32(4))
    s1 = (a1 & k2) | (((a2 >> np.uint32(2)) & k1) << np.uint32(4))
    s2 = ((a0 >> np.uint32(4)) & k2) | (((a2 >> np.uint32(4)) & k1) << np.uint32(4))
    s3 = ((a1 >> np.uint32(4)) & k2) | (((a2 >> np.uint32(6)) & k1) << np.uint32(4))
    return s0, s1, s2, s3


@intrinsic
def reduce8(typingctx, a0, a1, a2, a3, a4, a5, a6, a7):
    """i32x8 whose lane r is the sum of the 8 lanes of a_r (exact): a transpose-add tree of
    7 vector adds instead of 8 horizontal sums."""
    sig = v8i(a0, a1, a2, a3, a4, a5, a6, a7)

    def cg(context, builder, sig, args):
        def sh(x, y, idx):
            return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(_i32, len(idx)), idx))

        ev, od = [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15]
        # pairs: (a0+a1, b0+b1, a2+a3, b2+b3, ...)
        p = [builder.add(sh(args[2 * j], args[2 * j + 1], ev), sh(args[2 * j], args[2 * j + 1], od)) for j in range(4)]
        # quads: (a0..3, b0..3, c0..3, d0..3, a4..7, b4..7, c4..7, d4..7)
        lo, hi = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
        q0 = builder.add(sh(p[0], p[1], lo), sh(p[0], p[1], hi))
        q1 = builder.add(sh(p[2], p[3], lo), sh(p[2], p[3], hi))
        # halves: (a, b, c, d, e, f, g, h)
        return builder.add(sh(q0, q1, [0, 1, 2, 3, 8, 9, 10, 11]), sh(q0, q1, [4, 5, 6, 7, 12, 13, 14, 15]))

    return sig, cg


@intrinsic
def gather_f16x8(typingctx, a, off, stride):
    """f32x8 of the 8 halves at byte offsets off + r * stride (r < 8) of a uint8 array: the f16 scales
    of a block of 8 consecutive rows, converted with one vcvtph2ps (exact)."""
    _check_array(a, _BYTES)
    sig = v8f(a, types.intp, types.intp)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        v = ir.Constant(ir.VectorType(_i16, 8), None)
        for r in range(8):
            o = builder.add(args[1], builder.mul(args[2], ir.Constant(args[2].type, r)))
            p = builder.bitcast(builder.gep(ary.data, [o]), _i16.as_pointer())
            v = builder.insert_element(v, builder.load(p, align=1), ir.Constant(_i32, r))
        return builder.fpext(builder.bitcast(v, _V8H), _V8F)

    return sig, cg


@intrinsic
def store_f32x8(typingctx, a, off, v):
    """a[off:off + 8] = v (float32 array)."""
    _check_array(a, (types.float32,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], args[1], _V8F), align=4)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def madd_svs(typingctx, mode, acc, a, b, sv, i0, i1):
    """acc + per i32 lane, elements 0-15 of a.b weighted by lane i0 of the i16x16 ``sv`` and elements
    16-31 by lane i1 (compile-time ints), for SIGNED a: vpabsb / vpsignb, pmaddubsw (exact while
    2 * |a| * 128 < 32768), then pmaddwd / vpdpwssd with the shuffled scales (ggml's mul_add_epi8 +
    madd_epi16).  Per lane the same integer as madd_sc_s or dot_ss times a scale."""
    m = _mode(mode)
    j0, j1 = i0.literal_value, i1.literal_value
    sig = v8i(mode, acc, a, b, sv, i0, i1)

    def cg(context, builder, sig, args):
        acc, a, b, sv = args[1:5]
        absa = builder.call(_fn(builder, "llvm.abs.v32i8", _V32B, [_V32B, ir.IntType(1)]), [a, ir.Constant(ir.IntType(1), 0)])
        sb = builder.call(_fn(builder, "llvm.x86.avx2.psign.b", _V32B, [_V32B, _V32B]), [b, a])
        p16 = builder.call(_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16S, [_V32B, _V32B]), [absa, sb])
        sc = builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(_i32, 16), [j0] * 8 + [j1] * 8))
        if m == VNNI:
            return builder.call(_fn(builder, "llvm.x86.avx512.vpdpwssd.256", _V8I, [_V8I, _V16S, _V16S]), [acc, p16, sc])
        return builder.add(acc, builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [_V16S, _V16S]), [p16, sc]))

    return sig, cg


@intrinsic
def q2_scales(typingctx, a, off):
    """i16x16 of the 16 Q2_K sub-block scales (low nibbles of the 16 bytes at ``off``)."""
    _check_array(a, _BYTES)
    sig = v16s(a, off)

    def cg(context, builder, sig, args):
        raw = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _V16B), align=1)
        return builder.zext(builder.and_(raw, ir.Constant(_V16B, [15] * 16)), _V16S)

    return sig, cg


@intrinsic
def q3_scales_m32(typingctx, u0, u1, u2, u3):
    """i16x16 of the 16 Q3_K scales minus 32 from q3_K_scales' four words (byte s % 4 of word s // 4)."""
    sig = v16s(u0, u1, u2, u3)

    def cg(context, builder, sig, args):
        v = ir.Constant(ir.VectorType(_i32, 4), None)
        for j, x in enumerate(args):
            w = x.type.width
            x = builder.trunc(x, _i32) if w > 32 else builder.zext(x, _i32) if w < 32 else x
            v = builder.insert_element(v, x, ir.Constant(_i32, j))
        s = builder.zext(builder.bitcast(v, _V16B), _V16S)
        return builder.sub(s, ir.Constant(_V16S, [32] * 16))

    return sig, cg


@intrinsic
def iq4_xs_scales(typingctx, a, off):
    """i16x16, lanes 0-7 = ls_j - 32 of the IQ4_XS super-block at byte ``off`` (6-bit scales: low
    nibbles at off + 4, two high bits each in the u16 at off + 2), lanes 8-15 a copy."""
    _check_array(a, _BYTES)
    sig = v16s(a, off)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        pl = builder.bitcast(builder.gep(ary.data, [builder.add(args[1], ir.Constant(args[1].type, 4))]),
                             ir.VectorType(ir.IntType(8), 4).as_pointer())
        ph = builder.bitcast(builder.gep(ary.data, [builder.add(args[1], ir.Constant(args[1].type, 2))]), _i16.as_pointer())
        V8S = ir.VectorType(_i16, 8)
        lo4 = builder.load(pl, align=1)
        lo8 = builder.zext(builder.shuffle_vector(lo4, lo4, ir.Constant(ir.VectorType(_i32, 8), [0, 0, 1, 1, 2, 2, 3, 3])), V8S)
        lo = builder.and_(builder.lshr(lo8, ir.Constant(V8S, [0, 4] * 4)), ir.Constant(V8S, [15] * 8))
        h = builder.load(ph, align=1)
        hv = builder.insert_element(ir.Constant(V8S, None), h, ir.Constant(_i32, 0))
        hv = builder.shuffle_vector(hv, hv, ir.Constant(ir.VectorType(_i32, 8), [0] * 8))
        hi = builder.shl(builder.and_(builder.lshr(hv, ir.Constant(V8S, [0, 2, 4, 6, 8, 10, 12, 14])),
                                      ir.Constant(V8S, [3] * 8)), ir.Constant(V8S, [4] * 8))
        s8 = builder.sub(builder.or_(lo, hi), ir.Constant(V8S, [32] * 8))
        return builder.shuffle_vector(s8, s8, ir.Constant(ir.VectorType(_i32, 16), list(range(8)) * 2))

    return sig, cg


def kernels(mode: int, per_row: dict) -> dict:
    """{type name: (matvec, matmat)} of Q2_K, Q3_K, Q4_0, IQ4_NL, IQ4_XS for one instruction-set mode:
    the grouped-rows matvec, with ``per_row``'s (the family modules' table) matvec for the rows after
    the last whole group and its matmat unchanged."""
    repacks_q2 = mode == VNNI

    # ------------------------------------------------------------------ Q4_0 / IQ4_NL, repacked order
    def make_q0_rows8(unpack, bsz, shift, signed):
        @numba.njit(inline="always")
        def lanes(m, u, x):
            if signed:
                return dot_ss(mode, i_zero(), u, x)
            return dot_us(mode, m, u, x)

        @numba.njit(**_NB)
        def rows8(w, xp, out, r0, r1):
            """ggml_gemv_q4_0_8x8_q8_0's order (see repack.q4_0_repacked) for rows r0.. in groups of 8."""
            xq, xd, n4 = xp
            nb = xd.shape[0]
            rb = w.shape[1]
            wf = w.reshape(-1)
            ns = (n4 << shift).astype(np.int32)
            i = r0
            while i + 8 <= r1:
                acc = f_zero()
                for b in range(nb):
                    o = i * rb + b * bsz
                    x = load_b32(xq, b * 32)
                    m = load_i8(ns, b * 8)
                    s = reduce8(lanes(m, unpack(wf, o), x), lanes(m, unpack(wf, o + rb), x),
                                lanes(m, unpack(wf, o + 2 * rb), x), lanes(m, unpack(wf, o + 3 * rb), x),
                                lanes(m, unpack(wf, o + 4 * rb), x), lanes(m, unpack(wf, o + 5 * rb), x),
                                lanes(m, unpack(wf, o + 6 * rb), x), lanes(m, unpack(wf, o + 7 * rb), x))
                    acc = fmadd_v(acc, s, f_scale(gather_f16x8(wf, o, rb), xd[b]))
                store_f32x8(out, i, acc)
                i += 8
        return rows8

    @numba.njit(inline="always")
    def u_q4_0(w, o):
        return load_nib(w, o + 2)

    @numba.njit(inline="always")
    def u_iq4_nl(w, o):
        return lut_iq4nl(load_nib(w, o + 2))

    q4_0_rows8 = make_q0_rows8(u_q4_0, 18, 3, False)
    iq4_nl_rows8 = make_q0_rows8(u_iq4_nl, 18, 0, True)

    # ------------------------------------------------------------------ Q4_0, vec_dot order (rows % 8 != 0)
    @numba.njit(**_NB)
    def q4_0_vec4(w, xp, out, r0, r1):
        """ggml_vec_dot_q4_0_q8_0's order (legacy_quants.make_offset_matvec), 4 rows interleaved."""
        xq, xd, n4 = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        ns = (n4 << 3).astype(np.int32)
        i = r0
        while i + 4 <= r1:
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            for b in range(nb):
                o = i * rb + b * 18
                x = load_b32(xq, b * 32)
                m = load_i8(ns, b * 8)
                a0 = fmadd_i(a0, dot_us(mode, m, load_nib(wf, o + 2), x), f16_to_f32(wf, o) * xd[b])
                a1 = fmadd_i(a1, dot_us(mode, m, load_nib(wf, o + rb + 2), x), f16_to_f32(wf, o + rb) * xd[b])
                a2 = fmadd_i(a2, dot_us(mode, m, load_nib(wf, o + 2 * rb + 2), x), f16_to_f32(wf, o + 2 * rb) * xd[b])
                a3 = fmadd_i(a3, dot_us(mode, m, load_nib(wf, o + 3 * rb + 2), x), f16_to_f32(wf, o + 3 * rb) * xd[b])
            out[i] = hsum_f(a0); out[i + 1] = hsum_f(a1); out[i + 2] = hsum_f(a2); out[i + 3] = hsum_f(a3)
            i += 4

    # ------------------------------------------------------------------ IQ4_NL, vec_dot order (rows % 8 != 0)
    @numba.njit(inline="always")
    def nl_blk(wf, o, x):
        return dot_ss(mode, i_zero(), lut_iq4nl(load_nib(wf, o + 2)), x)

    @numba.njit(inline="always")
    def nl_row(a1, a2, wf, o, x0, x1, d0, d1):
        a1 = fmadd_i(a1, nl_blk(wf, o, x0), d0 * f16_to_f32(wf, o))
        a2 = fmadd_i(a2, nl_blk(wf, o + 18, x1), d1 * f16_to_f32(wf, o + 18))
        return a1, a2

    @numba.njit(inline="always")
    def nl_end(a1, a2, wf, o, xq, xo, d, odd):
        s = hsum_f(f_add(a1, a2))
        if odd:
            s = fma_s(d * f16_to_f32(wf, o), f32(hsum_i(nl_blk(wf, o, load_b32(xq, xo)))), s)
        return s

    @numba.njit(**_NB)
    def iq4_nl_vec4(w, xp, out, r0, r1):
        """ggml_vec_dot_iq4_nl_q8_0's order (i_quants.vec_matvec: blocks in pairs into two f32x8
        accumulators, a last odd block by a scalar FMA), 4 rows interleaved."""
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        i = r0
        while i + 4 <= r1:
            p0 = f_zero(); q0 = f_zero(); p1 = f_zero(); q1 = f_zero()
            p2 = f_zero(); q2 = f_zero(); p3 = f_zero(); q3 = f_zero()
            b = 0
            while b + 1 < nb:
                o = i * rb + b * 18
                x0 = load_b32(xq, b * 32)
                x1 = load_b32(xq, b * 32 + 32)
                d0 = xd[b]; d1 = xd[b + 1]
                p0, q0 = nl_row(p0, q0, wf, o, x0, x1, d0, d1)
                p1, q1 = nl_row(p1, q1, wf, o + rb, x0, x1, d0, d1)
                p2, q2 = nl_row(p2, q2, wf, o + 2 * rb, x0, x1, d0, d1)
                p3, q3 = nl_row(p3, q3, wf, o + 3 * rb, x0, x1, d0, d1)
                b += 2
            odd = b < nb
            o = i * rb + b * 18
            d = xd[b] if odd else f32(0.0)
            out[i] = nl_end(p0, q0, wf, o, xq, b * 32, d, odd)
            out[i + 1] = nl_end(p1, q1, wf, o + rb, xq, b * 32, d, odd)
            out[i + 2] = nl_end(p2, q2, wf, o + 2 * rb, xq, b * 32, d, odd)
            out[i + 3] = nl_end(p3, q3, wf, o + 3 * rb, xq, b * 32, d, odd)
            i += 4

    # ------------------------------------------------------------------ Q2_K
    @numba.njit(inline="always")
    def q2_quarter(acc, raw, xq, xo, sv, i, j0, j1):
        return madd_sv(mode, acc, b_and(b_shr(raw, 2 * i), 3), load_b32(xq, xo + 32 * i), sv, j0, j1)

    @numba.njit(inline="always")
    def q2_lanes(wf, o, xq, xo):
        """i32x8 of the scaled part of the Q2_K super-block at o: the lanes of k_quants.q2_K_half(0) +
        q2_K_half(1) (exact), with the scales picked from one i16x16 vector."""
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

    @numba.njit(**_NB)
    def q2_K_rows8(w, xp, out, r0, r1):
        """ggml_gemv_q2_K_8x8_q8_K's order (k_quants.q2_K_gemv: a scalar chain for the scaled part and
        one for the mins, one FMA each per super-block, out = acc - accm), 8 rows in lanes."""
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        i = r0
        while i + 8 <= r1:
            acc = f_zero()
            accm = f_zero()
            for b in range(nb):
                o = i * rb + b * 84
                xo = b * 256
                bo = b * 16
                s = reduce8(q2_lanes(wf, o, xq, xo), q2_lanes(wf, o + rb, xq, xo),
                            q2_lanes(wf, o + 2 * rb, xq, xo), q2_lanes(wf, o + 3 * rb, xq, xo),
                            q2_lanes(wf, o + 4 * rb, xq, xo), q2_lanes(wf, o + 5 * rb, xq, xo),
                            q2_lanes(wf, o + 6 * rb, xq, xo), q2_lanes(wf, o + 7 * rb, xq, xo))
                mn = reduce8(q2_mins_lanes(wf, o, xb, bo), q2_mins_lanes(wf, o + rb, xb, bo),
                             q2_mins_lanes(wf, o + 2 * rb, xb, bo), q2_mins_lanes(wf, o + 3 * rb, xb, bo),
                             q2_mins_lanes(wf, o + 4 * rb, xb, bo), q2_mins_lanes(wf, o + 5 * rb, xb, bo),
                             q2_mins_lanes(wf, o + 6 * rb, xb, bo), q2_mins_lanes(wf, o + 7 * rb, xb, bo))
                acc = fmadd_v(acc, s, f_scale(gather_f16x8(wf, o + 80, rb), xd[b]))
                accm = fmadd_v(accm, mn, f_scale(gather_f16x8(wf, o + 82, rb), xd[b]))
            store_f32x8(out, i, f_sub(acc, accm))
            i += 8

    @numba.njit(inline="always")
    def q2_vec_blk(acc, wf, o, xq, xo, xb, bo, dx):
        acc = fmadd_i(acc, q2_mins_lanes(wf, o, xb, bo), -dx * f16_to_f32(wf, o + 82))
        return fmadd_i(acc, q2_lanes(wf, o, xq, xo), dx * f16_to_f32(wf, o + 80))

    @numba.njit(**_NB)
    def q2_K_vec4(w, xp, out, r0, r1):
        """ggml_vec_dot_q2_K_q8_K's order (k_quants.q2_K_vec: per super-block the mins' FMA with
        -d_x * dmin, then the scaled lanes' FMA with d_x * d_w, hsum at the end), 4 rows interleaved."""
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        i = r0
        while i + 4 <= r1:
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            for b in range(nb):
                o = i * rb + b * 84
                dx = xd[b]
                a0 = q2_vec_blk(a0, wf, o, xq, b * 256, xb, b * 16, dx)
                a1 = q2_vec_blk(a1, wf, o + rb, xq, b * 256, xb, b * 16, dx)
                a2 = q2_vec_blk(a2, wf, o + 2 * rb, xq, b * 256, xb, b * 16, dx)
                a3 = q2_vec_blk(a3, wf, o + 3 * rb, xq, b * 256, xb, b * 16, dx)
            out[i] = hsum_f(a0); out[i + 1] = hsum_f(a1); out[i + 2] = hsum_f(a2); out[i + 3] = hsum_f(a3)
            i += 4

    # ------------------------------------------------------------------ Q3_K (always the vec_dot order)
    @numba.njit(inline="always")
    def q3_quarter(acc, raw, hm, xq, xo, sv, j, i, s0, s1):
        q = b_add(b_or(b_and(b_shr(raw, 2 * i), 3), b_shl(b_and(b_shr(hm, 4 * j + i), 1), 2)), 252)
        return madd_svs(mode, acc, q, load_b32(xq, xo + 32 * i), sv, s0, s1)

    @numba.njit(inline="always")
    def q3_lanes(wf, o, xq, xo):
        """The i32x8 lanes of k_quants.q3_K_lanes (exact), scales as one i16x16 vector."""
        u0, u1, u2, u3 = q3_K_scales(wf, o)
        sv = q3_scales_m32(u0, u1, u2, u3)
        hm = load_b32(wf, o)
        raw = load_b32(wf, o + 32)
        a = q3_quarter(i_zero(), raw, hm, xq, xo, sv, 0, 0, 0, 1)
        a = q3_quarter(a, raw, hm, xq, xo, sv, 0, 1, 2, 3)
        a = q3_quarter(a, raw, hm, xq, xo, sv, 0, 2, 4, 5)
        a = q3_quarter(a, raw, hm, xq, xo, sv, 0, 3, 6, 7)
        raw = load_b32(wf, o + 64)
        a = q3_quarter(a, raw, hm, xq, xo + 128, sv, 1, 0, 8, 9)
        a = q3_quarter(a, raw, hm, xq, xo + 128, sv, 1, 1, 10, 11)
        a = q3_quarter(a, raw, hm, xq, xo + 128, sv, 1, 2, 12, 13)
        return q3_quarter(a, raw, hm, xq, xo + 128, sv, 1, 3, 14, 15)

    @numba.njit(**_NB)
    def q3_K_vec4(w, xp, out, r0, r1):
        """ggml_vec_dot_q3_K_q8_K's order (k_quants.q3_K_dot), 4 rows interleaved."""
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        i = r0
        while i + 4 <= r1:
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            for b in range(nb):
                o = i * rb + b * 110
                xo = b * 256
                dx = xd[b]
                a0 = fmadd_i(a0, q3_lanes(wf, o, xq, xo), dx * f16_to_f32(wf, o + 108))
                a1 = fmadd_i(a1, q3_lanes(wf, o + rb, xq, xo), dx * f16_to_f32(wf, o + rb + 108))
                a2 = fmadd_i(a2, q3_lanes(wf, o + 2 * rb, xq, xo), dx * f16_to_f32(wf, o + 2 * rb + 108))
                a3 = fmadd_i(a3, q3_lanes(wf, o + 3 * rb, xq, xo), dx * f16_to_f32(wf, o + 3 * rb + 108))
            out[i] = hsum_f(a0); out[i + 1] = hsum_f(a1); out[i + 2] = hsum_f(a2); out[i + 3] = hsum_f(a3)
            i += 4

    # ------------------------------------------------------------------ IQ4_XS (always the vec_dot order)
    @numba.njit(inline="always")
    def xs_sub(acc, wf, o, xq, xo, sv, j):
        return madd_svs(mode, acc, lut_iq4nl(load_nib(wf, o + 8 + 16 * j)), load_b32(xq, xo + 32 * j), sv, j, j)

    @numba.njit(inline="always")
    def xs_lanes(wf, o, xq, xo):
        """The i32x8 lanes of i_quants.xs_lanes (exact): sign trick, pmaddubsw, then pmaddwd by the
        sub-block scale (ggml's order of integer operations), scales as one i16x16 vector."""
        sv = iq4_xs_scales(wf, o)
        a = xs_sub(i_zero(), wf, o, xq, xo, sv, 0)
        a = xs_sub(a, wf, o, xq, xo, sv, 1)
        a = xs_sub(a, wf, o, xq, xo, sv, 2)
        a = xs_sub(a, wf, o, xq, xo, sv, 3)
        a = xs_sub(a, wf, o, xq, xo, sv, 4)
        a = xs_sub(a, wf, o, xq, xo, sv, 5)
        a = xs_sub(a, wf, o, xq, xo, sv, 6)
        return xs_sub(a, wf, o, xq, xo, sv, 7)

    @numba.njit(**_NB)
    def iq4_xs_vec4(w, xp, out, r0, r1):
        """ggml_vec_dot_iq4_xs_q8_K's order (i_quants.xs_dot), 4 rows interleaved."""
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        i = r0
        while i + 4 <= r1:
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            for b in range(nb):
                o = i * rb + b * 136
                xo = b * 256
                dx = xd[b]
                a0 = fmadd_i(a0, xs_lanes(wf, o, xq, xo), f16_to_f32(wf, o) * dx)
                a1 = fmadd_i(a1, xs_lanes(wf, o + rb, xq, xo), f16_to_f32(wf, o + rb) * dx)
                a2 = fmadd_i(a2, xs_lanes(wf, o + 2 * rb, xq, xo), f16_to_f32(wf, o + 2 * rb) * dx)
                a3 = fmadd_i(a3, xs_lanes(wf, o + 3 * rb, xq, xo), f16_to_f32(wf, o + 3 * rb) * dx)
            out[i] = hsum_f(a0); out[i + 1] = hsum_f(a1); out[i + 2] = hsum_f(a2); out[i + 3] = hsum_f(a3)
            i += 4

    # ------------------------------------------------------------------ dispatch
    q4_0_row = per_row["Q4_0"][0]
    iq4_nl_row = per_row["IQ4_NL"][0]
    q2_K_row = per_row["Q2_K"][0]
    q3_K_row = per_row["Q3_K"][0]
    iq4_xs_row = per_row["IQ4_XS"][0]

    @numba.njit(**_NB)
    def q4_0_matvec(w, xp, out, r0, r1):
        if w.shape[0] % 8 == 0:   # llama.cpp's repacked q4_0_8x8 gemv
            r = r0 + (r1 - r0) // 8 * 8
            q4_0_rows8(w, xp, out, r0, r)
        else:
            r = r0 + (r1 - r0) // 4 * 4
            q4_0_vec4(w, xp, out, r0, r)
        q4_0_row(w, xp, out, r, r1)

    @numba.njit(**_NB)
    def iq4_nl_matvec(w, xp, out, r0, r1):
        if w.shape[0] % 8 == 0:   # llama.cpp's repacked iq4_nl_8x8 gemv
            r = r0 + (r1 - r0) // 8 * 8
            iq4_nl_rows8(w, xp, out, r0, r)
        else:   # (4 rows interleaved measured slower than the per-row code: not used)
            r = r0
        iq4_nl_row(w, xp, out, r, r1)

    @numba.njit(**_NB)
    def q2_K_matvec(w, xp, out, r0, r1):
        if repacks_q2 and w.shape[0] % 8 == 0:   # llama.cpp's repacked q2_K_8x8 gemv (AVX-512)
            r = r0 + (r1 - r0) // 8 * 8
            q2_K_rows8(w, xp, out, r0, r)
        else:
            r = r0 + (r1 - r0) // 4 * 4
            q2_K_vec4(w, xp, out, r0, r)
        q2_K_row(w, xp, out, r, r1)

    @numba.njit(**_NB)
    def q3_K_matvec(w, xp, out, r0, r1):
        r = r0 + (r1 - r0) // 4 * 4
        q3_K_vec4(w, xp, out, r0, r)
        q3_K_row(w, xp, out, r, r1)

    @numba.njit(**_NB)
    def iq4_xs_matvec(w, xp, out, r0, r1):
        r = r0 + (r1 - r0) // 4 * 4
        iq4_xs_vec4(w, xp, out, r0, r)
        iq4_xs_row(w, xp, out, r, r1)

    return dict(Q4_0=(q4_0_matvec, per_row["Q4_0"][1]), IQ4_NL=(iq4_nl_matvec, per_row["IQ4_NL"][1]),
                Q2_K=(q2_K_matvec, per_row["Q2_K"][1]), Q3_K=(q3_K_matvec, per_row["Q3_K"][1]),
                IQ4_XS=(iq4_xs_matvec, per_row["IQ4_XS"][1]))

"""Integer dot products of quantized weights and activations, and the steps that scale them.

The 8-lane (ymm) dots take a compile-time ``mode`` (`llvm_ir.AVX2`: pmaddubsw / pmaddwd;
`llvm_ir.VNNI`: vpdpbusd / vpdpwssd); the 16-lane ones are AVX-512 VNNI only: the prompt products of
Q3_K, IQ4_XS and Q5_K keep 16 weight rows in the lanes of a zmm register
(`x86.repack.rows16_tiled`), each instruction doing twice the ymm kernel's work."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..llvm_ir import (AVX2, BYTE_DTYPES, check_array, declare, array_ptr, f32_vector_type, literal_mode, ll,
                       load_at_arg, splat, to_i32, v16f, v16i, v16s, v8i, VNNI)


def _dpbusd(builder, mode, acc, a, b):
    """acc + sum of 4 adjacent u8(a)*s8(b) products per i32 lane."""
    if mode == VNNI:
        f = declare(builder, "llvm.x86.avx512.vpdpbusd.256", ll.v8i32, [ll.v8i32, ll.v32i8, ll.v32i8])
        return builder.call(f, [acc, a, b])
    if mode == AVX2:
        mub = declare(builder, "llvm.x86.avx2.pmadd.ub.sw", ll.v16i16, [ll.v32i8, ll.v32i8])
        mwd = declare(builder, "llvm.x86.avx2.pmadd.wd", ll.v8i32, [ll.v16i16, ll.v16i16])
        p16 = builder.call(mub, [a, b])
        return builder.add(acc, builder.call(mwd, [p16, ir.Constant(ll.v16i16, [1] * 16)]))
    raise ValueError(f"mode {mode}")


def add_word_products(builder, mode: int, acc, words, scales):
    """acc + per i32 lane the two adjacent i16 products words * scales (i32x8 acc, i16x16 words and
    scales): vpdpwssd on VNNI, pmaddwd and an add on AVX2."""
    if mode == VNNI:
        f = declare(builder, "llvm.x86.avx512.vpdpwssd.256", ll.v8i32, [ll.v8i32, ll.v16i16, ll.v16i16])
        return builder.call(f, [acc, words, scales])
    mwd = declare(builder, "llvm.x86.avx2.pmadd.wd", ll.v8i32, [ll.v16i16, ll.v16i16])
    return builder.add(acc, builder.call(mwd, [words, scales]))


@intrinsic
def dot_us(typingctx, mode, acc, a, b):
    """acc (i32x8) + lane-wise dot of unsigned bytes a with signed bytes b (4 products per lane)."""
    m = literal_mode(mode)
    sig = v8i(mode, acc, a, b)
    return sig, lambda context, builder, sig, args: _dpbusd(builder, m, args[1], args[2], args[3])


@intrinsic
def dot_ss(typingctx, mode, acc, a, b):
    """Like dot_us for signed a (sign trick: |a| . (b * sign(a)); a = -128 is fine)."""
    m = literal_mode(mode)
    sig = v8i(mode, acc, a, b)

    def cg(context, builder, sig, args):
        a, b = args[2], args[3]
        zero = ir.Constant(ll.v32i8, [0] * 32)
        neg = builder.icmp_signed("<", a, zero)
        absa = builder.select(neg, builder.sub(zero, a), a)
        # b * sign(a) in one vpsignb (ggml's _mm256_sign_epi8), where LLVM made a compare, an xor and
        # a subtract of the select; it zeroes b where a == 0, which |a| = 0 multiplies away anyway
        sb = builder.call(declare(builder, "llvm.x86.avx2.psign.b", ll.v32i8, [ll.v32i8, ll.v32i8]), [b, a])
        return _dpbusd(builder, m, args[1], absa, sb)

    return sig, cg


@intrinsic
def dot_us16(typingctx, acc, a, b):
    """acc + the sums of 4 products of unsigned a and signed b bytes per int32 lane (vpdpbusd zmm)."""
    sig = v16i(acc, a, b)

    def cg(context, builder, sig, args):
        dp = declare(builder, "llvm.x86.avx512.vpdpbusd.512", ll.v16i32, [ll.v16i32, ll.v64i8, ll.v64i8])
        return builder.call(dp, [args[0], args[1], args[2]])

    return sig, cg


@intrinsic
def madd_sc(typingctx, mode, acc, a, b, s0, s1):
    """acc + scaled dot: elements 0-15 of u8(a).s8(b) weighted by int s0, elements 16-31 by s1.

    pmaddubsw (u8*s8 pairs -> i16, exact while |pair| < 32768: weights <= 63 here) followed by
    pmaddwd / vpdpwssd with the scales.
    """
    m = literal_mode(mode)
    sig = v8i(mode, acc, a, b, s0, s1)

    def cg(context, builder, sig, args):
        acc, a, b, s0, s1 = args[1:]
        s0 = builder.trunc(s0, ll.i16)
        s1 = builder.trunc(s1, ll.i16)
        sc = splat(builder, s0, ll.v16i16)
        for j in range(8, 16):
            sc = builder.insert_element(sc, s1, ir.Constant(ll.i32, j))
        mub = declare(builder, "llvm.x86.avx2.pmadd.ub.sw", ll.v16i16, [ll.v32i8, ll.v32i8])
        p16 = builder.call(mub, [a, b])
        return add_word_products(builder, m, acc, p16, sc)

    return sig, cg


@intrinsic
def madd_sc_s(typingctx, mode, acc, a, b, s0, s1):
    """madd_sc for signed a (sign trick: |a| . (b * sign(a)), exact while |a| * 128 * 2 < 32768):
    acc + per i32 lane, elements 0-15 of a.b weighted by int s0 and elements 16-31 by s1."""
    m = literal_mode(mode)
    sig = v8i(mode, acc, a, b, s0, s1)

    def cg(context, builder, sig, args):
        acc, a, b, s0, s1 = args[1:]
        zero = ir.Constant(ll.v32i8, [0] * 32)
        neg = builder.icmp_signed("<", a, zero)
        absa = builder.select(neg, builder.sub(zero, a), a)
        sb = builder.select(neg, builder.sub(zero, b), b)
        sc = splat(builder, builder.trunc(s0, ll.i16), ll.v16i16)
        s1 = builder.trunc(s1, ll.i16)
        for j in range(8, 16):
            sc = builder.insert_element(sc, s1, ir.Constant(ll.i32, j))
        p16 = builder.call(declare(builder, "llvm.x86.avx2.pmadd.ub.sw", ll.v16i16, [ll.v32i8, ll.v32i8]), [absa, sb])
        return add_word_products(builder, m, acc, p16, sc)

    return sig, cg


@intrinsic
def madd_sv(typingctx, mode, acc, a, b, sv, i0, i1):
    """madd_sc with the two scales taken from lanes i0, i1 (compile-time ints) of an i16x16 vector:
    one constant shuffle (vpermw / vpshufb) instead of moving scalars into a vector."""
    m = literal_mode(mode)
    if not isinstance(i0, types.IntegerLiteral) or not isinstance(i1, types.IntegerLiteral):
        raise TypingError("madd_sv lanes must be compile-time int constants")
    j0, j1 = i0.literal_value, i1.literal_value
    sig = v8i(mode, acc, a, b, sv, i0, i1)

    def cg(context, builder, sig, args):
        acc, a, b, sv = args[1:5]
        sc = builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(ll.i32, 16), [j0] * 8 + [j1] * 8))
        mub = declare(builder, "llvm.x86.avx2.pmadd.ub.sw", ll.v16i16, [ll.v32i8, ll.v32i8])
        p16 = builder.call(mub, [a, b])
        return add_word_products(builder, m, acc, p16, sc)

    return sig, cg


@intrinsic
def madd16(typingctx, mode, acc, a, b):
    """acc + pmaddwd(a, b): per i32 lane, lo16(a)*lo16(b) + hi16(a)*hi16(b) (vpdpwssd on VNNI)."""
    m = literal_mode(mode)
    sig = v8i(mode, acc, a, b)

    def cg(context, builder, sig, args):
        acc, a, b = args[1], builder.bitcast(args[2], ll.v16i16), builder.bitcast(args[3], ll.v16i16)
        return add_word_products(builder, m, acc, a, b)

    return sig, cg


@intrinsic
def madd_bcast16(typingctx, m, pv, bs, off):
    """m + vpdpwssd(pv, bs[off] in every dword): per lane lo16(pv) * lo16(b) + hi16(pv) * hi16(b),
    pv the rows' i16 pairs (i32x16), bs an int32 array of i16 pairs."""
    check_array(bs, (types.int32,))
    sig = v16i(m, pv, bs, off)

    def cg(context, builder, sig, args):
        v32s = ir.VectorType(ll.i16, 32)
        b = builder.load(array_ptr(context, builder, sig.args[2], args[2], args[3], ll.i32), align=4)
        f = declare(builder, "llvm.x86.avx512.vpdpwssd.512", ll.v16i32, [ll.v16i32, v32s, v32s])
        return builder.call(f, [args[0], builder.bitcast(args[1], v32s),
                                builder.bitcast(splat(builder, b, ll.v16i32), v32s)])

    return sig, cg


# `sub_dot16`'s dots alternate between this many accumulators (added at the end: exact in int32), so
# a sub-block's 8 dots per column are two dependency chains, not one (the reason is inferred: no
# performance counters in these VMs). Intel Xeon host (family 6 model 207), Q5_K (8 chunks),
# K = 2048, 512 columns, five alternating runs of kernels_bench: 256-270 -> 287-300 GFLOP/s; Q3_K
# (4 chunks) 245-255 against 238-260, no change measured.
SUB_DOT_CHAINS = 2


@intrinsic
def sub_dot16(typingctx, s, w, wo, xa, xo, sv, chunks):
    """s + sv * (16 rows' dot products of one sub-block of 4 * chunks elements, compile-time 4 or
    8): a vpdpbusd per chunk e of the rows' unsigned 4-byte chunks at w[wo + 64e] (dword r: row r)
    against the activation bytes xa[xo + 4e..+4] broadcast, times the rows' scales sv (i32x16,
    exact)."""
    check_array(w, BYTE_DTYPES)
    check_array(xa, BYTE_DTYPES)
    if not isinstance(chunks, types.IntegerLiteral):
        raise TypingError("sub_dot16: chunks must be a compile-time int")
    nch = chunks.literal_value
    sig = v16i(s, w, wo, xa, xo, sv, chunks)

    def cg(context, builder, sig, args):
        s, wa, wo, xa, xo, sv = args[:6]
        dp = declare(builder, "llvm.x86.avx512.vpdpbusd.512", ll.v16i32, [ll.v16i32, ll.v64i8, ll.v64i8])
        d = [ir.Constant(ll.v16i32, [0] * 16)] * SUB_DOT_CHAINS
        for e in range(nch):
            q = builder.load(array_ptr(context, builder, sig.args[1], wa, builder.add(wo, ir.Constant(wo.type, 64 * e)),
                                  ll.v64i8), align=1)
            x = builder.load(array_ptr(context, builder, sig.args[3], xa, builder.add(xo, ir.Constant(xo.type, 4 * e)),
                                  ll.i32), align=1)
            c = e % SUB_DOT_CHAINS
            d[c] = builder.call(dp, [d[c], q, builder.bitcast(splat(builder, x, ll.v16i32), ll.v64i8)])
        t = d[0]
        for c in range(1, SUB_DOT_CHAINS):
            t = builder.add(t, d[c])
        return builder.add(s, builder.mul(t, sv))

    return sig, cg


@intrinsic
def mins_dot(typingctx, m_lo, m_hi, xb, off):
    """sum_j m_j * (xb[off+2j] + xb[off+2j+1]) for the 8 mins packed as bytes of two uint32."""
    check_array(xb, (types.int32,))
    sig = types.int32(m_lo, m_hi, xb, off)

    def cg(context, builder, sig, args):
        V4B = ir.VectorType(ll.i8, 4)
        lo = builder.bitcast(builder.trunc(args[0], ll.i32) if args[0].type.width > 32 else args[0], V4B)
        hi = builder.bitcast(builder.trunc(args[1], ll.i32) if args[1].type.width > 32 else args[1], V4B)
        m8 = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(ll.i32, 8), list(range(8))))
        m16 = builder.shuffle_vector(m8, m8, ir.Constant(ir.VectorType(ll.i32, 16), [j // 2 for j in range(16)]))
        V16I = ir.VectorType(ll.i32, 16)
        m = builder.zext(m16, V16I)
        p = builder.load(array_ptr(context, builder, sig.args[2], args[2], args[3], V16I), align=4)
        red = declare(builder, "llvm.vector.reduce.add.v16i32", ll.i32, [V16I])
        return builder.call(red, [builder.mul(m, p)])

    return sig, cg


@intrinsic
def q6_offset(typingctx, sv, xb, off):
    """32 * (sc[2m] * bsum[2m] + sc[2m+1] * bsum[2m+1]) per i32 lane m (ggml's Q6_K per-lane offset):
    the 16 int32 bsums at xb[off] (|bsum| <= 16 * 127, exact in i16) times the i16x16 scales, pmaddwd."""
    check_array(xb, (types.int32,))
    sig = v8i(sv, xb, off)

    def cg(context, builder, sig, args):
        V16I = ir.VectorType(ll.i32, 16)
        bs = builder.load(array_ptr(context, builder, sig.args[1], args[1], args[2], V16I), align=4)
        bs16 = builder.trunc(bs, ll.v16i16)
        mwd = declare(builder, "llvm.x86.avx2.pmadd.wd", ll.v8i32, [ll.v16i16, ll.v16i16])
        return builder.shl(builder.call(mwd, [args[0], bs16]), ir.Constant(ll.v8i32, [5] * 8))

    return sig, cg


@intrinsic
def q2_mins_lanes(typingctx, a, off, xb, xoff):
    """i32x8, lane l = m[2l] * bsum[2l] + m[2l+1] * bsum[2l+1]: the 16 Q2_K mins (high nibbles of the 16
    bytes at a[off]) against the 16 int32 bsums at xb[xoff] as i16 (pmaddwd, like ggml's vec_dot)."""
    check_array(a, BYTE_DTYPES)
    check_array(xb, (types.int32,))
    sig = v8i(a, off, xb, xoff)

    def cg(context, builder, sig, args):
        V16I = ir.VectorType(ll.i32, 16)
        raw = load_at_arg(context, builder, sig, args, 0, ll.v16i8)
        m = builder.zext(builder.lshr(raw, ir.Constant(ll.v16i8, [4] * 16)), ll.v16i16)
        bs = builder.trunc(builder.load(array_ptr(context, builder, sig.args[2], args[2], args[3], V16I), align=4), ll.v16i16)
        return builder.call(declare(builder, "llvm.x86.avx2.pmadd.wd", ll.v8i32, [ll.v16i16, ll.v16i16]), [m, bs])

    return sig, cg


@intrinsic
def scales_k4(typingctx, u0, u1, u2, u3):
    """The 16 bytes of four uint32 (e.g. k4_scales' 6-bit scales and mins) -> i16x16, zero-extended."""
    sig = v16s(u0, u1, u2, u3)

    def cg(context, builder, sig, args):
        v = ir.Constant(ir.VectorType(ll.i32, 4), None)
        for j, a in enumerate(args):
            v = builder.insert_element(v, to_i32(builder, a), ir.Constant(ll.i32, j))
        return builder.zext(builder.bitcast(v, ll.v16i8), ll.v16i16)

    return sig, cg


@intrinsic
def scales_i8(typingctx, a, off):
    """16 signed bytes at ``off`` of a uint8/int8 array -> i16x16 (sign-extended; Q6_K scales)."""
    check_array(a, BYTE_DTYPES)
    sig = v16s(a, off)
    return sig, lambda context, builder, sig, args: builder.sext(load_at_arg(context, builder, sig, args, 0, ll.v16i8), ll.v16i16)


@intrinsic
def offset_step16(typingctx, acc, s, m, shift, dv, dx):
    """acc + (f32(s - (m << shift)) * dv) * dx per lane, the product rounded, the rest fused (f32x16
    acc, dv; i32x16 s, m; a compile-time shift; scalar dx): ggml's tiled matmul step of Q3_K
    (shift 2) and IQ4_XS (7), lane-wise."""
    if not isinstance(shift, types.IntegerLiteral):
        raise TypingError("offset_step16: shift must be a compile-time int")
    sh = shift.literal_value
    sig = v16f(acc, s, m, shift, dv, types.float32)

    def cg(context, builder, sig, args):
        acc, s, m, _sh, dv, dx = args
        v = builder.sub(s, builder.shl(m, ir.Constant(ll.v16i32, [sh] * 16)))
        t = builder.fmul(builder.sitofp(v, ll.v16f32), dv)
        f = declare(builder, "llvm.fma.v16f32", ll.v16f32, [ll.v16f32, ll.v16f32, ll.v16f32])
        return builder.call(f, [t, splat(builder, dx, ll.v16f32), acc])

    return sig, cg


@intrinsic
def tiled_min_step(typingctx, acc, s, dv, m, dmn, dx):
    """ggml's tiled matmul step of a type with mins, lane-wise (each lane an output row): r = f32(s)
    * dv; r = fma(dmn, f32(m), r) (dmn = -dmin); acc + r * dx fused (acc, dv, dmn f32x8 with i32x8
    s, m, or all 16 lanes wide; scalar dx) -- `k_quants`' k4_tiled per lane."""
    vt = f32_vector_type(acc, dv, dmn)
    sig = vt(acc, s, dv, m, dmn, types.float32)

    def cg(context, builder, sig, args):
        acc, s, dv, m, dmn, dx = args
        V = ll.vector(vt)
        f = declare(builder, f"llvm.fma.v{V.count}f32", V, [V, V, V])
        r = builder.fmul(builder.sitofp(s, V), dv)
        r = builder.call(f, [dmn, builder.sitofp(m, V), r])
        return builder.call(f, [r, splat(builder, dx, V), acc])

    return sig, cg


def dot_fma16(builder, init, q, x, sc, acc):
    """acc + float(vpdpbusd(init, q, x)) * sc, lane-wise (i32x16 init, i8x64 q and x, f32x16 sc
    and acc): the end of a pair of rows' block step (`pair_q45`, `x86.q5_pairs.pair_step`)."""
    dp = declare(builder, "llvm.x86.avx512.vpdpbusd.512", ll.v16i32, [ll.v16i32, ll.v64i8, ll.v64i8])
    lanes = builder.sitofp(builder.call(dp, [init, q, x]), ll.v16f32)
    f = declare(builder, "llvm.fma.v16f32", ll.v16f32, [ll.v16f32, ll.v16f32, ll.v16f32])
    return builder.call(f, [lanes, sc, acc])


def spread_scales(builder, h4, xs, lanes):
    """f32x16 of (h4[lanes[i]] * xs): h4 four halves (a pair's two block scales first), each
    converted and multiplied by the activation block's scale in an xmm register, then spread over
    the lanes with one permute (the same products as spreading first, a third fewer instructions:
    `x86.q5_pairs`, `x86.q8_pairs`)."""
    s4 = builder.fmul(builder.fpext(h4, ir.VectorType(ll.f32, 4)), splat(builder, xs, ir.VectorType(ll.f32, 4)))
    return builder.shuffle_vector(s4, s4, ir.Constant(ll.v16i32, lanes))

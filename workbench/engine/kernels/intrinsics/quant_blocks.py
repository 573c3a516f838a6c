"""Unpacking quantized blocks into vector lanes: nibbles, Q5's fifth bits, the IQ4_NL table,
Q8_0's offset quants, two rows of Q4_0 / Q5_0 in one zmm register, and the Q4_K / Q5_K / Q6_K
super-blocks in 512-bit lanes (with the IR helpers `x86.rows_lowbit` builds on)."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..llvm_ir import (BYTE_DTYPES, check_array, declare, array_ptr, literal_mode, ll, load_at_arg, splat, v16f,
                       v32b, v64b, v8i, VNNI)
from .dots import dot_fma16


#: IQ4_NL / IQ4_XS: the 16 non-linear 4-bit values (ggml's kvalues_iq4nl)
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@intrinsic
def lut_iq4nl(typingctx, v):
    """Bytes 0..15 of ``v`` -> the signed IQ4_NL values (vpshufb on the 16-entry table, like ggml)."""
    if v != v32b:
        raise TypingError("expected an i8x32 vector")
    sig = v32b(v)

    def cg(context, builder, sig, args):
        table = ir.Constant(ll.v32i8, [x & 0xFF for x in KVALUES_IQ4NL] * 2)
        f = declare(builder, "llvm.x86.avx2.pshuf.b", ll.v32i8, [ll.v32i8, ll.v32i8])
        return builder.call(f, [table, args[0]])

    return sig, cg


@intrinsic
def load_nib(typingctx, mode, a, off):
    """16 bytes at ``off`` -> 32 bytes: low nibbles (elements 0-15) then high nibbles (16-31)."""
    m = literal_mode(mode)
    check_array(a, BYTE_DTYPES)
    sig = v32b(mode, a, off)

    def cg(context, builder, sig, args):
        v = load_at_arg(context, builder, sig, args, 1, ll.v16i8)
        if m == VNNI:
            # broadcast the 16 bytes to both halves (vbroadcasti128), shift the high half's 32-bit
            # lanes right by 4 (vpsrlvd), mask: 3 instructions instead of 4
            both = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ll.i32, 32), list(range(16)) * 2))
            w = builder.lshr(builder.bitcast(both, ll.v8i32), ir.Constant(ll.v8i32, [0, 0, 0, 0, 4, 4, 4, 4]))
            return builder.and_(builder.bitcast(w, ll.v32i8), ir.Constant(ll.v32i8, [15] * 32))
        # AVX2-era cores run a variable shift of a ymm register slowly: shift the 16 bytes as xmm
        # (vpsrlw), join the halves (vinserti128), mask (ggml's bytes_from_nibbles_32).  Measured on
        # the AVX2 EPYC host, K = 640 from memory: Q5_0 4.0 -> 4.4, Q4_1 4.6 -> 5.0 GB/s
        v8s = ir.VectorType(ir.IntType(16), 8)
        hi = builder.bitcast(builder.lshr(builder.bitcast(v, v8s), ir.Constant(v8s, [4] * 8)), ll.v16i8)
        both = builder.shuffle_vector(v, hi, ir.Constant(ir.VectorType(ll.i32, 32), list(range(32))))
        return builder.and_(both, ir.Constant(ll.v32i8, [15] * 32))

    return sig, cg


@intrinsic
def load_bits16(typingctx, a, off):
    """u32 at ``off`` -> 32 bytes, byte j = 16 if bit j is set else 0 (the 5th bit of Q5_x quants)."""
    check_array(a, BYTE_DTYPES)
    sig = v32b(a, off)

    def cg(context, builder, sig, args):
        # i32 -> <32 x i1> is a mask register on AVX-512 (kmovd); LLVM expands it on AVX2
        v = load_at_arg(context, builder, sig, args, 0, ll.i32)
        nz = builder.bitcast(v, ir.VectorType(ll.i1, 32))
        return builder.select(nz, ir.Constant(ll.v32i8, [16] * 32), ir.Constant(ll.v32i8, [0] * 32))

    return sig, cg


def _unpack_q45x2(context, builder, wt, wa, o0, o1, q5):
    """The unsigned quants of the Q4_0 / Q5_0 blocks at bytes o0 and o1 of w (array type wt) in the
    low and high 256-bit halves of an i8x64 (each: the 16 nibble bytes low nibbles first, plus 16
    where the block's u32 of high bits has a bit (Q5_0)), and each block's first 8 (Q5_0) or 2
    (Q4_0) bytes as an integer: its scale in the low 16 bits."""
    nib = 6 if q5 else 2
    i64 = o0.type

    def at(o, extra, ty):
        return builder.load(array_ptr(context, builder, wt, wa, builder.add(o, ir.Constant(i64, extra)), ty), align=1)
    r0, r1 = at(o0, nib, ll.v16i8), at(o1, nib, ll.v16i8)
    q = builder.shuffle_vector(r0, r1, ir.Constant(ir.VectorType(ll.i32, 64), list(range(16)) * 2 + list(range(16, 32)) * 2))
    q = builder.lshr(builder.bitcast(q, ll.v16i32), ir.Constant(ll.v16i32, ([0] * 4 + [4] * 4) * 2))
    q = builder.and_(builder.bitcast(q, ll.v64i8), ir.Constant(ll.v64i8, [15] * 64))
    if not q5:
        return q, at(o0, 0, ll.i16), at(o1, 0, ll.i16)
    g0, g1 = at(o0, 0, ll.i64), at(o1, 0, ll.i64)   # scale and high bits of each block in one load
    lo = builder.and_(builder.lshr(g0, ir.Constant(ll.i64, 16)), ir.Constant(ll.i64, 0xFFFFFFFF))
    hi = builder.and_(builder.shl(g1, ir.Constant(ll.i64, 16)), ir.Constant(ll.i64, 0xFFFFFFFF00000000))
    m = builder.bitcast(builder.or_(lo, hi), ir.VectorType(ll.i1, 64))
    return builder.select(m, builder.add(q, ir.Constant(ll.v64i8, [16] * 64)), q), g0, g1


@intrinsic
def unpack_q45x2(typingctx, bits, w, o):
    """The unsigned quants of the Q4_0 (bits = 4) or Q5_0 (bits = 5) block at byte o of w in both
    256-bit halves of an i8x64 (`_unpack_q45x2`): one row's block against two columns at once."""
    if not isinstance(bits, types.IntegerLiteral) or bits.literal_value not in (4, 5):
        raise TypingError("unpack_q45x2: bits must be a compile-time 4 or 5")
    check_array(w, BYTE_DTYPES)
    sig = v64b(bits, w, o)

    def cg(context, builder, sig, args):
        return _unpack_q45x2(context, builder, sig.args[1], args[1], args[2], args[2], bits.literal_value == 5)[0]

    return sig, cg


def q8_offset_bytes(context, builder, sig, args, halves):
    q = load_at_arg(context, builder, sig, [args[0], builder.add(args[1], ir.Constant(args[1].type, 2))], 0, ll.v32i8)
    if halves == 2:
        q = builder.shuffle_vector(q, q, ir.Constant(ir.VectorType(ll.i32, 64), list(range(32)) * 2))
    return builder.xor(q, ir.Constant(ir.VectorType(ll.i8, 32 * halves), [-128] * (32 * halves)))


@intrinsic
def q8_offset(typingctx, w, o):
    """The 32 quants of the Q8_0 block at byte o of w as unsigned bytes q + 128 (an XOR of the sign
    bit; with group sums scaled by 128 as a dot's initial lanes the VNNI dot of them is the signed
    one: vpdpbusd does not saturate) (f32x8 form: i8x32)."""
    check_array(w, BYTE_DTYPES)
    return v32b(w, o), lambda context, builder, sig, args: q8_offset_bytes(context, builder, sig, args, 1)


@intrinsic
def q8_offset_x2(typingctx, w, o):
    """q8_offset's 32 bytes in both 256-bit halves of an i8x64 (one row's block against two columns)."""
    check_array(w, BYTE_DTYPES)
    return v64b(w, o), lambda context, builder, sig, args: q8_offset_bytes(context, builder, sig, args, 2)


# Q4_0 / Q5_0 one-token products on AVX-512: two rows' blocks of the same activation block in one
# 512-bit register, row 0 in lanes 0-7 and row 1 in lanes 8-15. Every lane does what the f32x8
# chain of its own row does (the same dot, conversion and fused multiply-add), so each row's bits
# are unchanged; the nibble unpacking, the dot, the conversion and the multiply-add are one
# instruction for both rows instead of one each. The AMD EPYC host (Zen 5) ran these products
# bound by their vector instructions (Q5_0 27.9 GB/s from the L2 and from memory alike).
@intrinsic
def pair_q45(typingctx, bits, acc, w, o0, o1, ns, nsoff, xq, xoff, xs):
    """acc + float(dot) * (d0 * xs | d1 * xs) for one block of two rows of Q4_0 (bits = 4) or Q5_0
    (bits = 5) starting at bytes o0 and o1 of w: lane-wise what `dot_us(VNNI, ns[nsoff..+8],
    unpack(w, o), xq[xoff..+32])` and `fmadd_i(acc, lanes, f16(w[o..o+2]) * xs)` give each row
    (unpack: the 16 nibble bytes at o + 2 (Q4_0) or o + 6 (Q5_0) low nibbles first, plus 16 where
    the u32 at o + 2 has a bit (Q5_0)).  The rows' scales are joined in a general register and
    converted and multiplied as one vector (f16 -> f32 is exact and each lane's product rounds as
    the scalar one), and the high bits are added under the mask in one masked add: four vector
    instructions fewer a block than two scalar conversions and products, their merge, and an OR
    with a blend."""
    if not isinstance(bits, types.IntegerLiteral) or bits.literal_value not in (4, 5):
        raise TypingError("pair_q45: bits must be a compile-time 4 or 5")
    q5 = bits.literal_value == 5
    check_array(w, BYTE_DTYPES)
    check_array(ns, (types.int32,))
    check_array(xq, BYTE_DTYPES)
    sig = v16f(bits, acc, w, o0, o1, ns, nsoff, xq, xoff, types.float32)

    def cg(context, builder, sig, args):
        _, acc, wa, o0, o1, nsa, nso, xa, xo, xs = args
        wt = sig.args[2]

        q, g0, g1 = _unpack_q45x2(context, builder, wt, wa, o0, o1, q5)
        if q5:
            d0, d1 = builder.trunc(g0, ll.i32), builder.trunc(g1, ll.i32)
        else:
            d0, d1 = builder.zext(g0, ll.i32), builder.zext(g1, ll.i32)
        d01 = builder.or_(builder.and_(d0, ir.Constant(ll.i32, 0xFFFF)), builder.shl(d1, ir.Constant(ll.i32, 16)))
        d2 = builder.fpext(builder.bitcast(d01, ir.VectorType(ll.f16, 2)), ir.VectorType(ll.f32, 2))
        sc = builder.fmul(builder.shuffle_vector(d2, d2, ir.Constant(ll.v16i32, [0] * 8 + [1] * 8)), splat(builder, xs, ll.v16f32))
        n8 = builder.load(array_ptr(context, builder, sig.args[5], nsa, nso, ll.v8i32), align=1)
        n16 = builder.shuffle_vector(n8, n8, ir.Constant(ll.v16i32, list(range(8)) * 2))
        x32 = builder.load(array_ptr(context, builder, sig.args[7], xa, xo, ll.v32i8), align=1)
        x64 = builder.shuffle_vector(x32, x32, ir.Constant(ir.VectorType(ll.i32, 64), list(range(32)) * 2))
        return dot_fma16(builder, n16, q, x64, sc, acc)

    return sig, cg


def both_halves(builder, at, arr, aty, base, off):
    """32 bytes at base + off in both 256-bit halves of a zmm register, as qwords."""
    v4 = at(arr, aty, base, off, ir.VectorType(ll.i64, 4))
    return builder.shuffle_vector(v4, v4, ir.Constant(ir.VectorType(ll.i32, 8), [0, 1, 2, 3] * 2))


def bits_per_half(builder, v, shifts, mask):
    """Bytes of (v >> shift) & mask, one shift per 256-bit half (v: qwords of `both_halves`)."""
    v8q = ir.VectorType(ll.i64, 8)
    sh = builder.lshr(v, ir.Constant(v8q, [shifts[0]] * 4 + [shifts[1]] * 4))
    return builder.and_(builder.bitcast(sh, ll.v64i8), ir.Constant(ll.v64i8, [mask] * 64))


def scale_words(builder, sv, s):
    """i16x32: scales s, s + 1, s + 2, s + 3 of the i16x16 `sv`, each over 8 words (the word
    products of four 16-weight sub-blocks, two 32-weight vectors)."""
    return builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(ll.i32, 32), [s] * 8 + [s + 1] * 8 + [s + 2] * 8
                                                      + [s + 3] * 8))


def word_ops(context, builder, o):
    """(at, pmaddubsw, vpdpwssd) of the 512-bit K-quant lanes: at(arr, aty, base, off, ty) loads a
    `ty` at byte base + off (a compile-time off) of an array."""
    v32s = ir.VectorType(ll.i16, 32)

    def at(arr, aty, base, off, ty):
        return builder.load(array_ptr(context, builder, aty, arr, builder.add(base, ir.Constant(o.type, off)), ty),
                            align=1)
    return (at, declare(builder, "llvm.x86.avx512.pmaddubs.w.512", v32s, [ll.v64i8, ll.v64i8]),
            declare(builder, "llvm.x86.avx512.vpdpwssd.512", ll.v16i32, [ll.v16i32, v32s, v32s]))


def fold16(builder, acc):
    """i32x16 -> i32x8: lane m + lane m + 8 (the two 32-weight vectors a zmm register held)."""
    v8 = ir.VectorType(ll.i32, 8)
    lo = builder.shuffle_vector(acc, acc, ir.Constant(v8, list(range(8))))
    return builder.add(lo, builder.shuffle_vector(acc, acc, ir.Constant(v8, list(range(8, 16)))))


@intrinsic
def q6_K_lanes512(typingctx, w, o, xq, xo):
    """The integer lanes sum_j sc_j * dot_j of the Q6_K super-block at byte o of w against the
    Q8_K quants at xq[xo..+256], unsigned quants (the -32 offset is `q6_offset`'s), in
    ggml_vec_dot_q6_K_q8_K's AVX2 lanes (lane m: bytes 4m..4m+3 of each of its eight 32-weight
    vectors). Two of those vectors a zmm register: each 64 low-bit bytes (ql0 | ql1) one load, the
    high bits broadcast to both halves and shifted per half, one pmaddubsw and one vpdpwssd a
    pair of sub-block pairs; the halves' lanes summed at the end. The sums are integers: the same
    lanes as the ymm code's, in ~30 % fewer instructions (AVX-512 BW / VNNI)."""
    check_array(w, BYTE_DTYPES)
    check_array(xq, BYTE_DTYPES)
    sig = v8i(w, o, xq, xo)

    def cg(context, builder, sig, args):
        wa, o, xa, xo = args
        v8q = ir.VectorType(ll.i64, 8)
        at, mub, dpw = word_ops(context, builder, o)
        sc16 = builder.sext(at(wa, sig.args[0], o, 192, ll.v16i8), ll.v16i16)
        m15, m48 = ir.Constant(ll.v64i8, [15] * 64), ir.Constant(ll.v64i8, [48] * 64)
        acc = ir.Constant(ll.v16i32, None)
        for h in range(2):
            ql = at(wa, sig.args[0], o, 64 * h, ll.v64i8)                      # ql0 | ql1
            qh = both_halves(builder, at, wa, sig.args[0], o, 128 + 32 * h)
            hi_lo = builder.and_(builder.bitcast(builder.shl(qh, ir.Constant(v8q, [4] * 4 + [2] * 4)), ll.v64i8), m48)
            q12 = builder.or_(builder.and_(ql, m15), hi_lo)                  # q1 | q2
            q34 = builder.or_(builder.and_(builder.lshr(ql, ir.Constant(ll.v64i8, [4] * 64)), m15),
                              bits_per_half(builder, qh, (0, 2), 48))               # q3 | q4
            for k, q in enumerate((q12, q34)):
                x = at(xa, sig.args[2], xo, 128 * h + 64 * k, ll.v64i8)
                sc = scale_words(builder, sc16, 8 * h + 4 * k)
                acc = builder.call(dpw, [acc, builder.call(mub, [q, x]), sc])
        return fold16(builder, acc)

    return sig, cg


@intrinsic
def k4_lanes512(typingctx, w, o, xq, xo, sv, q5):
    """The integer lanes sum_j sc_j * dot_j of the Q4_K (q5 = 0) or Q5_K (q5 = 1, compile-time)
    super-block at byte o of w against the Q8_K quants at xq[xo..+256], in
    ggml_vec_dot_q4_K_q8_K's / q5_K's AVX2 lanes; sv: the i16x16 scales (`scales_k4`). A 64-weight
    group a zmm register: its 32 nibble bytes broadcast, the low nibbles in one half and the high
    in the other (one shift, one AND), Q5_K's fifth bits as one test and one masked add, one
    pmaddubsw and one vpdpwssd; the halves' integer lanes summed at the end: the same integers."""
    if not isinstance(q5, types.IntegerLiteral):
        raise TypingError("k4_lanes512: q5 must be a compile-time 0 or 1")
    is_q5 = bool(q5.literal_value)
    check_array(w, BYTE_DTYPES)
    check_array(xq, BYTE_DTYPES)
    sig = v8i(w, o, xq, xo, sv, q5)

    def cg(context, builder, sig, args):
        wa, o, xa, xo, sv = args[:5]
        at, mub, dpw = word_ops(context, builder, o)

        qh = builder.bitcast(both_halves(builder, at, wa, sig.args[0], o, 16), ll.v64i8) if is_q5 else None
        zero = ir.Constant(ll.v64i8, [0] * 64)
        acc = ir.Constant(ll.v16i32, None)
        for jp in range(4):
            raw = both_halves(builder, at, wa, sig.args[0], o, (48 if is_q5 else 16) + 32 * jp)
            q = bits_per_half(builder, raw, (0, 4), 15)           # low nibbles | high nibbles
            if is_q5:   # bit 2jp of qh for the low nibbles, 2jp + 1 for the high: + 16
                bit = ir.Constant(ll.v64i8, [1 << (2 * jp)] * 32 + [1 << (2 * jp + 1)] * 32)
                m = builder.icmp_unsigned("!=", builder.and_(qh, bit), zero)
                q = builder.select(m, builder.add(q, ir.Constant(ll.v64i8, [16] * 64)), q)
            x = at(xa, sig.args[2], xo, 64 * jp, ll.v64i8)
            sc = builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(ll.i32, 32), [2 * jp] * 16 + [2 * jp + 1] * 16))
            acc = builder.call(dpw, [acc, builder.call(mub, [q, x]), sc])
        return fold16(builder, acc)

    return sig, cg

"""LLVM-level primitives for the kernels, exposed to Numba as intrinsics.

Scalar helpers (f16/bf16 conversion) are plain LLVM IR and used by every path.
The vector primitives work on 256-bit registers and take a compile-time ``mode``
(an int literal, captured as a closure constant by the kernel factories) selecting
the instruction set: PORTABLE (generic LLVM vector IR), AVX2 (pmaddubsw/pmaddwd/psign)
or VNNI (AVX512-VNNI vpdpbusd/vpdpwssd on ymm registers). LLVM folds the unused
branches away, so a kernel compiled for one mode never contains the others' opcodes.
"""
from __future__ import annotations

from llvmlite import ir
import numba
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic, models, register_model

from .cpu import cpu_vendor

PORTABLE = 0
AVX2 = 1
VNNI = 2

_i1 = ir.IntType(1)
_i8 = ir.IntType(8)
_i16 = ir.IntType(16)
_i32 = ir.IntType(32)
_i64 = ir.IntType(64)
_f32 = ir.FloatType()
_f16 = ir.HalfType()
_V32B = ir.VectorType(_i8, 32)
_V16B = ir.VectorType(_i8, 16)
_V16S = ir.VectorType(_i16, 16)
_V8I = ir.VectorType(_i32, 8)
_V8F = ir.VectorType(_f32, 8)
_V8H = ir.VectorType(_f16, 8)
_V8S = ir.VectorType(_i16, 8)


# ----------------------------------------------------------------------------- numba types
class VecType(types.Type):
    """An LLVM vector value held in a Numba variable (never boxed to Python)."""

    def __init__(self, kind: str):
        self.kind = kind
        super().__init__(name=f"simd.{kind}")


v32b = VecType("i8x32")
v8i = VecType("i32x8")
v8f = VecType("f32x8")
v16s = VecType("i16x16")
v4i = VecType("i32x4")
v4f = VecType("f32x4")
_V4I = ir.VectorType(_i32, 4)
_V4F = ir.VectorType(_f32, 4)
v16f = VecType("f32x16")   # two rows' f32x8 accumulators side by side in one zmm register (`pair_q45`)
v16i = VecType("i32x16")
v64b = VecType("i8x64")
_V16F = ir.VectorType(_f32, 16)
_V16I = ir.VectorType(_i32, 16)
_V64B = ir.VectorType(_i8, 64)
_LL = {"i8x32": _V32B, "i32x8": _V8I, "f32x8": _V8F, "i16x16": _V16S, "i32x4": _V4I, "f32x4": _V4F,
       "f32x16": _V16F, "i32x16": _V16I, "i8x64": _V64B}


@register_model(VecType)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _LL[fe_type.kind])


# ----------------------------------------------------------------------------- helpers
def _fn(builder, name, ret, args):
    m = builder.module
    f = m.globals.get(name)
    if f is None:
        f = ir.Function(m, ir.FunctionType(ret, args), name=name)
    return f


def _ptr(context, builder, aty, arr, off, vty):
    """Pointer to element ``off`` of a C-contiguous array, cast to ``vty*``."""
    ary = context.make_array(aty)(context, builder, arr)
    p = builder.gep(ary.data, [off])
    return builder.bitcast(p, vty.as_pointer())


def _mode(t) -> int:
    if not isinstance(t, types.IntegerLiteral):
        raise TypingError("simd mode must be a compile-time int constant")
    return t.literal_value


def _splat(builder, val, vty):
    undef = ir.Constant(vty, None)
    v = builder.insert_element(undef, val, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_i32, vty.count), [0] * vty.count))


def _check_array(a, dtypes):
    if not isinstance(a, types.Array) or a.dtype not in dtypes:
        raise TypingError(f"expected array of {dtypes}, got {a}")


_BYTES = (types.uint8, types.int8)


# ----------------------------------------------------------------------------- two rows in one zmm
# Q4_0 / Q5_0 one-token products on AVX-512: two rows' blocks of the same activation block in one
# 512-bit register, row 0 in lanes 0-7 and row 1 in lanes 8-15. Every lane does what the f32x8
# chain of its own row does (the same dot, conversion and fused multiply-add), so each row's bits
# are unchanged; the nibble unpacking, the dot, the conversion and the multiply-add are one
# instruction for both rows instead of one each. The AMD EPYC host (Zen 5) ran these products
# bound by their vector instructions (Q5_0 27.9 GB/s from the L2 and from memory alike).
@intrinsic
def f_zero16(typingctx):
    sig = v16f()
    return sig, lambda context, builder, sig, args: ir.Constant(_V16F, [0.0] * 16)


@intrinsic
def half_f(typingctx, v, h):
    """Lanes 8h..8h+7 of an f32x16 as f32x8 (h a compile-time 0 or 1): one row of a pair."""
    if not isinstance(h, types.IntegerLiteral):
        raise TypingError("half_f: the half must be a compile-time int")
    k = h.literal_value
    sig = v8f(v, h)

    def cg(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(_i32, 8), list(range(8 * k, 8 * k + 8))))

    return sig, cg


@numba.njit(inline="always")
def hsum16(v):
    """An f32x16's lanes summed as GCC's _mm512_reduce_add_ps: the high 8 lanes added to the low 8,
    then hsum_f's tree (ggml's reduction of a 16-lane F16 / F32 dot on the AVX-512 build)."""
    return hsum_f(f_add(half_f(v, 0), half_f(v, 1)))


def _unpack_q45x2(context, builder, wt, wa, o0, o1, q5):
    """The unsigned quants of the Q4_0 / Q5_0 blocks at bytes o0 and o1 of w (array type wt) in the
    low and high 256-bit halves of an i8x64 (each: the 16 nibble bytes low nibbles first, plus 16
    where the block's u32 of high bits has a bit (Q5_0)), and each block's first 8 (Q5_0) or 2
    (Q4_0) bytes as an integer: its scale in the low 16 bits."""
    nib = 6 if q5 else 2
    i64 = o0.type

    def at(o, extra, ty):
        return builder.load(_ptr(context, builder, wt, wa, builder.add(o, ir.Constant(i64, extra)), ty), align=1)
    r0, r1 = at(o0, nib, _V16B), at(o1, nib, _V16B)
    q = builder.shuffle_vector(r0, r1, ir.Constant(ir.VectorType(_i32, 64), list(range(16)) * 2 + list(range(16, 32)) * 2))
    q = builder.lshr(builder.bitcast(q, _V16I), ir.Constant(_V16I, ([0] * 4 + [4] * 4) * 2))
    q = builder.and_(builder.bitcast(q, _V64B), ir.Constant(_V64B, [15] * 64))
    if not q5:
        return q, at(o0, 0, _i16), at(o1, 0, _i16)
    g0, g1 = at(o0, 0, _i64), at(o1, 0, _i64)   # scale and high bits of each block in one load
    lo = builder.and_(builder.lshr(g0, ir.Constant(_i64, 16)), ir.Constant(_i64, 0xFFFFFFFF))
    hi = builder.and_(builder.shl(g1, ir.Constant(_i64, 16)), ir.Constant(_i64, 0xFFFFFFFF00000000))
    m = builder.bitcast(builder.or_(lo, hi), ir.VectorType(_i1, 64))
    return builder.select(m, builder.add(q, ir.Constant(_V64B, [16] * 64)), q), g0, g1


@intrinsic
def unpack_q45x2(typingctx, bits, w, o):
    """The unsigned quants of the Q4_0 (bits = 4) or Q5_0 (bits = 5) block at byte o of w in both
    256-bit halves of an i8x64 (`_unpack_q45x2`): one row's block against two columns at once."""
    if not isinstance(bits, types.IntegerLiteral) or bits.literal_value not in (4, 5):
        raise TypingError("unpack_q45x2: bits must be a compile-time 4 or 5")
    _check_array(w, _BYTES)
    sig = v64b(bits, w, o)

    def cg(context, builder, sig, args):
        return _unpack_q45x2(context, builder, sig.args[1], args[1], args[2], args[2], bits.literal_value == 5)[0]

    return sig, cg


def _q8_offset(context, builder, sig, args, halves):
    q = _arr_load(context, builder, sig, [args[0], builder.add(args[1], ir.Constant(args[1].type, 2))], 0, _V32B)
    if halves == 2:
        q = builder.shuffle_vector(q, q, ir.Constant(ir.VectorType(_i32, 64), list(range(32)) * 2))
    return builder.xor(q, ir.Constant(ir.VectorType(_i8, 32 * halves), [-128] * (32 * halves)))


@intrinsic
def q8_offset(typingctx, w, o):
    """The 32 quants of the Q8_0 block at byte o of w as unsigned bytes q + 128 (an XOR of the sign
    bit; with group sums scaled by 128 as a dot's initial lanes the VNNI dot of them is the signed
    one: vpdpbusd does not saturate) (f32x8 form: i8x32)."""
    _check_array(w, _BYTES)
    return v32b(w, o), lambda context, builder, sig, args: _q8_offset(context, builder, sig, args, 1)


@intrinsic
def q8_offset_x2(typingctx, w, o):
    """q8_offset's 32 bytes in both 256-bit halves of an i8x64 (one row's block against two columns)."""
    _check_array(w, _BYTES)
    return v64b(w, o), lambda context, builder, sig, args: _q8_offset(context, builder, sig, args, 2)


@intrinsic
def dot_us16(typingctx, acc, a, b):
    """acc + the sums of 4 products of unsigned a and signed b bytes per int32 lane (vpdpbusd zmm)."""
    sig = v16i(acc, a, b)

    def cg(context, builder, sig, args):
        dp = _fn(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I, [_V16I, _V64B, _V64B])
        return builder.call(dp, [args[0], args[1], args[2]])

    return sig, cg


# ----------------------------------------------------------------------------- 16 rows in zmm lanes
# The prompt products of Q3_K, IQ4_XS and Q5_K on AVX-512 VNNI keep 16 weight rows in the lanes of a zmm
# register (`repack.rows16_tiled`): each instruction of the ymm kernel's (8 rows) does twice the work.
# The rows' regrouping into lanes (`quants_unsigned`, `transpose_words`, `store_fields16`) serves
# the 8-row kernels too.
@intrinsic
def i_zero16(typingctx):
    sig = v16i()
    return sig, lambda context, builder, sig, args: ir.Constant(_V16I, [0] * 16)


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
    _check_array(w, _BYTES)
    _check_array(xa, _BYTES)
    if not isinstance(chunks, types.IntegerLiteral):
        raise TypingError("sub_dot16: chunks must be a compile-time int")
    nch = chunks.literal_value
    sig = v16i(s, w, wo, xa, xo, sv, chunks)

    def cg(context, builder, sig, args):
        s, wa, wo, xa, xo, sv = args[:6]
        dp = _fn(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I, [_V16I, _V64B, _V64B])
        d = [ir.Constant(_V16I, [0] * 16)] * SUB_DOT_CHAINS
        for e in range(nch):
            q = builder.load(_ptr(context, builder, sig.args[1], wa, builder.add(wo, ir.Constant(wo.type, 64 * e)),
                                  _V64B), align=1)
            x = builder.load(_ptr(context, builder, sig.args[3], xa, builder.add(xo, ir.Constant(xo.type, 4 * e)),
                                  _i32), align=1)
            c = e % SUB_DOT_CHAINS
            d[c] = builder.call(dp, [d[c], q, builder.bitcast(_splat(builder, x, _V16I), _V64B)])
        t = d[0]
        for c in range(1, SUB_DOT_CHAINS):
            t = builder.add(t, d[c])
        return builder.add(s, builder.mul(t, sv))

    return sig, cg


@intrinsic
def madd_bcast16(typingctx, m, pv, bs, off):
    """m + vpdpwssd(pv, bs[off] in every dword): per lane lo16(pv) * lo16(b) + hi16(pv) * hi16(b),
    pv the rows' i16 pairs (i32x16), bs an int32 array of i16 pairs."""
    _check_array(bs, (types.int32,))
    sig = v16i(m, pv, bs, off)

    def cg(context, builder, sig, args):
        v32s = ir.VectorType(_i16, 32)
        b = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], _i32), align=4)
        f = _fn(builder, "llvm.x86.avx512.vpdpwssd.512", _V16I, [_V16I, v32s, v32s])
        return builder.call(f, [args[0], builder.bitcast(args[1], v32s),
                                builder.bitcast(_splat(builder, b, _V16I), v32s)])

    return sig, cg


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
        v = builder.sub(s, builder.shl(m, ir.Constant(_V16I, [sh] * 16)))
        t = builder.fmul(builder.sitofp(v, _V16F), dv)
        f = _fn(builder, "llvm.fma.v16f32", _V16F, [_V16F, _V16F, _V16F])
        return builder.call(f, [t, _splat(builder, dx, _V16F), acc])

    return sig, cg


@intrinsic
def quants_unsigned(typingctx, w, o, t, to, kind):
    """The 256 quants of the Q3_K (kind 0), Q2_K (1), IQ4_XS (2), Q4_K (3) or Q5_K (4, compile-time)
    super-block at byte o of w as unsigned bytes in their natural order into t[to:to + 256] (Q3_K: q + 4,
    the low bits | the hmask bit << 2; Q2_K: 0..3; IQ4_XS: the grid value + 128; Q4_K: 0..15; Q5_K:
    0..31 with the fifth bit): the rows' side of `repack._repack_k16` / `_repack_q4_K` in 32-byte
    vectors (AVX2 and up) instead of 4 quants at a time."""
    _check_array(w, _BYTES)
    _check_array(t, _BYTES)
    if not isinstance(kind, types.IntegerLiteral) or kind.literal_value not in (0, 1, 2, 3, 4):
        raise TypingError("quants_unsigned: kind must be a compile-time 0..4")
    kd = kind.literal_value
    sig = types.void(w, o, t, to, kind)

    def cg(context, builder, sig, args):
        wa, o, ta, to = args[0], args[1], args[2], args[3]
        V4Q = ir.VectorType(_i64, 4)

        def ld(off, ty):
            return builder.load(_ptr(context, builder, sig.args[0], wa, builder.add(o, ir.Constant(o.type, off)), ty),
                                align=1)

        def st(off, v):
            builder.store(v, _ptr(context, builder, sig.args[2], ta, builder.add(to, ir.Constant(to.type, off)), _V32B),
                          align=1)

        def bits(v, shifts, mask):   # bytes of (v >> shift) & mask, the shift per 128-bit half
            sh = builder.lshr(builder.bitcast(v, V4Q), ir.Constant(V4Q, [shifts[0]] * 2 + [shifts[1]] * 2))
            return builder.and_(builder.bitcast(sh, _V32B), ir.Constant(_V32B, [mask] * 32))

        if kd == 2:
            table = ir.Constant(_V32B, [(x + 128) & 0xFF for x in KVALUES_IQ4NL] * 2)
            pshufb = _fn(builder, "llvm.x86.avx2.pshuf.b", _V32B, [_V32B, _V32B])
            for j in range(8):
                raw = ld(8 + 16 * j, _V16B)
                both = builder.shuffle_vector(raw, raw, ir.Constant(ir.VectorType(_i32, 32), list(range(16)) * 2))
                st(32 * j, builder.call(pshufb, [table, bits(both, (0, 4), 15)]))
            return context.get_dummy_value()
        if kd >= 3:   # Q4_K / Q5_K: 64 quants per 32 bytes, the low nibbles then the high
            qh = ld(16, _V32B) if kd == 4 else None
            for p in range(4):
                raw = ld((48 if kd == 4 else 16) + 32 * p, _V32B)
                lo, hi = bits(raw, (0, 0), 15), bits(raw, (4, 4), 15)
                if kd == 4:   # the fifth bits (bit 2p of qh: the low nibbles', 2p + 1: the high ones') as + 16
                    four = ir.Constant(_V32B, [4] * 32)
                    lo = builder.or_(lo, builder.shl(bits(qh, (2 * p, 2 * p), 1), four))
                    hi = builder.or_(hi, builder.shl(bits(qh, (2 * p + 1, 2 * p + 1), 1), four))
                st(64 * p, lo)
                st(64 * p + 32, hi)
            return context.get_dummy_value()
        hm = ld(0, _V32B) if kd == 0 else None
        for h in range(2):
            raw = ld((32 if kd == 0 else 16) + 32 * h, _V32B)
            for i in range(4):
                q = bits(raw, (2 * i, 2 * i), 3)
                if kd == 0:
                    hb = bits(hm, (4 * h + i, 4 * h + i), 1)
                    q = builder.or_(q, builder.shl(hb, ir.Constant(_V32B, [2] * 32)))
                st(128 * h + 32 * i, q)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def transpose_words(typingctx, src, so, dst, do, first, count, n):
    """The n x n dwords (n = 8 or 16) at byte so of src (row r: 4n bytes at so + 256 r) transposed:
    rows first .. first + count - 1 of the result (row c: dword c of every source row) to the bytes
    at do of dst, 4n each (all compile-time ints but the offsets): n loads, log2(n) rounds of n
    two-source permutes (round k swaps bit k of the row and column numbers), the stores."""
    _check_array(src, _BYTES)
    _check_array(dst, _BYTES)
    for v in (first, count, n):
        if not isinstance(v, types.IntegerLiteral):
            raise TypingError("transpose_words: first, count and n must be compile-time ints")
    c0, nc, nn = first.literal_value, count.literal_value, n.literal_value
    if nn not in (8, 16):
        raise TypingError("transpose_words: n must be 8 or 16")
    sig = types.void(src, so, dst, do, first, count, n)

    def cg(context, builder, sig, args):
        sa, so, da, do = args[:4]
        V = ir.VectorType(_i32, nn)
        rows = [builder.load(_ptr(context, builder, sig.args[0], sa, builder.add(so, ir.Constant(so.type, 256 * r)),
                                  V), align=1) for r in range(nn)]
        for k in range(nn.bit_length() - 1):
            m = 1 << k
            nxt = list(rows)
            for i in range(nn):
                if i & m:
                    continue
                j = i | m
                # new row i: column c from row i (bit k of c clear) or row j's column c - m;
                # new row j: row i's column c + m (bit k clear) or row j's column c (shuffle indices
                # 0..n-1: the first vector, n..2n-1: the second)
                lo = [c if not c & m else nn + c - m for c in range(nn)]
                hi = [c + m if not c & m else nn + c for c in range(nn)]
                nxt[i] = builder.shuffle_vector(rows[i], rows[j], ir.Constant(V, lo))
                nxt[j] = builder.shuffle_vector(rows[i], rows[j], ir.Constant(V, hi))
            rows = nxt
        for c in range(c0, c0 + nc):
            builder.store(rows[c], _ptr(context, builder, sig.args[2], da,
                                        builder.add(do, ir.Constant(do.type, 4 * nn * (c - c0))), V), align=1)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def store_fields16(typingctx, t, to, sv, pv):
    """A row's regrouping fields into a transpose's source row: the i16x16 sv sign-extended to 16
    int32 at byte to of t, the i16x16 pv (8 i16 pairs) at to + 64."""
    _check_array(t, _BYTES)
    sig = types.void(t, to, sv, pv)

    def cg(context, builder, sig, args):
        ta, to, sv, pv = args
        builder.store(builder.sext(sv, _V16I), _ptr(context, builder, sig.args[0], ta, to, _V16I), align=1)
        builder.store(pv, _ptr(context, builder, sig.args[0], ta, builder.add(to, ir.Constant(to.type, 64)), _V16S),
                      align=1)
        return context.get_dummy_value()

    return sig, cg


def _fma_int(name: str, vt: VecType, doc: str):
    """An intrinsic `name(acc, v, s)`: acc + f32(v) * s per lane, fused, in the float vector type
    vt (v the int32 lanes of the same count, s a vector of vt)."""
    ll = _LL[vt.kind]

    def fma(typingctx, acc, v, s):
        def cg(context, builder, sig, args):
            f = _fn(builder, f"llvm.fma.v{ll.count}f32", ll, [ll, ll, ll])
            return builder.call(f, [builder.sitofp(args[1], ll), args[2], args[0]])
        return vt(acc, v, s), cg
    fma.__name__ = fma.__qualname__ = name
    fma.__doc__ = doc
    return intrinsic(fma)




@intrinsic
def scale16(typingctx, a, off, s):
    """a[off:off + 16] * s (float32 array; each product rounded once, as the scalar one)."""
    _check_array(a, (types.float32,))
    sig = v16f(a, off, types.float32)

    def cg(context, builder, sig, args):
        return builder.fmul(_arr_load(context, builder, sig, args, 0, _V16F), _splat(builder, args[2], _V16F))

    return sig, cg


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
    _check_array(w, _BYTES)
    _check_array(ns, (types.int32,))
    _check_array(xq, _BYTES)
    sig = v16f(bits, acc, w, o0, o1, ns, nsoff, xq, xoff, types.float32)

    def cg(context, builder, sig, args):
        _, acc, wa, o0, o1, nsa, nso, xa, xo, xs = args
        wt = sig.args[2]

        q, g0, g1 = _unpack_q45x2(context, builder, wt, wa, o0, o1, q5)
        if q5:
            d0, d1 = builder.trunc(g0, _i32), builder.trunc(g1, _i32)
        else:
            d0, d1 = builder.zext(g0, _i32), builder.zext(g1, _i32)
        d01 = builder.or_(builder.and_(d0, ir.Constant(_i32, 0xFFFF)), builder.shl(d1, ir.Constant(_i32, 16)))
        d2 = builder.fpext(builder.bitcast(d01, ir.VectorType(_f16, 2)), ir.VectorType(_f32, 2))
        sc = builder.fmul(builder.shuffle_vector(d2, d2, ir.Constant(_V16I, [0] * 8 + [1] * 8)), _splat(builder, xs, _V16F))
        n8 = builder.load(_ptr(context, builder, sig.args[5], nsa, nso, _V8I), align=1)
        n16 = builder.shuffle_vector(n8, n8, ir.Constant(_V16I, list(range(8)) * 2))
        x32 = builder.load(_ptr(context, builder, sig.args[7], xa, xo, _V32B), align=1)
        x64 = builder.shuffle_vector(x32, x32, ir.Constant(ir.VectorType(_i32, 64), list(range(32)) * 2))
        return dot_fma16(builder, n16, q, x64, sc, acc)

    return sig, cg


def spread_scales(builder, h4, xs, lanes):
    """f32x16 of (h4[lanes[i]] * xs): h4 four halves (a pair's two block scales first), each
    converted and multiplied by the activation block's scale in an xmm register, then spread over
    the lanes with one permute (the same products as spreading first, a third fewer instructions:
    `x86.q5_pairs`, `x86.q8_pairs`)."""
    s4 = builder.fmul(builder.fpext(h4, ir.VectorType(_f32, 4)), _splat(builder, xs, ir.VectorType(_f32, 4)))
    return builder.shuffle_vector(s4, s4, ir.Constant(_V16I, lanes))


def dot_fma16(builder, init, q, x, sc, acc):
    """acc + float(vpdpbusd(init, q, x)) * sc, lane-wise (i32x16 init, i8x64 q and x, f32x16 sc
    and acc): the end of a pair of rows' block step (`pair_q45`, `x86.q5_pairs.pair_step`)."""
    dp = _fn(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I, [_V16I, _V64B, _V64B])
    lanes = builder.sitofp(builder.call(dp, [init, q, x]), _V16F)
    f = _fn(builder, "llvm.fma.v16f32", _V16F, [_V16F, _V16F, _V16F])
    return builder.call(f, [lanes, sc, acc])

# ----------------------------------------------------------------------------- scalar f16/bf16
@intrinsic
def f16_to_f32(typingctx, a, off):
    """Little-endian IEEE half at byte offset ``off`` of a uint8 array -> float32 (exact)."""
    _check_array(a, _BYTES)
    sig = types.float32(a, off)

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _f16)
        return builder.fpext(builder.load(p, align=1), _f32)

    return sig, cg


@intrinsic
def f16_lead(typingctx, a, off):
    """Like f16_to_f32 for a half that at least 6 more bytes follow (a block's leading scale): read as
    the first of four halves, one vcvtph2ps from memory instead of a vpinsrw and a vcvtph2ps.  Measured
    on the AVX2 EPYC host (Q8_0 matvec, K = 640, from memory): 9.1 -> 9.6 GB/s."""
    _check_array(a, _BYTES)
    sig = types.float32(a, off)

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(_f16, 4))
        f4 = builder.fpext(builder.load(p, align=1), ir.VectorType(_f32, 4))
        return builder.extract_element(f4, ir.Constant(_i32, 0))

    return sig, cg


@intrinsic
def bits_to_f32(typingctx, h):
    """uint16 half bits -> float32 (exact)."""
    sig = types.float32(h)

    def cg(context, builder, sig, args):
        v = builder.trunc(args[0], _i16) if args[0].type.width > 16 else args[0]
        return builder.fpext(builder.bitcast(v, _f16), _f32)

    return sig, cg


@intrinsic
def round_f16(typingctx, x):
    """Round float32 to the nearest half (ties to even, like F16C) and back to float32."""
    sig = types.float32(types.float32)

    def cg(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], _f16), _f32)

    return sig, cg


@intrinsic
def bf16_to_f32(typingctx, a, off):
    """bfloat16 at byte offset ``off`` of a uint8 array -> float32 (exact)."""
    _check_array(a, _BYTES)
    sig = types.float32(a, off)

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _i16)
        v = builder.zext(builder.load(p, align=1), _i32)
        return builder.bitcast(builder.shl(v, ir.Constant(_i32, 16)), _f32)

    return sig, cg


# ----------------------------------------------------------------------------- vector primitives
def _arr_load(context, builder, sig, llargs, idx, vty):
    return builder.load(_ptr(context, builder, sig.args[idx], llargs[idx], llargs[idx + 1], vty), align=1)


def _vector_load(name: str, vt: VecType, dtypes: tuple, doc: str):
    """An intrinsic `name(a, off)`: one unaligned load of the vector type vt at element `off` of an
    array of one of `dtypes` (a byte offset for byte arrays)."""
    ll = _LL[vt.kind]

    def load(typingctx, a, off):
        _check_array(a, dtypes)
        return vt(a, off), lambda context, builder, sig, args: _arr_load(context, builder, sig, args, 0, ll)
    load.__name__ = load.__qualname__ = name
    load.__doc__ = doc
    return intrinsic(load)


load_b32 = _vector_load("load_b32", v32b, _BYTES,
                         "32 bytes at element offset ``off`` of a uint8/int8 array (unaligned).")
load_i8 = _vector_load("load_i8", v8i, (types.int32,),
                        "8 int32 at element offset ``off`` of an int32 array.")
load_f32x8 = _vector_load("load_f32x8", v8f, _BYTES + (types.float32,),
                           "8 float32 at element ``off`` of a float32 array, or at byte ``off`` of a uint8 array.")
load_f32x16 = _vector_load("load_f32x16", v16f, _BYTES + (types.float32,),
                            "16 float32 at element ``off`` of a float32 array, or at byte ``off`` of a uint8 "
                            "array (one zmm load on AVX-512).")
load_b64 = _vector_load("load_b64", v64b, _BYTES,
                         "64 bytes at byte ``off`` of an int8 / uint8 array.")
load_i16 = _vector_load("load_i16", v16i, (types.int32,),
                         "16 int32 at element ``off`` of an int32 array.")
load_i32x4 = _vector_load("load_i32x4", v4i, (types.int32,),
                           "4 int32 at element ``off`` of an int32 array.")
load_f32x4 = _vector_load("load_f32x4", v4f, (types.float32,),
                           "4 float32 at element ``off`` of a float32 array.")


# Software prefetch for weight streams, measured on the EPYC host (one core, 64 MB from memory,
# medians): with rows of at most 2048 weights the kernels' per-row (or per 8-row group) reduction
# interrupts the stream often, and prefetching 4 KB ahead (about the memory latency at this speed)
# helped: Q4_K K=768 21.1 -> 24.4, K=1024 20.3 -> 24.2 GB/s; with longer rows the hardware
# prefetcher alone did better (Q4_K K=3072 25.5 -> 22.1, K=4096 21.3 -> 19.1 GB/s with it).
# Expert matrices (K = 768..2048) and small models' rows are in the first group.
PREFETCH_BYTES = 4096
PREFETCH_MAX_K = 2048
# The K-quant one-token products that read a super-block record at a time (Q6_K rows, Q4_K's 8-row
# x8 groups) prefetch every line of the record, nearer on Intel. Intel Xeon host, 1 core, 1 GB from
# memory, 2 MB pages: Q6_K (K = 2048) 10.5 GB/s at 4096 bytes ahead, 14.7-15.5 at 1024-1792, 9.9
# at 8192; Q4_K x8 (one prefetch per 1152-byte group before) 12.9 -> 15.1 with every line 1536
# ahead, 9.4 at 4096 (side by side in one process); in the caches 23 and 39 GB/s. Q5_0 / Q8_0
# (K = 640) did best at 4096 there too. The AMD EPYC hosts measured 4096 for Q4_K and Q6_K (above).
# Plain Q4_K rows (k4_rows, the dense Q4_K weights), every line of a block at this distance
# instead of two lines of its 144 bytes 4096 ahead: 640 x 1024 / 640 x 2048 matrices read cold, one
# after another (`kernels_bench.py --cold-rows 640`), 13.3 -> 14.8 / 13.0 -> 15.8 GB/s on the Intel
# Xeon host (unmeasured on AMD).
PREFETCH_NEAR = 1536 if cpu_vendor() == "GenuineIntel" else PREFETCH_BYTES
# The legacy one-token products (Q8_0, Q5_0, Q4_0 rows) with two streams per thread (below): 2048
# bytes ahead on Intel, where one stream had done best at 4096. Intel Xeon host, K = 640, 384 MB from
# memory, two alternating runs: Q8_0 17.75 -> 18.15 GB/s (2560: 17.8), Q5_0 15.25 -> 15.25.
PREFETCH_LEGACY = 2048 if cpu_vendor() == "GenuineIntel" else PREFETCH_BYTES


# Two streams per thread: a one-token product reads the rows of its range [r0, r1) from both halves
# in turn, a row (or a kernel's row group) of each. One core keeps more lines in flight along two
# streams than along one (the hardware prefetcher runs ahead of each; one stream's look-ahead
# bounds it). Intel Xeon host, Q8_0 K = 640 from memory, 1 GB, side by side: 1 thread 15.7 -> 16.8
# GB/s, 2 threads (a half each) 29.6 -> 32.9; alternating every row 18.0, every 8 rows (5.4 KB)
# 16.1, every 64 (43 KB) 15.0 against 16.0 for one stream; halves 5 KB apart 13.0, 21 KB 15.1,
# 85 KB and more 17.0-17.9 (four streams: 15.7). Below TWO_STREAMS_MIN bytes a half, one stream.
# AMD EPYC host (Zen 5, cpuinfo family 26), 2026-12-04, one stream -> two: Q8_0 K = 640 from memory
# (384 MB, two alternating runs) 35.7 / 37.4 -> 41.9 / 40.9 GB/s, Q5_0 27.5 / 27.6 -> 27.9 / 28.8;
# decode_profile --ab, three rounds: 1 thread 120.4 / 120.3 / 118.1 -> 124.3 / 122.8 / 122.7 t/s,
# 2 threads 169.2 / 158.7 / 152.1 -> 164.0 / 158.6 / 156.8 (noise). On everywhere (the AVX2-only
# EPYC kinds unmeasured).
TWO_STREAMS_MIN = 64 * 1024


@numba.njit(inline="always")
def stream_halves(r0: int, r1: int, unit: int, row_bytes: int, min_bytes: int = TWO_STREAMS_MIN) -> int:
    """Where the second stream of rows [r0, r1) starts: mid = r0 + a whole number of `unit`-row
    steps, at most half; a kernel reads rows mid - r0 steps long from r0 and mid in turn, then
    [2 * mid - r0, r1) alone. r0 (no pairs) when a half would be under min_bytes."""
    half = (r1 - r0) // (2 * unit) * unit
    if half * row_bytes < min_bytes:
        return r0
    return r0 + half


@numba.njit(inline="always")
def prime_streams(w, r0: int, mid: int, row_bytes: int, ahead: int) -> None:
    """Prefetch the first `ahead` bytes of the streams of rows [r0, ...) and [mid, ...) (mid == r0:
    one stream): a kernel that prefetches `ahead` bytes past the row it reads otherwise waits on
    every line of that first stretch, at each product's start."""
    a = r0 * row_bytes
    for off in range(a & ~63, a + ahead, 64):
        prefetch(w, off)
    if mid > r0:
        b = mid * row_bytes
        for off in range(b & ~63, b + ahead, 64):
            prefetch(w, off)


@numba.njit(inline="always")
def group_steps(r0: int, r1: int, unit: int, row_bytes: int, min_bytes: int = TWO_STREAMS_MIN):
    """For kernels reading groups of `unit` rows two at a time (a group of each half, row by row
    in turn): (pairs, steps) over the whole groups of [r0, r1): the first `pairs` steps take groups
    r0 + unit * s and mid + unit * s (mid = r0 + unit * pairs), the rest one group each
    (`step_groups`)."""
    n_groups = (r1 - r0) // unit
    n_pairs = (stream_halves(r0, r0 + unit * n_groups, unit, row_bytes, min_bytes) - r0) // unit
    return n_pairs, n_groups - n_pairs


@numba.njit(inline="always")
def step_groups(st: int, r0: int, mid: int, n_pairs: int, unit: int):
    """Step st of `group_steps`: (first row of group a, of group b, how many groups: 2 or 1)."""
    if st < n_pairs:
        return r0 + unit * st, mid + unit * st, 2
    return r0 + unit * (st + n_pairs), r0, 1


@numba.njit(inline="always")
def stream_row(j: int, r0: int, mid: int, unit: int) -> int:
    """The first row of the j-th step of `unit` rows a kernel reads of [r0, r1) split at mid
    (`stream_halves`): r0, mid, r0 + unit, mid + unit, ... while both halves last, then on in
    order (the rest of the second half). The kernels compute a step's row from j inside their own
    loop: a row function taking the arrays, inlined, kept numba's reference counting of each
    array around every call (Q8_0 in the caches 27 -> 11 GB/s)."""
    n2 = 2 * ((mid - r0) // unit)
    if j < n2:
        return (r0 if j % 2 == 0 else mid) + j // 2 * unit
    return r0 + j * unit


@numba.njit(inline="always")
def prefetch_distance(k: int) -> int:
    """How far ahead a matvec over rows of ``k`` weights prefetches: PREFETCH_LEGACY for short rows,
    0 for long ones (a hint for the line about to be read: the hardware prefetcher's stream alone).
    The kernels then prefetch unconditionally, once per step of their unrolled block loop: a test per
    32-weight block cost 7 of a Q5_0 block's 26 instructions (Intel Xeon host, 1 core from memory:
    Q5_0 12.7 GB/s before)."""
    return PREFETCH_LEGACY if k <= PREFETCH_MAX_K else 0


def _prefetch_t0(builder, p, write: bool = False) -> None:
    """prefetcht0 of the line holding i8* p (llvm.prefetch: read, keep in all levels, data);
    write: prefetchw (the line arrives owned, ready for a store)."""
    fn = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [ir.IntType(8).as_pointer(), _i32, _i32, _i32])
    builder.call(fn, [p, ir.Constant(_i32, int(write)), ir.Constant(_i32, 3), ir.Constant(_i32, 1)])


@intrinsic
def prefetch(typingctx, a, off):
    """Hint: bring the cache line at byte ``off`` of a uint8 array into the caches (prefetcht0).
    Never faults (a prefetch past the end of the array is dropped by the CPU)."""
    _check_array(a, _BYTES)
    sig = types.void(a, off)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        _prefetch_t0(builder, builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer()))
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def prefetch_at(typingctx, addr):
    """`prefetch` at a raw byte address (the crew's job tables hold addresses, not arrays); never
    faults, even where nothing is mapped."""
    def cg(context, builder, sig, args):
        _prefetch_t0(builder, builder.inttoptr(args[0], ir.IntType(8).as_pointer()))
        return context.get_dummy_value()

    return types.void(addr), cg


@intrinsic
def prefetch_write_at(typingctx, addr):
    """Hint: bring the line at a raw byte address into the caches for writing (prefetchw: it
    arrives owned, so a store there does not wait for it); never faults."""
    def cg(context, builder, sig, args):
        _prefetch_t0(builder, builder.inttoptr(args[0], ir.IntType(8).as_pointer()), write=True)
        return context.get_dummy_value()

    return types.void(addr), cg


@intrinsic
def load_nib(typingctx, mode, a, off):
    """16 bytes at ``off`` -> 32 bytes: low nibbles (elements 0-15) then high nibbles (16-31)."""
    m = _mode(mode)
    _check_array(a, _BYTES)
    sig = v32b(mode, a, off)

    def cg(context, builder, sig, args):
        v = _arr_load(context, builder, sig, args, 1, _V16B)
        if m == VNNI:
            # broadcast the 16 bytes to both halves (vbroadcasti128), shift the high half's 32-bit
            # lanes right by 4 (vpsrlvd), mask: 3 instructions instead of 4
            both = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, 32), list(range(16)) * 2))
            w = builder.lshr(builder.bitcast(both, _V8I), ir.Constant(_V8I, [0, 0, 0, 0, 4, 4, 4, 4]))
            return builder.and_(builder.bitcast(w, _V32B), ir.Constant(_V32B, [15] * 32))
        # AVX2-era cores run a variable shift of a ymm register slowly: shift the 16 bytes as xmm
        # (vpsrlw), join the halves (vinserti128), mask (ggml's bytes_from_nibbles_32).  Measured on
        # the AVX2 EPYC host, K = 640 from memory: Q5_0 4.0 -> 4.4, Q4_1 4.6 -> 5.0 GB/s
        v8s = ir.VectorType(ir.IntType(16), 8)
        hi = builder.bitcast(builder.lshr(builder.bitcast(v, v8s), ir.Constant(v8s, [4] * 8)), _V16B)
        both = builder.shuffle_vector(v, hi, ir.Constant(ir.VectorType(_i32, 32), list(range(32))))
        return builder.and_(both, ir.Constant(_V32B, [15] * 32))

    return sig, cg


@intrinsic
def load_bits16(typingctx, a, off):
    """u32 at ``off`` -> 32 bytes, byte j = 16 if bit j is set else 0 (the 5th bit of Q5_x quants)."""
    _check_array(a, _BYTES)
    sig = v32b(a, off)

    def cg(context, builder, sig, args):
        # i32 -> <32 x i1> is a mask register on AVX-512 (kmovd); LLVM expands it on AVX2
        v = _arr_load(context, builder, sig, args, 0, _i32)
        nz = builder.bitcast(v, ir.VectorType(_i1, 32))
        return builder.select(nz, ir.Constant(_V32B, [16] * 32), ir.Constant(_V32B, [0] * 32))

    return sig, cg


def _bytes_binop(opname):
    @intrinsic
    def op(typingctx, a, b):
        """a OP b per byte (i8x32, or i8x64 for the 16-lane kernels; b a vector of a's type or a scalar)."""
        if a not in (v32b, v64b):
            raise TypingError("expected an i8x32 or i8x64 vector")
        sig = a(a, b)

        def cg(context, builder, sig, args):
            rhs = args[1]
            if sig.args[1] != sig.args[0]:  # scalar: splat (runtime values allowed)
                rhs = _splat(builder, builder.trunc(rhs, _i8) if rhs.type.width > 8 else rhs, _LL[sig.args[0].kind])
            return getattr(builder, opname)(args[0], rhs)

        return sig, cg
    return op


b_and = _bytes_binop("and_")
b_or = _bytes_binop("or_")
b_shr = _bytes_binop("lshr")   # logical shift of unsigned bytes
b_shl = _bytes_binop("shl")
b_xor = _bytes_binop("xor")
b_add = _bytes_binop("add")  # wrapping byte add


@intrinsic
def i_zero(typingctx):
    sig = v8i()
    return sig, lambda context, builder, sig, args: ir.Constant(_V8I, [0] * 8)


@intrinsic
def f_zero(typingctx):
    sig = v8f()
    return sig, lambda context, builder, sig, args: ir.Constant(_V8F, [0.0] * 8)


@intrinsic
def i_shl(typingctx, v, n):
    sig = v8i(v, n)

    def cg(context, builder, sig, args):
        return builder.shl(args[0], _splat(builder, builder.trunc(args[1], _i32) if args[1].type.width > 32 else args[1], _V8I))

    return sig, cg


@intrinsic
def i_add0(typingctx, v, s):
    """Add integer scalar ``s`` to lane 0."""
    sig = v8i(v, s)

    def cg(context, builder, sig, args):
        s32 = builder.trunc(args[1], _i32) if args[1].type.width > 32 else builder.sext(args[1], _i32) if args[1].type.width < 32 else args[1]
        e = builder.extract_element(args[0], ir.Constant(_i32, 0))
        return builder.insert_element(args[0], builder.add(e, s32), ir.Constant(_i32, 0))

    return sig, cg


def _dpbusd(builder, mode, acc, a, b):
    """acc + sum of 4 adjacent u8(a)*s8(b) products per i32 lane."""
    if mode == VNNI:
        f = _fn(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I, [_V8I, _V32B, _V32B])
        return builder.call(f, [acc, a, b])
    if mode == AVX2:
        mub = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16S, [_V32B, _V32B])
        mwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [_V16S, _V16S])
        p16 = builder.call(mub, [a, b])
        return builder.add(acc, builder.call(mwd, [p16, ir.Constant(_V16S, [1] * 16)]))
    raise ValueError(f"mode {mode}")


@intrinsic
def dot_us(typingctx, mode, acc, a, b):
    """acc (i32x8) + lane-wise dot of unsigned bytes a with signed bytes b (4 products per lane)."""
    m = _mode(mode)
    sig = v8i(mode, acc, a, b)
    return sig, lambda context, builder, sig, args: _dpbusd(builder, m, args[1], args[2], args[3])


@intrinsic
def dot_ss(typingctx, mode, acc, a, b):
    """Like dot_us for signed a (sign trick: |a| . (b * sign(a)); a = -128 is fine)."""
    m = _mode(mode)
    sig = v8i(mode, acc, a, b)

    def cg(context, builder, sig, args):
        a, b = args[2], args[3]
        zero = ir.Constant(_V32B, [0] * 32)
        neg = builder.icmp_signed("<", a, zero)
        absa = builder.select(neg, builder.sub(zero, a), a)
        # b * sign(a) in one vpsignb (ggml's _mm256_sign_epi8), where LLVM made a compare, an xor and
        # a subtract of the select; it zeroes b where a == 0, which |a| = 0 multiplies away anyway
        sb = builder.call(_fn(builder, "llvm.x86.avx2.psign.b", _V32B, [_V32B, _V32B]), [b, a])
        return _dpbusd(builder, m, args[1], absa, sb)

    return sig, cg


@intrinsic
def madd_sc(typingctx, mode, acc, a, b, s0, s1):
    """acc + scaled dot: elements 0-15 of u8(a).s8(b) weighted by int s0, elements 16-31 by s1.

    pmaddubsw (u8*s8 pairs -> i16, exact while |pair| < 32768: weights <= 63 here) followed by
    pmaddwd / vpdpwssd with the scales.
    """
    m = _mode(mode)
    sig = v8i(mode, acc, a, b, s0, s1)

    def cg(context, builder, sig, args):
        acc, a, b, s0, s1 = args[1:]
        s0 = builder.trunc(s0, _i16)
        s1 = builder.trunc(s1, _i16)
        sc = _splat(builder, s0, _V16S)
        for j in range(8, 16):
            sc = builder.insert_element(sc, s1, ir.Constant(_i32, j))
        mub = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16S, [_V32B, _V32B])
        p16 = builder.call(mub, [a, b])
        if m == VNNI:
            f = _fn(builder, "llvm.x86.avx512.vpdpwssd.256", _V8I, [_V8I, _V16S, _V16S])
            return builder.call(f, [acc, p16, sc])
        mwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [_V16S, _V16S])
        return builder.add(acc, builder.call(mwd, [p16, sc]))

    return sig, cg


@intrinsic
def fmadd_i(typingctx, acc, v, s):
    """acc + float(v) * s  (f32x8, fused like ggml's _mm256_fmadd_ps)."""
    sig = v8f(acc, v, types.float32)

    def cg(context, builder, sig, args):
        f = _fn(builder, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
        return builder.call(f, [builder.sitofp(args[1], _V8F), _splat(builder, args[2], _V8F), args[0]])

    return sig, cg


def _f32_vec(*vs):
    """The vector type of float arguments that must agree (f32x8 or f32x16)."""
    if any(v != vs[0] for v in vs) or vs[0] not in (v8f, v16f):
        raise TypingError(f"expected f32x8 or f32x16 operands of one width, got {vs}")
    return vs[0]


@intrinsic
def fma_f(typingctx, acc, a, b):
    """acc + a * b (f32x8 or f32x16, fused)."""
    vt = _f32_vec(acc, a, b)
    sig = vt(acc, a, b)
    ll = _LL[vt.kind]

    def cg(context, builder, sig, args):
        f = _fn(builder, f"llvm.fma.v{ll.count}f32", ll, [ll, ll, ll])
        return builder.call(f, [args[1], args[2], args[0]])

    return sig, cg


@intrinsic
def load_f16x8(typingctx, a, off):
    """8 halves at byte ``off`` of a uint8 array -> f32x8 (vcvtph2ps)."""
    _check_array(a, _BYTES)
    sig = v8f(a, off)
    return sig, lambda context, builder, sig, args: builder.fpext(_arr_load(context, builder, sig, args, 0, _V8H), _V8F)


@intrinsic
def load_f16x16(typingctx, a, off):
    """16 halves at byte ``off`` of a uint8 array -> f32x16 (one vcvtph2ps zmm on AVX-512)."""
    _check_array(a, _BYTES)
    sig = v16f(a, off)
    return sig, lambda context, builder, sig, args: builder.fpext(
        _arr_load(context, builder, sig, args, 0, ir.VectorType(_f16, 16)), _V16F)


@intrinsic
def load_bf16x8(typingctx, a, off):
    """8 bfloat16 at byte ``off`` of a uint8 array -> f32x8 (exact: shift into the high half)."""
    _check_array(a, _BYTES)
    sig = v8f(a, off)

    def cg(context, builder, sig, args):
        v = builder.zext(_arr_load(context, builder, sig, args, 0, _V8S), _V8I)
        return builder.bitcast(builder.shl(v, ir.Constant(_V8I, [16] * 8)), _V8F)

    return sig, cg


@intrinsic
def hsum_f(typingctx, v):
    sig = types.float32(v)

    def cg(context, builder, sig, args):
        # pairwise tree (like ggml's hsum_float_8), no reassociation flags needed
        x = args[0]
        lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_i32, 4), [0, 1, 2, 3]))
        hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_i32, 4), [4, 5, 6, 7]))
        s4 = builder.fadd(lo, hi)
        a = builder.shuffle_vector(s4, s4, ir.Constant(ir.VectorType(_i32, 2), [0, 1]))
        b = builder.shuffle_vector(s4, s4, ir.Constant(ir.VectorType(_i32, 2), [2, 3]))
        s2 = builder.fadd(a, b)
        return builder.fadd(builder.extract_element(s2, ir.Constant(_i32, 0)),
                            builder.extract_element(s2, ir.Constant(_i32, 1)))

    return sig, cg


@intrinsic
def hsum_hadd_f(typingctx, v):
    """v's 8 lanes summed as ggml's GGML_F32x8_REDUCE ends: t_i = v_i + v_(i+4), then two
    _mm_hadd_ps, i.e. (t0 + t1) + (t2 + t3) (hsum_f pairs (t0 + t2) + (t1 + t3))."""
    sig = types.float32(v)

    def cg(context, builder, sig, args):
        x = args[0]
        lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_i32, 4), [0, 1, 2, 3]))
        hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_i32, 4), [4, 5, 6, 7]))
        t = builder.fadd(lo, hi)
        e = [builder.extract_element(t, ir.Constant(_i32, i)) for i in range(4)]
        return builder.fadd(builder.fadd(e[0], e[1]), builder.fadd(e[2], e[3]))

    return sig, cg


@intrinsic
def f_add(typingctx, a, b):
    """a + b (f32x8 or f32x16)."""
    sig = _f32_vec(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.fadd(args[0], args[1])


def _i32_vec(*vs):
    """The vector type of int32 arguments that must agree (i32x8 or i32x16)."""
    if any(v != vs[0] for v in vs) or vs[0] not in (v8i, v16i):
        raise TypingError(f"expected i32x8 or i32x16 operands of one width, got {vs}")
    return vs[0]


@intrinsic
def i_add(typingctx, a, b):
    """a + b (i32x8 or i32x16)."""
    sig = _i32_vec(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.add(args[0], args[1])


@intrinsic
def concat(typingctx, a, b):
    """a in the low half, b in the high half of a vector twice as wide (i32x8 -> i32x16, f32x8 ->
    f32x16, i8x32 -> i8x64): two 8-row groups side by side as 16 lanes (`k4_x8`'s gemm). A load
    operand becomes a vinserti64x4 / vinsertf64x4 from memory."""
    wide = {v8i: v16i, v8f: v16f, v32b: v64b}
    if a != b or a not in wide:
        raise TypingError(f"concat: expected two i32x8, f32x8 or i8x32 vectors, got {a}, {b}")
    sig = wide[a](a, b)

    def cg(context, builder, sig, args):
        n = _LL[sig.args[0].kind].count
        return builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(_i32, 2 * n), list(range(2 * n))))

    return sig, cg


@intrinsic
def ld_u32(typingctx, a, off):
    """Unaligned little-endian uint32 at byte ``off`` of a uint8 array (no index checks)."""
    _check_array(a, _BYTES)
    sig = types.uint32(a, off)
    return sig, lambda context, builder, sig, args: _arr_load(context, builder, sig, args, 0, _i32)


@intrinsic
def mins_dot(typingctx, m_lo, m_hi, xb, off):
    """sum_j m_j * (xb[off+2j] + xb[off+2j+1]) for the 8 mins packed as bytes of two uint32."""
    _check_array(xb, (types.int32,))
    sig = types.int32(m_lo, m_hi, xb, off)

    def cg(context, builder, sig, args):
        V4B = ir.VectorType(_i8, 4)
        lo = builder.bitcast(builder.trunc(args[0], _i32) if args[0].type.width > 32 else args[0], V4B)
        hi = builder.bitcast(builder.trunc(args[1], _i32) if args[1].type.width > 32 else args[1], V4B)
        m8 = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_i32, 8), list(range(8))))
        m16 = builder.shuffle_vector(m8, m8, ir.Constant(ir.VectorType(_i32, 16), [j // 2 for j in range(16)]))
        V16I = ir.VectorType(_i32, 16)
        m = builder.zext(m16, V16I)
        p = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], V16I), align=4)
        red = _fn(builder, "llvm.vector.reduce.add.v16i32", _i32, [V16I])
        return builder.call(red, [builder.mul(m, p)])

    return sig, cg


@intrinsic
def sdot16(typingctx, a, off, xb, xoff):
    """sum_j int8(a[off+j]) * xb[xoff+j] for j < 16 (int32 result)."""
    _check_array(a, _BYTES)
    _check_array(xb, (types.int32,))
    sig = types.int32(a, off, xb, xoff)

    def cg(context, builder, sig, args):
        V16I = ir.VectorType(_i32, 16)
        s = builder.sext(_arr_load(context, builder, sig, args, 0, _V16B), V16I)
        p = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], V16I), align=4)
        red = _fn(builder, "llvm.vector.reduce.add.v16i32", _i32, [V16I])
        return builder.call(red, [builder.mul(s, p)])

    return sig, cg


# ----------------------------------------------------------------------------- vector sub-block scales
def _to_i32(builder, v):
    w = v.type.width
    return builder.trunc(v, _i32) if w > 32 else builder.zext(v, _i32) if w < 32 else v


@intrinsic
def scales_k4(typingctx, u0, u1, u2, u3):
    """The 16 bytes of four uint32 (e.g. _k4_scales' 6-bit scales and mins) -> i16x16, zero-extended."""
    sig = v16s(u0, u1, u2, u3)

    def cg(context, builder, sig, args):
        v = ir.Constant(ir.VectorType(_i32, 4), None)
        for j, a in enumerate(args):
            v = builder.insert_element(v, _to_i32(builder, a), ir.Constant(_i32, j))
        return builder.zext(builder.bitcast(v, _V16B), _V16S)

    return sig, cg


@intrinsic
def scales_i8(typingctx, a, off):
    """16 signed bytes at ``off`` of a uint8/int8 array -> i16x16 (sign-extended; Q6_K scales)."""
    _check_array(a, _BYTES)
    sig = v16s(a, off)
    return sig, lambda context, builder, sig, args: builder.sext(_arr_load(context, builder, sig, args, 0, _V16B), _V16S)


@intrinsic
def madd_sv(typingctx, mode, acc, a, b, sv, i0, i1):
    """madd_sc with the two scales taken from lanes i0, i1 (compile-time ints) of an i16x16 vector:
    one constant shuffle (vpermw / vpshufb) instead of moving scalars into a vector."""
    m = _mode(mode)
    if not isinstance(i0, types.IntegerLiteral) or not isinstance(i1, types.IntegerLiteral):
        raise TypingError("madd_sv lanes must be compile-time int constants")
    j0, j1 = i0.literal_value, i1.literal_value
    sig = v8i(mode, acc, a, b, sv, i0, i1)

    def cg(context, builder, sig, args):
        acc, a, b, sv = args[1:5]
        sc = builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(_i32, 16), [j0] * 8 + [j1] * 8))
        mub = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16S, [_V32B, _V32B])
        p16 = builder.call(mub, [a, b])
        if m == VNNI:
            f = _fn(builder, "llvm.x86.avx512.vpdpwssd.256", _V8I, [_V8I, _V16S, _V16S])
            return builder.call(f, [acc, p16, sc])
        mwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [_V16S, _V16S])
        return builder.add(acc, builder.call(mwd, [p16, sc]))

    return sig, cg


def _both_halves(builder, at, arr, aty, base, off):
    """32 bytes at base + off in both 256-bit halves of a zmm register, as qwords."""
    v4 = at(arr, aty, base, off, ir.VectorType(_i64, 4))
    return builder.shuffle_vector(v4, v4, ir.Constant(ir.VectorType(_i32, 8), [0, 1, 2, 3] * 2))


def _bits(builder, v, shifts, mask):
    """Bytes of (v >> shift) & mask, one shift per 256-bit half (v: qwords of `_both_halves`)."""
    v8q = ir.VectorType(_i64, 8)
    sh = builder.lshr(v, ir.Constant(v8q, [shifts[0]] * 4 + [shifts[1]] * 4))
    return builder.and_(builder.bitcast(sh, _V64B), ir.Constant(_V64B, [mask] * 64))


def _scale_words(builder, sv, s):
    """i16x32: scales s, s + 1, s + 2, s + 3 of the i16x16 `sv`, each over 8 words (the word
    products of four 16-weight sub-blocks, two 32-weight vectors)."""
    return builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(_i32, 32), [s] * 8 + [s + 1] * 8 + [s + 2] * 8
                                                      + [s + 3] * 8))


def _word_ops(context, builder, o):
    """(at, pmaddubsw, vpdpwssd) of the 512-bit K-quant lanes: at(arr, aty, base, off, ty) loads a
    `ty` at byte base + off (a compile-time off) of an array."""
    v32s = ir.VectorType(_i16, 32)

    def at(arr, aty, base, off, ty):
        return builder.load(_ptr(context, builder, aty, arr, builder.add(base, ir.Constant(o.type, off)), ty),
                            align=1)
    return (at, _fn(builder, "llvm.x86.avx512.pmaddubs.w.512", v32s, [_V64B, _V64B]),
            _fn(builder, "llvm.x86.avx512.vpdpwssd.512", _V16I, [_V16I, v32s, v32s]))


@intrinsic
def q6_K_lanes512(typingctx, w, o, xq, xo):
    """The integer lanes sum_j sc_j * dot_j of the Q6_K super-block at byte o of w against the
    Q8_K quants at xq[xo..+256], unsigned quants (the -32 offset is `q6_offset`'s), in
    ggml_vec_dot_q6_K_q8_K's AVX2 lanes (lane m: bytes 4m..4m+3 of each of its eight 32-weight
    vectors). Two of those vectors a zmm register: each 64 low-bit bytes (ql0 | ql1) one load, the
    high bits broadcast to both halves and shifted per half, one pmaddubsw and one vpdpwssd a
    pair of sub-block pairs; the halves' lanes summed at the end. The sums are integers: the same
    lanes as the ymm code's, in ~30 % fewer instructions (AVX-512 BW / VNNI)."""
    _check_array(w, _BYTES)
    _check_array(xq, _BYTES)
    sig = v8i(w, o, xq, xo)

    def cg(context, builder, sig, args):
        wa, o, xa, xo = args
        v8q = ir.VectorType(_i64, 8)
        at, mub, dpw = _word_ops(context, builder, o)
        sc16 = builder.sext(at(wa, sig.args[0], o, 192, _V16B), _V16S)
        m15, m48 = ir.Constant(_V64B, [15] * 64), ir.Constant(_V64B, [48] * 64)
        acc = ir.Constant(_V16I, None)
        for h in range(2):
            ql = at(wa, sig.args[0], o, 64 * h, _V64B)                      # ql0 | ql1
            qh = _both_halves(builder, at, wa, sig.args[0], o, 128 + 32 * h)
            hi_lo = builder.and_(builder.bitcast(builder.shl(qh, ir.Constant(v8q, [4] * 4 + [2] * 4)), _V64B), m48)
            q12 = builder.or_(builder.and_(ql, m15), hi_lo)                  # q1 | q2
            q34 = builder.or_(builder.and_(builder.lshr(ql, ir.Constant(_V64B, [4] * 64)), m15),
                              _bits(builder, qh, (0, 2), 48))               # q3 | q4
            for k, q in enumerate((q12, q34)):
                x = at(xa, sig.args[2], xo, 128 * h + 64 * k, _V64B)
                sc = _scale_words(builder, sc16, 8 * h + 4 * k)
                acc = builder.call(dpw, [acc, builder.call(mub, [q, x]), sc])
        return _fold16(builder, acc)

    return sig, cg


def _fold16(builder, acc):
    """i32x16 -> i32x8: lane m + lane m + 8 (the two 32-weight vectors a zmm register held)."""
    v8 = ir.VectorType(_i32, 8)
    lo = builder.shuffle_vector(acc, acc, ir.Constant(v8, list(range(8))))
    return builder.add(lo, builder.shuffle_vector(acc, acc, ir.Constant(v8, list(range(8, 16)))))


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
    _check_array(w, _BYTES)
    _check_array(xq, _BYTES)
    sig = v8i(w, o, xq, xo, sv, q5)

    def cg(context, builder, sig, args):
        wa, o, xa, xo, sv = args[:5]
        at, mub, dpw = _word_ops(context, builder, o)

        qh = builder.bitcast(_both_halves(builder, at, wa, sig.args[0], o, 16), _V64B) if is_q5 else None
        zero = ir.Constant(_V64B, [0] * 64)
        acc = ir.Constant(_V16I, None)
        for jp in range(4):
            raw = _both_halves(builder, at, wa, sig.args[0], o, (48 if is_q5 else 16) + 32 * jp)
            q = _bits(builder, raw, (0, 4), 15)           # low nibbles | high nibbles
            if is_q5:   # bit 2jp of qh for the low nibbles, 2jp + 1 for the high: + 16
                bit = ir.Constant(_V64B, [1 << (2 * jp)] * 32 + [1 << (2 * jp + 1)] * 32)
                m = builder.icmp_unsigned("!=", builder.and_(qh, bit), zero)
                q = builder.select(m, builder.add(q, ir.Constant(_V64B, [16] * 64)), q)
            x = at(xa, sig.args[2], xo, 64 * jp, _V64B)
            sc = builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(_i32, 32), [2 * jp] * 16 + [2 * jp + 1] * 16))
            acc = builder.call(dpw, [acc, builder.call(mub, [q, x]), sc])
        return _fold16(builder, acc)

    return sig, cg


# ----------------------------------------------------------------------------- exact-order helpers
@intrinsic
def q6_offset(typingctx, sv, xb, off):
    """32 * (sc[2m] * bsum[2m] + sc[2m+1] * bsum[2m+1]) per i32 lane m (ggml's Q6_K per-lane offset):
    the 16 int32 bsums at xb[off] (|bsum| <= 16 * 127, exact in i16) times the i16x16 scales, pmaddwd."""
    _check_array(xb, (types.int32,))
    sig = v8i(sv, xb, off)

    def cg(context, builder, sig, args):
        V16I = ir.VectorType(_i32, 16)
        bs = builder.load(_ptr(context, builder, sig.args[1], args[1], args[2], V16I), align=4)
        bs16 = builder.trunc(bs, _V16S)
        mwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [_V16S, _V16S])
        return builder.shl(builder.call(mwd, [args[0], bs16]), ir.Constant(_V8I, [5] * 8))

    return sig, cg


@intrinsic
def i_sub(typingctx, a, b):
    sig = v8i(a, b)
    return sig, lambda context, builder, sig, args: builder.sub(args[0], args[1])


def _reduce_i32x8(op: str):
    """Codegen of an int32x8 -> int32 lane reduction (llvm.vector.reduce.<op>)."""
    def cg(context, builder, sig, args):
        return builder.call(_fn(builder, f"llvm.vector.reduce.{op}.v8i32", _i32, [_V8I]), [args[0]])
    return cg


@intrinsic
def hsum_i(typingctx, v):
    """Sum of the 8 int32 lanes (exact in int32 for these kernels)."""
    return types.int32(v), _reduce_i32x8("add")


@intrinsic
def fma_s(typingctx, a, b, c):
    """a * b + c in float32, rounded once (llvm.fma.f32: vfmadd on these CPUs)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def cg(context, builder, sig, args):
        f = _fn(builder, "llvm.fma.f32", _f32, [_f32, _f32, _f32])
        return builder.call(f, list(args))

    return sig, cg



# ----------------------------------------------------------------------------- 4-lane (one lane per column)
@intrinsic
def reduce4(typingctx, a, b, c, d):
    """i32x4 of the lane sums of four i32x8 vectors (exact integer sums)."""
    sig = v4i(a, b, c, d)

    def cg(context, builder, sig, args):
        def sh(x, y, idx):
            return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(_i32, len(idx)), idx))
        # transpose-and-add: pairs, then quads, then the two 128-bit halves
        ab = builder.add(sh(args[0], args[1], [0, 8, 2, 10, 4, 12, 6, 14]), sh(args[0], args[1], [1, 9, 3, 11, 5, 13, 7, 15]))
        cd = builder.add(sh(args[2], args[3], [0, 8, 2, 10, 4, 12, 6, 14]), sh(args[2], args[3], [1, 9, 3, 11, 5, 13, 7, 15]))
        q = builder.add(sh(ab, cd, [0, 1, 8, 9, 4, 5, 12, 13]), sh(ab, cd, [2, 3, 10, 11, 6, 7, 14, 15]))
        return builder.add(sh(q, q, [0, 1, 2, 3]), sh(q, q, [4, 5, 6, 7]))

    return sig, cg


@intrinsic
def f4_zero(typingctx):
    sig = v4f()
    return sig, lambda context, builder, sig, args: ir.Constant(_V4F, [0.0] * 4)


@intrinsic
def i4_mul_add(typingctx, a, s, b, t):
    """a * s + b * t (i32x4 vectors, int scalars s, t)."""
    sig = v4i(a, s, b, t)

    def cg(context, builder, sig, args):
        sv = _splat(builder, _to_i32(builder, args[1]), _V4I)
        tv = _splat(builder, _to_i32(builder, args[3]), _V4I)
        return builder.add(builder.mul(args[0], sv), builder.mul(args[2], tv))

    return sig, cg


@intrinsic
def f4_scale(typingctx, v, s):
    """v * s per lane (float32 products, each rounded once)."""
    sig = v4f(v, types.float32)
    return sig, lambda context, builder, sig, args: builder.fmul(_splat(builder, args[1], _V4F), args[0])


fma4_i = _fma_int("fma4_i", v4f, "acc + f32(v) * s per lane, fused (s an f32x4).")


@intrinsic
def fmadd_im(typingctx, acc, v, a, off):
    """acc + f32(v) * a[off] (f32x8, fused; a float32 array): the scale is a broadcast load, which
    AVX-512 folds into the FMA as an embedded-broadcast operand (no shuffle uop)."""
    _check_array(a, (types.float32,))
    sig = v8f(acc, v, a, off)

    def cg(context, builder, sig, args):
        f = _fn(builder, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
        s = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], _f32), align=4)
        return builder.call(f, [builder.sitofp(args[1], _V8F), _splat(builder, s, _V8F), args[0]])

    return sig, cg


@intrinsic
def store_f32x4(typingctx, a, off, v):
    """a[off:off + 4] = v (float32 array, f32x4)."""
    _check_array(a, (types.float32,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], args[1], _V4F), align=4)
        return context.get_dummy_value()

    return sig, cg


# ----------------------------------------------------------------------------- rows-in-lanes (one lane per row)

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
def store_i32x8(typingctx, a, off, v):
    """a[off:off + 8] = v (int32 array)."""
    _check_array(a, (types.int32,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], args[1], _V8I), align=4)
        return context.get_dummy_value()

    return sig, cg


def _bcast_b4(name: str, vt: VecType, lanes: ir.VectorType, doc: str):
    """An intrinsic `name(a, off)`: the 4 bytes at byte ``off`` of a uint8/int8 array repeated in every
    dword of a byte vector vt (a broadcast load: an embedded-broadcast operand of vpdpbusd on AVX-512)."""
    def bcast(typingctx, a, off):
        _check_array(a, _BYTES)

        def cg(context, builder, sig, args):
            v = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _i32), align=1)
            return builder.bitcast(_splat(builder, v, lanes), _LL[vt.kind])
        return vt(a, off), cg
    bcast.__name__ = bcast.__qualname__ = name
    bcast.__doc__ = doc
    return intrinsic(bcast)


bcast_b4 = _bcast_b4("bcast_b4", v32b, _V8I, "The 4 bytes at byte ``off`` in all 8 dwords of an i8x32.")
bcast_b4_16 = _bcast_b4("bcast_b4_16", v64b, _V16I, "The 4 bytes at byte ``off`` in all 16 dwords of an i8x64.")


@intrinsic
def bcast_i32(typingctx, a, off):
    """a[off] (int32 array) in all 8 lanes."""
    _check_array(a, (types.int32,))
    sig = v8i(a, off)

    def cg(context, builder, sig, args):
        v = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _i32), align=4)
        return _splat(builder, v, _V8I)

    return sig, cg


@intrinsic
def madd16(typingctx, mode, acc, a, b):
    """acc + pmaddwd(a, b): per i32 lane, lo16(a)*lo16(b) + hi16(a)*hi16(b) (vpdpwssd on VNNI)."""
    m = _mode(mode)
    sig = v8i(mode, acc, a, b)

    def cg(context, builder, sig, args):
        acc, a, b = args[1], builder.bitcast(args[2], _V16S), builder.bitcast(args[3], _V16S)
        if m == VNNI:
            return builder.call(_fn(builder, "llvm.x86.avx512.vpdpwssd.256", _V8I, [_V8I, _V16S, _V16S]), [acc, a, b])
        return builder.add(acc, builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [_V16S, _V16S]), [a, b]))

    return sig, cg


@intrinsic
def i_mul(typingctx, a, b):
    """a * b (i32x8 or i32x16)."""
    sig = _i32_vec(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.mul(args[0], args[1])


@intrinsic
def fmadd_v(typingctx, acc, v, s):
    """acc + f32(v) * s (f32x8 with i32x8 v, or f32x16 with i32x16 v; fused; s the per-lane scales)."""
    vt = _f32_vec(acc, s)
    if v != {v8f: v8i, v16f: v16i}[vt]:
        raise TypingError(f"fmadd_v: the int32 lanes must match {vt}, got {v}")
    sig = vt(acc, v, s)

    def cg(context, builder, sig, args):
        V = _LL[vt.kind]
        f = _fn(builder, f"llvm.fma.v{V.count}f32", V, [V, V, V])
        return builder.call(f, [builder.sitofp(args[1], V), args[2], args[0]])

    return sig, cg


@intrinsic
def fma_sv(typingctx, acc, v, dv, s):
    """acc + (f32(v) * dv) * s: the product f32(v) * dv rounded per lane, then fused with scalar s."""
    sig = v8f(acc, v, dv, types.float32)

    def cg(context, builder, sig, args):
        f = _fn(builder, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
        t = builder.fmul(builder.sitofp(args[1], _V8F), args[2])
        return builder.call(f, [t, _splat(builder, args[3], _V8F), args[0]])

    return sig, cg


@intrinsic
def tiled_min_step(typingctx, acc, s, dv, m, dmn, dx):
    """ggml's tiled matmul step of a type with mins, lane-wise (each lane an output row): r = f32(s)
    * dv; r = fma(dmn, f32(m), r) (dmn = -dmin); acc + r * dx fused (acc, dv, dmn f32x8 with i32x8
    s, m, or all 16 lanes wide; scalar dx) -- `k_quants`' k4_tiled per lane."""
    vt = _f32_vec(acc, dv, dmn)
    sig = vt(acc, s, dv, m, dmn, types.float32)

    def cg(context, builder, sig, args):
        acc, s, dv, m, dmn, dx = args
        V = _LL[vt.kind]
        f = _fn(builder, f"llvm.fma.v{V.count}f32", V, [V, V, V])
        r = builder.fmul(builder.sitofp(s, V), dv)
        r = builder.call(f, [dmn, builder.sitofp(m, V), r])
        return builder.call(f, [r, _splat(builder, dx, V), acc])

    return sig, cg


@intrinsic
def f_scale(typingctx, v, s):
    """v * s per lane (f32x8 or f32x16, each product rounded once)."""
    sig = _f32_vec(v)(v, types.float32)
    return sig, lambda context, builder, sig, args: builder.fmul(args[0], _splat(builder, args[1], _LL[sig.args[0].kind]))


@intrinsic
def f_sub(typingctx, a, b):
    """a - b (f32x8 or f32x16)."""
    sig = _f32_vec(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.fsub(args[0], args[1])


@intrinsic
def f_lane(typingctx, v, j):
    sig = types.float32(v, j)
    return sig, lambda context, builder, sig, args: builder.extract_element(args[0], _to_i32(builder, args[1]))


@intrinsic
def f4_sub(typingctx, a, b):
    sig = v4f(a, b)
    return sig, lambda context, builder, sig, args: builder.fsub(args[0], args[1])


@intrinsic
def f4_lane(typingctx, v, j):
    sig = types.float32(v, j)
    return sig, lambda context, builder, sig, args: builder.extract_element(args[0], _to_i32(builder, args[1]))


@intrinsic
def f4_make(typingctx, a, b, c, d):
    """f32x4 (a, b, c, d) from four float32 scalars."""
    sig = v4f(types.float32, types.float32, types.float32, types.float32)

    def cg(context, builder, sig, args):
        v = ir.Constant(_V4F, None)
        for j, s in enumerate(args):
            v = builder.insert_element(v, s, ir.Constant(_i32, j))
        return v

    return sig, cg


#: IQ4_NL / IQ4_XS: the 16 non-linear 4-bit values (ggml's kvalues_iq4nl)
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@intrinsic
def lut_iq4nl(typingctx, v):
    """Bytes 0..15 of ``v`` -> the signed IQ4_NL values (vpshufb on the 16-entry table, like ggml)."""
    if v != v32b:
        raise TypingError("expected an i8x32 vector")
    sig = v32b(v)

    def cg(context, builder, sig, args):
        table = ir.Constant(_V32B, [x & 0xFF for x in KVALUES_IQ4NL] * 2)
        f = _fn(builder, "llvm.x86.avx2.pshuf.b", _V32B, [_V32B, _V32B])
        return builder.call(f, [table, args[0]])

    return sig, cg


@intrinsic
def i_muls(typingctx, v, s):
    """v * s per i32 lane (i32x8 or i32x16; s an integer scalar; exact for these kernels' ranges)."""
    sig = _i32_vec(v)(v, s)

    def cg(context, builder, sig, args):
        return builder.mul(args[0], _splat(builder, _to_i32(builder, args[1]), _LL[sig.args[0].kind]))

    return sig, cg


@intrinsic
def madd_sc_s(typingctx, mode, acc, a, b, s0, s1):
    """madd_sc for signed a (sign trick: |a| . (b * sign(a)), exact while |a| * 128 * 2 < 32768):
    acc + per i32 lane, elements 0-15 of a.b weighted by int s0 and elements 16-31 by s1."""
    m = _mode(mode)
    sig = v8i(mode, acc, a, b, s0, s1)

    def cg(context, builder, sig, args):
        acc, a, b, s0, s1 = args[1:]
        zero = ir.Constant(_V32B, [0] * 32)
        neg = builder.icmp_signed("<", a, zero)
        absa = builder.select(neg, builder.sub(zero, a), a)
        sb = builder.select(neg, builder.sub(zero, b), b)
        sc = _splat(builder, builder.trunc(s0, _i16), _V16S)
        s1 = builder.trunc(s1, _i16)
        for j in range(8, 16):
            sc = builder.insert_element(sc, s1, ir.Constant(_i32, j))
        p16 = builder.call(_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16S, [_V32B, _V32B]), [absa, sb])
        if m == VNNI:
            return builder.call(_fn(builder, "llvm.x86.avx512.vpdpwssd.256", _V8I, [_V8I, _V16S, _V16S]), [acc, p16, sc])
        return builder.add(acc, builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [_V16S, _V16S]), [p16, sc]))

    return sig, cg


@intrinsic
def q2_mins_lanes(typingctx, a, off, xb, xoff):
    """i32x8, lane l = m[2l] * bsum[2l] + m[2l+1] * bsum[2l+1]: the 16 Q2_K mins (high nibbles of the 16
    bytes at a[off]) against the 16 int32 bsums at xb[xoff] as i16 (pmaddwd, like ggml's vec_dot)."""
    _check_array(a, _BYTES)
    _check_array(xb, (types.int32,))
    sig = v8i(a, off, xb, xoff)

    def cg(context, builder, sig, args):
        V16I = ir.VectorType(_i32, 16)
        raw = _arr_load(context, builder, sig, args, 0, _V16B)
        m = builder.zext(builder.lshr(raw, ir.Constant(_V16B, [4] * 16)), _V16S)
        bs = builder.trunc(builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], V16I), align=4), _V16S)
        return builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [_V16S, _V16S]), [m, bs])

    return sig, cg


# ----------------------------------------------------------------------------- activation quantization
@intrinsic
def abs_bits(typingctx, v):
    """|v| per lane as int32 bits (f32x8 -> i32x8): non-negative floats order as their bits, so
    magnitudes compare exactly as integers (no NaN in activations)."""
    sig = v8i(v)

    def cg(context, builder, sig, args):
        return builder.and_(builder.bitcast(args[0], _V8I), ir.Constant(_V8I, [0x7FFFFFFF] * 8))

    return sig, cg


@intrinsic
def i_max(typingctx, a, b):
    """Signed max per lane (i32x8)."""
    sig = v8i(a, b)

    def cg(context, builder, sig, args):
        return builder.select(builder.icmp_signed(">", args[0], args[1]), args[0], args[1])

    return sig, cg


@intrinsic
def hmax_i(typingctx, v):
    """The largest of the 8 int32 lanes."""
    return types.int32(v), _reduce_i32x8("smax")


@intrinsic
def f32_of_bits(typingctx, b):
    """The float32 whose bits are the int32 b (as hmax_i of abs_bits returns a magnitude)."""
    def cg(context, builder, sig, args):
        return builder.bitcast(args[0], _f32)
    return types.float32(types.int32), cg


@intrinsic
def q8_lanes(typingctx, v, s):
    """min(127, round_half_even(v * s)) per lane (f32x8, float32 s -> i32x8): ggml's
    ``MIN(127, nearest_int(iscale * x))`` of quantize_row_q8_K, the product rounded once."""
    sig = v8i(v, types.float32)

    def cg(context, builder, sig, args):
        p = builder.fmul(args[0], _splat(builder, args[1], _V8F))
        r = builder.call(_fn(builder, "llvm.rint.v8f32", _V8F, [_V8F]), [p])
        q = builder.fptosi(r, _V8I)
        top = ir.Constant(_V8I, [127] * 8)
        return builder.select(builder.icmp_signed("<", q, top), q, top)

    return sig, cg


@intrinsic
def store_i8x8(typingctx, a, off, v):
    """a[off:off + 8] = v truncated to int8 (int8 array; the lanes fit)."""
    _check_array(a, (types.int8,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        vty = ir.VectorType(_i8, 8)
        builder.store(builder.trunc(args[2], vty), _ptr(context, builder, sig.args[0], args[0], args[1], vty), align=1)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def copy_bytes(typingctx, dst, doff, src, soff, n):
    """dst[doff:doff + n] = src[soff:soff + n] for byte arrays that do not overlap there (one
    llvm.memcpy: a row-pair layout's repack copies runs of 2-32 bytes, which a byte loop or a slice
    assignment copied at ~1 GB/s)."""
    _check_array(dst, _BYTES)
    _check_array(src, _BYTES)
    sig = types.void(dst, doff, src, soff, n)

    def cg(context, builder, sig, args):
        i8p = _i8.as_pointer()
        d = _ptr(context, builder, sig.args[0], args[0], args[1], _i8)
        s = _ptr(context, builder, sig.args[2], args[2], args[3], _i8)
        k = args[4] if args[4].type == _i64 else builder.sext(args[4], _i64)
        fn = _fn(builder, "llvm.memcpy.p0i8.p0i8.i64", ir.VoidType(), [i8p, i8p, _i64, _i1])
        builder.call(fn, [d, s, k, ir.Constant(_i1, 0)])
        return context.get_dummy_value()

    return sig, cg

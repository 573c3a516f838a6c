"""Lane-wise arithmetic on vector registers: zeros, byte logic and shifts, int32 and f32 adds,
products and fused multiply-adds (8 lanes in a ymm register, 16 in a zmm one, 4 for the
one-lane-per-column kernels), widening and narrowing between them, and the activations'
quantization steps. Each lane rounds as the scalar operation in ggml's order would."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..llvm_ir import (check_array, declare, array_ptr, f32_vector_type, i32_vector_type, ll, load_at_arg, splat,
                       to_i32, v16f, v16i, v32b, v4f, v4i, v64b, v8f, v8i, VecType)


@intrinsic
def i_zero(typingctx):
    sig = v8i()
    return sig, lambda context, builder, sig, args: ir.Constant(ll.v8i32, [0] * 8)


@intrinsic
def f_zero(typingctx):
    sig = v8f()
    return sig, lambda context, builder, sig, args: ir.Constant(ll.v8f32, [0.0] * 8)


@intrinsic
def i_zero16(typingctx):
    sig = v16i()
    return sig, lambda context, builder, sig, args: ir.Constant(ll.v16i32, [0] * 16)


@intrinsic
def f_zero16(typingctx):
    sig = v16f()
    return sig, lambda context, builder, sig, args: ir.Constant(ll.v16f32, [0.0] * 16)


@intrinsic
def f4_zero(typingctx):
    sig = v4f()
    return sig, lambda context, builder, sig, args: ir.Constant(ll.v4f32, [0.0] * 4)


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
                rhs = splat(builder, builder.trunc(rhs, ll.i8) if rhs.type.width > 8 else rhs, ll.vector(sig.args[0]))
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
def i_shl(typingctx, v, n):
    sig = v8i(v, n)

    def cg(context, builder, sig, args):
        return builder.shl(args[0], splat(builder, builder.trunc(args[1], ll.i32) if args[1].type.width > 32 else args[1], ll.v8i32))

    return sig, cg


@intrinsic
def i_add(typingctx, a, b):
    """a + b (i32x8 or i32x16)."""
    sig = i32_vector_type(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.add(args[0], args[1])


@intrinsic
def i_sub(typingctx, a, b):
    sig = v8i(a, b)
    return sig, lambda context, builder, sig, args: builder.sub(args[0], args[1])


@intrinsic
def i_mul(typingctx, a, b):
    """a * b (i32x8 or i32x16)."""
    sig = i32_vector_type(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.mul(args[0], args[1])


@intrinsic
def i_muls(typingctx, v, s):
    """v * s per i32 lane (i32x8 or i32x16; s an integer scalar; exact for these kernels' ranges)."""
    sig = i32_vector_type(v)(v, s)

    def cg(context, builder, sig, args):
        return builder.mul(args[0], splat(builder, to_i32(builder, args[1]), ll.vector(sig.args[0])))

    return sig, cg


@intrinsic
def i_max(typingctx, a, b):
    """Signed max per lane (i32x8)."""
    sig = v8i(a, b)

    def cg(context, builder, sig, args):
        return builder.select(builder.icmp_signed(">", args[0], args[1]), args[0], args[1])

    return sig, cg


@intrinsic
def i4_mul_add(typingctx, a, s, b, t):
    """a * s + b * t (i32x4 vectors, int scalars s, t)."""
    sig = v4i(a, s, b, t)

    def cg(context, builder, sig, args):
        sv = splat(builder, to_i32(builder, args[1]), ll.v4i32)
        tv = splat(builder, to_i32(builder, args[3]), ll.v4i32)
        return builder.add(builder.mul(args[0], sv), builder.mul(args[2], tv))

    return sig, cg


@intrinsic
def f_add(typingctx, a, b):
    """a + b (f32x8 or f32x16)."""
    sig = f32_vector_type(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.fadd(args[0], args[1])


@intrinsic
def f_sub(typingctx, a, b):
    """a - b (f32x8 or f32x16)."""
    sig = f32_vector_type(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.fsub(args[0], args[1])


@intrinsic
def f4_sub(typingctx, a, b):
    sig = v4f(a, b)
    return sig, lambda context, builder, sig, args: builder.fsub(args[0], args[1])


@intrinsic
def f_scale(typingctx, v, s):
    """v * s per lane (f32x8 or f32x16, each product rounded once)."""
    sig = f32_vector_type(v)(v, types.float32)
    return sig, lambda context, builder, sig, args: builder.fmul(args[0], splat(builder, args[1], ll.vector(sig.args[0])))


@intrinsic
def f4_scale(typingctx, v, s):
    """v * s per lane (float32 products, each rounded once)."""
    sig = v4f(v, types.float32)
    return sig, lambda context, builder, sig, args: builder.fmul(splat(builder, args[1], ll.v4f32), args[0])


@intrinsic
def scale16(typingctx, a, off, s):
    """a[off:off + 16] * s (float32 array; each product rounded once, as the scalar one)."""
    check_array(a, (types.float32,))
    sig = v16f(a, off, types.float32)

    def cg(context, builder, sig, args):
        return builder.fmul(load_at_arg(context, builder, sig, args, 0, ll.v16f32), splat(builder, args[2], ll.v16f32))

    return sig, cg


@intrinsic
def f_lane(typingctx, v, j):
    sig = types.float32(v, j)
    return sig, lambda context, builder, sig, args: builder.extract_element(args[0], to_i32(builder, args[1]))


@intrinsic
def f4_lane(typingctx, v, j):
    sig = types.float32(v, j)
    return sig, lambda context, builder, sig, args: builder.extract_element(args[0], to_i32(builder, args[1]))


@intrinsic
def f4_make(typingctx, a, b, c, d):
    """f32x4 (a, b, c, d) from four float32 scalars."""
    sig = v4f(types.float32, types.float32, types.float32, types.float32)

    def cg(context, builder, sig, args):
        v = ir.Constant(ll.v4f32, None)
        for j, s in enumerate(args):
            v = builder.insert_element(v, s, ir.Constant(ll.i32, j))
        return v

    return sig, cg


@intrinsic
def fma_f(typingctx, acc, a, b):
    """acc + a * b (f32x8 or f32x16, fused)."""
    vt = f32_vector_type(acc, a, b)
    sig = vt(acc, a, b)
    llv = ll.vector(vt)

    def cg(context, builder, sig, args):
        f = declare(builder, f"llvm.fma.v{llv.count}f32", llv, [llv, llv, llv])
        return builder.call(f, [args[1], args[2], args[0]])

    return sig, cg


@intrinsic
def fmadd_i(typingctx, acc, v, s):
    """acc + float(v) * s  (f32x8, fused like ggml's _mm256_fmadd_ps)."""
    sig = v8f(acc, v, types.float32)

    def cg(context, builder, sig, args):
        f = declare(builder, "llvm.fma.v8f32", ll.v8f32, [ll.v8f32, ll.v8f32, ll.v8f32])
        return builder.call(f, [builder.sitofp(args[1], ll.v8f32), splat(builder, args[2], ll.v8f32), args[0]])

    return sig, cg


@intrinsic
def fmadd_v(typingctx, acc, v, s):
    """acc + f32(v) * s (f32x8 with i32x8 v, or f32x16 with i32x16 v; fused; s the per-lane scales)."""
    vt = f32_vector_type(acc, s)
    if v != {v8f: v8i, v16f: v16i}[vt]:
        raise TypingError(f"fmadd_v: the int32 lanes must match {vt}, got {v}")
    sig = vt(acc, v, s)

    def cg(context, builder, sig, args):
        V = ll.vector(vt)
        f = declare(builder, f"llvm.fma.v{V.count}f32", V, [V, V, V])
        return builder.call(f, [builder.sitofp(args[1], V), args[2], args[0]])

    return sig, cg


@intrinsic
def fma_sv(typingctx, acc, v, dv, s):
    """acc + (f32(v) * dv) * s: the product f32(v) * dv rounded per lane, then fused with scalar s."""
    sig = v8f(acc, v, dv, types.float32)

    def cg(context, builder, sig, args):
        f = declare(builder, "llvm.fma.v8f32", ll.v8f32, [ll.v8f32, ll.v8f32, ll.v8f32])
        t = builder.fmul(builder.sitofp(args[1], ll.v8f32), args[2])
        return builder.call(f, [t, splat(builder, args[3], ll.v8f32), args[0]])

    return sig, cg


@intrinsic
def fmadd_im(typingctx, acc, v, a, off):
    """acc + f32(v) * a[off] (f32x8, fused; a float32 array): the scale is a broadcast load, which
    AVX-512 folds into the FMA as an embedded-broadcast operand (no shuffle uop)."""
    check_array(a, (types.float32,))
    sig = v8f(acc, v, a, off)

    def cg(context, builder, sig, args):
        f = declare(builder, "llvm.fma.v8f32", ll.v8f32, [ll.v8f32, ll.v8f32, ll.v8f32])
        s = builder.load(array_ptr(context, builder, sig.args[2], args[2], args[3], ll.f32), align=4)
        return builder.call(f, [builder.sitofp(args[1], ll.v8f32), splat(builder, s, ll.v8f32), args[0]])

    return sig, cg


def _fma_int(name: str, vt: VecType, doc: str):
    """An intrinsic `name(acc, v, s)`: acc + f32(v) * s per lane, fused, in the float vector type
    vt (v the int32 lanes of the same count, s a vector of vt)."""
    llv = ll.vector(vt)

    def fma(typingctx, acc, v, s):
        def cg(context, builder, sig, args):
            f = declare(builder, f"llvm.fma.v{llv.count}f32", llv, [llv, llv, llv])
            return builder.call(f, [builder.sitofp(args[1], llv), args[2], args[0]])
        return vt(acc, v, s), cg
    fma.__name__ = fma.__qualname__ = name
    fma.__doc__ = doc
    return intrinsic(fma)


fma4_i = _fma_int("fma4_i", v4f, "acc + f32(v) * s per lane, fused (s an f32x4).")


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
        n = ll.vector(sig.args[0]).count
        return builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(ll.i32, 2 * n), list(range(2 * n))))

    return sig, cg


@intrinsic
def half_f(typingctx, v, h):
    """Lanes 8h..8h+7 of an f32x16 as f32x8 (h a compile-time 0 or 1): one row of a pair."""
    if not isinstance(h, types.IntegerLiteral):
        raise TypingError("half_f: the half must be a compile-time int")
    k = h.literal_value
    sig = v8f(v, h)

    def cg(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(ll.i32, 8), list(range(8 * k, 8 * k + 8))))

    return sig, cg


@intrinsic
def abs_bits(typingctx, v):
    """|v| per lane as int32 bits (f32x8 -> i32x8): non-negative floats order as their bits, so
    magnitudes compare exactly as integers (no NaN in activations)."""
    sig = v8i(v)

    def cg(context, builder, sig, args):
        return builder.and_(builder.bitcast(args[0], ll.v8i32), ir.Constant(ll.v8i32, [0x7FFFFFFF] * 8))

    return sig, cg


@intrinsic
def q8_lanes(typingctx, v, s):
    """min(127, round_half_even(v * s)) per lane (f32x8, float32 s -> i32x8): ggml's
    ``MIN(127, nearest_int(iscale * x))`` of quantize_row_q8_K, the product rounded once."""
    sig = v8i(v, types.float32)

    def cg(context, builder, sig, args):
        p = builder.fmul(args[0], splat(builder, args[1], ll.v8f32))
        r = builder.call(declare(builder, "llvm.rint.v8f32", ll.v8f32, [ll.v8f32]), [p])
        q = builder.fptosi(r, ll.v8i32)
        top = ir.Constant(ll.v8i32, [127] * 8)
        return builder.select(builder.icmp_signed("<", q, top), q, top)

    return sig, cg

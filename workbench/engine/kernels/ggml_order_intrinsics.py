"""Extra LLVM intrinsics for ``ggml_order`` (kept apart from simd.py, which is tuned separately)."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from .simd import v8i

_i8 = ir.IntType(8)
_i32 = ir.IntType(32)
_f32 = ir.FloatType()
_V8I = ir.VectorType(_i32, 8)
_V16I = ir.VectorType(_i32, 16)
_V16B = ir.VectorType(_i8, 16)


def _fn(builder, name, ret, args):
    m = builder.module
    f = m.globals.get(name)
    if f is None:
        f = ir.Function(m, ir.FunctionType(ret, args), name=name)
    return f


def _ptr(context, builder, aty, arr, off, vty):
    ary = context.make_array(aty)(context, builder, arr)
    return builder.bitcast(builder.gep(ary.data, [off]), vty.as_pointer())


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c on float32 with one rounding (llvm.fma.f32), like _mm_fmadd_ss."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def cg(context, builder, sig, args):
        f = _fn(builder, "llvm.fma.f32", _f32, [_f32, _f32, _f32])
        return builder.call(f, list(args))

    return sig, cg


@intrinsic
def i_hsum(typingctx, v):
    """Sum of the 8 int32 lanes (exact integer arithmetic)."""
    if v != v8i:
        raise TypingError("expected an i32x8 vector")
    sig = types.int32(v)

    def cg(context, builder, sig, args):
        f = _fn(builder, "llvm.vector.reduce.add.v8i32", _i32, [_V8I])
        return builder.call(f, [args[0]])

    return sig, cg


@intrinsic
def q6_bsum_lanes(typingctx, w, off, bs, boff):
    """Lane m = -32 * (sc[2m] * bs[2m] + sc[2m+1] * bs[2m+1]) for the 16 int8 Q6_K scales at byte
    ``off`` of w and the 16 int32 activation bsums at ``boff`` of bs (ggml's q8sclsub, negated)."""
    if not isinstance(w, types.Array) or w.dtype not in (types.uint8, types.int8):
        raise TypingError("w must be a uint8 array")
    if not isinstance(bs, types.Array) or bs.dtype != types.int32:
        raise TypingError("bs must be an int32 array")
    sig = v8i(w, off, bs, boff)

    def cg(context, builder, sig, args):
        sc = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _V16B), align=1)
        sc = builder.sext(sc, _V16I)
        b = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], _V16I), align=4)
        p = builder.mul(sc, b)
        ev = builder.shuffle_vector(p, p, ir.Constant(_V8I, [0, 2, 4, 6, 8, 10, 12, 14]))
        od = builder.shuffle_vector(p, p, ir.Constant(_V8I, [1, 3, 5, 7, 9, 11, 13, 15]))
        return builder.mul(builder.add(ev, od), ir.Constant(_V8I, [-32] * 8))

    return sig, cg

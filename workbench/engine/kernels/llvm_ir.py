"""Building blocks for the kernels' LLVM IR: what every intrinsic (`kernels.intrinsics`) and every
x86 kernel module that writes its own intrinsics builds with.

- the instruction-set modes a kernel factory closes over (PORTABLE, AVX2, VNNI; a compile-time
  constant, so LLVM folds the other modes' branches away);
- `ll`, the LLVM types, named as LLVM names them in intrinsic names (`ll.v8f32`: <8 x float>);
- `VecType` and its Numba types (`v8f`, `v32b`, ...): an LLVM vector held in a Numba variable;
- helpers for code generators: declare an LLVM intrinsic, point into an array argument, splat a
  scalar, check an argument's type at typing time.
"""
from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic, models, register_model

#: generic LLVM vector IR (no x86 intrinsics)
PORTABLE = 0
#: pmaddubsw / pmaddwd / psign on ymm registers
AVX2 = 1
#: AVX-512 VNNI vpdpbusd / vpdpwssd (ymm and zmm registers)
VNNI = 2


class LLVMTypes:
    """The LLVM types of the kernels' IR: scalars (``i32``, ``f16``, ...) and vectors spelled
    ``v<lanes><element>`` (``v32i8``: 32 bytes, one ymm register)."""
    i1 = ir.IntType(1)
    i8 = ir.IntType(8)
    i16 = ir.IntType(16)
    i32 = ir.IntType(32)
    i64 = ir.IntType(64)
    f16 = ir.HalfType()
    f32 = ir.FloatType()
    v16i8 = ir.VectorType(i8, 16)
    v32i8 = ir.VectorType(i8, 32)
    v64i8 = ir.VectorType(i8, 64)
    v8i16 = ir.VectorType(i16, 8)
    v16i16 = ir.VectorType(i16, 16)
    v4i32 = ir.VectorType(i32, 4)
    v8i32 = ir.VectorType(i32, 8)
    v16i32 = ir.VectorType(i32, 16)
    v8f16 = ir.VectorType(f16, 8)
    v4f32 = ir.VectorType(f32, 4)
    v8f32 = ir.VectorType(f32, 8)
    v16f32 = ir.VectorType(f32, 16)

    def vector(self, vt: VecType) -> ir.VectorType:
        """The LLVM vector type a Numba `VecType` holds."""
        return _LLVM_OF_KIND[vt.kind]


ll = LLVMTypes()


class VecType(types.Type):
    """An LLVM vector value held in a Numba variable (never boxed to Python)."""

    def __init__(self, kind: str):
        self.kind = kind
        super().__init__(name=f"simd.{kind}")


v32b = VecType("i8x32")
v64b = VecType("i8x64")
v16s = VecType("i16x16")
v4i = VecType("i32x4")
v8i = VecType("i32x8")
v16i = VecType("i32x16")
v4f = VecType("f32x4")
v8f = VecType("f32x8")
v16f = VecType("f32x16")   # e.g. two rows' f32x8 accumulators side by side in one zmm register
_LLVM_OF_KIND = {"i8x32": ll.v32i8, "i8x64": ll.v64i8, "i16x16": ll.v16i16, "i32x4": ll.v4i32, "i32x8": ll.v8i32,
                 "i32x16": ll.v16i32, "f32x4": ll.v4f32, "f32x8": ll.v8f32, "f32x16": ll.v16f32}


@register_model(VecType)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _LLVM_OF_KIND[fe_type.kind])


#: the element types of the byte arrays the kernels read (weights, quantized activations)
BYTE_DTYPES = (types.uint8, types.int8)


def declare(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The function `name` of the builder's module (an LLVM intrinsic such as
    "llvm.fma.v8f32"), declared on first use."""
    m = builder.module
    f = m.globals.get(name)
    if f is None:
        f = ir.Function(m, ir.FunctionType(ret, args), name=name)
    return f


def array_ptr(context, builder: ir.IRBuilder, aty: types.Array, arr, off, vty: ir.Type):
    """Pointer to element ``off`` of a C-contiguous array (Numba type `aty`, value `arr`), cast to
    ``vty*`` (a byte offset for a byte array)."""
    ary = context.make_array(aty)(context, builder, arr)
    p = builder.gep(ary.data, [off])
    return builder.bitcast(p, vty.as_pointer())


def load_at_arg(context, builder: ir.IRBuilder, sig, llargs, idx: int, vty: ir.Type):
    """One unaligned load of a `vty` from the array argument ``idx`` at the offset in argument
    ``idx + 1`` (the ``(a, off)`` pair most intrinsics take)."""
    return builder.load(array_ptr(context, builder, sig.args[idx], llargs[idx], llargs[idx + 1], vty), align=1)


def literal_mode(t: types.Type) -> int:
    """The instruction-set mode of a typing-time argument, which must be a compile-time int."""
    if not isinstance(t, types.IntegerLiteral):
        raise TypingError("simd mode must be a compile-time int constant")
    return t.literal_value


def splat(builder: ir.IRBuilder, val, vty: ir.VectorType):
    """The scalar `val` in every lane of a `vty` (a broadcast)."""
    undef = ir.Constant(vty, None)
    v = builder.insert_element(undef, val, ir.Constant(ll.i32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(ll.i32, vty.count), [0] * vty.count))


def to_i32(builder: ir.IRBuilder, v):
    """An integer value as i32 (truncated, or zero-extended when narrower)."""
    w = v.type.width
    return builder.trunc(v, ll.i32) if w > 32 else builder.zext(v, ll.i32) if w < 32 else v


def check_array(a: types.Type, dtypes: tuple) -> None:
    """At typing time: `a` must be an array of one of `dtypes`."""
    if not isinstance(a, types.Array) or a.dtype not in dtypes:
        raise TypingError(f"expected array of {dtypes}, got {a}")


def f32_vector_type(*vs: types.Type) -> VecType:
    """The vector type of float arguments that must agree (f32x8 or f32x16)."""
    if any(v != vs[0] for v in vs) or vs[0] not in (v8f, v16f):
        raise TypingError(f"expected f32x8 or f32x16 operands of one width, got {vs}")
    return vs[0]


def i32_vector_type(*vs: types.Type) -> VecType:
    """The vector type of int32 arguments that must agree (i32x8 or i32x16)."""
    if any(v != vs[0] for v in vs) or vs[0] not in (v8i, v16i):
        raise TypingError(f"expected i32x8 or i32x16 operands of one width, got {vs}")
    return vs[0]


def vector_load_intrinsic(name: str, vt: VecType, dtypes: tuple, doc: str) -> Callable:
    """An intrinsic `name(a, off)`: one unaligned load of the vector type vt at element `off` of an
    array of one of `dtypes` (a byte offset for byte arrays)."""
    llv = ll.vector(vt)

    def load(typingctx, a, off):
        check_array(a, dtypes)
        return vt(a, off), lambda context, builder, sig, args: load_at_arg(context, builder, sig, args, 0, llv)
    load.__name__ = load.__qualname__ = name
    load.__doc__ = doc
    return intrinsic(load)

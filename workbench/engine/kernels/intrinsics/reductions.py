"""Sums (and a max) across a vector's lanes, each in the order of the ggml reduction it stands
for (hsum_float_8, GGML_F32x8_REDUCE, _mm512_reduce_add_ps), so the float results match
llama.cpp's bits."""
from __future__ import annotations

from llvmlite import ir
import numba
from numba import types
from numba.extending import intrinsic

from ..llvm_ir import declare, ll, v4i
from .lanes import f_add, half_f


@intrinsic
def hsum_f(typingctx, v):
    sig = types.float32(v)

    def cg(context, builder, sig, args):
        # pairwise tree (like ggml's hsum_float_8), no reassociation flags needed
        x = args[0]
        lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ll.i32, 4), [0, 1, 2, 3]))
        hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ll.i32, 4), [4, 5, 6, 7]))
        s4 = builder.fadd(lo, hi)
        a = builder.shuffle_vector(s4, s4, ir.Constant(ir.VectorType(ll.i32, 2), [0, 1]))
        b = builder.shuffle_vector(s4, s4, ir.Constant(ir.VectorType(ll.i32, 2), [2, 3]))
        s2 = builder.fadd(a, b)
        return builder.fadd(builder.extract_element(s2, ir.Constant(ll.i32, 0)),
                            builder.extract_element(s2, ir.Constant(ll.i32, 1)))

    return sig, cg


@intrinsic
def hsum_hadd_f(typingctx, v):
    """v's 8 lanes summed as ggml's GGML_F32x8_REDUCE ends: t_i = v_i + v_(i+4), then two
    _mm_hadd_ps, i.e. (t0 + t1) + (t2 + t3) (hsum_f pairs (t0 + t2) + (t1 + t3))."""
    sig = types.float32(v)

    def cg(context, builder, sig, args):
        x = args[0]
        lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ll.i32, 4), [0, 1, 2, 3]))
        hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ll.i32, 4), [4, 5, 6, 7]))
        t = builder.fadd(lo, hi)
        e = [builder.extract_element(t, ir.Constant(ll.i32, i)) for i in range(4)]
        return builder.fadd(builder.fadd(e[0], e[1]), builder.fadd(e[2], e[3]))

    return sig, cg


@numba.njit(inline="always")
def hsum16(v):
    """An f32x16's lanes summed as GCC's _mm512_reduce_add_ps: the high 8 lanes added to the low 8,
    then hsum_f's tree (ggml's reduction of a 16-lane F16 / F32 dot on the AVX-512 build)."""
    return hsum_f(f_add(half_f(v, 0), half_f(v, 1)))


def _reduce_i32x8(op: str):
    """Codegen of an int32x8 -> int32 lane reduction (llvm.vector.reduce.<op>)."""
    def cg(context, builder, sig, args):
        return builder.call(declare(builder, f"llvm.vector.reduce.{op}.v8i32", ll.i32, [ll.v8i32]), [args[0]])
    return cg


@intrinsic
def hsum_i(typingctx, v):
    """Sum of the 8 int32 lanes (exact in int32 for these kernels)."""
    return types.int32(v), _reduce_i32x8("add")


@intrinsic
def hmax_i(typingctx, v):
    """The largest of the 8 int32 lanes."""
    return types.int32(v), _reduce_i32x8("smax")


@intrinsic
def reduce4(typingctx, a, b, c, d):
    """i32x4 of the lane sums of four i32x8 vectors (exact integer sums)."""
    sig = v4i(a, b, c, d)

    def cg(context, builder, sig, args):
        def sh(x, y, idx):
            return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(ll.i32, len(idx)), idx))
        # transpose-and-add: pairs, then quads, then the two 128-bit halves
        ab = builder.add(sh(args[0], args[1], [0, 8, 2, 10, 4, 12, 6, 14]), sh(args[0], args[1], [1, 9, 3, 11, 5, 13, 7, 15]))
        cd = builder.add(sh(args[2], args[3], [0, 8, 2, 10, 4, 12, 6, 14]), sh(args[2], args[3], [1, 9, 3, 11, 5, 13, 7, 15]))
        q = builder.add(sh(ab, cd, [0, 1, 8, 9, 4, 5, 12, 13]), sh(ab, cd, [2, 3, 10, 11, 6, 7, 14, 15]))
        return builder.add(sh(q, q, [0, 1, 2, 3]), sh(q, q, [4, 5, 6, 7]))

    return sig, cg

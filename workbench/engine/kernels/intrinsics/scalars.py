"""Scalar intrinsics: one value at a time (an f16 or bf16 read from a byte array and widened,
rounding to f16, a fused multiply-add, an unaligned u32 read). Every kernel path uses them, the
portable one included: plain LLVM IR, no x86 instruction."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..llvm_ir import BYTE_DTYPES, check_array, declare, array_ptr, ll, load_at_arg


@intrinsic
def f16_to_f32(typingctx, a, off):
    """Little-endian IEEE half at byte offset ``off`` of a uint8 array -> float32 (exact)."""
    check_array(a, BYTE_DTYPES)
    sig = types.float32(a, off)

    def cg(context, builder, sig, args):
        p = array_ptr(context, builder, sig.args[0], args[0], args[1], ll.f16)
        return builder.fpext(builder.load(p, align=1), ll.f32)

    return sig, cg


@intrinsic
def f16_lead(typingctx, a, off):
    """Like f16_to_f32 for a half that at least 6 more bytes follow (a block's leading scale): read as
    the first of four halves, one vcvtph2ps from memory instead of a vpinsrw and a vcvtph2ps.  Measured
    on the AVX2 EPYC host (Q8_0 matvec, K = 640, from memory): 9.1 -> 9.6 GB/s."""
    check_array(a, BYTE_DTYPES)
    sig = types.float32(a, off)

    def cg(context, builder, sig, args):
        p = array_ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ll.f16, 4))
        f4 = builder.fpext(builder.load(p, align=1), ir.VectorType(ll.f32, 4))
        return builder.extract_element(f4, ir.Constant(ll.i32, 0))

    return sig, cg


@intrinsic
def round_f16(typingctx, x):
    """Round float32 to the nearest half (ties to even, like F16C) and back to float32."""
    sig = types.float32(types.float32)

    def cg(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ll.f16), ll.f32)

    return sig, cg


@intrinsic
def bf16_to_f32(typingctx, a, off):
    """bfloat16 at byte offset ``off`` of a uint8 array -> float32 (exact)."""
    check_array(a, BYTE_DTYPES)
    sig = types.float32(a, off)

    def cg(context, builder, sig, args):
        p = array_ptr(context, builder, sig.args[0], args[0], args[1], ll.i16)
        v = builder.zext(builder.load(p, align=1), ll.i32)
        return builder.bitcast(builder.shl(v, ir.Constant(ll.i32, 16)), ll.f32)

    return sig, cg


@intrinsic
def fma_s(typingctx, a, b, c):
    """a * b + c in float32, rounded once (llvm.fma.f32: vfmadd on these CPUs)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def cg(context, builder, sig, args):
        f = declare(builder, "llvm.fma.f32", ll.f32, [ll.f32, ll.f32, ll.f32])
        return builder.call(f, list(args))

    return sig, cg


@intrinsic
def ld_u32(typingctx, a, off):
    """Unaligned little-endian uint32 at byte ``off`` of a uint8 array (no index checks)."""
    check_array(a, BYTE_DTYPES)
    sig = types.uint32(a, off)
    return sig, lambda context, builder, sig, args: load_at_arg(context, builder, sig, args, 0, ll.i32)


@intrinsic
def f32_of_bits(typingctx, b):
    """The float32 whose bits are the int32 b (as hmax_i of abs_bits returns a magnitude)."""
    def cg(context, builder, sig, args):
        return builder.bitcast(args[0], ll.f32)
    return types.float32(types.int32), cg

"""Vectors in and out of arrays: unaligned loads (bytes, int32, f32; f16 and bf16 widened to
f32), gathers, stores, broadcast loads, and a byte copy."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..llvm_ir import (BYTE_DTYPES, check_array, declare, array_ptr, ll, load_at_arg, splat, v16f, v16i, v32b,
                       v4f, v4i, v64b, v8f, v8i, vector_load_intrinsic, VecType)


load_b32 = vector_load_intrinsic("load_b32", v32b, BYTE_DTYPES,
                         "32 bytes at element offset ``off`` of a uint8/int8 array (unaligned).")


load_i8 = vector_load_intrinsic("load_i8", v8i, (types.int32,),
                        "8 int32 at element offset ``off`` of an int32 array.")


load_f32x8 = vector_load_intrinsic("load_f32x8", v8f, BYTE_DTYPES + (types.float32,),
                           "8 float32 at element ``off`` of a float32 array, or at byte ``off`` of a uint8 array.")


load_f32x16 = vector_load_intrinsic("load_f32x16", v16f, BYTE_DTYPES + (types.float32,),
                            "16 float32 at element ``off`` of a float32 array, or at byte ``off`` of a uint8 "
                            "array (one zmm load on AVX-512).")


load_b64 = vector_load_intrinsic("load_b64", v64b, BYTE_DTYPES,
                         "64 bytes at byte ``off`` of an int8 / uint8 array.")


load_i16 = vector_load_intrinsic("load_i16", v16i, (types.int32,),
                         "16 int32 at element ``off`` of an int32 array.")


load_i32x4 = vector_load_intrinsic("load_i32x4", v4i, (types.int32,),
                           "4 int32 at element ``off`` of an int32 array.")


load_f32x4 = vector_load_intrinsic("load_f32x4", v4f, (types.float32,),
                           "4 float32 at element ``off`` of a float32 array.")


@intrinsic
def load_f16x8(typingctx, a, off):
    """8 halves at byte ``off`` of a uint8 array -> f32x8 (vcvtph2ps)."""
    check_array(a, BYTE_DTYPES)
    sig = v8f(a, off)
    return sig, lambda context, builder, sig, args: builder.fpext(load_at_arg(context, builder, sig, args, 0, ll.v8f16), ll.v8f32)


@intrinsic
def load_f16x16(typingctx, a, off):
    """16 halves at byte ``off`` of a uint8 array -> f32x16 (one vcvtph2ps zmm on AVX-512)."""
    check_array(a, BYTE_DTYPES)
    sig = v16f(a, off)
    return sig, lambda context, builder, sig, args: builder.fpext(
        load_at_arg(context, builder, sig, args, 0, ir.VectorType(ll.f16, 16)), ll.v16f32)


@intrinsic
def load_bf16x8(typingctx, a, off):
    """8 bfloat16 at byte ``off`` of a uint8 array -> f32x8 (exact: shift into the high half)."""
    check_array(a, BYTE_DTYPES)
    sig = v8f(a, off)

    def cg(context, builder, sig, args):
        v = builder.zext(load_at_arg(context, builder, sig, args, 0, ll.v8i16), ll.v8i32)
        return builder.bitcast(builder.shl(v, ir.Constant(ll.v8i32, [16] * 8)), ll.v8f32)

    return sig, cg


@intrinsic
def gather_f16x8(typingctx, a, off, stride):
    """f32x8 of the 8 halves at byte offsets off + r * stride (r < 8) of a uint8 array: the f16 scales
    of a block of 8 consecutive rows, converted with one vcvtph2ps (exact)."""
    check_array(a, BYTE_DTYPES)
    sig = v8f(a, types.intp, types.intp)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        v = ir.Constant(ir.VectorType(ll.i16, 8), None)
        for r in range(8):
            o = builder.add(args[1], builder.mul(args[2], ir.Constant(args[2].type, r)))
            p = builder.bitcast(builder.gep(ary.data, [o]), ll.i16.as_pointer())
            v = builder.insert_element(v, builder.load(p, align=1), ir.Constant(ll.i32, r))
        return builder.fpext(builder.bitcast(v, ll.v8f16), ll.v8f32)

    return sig, cg


@intrinsic
def store_f32x8(typingctx, a, off, v):
    """a[off:off + 8] = v (float32 array)."""
    check_array(a, (types.float32,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        builder.store(args[2], array_ptr(context, builder, sig.args[0], args[0], args[1], ll.v8f32), align=4)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def store_f32x16(typingctx, a, off, v):
    """a[off:off + 16] = v (float32 array; one zmm store on AVX-512)."""
    check_array(a, (types.float32,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        builder.store(args[2], array_ptr(context, builder, sig.args[0], args[0], args[1], ll.v16f32), align=4)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def store_i32x8(typingctx, a, off, v):
    """a[off:off + 8] = v (int32 array)."""
    check_array(a, (types.int32,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        builder.store(args[2], array_ptr(context, builder, sig.args[0], args[0], args[1], ll.v8i32), align=4)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def store_f32x4(typingctx, a, off, v):
    """a[off:off + 4] = v (float32 array, f32x4)."""
    check_array(a, (types.float32,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        builder.store(args[2], array_ptr(context, builder, sig.args[0], args[0], args[1], ll.v4f32), align=4)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def store_i8x8(typingctx, a, off, v):
    """a[off:off + 8] = v truncated to int8 (int8 array; the lanes fit)."""
    check_array(a, (types.int8,))
    sig = types.void(a, off, v)

    def cg(context, builder, sig, args):
        vty = ir.VectorType(ll.i8, 8)
        builder.store(builder.trunc(args[2], vty), array_ptr(context, builder, sig.args[0], args[0], args[1], vty), align=1)
        return context.get_dummy_value()

    return sig, cg


def _bcast_b4(name: str, vt: VecType, lanes: ir.VectorType, doc: str):
    """An intrinsic `name(a, off)`: the 4 bytes at byte ``off`` of a uint8/int8 array repeated in every
    dword of a byte vector vt (a broadcast load: an embedded-broadcast operand of vpdpbusd on AVX-512)."""
    def bcast(typingctx, a, off):
        check_array(a, BYTE_DTYPES)

        def cg(context, builder, sig, args):
            v = builder.load(array_ptr(context, builder, sig.args[0], args[0], args[1], ll.i32), align=1)
            return builder.bitcast(splat(builder, v, lanes), ll.vector(vt))
        return vt(a, off), cg
    bcast.__name__ = bcast.__qualname__ = name
    bcast.__doc__ = doc
    return intrinsic(bcast)


bcast_b4 = _bcast_b4("bcast_b4", v32b, ll.v8i32, "The 4 bytes at byte ``off`` in all 8 dwords of an i8x32.")


bcast_b4_16 = _bcast_b4("bcast_b4_16", v64b, ll.v16i32, "The 4 bytes at byte ``off`` in all 16 dwords of an i8x64.")


@intrinsic
def bcast_i32(typingctx, a, off):
    """a[off] (int32 array) in all 8 lanes."""
    check_array(a, (types.int32,))
    sig = v8i(a, off)

    def cg(context, builder, sig, args):
        v = builder.load(array_ptr(context, builder, sig.args[0], args[0], args[1], ll.i32), align=4)
        return splat(builder, v, ll.v8i32)

    return sig, cg


@intrinsic
def copy_bytes(typingctx, dst, doff, src, soff, n):
    """dst[doff:doff + n] = src[soff:soff + n] for byte arrays that do not overlap there (one
    llvm.memcpy: a row-pair layout's repack copies runs of 2-32 bytes, which a byte loop or a slice
    assignment copied at ~1 GB/s)."""
    check_array(dst, BYTE_DTYPES)
    check_array(src, BYTE_DTYPES)
    sig = types.void(dst, doff, src, soff, n)

    def cg(context, builder, sig, args):
        i8p = ll.i8.as_pointer()
        d = array_ptr(context, builder, sig.args[0], args[0], args[1], ll.i8)
        s = array_ptr(context, builder, sig.args[2], args[2], args[3], ll.i8)
        k = args[4] if args[4].type == ll.i64 else builder.sext(args[4], ll.i64)
        fn = declare(builder, "llvm.memcpy.p0i8.p0i8.i64", ir.VoidType(), [i8p, i8p, ll.i64, ll.i1])
        builder.call(fn, [d, s, k, ir.Constant(ll.i1, 0)])
        return context.get_dummy_value()

    return sig, cg

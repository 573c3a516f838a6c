"""The probe's compiled loops (Numba): a streaming read and a pointer chase.

Kept apart so that importing the advisor (e.g. to advise for a fixture machine) never compiles.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, models, register_model

_V32 = ir.VectorType(ir.IntType(8), 32)


class _Bytes32(types.Type):
    """32 bytes in one vector register (plain LLVM vector IR: any target)."""

    def __init__(self) -> None:
        super().__init__(name="advisor.i8x32")


_b32 = _Bytes32()


@register_model(_Bytes32)
class _Bytes32Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _V32)


@intrinsic
def _load32(typingctx, a, off):
    """The 32 bytes at byte ``off`` of a uint8 array (unaligned, unchecked)."""
    sig = _b32(a, off)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), _V32.as_pointer()), align=1)

    return sig, cg


@intrinsic
def _xor32(typingctx, a, b):
    sig = _b32(a, b)
    return sig, lambda context, builder, sig, args: builder.xor(args[0], args[1])


@intrinsic
def _fold32(typingctx, a):
    """XOR of the 32 bytes' four 8-byte words (llvm.vector.reduce.xor)."""
    sig = types.uint64(a)

    def cg(context, builder, sig, args):
        m = builder.module
        v4 = ir.VectorType(ir.IntType(64), 4)
        name = "llvm.vector.reduce.xor.v4i64"
        fn = m.globals.get(name) or ir.Function(m, ir.FunctionType(ir.IntType(64), [v4]), name=name)
        return builder.call(fn, [builder.bitcast(args[0], v4)])

    return sig, cg


@nb.njit(nogil=True, cache=True)
def stream_read(a: np.ndarray) -> np.uint64:
    """The XOR of every word of ``a`` (uint64), each read once in 32-byte vector loads with four
    independent XOR chains, so the loop is far faster than memory. The 8-byte sum this replaced
    was compiled to about 8 bytes a cycle: on the AMD EPYC host (Zen 5) it read 28.6 GB/s from
    memory and 33 from the L2 where these loads read 38-40 and ~180, and the advisor took that loop's
    limit for the memory's (decode predicted 21-27 % under the measurement, "bound by memory")."""
    b = a.view(np.uint8)
    n = b.shape[0] // 128 * 128
    s = np.uint64(0)
    if n:
        z = _load32(b, 0)
        a0 = _xor32(z, z); a1 = a0; a2 = a0; a3 = a0
        for i in range(0, n, 128):
            a0 = _xor32(a0, _load32(b, i)); a1 = _xor32(a1, _load32(b, i + 32))
            a2 = _xor32(a2, _load32(b, i + 64)); a3 = _xor32(a3, _load32(b, i + 96))
        s = _fold32(_xor32(_xor32(a0, a1), _xor32(a2, a3)))
    for j in range(n // 8, a.shape[0]):
        s ^= a[j]
    return s


@nb.njit(nogil=True, cache=True)
def chase(nxt: np.ndarray, start: int, steps: int) -> int:  # nxt: int64
    """Follow ``steps`` dependent loads through ``nxt`` (each load's address is the last one's value)."""
    i = start
    for _ in range(steps):
        i = nxt[i]
    return i

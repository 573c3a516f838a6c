"""A spin barrier for the workers of one forward pass, in compiled code without the GIL.

A Python barrier between pinned threads costs 30-40 us; a token needs about a
hundred synchronisation points. Here arriving is one atomic add, and waiting
spins on an atomic load (with `pause`) while the GIL is released. After a
bounded number of spins the wait returns to Python, which sleeps briefly and
spins again, so more workers than cores never livelock the machine.
"""

from __future__ import annotations

import platform
import time

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")

# state layout (int64): [arrived, generation, aborted]
ARRIVED, GENERATION, ABORTED = 0, 1, 2


def _pointer(context, builder, aty, arr, idx):
    ary = context.make_array(aty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, aty, ary, [idx])


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    """arr[idx] += val atomically; returns the previous value."""
    sig = types.int64(arr, idx, types.int64)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")
    return sig, codegen


@intrinsic
def atomic_load(typingctx, arr, idx):
    sig = types.int64(arr, idx)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)
    return sig, codegen


@intrinsic
def atomic_store(typingctx, arr, idx, val):
    sig = types.void(arr, idx, types.int64)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1])
        builder.store_atomic(args[2], ptr, "release", 8)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def cpu_pause(typingctx):
    sig = types.void()

    def codegen(context, builder, sig, args):
        if _X86:  # the spin-wait hint; elsewhere a plain spin
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return sig, codegen


_JIT = dict(nogil=True, cache=True)


@nb.njit(**_JIT)
def arrive(state: np.ndarray, n: int) -> int:
    """Count this worker in. Returns -1 if it was the last (everyone is released), else the
    generation to wait on."""
    gen = atomic_load(state, GENERATION)
    if atomic_add(state, ARRIVED, 1) == n - 1:
        atomic_store(state, ARRIVED, 0)
        atomic_add(state, GENERATION, 1)
        return -1
    return gen


@nb.njit(**_JIT)
def wait(state: np.ndarray, gen: int, spins: int) -> int:
    """0 when released, 1 when still waiting after `spins` spins, -1 when aborted."""
    for _ in range(spins):
        if atomic_load(state, GENERATION) != gen:
            return 0
        if atomic_load(state, ABORTED) != 0:
            return -1
        cpu_pause()
    return 1


class Aborted(Exception):
    """Another worker failed; this one leaves the forward pass."""


class SpinBarrier:
    def __init__(self, n: int, spins: int = 1 << 16):
        self.n = n
        self.spins = spins
        self.state = np.zeros(4, dtype=np.int64)

    def wait(self) -> None:
        gen = arrive(self.state, self.n)
        if gen < 0:
            return
        while True:
            r = wait(self.state, gen, self.spins)
            if r == 0:
                return
            if r < 0:
                raise Aborted("another worker failed")
            time.sleep(0)  # give the core away (oversubscribed or slow peer), then spin again

    def abort(self) -> None:
        atomic_store(self.state, ABORTED, 1)

    def reset(self) -> None:
        self.state[:] = 0

"""How the one-token kernels read their weight rows from memory: software prefetch (how far
ahead, per CPU vendor and row length) and two streams per thread (the rows of a range read from
both of its halves in turn). The distances are measured: benchmarks/HISTORY.md, "Prefetch distances"."""
from __future__ import annotations

from llvmlite import ir
import numba
from numba import types
from numba.extending import intrinsic

from ..cpu import cpu_vendor
from ..llvm_ir import BYTE_DTYPES, check_array, declare, ll


# Each distance below is measured; the runs behind it are in benchmarks/HISTORY.md, "Prefetch
# distances".
# Rows of at most PREFETCH_MAX_K weights (experts, small models): prefetch 4 KB ahead (their
# reductions interrupt the stream); longer rows: the hardware prefetcher alone did better.
PREFETCH_BYTES = 4096


PREFETCH_MAX_K = 2048


# Super-block records read whole (Q6_K rows, Q4_K's x8 groups, plain Q4_K rows): every line of a
# record, nearer on Intel.
PREFETCH_NEAR = 1536 if cpu_vendor() == "GenuineIntel" else PREFETCH_BYTES


# The legacy one-token products (Q8_0, Q5_0, Q4_0 rows) with two streams per thread: nearer on Intel.
PREFETCH_LEGACY = 2048 if cpu_vendor() == "GenuineIntel" else PREFETCH_BYTES


# Two streams per thread: a one-token product reads the rows of its range [r0, r1) from both halves
# in turn, a row (or a kernel's row group) of each (a core keeps more lines in flight along two
# streams than along one); below TWO_STREAMS_MIN bytes a half, one stream.
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


def _prefetch(builder, p, write: bool = False, locality: int = 3) -> None:
    """prefetcht0 of the line holding i8* p (llvm.prefetch: read, keep in all levels, data);
    write: prefetchw (the line arrives owned, ready for a store); locality 1: prefetcht2 (the
    outer caches)."""
    fn = declare(builder, "llvm.prefetch.p0i8", ir.VoidType(), [ir.IntType(8).as_pointer(), ll.i32, ll.i32, ll.i32])
    builder.call(fn, [p, ir.Constant(ll.i32, int(write)), ir.Constant(ll.i32, locality), ir.Constant(ll.i32, 1)])


@intrinsic
def prefetch(typingctx, a, off):
    """Hint: bring the cache line at byte ``off`` of a uint8 array into the caches (prefetcht0).
    Never faults (a prefetch past the end of the array is dropped by the CPU)."""
    check_array(a, BYTE_DTYPES)
    sig = types.void(a, off)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        _prefetch(builder, builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer()))
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def prefetch_at(typingctx, addr):
    """`prefetch` at a raw byte address (the crew's job tables hold addresses, not arrays); never
    faults, even where nothing is mapped."""
    def cg(context, builder, sig, args):
        _prefetch(builder, builder.inttoptr(args[0], ir.IntType(8).as_pointer()))
        return context.get_dummy_value()

    return types.void(addr), cg


@intrinsic
def prefetch_l2_at(typingctx, addr):
    """`prefetch_at` into the outer caches only (prefetcht2): a stretch asked for well ahead of
    its use (`crew.RUN_AHEAD`; `benchmarks/cold_runs_probe.py`: prefetcht2 of a run's first 4 KiB
    did better than prefetcht0 of the same bytes on the Zen 4 host)."""
    def cg(context, builder, sig, args):
        _prefetch(builder, builder.inttoptr(args[0], ir.IntType(8).as_pointer()), locality=1)
        return context.get_dummy_value()

    return types.void(addr), cg


@intrinsic
def prefetch_write_at(typingctx, addr):
    """Hint: bring the line at a raw byte address into the caches for writing (prefetchw: it
    arrives owned, so a store there does not wait for it); never faults."""
    def cg(context, builder, sig, args):
        _prefetch(builder, builder.inttoptr(args[0], ir.IntType(8).as_pointer()), write=True)
        return context.get_dummy_value()

    return types.void(addr), cg

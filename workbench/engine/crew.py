"""Workers that take one-token products inside compiled code: hand-offs without the GIL.

A decoded token needs ~75 matrix products of 5-100 us each. Handing each one to a
Python thread costs 25-50 us (a thread wake-up and a GIL transfer), so before the
crew only the output matrix was worth splitting. Here, for a whole forward pass,
the pool's workers 1..N-1 sit in a compiled loop (`serve`, GIL released): they spin
on a job counter, take row chunks of the posted products through an atomic counter
(or the chunks the job pins to them), and acknowledge. The calling thread posts a
job, works on its chunks too and waits for the acknowledgements (`Crew.run`): one
hand-off costs about a microsecond.

A job is a table of matrix-vector *tasks* (a weight matrix, a prepared input, an
output vector) and a table of *chunks* (a task's row range, and the worker it is
pinned to or -1 for anyone). Every output row is one kernel call's dot product
whoever computes it, so results are the same to the bit at any thread count.

The waiting side spins with `pause`; after ~50 us without news it yields its CPU
(sched_yield) between looks, so a worker never starves another process for long. It does not
only spin: a decoded token's jobs come in an order known in advance, so each job names the next
(`link`), and whoever runs out of a job's chunks first, a worker waiting for the next job or the
caller waiting for acknowledgements, reads its first rows of that next job into its caches
(`_next_rows`); between two jobs the caller names the next one too (`ahead`).
"""
from __future__ import annotations

import platform
import time
from typing import Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import kernels
from .kernels.llvm_ir import declare
from .kernels.intrinsics.streams import prefetch_at, prefetch_l2_at, prefetch_write_at

from .kernels.jitcache import JIT as _NB
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")

# ---- task table: one row per (product, array) -------------------------------------------
(T_TYPE, T_W, T_ROWS, T_ROWLEN, T_PREP, T_OUT, T_OUTOFF, T_XROW, T_OUTROW,
 T_X0, T_N0, T_X1, T_N1, T_X2, T_N2, T_OUTADDR,
 T_LO, T_HI, T_WSHIFT, T_XOFF, T_XLEN, T_NEXT_T, T_NEXT_C, T_NEXT_NC, T_NEXT_NO,
 T_WA_AT, T_WA_N, T_WA_STRIDE, T_WA_PER,
 T_NCOL, T_OSTRIDE, T_FN, T_FULLROWS, T_XFAM) = range(34)
TASK_FIELDS = 34
# T_LO, T_HI: a chunk's rows count from T_LO and stop at T_HI (attention: the filled, in-window
# key positions; products: 0 and no limit); T_WSHIFT: bytes added to the weight address
# (attention: values seen from a later slot); T_XOFF, T_XLEN: the input starts T_XOFF elements
# into its row and is T_XLEN long (0: the whole row)
# T_NEXT_T, T_NEXT_C, T_NEXT_NC, T_NEXT_NO (the first task's row only): the job a decoded token
# posts after this one (its task and chunk tables' addresses, chunk and pinned-chunk counts; 0: not
# known), set once by `link`: whoever of the caller and the workers runs out of this job's chunks
# first reads its rows of that job into its caches while the other finishes (`_next_rows`)
# T_WA_AT, T_WA_N, T_WA_STRIDE, T_WA_PER (the first task's row only, `write_ahead`): T_WA_N runs of
# T_WA_PER lines, T_WA_STRIDE bytes apart from address T_WA_AT, that the caller stores to (or reads)
# after the job: it asks for them, owned, right after posting the job (once; the count is cleared)
# T_NCOL, T_OSTRIDE, T_FN, T_FULLROWS, T_XFAM: a prompt's product (`prompt_jobs`, run by its own
# chunk function): T_NCOL consecutive input rows from the task's input row into as many output
# rows T_OSTRIDE bytes apart, by the kernel compiled at address T_FN (the sub-matrix's full row
# count T_FULLROWS; T_XFAM the prepared input's arrays, `prompt_jobs.FAMILY_INPUTS`)
NO_LIMIT = 1 << 62
# ---- chunk table: one row per piece of work ----------------------------------------------
C_TASK, C_LO, C_HI, C_OWNER, C_SPAN = range(5)  # tasks C_TASK.. C_TASK + C_SPAN - 1
CHUNK_FIELDS = 5
# ---- control block (int64, one cache line per field that changes) ------------------------
SEQ = 0          # job number (negative: leave the loop)
CHUNK_FN = 1     # address of the compiled `run_chunk` (the job loop calls the kernels through it)
# the job that comes next (`ahead`): its task and chunk tables, chunk counts, and a count bumped at
# each hint; workers waiting for that job read the rows they will likely take into their caches
# meanwhile. AHEAD_ON: the workers share one node
AHEAD_TASKS, AHEAD_CHUNKS, AHEAD_GEN, AHEAD_ON, AHEAD_N_CHUNKS, AHEAD_N_OWNED = 2, 3, 4, 5, 6, 7
NEXT = 8         # next shared chunk to take (atomic counter)
TASKS = 16       # address of the job's task table
CHUNKS = 17      # address of its chunk table
N_OWNED = 18     # chunks [0, N_OWNED) are pinned to a worker; [N_OWNED, N_CHUNKS) are shared
N_CHUNKS = 19
N_TASKS = 20
LEAD_FN = 21     # address of the compiled `lead_core` (`lead` calls it through this, see `_call_core`)
STEAL = 22       # the posted job's worker count when its pinned chunks may be stolen, else 0 (`STEALABLE`)
CURSORS = 23     # where the per-worker cursors start: ctl[CURSORS] + 8 * w (a line each)
FAILED = 24      # set by a worker whose loop raised (the caller stops waiting)
WAITED = 25      # nanoseconds the caller spent waiting for acknowledgements (not working)
SOLO = 26        # non-zero: the caller runs every job alone, every chunk, pinned or not (`Crew.start`)
# a trace (`Crew.trace`): addresses of int64 logs and their fill counts, kept across `start`
TRACE_LEAD, TRACE_LEAD_N, TRACE_WORK, TRACE_WORK_N = 27, 28, 29, 30
TRACE_CAP = 31   # int64 entries in each log
ACK = 32         # ACK + 8 * w: last job worker w finished
# ... then per worker w, at ctl[CURSORS] + 8 * w: its pinned chunks taken from the front (high 32
# bits: by w) and from the back (low 32 bits: by others), and at + 1 its steal group (its node)
SPINS_BEFORE_YIELD = 2000
# a worker waiting longer than its next job's rows take to read (the caller's Python between two
# tokens, ~150 us) goes on along the links, job after job, reading its likely rows of each into
# its caches, this many bytes in all (a part of a 2 MB L2)
READ_AHEAD_BYTES = 1 << 20
ROWS_TILE_BYTES = 16 << 10  # a span's tile of weight rows, run over each of its inputs from L1
# added to a job's pinned-chunk count (`lead`'s n_owned): a worker done with its own pinned chunks
# takes those of a worker of its group (node) that is behind, from the end of that worker's list.
# Pinned halves keep each worker on long contiguous streams (finer shared chunks streamed 25-35 %
# slower on the EPYC VM), but under a hypervisor either vCPU can run 5-20 % slower for a while:
# the other one then waited at every expert job.
STEALABLE = 1 << 40
STEAL_TAIL = 4   # the owner claims its pieces in runs, leaving at least this many at its list's end
_LOW32 = (1 << 32) - 1


# ----------------------------------------------------------------------------- intrinsics
def _slot(context, builder, aty, arr, idx):
    ary = context.make_array(aty)(context, builder, arr)
    return builder.gep(ary.data, [idx])


@intrinsic
def atomic_load(typingctx, arr, idx):
    """arr[idx] with acquire ordering (int64 array)."""
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_slot(context, builder, sig.args[0], *args), "acquire", 8)
    return types.int64(arr, idx), codegen


@intrinsic
def atomic_store(typingctx, arr, idx, val):
    """arr[idx] = val with release ordering (int64 array)."""
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _slot(context, builder, sig.args[0], args[0], args[1]), "release", 8)
        return context.get_dummy_value()
    return types.void(arr, idx, types.int64), codegen


@intrinsic
def fetch_add(typingctx, arr, idx, val):
    """Atomically add val to arr[idx]; returns the previous value."""
    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _slot(context, builder, sig.args[0], args[0], args[1]), args[2],
                                  "seq_cst")
    return types.int64(arr, idx, types.int64), codegen


@intrinsic
def compare_swap(typingctx, arr, idx, old, new):
    """arr[idx] = new if it holds old (atomically); True if it did."""
    def codegen(context, builder, sig, args):
        res = builder.cmpxchg(_slot(context, builder, sig.args[0], args[0], args[1]), args[2], args[3],
                              "seq_cst", "seq_cst")
        return builder.extract_value(res, 1)
    return types.boolean(arr, idx, types.int64, types.int64), codegen


@numba.njit(inline="always")
def ahead(ctl, job) -> None:
    """Tell the waiting workers which job comes next (`job`: its (tasks, chunks, n_owned)): while
    the caller runs the serial steps between two jobs (norms, activation, input quantization),
    each reads the weight rows it will likely take (`_ahead_rows`) into its caches instead of
    spinning."""
    if ctl[AHEAD_ON] != 0:
        tasks, chunks, n_owned = job
        ctl[AHEAD_TASKS] = address(tasks)
        ctl[AHEAD_CHUNKS] = address(chunks)
        ctl[AHEAD_N_CHUNKS] = chunks.shape[0]
        ctl[AHEAD_N_OWNED] = n_owned & (STEALABLE - 1)
        atomic_store(ctl, AHEAD_GEN, ctl[AHEAD_GEN] + 1)


@numba.njit(inline="always")
def write_ahead(tasks, at, n, stride, per) -> None:
    """Have the next run of the job whose task table is `tasks` ask, right after its post, for n
    runs of `per` lines at `at`, `at + stride`, ... owned (prefetchw): lines the caller stores to
    after the job, each cold and on its own line (a decoded token's values down the transposed
    cache's column), and the lines around them the values job then reads.
    Asked for in a burst on the caller's serial path, 256 such lines held it 4.5-5.7 us (a line
    fill buffer each, Intel Xeon host); asked right after the post, while the workers stream the
    job's weights, they come in beside them and a worker takes over the caller's last pieces
    meanwhile (2 threads: 106.6 -> 107.4 t/s). A caller alone asks after its part instead, as
    before, while the norms and RoPE run: a burst before its own stream cost 1.4 % at 1 thread."""
    if tasks.shape[0] > 0:
        tasks[0, T_WA_AT] = at
        tasks[0, T_WA_STRIDE] = stride
        tasks[0, T_WA_PER] = per
        tasks[0, T_WA_N] = n


@numba.njit(inline="always")
def _write_ahead_now(tasks) -> None:
    n = tasks[0, T_WA_N] if tasks.shape[0] > 0 else 0
    if n > 0:
        at, stride, per = tasks[0, T_WA_AT], tasks[0, T_WA_STRIDE], tasks[0, T_WA_PER]
        for r in range(n):
            for j in range(per):
                prefetch_write_at(at + r * stride + 64 * j)
        tasks[0, T_WA_N] = 0


@numba.njit(inline="always")
def _ahead_rows(ctl, me):
    """Byte range [lo, hi) of the hinted job's weights worker `me` will likely read first: its
    first pinned chunk, or shared chunk number `me` (the caller, worker 0, posts and takes the
    first one at once)."""
    return _rows_of(ctl[AHEAD_TASKS], ctl[AHEAD_CHUNKS], ctl[AHEAD_N_CHUNKS], ctl[AHEAD_N_OWNED], me)


@numba.njit(inline="always")
def _next_rows(tasks_at, me):
    """`_ahead_rows` of the job linked after the one whose task table is at `tasks_at` (`link`);
    (0, 0) when none is."""
    task = array_at(tasks_at, TASK_FIELDS, np.int64)
    if task[T_NEXT_T] == 0:
        return 0, 0
    return _rows_of(task[T_NEXT_T], task[T_NEXT_C], task[T_NEXT_NC], task[T_NEXT_NO], me)


@numba.njit(inline="always")
def _rows_of(tasks_at, chunks_at, n_chunks, n_owned, me):
    chunks = array_at(chunks_at, n_chunks * CHUNK_FIELDS, np.int64)
    c = -1
    for i in range(n_owned):
        if chunks[i * CHUNK_FIELDS + C_OWNER] == me:
            c = i
            break
    if c < 0 and n_owned + me < n_chunks:
        c = n_owned + me
    if c < 0:
        return 0, 0
    t = chunks[c * CHUNK_FIELDS + C_TASK]
    # a pinned chunk's run: the pieces of the same task that follow it (one stream)
    last = c
    while (c < n_owned and last + 1 < n_owned and chunks[(last + 1) * CHUNK_FIELDS + C_OWNER] == me
           and chunks[(last + 1) * CHUNK_FIELDS + C_TASK] == t
           and chunks[(last + 1) * CHUNK_FIELDS + C_LO] == chunks[last * CHUNK_FIELDS + C_HI]):
        last += 1
    task = array_at(tasks_at + 8 * TASK_FIELDS * t, TASK_FIELDS, np.int64)
    w = task[T_W] + task[T_WSHIFT]
    # rows count from T_LO and stop at T_HI (attention: the previous call's window, one row off)
    lo = task[T_LO] + chunks[c * CHUNK_FIELDS + C_LO]
    hi = min(task[T_LO] + chunks[last * CHUNK_FIELDS + C_HI], task[T_HI], task[T_ROWS])
    return w + lo * task[T_ROWLEN], w + max(hi, lo) * task[T_ROWLEN]


# A worker's pinned runs are often short and scattered (a decoded token's routed experts: at R1's
# widths 128 rows x 256 of Q4_K, 18 KiB, each somewhere else in the file): each started cold, at
# about a third of its speed from the caches (`benchmarks/cold_runs_probe.py`). Before running
# one, the worker asks for the first RUN_AHEAD bytes of its next run into the outer caches
# (`prefetch_l2_at`) when that run does not simply continue this one (the hardware prefetcher
# follows that). 8 KiB is what the engine was measured with (benchmarks/HISTORY.md).
RUN_AHEAD = 8192


@numba.njit(inline="always")
def next_run_bytes(tasks, chunks, n_owned, me, last, anyone):
    """Byte range [a, b) of the first RUN_AHEAD bytes of the pinned run worker `me` takes after
    chunk `last` (`anyone`: the next pinned chunk whoever owns it: a worker alone runs them all);
    (0, 0) when there is none or it continues chunk `last`'s rows (one stream: the hardware
    prefetcher follows it)."""
    c = last + 1
    while c < n_owned and not anyone and chunks[c, C_OWNER] != me:
        c += 1
    if c >= n_owned:
        return 0, 0
    t = chunks[c, C_TASK]
    if t == chunks[last, C_TASK] and chunks[c, C_LO] == chunks[last, C_HI]:
        return 0, 0
    w = tasks[t, T_W] + tasks[t, T_WSHIFT]
    lo = tasks[t, T_LO] + chunks[c, C_LO]
    hi = min(tasks[t, T_LO] + chunks[c, C_HI], tasks[t, T_HI], tasks[t, T_ROWS])
    if hi <= lo:
        return 0, 0
    a = (w + lo * tasks[t, T_ROWLEN]) & ~63
    return a, min(w + hi * tasks[t, T_ROWLEN], a + RUN_AHEAD)


@numba.njit(inline="always")
def _run_ahead(tasks, chunks, n_owned, me, last, anyone) -> None:
    """Ask for `next_run_bytes` into the outer caches (prefetcht2)."""
    a, b = next_run_bytes(tasks, chunks, n_owned, me, last, anyone)
    for pa in range(a, b, 64):
        prefetch_l2_at(pa)


@numba.njit(inline="always")
def _read_ahead(pa):
    """Prefetch the 512 bytes at address pa (a waiting thread's step between two looks at the
    job counter); returns where the next step starts."""
    for i in range(8):
        prefetch_at(pa + 64 * i)
    return pa + 512


# A caller with no workers has nobody to read the next job's rows while it runs the serial steps
# between two jobs (norms, RoPE, quantization): it asks for the first CALLER_AHEAD bytes of each of
# the next job's two streams (the kernels read a range's two halves in turn) before those steps,
# so the product starts on lines already on their way instead of waiting out the memory's latency
CALLER_AHEAD = 1024


@numba.njit(inline="always")
def _caller_ahead(ctl, tasks) -> None:
    if ctl[AHEAD_ON] == 0:
        return
    pa, pend = _next_rows(address(tasks), 0)
    if pend <= pa:
        return
    mid = (pa + (pend - pa) // 2) & ~63
    n = min(pend - pa, CALLER_AHEAD)
    for off in range(0, n, 64):
        prefetch_at(pa + off)
        prefetch_at(mid + off)


@intrinsic
def cpu_relax(typingctx):
    """The x86 `pause` hint inside a spin loop (nothing elsewhere)."""
    def codegen(context, builder, sig, args):
        if _X86:
            builder.call(declare(builder, "llvm.x86.sse2.pause", ir.VoidType(), []), [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def yield_cpu(typingctx):
    """sched_yield(2): let another runnable thread have this CPU."""
    def codegen(context, builder, sig, args):
        builder.call(declare(builder, "sched_yield", ir.IntType(32), []), [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def now_ns(typingctx):
    """clock_gettime(CLOCK_MONOTONIC) in nanoseconds (vDSO: tens of nanoseconds)."""
    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = declare(builder, "clock_gettime", ir.IntType(32), [ir.IntType(32), i64.as_pointer()])
        ts = builder.alloca(ir.ArrayType(i64, 2))
        p = builder.bitcast(ts, i64.as_pointer())
        builder.call(fn, [ir.Constant(ir.IntType(32), 1), p])
        sec = builder.load(p)
        nsec = builder.load(builder.gep(p, [ir.Constant(ir.IntType(32), 1)]))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)
    return types.int64(), codegen


@intrinsic
def address(typingctx, arr):
    """The address of an array's first element."""
    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, ir.IntType(64))
    return types.int64(arr), codegen


@intrinsic
def _voidptr(typingctx, addr):
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))
    return types.voidptr(types.int64), codegen


_I64 = types.int64
_VEC, _TAB = types.Array(_I64, 1, "C"), types.Array(_I64, 2, "C")
# lead_core's one signature: ctl, n_workers, tasks, chunks, n_owned, xa, xb, outs, row_lo, row_hi, w_shift
CORE_ARGS = (_VEC, _I64, _TAB, _TAB, _I64, _TAB, _TAB, _TAB, _I64, _I64, _I64)


def compiled_address(dispatcher, argtypes: tuple) -> int:
    """The address of `dispatcher` compiled for `argtypes` (compiled or loaded from the cache now)."""
    dispatcher.compile(argtypes)
    cres = dispatcher.overloads[argtypes]
    return int(cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name))


# run_chunk's one signature: tasks, t, span, lo, hi
CHUNK_ARGS = (_TAB, _I64, _I64, _I64, _I64)


def call_by_address(context, builder, restype, argtypes, addr, args):
    """Call the function compiled for `argtypes` at address `addr` (numba's calling convention)."""
    cc = context.call_conv
    fn = builder.inttoptr(addr, cc.get_function_type(restype, argtypes).as_pointer())
    status, res = cc.call_function(builder, fn, restype, argtypes, args)
    with cgutils.if_unlikely(builder, status.is_error):
        cc.return_status_propagate(builder, status)
    return res


@intrinsic
def call_chunk(typingctx, addr, tasks, t, span, lo, hi):
    """run_chunk(tasks, t, span, lo, hi) called through its address (ctl[CHUNK_FN]), like `_call_core`."""
    if tasks != _TAB:
        raise numba.core.errors.TypingError(f"run_chunk takes {_TAB}, got {tasks}")
    sig = types.none(_I64, *CHUNK_ARGS)

    def codegen(context, builder, sig, args):
        call_by_address(context, builder, types.none, CHUNK_ARGS, args[0], args[1:])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _call_core(typingctx, addr, ctl, n_workers, tasks, chunks, n_owned, xa, xb, outs, row_lo, row_hi, w_shift):
    """lead_core(ctl, ...) called through its address `addr` (numba's calling convention) instead of
    by name: a compiled caller of `lead` then does not link lead_core, the job loop and every
    kernel into its own code and optimize them once more (numba re-optimizes a callee's code in
    every caller): those were most of the compile time of each one-token runner. The address is
    data (`Crew` puts it in ctl[LEAD_FN]), so callers stay in the disk cache."""
    got = (ctl, n_workers, tasks, chunks, n_owned, xa, xb, outs, row_lo, row_hi, w_shift)
    for have, want in zip(got, CORE_ARGS):
        if isinstance(want, types.Array) and have != want:
            raise numba.core.errors.TypingError(f"lead_core takes {want}, got {have}")
    sig = types.boolean(_I64, *CORE_ARGS)

    def codegen(context, builder, sig, args):
        return call_by_address(context, builder, types.boolean, CORE_ARGS, args[0], args[1:])
    return sig, codegen


def core_address(lead_core) -> int:
    """The address of lead_core compiled for `CORE_ARGS` (compiled or loaded from the cache now)."""
    return compiled_address(lead_core, CORE_ARGS)


@numba.njit(inline="always")
def array_at(addr, n, dtype):
    """The `n` items of `dtype` at address `addr` as a 1-D array (no copy)."""
    return numba.carray(_voidptr(addr), (n,), dtype)


def _array_row(a):
    """(address, bytes from one row to the next (0 for a 1-D array), row length, item size)."""


@overload(_array_row)
def _array_row_impl(a):
    if a.ndim == 2:
        return lambda a: (address(a), a.strides[0], a.shape[1], a.itemsize)
    return lambda a: (address(a), 0, a.size, a.itemsize)


def input_table(xp):
    """A prepared input (tuple of 1 or 3 arrays) as int64 rows (address, row stride, length, item size)."""


@overload(input_table)
def _input_table_impl(xp):
    if len(xp) == 1:
        def one(xp):
            tab = np.empty((1, 4), dtype=np.int64)
            tab[0, 0], tab[0, 1], tab[0, 2], tab[0, 3] = _array_row(xp[0])
            return tab
        return one

    def three(xp):
        tab = np.empty((3, 4), dtype=np.int64)
        tab[0, 0], tab[0, 1], tab[0, 2], tab[0, 3] = _array_row(xp[0])
        tab[1, 0], tab[1, 1], tab[1, 2], tab[1, 3] = _array_row(xp[1])
        tab[2, 0], tab[2, 1], tab[2, 2], tab[2, 3] = _array_row(xp[2])
        return tab
    return three


def output_table(outs):
    """Outputs (a tuple of float32 arrays, 1-D or 2-D) as int64 rows (address, row stride)."""


@overload(output_table)
def _output_table_impl(outs):
    def impl(outs):
        tab = np.empty((len(outs), 2), dtype=np.int64)
        k = 0
        for o in outs:
            a = _array_row(o)
            tab[k, 0] = a[0]
            tab[k, 1] = a[1]
            k += 1
        return tab
    return impl


@numba.njit(**_NB)
def _trace(ctl, at, a, b, c, d):
    """Append one record (4 int64) to the trace log whose address is ctl[at] (entries used at
    ctl[at + 1], taken atomically: the workers share their log; capacity at ctl[TRACE_CAP]); a full
    log drops records."""
    i = fetch_add(ctl, at + 1, 4)
    if i + 4 <= ctl[TRACE_CAP]:
        lg = array_at(ctl[at], ctl[TRACE_CAP], np.int64)
        lg[i] = a
        lg[i + 1] = b
        lg[i + 2] = c
        lg[i + 3] = d


_F16 = kernels.F16


@numba.njit(**_NB)
def same_matrix_heads(tasks, t, span):
    """(input stride, output stride) in floats when tasks t..t+span-1 are F16 products of one
    matrix over inputs and outputs equally spaced (a kv head's query heads), else (-1, -1)."""
    if span < 2 or tasks[t, T_TYPE] != _F16:
        return -1, -1
    dx = tasks[t + 1, T_X0] - tasks[t, T_X0]
    do = tasks[t + 1, T_OUTADDR] - tasks[t, T_OUTADDR]
    if dx < 0 or do < 0 or dx % 4 or do % 4:
        return -1, -1
    for u in range(t + 1, t + span):
        if (tasks[u, T_TYPE] != _F16 or tasks[u, T_W] + tasks[u, T_WSHIFT] != tasks[t, T_W] + tasks[t, T_WSHIFT]
                or tasks[u, T_ROWS] != tasks[t, T_ROWS] or tasks[u, T_ROWLEN] != tasks[t, T_ROWLEN]
                or tasks[u, T_N0] != tasks[t, T_N0] or tasks[u, T_X0] - tasks[u - 1, T_X0] != dx
                or tasks[u, T_OUTADDR] - tasks[u - 1, T_OUTADDR] != do):
            return -1, -1
    return dx // 4, do // 4


# ----------------------------------------------------------------------------- the loop
def _build(mv: dict, x8_columns):
    """serve / work / lead compiled over one kernel path's matvec functions (and its Q4_K_x8 product
    of 4 scattered columns, `kernels.x8_columns_kernel`)."""
    F32, F16, BF16 = kernels.F32, kernels.F16, kernels.BF16
    Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 = kernels.Q8_0, kernels.Q4_0, kernels.Q5_0, kernels.Q4_1, kernels.Q5_1
    Q4_K, Q5_K, Q6_K = kernels.Q4_K, kernels.Q5_K, kernels.Q6_K
    mv_f32, mv_f16, mv_bf16 = mv[F32], mv[F16], mv[BF16]
    mv_q8_0, mv_q4_0, mv_q5_0, mv_q4_1, mv_q5_1 = mv[Q8_0], mv[Q4_0], mv[Q5_0], mv[Q4_1], mv[Q5_1]
    mv_q4_K, mv_q5_K, mv_q6_K = mv[Q4_K], mv[Q5_K], mv[Q6_K]
    IQ4_NL, IQ4_XS, Q3_K, Q2_K = kernels.IQ4_NL, kernels.IQ4_XS, kernels.Q3_K, kernels.Q2_K
    mv_iq4_nl, mv_iq4_xs, mv_q3_K, mv_q2_K = mv[IQ4_NL], mv[IQ4_XS], mv[Q3_K], mv[Q2_K]
    Q4_K_X8 = kernels.Q4_K_X8  # (the portable path has no packed layout: the engine never packs there)
    mv_q4_K_x8 = mv.get(Q4_K_X8, mv[Q4_K])
    Q5_0_X2 = kernels.Q5_0_X2  # (AVX-512 VNNI only)
    mv_q5_0_x2 = mv.get(Q5_0_X2, mv[Q5_0])
    Q8_0_X2 = kernels.Q8_0_X2  # (AVX-512 VNNI only)
    mv_q8_0_x2 = mv.get(Q8_0_X2, mv[Q8_0])
    Q4_0_X8, IQ4_NL_X8 = kernels.Q4_0_X8, kernels.IQ4_NL_X8  # (AVX-512 VNNI only)
    mv_q4_0_x8, mv_iq4_nl_x8 = mv.get(Q4_0_X8, mv[Q4_0]), mv.get(IQ4_NL_X8, mv[IQ4_NL])
    # 3-D mul_mat weights (MLA's attn_k_b / attn_v_b) of types llama.cpp repacks as matrices (SIMD paths)
    Q4_0_P, Q2_K_P, Q4_K_P, IQ4_NL_P = (kernels.Q4_0_PLAIN, kernels.Q2_K_PLAIN, kernels.Q4_K_PLAIN,
                                        kernels.IQ4_NL_PLAIN)
    mv_q4_0_p, mv_q2_K_p = mv.get(Q4_0_P, mv[Q4_0]), mv.get(Q2_K_P, mv[Q2_K])
    mv_q4_K_p, mv_iq4_nl_p = mv.get(Q4_K_P, mv[Q4_K]), mv.get(IQ4_NL_P, mv[IQ4_NL])
    mv_f16_heads = kernels.heads_kernel()
    i8, i32, f32, u8 = np.int8, np.int32, np.float32, np.uint8

    @numba.njit(inline="always")
    def run_task(tasks, t, lo, hi):
        typ = tasks[t, T_TYPE]
        w = numba.carray(_voidptr(tasks[t, T_W] + tasks[t, T_WSHIFT]), (tasks[t, T_ROWS], tasks[t, T_ROWLEN]), u8)
        out = array_at(tasks[t, T_OUTADDR], tasks[t, T_ROWS], f32)
        x0, n0 = tasks[t, T_X0], tasks[t, T_N0]
        x1, n1, x2, n2 = tasks[t, T_X1], tasks[t, T_N1], tasks[t, T_X2], tasks[t, T_N2]
        if typ == F16:
            mv_f16(w, (array_at(x0, n0, f32),), out, lo, hi)
        elif typ == F32:
            mv_f32(w, (array_at(x0, n0, f32),), out, lo, hi)
        elif typ == BF16:
            mv_bf16(w, (array_at(x0, n0, f32),), out, lo, hi)
        elif typ == Q4_1 or typ == Q5_1:
            xp = (array_at(x0, n0, i8), array_at(x1, n1, f32), array_at(x2, n2, f32))
            if typ == Q4_1:
                mv_q4_1(w, xp, out, lo, hi)
            else:
                mv_q5_1(w, xp, out, lo, hi)
        else:
            xp = (array_at(x0, n0, i8), array_at(x1, n1, f32), array_at(x2, n2, i32))
            if typ == Q8_0_X2:
                mv_q8_0_x2(w, xp, out, lo, hi)
            elif typ == Q8_0:
                mv_q8_0(w, xp, out, lo, hi)
            elif typ == Q4_0:
                mv_q4_0(w, xp, out, lo, hi)
            elif typ == Q4_0_X8:
                mv_q4_0_x8(w, xp, out, lo, hi)
            elif typ == IQ4_NL_X8:
                mv_iq4_nl_x8(w, xp, out, lo, hi)
            elif typ == Q5_0:
                mv_q5_0(w, xp, out, lo, hi)
            elif typ == Q5_0_X2:
                mv_q5_0_x2(w, xp, out, lo, hi)
            elif typ == Q4_K_X8:
                mv_q4_K_x8(w, xp, out, lo, hi)
            elif typ == Q4_K:
                mv_q4_K(w, xp, out, lo, hi)
            elif typ == Q5_K:
                mv_q5_K(w, xp, out, lo, hi)
            elif typ == Q6_K:
                mv_q6_K(w, xp, out, lo, hi)
            elif typ == IQ4_NL:
                mv_iq4_nl(w, xp, out, lo, hi)
            elif typ == IQ4_XS:
                mv_iq4_xs(w, xp, out, lo, hi)
            elif typ == Q3_K:
                mv_q3_K(w, xp, out, lo, hi)
            elif typ == Q2_K:
                mv_q2_K(w, xp, out, lo, hi)
            elif typ == Q4_0_P:
                mv_q4_0_p(w, xp, out, lo, hi)
            elif typ == Q4_K_P:
                mv_q4_K_p(w, xp, out, lo, hi)
            elif typ == Q2_K_P:
                mv_q2_K_p(w, xp, out, lo, hi)
            elif typ == IQ4_NL_P:
                mv_iq4_nl_p(w, xp, out, lo, hi)

    @numba.njit(inline="always")
    def x8_operands(tasks, t):
        """Task t's Q8_K input (quants as bytes, scales, sums) and its output, as arrays."""
        return (array_at(tasks[t, T_X0], tasks[t, T_N0], u8), array_at(tasks[t, T_X1], tasks[t, T_N1], f32),
                array_at(tasks[t, T_X2], tasks[t, T_N2], i32), array_at(tasks[t, T_OUTADDR], tasks[t, T_ROWS], f32))

    @numba.njit(**_NB)
    def run_chunk(tasks, t, span, lo, hi):
        """Rows lo..hi of tasks t..t+span-1: one F16 call for the query heads of a kv head (each
        key or V^T row converted once for all of them: `kernels.f16_heads`), else one kernel call
        per task."""
        xs, os = same_matrix_heads(tasks, t, span)
        if xs >= 0:
            rows, n0 = tasks[t, T_ROWS], tasks[t, T_N0]
            w = numba.carray(_voidptr(tasks[t, T_W] + tasks[t, T_WSHIFT]), (rows, tasks[t, T_ROWLEN]), u8)
            x = array_at(tasks[t, T_X0], (span - 1) * xs + n0, f32)
            out = array_at(tasks[t, T_OUTADDR], (span - 1) * os + rows, f32)
            mv_f16_heads(w, x, xs, n0, span, out, os, lo, hi)
            return
        if span == 1:
            run_task(tasks, t, lo, hi)
            return
        # one weight piece over several inputs (`rows_job`): in tiles of rows that stay in L1
        step = max(ROWS_TILE_BYTES // max(tasks[t, T_ROWLEN], 1) // 16 * 16, 16)
        # a Q4_K_x8 weight: 4 inputs a weight load (`kernels.x8_columns_kernel`; a last 3 padded
        # with a repeat, the same bits twice) where that is faster than the gemv per input: from 3
        # inputs on rows of 2+ super-blocks, from 8 on rows of one (its tile's fixed steps weigh
        # more there). benchmarks/x8_columns_probe.py, one core, from memory (AMD EPYC family 25
        # model 17): 512 x 2048 in 16-row tiles, 3 / 4 / 8 inputs, gemvs 77 / 96 / 170 us, quads
        # 62 / 63 / 106; 256 x 256 in 112-row tiles, 4 / 8 inputs, gemvs 6.5 / 11.7, quads 7.0 / 10.9
        x8 = tasks[t, T_TYPE] == Q4_K_X8 and (span >= 8 or (span >= 3 and tasks[t, T_ROWLEN] >= 288))
        w = numba.carray(_voidptr(tasks[t, T_W] + tasks[t, T_WSHIFT]), (tasks[t, T_ROWS], tasks[t, T_ROWLEN]), u8)
        for a in range(lo, hi, step):
            b = min(a + step, hi)
            u = t
            if x8:
                while u + 3 <= t + span:
                    p0, p1 = x8_operands(tasks, u), x8_operands(tasks, u + 1)
                    p2, p3 = x8_operands(tasks, u + 2), x8_operands(tasks, min(u + 3, t + span - 1))
                    x8_columns(w, (p0[0], p1[0], p2[0], p3[0]), (p0[1], p1[1], p2[1], p3[1]),
                               (p0[2], p1[2], p2[2], p3[2]), (p0[3], p1[3], p2[3], p3[3]), a, b, True)
                    u += 4
            for v in range(u, t + span):
                run_task(tasks, v, a, b)

    # The job loop below calls run_chunk -- and so the kernels -- through its address (ctl[CHUNK_FN]):
    # numba re-optimizes and re-emits a callee's code in every caller, so calling it by name
    # emitted every active kernel again in run_pinned, steal_pinned, work, serve and lead_core
    # (9.3 s of a first start's crew compile on the AVX2 EPYC host)
    @numba.njit(**_NB)
    def run_pinned(fn, tasks, chunks, c, last):
        """The rows of chunks c..last (one run of pieces of the same tasks; last == c: one chunk),
        in one run_chunk call; a chunk's tasks share the first one's row limits."""
        t0 = chunks[c, C_TASK]
        lo, hi = tasks[t0, T_LO] + chunks[c, C_LO], min(tasks[t0, T_LO] + chunks[last, C_HI], tasks[t0, T_HI])
        if lo < hi:
            call_chunk(fn, tasks, t0, chunks[c, C_SPAN], lo, hi)

    @numba.njit(**_NB)
    def steal_pinned(ctl, me, tasks, chunks, n_owned):
        """Worker me's pinned chunks in order, each claimed on its cursor (front count + 1); then,
        while a worker of its group has some left, the last of them (back count + 1): whole
        chunks, each run by exactly one worker with the same kernel calls."""
        base = ctl[CURSORS]
        n_workers = ctl[STEAL]
        mine = 0
        for c in range(n_owned):
            if chunks[c, C_OWNER] == me:
                mine += 1
        at = base + 8 * me
        pos = 0
        while True:
            cur = atomic_load(ctl, at)
            f = cur >> 32
            left = mine - f - (cur & _LOW32)
            if left <= 0:
                break
            while chunks[pos, C_OWNER] != me:
                pos += 1
            # claim the following pieces of the same rows' run too (one kernel call, one stream),
            # all but the last STEAL_TAIL of the list, which stay for a thief to take one by one
            n, prev, nxt = 1, pos, pos + 1
            while n < left - STEAL_TAIL:
                while nxt < n_owned and chunks[nxt, C_OWNER] != me:
                    nxt += 1
                if (nxt >= n_owned or chunks[nxt, C_TASK] != chunks[pos, C_TASK]
                        or chunks[nxt, C_SPAN] != chunks[pos, C_SPAN] or chunks[nxt, C_LO] != chunks[prev, C_HI]
                        or chunks[nxt, C_HI] - chunks[nxt, C_LO] != chunks[pos, C_HI] - chunks[pos, C_LO]):
                    break
                n += 1
                prev = nxt
                nxt += 1
            if compare_swap(ctl, at, cur, cur + (n << 32)):
                _run_ahead(tasks, chunks, n_owned, me, prev, False)
                run_pinned(ctl[CHUNK_FN], tasks, chunks, pos, prev)  # prev: the run's last piece
                pos = prev + 1
        group = ctl[at + 1]
        for d in range(1, n_workers):
            v = (me + d) % n_workers
            vat = base + 8 * v
            if ctl[vat + 1] != group:
                continue
            theirs = 0
            for c in range(n_owned):
                if chunks[c, C_OWNER] == v:
                    theirs += 1
            while True:
                cur = atomic_load(ctl, vat)
                back = cur & _LOW32
                if (cur >> 32) + back >= theirs:
                    break
                if compare_swap(ctl, vat, cur, cur + 1):
                    k = back  # the (k+1)-th of v's chunks from the end of its list
                    c = n_owned - 1
                    while True:
                        if chunks[c, C_OWNER] == v:
                            if k == 0:
                                break
                            k -= 1
                        c -= 1
                    run_pinned(ctl[CHUNK_FN], tasks, chunks, c, c)

    @numba.njit(**_NB)
    def work(ctl, me):
        """Worker `me`'s part of the posted job: its pinned chunks, then shared ones as they come."""
        n_tasks = ctl[N_TASKS]
        tasks = numba.carray(_voidptr(ctl[TASKS]), (n_tasks, TASK_FIELDS), np.int64)
        n_chunks = ctl[N_CHUNKS]
        chunks = numba.carray(_voidptr(ctl[CHUNKS]), (max(n_chunks, 1), CHUNK_FIELDS), np.int64)
        n_owned = ctl[N_OWNED]
        solo = ctl[SOLO] != 0
        if ctl[STEAL] != 0 and not solo:
            steal_pinned(ctl, me, tasks, chunks, n_owned)
        else:
            for c in range(n_owned):
                if solo or chunks[c, C_OWNER] == me:
                    _run_ahead(tasks, chunks, n_owned, me, c, solo)
                    run_pinned(ctl[CHUNK_FN], tasks, chunks, c, c)
        while True:
            c = n_owned + fetch_add(ctl, NEXT, 1)
            if c >= n_chunks:
                break
            t0 = chunks[c, C_TASK]
            lo, hi = tasks[t0, T_LO] + chunks[c, C_LO], min(tasks[t0, T_LO] + chunks[c, C_HI], tasks[t0, T_HI])
            if lo >= tasks[t0, T_HI]:  # shared chunks past the limit come last (attention): none left
                break
            if lo < hi:
                call_chunk(ctl[CHUNK_FN], tasks, t0, chunks[c, C_SPAN], lo, hi)

    @numba.njit(**_NB)
    def serve(ctl, me, seen):
        """Worker `me` (>= 1): do every job posted after job `seen` until SEQ turns negative;
        returns the nanoseconds spent working (the rest was waiting)."""
        busy = 0
        gen = atomic_load(ctl, AHEAD_GEN)
        pa = pend = 0
        pstart = 0
        hop = 0      # the task table whose linked job's rows [pstart, pend) are
        budget = 0   # bytes it may still read ahead along the links before the next job
        while True:
            spins = 0
            seq = atomic_load(ctl, SEQ)
            while seq == seen:
                g = atomic_load(ctl, AHEAD_GEN)
                if g != gen:   # a new hint: the job the caller prepares now
                    gen = g
                    a, b = _ahead_rows(ctl, me)
                    if a != pstart or b != pend:   # (the linked job's rows: already on their way)
                        pstart, pa, pend = a, a, b
                    hop = 0
                if pa < pend:  # read ahead 512 bytes at a time, looking for the job in between
                    pa = _read_ahead(pa)
                elif hop != 0 and budget > 0:  # a long wait (the caller's Python between tokens):
                    hop = array_at(hop, TASK_FIELDS, np.int64)[T_NEXT_T]   # the job after that one
                    if hop != 0:
                        pstart, pend = _next_rows(hop, me)
                        pa = pstart
                        budget -= max(pend - pstart, 512)   # (a cycle of links ends too)
                else:
                    cpu_relax()
                    spins += 1
                    if spins > SPINS_BEFORE_YIELD:
                        yield_cpu()
                seq = atomic_load(ctl, SEQ)
            pa = pend   # the job is here: a hint is for the wait before it
            hop = 0
            if seq < 0:
                return busy
            seen = seq
            t0 = now_ns()
            work(ctl, me)
            t1 = now_ns()
            busy += t1 - t0
            if ctl[TRACE_WORK] != 0:
                _trace(ctl, TRACE_WORK, me, seq, t0, t1)
            if ctl[AHEAD_ON] != 0:   # read ahead the linked job's rows while the caller finishes
                pa, pend = _next_rows(ctl[TASKS], me)
                pstart = pa
                hop, budget = ctl[TASKS], READ_AHEAD_BYTES - (pend - pa)
            atomic_store(ctl, ACK + 8 * me, seq)

    @numba.njit(**_NB)
    def wait_acks(ctl, n_workers, seq, pa, pend):
        """Until every worker acknowledged job seq (False if one failed); meanwhile the caller reads
        [pa, pend) into its caches (its first rows of the linked next job), 512 bytes a look."""
        for w in range(1, n_workers):
            spins = 0
            while atomic_load(ctl, FAILED) != 0 or atomic_load(ctl, ACK + 8 * w) != seq:
                if atomic_load(ctl, FAILED) != 0:
                    return False
                if pa < pend:
                    pa = _read_ahead(pa)
                    continue
                cpu_relax()
                spins += 1
                if spins > SPINS_BEFORE_YIELD:
                    yield_cpu()
        return True

    @numba.njit(**_NB)
    def lead_core(ctl, n_workers, tasks, chunks, n_owned, xa, xb, outs, row_lo, row_hi, w_shift):
        """`lead` over address tables (`input_table`, `output_table`): every argument an int64
        array or an int, so this, the crew's biggest function, compiles once (in the background
        while a model loads: `warm`) instead of once per tuple of input and output arrays."""
        for t in range(tasks.shape[0]):
            if row_hi >= 0:
                tasks[t, T_LO] = row_lo
                tasks[t, T_HI] = row_hi
            if w_shift >= 0:
                tasks[t, T_WSHIFT] = w_shift
            xp = xa if tasks[t, T_PREP] == 0 else xb
            row = tasks[t, T_XROW]
            if xp.shape[0] == 1:
                tasks[t, T_X0] = xp[0, 0] + row * xp[0, 1] + tasks[t, T_XOFF] * xp[0, 3]
                tasks[t, T_N0] = tasks[t, T_XLEN] if tasks[t, T_XLEN] > 0 else xp[0, 2] - tasks[t, T_XOFF]
            else:
                tasks[t, T_X0] = xp[0, 0] + row * xp[0, 1]
                tasks[t, T_N0] = xp[0, 2]
                tasks[t, T_X1] = xp[1, 0] + row * xp[1, 1]
                tasks[t, T_N1] = xp[1, 2]
                tasks[t, T_X2] = xp[2, 0] + row * xp[2, 1]
                tasks[t, T_N2] = xp[2, 2]
            o = tasks[t, T_OUT]
            tasks[t, T_OUTADDR] = outs[o, 0] + tasks[t, T_OUTROW] * outs[o, 1] + 4 * tasks[t, T_OUTOFF]
        steal = (n_owned & STEALABLE) != 0 and n_workers > 1 and ctl[CURSORS] != 0
        n_owned = n_owned & (STEALABLE - 1)
        if steal:
            for w in range(n_workers):
                ctl[ctl[CURSORS] + 8 * w] = 0
        ctl[STEAL] = n_workers if steal else 0
        ctl[TASKS] = address(tasks)
        ctl[CHUNKS] = address(chunks)
        ctl[N_TASKS] = tasks.shape[0]
        ctl[N_CHUNKS] = chunks.shape[0]
        ctl[N_OWNED] = n_owned
        atomic_store(ctl, NEXT, 0)
        # worker 0 is np.int64(0), not 0: a literal argument would make Numba compile `work` and what
        # it calls a second time, specialised for the constant (4 s on a first start)
        if ctl[SOLO] != 0:  # nobody else is listening: every chunk here, no acknowledgements
            tp = now_ns()
            work(ctl, np.int64(0))
            _write_ahead_now(tasks)
            _caller_ahead(ctl, tasks)
            if ctl[TRACE_LEAD] != 0:
                t1 = now_ns()
                _trace(ctl, TRACE_LEAD, tp, t1, t1, tasks.shape[0])
            return True
        seq = ctl[SEQ] + 1
        tp = now_ns()
        atomic_store(ctl, SEQ, seq)
        if n_workers > 1:
            _write_ahead_now(tasks)
        work(ctl, np.int64(0))
        if n_workers <= 1:
            _write_ahead_now(tasks)
            _caller_ahead(ctl, tasks)
        t0 = now_ns()
        pa, pend = _next_rows(address(tasks), 0) if ctl[AHEAD_ON] != 0 else (0, 0)
        ok = wait_acks(ctl, n_workers, seq, pa, pend)
        t1 = now_ns()
        ctl[WAITED] += t1 - t0
        if ctl[TRACE_LEAD] != 0:
            _trace(ctl, TRACE_LEAD, tp, t0, t1, tasks.shape[0])
        return ok

    @numba.njit(**_NB)
    def lead(ctl, n_workers, tasks, chunks, n_owned, xa, xb, outs, row_lo, row_hi, w_shift):
        """Fill the job's input/output addresses, post it, do worker 0's part, wait for the rest.

        n_owned: the job's first n_owned chunks are pinned to their workers; + STEALABLE: a worker
        done with its own takes those of a worker of its node that is behind, from the back.

        xa, xb: the prepared inputs of the tasks marked 0 / 1 (tuples of 1 or 3 arrays, 1-D or
        2-D with the row given by the task); outs: tuple of outputs (1-D, or 2-D with the row given
        by the task). row_hi >= 0: every task's rows are [row_lo, row_hi); w_shift >= 0: every
        task's weight shift (negative: keep what the caller put in the task table)."""
        i64 = np.int64
        if ctl[LEAD_FN] == 0:  # (a control block that no Crew made: nothing to call)
            return False
        return _call_core(ctl[LEAD_FN], ctl, i64(n_workers), tasks, chunks, i64(n_owned), input_table(xa),
                          input_table(xb), output_table(outs), i64(row_lo), i64(row_hi), i64(w_shift))

    return serve, lead, lead_core, run_chunk


_BUILT: dict[tuple, tuple] = {}


def _compiled() -> tuple:
    # keyed by the types kernels.precompile was asked for too: only their kernels are linked in
    key = (kernels.kernel_path(), kernels.active_types())
    fns = _BUILT.get(key)
    if fns is None:
        fns = _BUILT[key] = _build(kernels.matvec_kernels(), kernels.x8_columns_kernel())
    return fns


#: the crew's compiled functions and their one signature each
_WARM = {"run_chunk": (3, CHUNK_ARGS), "serve": (0, (_VEC, _I64, _I64)), "lead_core": (2, CORE_ARGS)}


def warm_one(name: str) -> None:
    """Compile (or load from the disk cache) one of the crew's functions for the active kernels."""
    index, sig = _WARM[name]
    _compiled()[index].compile(sig)


def compile_tasks() -> list[tuple[str, bool, bool]]:
    """`kernels.precompile`'s `after` tasks for the crew: (name, the engine waits for it, it links
    the one-token kernels) -- only run_chunk calls kernels; serve and lead_core call it by address."""
    return [(f"call:{__name__}:warm_one:{name}", True, name == "run_chunk") for name in _WARM]


def warm() -> None:
    """Compile (or load from the disk cache) the crew's loop for the active kernels now: on a
    first start the engine calls this in the background while the weights load, after
    `kernels.precompile` (which may have had its helper process compile them: then these are
    cache loads), so the first decoded token does not wait for it."""
    for name in _WARM:
        warm_one(name)


_RUNNERS: dict = {}


def product_runner(lead, prep_a, prep_b=None, rows: bool = False):
    """A compiled call that prepares a one-token input x (prep_a's format for the tasks marked
    0, prep_b's for those marked 1) and runs a product job: one call per group of products.
    rows: x holds a decode batch's rows [n, k] and the job is a `rows_job`, outputs 2-D."""
    key = (lead, prep_a, prep_b, rows)
    fn = _RUNNERS.get(key)
    if fn is not None:
        return fn
    if rows:
        if prep_b is None:
            @numba.njit(**_NB)
            def fn(ctl, n_workers, tasks, chunks, n_owned, x, outs):
                a = prep_a(x)
                return lead(ctl, n_workers, tasks, chunks, n_owned, a, a, outs, 0, NO_LIMIT, 0)
        else:
            @numba.njit(**_NB)
            def fn(ctl, n_workers, tasks, chunks, n_owned, x, outs):
                return lead(ctl, n_workers, tasks, chunks, n_owned, prep_a(x), prep_b(x), outs, 0, NO_LIMIT, 0)
    elif prep_b is None:
        @numba.njit(**_NB)
        def fn(ctl, n_workers, tasks, chunks, n_owned, x, outs):
            a = prep_a(x.reshape(1, -1))
            xa = (a[0][0], a[1][0], a[2][0])
            return lead(ctl, n_workers, tasks, chunks, n_owned, xa, xa, outs, 0, NO_LIMIT, 0)
    else:
        @numba.njit(**_NB)
        def fn(ctl, n_workers, tasks, chunks, n_owned, x, outs):
            a = prep_a(x.reshape(1, -1))
            b = prep_b(x.reshape(1, -1))
            xa = (a[0][0], a[1][0], a[2][0])
            xb = (b[0][0], b[1][0], b[2][0])
            return lead(ctl, n_workers, tasks, chunks, n_owned, xa, xb, outs, 0, NO_LIMIT, 0)
    _RUNNERS[key] = fn
    return fn


@numba.njit(inline="always")
def prep_families(tasks, fam):
    """(family of the tasks marked 0, of those marked 1; -1: none) of a job's task table, from
    each task's weight type (`kernels.q8_family`; tasks of no family, such as padding, skipped)."""
    ka = -1
    kb = -1
    for t in range(tasks.shape[0]):
        f = fam[tasks[t, T_TYPE]]
        if f >= 0:
            if tasks[t, T_PREP] == 0:
                ka = f
            else:
                kb = f
    return ka, kb


def product_runner_mixed(lead, rows: bool = False):
    """`product_runner` for a file whose products take Q8_0 or Q8_K activations: each call picks
    the formats from the job's weight types (`prep_families`), so the groups of every layer share
    this one function and a token's layers compile into one call however the file mixes its
    types (with a runner per format pair, a layer unlike the others kept the whole token from
    its one compiled call: a Python call per layer instead). rows: as `product_runner`'s."""
    key = (lead, "q8 mixed", rows)
    fn = _RUNNERS.get(key)
    if fn is not None:
        return fn
    fam = kernels.q8_families()
    quantize = kernels.activations.quantize_q8_0_or_K

    if rows:
        @numba.njit(**_NB)
        def fn(ctl, n_workers, tasks, chunks, n_owned, x, outs):
            ka, kb = prep_families(tasks, fam)
            a = quantize(x, ka)
            b = quantize(x, kb) if kb >= 0 else a
            return lead(ctl, n_workers, tasks, chunks, n_owned, a, b, outs, 0, NO_LIMIT, 0)
    else:
        @numba.njit(**_NB)
        def fn(ctl, n_workers, tasks, chunks, n_owned, x, outs):
            ka, kb = prep_families(tasks, fam)
            xr = x.reshape(1, -1)
            a = quantize(xr, ka)
            b = quantize(xr, kb) if kb >= 0 else a
            xa = (a[0][0], a[1][0], a[2][0])
            xb = (b[0][0], b[1][0], b[2][0])
            return lead(ctl, n_workers, tasks, chunks, n_owned, xa, xb, outs, 0, NO_LIMIT, 0)
    _RUNNERS[key] = fn
    return fn


class CrewError(RuntimeError):
    pass


class Table:
    """A crew job's tables composed per call (routed experts): the `Job` fields `Crew.run` reads."""

    def __init__(self, tasks: np.ndarray, chunks: np.ndarray):
        self.tasks, self.chunks, self.n_owned = tasks, chunks, len(chunks)


_LINKED: dict[int, tuple] = {}  # a linked job's task table address -> the tables its link reads


def link(job: tuple, after: tuple) -> None:
    """Name `after` (tasks, chunks, n_owned) as the job a decoded token posts after `job` (its
    first task's T_NEXT_* fields): a hint for reading ahead (`_next_rows`), wrong at worst (a
    prefetch never faults). The tables the link reads are kept alive until `job` is linked again
    (a new session's attention jobs replace the last one's)."""
    tasks = job[0]
    if tasks.shape[0] == 0:
        return
    nt, nc, no = after[:3]
    fields = [T_NEXT_T, T_NEXT_C, T_NEXT_NC, T_NEXT_NO]
    if nt.shape[0] == 0 or nc.shape[0] == 0:
        tasks[0, fields] = 0
        _LINKED.pop(tasks.ctypes.data, None)
        return
    _LINKED[tasks.ctypes.data] = (nt, nc)
    tasks[0, fields] = (nt.ctypes.data, nc.ctypes.data, nc.shape[0], int(no) & (STEALABLE - 1))


def rows_job(job: "Job | Table | tuple", n: int, x_stride: int = 1) -> Table:
    """`job` (one input row per task) over n input rows: each task repeated for rows 0..n-1 (its
    input row + i * x_stride -> its output row + i; x_stride: the prepared input's rows per
    sequence, MLA's heads for its per-head products), each chunk spanning its task's n copies, so a worker reads a piece of
    the weight once from memory and runs it over every row from its caches (`run_chunk` tiles the
    rows of a span). Every output is the one-row kernel call's dot product: a row's numbers do
    not depend on the others. F16 tasks keep a chunk per row (a span of equally spaced F16 inputs
    takes the attention's heads kernel, whose float order is not the product's)."""
    t1, c1, owned = job if isinstance(job, tuple) else (job.tasks, job.chunks, job.n_owned)
    if (c1[:, C_SPAN] != 1).any():
        raise ValueError("rows_job: a chunk already spans several tasks")
    rows = np.arange(n, dtype=np.int64)
    tasks = np.repeat(t1, n, axis=0)
    # no read-ahead links or write-ahead lines: those of the one-token job name tables (another
    # session's attention jobs) that `link` may free while this table lives
    tasks[:, [T_NEXT_T, T_NEXT_C, T_NEXT_NC, T_NEXT_NO, T_WA_N]] = 0
    tasks[:, T_XROW] += np.tile(rows * x_stride, t1.shape[0])
    tasks[:, T_OUTROW] += np.tile(rows, t1.shape[0])
    f16 = t1[c1[:, C_TASK], T_TYPE] == _F16
    per = np.where(f16, n, 1)
    chunks = np.repeat(c1, per, axis=0)
    chunks[:, C_TASK] *= n
    first = np.repeat(np.cumsum(per) - per, per)
    chunks[:, C_TASK] += np.where(np.repeat(f16, per), np.arange(chunks.shape[0]) - first, 0)
    chunks[:, C_SPAN] = np.where(np.repeat(f16, per), 1, n)
    table = Table(tasks, chunks)
    table.n_owned = int(per[:owned & (STEALABLE - 1)].sum()) | (owned & STEALABLE)
    return table


class Job:
    """A reusable job: the static part of its tables (weights, row ranges, who does what).

    `tasks`: (type, weight matrix, prepared input 0/1, output index, output offset[, input row,
    output row]); the input and output addresses are filled at each run. `owned` chunks:
    (task, lo, hi, worker); `shared` chunks: (task, lo, hi[, span]), rows lo..hi of tasks
    task..task + span - 1, taken by whichever worker comes first (owned chunks may carry a span too).
    """

    def __init__(self, tasks: list[tuple[int, np.ndarray, int, int, int] | tuple[int, np.ndarray, int, int, int, int, int]],
                 owned: list[tuple[int, int, int, int]], shared: list[tuple[int, int, int] | tuple[int, int, int, int]]):
        self.tasks = np.zeros((len(tasks), TASK_FIELDS), dtype=np.int64)
        self.arrays = [w for _, w, *_ in tasks]  # keep the weights alive while the job exists
        for i, (typ, w, prep, out, out_off, *rows) in enumerate(tasks):
            if not w.flags.c_contiguous or w.ndim != 2:
                raise ValueError("crew tasks need C-contiguous 2-D weight arrays")
            x_row, out_row = rows or (0, 0)
            self.tasks[i, [T_TYPE, T_W, T_ROWS, T_ROWLEN, T_PREP, T_OUT, T_OUTOFF, T_XROW, T_OUTROW, T_HI]] = (
                typ, w.ctypes.data, w.shape[0], w.shape[1], prep, out, out_off, x_row, out_row, NO_LIMIT)
        rows = [(t, lo, hi, o, *(span or (1,))) for t, lo, hi, o, *span in owned] + \
            [(t, lo, hi, -1, *(span or (1,))) for t, lo, hi, *span in shared]
        self.chunks = np.array(rows, dtype=np.int64).reshape(-1, CHUNK_FIELDS)
        self.n_owned = len(owned)


class CrewTrace:
    """The logs of `Crew.trace`: `records` = (caller [jobs, (posted, own part done, acknowledged,
    tasks)], workers [records, (worker, job number in its pass, start, end)]) once stopped."""

    def __init__(self, lead: np.ndarray, work: np.ndarray):
        self.lead, self.work = lead, work
        self.records: tuple[np.ndarray, np.ndarray] | None = None


class Crew:
    """The pool's workers 1..N-1 held in the compiled loop while a forward pass runs."""

    def __init__(self, pool, n_workers: int):
        self.pool = pool
        self.n_workers = n_workers
        n = max(n_workers, 1)
        self._cursors = ACK + 8 * n + 8
        self.ctl = np.zeros(self._cursors + 8 * n + 8, dtype=np.int64)
        # each worker's steal group: its node (a thief reads only its own node's memory)
        workers = list(getattr(pool, "workers", ()))
        self._groups = [int(getattr(workers[w], "node", 0) or 0) if w < len(workers) else 0 for w in range(n)]
        self.active = False
        self.solo = False
        self._trace: CrewTrace | None = None
        # `lead` is public for compiled callers that post jobs themselves (attention, runners)
        self._serve, self.lead, core, chunk = _compiled()
        self._core = core_address(core)
        # run_chunk's address, what `start` puts into ctl[CHUNK_FN] (chunk_log swaps in its own)
        self.chunk_fn = compiled_address(chunk, CHUNK_ARGS)
        self._init_ctl()

    @property
    def one_group(self) -> bool:
        """Every worker in one steal group (node): any may take over another's pinned pieces."""
        return len(set(self._groups)) == 1

    def _init_ctl(self) -> None:
        """The fields no job changes: lead_core's and run_chunk's addresses, the cursors' place and
        steal groups."""
        self.ctl[LEAD_FN] = self._core
        self.ctl[CHUNK_FN] = self.chunk_fn
        self.ctl[CURSORS] = self._cursors
        # read-ahead hints only where every worker reads its node's memory (on several nodes a
        # worker would pull another node's weights across the interconnect for nothing)
        self.ctl[AHEAD_ON] = int(self.one_group)
        for w, g in enumerate(self._groups):
            self.ctl[self._cursors + 8 * w + 1] = g

    def start(self, solo: bool = False) -> None:
        """Send workers 1..N-1 into the loop (returns at once; the caller stands in for worker 0).

        solo: leave them parked and run every job alone, every chunk included (those pinned to
        other workers: the same kernel calls, so the same results): for passes where another
        process holds the workers' CPUs and waiting for them would cost more than their help."""
        if self.active:
            return
        trace = self.ctl[TRACE_LEAD:TRACE_CAP + 1].copy()  # a trace spans passes
        self.ctl[:] = 0
        self.ctl[TRACE_LEAD:TRACE_CAP + 1] = trace
        self._init_ctl()
        self.solo = solo and self.n_workers > 1
        if self.solo:
            self.ctl[SOLO] = 1
        if self.n_workers < 2 or self.solo:  # the caller alone: jobs run inside `run`, nobody to launch
            self.active = True
            return
        serve, ctl = self._serve, self.ctl

        pool = self.pool

        def body(w: int) -> None:
            t0 = time.perf_counter()
            try:
                worked = serve(ctl, w, 0) * 1e-9
            except BaseException:
                ctl[FAILED] = 1
                raise
            # the pool counts the whole loop as busy: give back the time spent waiting for jobs
            pool.note_idle(w, max(time.perf_counter() - t0 - worked, 0.0))
        self.pool.launch(body, lead=True)
        self.active = True

    def stop(self) -> float:
        """Release the workers back to the pool (and re-raise what one of them raised); returns
        the seconds the caller spent waiting for the workers since `start`."""
        if not self.active:
            return 0.0
        self.active = False
        if self.n_workers < 2 or self.solo:
            return 0.0
        self.ctl[SEQ] = -1
        waited = self.ctl[WAITED] * 1e-9
        try:
            self.pool.join()
        finally:
            self.pool.note_idle(0, waited)  # the caller's waits for acknowledgements
            self.ctl[WAITED] = 0
        return waited

    def waited(self) -> float:
        """Seconds the caller has waited for acknowledgements since `start`."""
        return float(self.ctl[WAITED]) * 1e-9

    def trace(self, capacity: int = 1 << 20) -> "CrewTrace":
        """Log every job from now on (until `stop_trace`): for each job the caller's
        post, end of its own part and acknowledgements, and each worker's start and end, in ns
        (`benchmarks/crew_timeline.py` turns them into a per-job table)."""
        t = CrewTrace(np.zeros(capacity, np.int64), np.zeros(capacity, np.int64))
        self.ctl[TRACE_LEAD], self.ctl[TRACE_WORK] = t.lead.ctypes.data, t.work.ctypes.data
        self.ctl[TRACE_LEAD_N] = self.ctl[TRACE_WORK_N] = 0
        self.ctl[TRACE_CAP] = capacity
        self._trace = t
        return t

    def stop_trace(self) -> "CrewTrace | None":
        """Stop logging; returns the trace with its records."""
        t, self._trace = self._trace, None
        if t is not None:
            n_lead, n_work = (min(int(self.ctl[i]), t.lead.shape[0]) // 4 for i in (TRACE_LEAD_N, TRACE_WORK_N))
            t.records = (t.lead[:4 * n_lead].reshape(-1, 4).copy(), t.work[:4 * n_work].reshape(-1, 4).copy())
        self.ctl[TRACE_LEAD:TRACE_CAP + 1] = 0
        return t

    def run_with(self, chunk_fn: int, job: "Job | Table", xa: tuple, xb: tuple, outs: Sequence[np.ndarray]) -> None:
        """`run` with every chunk of this job run by the compiled function at `chunk_fn` (the
        signature of `run_chunk`; `prompt_jobs`' products of several inputs) instead of the one
        in place (`run_chunk`, or a `chunk_log`'s), which is put back after the job."""
        keep = int(self.ctl[CHUNK_FN])
        self.ctl[CHUNK_FN] = chunk_fn
        try:
            self.run(job, xa, xb, outs)
        finally:
            self.ctl[CHUNK_FN] = keep

    def run(self, job: Job, xa: tuple, xb: tuple, outs: Sequence[np.ndarray]) -> None:
        """Run a job: prepared inputs `xa`, `xb` (tasks' prep 0 / 1) into outputs `outs` (1-D,
        or 2-D with the row given by the task)."""
        ok = self.lead(self.ctl, self.n_workers, job.tasks, job.chunks, job.n_owned, xa, xb, tuple(outs),
                        0, NO_LIMIT, 0)
        if not ok:
            self.stop()
            raise CrewError("a worker failed during a product")

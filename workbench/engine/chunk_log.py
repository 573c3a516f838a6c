"""What each worker's kernels read: every crew chunk logged with the CPU that ran it.

The crew's job loop calls the kernels through one address (`crew.CHUNK_FN` in its control block,
`run_chunk`). `ChunkLog` puts a logging function at that address while it is open: each call notes
the CPU it runs on (`sched_getcpu`), the task's type, the address of the rows it reads, their row
length and input length, and the row range, then calls `run_chunk` itself, so the results are the
same bits. Nothing in the crew changes; a closed log puts `run_chunk` back.

`reads` then turns the log into bytes per CPU, and `pages_read` into the node of every page read
(move_pages): the proof that a node's workers read only their node's KV pages and expert bytes
(tests/numa_vm, benchmarks/numa_vm_proof.py). The log's control block is reached through a symbol
the JIT linker resolves (`llvmlite.binding.add_symbol`), not an address baked into the code, so
the logging function stays in the disk cache like the rest.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .crew import (CHUNK_ARGS, CHUNK_FN, T_N0, T_ROWLEN, T_TYPE, T_W, T_WSHIFT, array_at, call_chunk,
                   compiled_address, fetch_add)
from .kernels import F16
from .kernels.jitcache import JIT

SYMBOL = "numawb_chunk_log_ctl"
# control block: the wrapped run_chunk's address, the log's address, its capacity (records), used
L_FN, L_LOG, L_CAP, L_N = 0, 1, 2, 8   # L_N on its own cache line (the workers add to it)
FIELDS = 8  # cpu, type, address of row lo, row bytes, input length, lo, hi, span
_CTL = np.zeros(16, dtype=np.int64)
llvm.add_symbol(SYMBOL, _CTL.ctypes.data)


@intrinsic
def _ctl_address(typingctx):
    """The address the linker gives `SYMBOL` (the control block above)."""
    def codegen(context, builder, sig, args):
        mod = builder.module
        g = mod.globals.get(SYMBOL)
        if g is None:
            g = ir.GlobalVariable(mod, ir.IntType(64), SYMBOL)
            g.linkage = "external"
        return builder.ptrtoint(g, ir.IntType(64))
    return types.int64(), codegen


@intrinsic
def _getcpu(typingctx):
    """sched_getcpu(3): the CPU the calling thread runs on."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "sched_getcpu")
        return builder.sext(builder.call(fn, []), ir.IntType(64))
    return types.int64(), codegen


@numba.njit(**JIT)
def logged_chunk(tasks, t, span, lo, hi):
    """run_chunk(tasks, t, span, lo, hi) after one record in the log (a full log drops records,
    counting them)."""
    ctl = array_at(_ctl_address(), 16, np.int64)
    i = fetch_add(ctl, L_N, 1)
    if i < ctl[L_CAP]:
        lg = array_at(ctl[L_LOG] + 8 * FIELDS * i, FIELDS, np.int64)
        lg[0] = _getcpu()
        lg[1] = tasks[t, T_TYPE]
        lg[2] = tasks[t, T_W] + tasks[t, T_WSHIFT] + lo * tasks[t, T_ROWLEN]
        lg[3] = tasks[t, T_ROWLEN]
        lg[4] = tasks[t, T_N0]
        lg[5] = lo
        lg[6] = hi
        lg[7] = span
    call_chunk(ctl[L_FN], tasks, t, span, lo, hi)


@dataclass(frozen=True)
class Read:
    """One logged chunk: `cpu` read rows lo..hi of the matrix whose row lo starts at `addr`."""
    cpu: int
    type: int
    addr: int
    row_bytes: int
    n_in: int
    lo: int
    hi: int
    span: int

    @property
    def nbytes(self) -> int:
        return (self.hi - self.lo) * self.row_bytes


class ChunkLog:
    """`with ChunkLog(engine.rt.crew) as log: ...` -- every chunk the crew runs meanwhile is in
    `log.reads` afterwards (`dropped`: records past the capacity)."""

    def __init__(self, crew, capacity: int = 1 << 20):
        self.crew = crew
        self.buf = np.zeros((capacity, FIELDS), dtype=np.int64)
        self.reads: list[Read] = []
        self.dropped = 0

    def __enter__(self) -> "ChunkLog":
        if _CTL[L_LOG] != 0:
            raise RuntimeError("a chunk log is already open")
        self._orig = self.crew.chunk_fn
        _CTL[L_FN] = self._orig
        _CTL[L_LOG] = self.buf.ctypes.data
        _CTL[L_CAP] = self.buf.shape[0]
        _CTL[L_N] = 0
        spy = compiled_address(logged_chunk, CHUNK_ARGS)
        self.crew.chunk_fn = spy          # what `Crew.start` puts back into the control block
        self.crew.ctl[CHUNK_FN] = spy   # and the running crew's next job
        return self

    def __exit__(self, *exc) -> None:
        self.crew.chunk_fn = self._orig
        self.crew.ctl[CHUNK_FN] = self._orig
        n = int(_CTL[L_N])
        kept = min(n, self.buf.shape[0])
        self.dropped = n - kept
        self.reads = [Read(*map(int, r)) for r in self.buf[:kept]]
        _CTL[L_LOG] = 0


def within(reads: list[Read], arr: np.ndarray) -> list[Read]:
    """The reads whose first byte lies in `arr`'s memory."""
    lo = arr.ctypes.data
    hi = lo + arr.nbytes
    return [r for r in reads if lo <= r.addr < hi]


def bytes_by_page(reads: list[Read]) -> dict[int, int]:
    """Page address -> bytes the reads cover in it (rows of `row_bytes`, of which an F16 task reads
    its input's length: 2 bytes an element)."""
    from ..numa.memory import PAGE
    starts, ends = [], []
    for r in reads:
        width = min(r.row_bytes, 2 * r.n_in) if r.type == F16 and r.n_in > 0 else r.row_bytes
        if width == r.row_bytes:   # whole rows: one run of bytes
            starts.append(np.array([r.addr]))
            ends.append(np.array([r.addr + (r.hi - r.lo) * r.row_bytes]))
        else:
            a = r.addr + np.arange(r.hi - r.lo, dtype=np.int64) * r.row_bytes
            starts.append(a)
            ends.append(a + width)
    out: dict[int, int] = defaultdict(int)
    if not starts:
        return out
    a, b = np.concatenate(starts), np.concatenate(ends)
    p0, p1 = a // PAGE, (b - 1) // PAGE
    one = p0 == p1   # runs inside one page
    for p, n in zip(p0[one], (b - a)[one]):
        out[int(p) * PAGE] += int(n)
    for x, y, q0, q1 in zip(a[~one], b[~one], p0[~one], p1[~one]):
        out[int(q0) * PAGE] += int((q0 + 1) * PAGE - x)
        out[int(q1) * PAGE] += int(y - q1 * PAGE)
        for q in range(int(q0) + 1, int(q1)):
            out[q * PAGE] += PAGE
    return out


def bytes_by_node(reads: list[Read]) -> dict[int, int]:
    """Node -> bytes of the reads on it (move_pages of every page read; -1: a page with no node)."""
    from ..numa import syscalls as sc
    pages = bytes_by_page(reads)
    addrs = sorted(pages)
    out: dict[int, int] = defaultdict(int)
    for i in range(0, len(addrs), 4096):
        part = addrs[i:i + 4096]
        r = sc.move_pages(part)
        if not r:
            raise OSError(f"move_pages: {r.reason}")
        for a, node in zip(part, r.value):
            out[node if node >= 0 else -1] += pages[a]
    return dict(out)


def kv_reads(reads: list[Read], kv) -> dict[int, tuple[set[tuple[int, int]], list[Read]]]:
    """A KV cache's reads by CPU: the (owner, position) pairs its key chunks read (a key row is
    one slot of an owner: `kv_cache.slot_position`), and every read of its keys and values."""
    from .kv_cache import slot_position
    out: dict[int, tuple[set, list]] = defaultdict(lambda: (set(), []))
    no = kv.n_workers
    for il in range(len(kv.k_bytes)):
        for o in range(no):
            for karr in kv.k_bytes[il][o]:
                for r in within(reads, karr):
                    pos, rs = out[r.cpu]
                    rs.append(r)
                    row0 = (r.addr - karr.ctypes.data) // karr.shape[1]
                    pos.update((o, slot_position(j, o, no)) for j in range(row0, row0 + r.hi - r.lo))
            for varr in kv.v_bytes[il][o]:
                for r in within(reads, varr):
                    out[r.cpu][1].append(r)
    return dict(out)

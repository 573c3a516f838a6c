"""The runtime: weights in placed buffers, products split over worker threads.

Model code asks for products by tensor name (`linear`, `gated`) and for
attention; it never sees kernels, threads or NUMA placement. A product is
split into consecutive row ranges, one per worker, by the NUMA layer's
`row_split`, so `slice` placement and the compute split always agree. Each
worker reads the copy of a weight that its node holds (`layout.array_for`).

During a forward pass (`step`) the calling thread stands in for worker 0, so a
hand-off (tens of microseconds of thread wake-ups and GIL transfers) is paid
only where it pays off: a one-token product smaller than `SPLIT_BYTES` runs on
the calling thread alone; a bigger one (the output matrix) is dealt out in row
chunks to whichever worker is free. Every output row is one kernel call's dot
product whatever the split, so results do not depend on the thread count.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import numba
import numpy as np

from .kernels.jitcache import JIT
from . import kernels
from . import ops
from .attention import AttentionPaths
from .crew import (C_OWNER, C_SPAN, C_TASK, CHUNK_FIELDS, STEALABLE, T_OUT, T_OUTOFF, T_PREP, T_W, T_XROW, TASK_FIELDS,
                   Crew, CrewError, Job, Table, link, product_runner, product_runner_mixed, rows_job)
from .attention import SKIP_SLID_VALUES, one_token_attention, owners_attention, token_window
from .dense_token import dense_runner
from .expert_token import (GELU, SILU, compose, concat_jobs, expert_runner, fixed_format, routed_runner,
                           shared_fused_runner, shared_runner)
from .mla_token import mla_block_runner
from .rows_ffn import rows_fused_runner, rows_routed_runner
from .token_attention import block_runner
from .token_layer import layer_runner, list_address, token_runner, typed_layers
from .gating import Gating
from .gguf_file import GGUFFile, ModelLoadError, TensorInfo
from .kv_cache import KVCache
from .routing import TokenJournal

F32, F16, BF16 = 0, 1, 30
# weight bytes of a one-token product below which the calling thread computes it alone (when it
# stands in for worker 0): a hand-off to the other workers costs more than it saves
SPLIT_BYTES = 8 << 20
_EMPTY = np.zeros(0, dtype=np.float32)
_NO_TASKS = np.zeros((0, TASK_FIELDS), dtype=np.int64)
_NO_CHUNKS = np.zeros((0, CHUNK_FIELDS), dtype=np.int64)
_NO_JOB = (_NO_TASKS, _NO_CHUNKS, 0)
_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_WADDR = np.zeros((0, 0), dtype=np.int64)   # `compose`'s full tables: no compact addresses
CHUNK_BYTES = 1 << 20  # smallest chunk of rows dealt to the workers, in weight bytes
CHUNK_ALIGN = 64  # rows
# one-token products go through the crew (workers waiting in compiled code) in chunks of at
# least this many weight bytes; NUMAWB_CREW=0 turns the crew off (Python hand-offs, as before)
CREW_CHUNK_BYTES = 96 << 10
# a one-token product's pinned share is cut in pieces of half what is left (the first: FIRST_PIECE),
# down to this many bytes
PIECE_BYTES = 24 << 10
# A worker's first piece of its share: a kernel call reads its range as two streams when each half
# is at least TWO_STREAMS_MIN bytes (kernels.intrinsics.stream_halves), so a bigger first piece
# streams more of a layer's small products that way (the pieces after it halve what is left)
FIRST_PIECE = 0.75
# A prompt's products when every worker reads every row (one node, or a copy per node): each
# worker takes its share of the tokens, prepares those inputs itself and multiplies them by all
# the rows, where a split of the rows left the input's preparation to the caller alone (serial:
# 18 of a 356 ms prefill at 2 threads on the AMD EPYC host, the other worker waiting). Shares are
# TOKEN_ALIGN-token multiples from the first token, the rest to the last worker, so every token sits
# in the same column group of the kernels as in one call over all of them (llama.cpp's repacked
# products take 4 columns at a time and the last ones alone: the same bits). Below TOKEN_SPLIT_MIN
# tokens a worker the rows are split instead: each worker would read every weight for few tokens.
TOKEN_SPLIT_MIN = 32
TOKEN_ALIGN = 16
EXPERT_ROWS = 32  # prompt: expert rows per piece, read once from memory for all of its tokens
# one token: a worker's rows of an expert in pinned pieces of this many rows (a multiple of the
# kernels' 8-row groups): the pieces a worker of the same node may take over at the end
STEAL_ROWS = 64
USE_CREW = os.environ.get("NUMAWB_CREW", "1") != "0"
# a pass whose caller waited for the crew's workers longer than this share of it is "starved":
# another process holds a worker's CPU and the spinning only delays it. After CREW_STARVED such
# passes in a row the next tokens run solo (`Crew.start(solo=True)`: the calling thread computes
# every chunk, the workers stay parked), CREW_BACKOFF of them at first, twice as many each time the
# retry starves again (up to CREW_BACKOFF_MAX): a burst of other work costs a few tokens, steady
# contention runs at one thread's speed instead of waiting on a descheduled worker at every job
CREW_STARVED_SHARE = 0.4
CREW_STARVED_SECONDS = 0.002  # and longer than this (a scheduler time slice; tiny models wait us)
CREW_STARVED = 3
CREW_BACKOFF = 16
CREW_BACKOFF_MAX = 1024
# A decoded token's crew stays launched after its pass, its workers spinning in compiled code, so
# the next token does not pay two thread wake-ups and GIL hand-offs (`Crew.stop` then `start`:
# ~0.2 ms a token on the EPYC VM at 2 threads, 5 % of a MoE token). It is released after
# LINGER_IDLE seconds without a pass (by a watchdog thread), at the end of the first pass LINGER_MAX
# seconds after it started (the pool's busy accounting catches up), and before anyone else uses
# the pool (`WorkerPool.hold`). NUMAWB_CREW_LINGER=0 releases it after every pass, as before.
LINGER = os.environ.get("NUMAWB_CREW_LINGER", "1") != "0"
LINGER_IDLE = 0.02
LINGER_TICK = 0.01  # the watchdog's period while a crew lingers
LINGER_MAX = 0.25

class Layout(Protocol):
    mode: str

    def array_for(self, name: str, worker: int) -> tuple[np.ndarray, int]: ...

    def full_array(self, name: str) -> np.ndarray | None: ...

    def expert_rows(self, name: str, worker: int, expert: int) -> tuple[np.ndarray, int]: ...


class Pool(Protocol):
    workers: Sequence

    def run(self, fn: Callable[[int], None], lead: bool = False) -> None: ...

    def lead(self) -> AbstractContextManager[None]: ...

    def lead_begin(self) -> tuple: ...

    def lead_end(self, state: tuple) -> None: ...

    def launch(self, fn: Callable[[int], None], lead: bool = False) -> None: ...

    def join(self) -> None: ...

    def note_idle(self, index: int, seconds: float) -> None: ...


@dataclass
class Weight:
    info: TensorInfo
    layout_type: int | None = None  # the layout its bytes are kept in when not the file's (`packing`)

    @property
    def ggml_type(self) -> int:
        """The type its kernels take: the file's, or the layout the engine keeps it in."""
        return self.info.ggml_type if self.layout_type is None else self.layout_type

    @property
    def rows(self) -> int:
        return self.info.rows

    @property
    def ne0(self) -> int:
        return self.info.shape[0]


_EXPERT_LOOPS: dict = {}


def _expert_loop(qtype: int) -> Callable:
    """A compiled (GIL-free) loop over one expert's rows [lo, hi) in pieces of `step` rows, each
    piece multiplied by every listed input row (`ins`, rows of the prepared 2-D inputs) into row
    `outrows[j]` of `out` from column `off`: the weights stay in cache while the tokens pass.
    Every output is what ggml's mul_mat_id computes for that many tokens: with a type's
    `mul_mat_id_kernel` (several tokens per unpacked weight block; `rows` is the expert's full row
    count, which decides llama.cpp's repacking), else the type's matvec per row and token."""
    key = (kernels.kernel_path(), qtype)
    fn = _EXPERT_LOOPS.get(key)
    if fn is None:
        mv = kernels.matvec_kernels()[qtype]
        idk = kernels.mul_mat_id_kernel(qtype)
        if kernels.preparer(qtype) is None:  # float weights: one prepared array
            @numba.njit(**JIT)
            def fn(w, xp, ins, out, outrows, off, lo, hi, step, rows):
                xa = xp[0]
                for c0 in range(lo, hi, step):
                    c1 = min(c0 + step, hi)
                    for j in range(ins.shape[0]):
                        mv(w, (xa[ins[j]],), out[outrows[j]][off:], c0, c1)
        elif idk is None:
            @numba.njit(**JIT)
            def fn(w, xp, ins, out, outrows, off, lo, hi, step, rows):
                xa, xb, xc = xp
                for c0 in range(lo, hi, step):
                    c1 = min(c0 + step, hi)
                    for j in range(ins.shape[0]):
                        r = ins[j]
                        mv(w, (xa[r], xb[r], xc[r]), out[outrows[j]][off:], c0, c1)
        else:
            @numba.njit(**JIT)
            def fn(w, xp, ins, out, outrows, off, lo, hi, step, rows):
                xa, xb, xc = xp
                n = ins.shape[0]
                if n == 1:  # one token: the matvec, no gathering
                    r = ins[0]
                    mv(w, (xa[r], xb[r], xc[r]), out[outrows[0]][off:], lo, hi)
                    return
                ga = np.empty((n, xa.shape[1]), xa.dtype)
                gb = np.empty((n, xb.shape[1]), xb.dtype)
                gc = np.empty((n, xc.shape[1]), xc.dtype)
                for j in range(n):
                    ga[j] = xa[ins[j]]
                    gb[j] = xb[ins[j]]
                    gc[j] = xc[ins[j]]
                og = np.empty((n, hi), np.float32)
                for c0 in range(lo, hi, step):
                    idk(w, (ga, gb, gc), og, c0, min(c0 + step, hi), rows)
                for j in range(n):
                    out[outrows[j]][off + lo:off + hi] = og[j, lo:hi]
        _EXPERT_LOOPS[key] = fn
    return fn


def warm_expert_loops(types: Iterable[int]) -> None:
    """Compile (or load from the disk cache) `_expert_loop` for these expert tensor types with the
    argument types a prompt passes: the engine does it while a mixture-of-experts model loads, so
    its first prompt does not stop for seconds to compile the experts' products."""
    for t in types:
        k = 256
        w = np.zeros((8, kernels.row_bytes(t, k)), np.uint8)
        xp = kernels.prepare(t, np.zeros((2, k), np.float32))
        _expert_loop(t)(w, xp, np.arange(2, dtype=np.int64), np.zeros((2, 8), np.float32),
                        np.arange(2, dtype=np.int64), 0, 0, 8, EXPERT_ROWS, 8)


Before = Callable[[int, int], None]                   # token-wise work on an input's rows [t0, t1)
After = Callable[[int, int, list], None]               # ... on the outputs' rows [t0, t1)


def _token_cuts(n: int, n_workers: int) -> list[int]:
    """Where each worker's share of n tokens starts (and n): TOKEN_ALIGN multiples, the rest last."""
    return [min(n, n * wk // n_workers // TOKEN_ALIGN * TOKEN_ALIGN) for wk in range(n_workers)] + [n]


def then_after(after: After | None, outs: list[np.ndarray]) -> list[np.ndarray]:
    """`after` over every row of the outputs (a path that does not share out the tokens)."""
    if after is not None and outs and outs[0].shape[0]:
        after(0, outs[0].shape[0], outs)
    return outs


def _chunks(rows: int, min_rows: int, n_workers: int) -> list[tuple[int, int]]:
    """Row ranges, each a share of what is left (guided scheduling): big first, small at the end,
    so that workers finish together however fast each one runs."""
    out = []
    lo = 0
    while lo < rows:
        size = max(min_rows, (rows - lo) // (2 * n_workers))
        hi = min(rows, -(-(lo + size) // CHUNK_ALIGN) * CHUNK_ALIGN)
        out.append((lo, hi))
        lo = hi
    return out


def _pinned_shares(rows: list[int], row_bytes: list[int], n_workers: int) -> list[tuple[int, int, int, int]]:
    """Pinned chunks (task, lo, hi, worker) of products whose rows are taken in order, task after
    task: each worker one contiguous share of the bytes, cut in pieces of FIRST_PIECE of its share,
    then half what is left (at least PIECE_BYTES, 8-row multiples)."""
    total = sum(r * b for r, b in zip(rows, row_bytes))
    out = []
    t, row = 0, 0
    for wk in range(n_workers):
        left = total * (wk + 1) // n_workers - total * wk // n_workers
        part = FIRST_PIECE
        while left > 0 and t < len(rows):
            size = max(PIECE_BYTES, int(left * part)) // row_bytes[t]
            part = 0.5
            hi = min(rows[t], -(-(row + max(size, 1)) // 8) * 8)
            if wk == n_workers - 1:
                hi = rows[t] if rows[t] - hi < 8 else hi
            out.append((t, row, hi, wk))
            left -= (hi - row) * row_bytes[t]
            row = hi
            if row >= rows[t]:
                t, row = t + 1, 0
    while t < len(rows):  # (rounding) what is left goes to the last worker
        out.append((t, row, rows[t], n_workers - 1))
        t, row = t + 1, 0
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.ctypes.data == b.ctypes.data


@dataclass(frozen=True)
class AttentionSpec:
    """A layer's attention sub-layer as `Runtime.attention_token` / `layer_token` take it: tensor
    names, (n_head, n_kv, head_dim, head_dim_v), sliding window (0: none), score scale, biases (q, k,
    v, output; size 0: none), q/k norm weights, norm epsilon, NEOX RoPE, queries prescaled."""
    qkv: tuple[str, str, str]
    output: str
    shape: tuple[int, int, int, int]
    window: int
    scale: float
    biases: tuple[np.ndarray, ...]
    q_norm: np.ndarray
    k_norm: np.ndarray
    eps: float
    neox: bool
    prescale: bool


@dataclass(frozen=True)
class MLASpec:
    """A layer's multi-head latent attention (DeepSeek 2/3) as `Runtime.layer_token` / `token_layers`
    take it: `first` the products of the normed input (q_a or q, then kv_a_mqa), `q_a_norm` and
    `q_b` the q-LoRA's ("" without), `kv_norm` the latent's norm, `k_b` / `v_b` the per-head 3-D
    tensors, `output`; n_head, nope (the query's non-rotary width), score scale, norm epsilon, NEOX
    RoPE. No sliding window (`window` 0)."""
    first: tuple[str, str]
    q_a_norm: str
    q_b: str
    kv_norm: str
    k_b: str
    v_b: str
    output: str
    n_head: int
    nope: int
    scale: float
    eps: float
    neox: bool
    window: int = 0


@dataclass(frozen=True)
class RoutedSpec:
    """A layer's routed FFN as `Runtime.routed_token` / `layer_token` take it (gate None: `up` is a
    fused gate_up tensor)."""
    router: str
    gating: Gating
    gate: str | None
    up: str
    down: str
    activation: str = "silu"


@dataclass(frozen=True)
class DenseSpec:
    """A layer's dense gated FFN as `Runtime.layer_token` / `token_layers` take it."""
    gate: str
    up: str
    down: str
    activation: str = "silu"


@dataclass(frozen=True)
class SharedSpec:
    """A layer's FFN in a model with shared experts (DeepSeek): the routed experts (None in a dense
    layer) and then `dense` (the shared experts' gated FFN, or the dense layer's), their outputs
    added. A dense layer's call takes `template`'s routed arguments without running them, so every
    layer of the model has one argument type (one typed list, one compiled token)."""
    routed: RoutedSpec | None
    template: RoutedSpec
    dense: DenseSpec


@dataclass
class _TokenParts:
    """A compiled one-token sub-layer and its arguments that stay from token to token: `head` (and
    for attention `mid`, `win`, `tail`) around the per-token ones; `o` its output; a routed FFN's
    `routing`: (its ids output, the expert tensors) for `RoutingStats.record`; `first`: the job it
    starts with, which the layer before names to the waiting workers."""
    fn: Callable
    n_in: int
    head: tuple
    mid: tuple
    win: tuple
    tail: tuple
    o: np.ndarray
    routing: tuple = ()
    first: tuple = _NO_JOB   # (tasks, chunks, n_owned) of the first crew job it posts (`crew.ahead`)
    last: tuple = _NO_JOB    # and of the last (`crew.link`: none for routed experts, chosen per token)
    rows: Callable | None = None  # an FFN's same call over a decode batch's rows (`rows_ffn`)


@dataclass
class _Cached:
    lead: Callable
    ready: _TokenParts | None


@dataclass
class _Group:
    """The products of one `linear` call, resolved once per layout."""
    names: tuple[str, ...]
    ne0: int
    rows: list[int]
    jobs: list[tuple[int, list[tuple[np.ndarray, int, int, int]], int]]  # (type, plan, prepared input)
    prep_types: list[int]  # one weight type per distinct prepared input
    # (type, array, prepared input, rows) when worker 0's arrays hold every row
    whole: list[tuple[int, np.ndarray, int, int]] | None
    small: bool  # below SPLIT_BYTES
    chunks: list[tuple[int, int]] | None  # row ranges dealt to workers, when all read `whole`
    # per product, each worker's array when every worker's holds every row (a token split's)
    everyone: list[list[np.ndarray]] | None = None
    job: Job | None = None  # the crew's job for one token (built on first use)
    runner: Callable | None = None  # compiled prepare + job for one token (None: not built yet)
    runner_lead: Callable | None = None  # the crew `lead` the runner was built around


class _Watchdog:
    """One daemon thread for the process: releases the crews left launched (LINGER) once their
    runtime has gone LINGER_IDLE seconds without a pass."""

    _lock = threading.Lock()
    _wake = threading.Event()
    _watched: "weakref.WeakSet[Runtime]" = weakref.WeakSet()
    _thread: threading.Thread | None = None

    @classmethod
    def watch(cls, rt: "Runtime") -> None:
        with cls._lock:
            cls._watched.add(rt)
            if cls._thread is None:
                cls._thread = threading.Thread(target=cls._loop, name="numawb-crew-watchdog", daemon=True)
                cls._thread.start()
        cls._wake.set()

    @classmethod
    def _loop(cls) -> None:
        while True:
            cls._wake.wait()
            time.sleep(LINGER_TICK)
            now = time.perf_counter()
            with cls._lock:
                watched = list(cls._watched)
            for rt in watched:
                if rt._linger_expired(now):
                    try:
                        rt.release_crew()
                    except Exception:  # noqa: BLE001 - a worker's error: the pass that met it raised it already
                        pass
            with cls._lock:
                for rt in watched:
                    if not rt._lingering:
                        cls._watched.discard(rt)
                if not cls._watched:
                    cls._wake.clear()
            del watched


class Runtime(AttentionPaths):
    """Owns the weights, the worker pool and the split of every product."""

    def __init__(self, gguf: GGUFFile, layout: Layout, pool: Pool,
                 row_split: Callable[[int, int], list[tuple[int, int]]], packed: dict[str, int] | None = None):
        self.gguf = gguf
        self.layout = layout
        self.pool = pool
        self.n_workers = len(pool.workers)
        self._row_split = row_split
        self._small: dict[str, np.ndarray] = {}
        self._plans: dict[str, list[tuple[np.ndarray, int, int, int]]] = {}
        self._groups: dict[tuple[str, ...], _Group] = {}
        self._eplans: dict[tuple[str, int], list[tuple[np.ndarray, int, int, int]]] = {}
        self._eblocks: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._rows_jobs: dict[tuple, Table] = {}  # (group names, rows) -> a decode batch's job
        self._etoken: dict[tuple, tuple] = {}  # (gate, up, down) -> compiled one-token expert FFN
        # a decoded token's compiled sub-layers with their fixed arguments: per KV cache (attention)
        # and per tensors (routed FFN), remade when the layout or the crew changes
        self._tparts: "weakref.WeakKeyDictionary[KVCache, dict]" = weakref.WeakKeyDictionary()
        self._rparts: dict[tuple, _Cached] = {}
        self._journals: dict[tuple, TokenJournal] = {}  # routed experts of token_layers' calls
        self._step_keys: dict[tuple, tuple] = {}
        self._leading = False
        self._crew: Crew | None = None
        # the crew between passes (see LINGER): transitions under _crew_lock; _vacating asks the
        # pass in progress to release it instead of lingering
        self._crew_lock = threading.RLock()
        self._lingering = False
        self._vacating = False
        self._passing = False
        self._crew_t0 = 0.0
        self._last_pass = 0.0
        self._routing = None
        self.crew_backoff = 0  # one-token passes left without the crew (see _note_wait)
        self._starved = 0
        self._backoff_next = CREW_BACKOFF
        self.weights = {name: Weight(info) for name, info in gguf.tensors.items()}
        self.packed: dict[str, int] = {}
        self._set_packed(packed or {})
        self.layers: tuple[int, int] | None = None  # a pipeline stage's layer range [lo, hi) (None: all)

    @property
    def routing(self):
        """RoutingStats of a mixture-of-experts model (set by the engine), or None."""
        return self._routing

    @routing.setter
    def routing(self, stats) -> None:
        self._routing = stats
        if stats is not None:
            for journal in self._journals.values():
                stats.attach(journal)

    # -- weights -----------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.weights

    def shape(self, name: str) -> tuple[int, ...]:
        return self.weights[name].info.shape

    def f32(self, name: str) -> np.ndarray:
        """A small float tensor (norm weights, biases) as float32, cached."""
        arr = self._small.get(name)
        if arr is None:
            w = self.weights[name]
            raw = self._any_full(name)
            arr = kernels.dequantize_rows(w.ggml_type, raw.reshape(w.rows, -1), 0, w.rows).reshape(-1)
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            self._small[name] = arr
        return arr

    def _any_full(self, name: str) -> np.ndarray:
        full = self.layout.full_array(name)
        if full is not None:
            return full
        raise ModelLoadError(f"tensor {name!r} has no complete copy in this placement")

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Dequantized rows of a matrix (embedding lookup)."""
        w = self.weights[name]
        out = np.empty((len(ids), w.ne0), dtype=np.float32)
        for k, i in enumerate(ids):
            arr, first = self._part_holding(name, int(i))
            out[k] = kernels.dequantize_rows(w.ggml_type, arr, int(i) - first, int(i) - first + 1)[0]
        return out

    def _part_holding(self, name: str, row: int) -> tuple[np.ndarray, int]:
        full = self.layout.full_array(name)
        if full is not None:
            return full, 0
        for wk in range(self.n_workers):
            arr, first = self.layout.array_for(name, wk)
            if first <= row < first + arr.shape[0]:
                return arr, first
        raise IndexError(f"row {row} of {name!r} is held by no worker")

    def _set_packed(self, packed: dict[str, int]) -> None:
        """Tensors whose bytes the layout keeps in an engine layout (`packing`) -> that layout."""
        for name, w in self.weights.items():
            w.layout_type = packed.get(name)
        self.packed = dict(packed)

    def set_layout(self, layout: Layout, pool: Pool, packed: dict[str, int] | None = None) -> None:
        """A new placement (and its packed tensors: None keeps the current ones)."""
        self.release_crew()
        if packed is not None:
            self._set_packed(packed)
        self.layout = layout
        self.pool = pool
        self.n_workers = len(pool.workers)
        self._crew = None
        self._plans.clear()
        self._groups.clear()
        self._small.clear()
        self._eplans.clear()
        self._eblocks.clear()
        self._etoken.clear()
        self._rows_jobs.clear()
        self._tparts = weakref.WeakKeyDictionary()
        self._rparts.clear()

    # -- products ----------------------------------------------------------------
    @contextmanager
    def step(self, n_tokens: int = 0, rows: bool = False) -> Iterator[None]:
        """One forward pass: the calling thread stands in for worker 0 (see `WorkerPool.lead`).

        For one token, or for a decode batch (`rows`: n_tokens sequences, one token each), the
        other workers wait in the crew's compiled loop for the whole pass, and after it until the
        next one (see LINGER). `begin_pass`/`end_pass` are the same without a generator (a decoded
        token's Python runs cold: every frame counts).
        """
        state = self.begin_pass(n_tokens, rows)
        ok = False
        try:
            yield
            ok = True
        finally:
            self.end_pass(state, ok)

    def begin_pass(self, n_tokens: int = 0, rows: bool = False) -> tuple | None:
        """Start a forward pass of n_tokens (see `step`); the state to give `end_pass`."""
        if self._leading:
            return None
        self._crew_lock.acquire()
        try:
            self._passing = True
            self._last_pass = t0 = time.perf_counter()
            if self.n_workers == 1:
                # the calling thread does everything; one token still runs its products and
                # attention as jobs (one compiled call per group instead of one per matrix)
                if (n_tokens == 1 or rows) and USE_CREW:
                    if self._crew is None:
                        self._crew = Crew(self.pool, 1)
                    self._crew.start()
                    return (self._crew, False, None, 0.0, t0)
                return (None, False, None, 0.0, t0)
            want = (n_tokens == 1 or rows) and USE_CREW
            solo = want and self.crew_backoff > 0
            crew = self._crew
            if self._lingering and (not want or crew is None or crew.solo != solo or self._vacating):
                self._stop_crew()
            lead = self.pool.lead_begin()
            self._leading = True
            if not want:
                return (None, False, lead, 0.0, t0)
            if crew is None:
                crew = self._crew = Crew(self.pool, self.n_workers)
            if solo:
                self.crew_backoff -= 1
            if not crew.active:
                try:
                    crew.start(solo=solo)
                except BaseException:
                    self._leading = False
                    self.pool.lead_end(lead)
                    raise
                self._crew_t0 = t0
            return (crew, solo, lead, crew.waited(), t0)
        except BaseException:
            self._passing = False
            self._crew_lock.release()
            raise

    def end_pass(self, state: tuple | None, ok: bool = True) -> None:
        """End the pass `begin_pass` started (ok: it ran to the end; else the crew is stopped)."""
        if state is None:
            return
        crew, solo, lead, w0, t0 = state
        try:
            if lead is None:  # one worker
                if crew is not None:
                    crew.stop()
                return
            self._leading = False
            try:
                if crew is not None:
                    now = time.perf_counter()
                    if not solo:
                        self._note_wait(crew.waited() - w0, now - t0)
                    if (ok and LINGER and not solo and crew.active and not self._vacating
                            and now - self._crew_t0 < LINGER_MAX and self.crew_backoff == 0):
                        self._linger()
                    else:
                        self._stop_crew()
            finally:
                self.pool.lead_end(lead)
        finally:
            self._passing = False
            self._last_pass = time.perf_counter()
            self._crew_lock.release()

    def _linger(self) -> None:
        """Leave the crew launched after this pass (see LINGER); a lingering crew stays so through
        the passes that reuse it (the watchdog skips a runtime in a pass)."""
        if not self._lingering:
            self._lingering = True
            hold = getattr(self.pool, "hold", None)
            if hold is not None:
                hold(self.release_crew)
            _Watchdog.watch(self)

    def _stop_crew(self) -> None:
        self._lingering = False
        hold = getattr(self.pool, "hold", None)
        if hold is not None:
            hold(None)
        if self._crew is not None and self._crew.active:
            self._crew.stop()

    def release_crew(self) -> None:
        """Release a crew left launched between passes (any thread; waits for a pass in progress)."""
        if not self._lingering:
            return
        self._vacating = True
        try:
            with self._crew_lock:
                if self._lingering:
                    self._stop_crew()
        finally:
            self._vacating = False

    def _linger_expired(self, now: float) -> bool:
        return self._lingering and not self._passing and now - self._last_pass > LINGER_IDLE

    def _note_wait(self, waited: float, wall: float) -> None:
        """Back off from the crew after CREW_STARVED passes in a row mostly spent waiting for it."""
        if waited > CREW_STARVED_SHARE * wall and waited > CREW_STARVED_SECONDS:
            self._starved += 1
            if self._starved >= CREW_STARVED:
                self.crew_backoff, self._starved = self._backoff_next, 0
                self._backoff_next = min(2 * self._backoff_next, CREW_BACKOFF_MAX)
        else:
            self._starved = 0
            self._backoff_next = CREW_BACKOFF

    @property
    def _crewing(self) -> bool:
        return self._passing and self._crew is not None and self._crew.active

    def _plan(self, name: str) -> list[tuple[np.ndarray, int, int, int]]:
        """Per worker: (array it reads, first row that array holds, lo, hi)."""
        plan = self._plans.get(name)
        if plan is None:
            w = self.weights[name]
            plan = []
            for wk, (lo, hi) in enumerate(self._row_split(w.rows, self.n_workers)):
                arr, first = self.layout.array_for(name, wk)
                arr = arr.reshape(arr.shape[0], -1) if arr.ndim != 2 else arr
                plan.append((arr, first, lo, hi))
            self._plans[name] = plan
        return plan

    def _group(self, names: tuple[str, ...]) -> _Group:
        group = self._groups.get(names)
        if group is None:
            ws = [self.weights[name] for name in names]
            keys = [kernels.prepare_key(w.ggml_type) for w in ws]
            prep = list(dict.fromkeys(keys))
            plans = [self._plan(name) for name in names]
            jobs = [(w.ggml_type, plan, prep.index(key)) for w, plan, key in zip(ws, plans, keys)]
            whole = None
            if all(plan[0][1] == 0 and plan[0][0].shape[0] == w.rows for w, plan in zip(ws, plans)):
                whole = [(t, plan[0][0], p, w.rows) for (t, plan, p), w in zip(jobs, ws)]
            shared = whole is not None and all(_same(arr, plan[0][0]) for plan in plans for arr, *_ in plan)
            nbytes = sum(w.info.nbytes for w in ws)
            rows = max(w.rows for w in ws)
            everyone = None
            if all(first == 0 and arr.shape[0] == w.rows for w, plan in zip(ws, plans) for arr, first, *_ in plan):
                everyone = [[arr for arr, *_ in plan] for plan in plans]
            group = _Group(names, ws[0].ne0, [w.rows for w in ws], jobs,
                           [next(w.ggml_type for w, k in zip(ws, keys) if k == key) for key in prep],
                           whole, nbytes < SPLIT_BYTES,
                           _chunks(rows, max(CHUNK_BYTES * rows // nbytes, 1), self.n_workers) if shared else None,
                           everyone)
            self._groups[names] = group
        return group

    def linear(self, x: np.ndarray, names: tuple[str, ...], after: After | None = None) -> list[np.ndarray]:
        """x [n, k] times each named weight; all products run in one dispatch over the workers.
        after(t0, t1, outs): token-wise work on the outputs' rows [t0, t1), run by the worker that
        computed them when the tokens are shared out (`_token_split`), else once over all rows."""
        group = self._group(names)
        if x.shape[0] == 1 and self._crewing:
            outs = self._one_token(group, x)
            if outs is not None:
                return then_after(after, outs)
        outs = self._token_split(group, x, None, after=after)
        if outs is not None:
            return outs
        outs, xps = self._products(group, x)
        self._run(group, xps, outs, x.shape[0] == 1, None)
        return then_after(after, outs)

    def gated(self, x: np.ndarray, gate: str, up: str, activation: str, before: Before | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """act(x W_gate) * (x W_up), the activation applied by each worker to the rows it computed.
        before(t0, t1): token-wise work that writes x's rows [t0, t1) (x C-contiguous float32), run
        by the worker that multiplies them when the tokens are shared out, else once first."""
        group = self._group((gate, up))
        n, rows = x.shape[0], group.rows[0]
        if n == 1 and self._crewing:
            if before is not None:
                before(0, 1)
            outs = self._one_token(group, x)
            if outs is not None:
                g, u = outs
                a = np.empty_like(g)
                if activation == "gelu":
                    ops.gelu_mul(g, u, a, ops.GELU_F16)
                else:
                    ops.silu_mul(g, u, a)
                return g, u, a
            before = None   # done
        g, u = np.empty((n, rows), dtype=np.float32), np.empty((n, rows), dtype=np.float32)
        a = np.empty_like(g)

        def finish(t0: int, t1: int, lo: int, hi: int) -> None:
            if activation == "gelu":
                ops.gelu_mul(g[t0:t1, lo:hi], u[t0:t1, lo:hi], a[t0:t1, lo:hi], ops.GELU_F16)
            else:
                ops.silu_mul(g[t0:t1, lo:hi], u[t0:t1, lo:hi], a[t0:t1, lo:hi])
        if self._token_split(group, x, finish, [g, u], before=before) is None:
            if before is not None:
                before(0, n)
            _, xps = self._products(group, x)
            self._run(group, xps, [g, u], n == 1, lambda lo, hi: finish(0, n, lo, hi))
        return g, u, a

    @property
    def mixed_q8(self) -> bool:
        """The file's products take both Q8_0 and Q8_K activations (a K-quant file with some
        Q5_0 / Q8_0 tensors, as Gemma 3's and llama.cpp's Q4_K_M rules give): then every group
        whose formats are among those two runs one product runner that picks them per call
        (`crew.product_runner_mixed`), so layers that mix them differently share a compiled token."""
        fams = {kernels.q8_family(w.ggml_type) for w in self.weights.values()}
        return {0, 1} <= fams

    def _token_runner(self, group: _Group) -> Callable | None:
        """The group's compiled one-token product (input preparation + crew job) for the current
        crew, its job made; None when its inputs are not quantized (float weights take the general
        path)."""
        crew = self._crew
        if group.runner is None or group.runner_lead is not crew.lead:
            group.runner_lead = crew.lead
            group.runner = self.product_runner(group) or False
        if group.runner is False:
            return None
        if group.job is None:
            group.job = self._crew_job(group)
        return group.runner

    def product_runner(self, group: _Group, rows: bool = False) -> Callable | None:
        """The compiled prepare + crew job of a group's products with the current crew, for one
        token or (rows) a decode batch's rows; None when its inputs are not quantized or take more
        than two formats."""
        preps = [kernels.preparer(t) for t in group.prep_types]
        if None in preps or len(preps) > 2:
            return None
        if self.mixed_q8 and all(kernels.q8_family(t) >= 0 for t in group.prep_types):
            return product_runner_mixed(self._crew.lead, rows)
        return product_runner(self._crew.lead, *preps, rows=rows)

    def _one_token(self, group: _Group, x: np.ndarray) -> list[np.ndarray] | None:
        """A group's one-token products with the crew in one compiled call (input preparation
        included); None when its inputs are not quantized (float weights take the general path)."""
        crew = self._crew
        if self._token_runner(group) is None:
            return None
        if x.shape[1] != group.ne0:
            raise ValueError(f"input width {x.shape[1]} != row length {group.ne0}")
        job = group.job
        outs = [np.empty((1, rows), dtype=np.float32) for rows in group.rows]
        if not group.runner(crew.ctl, crew.n_workers, job.tasks, job.chunks, job.n_owned,
                            np.ascontiguousarray(x[0]), tuple([o[0] for o in outs])):
            crew.stop()
            raise CrewError("a worker failed during a product")
        return outs

    def rows_ffn(self, spec: "RoutedSpec | DenseSpec | SharedSpec | None", h: np.ndarray) -> np.ndarray | None:
        """An FFN over the rows of a decode batch in one call: only a decode batch's pass has one
        (`engine.batch`); here None, the caller's steps."""
        return None

    def rows_attention(self, spec: "AttentionSpec", h: np.ndarray, il: int, rope: np.ndarray) -> np.ndarray | None:
        """The shared attention sub-layer over a decode batch's rows in one call: only a decode
        batch's pass has one (`engine.batch`); here None, the caller's steps."""
        return None

    def rows_mla(self, spec: "MLASpec", h: np.ndarray, il: int, rope: np.ndarray) -> np.ndarray | None:
        """DeepSeek's MLA sub-layer over a decode batch's rows in one call: only a decode batch's
        pass has one (`engine.batch`); here None, the caller's steps."""
        return None

    def rows_products(self, group: _Group, x: np.ndarray) -> list[np.ndarray] | None:
        """A group's products over the n rows of a decode batch (n sequences, one token each) as
        one crew job (`crew.rows_job`: each weight piece read once for all rows, every output the
        one-token kernel's dot); None when the crew is not running or the group's inputs take more
        than two formats."""
        if not self._crewing or len(group.prep_types) > 2:
            return None
        n = x.shape[0]
        if x.shape[1] != group.ne0:
            raise ValueError(f"input width {x.shape[1]} != row length {group.ne0}")
        key = (group.names, n)
        table = self._rows_jobs.get(key)
        if table is None:
            if group.job is None:
                group.job = self._crew_job(group)
            table = self._rows_jobs[key] = rows_job(group.job, n)
        x = np.ascontiguousarray(x, dtype=np.float32)
        xps = [kernels.prepare(t, x) for t in group.prep_types]
        outs = [np.empty((n, rows), dtype=np.float32) for rows in group.rows]
        self._crew.run(table, xps[0], xps[-1], outs)
        if not self._crew.active:
            raise CrewError("a worker failed during a product")
        return outs

    def attention_token(self, h: np.ndarray, qkv: tuple[str, str, str], output: str, shape: tuple[int, int, int, int],
                        kv: KVCache, il: int, pos0: int, window: int, scale: float, *,
                        biases: Sequence[np.ndarray] = (_EMPTY,) * 4, q_norm: np.ndarray = _EMPTY, k_norm: np.ndarray = _EMPTY,
                        eps: float = 0.0, rope: np.ndarray = _EMPTY, neox: bool = False, prescale: bool = False
                        ) -> np.ndarray | None:
        """A decoded token's attention sub-layer in one compiled call (token_attention.py): the
        q/k/v products of `qkv` (+ `biases` q, k, v, output; size 0 to skip), `q_norm`/`k_norm`
        per head, RoPE from `rope` (one token's row of ops.rope_cache), queries scaled first when
        `prescale`, attention over layer il's cache, the `output` product. `shape`: (n_head, n_kv,
        head_dim, head_dim_v). Returns o [1, n_embd], the same bits as the general path; None when
        there is no such call here (several tokens, no crew, float weights, a cache split between
        nodes): the caller takes the general path."""
        if h.shape[0] != 1 or not self._crewing:
            return None
        parts = self._attention_parts(AttentionSpec(qkv, output, shape, window, scale, tuple(biases), q_norm, k_norm,
                                                    eps, neox, prescale), kv, il)
        if parts is None:
            return None
        if h.shape[1] != parts.n_in:
            raise ValueError(f"input width {h.shape[1]} != row length {parts.n_in}")
        crew = self._crew
        start, base = token_window(pos0, window)
        if not parts.fn(crew.ctl, crew.n_workers, np.ascontiguousarray(h[0], dtype=np.float32), *parts.head, rope,
                        *parts.mid, pos0, *parts.win, start, base, *parts.tail):
            crew.stop()
            raise CrewError("a worker failed during attention")
        return parts.o.copy()

    def _attention_parts(self, spec: "AttentionSpec", kv: KVCache, il: int) -> "_TokenParts | None":
        """The compiled attention sub-layer of `spec` on layer il of `kv` with every argument that
        does not change from token to token (job tables, outputs, norms), made once per layout and
        cache; None when that layer has no such call (float weights). A cache split between nodes
        (several owners) takes `attention.owners_attention`: each owner's chunks on its node's
        workers."""
        if isinstance(spec, MLASpec):
            return self._mla_parts(spec, kv, il)
        per_kv = self._tparts.get(kv)
        if per_kv is None:
            per_kv = self._tparts[kv] = {}
        crew = self._crew
        key = (spec.qkv, spec.output, il)
        parts = per_kv.get(key)
        if parts is not None and parts.lead is crew.lead:
            return parts.ready
        g_qkv, g_out = self._group(spec.qkv), self._group((spec.output,))
        run_qkv, run_out = self._token_runner(g_qkv), self._token_runner(g_out)
        ready = None
        if run_qkv is not None and run_out is not None:
            n_head, n_kv, hd, hdv = spec.shape
            keys, values = self._token_jobs(kv, il, n_head // n_kv)
            q = np.empty((n_head, hd), dtype=np.float32)
            k = np.empty((n_kv, hd), dtype=np.float32)
            v = np.empty((n_kv, hdv), dtype=np.float32)
            o = np.empty((1, g_out.rows[0]), dtype=np.float32)
            b = spec.biases
            jq, jo = g_qkv.job, g_out.job
            chain = [(jq.tasks, jq.chunks, jq.n_owned), keys, values, (jo.tasks, jo.chunks, jo.n_owned)]
            for before, after in zip(chain, chain[1:]):
                link(before, after)
            attend, kc, vc = self._cache_args(kv, il)
            ready = _TokenParts(
                block_runner(run_qkv, attend, run_out), g_qkv.ne0,
                ((jq.tasks, jq.chunks, jq.n_owned), q, k, v, b[0], b[1], b[2], spec.q_norm, spec.k_norm, spec.eps),
                (spec.neox, spec.prescale, keys, values, kc, vc),
                (spec.window, spec.scale), (kv.cap, (jo.tasks, jo.chunks, jo.n_owned), o[0], b[3]), o,
                first=chain[0], last=chain[-1])
        per_kv[key] = _Cached(crew.lead, ready)
        return ready

    def _cache_args(self, kv, il: int) -> tuple[Callable, object, object]:
        """The compiled one-token attention for cache `kv` and its layer il's keys and values as
        it takes them: one owner's arrays, or the owners' tuples (a cache split between nodes)."""
        if kv.n_workers == 1:
            return one_token_attention(self._crew.lead), kv.keys3(il, 0), kv.v[il][0]
        return (owners_attention(self._crew.lead), tuple(kv.keys3(il, o) for o in range(kv.n_workers)),
                tuple(kv.v[il]))

    def _token_split(self, group: _Group, x: np.ndarray, finish: Callable[[int, int, int, int], None] | None,
                     outs: list[np.ndarray] | None = None, before: Before | None = None,
                     after: After | None = None) -> list[np.ndarray] | None:
        """A prompt's products with the tokens shared out (see TOKEN_SPLIT_MIN): each worker runs
        `before(t0, t1)` on its tokens, prepares their inputs and multiplies them by every row of
        its own arrays, then `finish(t0, t1, 0, rows)` and `after(t0, t1, outs)`. None (nothing
        computed or called) when the rows must be split instead: one worker, too few tokens, or
        workers that hold only some rows."""
        n, nw = x.shape[0], self.n_workers
        if nw == 1 or n < TOKEN_SPLIT_MIN * nw or group.everyone is None:
            return None
        if x.shape[1] != group.ne0:
            raise ValueError(f"input width {x.shape[1]} != row length {group.ne0}")
        if outs is None:
            outs = [np.empty((n, rows), dtype=np.float32) for rows in group.rows]
        if before is None:
            x = np.ascontiguousarray(x, dtype=np.float32)
        elif not (x.flags.c_contiguous and x.dtype == np.float32):
            raise ValueError("an input written by `before` must be C-contiguous float32")
        cut = _token_cuts(n, nw)

        def work(wk: int) -> None:
            t0, t1 = cut[wk], cut[wk + 1]
            if t1 <= t0:
                return
            if before is not None:
                before(t0, t1)
            xps = [kernels.prepare(t, x[t0:t1]) for t in group.prep_types]
            for (qtype, _plan, p), arrs, out in zip(group.jobs, group.everyone, outs):
                arr = arrs[wk]
                kernels.matmat(qtype, arr, xps[p], out[t0:t1], 0, arr.shape[0])
            if finish is not None:
                finish(t0, t1, 0, group.rows[0])
            if after is not None:
                after(t0, t1, outs)
        self.each_worker(work)
        return outs

    def _products(self, group: _Group, x: np.ndarray) -> tuple[list[np.ndarray], list[tuple]]:
        """Fresh outputs of a group, and its inputs prepared (once per distinct vec_dot type)."""
        n = x.shape[0]
        if x.shape[1] != group.ne0:
            raise ValueError(f"input width {x.shape[1]} != row length {group.ne0}")
        xs = x[0] if n == 1 else x
        xps = [kernels.prepare(t, xs) for t in group.prep_types]
        return [np.empty((n, rows), dtype=np.float32) for rows in group.rows], xps

    def _run(self, group: _Group, xps: list[tuple], outs: list[np.ndarray], single: bool,
             finish: Callable[[int, int], None] | None) -> None:
        """Compute a group's products (then `finish(lo, hi)` on the rows just computed).

        One token: the calling thread alone when it can and the group is small; else, when all
        workers read the same arrays, workers take row chunks as they go (a worker slowed by
        other load takes fewer); else each worker computes its `row_split` range.
        """
        whole = group.whole
        if single and self._crewing:
            if group.job is None:
                group.job = self._crew_job(group)
            self._crew.run(group.job, xps[0], xps[-1], [o[0] for o in outs])
            if finish is not None:
                finish(0, group.rows[0])
            return
        if single and whole is not None and (self.n_workers == 1 or (self._leading and group.small)):
            for (qtype, arr, p, rows), out in zip(whole, outs):
                kernels.matvec(qtype, arr, xps[p], out[0], 0, rows)
            if finish is not None:
                finish(0, group.rows[0])
            return
        if single and group.chunks is not None:
            chunks = iter(group.chunks)  # shared by the workers: next() is atomic under the GIL

            def work(wk: int) -> None:
                for lo, hi in chunks:
                    for (qtype, arr, p, rows), out in zip(whole, outs):
                        if lo < rows:
                            kernels.matvec(qtype, arr, xps[p], out[0], lo, min(hi, rows))
                    if finish is not None:
                        finish(lo, hi)
            self.each_worker(work)
            return

        def work(wk: int) -> None:
            for (qtype, plan, p), out in zip(group.jobs, outs):
                arr, first, lo, hi = plan[wk]
                if hi <= lo:
                    continue
                if single:
                    kernels.matvec(qtype, arr, xps[p], out[0, first:first + arr.shape[0]], lo - first, hi - first)
                else:
                    kernels.matmat(qtype, arr, xps[p], out[:, first:first + arr.shape[0]], lo - first, hi - first)
            if finish is not None:
                lo, hi = group.jobs[0][1][wk][2:]
                if hi > lo:
                    finish(lo, hi)
        self.each_worker(work)

    def _crew_job(self, group: _Group) -> Job:
        """A group's one-token products as a crew job. When every worker reads the same arrays:
        with workers of one node, each worker's contiguous share of the rows, pinned, in halving
        pieces it may lose to a faster worker from the back (`_pinned_shares`): one stream per
        worker and product, where shared chunks taken in turn restarted the stream at every chunk
        (the gate/up products of Gemma 3 270M, 1.8 MB: 71-74 -> 62-66 us at 2 threads on the Intel
        Xeon host); across nodes, shared chunks in guided sizes (a thief reads only its own node).
        Else each worker's own row range of its own arrays."""
        tasks, owned, shared = [], [], []
        crew = self._crew
        if group.chunks is not None and self.n_workers > 1 and crew is not None and crew.one_group:
            for j, (qtype, plan, p) in enumerate(group.jobs):
                tasks.append((qtype, plan[0][0], p, j, 0))
            row_bytes = [self.weights[name].info.row_bytes for name in group.names]
            job = Job(tasks, _pinned_shares(group.rows, row_bytes, self.n_workers), [])
            job.n_owned |= STEALABLE
            return job
        if group.chunks is not None:
            for j, ((qtype, plan, p), rows, name) in enumerate(zip(group.jobs, group.rows, group.names)):
                tasks.append((qtype, plan[0][0], p, j, 0))
                min_rows = max(CREW_CHUNK_BYTES * rows // self.weights[name].info.nbytes, 1) \
                    if self.n_workers > 1 else rows
                shared += [(j, lo, hi) for lo, hi in _chunks(rows, min_rows, self.n_workers)]
        else:
            for j, (qtype, plan, p) in enumerate(group.jobs):
                for wk, (arr, first, lo, hi) in enumerate(plan):
                    if hi > lo:
                        owned.append((len(tasks), lo - first, hi - first, wk))
                        tasks.append((qtype, arr, p, j, first))
        return Job(tasks, owned, shared)

    # -- experts (3-D tensors: sub-matrix e = rows [e*n, (e+1)*n) of the tensor as 2-D) -------------
    def n_sub(self, name: str) -> int:
        """Sub-matrices of a 3-D tensor (experts, or heads of MLA's attn_k_b/attn_v_b); 1 for 2-D."""
        shape = self.weights[name].info.shape
        return int(shape[2]) if len(shape) >= 3 else 1

    def _expert_plan(self, name: str, e: int) -> list[tuple[np.ndarray, int, int, int]]:
        """Per worker: (rows of sub-matrix e it reads, index in e of their first, lo, hi): worker w
        computes rows row_split(n, n_workers)[w] of every sub-matrix, read through the layout's
        `expert_rows` (so a placement that gives each node its rows of every expert is local)."""
        key = (name, e)
        plan = self._eplans.get(key)
        if plan is None:
            w = self.weights[name]
            per = w.rows // self.n_sub(name)
            # a layout may choose who computes which rows of an expert (e.g. only the workers of
            # the node that owns it): expert_split(name, e) -> [(lo, hi)] per worker
            split = getattr(self.layout, "expert_split", None)
            ranges = split(name, e) if split is not None else self._row_split(per, self.n_workers)
            plan = []
            for wk, (lo, hi) in enumerate(ranges):
                if hi <= lo:  # this worker computes none of the expert: nothing to read
                    plan.append((np.zeros((0, w.info.row_bytes), dtype=np.uint8), 0, 0, 0))
                    continue
                arr, first = self.layout.expert_rows(name, wk, e)
                arr = arr.reshape(arr.shape[0], -1) if arr.ndim != 2 else arr
                if hi > lo and not (first <= lo and hi <= first + arr.shape[0]):
                    raise ValueError(f"{name}: worker {wk}'s copy of expert {e} holds rows "
                                     f"[{first}, {first + arr.shape[0]}), it computes [{lo}, {hi})")
                plan.append((arr, first, lo, hi))
            self._eplans[key] = plan
        return plan

    def moe(self, x: np.ndarray, gate: str | None, up: str, down: str, experts: np.ndarray, weights: np.ndarray,
            activation: str = "silu") -> np.ndarray:
        """The routed experts' gated FFN: x [n, n_embd] float32, experts [n, k] (ids, in slot order),
        weights [n, k] float32 -> [n, n_embd] = sum over slots i (in order) of
        weights[:, i] * down_e(act(gate_e x) * up_e x), e = experts[:, i]. gate None: `up` is a
        fused ffn_gate_up_exps (each expert's gate rows, then its up rows).

        As ggml's mul_mat_id: tokens are grouped by expert so each routed expert's rows are read once
        per call (only the routed experts are read); every output is one vec_dot per (row, token)
        whatever the grouping and thread count; each worker computes its `row_split` range of every
        expert it is given (see `_expert_plan`). The weighting and the sum over slots are f32, in
        slot order, as llama.cpp's ggml_mul and chain of ggml_add.
        """
        n, k = experts.shape
        ids = np.asarray(experts, dtype=np.int64)
        n_exp = self.n_sub(up)
        if ids.size and (ids.min() < 0 or ids.max() >= n_exp):
            raise ValueError(f"expert ids outside [0, {n_exp})")
        if self.routing is not None:
            self.routing.record(up, ids, tuple(n for n in (gate, up, down) if n))
        if n == 1 and self._crewing:
            out = self._moe_token(x, gate, up, down, ids[0], weights[0], activation)
            if out is not None:
                return out
        # (expert, input rows, output rows): gate/up read token t, write row t*k + i
        rows: dict[int, list[int]] = {}
        for r, e in enumerate(ids.reshape(-1).tolist()):
            rows.setdefault(e, []).append(r)
        groups = [(e, np.array(rs, dtype=np.int64) // k, np.array(rs, dtype=np.int64)) for e, rs in rows.items()]
        if gate is None:
            (gu,) = self._expert_products((up,), x, groups, n * k)
            half = gu.shape[1] // 2
            g, u = np.ascontiguousarray(gu[:, :half]), np.ascontiguousarray(gu[:, half:])
        else:
            g, u = self._expert_products((gate, up), x, groups, n * k)
        a = np.empty_like(g)

        def act(t0: int, t1: int) -> None:   # rows are (token, slot) pairs: token t's at t * k
            r0, r1 = t0 * k, t1 * k
            if activation == "gelu":
                ops.gelu_mul(g[r0:r1], u[r0:r1], a[r0:r1], ops.GELU_F16)
            else:
                ops.silu_mul(g[r0:r1], u[r0:r1], a[r0:r1])
        self.token_rows(n, act)
        # down reads the activation row of each (token, slot)
        (d,) = self._expert_products((down,), a, [(e, rows, rows) for e, _, rows in groups], n * k)
        d = d.reshape(n, k, -1)
        w = np.ascontiguousarray(weights, dtype=np.float32)
        out = np.empty((n, d.shape[2]), dtype=np.float32)
        self.token_rows(n, lambda t0, t1: ops.weighted_slots(d[t0:t1], w[t0:t1], out[t0:t1]))
        return out

    def token_rows(self, n: int, fn: Before) -> None:
        """fn(t0, t1) over tokens [0, n): the workers' token shares (as `_token_split`'s) when the
        tokens are many and every worker may run it, else fn(0, n) here (token-wise work between a
        prompt's products: one hand-off costs ~40 us)."""
        nw = self.n_workers
        if nw == 1 or n < TOKEN_SPLIT_MIN * nw:
            fn(0, n)
            return
        cut = _token_cuts(n, nw)
        self.each_worker(lambda wk: fn(cut[wk], cut[wk + 1]) if cut[wk + 1] > cut[wk] else None)

    def _token_experts(self, gate: str | None, up: str, down: str) -> tuple | None:
        """The compiled one-token expert FFN of these tensors with the crew (`expert_token`) and its
        tables, made once per layout; None when their types have no compiled path there (float
        experts, gate and up with different activation formats)."""
        crew = self._crew
        key = (gate, up, down)
        entry = self._etoken.get(key)
        if entry is None or entry[0] is not crew.lead:
            names_gu = (up,) if gate is None else (gate, up)
            ws_gu = [self.weights[nm] for nm in names_gu]
            wd = self.weights[down]
            preps = {kernels.prepare_key(w.ggml_type) for w in ws_gu}
            prep_gu, prep_d = kernels.preparer(ws_gu[0].ggml_type), kernels.preparer(wd.ggml_type)
            fams = [kernels.q8_family(w.ggml_type) for w in ws_gu + [wd]]
            mixed = self.mixed_q8 and min(fams) >= 0   # formats picked per call, per tensor
            if not mixed and (len(preps) != 1 or prep_gu is None or prep_d is None):
                entry = (crew.lead, None)
            else:
                n_sub = self.n_sub(up)
                pidx = [0] * len(names_gu) if len(set(fams[:-1])) == 1 else [0, 1]   # (a gate and an up apart)
                gu = self._token_table(names_gu, ws_gu, pidx, [w.rows // n_sub for w in ws_gu])
                dn = self._token_table((down,), [wd], [0], [wd.rows // n_sub])
                if mixed:
                    prep_gu = prep_d = kernels.activations.quantize_q8_0_or_K
                else:
                    prep_gu, prep_d = fixed_format(prep_gu), fixed_format(prep_d)
                runner = expert_runner(crew.lead, prep_gu, prep_d, len(names_gu))
                entry = (crew.lead, runner, gu, dn, ws_gu[0].rows // n_sub, wd.rows // n_sub,
                         rows_routed_runner(crew.lead, prep_gu, prep_d, len(names_gu)))
            self._etoken[key] = entry
        return entry if entry[1] is not None else None

    @staticmethod
    def _token_scratch(entry: tuple, k: int, fused: bool) -> tuple:
        """Fresh (g, u, act, d, out [1, n_out]) of one token's expert FFN, and n_ff."""
        gu_rows, n_out = entry[4], entry[5]
        n_ff = gu_rows // 2 if fused else gu_rows
        return (np.empty(k * gu_rows, dtype=np.float32), np.empty(1 if fused else k * n_ff, dtype=np.float32),
                np.empty(k * n_ff, dtype=np.float32), np.empty(k * n_out, dtype=np.float32),
                np.empty((1, n_out), dtype=np.float32), n_ff)

    def _moe_token(self, x: np.ndarray, gate: str | None, up: str, down: str, ids: np.ndarray,
                   weights: np.ndarray, activation: str) -> np.ndarray | None:
        """One token's routed experts in one compiled call with the crew (`expert_token`); None
        when the tensors' types have no compiled path there: the caller takes the general path."""
        entry = self._token_experts(gate, up, down)
        if entry is None:
            return None
        crew = self._crew
        _lead, runner, gu, dn, _r, _n, _rows = entry
        g, u, act, d, out, n_ff = self._token_scratch(entry, ids.shape[0], gate is None)
        if not runner(crew.ctl, crew.n_workers, np.ascontiguousarray(x, dtype=np.float32),
                      np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(weights, dtype=np.float32),
                      *gu, *dn, g, u, act, d, out[0], n_ff,
                      GELU if activation == "gelu" else SILU, ops.GELU_F16):
            crew.stop()
            raise CrewError("a worker failed during an expert product")
        return out

    def routed_token(self, h: np.ndarray, router: str, gating: Gating, gate: str | None, up: str, down: str,
                     activation: str = "silu") -> np.ndarray | None:
        """A decoded token's routed FFN (router product, `gating`, the k experts, their weighted sum)
        in one compiled call with the crew, bit-identical to `linear` on the router, the gating
        functions and `moe`; the experts are recorded in `routing` as `moe` does. None when there
        is no such call here (several tokens, no crew, a router that is not float32, experts
        without a compiled path): the caller routes and calls `moe`."""
        if h.shape[0] != 1 or not self._crewing:
            return None
        parts = self._routed_parts(RoutedSpec(router, gating, gate, up, down, activation))
        if parts is None:
            return None
        crew = self._crew
        if not parts.fn(crew.ctl, crew.n_workers, np.ascontiguousarray(h, dtype=np.float32), *parts.head):
            crew.stop()
            raise CrewError("a worker failed during an expert product")
        self._record_routing(parts)
        return parts.o.copy()

    def _record_routing(self, parts: "_TokenParts") -> None:
        if self.routing is not None and parts.routing:
            ids, names = parts.routing
            self.routing.record(names[-2], ids[None], names)

    def _routed_parts(self, spec: "RoutedSpec") -> "_TokenParts | None":
        """`routed_runner` of `spec` with every argument that does not change from token to token
        (job tables, gating, scratch, outputs), made once per layout; None when there is no such
        call (a router that is not float32, experts without a compiled path)."""
        crew = self._crew
        key = (spec.router, spec.gate, spec.up, spec.down)
        cached = self._rparts.get(key)
        if cached is not None and cached.lead is crew.lead:
            return cached.ready
        ready = None
        rgroup = self._group((spec.router,))
        entry = self._token_experts(spec.gate, spec.up, spec.down) if rgroup.prep_types == [kernels.F32] else None
        if entry is not None:
            if rgroup.job is None:
                rgroup.job = self._crew_job(rgroup)
            _lead, runner, gu, dn, _r, _n, rows = entry
            g_ = spec.gating
            k = g_.k
            g, u, act, d, out, n_ff = self._token_scratch(entry, k, spec.gate is None)
            ids = np.empty(k, dtype=np.int64)
            wts = np.empty(k, dtype=np.float32)
            logits = np.empty(rgroup.rows[0], dtype=np.float32)
            job = rgroup.job
            names = tuple(n for n in (spec.gate, spec.up, spec.down) if n)
            ready = _TokenParts(
                routed_runner(crew.lead, runner), rgroup.ne0,
                (job.tasks, job.chunks, job.n_owned, logits, g_.kind, k, g_.bias, g_.n_groups, g_.n_group_used,
                 g_.norm, g_.scale, ids, wts, *gu, *dn, g, u, act, d, out[0], n_ff,
                 GELU if spec.activation == "gelu" else SILU, ops.GELU_F16),
                (), (), (), out, (ids, names), first=(job.tasks, job.chunks, job.n_owned), rows=rows)
        self._rparts[key] = _Cached(crew.lead, ready)
        return ready

    def _dense_parts(self, spec: DenseSpec) -> "_TokenParts | None":
        """`dense_token.dense_runner` of `spec` with its job tables and scratch, made once per layout;
        None when there is no such call (float weights, more than two activation formats)."""
        crew = self._crew
        key = ("dense", spec.gate, spec.up, spec.down)
        cached = self._rparts.get(key)
        if cached is not None and cached.lead is crew.lead:
            return cached.ready
        ready = None
        g_gu, g_d = self._group((spec.gate, spec.up)), self._group((spec.down,))
        run_gu, run_d = self._token_runner(g_gu), self._token_runner(g_d)
        if run_gu is not None and run_d is not None and g_gu.rows[0] == g_gu.rows[1] == g_d.ne0:
            g = np.empty((1, g_gu.rows[0]), dtype=np.float32)
            u, act = np.empty_like(g), np.empty_like(g)
            out = np.empty((1, g_d.rows[0]), dtype=np.float32)
            jg, jd = g_gu.job, g_d.job
            link((jg.tasks, jg.chunks, jg.n_owned), (jd.tasks, jd.chunks, jd.n_owned))
            ready = _TokenParts(
                dense_runner(run_gu, run_d), g_gu.ne0,
                ((jg.tasks, jg.chunks, jg.n_owned), g, u, act, (jd.tasks, jd.chunks, jd.n_owned), out[0],
                 GELU if spec.activation == "gelu" else SILU, ops.GELU_F16),
                (), (), (), out, first=(jg.tasks, jg.chunks, jg.n_owned), last=(jd.tasks, jd.chunks, jd.n_owned))
        self._rparts[key] = _Cached(crew.lead, ready)
        return ready

    def _ffn_parts(self, spec: "RoutedSpec | DenseSpec | SharedSpec") -> "_TokenParts | None":
        if isinstance(spec, SharedSpec):
            return self._shared_parts(spec)
        return self._routed_parts(spec) if isinstance(spec, RoutedSpec) else self._dense_parts(spec)

    def _shared_parts(self, spec: SharedSpec) -> "_TokenParts | None":
        """`expert_token.shared_fused_runner` of `spec` where its jobs can be merged, else
        `shared_runner`: the routed FFN's parts (the template's, not run, in a dense layer) and the
        dense FFN's, their outputs added; None when either has no call."""
        fused = self._fused_parts(spec)
        if fused is not None:
            return fused
        r = self._routed_parts(spec.routed or spec.template)
        d = self._dense_parts(spec.dense)
        if r is None or d is None:
            return None
        out = np.empty_like(d.o)
        on = spec.routed is not None
        return _TokenParts(shared_runner(r.fn, d.fn), d.n_in, (on, r.head, d.first, d.head, r.o, d.o, out), (), (), (),
                           out, r.routing if on else (), first=r.first if on else d.first, last=d.last)

    def _fused_parts(self, spec: SharedSpec) -> "_TokenParts | None":
        """`shared_fused_runner`'s arguments for `spec`, made once per layout: the router's job and
        the shared (or dense) gate/up job merged, the down job's tasks reading prepared input 1
        into output 1, the routed experts' compact tables and the scratch. None where the jobs
        cannot share a call: fused gate/up experts, a router that is not float32, or the experts
        and the dense FFN quantizing their inputs apart."""
        crew = self._crew
        t, dn = spec.routed or spec.template, spec.dense
        key = ("fused", t.router, t.gate, t.up, t.down, dn.gate, dn.up, dn.down, spec.routed is not None)
        cached = self._rparts.get(key)
        if cached is not None and cached.lead is crew.lead:
            return cached.ready
        ready = None
        rgroup = self._group((t.router,))
        types_x = [self.weights[n].ggml_type for n in (t.gate, t.up, dn.gate, dn.up) if n]
        types_a = [self.weights[n].ggml_type for n in (t.down, dn.down)]
        entry = None
        if (t.gate is not None and rgroup.prep_types == [kernels.F32]
                and len({kernels.prepare_key(x) for x in types_x}) == 1
                and len({kernels.prepare_key(x) for x in types_a}) == 1
                and None not in (kernels.preparer(types_x[0]), kernels.preparer(types_a[0]))):
            entry = self._token_experts(t.gate, t.up, t.down)
        g_gu, g_d = self._group((dn.gate, dn.up)), self._group((dn.down,))
        if entry is not None and self._token_runner(g_gu) is not None and self._token_runner(g_d) is not None:
            if rgroup.job is None:
                rgroup.job = self._crew_job(rgroup)
            _lead, _runner, gu, dtab, _r, _n, _rows = entry
            rj, gj, dj = rgroup.job, g_gu.job, g_d.job
            tb = gj.tasks.copy()
            tb[:, T_PREP] = 1
            tb[:, T_OUT] += 1
            if spec.routed is not None:
                j1 = concat_jobs(rj.tasks.copy(), rj.chunks, rj.n_owned, tb, gj.chunks, gj.n_owned)
                j1 = (j1[0], j1[1], j1[2] | ((rj.n_owned | gj.n_owned) & STEALABLE))
            else:
                j1 = (tb, gj.chunks.copy(), gj.n_owned)
            td = dj.tasks.copy()
            td[:, T_PREP] = 1
            td[:, T_OUT] = 1
            sd = (td, dj.chunks.copy(), dj.n_owned)
            g_ = t.gating
            k = g_.k
            g, u, act, d, out, n_ff = self._token_scratch(entry, k, False)
            n_sh = g_gu.rows[0]
            ids = np.empty(k, dtype=np.int64)
            on = spec.routed is not None
            fam_x, fam_a = kernels.q8_family(types_x[0]), kernels.q8_family(types_a[0])
            if self.mixed_q8 and min(fam_x, fam_a) >= 0:   # one function for every layer's formats
                prep_x = prep_a = kernels.activations.quantize_q8_0_or_K
            else:
                prep_x, prep_a = fixed_format(kernels.preparer(types_x[0])), fixed_format(kernels.preparer(types_a[0]))
            ready = _TokenParts(
                shared_fused_runner(crew.lead, prep_x, prep_a), g_gu.ne0,
                (on, j1, np.empty(rgroup.rows[0], dtype=np.float32), g_.kind, k, g_.bias, g_.n_groups,
                 g_.n_group_used, g_.norm, g_.scale, ids, np.empty(k, dtype=np.float32), *gu, *dtab, sd, g, u, act,
                 d, np.empty((1, n_sh), dtype=np.float32), np.empty((1, n_sh), dtype=np.float32),
                 np.empty((1, n_sh), dtype=np.float32), np.empty(g_d.rows[0], dtype=np.float32), out, n_ff,
                 GELU if t.activation == "gelu" else SILU, ops.GELU_F16, fam_x, fam_a),
                (), (), (), out, (ids, tuple(n for n in (t.gate, t.up, t.down) if n)) if on else (),
                first=j1, last=sd, rows=rows_fused_runner(crew.lead, prep_x, prep_a))
        self._rparts[key] = _Cached(crew.lead, ready)
        return ready

    def _sub_job(self, name: str) -> tuple:
        """One token's per-head products of a 3-D tensor (MLA's attn_k_b / attn_v_b: sub-matrix i
        times input row i into output row i) as a crew job (tasks, chunks, owned), made once per
        layout: `sub_products`' tasks for every head."""
        w = self.weights[name]
        m = self.n_sub(name)
        heads = np.arange(m, dtype=np.int64)
        tasks, chunks = compose(*self._expert_table((name,), [w], [0], [w.rows // m]), heads, heads, _NO_WADDR)
        return tasks, chunks, chunks.shape[0] | STEALABLE

    def _mla_parts(self, spec: MLASpec, kv, il: int) -> "_TokenParts | None":
        """The compiled MLA sub-layer (`mla_token.mla_block_runner`) of `spec` on layer il of the
        latent cache (one owner or several), with its job tables and scratch, made once per layout
        and cache;
        None when a product has no compiled path (float weights)."""
        per_kv = self._tparts.setdefault(kv, {})
        crew = self._crew
        key = ("mla", spec.output, il)
        parts = per_kv.get(key)
        if parts is not None and parts.lead is crew.lead:
            return parts.ready
        ready = None
        g1, g_out = self._group(spec.first), self._group((spec.output,))
        g_qb = self._group((spec.q_b,)) if spec.q_b else None
        run1, run_out = self._token_runner(g1), self._token_runner(g_out)
        run_qb = self._token_runner(g_qb) if g_qb is not None else run1
        preps = [kernels.preparer(self.weights[n].ggml_type, floats=True) for n in (spec.k_b, spec.v_b)]
        if None not in (run1, run_out, run_qb, *preps):
            H, lora = spec.n_head, kv.kv_lora
            j1 = (g1.job.tasks, g1.job.chunks, g1.job.n_owned)
            qa = np.empty(g1.rows[0], dtype=np.float32)
            ckv = np.empty(g1.rows[1], dtype=np.float32)
            if g_qb is not None:
                jqb = (g_qb.job.tasks, g_qb.job.chunks, g_qb.job.n_owned)
                q = np.empty(g_qb.rows[0], dtype=np.float32)
                qa_norm = self.f32(spec.q_a_norm)
            else:
                jqb, q, qa_norm = j1, qa, _EMPTY
            jkb, jvb = self._sub_job(spec.k_b), self._sub_job(spec.v_b)
            keys, values = self._token_jobs(kv, il, H)
            jo = (g_out.job.tasks, g_out.job.chunks, g_out.job.n_owned)
            chain = [j1] + ([jqb] if g_qb is not None else []) + [jkb, keys, values, jvb, jo]
            for before, after in zip(chain, chain[1:]):
                link(before, after)
            width = kv.width
            attend, kc, vc = self._cache_args(kv, il)
            o = np.empty((1, g_out.rows[0]), dtype=np.float32)
            dv = self.weights[spec.v_b].rows // H
            ready = _TokenParts(
                mla_block_runner(run1, run_qb, crew.lead, preps[0], preps[1], attend, run_out),
                g1.ne0,
                (j1, qa, ckv, qa_norm, float(spec.eps), jqb, q, jkb, np.empty((H, spec.nope), dtype=np.float32),
                 np.empty((H, lora), dtype=np.float32)),
                (bool(spec.neox), int(spec.nope), self.f32(spec.kv_norm), keys, values, kc, vc,
                 np.empty((H, width), dtype=np.float32), np.empty((1, width), dtype=np.float32),
                 np.empty((1, lora), dtype=np.float32)),
                (0, float(spec.scale)), (kv.cap, jvb, np.empty((H, dv), dtype=np.float32), jo, o[0]), o,
                first=chain[0], last=chain[-1])
        per_kv[key] = _Cached(crew.lead, ready)
        return ready

    def layer_token(self, x: np.ndarray, h: np.ndarray, attention: "AttentionSpec", kv: KVCache, il: int,
                    pos0: int, rope: np.ndarray, ffn_norm: np.ndarray, ffn: "RoutedSpec | DenseSpec",
                    next_norm: np.ndarray, eps: float, post_attn: np.ndarray = _EMPTY,
                    post_ffn: np.ndarray = _EMPTY) -> np.ndarray | None:
        """A decoded token's whole layer in one compiled call (`token_layer`): the attention
        sub-layer of `attention` on normed input h, x += its output (normed by `post_attn` first,
        when given), the `ffn_norm` norm, the routed or dense FFN `ffn`, x += its output (normed by
        `post_ffn` first, when given); returns x normed by `next_norm` (the next layer's input
        norm), the same bits as the calls one by one. x is updated in place. None when either half
        has no compiled call here: the caller runs the layer step by step."""
        if h.shape[0] != 1 or not self._crewing:
            return None
        a = self._attention_parts(attention, kv, il)
        f = self._ffn_parts(ffn) if a is not None else None
        if f is None:
            return None
        crew = self._crew
        fn = layer_runner(a.fn, f.fn)
        start, base = token_window(pos0, attention.window)
        hn = np.empty_like(x)
        if not fn(crew.ctl, crew.n_workers, x, np.ascontiguousarray(h, dtype=np.float32), a.head, rope, a.mid, pos0,
                  a.win, start, base, a.tail, a.o, ffn_norm, f.head, f.o, next_norm, eps, hn, post_attn, post_ffn,
                  f.first, _NO_JOB):
            crew.stop()
            raise CrewError("a worker failed during a layer")
        self._record_routing(f)
        return hn

    def token_layers(self, x: np.ndarray, h: np.ndarray, steps: Sequence[tuple], kv: KVCache, pos0: int,
                     ropes: np.ndarray, output: str | None = None) -> tuple[np.ndarray, np.ndarray | None] | None:
        """A decoded token's layers in one compiled call (`token_layer.token_runner`): for each step
        (AttentionSpec, layer in the cache, ffn norm weight, RoutedSpec or DenseSpec, next norm
        weight, eps, post-attention norm weight, post-FFN norm weight (size 0: none), RoPE base
        index) what `layer_token` does, with the RoPE table ropes[index] ([bases, 1, rope dims / 2,
        2]); the layers' fixed arguments kept per cache as a typed list; x is updated in place.
        Returns (the last layer's output normed by its next norm, the logits [1, rows] of
        `output` times it when that product runs in the same call, else None). None when a layer
        has no compiled call or the layers' calls differ (tensor types): the caller goes layer by
        layer."""
        if h.shape[0] != 1 or not self._crewing:
            return None
        crew = self._crew
        ready = self._token_parts(kv, self._steps_key("token", steps, output),
                                  lambda: self._token_layers(steps, kv, output))
        if ready is None:
            return None
        fn, (layers_at, _typed), journal, out_job, h_last = ready  # _typed: alive for the call
        logits = np.empty(out_job[3], dtype=np.float32)
        ok = fn(crew.ctl, crew.n_workers, x, np.ascontiguousarray(h, dtype=np.float32), layers_at, ropes, pos0,
                SKIP_SLID_VALUES, journal.ids, journal.written, out_job, logits)
        self._token_done(ok, journal)
        if out_job[3]:
            return h_last, logits.reshape(1, -1)
        return h_last.copy(), None

    def token_program(self, tok: int, steps: Sequence[tuple], kv: KVCache, pos0: int, prologue: tuple,
                      output: str) -> np.ndarray | None:
        """A decoded token from its id to its logits [1, rows of `output`] in one compiled call:
        `token_layers` with the embedding row, its scale, the first norm and the RoPE table of pos0
        done in the same call (the Python around them ran cold after each token's weights streamed
        through the caches). prologue: (embedding tensor, scale or 0, first norm weight tensor, eps,
        (rope dims, base, freq scale, freq factors, ext factor, attn factor, corr lo, corr hi)).
        None when there is no such call (see `token_layers`; an embedding split between workers
        or kept in an engine layout). The prologue's RoPE base is an array: every base the steps'
        indexes name."""
        if not self._crewing:
            return None
        crew = self._crew
        ready = self._token_parts(kv, self._steps_key("program", steps, output),
                                  lambda: self._token_layers(steps, kv, output, prologue))
        if ready is None:
            return None
        fn, (pro_at, layers_at, *_lists), journal, out_job, _h = ready  # _lists: alive for the call
        logits = np.empty(out_job[3], dtype=np.float32)
        ok = fn(crew.ctl, crew.n_workers, tok, pos0, pro_at, layers_at, SKIP_SLID_VALUES, journal.ids,
                journal.written, out_job, logits)
        self._token_done(ok, journal)
        return logits.reshape(1, -1)

    def token_program_compile(self, steps: Sequence[tuple], kv: KVCache, prologue: tuple,
                              output: str) -> Callable[[], None] | None:
        """`token_program`'s compiled call for these steps and cache, made ready without running a
        token: its parts are built now (typed lists, the routing journal, the crew's product
        runners; milliseconds once compiled), and the returned function compiles the call itself
        for exactly the argument types `token_program` will pass. That compile is the long part
        of a first start (26 s on the AVX2-only EPYC for the default model) and touches no state
        of this runtime, so a caller can run it without the engine's lock while a prompt is
        evaluated. None when there is no such call."""
        if self._crew is None:  # the crew `begin_pass` would start (not started here)
            self._crew = Crew(self.pool, self.n_workers)
        ready = self._token_parts(kv, self._steps_key("program", steps, output),
                                  lambda: self._token_layers(steps, kv, output, prologue))
        if ready is None:
            return None
        fn, (pro_at, layers_at, *_lists), journal, out_job, _h = ready
        crew = self._crew
        args = (crew.ctl, crew.n_workers, 0, 0, pro_at, layers_at, SKIP_SLID_VALUES, journal.ids,
                journal.written, out_job, np.empty(0, dtype=np.float32))
        sig = tuple(numba.typeof(a) for a in args)
        return lambda: fn.compile(sig)

    def _token_done(self, ok: bool, journal: TokenJournal) -> None:
        """After a token's compiled call: raise if a worker failed; count the journal when due."""
        if not ok:
            self._crew.stop()
            raise CrewError("a worker failed during a token's layers")
        if journal.keys and journal.due and self.routing is not None:
            self.routing.read_journals()

    def _steps_key(self, kind: str, steps: Sequence[tuple], output: str | None) -> tuple:
        """(kind, the steps' layers, output), made once per steps object (the memo holds it, so its
        id is not reused)."""
        memo = self._step_keys.get((kind, id(steps), output))
        if memo is None or memo[0] is not steps:
            memo = self._step_keys[(kind, id(steps), output)] = (steps, (kind, tuple(s[1] for s in steps), output))
        return memo[1]

    def _token_parts(self, kv: KVCache, key: tuple, build: Callable[[], tuple | None]) -> tuple | None:
        """The parts of a token's compiled call kept per cache under `key`, made by `build` (again
        when the crew changed); None when there is no such call."""
        per_kv = self._tparts.get(kv)
        if per_kv is None:
            per_kv = self._tparts[kv] = {}
        cached = per_kv.get(key)
        if cached is None or cached.lead is not self._crew.lead:
            cached = per_kv[key] = _Cached(self._crew.lead, build())
        return cached.ready

    def _token_layers(self, steps: Sequence[tuple], kv: KVCache, output: str | None,
                      prologue: tuple | None = None) -> tuple | None:
        """`token_layers`' compiled call, its typed list of the layers' fixed arguments, the routing
        journal, the output product's job (its row count 0: none) and the last layer's output;
        None when there is no such call. With `prologue` (see `token_program`) the call starts from
        the token id, and its arguments are (the prologue's typed list, the layers')."""
        fns, layers, keys = set(), [], []
        k = 0
        last = first = _NO_JOB
        for attention, il, ffn_norm, ffn, next_norm, eps, post_attn, post_ffn, rope_i in steps:
            a = self._attention_parts(attention, kv, il)
            f = self._ffn_parts(ffn) if a is not None else None
            if f is None:
                return None
            link(last, a.first)   # the token's jobs in the order it posts them
            if first is _NO_JOB:
                first = a.first
            link(a.last, f.first)
            last = f.last
            fns.add((a.fn, f.fn))
            ids = _NO_IDS
            if f.routing:  # routed experts: the journal's row for this layer
                ids, names = f.routing
                keys.append((names[-2], names))
                k = ids.shape[0]
            layers.append((a.head, a.mid, int(attention.window), float(attention.scale), a.tail, a.o, ffn_norm,
                           f.head, f.o, next_norm, float(eps), np.empty_like(f.o), ids, post_attn, post_ffn,
                           int(rope_i), a.first, f.first))
        if len(fns) != 1:
            return None
        try:
            typed = typed_layers(tuple(layers))
        except numba.core.errors.TypingError:  # the layers' arguments differ in type
            return None
        (attn, ffn), = fns
        run_out = None
        out_job = (_NO_TASKS, _NO_CHUNKS, 0, 0)
        if output is not None:
            g = self._group((output,))
            run_out = self._token_runner(g) if len(g.rows) == 1 else None
            if run_out is not None:
                out_job = (g.job.tasks, g.job.chunks, g.job.n_owned, g.rows[0])
                link(last, out_job)
                link(out_job, first)   # and the next token's first job (while the Python between runs)
        jkey = (tuple(keys), k)
        journal = self._journals.get(jkey)
        if journal is None:  # one per set of layers, kept for the runtime's life
            journal = self._journals[jkey] = TokenJournal(keys, k)
            if self._routing is not None and keys:
                self._routing.attach(journal)
        if prologue is not None:
            name, scale, norm, eps, rope = prologue
            embed = kernels.dequantizer(self.weights[name].ggml_type)
            emb = self.layout.full_array(name)
            if run_out is None or embed is None or emb is None:
                return None
            pro = typed_layers(((emb, float(scale), self.f32(norm), float(eps), *rope),))
            fn = token_runner(attn, ffn, numba.typeof(typed), run_out, embed, numba.typeof(pro))
            # the lists ride along: their addresses are valid while they live
            return fn, (list_address(pro), list_address(typed), pro, typed), journal, out_job, None
        fn = token_runner(attn, ffn, numba.typeof(typed), run_out)
        return fn, (list_address(typed), typed), journal, out_job, layers[-1][11]

    def _expert_products(self, names: tuple[str, ...], x: np.ndarray, groups: list, m_out: int
                         ) -> list[np.ndarray]:
        """outs[j][out_rows] = x[in_rows] times sub-matrix e of names[j]^T, per (e, in_rows, out_rows)
        of `groups`: x is prepared once per vec_dot type (ggml quantizes src1 once), each product
        row is a matvec (one vec_dot per row and token, mul_mat_id's order)."""
        ws = [self.weights[nm] for nm in names]
        ne0 = ws[0].ne0
        if x.shape[1] != ne0:
            raise ValueError(f"input width {x.shape[1]} != row length {ne0}")
        keys = [kernels.prepare_key(w.ggml_type) for w in ws]
        prep = list(dict.fromkeys(keys))
        prep_types = [next(w.ggml_type for w, kk in zip(ws, keys) if kk == key) for key in prep]
        pidx = [prep.index(kk) for kk in keys]
        per = [w.rows // self.n_sub(nm) for w, nm in zip(ws, names)]
        outs = [np.empty((m_out, r), dtype=np.float32) for r in per]
        x = np.ascontiguousarray(x, dtype=np.float32)
        xps = [kernels.prepare(t, x) for t in prep_types]
        if self._crewing:  # one token's pass: the crew's workers wait in compiled code
            self._expert_crew(names, ws, pidx, per, xps, groups, outs)
            return outs
        loops = [_expert_loop(w.ggml_type) for w in ws]
        groups = [(e, np.ascontiguousarray(ins, dtype=np.int64), np.ascontiguousarray(outr, dtype=np.int64))
                  for e, ins, outr in groups]

        def work(wk: int) -> None:
            for e, ins, outr in groups:
                for j, nm in enumerate(names):
                    arr, first, lo, hi = self._expert_plan(nm, e)[wk]
                    if hi > lo:
                        loops[j](arr, xps[pidx[j]], ins, outs[j], outr, first, lo - first, hi - first, EXPERT_ROWS,
                                 per[j])
        self.each_worker(work)
        return outs

    def _expert_table(self, names: tuple[str, ...], ws: list, pidx: list[int], per: list[int]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Crew task and chunk rows of every sub-matrix of `names` (each worker its own row range
        of its own copy; task j of a sub-matrix writes output j with prepared input pidx[j]),
        stacked [n_sub, tasks, fields] / [n_sub, chunks, fields] so one token's job is a few array
        operations whatever k; and each task's output row width. Built once per layout."""
        key = names
        table = self._eblocks.get(key)
        if table is None:
            tasks_all, chunks_all = [], []
            for e in range(self.n_sub(names[0])):
                tasks, owned = [], []
                for j, nm in enumerate(names):
                    for wk, (arr, first, lo, hi) in enumerate(self._expert_plan(nm, e)):
                        if hi > lo:
                            # in pieces, in order: the owner streams them one after another, a
                            # worker of its node that is done first takes the last ones (STEALABLE)
                            step = STEAL_ROWS if self.n_workers > 1 else hi - lo
                            owned += [(len(tasks), a - first, min(a + step, hi) - first, wk)
                                      for a in range(lo, hi, step)]
                            tasks.append((ws[j].ggml_type, np.ascontiguousarray(arr), pidx[j], j, first))
                job = Job(tasks, owned, [])
                tasks_all.append(job.tasks)
                chunks_all.append(job.chunks)
            # experts split over different workers may have different task counts: pad with tasks
            # no chunk runs and with empty chunks owned by nobody
            n_t = max(len(t) for t in tasks_all)
            n_c = max(len(c) for c in chunks_all)
            t3 = np.zeros((len(tasks_all), n_t, TASK_FIELDS), dtype=np.int64)
            c3 = np.zeros((len(chunks_all), n_c, chunks_all[0].shape[1]), dtype=np.int64)
            c3[:, :, C_OWNER] = -1
            c3[:, :, C_SPAN] = 1
            for e, (t, c) in enumerate(zip(tasks_all, chunks_all)):
                t3[e, :len(t)] = t
                c3[e, :len(c)] = c
            width = np.array(per, dtype=np.int64)[t3[:, :, T_OUT]]
            table = self._eblocks[key] = (t3, c3, width)
        return table

    def _token_table(self, names: tuple[str, ...], ws: list, pidx: list[int], per: list[int]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`_expert_table` as one token's `expert_token.compose` reads it: when the sub-matrices'
        task and chunk rows differ only in the weight address (each worker the same rows of every
        expert), compact -- one sub-matrix's rows and every sub-matrix's addresses [n_sub, tasks]
        -- else the full tables and no addresses (a placement that gives experts to nodes)."""
        key = ("token",) + tuple(names)
        table = self._eblocks.get(key)
        if table is None:
            t3, c3, width = self._expert_table(names, ws, pidx, per)
            rest = np.delete(t3, T_W, axis=2)
            if (rest == rest[:1]).all() and (c3 == c3[:1]).all() and (width == width[:1]).all():
                table = (np.ascontiguousarray(t3[:1]), np.ascontiguousarray(c3[:1]), np.ascontiguousarray(width[:1]),
                         np.ascontiguousarray(t3[:, :, T_W]))
            else:
                table = (t3, c3, width, np.zeros((0, t3.shape[1]), dtype=np.int64))
            self._eblocks[key] = table
        return table

    def _expert_crew(self, names, ws, pidx, per, xps, groups, outs) -> None:
        """A few input rows with the crew: one job holding every routed expert's products (each
        task reads its own row of the prepared 2-D inputs and writes its own output row)."""
        tasks3, chunks3, width = self._expert_table(tuple(names), ws, pidx, per)
        es, ri, ro = [], [], []
        for e, ins, outr in groups:
            es += [e] * len(ins)
            ri += list(ins)
            ro += list(outr)
        es_a = np.array(es, dtype=np.int64)
        m, n_t = len(es), tasks3.shape[1]
        tasks = tasks3[es_a].reshape(m * n_t, -1)
        tasks[:, T_OUTOFF] += (np.array(ro, dtype=np.int64)[:, None] * width[es_a]).reshape(-1)
        tasks[:, T_XROW] = np.repeat(np.array(ri, dtype=np.int64), n_t)
        chunks = chunks3[es_a]
        chunks[:, :, C_TASK] += (np.arange(m, dtype=np.int64) * n_t)[:, None]
        table = Table(tasks, chunks.reshape(-1, chunks.shape[2]))
        table.n_owned |= STEALABLE
        self._crew.run(table, xps[0], xps[-1], [o.reshape(-1) for o in outs])

    def sub_products(self, name: str, x: np.ndarray) -> np.ndarray:
        """x [m, n, ne0] -> [m, n, rows] with sub-matrix i of 3-D tensor `name` applied to x[i]
        (ggml_mul_mat of a 3-D weight: MLA's per-head attn_k_b / attn_v_b); one token is a
        matvec per row (vec_dot), more are a matmat (ggml's mul_mat for >= 2 columns)."""
        w = self.weights[name]
        m, n, k = x.shape
        if m != self.n_sub(name) or k != w.ne0:
            raise ValueError(f"{name}: input {list(x.shape)} does not fit shape {list(w.info.shape)}")
        rows = w.rows // m
        if n == 1:  # one token: a matvec per head, through the expert machinery (crew jobs in decode)
            heads = np.arange(m, dtype=np.int64)
            (out1,) = self._expert_products((name,), x[:, 0, :], [(i, heads[i:i + 1], heads[i:i + 1]) for i in range(m)], m)
            return out1.reshape(m, 1, rows)
        out = np.empty((m, n, rows), dtype=np.float32)
        xps = [kernels.prepare(w.ggml_type, np.ascontiguousarray(x[i] if n > 1 else x[i, 0])) for i in range(m)]

        def work(wk: int) -> None:
            for i in range(m):
                arr, first, lo, hi = self._expert_plan(name, i)[wk]
                if hi <= lo:
                    continue
                if n == 1:
                    kernels.matvec(w.ggml_type, arr, xps[i], out[i, 0, first:first + arr.shape[0]],
                                   lo - first, hi - first)
                else:
                    kernels.matmat(w.ggml_type, arr, xps[i], out[i, :, first:first + arr.shape[0]],
                                   lo - first, hi - first)
        self.each_worker(work)
        return out

    def each_worker(self, fn: Callable[[int], None]) -> None:
        """fn(w) on every worker; a single worker runs inline (no hand-off cost)."""
        if self.n_workers == 1:
            fn(0)
        elif self._crewing:  # Python work: the crew leaves its loop for it
            solo = self._crew.solo
            self._crew.stop()
            try:
                self.pool.run(fn, lead=True)
            finally:
                self._crew.start(solo=solo)
        else:
            self.pool.run(fn, lead=self._leading)

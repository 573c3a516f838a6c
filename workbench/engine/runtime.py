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
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from . import kernels
from . import ops
from .attention import AttentionPaths
from .crew import (STEALABLE, T_NCOL, T_OUT, T_TYPE, Crew, CrewError, Job, Table, product_runner, product_runner_mixed,
                   rows_job)
from .experts import ExpertPaths
from .gguf_file import GGUFFile, ModelLoadError, TensorInfo
from . import handoff, prompt_jobs
from .kv_cache import KVCache
from .routing import TokenJournal
from .specs import AttentionSpec, DenseSpec, MLASpec, RoutedSpec, SharedSpec
from .token_calls import CachedCall, TokenCalls

# weight bytes of a one-token product below which the calling thread computes it alone (when it
# stands in for worker 0): a hand-off to the other workers costs more than it saves
SPLIT_BYTES = 8 << 20
CHUNK_BYTES = 1 << 20  # smallest chunk of rows dealt to the workers, in weight bytes
CHUNK_ALIGN = 64  # rows
# one-token products go through the crew (workers waiting in compiled code) in chunks of at
# least this many weight bytes; NUMAWB_CREW=0 turns the crew off (Python hand-offs, as before)
CREW_CHUNK_BYTES = 96 << 10
# a one-token product's pinned share is cut in pieces of half what is left (the first: FIRST_PIECE),
# down to this many bytes
PIECE_BYTES = 24 << 10
# A worker's first piece of its share: a kernel call reads its range as two streams when each half
# is at least TWO_STREAMS_MIN bytes (kernels.intrinsics.streams.stream_halves), so a bigger first piece
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
USE_CREW = os.environ.get("NUMAWB_CREW", "1") != "0"
# a prompt of 2 .. TOKEN_SPLIT_MIN x workers - 1 tokens runs its products as crew jobs (`prompt_jobs`)
PROMPT_CREW = os.environ.get("NUMAWB_PROMPT_CREW", "1") != "0"
PROMPT_ROWS = 64  # a prompt job's rows per chunk (a worker's share in pieces a worker of its node may take)
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
    prompt_job: Job | None = None  # a short prompt's crew job (`prompt_jobs`, built on first use)
    nbytes: int = 0  # the group's weight bytes


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


class Runtime(AttentionPaths, ExpertPaths, TokenCalls):
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
        self.rows_passes = 0   # decode batches' passes that ran every layer in one call (`engine.batch`)
        self._etoken: dict[tuple, tuple] = {}  # (gate, up, down) -> compiled one-token expert FFN
        # a decoded token's compiled sub-layers with their fixed arguments: per KV cache (attention)
        # and per tensors (routed FFN), remade when the layout or the crew changes
        self._tparts: "weakref.WeakKeyDictionary[KVCache, dict]" = weakref.WeakKeyDictionary()
        self._rparts: dict[tuple, CachedCall] = {}
        self._journals: dict[tuple, TokenJournal] = {}  # routed experts of token_layers' calls
        self._step_keys: dict[tuple, tuple] = {}
        self._leading = False
        self._prompt_pass = False  # this pass is a short prompt whose products are crew jobs
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
        self.solo_passes = 0   # passes run so, counted for /metrics (numawb_crew_solo_passes)
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
        self._mixed_q8 = None

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

        For one token, a decode batch (`rows`: n_tokens sequences, one token each) or a prompt
        shorter than TOKEN_SPLIT_MIN tokens a worker (its products as crew jobs, `prompt_jobs`),
        the other workers wait in the crew's compiled loop for the whole pass, and after it until
        the next one (see LINGER). `begin_pass`/`end_pass` are the same without a generator (a decoded
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
            prompt = (not rows and PROMPT_CREW and USE_CREW and 2 <= n_tokens < TOKEN_SPLIT_MIN * self.n_workers)
            want = ((n_tokens == 1 or rows) and USE_CREW) or prompt
            solo = want and self.crew_backoff > 0
            self._prompt_pass = prompt
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
                self.solo_passes += 1
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
        self._prompt_pass = False
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
    def crew(self) -> Crew | None:
        """The pinned workers' crew (None before the first pass that starts it)."""
        return self._crew

    @property
    def crewing(self) -> bool:
        """Whether the crew runs this pass's products (a pass started it and it is active)."""
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
                           everyone, nbytes=nbytes)
            self._groups[names] = group
        return group

    def linear(self, x: np.ndarray, names: tuple[str, ...], after: After | None = None) -> list[np.ndarray]:
        """x [n, k] times each named weight; all products run in one dispatch over the workers.
        after(t0, t1, outs): token-wise work on the outputs' rows [t0, t1), run by the worker that
        computed them when the tokens are shared out (`_token_split`), else once over all rows."""
        group = self._group(names)
        if x.shape[0] == 1 and self.crewing:
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
        if n == 1 and self.crewing:
            if before is not None:
                before(0, 1)
            outs = self._one_token(group, x)
            if outs is not None:
                g, u = outs
                a = np.empty_like(g)
                ops.apply_activation(activation, g, u, a)
                return g, u, a
            before = None   # done
        g, u = np.empty((n, rows), dtype=np.float32), np.empty((n, rows), dtype=np.float32)
        a = np.empty_like(g)

        def finish(t0: int, t1: int, lo: int, hi: int) -> None:
            ops.apply_activation(activation, g[t0:t1, lo:hi], u[t0:t1, lo:hi], a[t0:t1, lo:hi])
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
        if self._mixed_q8 is None:   # (once per packing, `_set_packed`: R1's 1,100 tensors took 2 ms a call)
            self._mixed_q8 = {0, 1} <= {kernels.q8_family(w.ggml_type) for w in self.weights.values()}
        return self._mixed_q8

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

    #: whether this runtime runs a decode batch's pass (`engine.batch`), whose layers may go in one call
    batch_rows = False

    def rows_layers(self, x: np.ndarray, h: np.ndarray, steps: Sequence[tuple], ropes: np.ndarray) -> np.ndarray | None:
        """A decode batch's every layer in one call: only a decode batch's pass has one
        (`engine.batch`); here None, the caller's steps."""
        return None

    def rows_products(self, group: _Group, x: np.ndarray) -> list[np.ndarray] | None:
        """A group's products over the n rows of a decode batch (n sequences, one token each) as
        one crew job (`crew.rows_job`: each weight piece read once for all rows, every output the
        one-token kernel's dot); None when the crew is not running or the group's inputs take more
        than two formats."""
        if not self.crewing or len(group.prep_types) > 2:
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
        if single and self.crewing:
            if group.job is None:
                group.job = self._crew_job(group)
            self._crew.run(group.job, xps[0], xps[-1], [o[0] for o in outs])
            if finish is not None:
                finish(0, group.rows[0])
            return
        if not single and self._prompt_pass and self.crewing and len(group.prep_types) <= 2:
            self._prompt_products(group, xps, outs)
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

        def at_once() -> None:   # worker 0's arrays hold every row: one call a product
            for (qtype, arr, p, rows), out in zip(whole, outs):
                if single:
                    kernels.matvec(qtype, arr, xps[p], out[0], 0, rows)
                else:
                    kernels.matmat(qtype, arr, xps[p], out, 0, rows)
            if finish is not None:
                finish(0, group.rows[0])
        self.each_worker(work, handoff.product_seconds(group.nbytes, outs[0].shape[0]),
                         at_once if whole is not None else None)

    def _prompt_products(self, group: _Group, xps: list[tuple], outs: list[np.ndarray]) -> None:
        """A short prompt's group of products as one crew job (`prompt_jobs`): each worker its
        `row_split` range of its own arrays in PROMPT_ROWS pieces (a worker of the same node done
        first takes the last ones), each piece over all the tokens by the type's matmat."""
        job = group.prompt_job
        if job is None:
            tasks, owned = [], []
            for j, (qtype, plan, p) in enumerate(group.jobs):
                for wk, (arr, first, lo, hi) in enumerate(plan):
                    if hi > lo:
                        owned += [(len(tasks), a - first, min(a + PROMPT_ROWS, hi) - first, wk)
                                  for a in range(lo, hi, PROMPT_ROWS)]
                        tasks.append((qtype, arr, p, j, first))
            job = Job(tasks, owned, [])
            job.n_owned |= STEALABLE
            t = job.tasks
            prompt_jobs.set_products(t, t[:, T_TYPE], prompt_jobs.MATMAT, 0,
                                     np.array(group.rows, dtype=np.int64)[t[:, T_OUT]] * 4, 0)
            group.prompt_job = job
        job.tasks[:, T_NCOL] = outs[0].shape[0]
        self._crew.run_with(prompt_jobs.chunk_address(), job, xps[0], xps[-1], outs)

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

    def each_worker(self, fn: Callable[[int], None], work: float | None = None,
                    whole: Callable[[], None] | None = None) -> None:
        """fn(w) on every worker; a single worker runs inline (no hand-off cost), and so does
        every worker's share when `work` (its estimated one-thread seconds) is below
        `handoff.HANDOFF_SECONDS` and no crew waits (a short prompt's products): `whole()` if
        given (the same work in one piece, as one worker computes it: half the kernel calls at
        two workers, and read from the calling thread's own copy), else each share in turn."""
        if self.n_workers == 1:
            fn(0)
        elif work is not None and work < handoff.HANDOFF_SECONDS and (not self.crewing or self._prompt_pass):
            if whole is not None:
                whole()
                return
            for w in range(self.n_workers):
                fn(w)
        elif self.crewing:  # Python work: the crew leaves its loop for it
            solo = self._crew.solo
            self._crew.stop()
            try:
                self.pool.run(fn, lead=True)
            finally:
                self._crew.start(solo=solo)
        else:
            self.pool.run(fn, lead=self._leading)

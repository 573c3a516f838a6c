"""Continuous batching of requests over a model's passes (`numawb serve`'s engine side).

`Scheduler` runs up to `n_parallel` slots (one sequence each), a bounded queue, requests that
join and leave between passes, prompts processed in the same 512-token pieces as
`Session.prefill` (the waiting prompts' next pieces, up to 512 tokens in all, between passes),
and cancellation at the next pass; each request's token loop (sampling, stop ids and strings,
budget, context) is a `engine.generation.Generation`, as in `Session.generate`.
The passes themselves are a model's: `LocalModel` over an `Engine` here (its decode passes are
`engine.batch.decode_batch`: every row the numbers of its sequence alone), or anything with its
methods (a pipeline over Ray hosts, workbench.cluster, whose hosts run `stage_batch`). It knows
nothing about HTTP (the server builds on it).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .batch import decode_batch
from .engine import Engine, Session
from .events import ContextFullError, DoneEvent, Stats
from .generation import Generation, Picker, reusable_prefix
from .sampling import SamplingParams
from ..errors import UserError
from ..numa.proof import prove

PREFILL_BATCH = 512  # prompt tokens per forward pass (Session.prefill's batch, so the same numbers)


@dataclass
class ErrorEvent:
    message: str


class QueueFullError(RuntimeError):
    """Every slot is busy and the queue is full: try again later."""


class ShuttingDownError(RuntimeError):
    """The scheduler no longer accepts requests."""


@dataclass
class Request:
    """One generation: prompt ids, sampling, limits; events go to `on_event` (from the
    scheduler's thread: TokenEvent with new text, then exactly one DoneEvent or ErrorEvent)."""

    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1                  # -1: until the context is full
    stop: list[str] = field(default_factory=list)
    stop_ids: set[int] | None = None     # default: the model's end-of-generation ids
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    on_event: Callable[[object], None] = lambda ev: None
    id: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    # -- state (scheduler thread)
    slot: int = -1
    state: str = "queued"                # queued | prompt | decode | done
    stats: Stats = field(default_factory=Stats)
    t_submit: float = 0.0
    reused: int = 0                      # prompt tokens found in the slot's cache
    kv_nodes: tuple[int, ...] = ()
    _fed: int = 0                        # prompt tokens in the cache so far
    _next: int = -1                      # picked token to feed at the next pass
    _gen: Generation | None = None       # the token loop's bookkeeping (engine/generation.py)

    @property
    def out(self) -> list[int]:
        """Tokens generated so far."""
        return self._gen.out if self._gen is not None else []

    @property
    def t_first(self) -> float:
        return self._gen.t_first if self._gen is not None else 0.0


@dataclass(frozen=True)
class ActiveRequest:
    """What a dashboard shows about one request (see `Scheduler.active`)."""

    id: str
    state: str
    slot: int
    prompt_tokens: int
    reused_tokens: int
    tokens: int
    tps: float
    kv_nodes: tuple[int, ...]
    age: float
    kv_bytes: tuple[tuple[int, int], ...] = ()  # (node, bytes) of its slot's KV cache, measured


class LocalModel:
    """The passes a `Scheduler` runs, over an `Engine` in this process: the logits stay here and
    each request's `Picker` samples them. A model pipelined over hosts (workbench.cluster) offers
    the same methods and samples on its last host; the scheduler cannot tell them apart."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.n_ctx_train = engine.cfg.n_ctx_train

    def open(self, n_ctx: int) -> Session:
        """A sequence slot: a KV cache of n_ctx positions (`.tokens` lists what it holds)."""
        return self.engine.new_session(n_ctx)

    def truncate(self, seq: Session, n: int) -> None:
        """Keep the first n cached positions."""
        seq.kv.truncate(n)
        del seq.tokens[n:]

    def prefill(self, seq: Session, piece: list[int], picker: Picker, first: bool, last: bool) -> int | None:
        """Append a piece of a prompt to the cache; on its last piece, the first token picked."""
        with self.engine.lock:
            logits = seq.eval(piece, batch=PREFILL_BATCH)
        return picker.pick(logits) if last else None

    def decode(self, seqs: list[Session], tokens: list[int], pickers: list[Picker]) -> list[int]:
        """Feed one token to each sequence in one pass; the next token picked for each."""
        with self.engine.lock:
            logits = decode_batch(self.engine, seqs, tokens)
        return [p.pick(lg) for p, lg in zip(pickers, logits)]

    def kv_nodes(self, seq: Session) -> tuple[int, ...]:
        return tuple(sorted({n for b in seq.kv_layout.buffers() for n in b.intended}))

    def kv_bytes(self, seq: Session, max_pages: int = 64) -> dict[int, int]:
        """Bytes of a sequence's KV cache on each node, from where its pages are (move_pages on up
        to `max_pages` pages a buffer; pages not yet touched count nowhere)."""
        out: dict[int, int] = {}
        for p in prove(seq.kv_layout.buffers(), max_pages):
            if p.sampled:
                per = p.nbytes / p.sampled
                for node, n in p.pages_by_node.items():
                    out[node] = out.get(node, 0) + int(n * per)
        return out

    def close(self, seqs: list[Session]) -> None:
        with self.engine.lock:  # the slots' KV caches go back now, not at garbage collection
            for s in seqs:
                s.close()


@dataclass
class _Slot:
    index: int
    session: Any                          # the model's sequence handle (a Session for LocalModel)
    request: Request | None = None
    prompt: list[int] = field(default_factory=list)  # the last request's prompt (for reuse)
    used: float = 0.0


class Scheduler:
    """Continuous batching over `n_parallel` slots; `submit` from any thread.

    One thread runs the loop: take queued requests into free slots, process the next piece of
    each waiting prompt (up to `PREFILL_BATCH` tokens in all), then one batched pass for every
    slot that is decoding; requests leave between passes.
    A request that continues a slot's previous request (its prompt starts with that whole
    prompt and goes on, as the next turn of a chat does) reuses the slot's cache, as `Chat`
    does; any other prompt is processed in full, so its numbers are those of
    `Session.generate` on a fresh session.
    """

    def __init__(self, engine: Any, n_parallel: int = 4, n_ctx: int = 4096, max_queue: int = 64):
        """`n_parallel` slots of `n_ctx` tokens each (KV caches placed as the engine's sessions);
        up to `max_queue` requests may wait for a slot. `engine` is an Engine, or any model
        with `LocalModel`'s methods (a pipeline over Ray hosts)."""
        if n_parallel < 1:
            raise ValueError(f"n_parallel must be >= 1 (got {n_parallel})")
        self.engine = engine
        self.model = LocalModel(engine) if isinstance(engine, Engine) else engine
        self.n_ctx = min(n_ctx, self.model.n_ctx_train)
        self.max_queue = max_queue
        self.slots = [_Slot(i, self.model.open(self.n_ctx)) for i in range(n_parallel)]
        self._queue: deque[Request] = deque()
        self._cv = threading.Condition()
        self._accepting = True
        self._stop = False
        self._ids = itertools.count(1)
        self._rr = 0
        # counters (read by metrics; ints and floats written by the loop thread only)
        self.requests_done = 0
        self.requests_failed = 0
        self.requests_cancelled = 0
        self.prompt_tokens_total = 0
        self.decode_tokens_total = 0
        self.passes = 0
        self.pass_rows = 0
        self.busy_seconds = 0.0
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent passes
        self._thread = threading.Thread(target=self._run, name="numawb-scheduler", daemon=True)
        self._thread.start()

    # -- public, any thread ------------------------------------------------------
    @property
    def n_parallel(self) -> int:
        return len(self.slots)

    def submit(self, req: Request) -> Request:
        """Queue a request; raises QueueFullError, ShuttingDownError or ContextFullError."""
        if not req.prompt:
            raise ValueError("empty prompt: nothing to continue from")
        if len(req.prompt) >= self.n_ctx:
            raise ContextFullError(f"the prompt ({len(req.prompt)} tokens) does not fit the context "
                                   f"of {self.n_ctx} tokens per slot")
        req.params.validate()
        with self._cv:
            if not self._accepting:
                raise ShuttingDownError("the server is shutting down")
            if self.running + len(self._queue) >= self.n_parallel + self.max_queue:
                raise QueueFullError(f"all {self.n_parallel} slots are busy and {len(self._queue)} "
                                     "requests are waiting")
            if not req.id:
                req.id = f"req-{next(self._ids)}"
            req.t_submit = time.perf_counter()
            self._queue.append(req)
            self._cv.notify()
        return req

    def cancel(self, req: Request) -> None:
        """Stop a request at the next pass (its slot is freed then)."""
        req.cancel.set()
        with self._cv:
            self._cv.notify()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return sum(1 for s in self.slots if s.request is not None)

    def decode_rate(self, window: float = 5.0) -> float:
        """Tokens per second generated over the last `window` seconds (all requests)."""
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= window]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1e-3)
        return sum(n for _, n in recent) / span

    def active(self) -> list[ActiveRequest]:
        """A thread-safe snapshot of the requests in slots and in the queue, for dashboards."""
        now = time.perf_counter()
        out = []
        with self._cv:
            busy = [(s.request, s.session) for s in self.slots if s.request is not None]
            reqs = busy + [(r, None) for r in self._queue]
        measure = getattr(self.model, "kv_bytes", None)
        for r, seq in reqs:
            dt = now - r.t_first if r.t_first else 0.0
            tps = (len(r.out) - 1) / dt if dt > 0 and len(r.out) > 1 else 0.0
            kv = tuple(sorted(measure(seq).items())) if measure is not None and seq is not None else ()
            out.append(ActiveRequest(r.id, r.state, r.slot, len(r.prompt), r.reused, len(r.out), tps,
                                     r.kv_nodes, now - r.t_submit, kv))
        return out

    def slot_kv(self) -> list[tuple[int, dict[int, int]]]:
        """Each busy slot's KV cache bytes per node, measured (`LocalModel.kv_bytes`), for
        /metrics and dashboards; [] for a model that cannot say (a pipeline over hosts)."""
        measure = getattr(self.model, "kv_bytes", None)
        if measure is None:
            return []
        with self._cv:
            busy = [(s.index, s.session) for s in self.slots if s.request is not None and s.session is not None]
        return [(i, measure(seq)) for i, seq in busy]

    def stop_accepting(self) -> None:
        with self._cv:
            self._accepting = False

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting; let requests finish for up to `timeout` seconds, cancel the rest, and
        release the slots' KV caches."""
        self.stop_accepting()
        deadline = time.perf_counter() + timeout
        while (self.running or self.queued) and time.perf_counter() < deadline and self._thread.is_alive():
            time.sleep(0.02)
        with self._cv:
            for r in list(self._queue) + [s.request for s in self.slots if s.request is not None]:
                r.cancel.set()
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.model.close([s.session for s in self.slots])

    # -- the loop ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._queue and all(s.request is None for s in self.slots):
                    self._cv.wait()
                if self._stop and not self._queue and all(s.request is None for s in self.slots):
                    return
                self._admit()
            try:
                self._iteration()
            except Exception as e:  # noqa: BLE001 - a failed pass fails its requests, not the server
                # a user-facing error (a pipeline host that stopped) is its one line as it is
                msg = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
                for s in self.slots:
                    if s.request is not None:
                        self._finish(s, error=msg)

    def _admit(self) -> None:
        """Queued requests into free slots (under the lock); cancelled queued ones leave."""
        for r in [r for r in self._queue if r.cancel.is_set()]:
            self._queue.remove(r)
            r.state = "done"
            r.stats.stop_reason = "cancelled"
            self.requests_cancelled += 1
            r.on_event(DoneEvent(r.stats, [], ""))
        while self._queue:
            free = [s for s in self.slots if s.request is None]
            if not free:
                break
            req = self._queue.popleft()
            slot = max(free, key=lambda s: (self._reusable(s, req.prompt), -s.used))
            self._start(slot, req)

    def _reusable(self, slot: _Slot, prompt: list[int]) -> int:
        """Cached tokens a prompt may reuse: only when it continues the slot's last request (starts
        with its whole prompt and goes on). Any other prompt, the same one again included, is
        processed in full, so that its numbers are those of a fresh `Session.generate`."""
        if not slot.prompt or len(prompt) <= len(slot.prompt) or prompt[:len(slot.prompt)] != slot.prompt:
            return 0
        return reusable_prefix(slot.session.tokens, prompt)

    def _start(self, slot: _Slot, req: Request) -> None:
        s = slot.session
        keep = self._reusable(slot, req.prompt)
        self.model.truncate(s, keep)
        req.slot, req.state, req.reused, req._fed = slot.index, "prompt", keep, keep
        budget = self.n_ctx - len(req.prompt)
        req.n_predict = budget if req.n_predict < 0 else min(req.n_predict, budget)
        req._gen = Generation(self.model.tokenizer, req.prompt, req.params, req.n_predict, self.n_ctx, req.stop,
                              req.stop_ids, req.frequency_penalty, req.presence_penalty, t0=req.t_submit,
                              stats=req.stats)
        req.stop_ids = req._gen.stop_ids
        req.stats.prompt_tokens = len(req.prompt) - keep
        req.kv_nodes = self.model.kv_nodes(s)
        slot.request, slot.prompt, slot.used = req, list(req.prompt), time.perf_counter()

    def _iteration(self) -> None:
        model = self.model
        # cancelled requests leave first
        for s in self.slots:
            if s.request is not None and s.request.cancel.is_set():
                self._finish(s, reason="cancelled")
        # the next piece of each waiting prompt (round robin) up to PREFILL_BATCH tokens in all, so
        # a decoding sequence waits about one piece at most; prompts that arrived together start
        # decoding in the same pass (their first tokens go out once all are in) instead of joining
        # the passes one at a time, each with a pass of the others in between
        prompts = [s for s in self.slots if s.request is not None and s.request.state == "prompt"]
        if prompts:
            k = self._rr % len(prompts)
            budget, firsts = PREFILL_BATCH, []
            for i, slot in enumerate(prompts[k:] + prompts[:k]):
                req = slot.request
                piece = req.prompt[req._fed:req._fed + PREFILL_BATCH]
                if i and len(piece) > budget:
                    break
                budget -= len(piece)
                self._rr += 1
                t0 = time.perf_counter()
                last = req._fed + len(piece) >= len(req.prompt)
                tok = model.prefill(slot.session, piece, req._gen.picker, req._fed == req.reused, last)
                req._fed += len(piece)
                dt = time.perf_counter() - t0
                req.stats.prompt_seconds += dt
                self.busy_seconds += dt
                if last:
                    firsts.append((slot, tok))
            for slot, tok in firsts:
                req = slot.request
                self.prompt_tokens_total += req.stats.prompt_tokens
                req.state = "decode"
                req._gen.begin_decode()
                if req._gen.done:  # the prompt only (as generate -n 0)
                    self._finish(slot)
                else:
                    self._take(slot, tok)
        # one pass for every sequence with a token to feed
        rows = [s for s in self.slots if s.request is not None and s.request.state == "decode"
                and s.request._next >= 0]
        if rows:
            t0 = time.perf_counter()
            picked = model.decode([s.session for s in rows], [s.request._next for s in rows],
                                  [s.request._gen.picker for s in rows])
            dt = time.perf_counter() - t0
            now = time.perf_counter()
            self.busy_seconds += dt
            self.passes += 1
            self.pass_rows += len(rows)
            self.decode_tokens_total += len(rows)
            self._recent.append((now, len(rows)))
            while self._recent and now - self._recent[0][0] > 30:
                self._recent.popleft()
            for s, tok in zip(rows, picked):
                s.request._next = -1
                self._take(s, tok)

    def _take(self, slot: _Slot, tok: int) -> None:
        """The token picked next for a slot's request: give out its text, or finish."""
        req = slot.request
        for ev in req._gen.accept(tok, len(slot.session.tokens)):
            req.on_event(ev)
        if req._gen.done:
            self._finish(slot)
        else:
            req._next = tok

    def _finish(self, slot: _Slot, reason: str = "", error: str = "") -> None:
        req = slot.request
        slot.request = None
        slot.used = time.perf_counter()
        if req._fed < len(req.prompt):  # an unfinished prompt: nothing in the cache to reuse
            slot.prompt = []
        req.state = "done"
        if error:
            self.requests_failed += 1
            req.on_event(ErrorEvent(error))
            return
        events = req._gen.finish(reason or None)
        if req._gen.reason == "cancelled":
            self.requests_cancelled += 1
        else:
            self.requests_done += 1
        for ev in events:
            req.on_event(ev)


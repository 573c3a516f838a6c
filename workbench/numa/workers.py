"""A pool of Python threads, each pinned to one CPU, that reports where it really runs.

Dispatch: every worker blocks on its own ``threading.Lock`` ("go"); ``run()``
releases all go-locks and then acquires each worker's "done" lock. Plain locks
are the cheapest wake-up CPython offers (no Condition/Event bookkeeping).
Measured round trip of ``run(lambda i: None)`` with 2 workers on the shared
2-core build box: 45-100 us depending on load (tests/test_numa_workers.py prints it).

By default the calling thread does NOT act as worker 0: it may be any thread
(UI, engine), and pinning it for good would change its affinity behind its back.
Inside ``with pool.lead():`` it stands in for worker 0 for a while instead:
kept on worker 0's node (its affinity restored on exit), it can run worker 0's
share itself (``run(fn, lead=True)``) or small work with no hand-off at all,
which saves a thread wake-up and a GIL hand-off per dispatch.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from . import syscalls as sc
from .topology import Topology, load_topology, parse_cpulist


@dataclass(frozen=True)
class WorkerInfo:
    index: int
    cpu: int | None           # CPU the worker is pinned to (None: unpinned)
    node: int                 # node it should run on
    actual_cpu: int | None    # what getcpu() said from inside the worker
    actual_node: int | None
    misplaced: bool


def _node_order(nodes: list[int]) -> list[int]:
    seen: dict[int, None] = {}
    for n in nodes:
        seen.setdefault(n, None)
    return list(seen)


def plan_cpus(topology: Topology, n_threads: int | None = None, policy: str = "distribute",
              cpus: list[int] | None = None, smt: bool = False) -> tuple[list[tuple[int, int]], list[str]]:
    """Decide (cpu, node) per worker; workers of one node are consecutive.

    Policies: ``distribute`` (all CPU nodes, or ``distribute:0,1``), ``isolate``
    (node of the calling CPU, or ``isolate:N``), ``cpus`` (explicit ``cpus`` list,
    regrouped by node keeping order). ``smt=False`` uses one CPU per core.
    Returns the plan and notes (oversubscription, unknown CPUs).
    """
    notes: list[str] = []
    allowed = [c for c in topology.allowed_cpus]
    name, _, arg = policy.partition(":")
    if cpus is not None or name == "cpus":
        chosen = list(cpus if cpus is not None else parse_cpulist(arg))
        if not chosen:
            raise ValueError("explicit CPU policy needs a non-empty CPU list")
        unknown = [c for c in chosen if c not in topology.cpu_node]
        if unknown:
            notes.append(f"CPUs {unknown} are not online here")
        order = _node_order([topology.node_of(c) for c in chosen])
        grouped = [c for nd in order for c in chosen if topology.node_of(c) == nd]
        if grouped != chosen:
            notes.append("explicit CPUs regrouped so that workers of one node are consecutive")
        per_node = {nd: [c for c in grouped if topology.node_of(c) == nd] for nd in order}
    else:
        if name == "distribute":
            nodes = parse_cpulist(arg) if arg else list(topology.cpu_node_ids)
        elif name == "isolate":
            if arg:
                nodes = [int(arg)]
            else:
                cur = sc.getcpu()
                nd = topology.node_of(cur.value[0]) if cur else topology.cpu_node_ids[0]
                nodes = [nd if nd in topology.cpu_node_ids else topology.cpu_node_ids[0]]
        else:
            raise ValueError(f"unknown worker policy {policy!r} (distribute, isolate[:N], cpus:LIST)")
        per_node = {}
        for nd in nodes:
            mine = [c for c in allowed if topology.node_of(c) == nd]
            mine = topology.smt_order(mine) if smt else topology.physical_cpus(mine)
            if mine:
                per_node[nd] = mine
            else:
                notes.append(f"node {nd} has no CPUs this process may use")
        if not per_node:
            raise ValueError(f"policy {policy!r}: no usable CPUs on nodes {nodes}")
    total = sum(len(v) for v in per_node.values())
    n = total if n_threads is None else int(n_threads)
    if n < 1:
        raise ValueError("n_threads must be >= 1")
    if n > total:
        notes.append(f"{n} threads on {total} CPUs: CPUs are shared (oversubscribed)")
    # Split n over nodes proportionally to their CPU counts (largest remainder).
    counts = {nd: n * len(v) // total for nd, v in per_node.items()}
    rema = sorted(per_node, key=lambda nd: -((n * len(per_node[nd])) % total))
    for nd in rema[: n - sum(counts.values())]:
        counts[nd] += 1
    plan = [(per_node[nd][k % len(per_node[nd])], nd) for nd in per_node for k in range(counts[nd])]
    return plan, notes


class _Worker:
    __slots__ = ("index", "cpu", "node", "go", "done", "thread", "busy", "info")

    def __init__(self, index: int, cpu: int | None, node: int):
        self.index, self.cpu, self.node = index, cpu, node
        self.go = threading.Lock()
        self.go.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        self.busy = 0.0
        self.info: WorkerInfo | None = None


class WorkerPool:
    """Threads pinned to CPUs; ``run(fn)`` calls ``fn(i)`` on every worker i in parallel."""

    def __init__(self, n_threads: int | None = None, policy: str = "distribute",
                 cpus: list[int] | None = None, smt: bool = False, topology: Topology | None = None):
        self.topology = topology or load_topology()
        plan, self.notes = plan_cpus(self.topology, n_threads, policy, cpus, smt)
        self.policy = policy if cpus is None else "cpus"
        self._fn: Callable[[int], None] | None = None
        self._error: BaseException | None = None
        self._err_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._holder: Callable[[], None] | None = None
        self._lead_cpus: set[int] | None = None
        #: (thread id, cpu) of the thread that last ran worker 0's share, seen at its pass's end
        #: (inside `lead`, while still pinned there); None before the first pass
        self.lead_seen: tuple[int, int] | None = None
        self._launched: list[_Worker] = []
        self._closed = False
        self._w = [_Worker(i, cpu, nd) for i, (cpu, nd) in enumerate(plan)]
        for w in self._w:
            w.thread = threading.Thread(target=self._loop, args=(w,), name=f"numa-worker-{w.index}",
                                        daemon=True)
            w.thread.start()
        for w in self._w:  # each worker releases 'done' once pinned and located
            w.done.acquire()
        self.workers: list[WorkerInfo] = [w.info for w in self._w]  # type: ignore[misc]
        self._last_wall = time.perf_counter()
        self._last_busy = [0.0] * len(self._w)
        bad = [w for w in self.workers if w.misplaced]
        if bad:
            self.notes.append("misplaced workers: " + ", ".join(
                f"#{w.index} wants cpu {w.cpu}/node {w.node}, runs on cpu {w.actual_cpu}/node {w.actual_node}"
                for w in bad))

    # ---- worker side ---------------------------------------------------
    def _locate(self, w: _Worker) -> WorkerInfo:
        r = sc.getcpu()
        acpu, anode = r.value if r else (None, None)
        misplaced = (w.cpu is not None and acpu is not None and acpu != w.cpu) or \
                    (anode is not None and anode != w.node)
        return WorkerInfo(w.index, w.cpu, w.node, acpu, anode, misplaced)

    def _loop(self, w: _Worker) -> None:
        if w.cpu is not None:
            r = sc.sched_setaffinity([w.cpu])
            if not r:
                with self._err_lock:
                    self.notes.append(f"worker {w.index}: pinning to cpu {w.cpu} failed: {r.reason}")
                w.cpu = None
        w.info = self._locate(w)
        w.done.release()
        go, done, idx = w.go, w.done, w.index
        perf = time.perf_counter
        while True:
            go.acquire()
            fn = self._fn
            if fn is None:
                done.release()
                return
            t0 = perf()
            try:
                fn(idx)
            except BaseException as e:  # noqa: BLE001 - re-raised in run()
                with self._err_lock:
                    if self._error is None:
                        self._error = e
            w.busy += perf() - t0
            done.release()

    # ---- caller side ---------------------------------------------------
    @property
    def n_threads(self) -> int:
        return len(self._w)

    @property
    def nodes(self) -> list[int]:
        """Nodes in use, in worker order."""
        return _node_order([w.node for w in self._w])

    def node_workers(self, node: int) -> list[int]:
        return [w.index for w in self._w if w.node == node]

    def run(self, fn: Callable[[int], None], lead: bool = False) -> None:
        """Run ``fn(i)`` on every worker; return when all are done; re-raise the first error.

        ``lead``: the calling thread runs ``fn(0)`` itself (meant for use inside ``lead()``).
        """
        self.launch(fn, lead)
        try:
            if lead:
                fn(0)
        finally:
            self.join()

    def launch(self, fn: Callable[[int], None], lead: bool = False) -> None:
        """Start ``fn(i)`` on every worker (on workers 1.. with ``lead``) and return at once.

        Every ``launch`` needs its ``join``; the pool runs one such call at a time.
        """
        if self._closed:
            raise RuntimeError("WorkerPool is closed")
        self._vacate()
        self._run_lock.acquire()
        self._fn = fn
        self._launched = self._w[1:] if lead else self._w
        for w in self._launched:
            w.go.release()

    def hold(self, release: Callable[[], None] | None) -> None:
        """The last ``launch``'s workers stay busy after its caller's pass (the engine's crew,
        spinning between decoded tokens); ``release`` ends that, and the next ``launch`` or
        ``close``, from any thread, calls it first. None: nothing is held."""
        self._holder = release

    def _vacate(self) -> None:
        release, self._holder = self._holder, None
        if release is not None:
            release()

    def join(self) -> None:
        """Wait for the workers of the last ``launch``; re-raise the first error one raised."""
        try:
            for w in self._launched:
                w.done.acquire()
            err, self._error = self._error, None
        finally:
            self._launched = []
            self._run_lock.release()
        if err is not None:
            raise err

    @contextmanager
    def lead(self) -> Iterator[None]:
        """Within: the calling thread stands in for worker 0, its time counted as worker 0's.

        It is pinned to the CPUs of worker 0's node that the pool uses (not to worker 0's own
        CPU: the scheduler may then dodge other load), and its affinity is restored on exit.
        ``lead_begin``/``lead_end`` are the same as two calls.
        """
        state = self.lead_begin()
        try:
            yield
        finally:
            self.lead_end(state)

    def lead_begin(self) -> tuple:
        """Enter ``lead``; returns the state ``lead_end`` takes. The affinity is set only when it
        differs (two system calls a pass saved when the thread already runs there)."""
        w0 = self._w[0]
        cpus = self._lead_cpus
        if cpus is None:
            cpus = self._lead_cpus = {w.cpu for w in self._w if w.node == w0.node and w.cpu is not None}
        saved = os.sched_getaffinity(0) if cpus else None
        if saved is not None:
            if saved == cpus:
                saved = None
            else:
                try:
                    os.sched_setaffinity(0, cpus)
                except OSError:
                    saved = None
        return saved, time.perf_counter()

    def lead_end(self, state: tuple) -> None:
        saved, t0 = state
        self._w[0].busy += time.perf_counter() - t0
        where = sc.getcpu()   # where worker 0's share ran: after the pass the thread may go anywhere
        if where:
            self.lead_seen = (threading.get_native_id(), where.value[0])
        if saved is not None:
            os.sched_setaffinity(0, saved)

    def check(self) -> list[WorkerInfo]:
        """Ask every worker again where it runs (getcpu from inside it)."""
        infos: list[WorkerInfo | None] = [None] * len(self._w)

        def locate(i: int) -> None:
            infos[i] = self._locate(self._w[i])
        self.run(locate)
        self.workers = [i for i in infos if i is not None]
        return self.workers

    def note_idle(self, index: int, seconds: float) -> None:
        """Take back `seconds` of worker `index`'s busy time: a caller whose ``fn`` waited (e.g.
        spun for work) knows better than the pool which part was work."""
        self._w[index].busy -= seconds

    def busy_fraction(self) -> list[float]:
        """Share of wall time each worker spent inside ``fn`` since the last call."""
        now = time.perf_counter()
        wall = max(now - self._last_wall, 1e-9)
        busy = [w.busy for w in self._w]
        out = [min(1.0, max(0.0, (b - a) / wall)) for a, b in zip(self._last_busy, busy)]
        self._last_wall, self._last_busy = now, busy
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._vacate()
        with self._run_lock:
            self._closed = True
            self._fn = None
            for w in self._w:
                w.go.release()
            for w in self._w:
                w.done.acquire()
                w.thread.join(timeout=5)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> str:
        """One line per worker: index -> cpu -> node (and a flag when misplaced)."""
        lines = []
        for w in self.workers:
            flag = "  MISPLACED" if w.misplaced else ""
            lines.append(f"worker {w.index:3d}: cpu {w.cpu} node {w.node} "
                         f"(runs on cpu {w.actual_cpu} node {w.actual_node}){flag}")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

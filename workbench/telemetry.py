"""Telemetry: immutable, JSON-serialisable snapshots of where the model's memory and threads are.

``Telemetry.sample()`` measures one ``Snapshot``: per node this process's weights / KV /
other bytes (page sampling + numa_maps), the rest of the system's use and free memory
(sysfs meminfo), the share of each buffer's pages proven on its intended nodes, the
workers (cpu, node, what they read, busy %), token rates and the memory bandwidth the
decode speed implies. ``Sampler`` runs it on its own niced thread (off the worker CPUs
when there are spare ones) every ``interval`` seconds; it can be paused.

Worker 0's share of a forward pass does not run on the pool's thread 0: the thread that
calls the engine runs it, pinned to worker 0's node for the pass (``WorkerPool.lead``), and
free again between passes. Worker 0's row shows where that thread ran at the end of its last
pass (``WorkerPool.lead_seen``), marked ``thread="caller"``: where it sits between passes says
nothing about the placement (an idle chat's thread on the other node read as "misplaced").
Before any pass, a thread that said it drives the engine (``Telemetry.note_caller``) is shown
where it runs now; with neither, worker 0's CPU and node are unknown (None), not the idle pool
thread's.

With a fixture topology (``--simulate-topology``) the memory and worker figures are
*simulated*: computed deterministically from the fixture, the engine's tensors and the
placement in force with the NUMA layer's own planners, and every snapshot says so.
Rates stay measured. Imports nothing from Textual.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from .numa import syscalls as sc
from .numa.plan import KVRequest, TensorSpec, make_plan
from .numa.proof import BufferProof, prove, read_numa_maps
from .numa.topology import Topology, fixture_path, format_cpulist, load_topology
from .numa.workers import plan_cpus

HISTORY = 60  # values kept per rate history


# ---- snapshot data --------------------------------------------------------

@dataclass(frozen=True)
class NodeMem:
    node: int
    cpus: str                 # cpulist text ('' for a memory-only node)
    total: int                # bytes
    free: int
    weights: int              # this process
    kv: int
    other: int
    system: int               # everything else in use on the node (other processes, kernel, caches)
    in_place: float | None    # share of pages meant for this node that are on it (None: nothing meant)
    host: str = ""            # the pipeline host this node belongs to ('' : this process's machine)


@dataclass(frozen=True)
class BufferShare:
    label: str
    kind: str
    intended: tuple[int, ...]
    nbytes: int
    share: float | None       # None: no intended node (OS default) or nothing touched yet
    line: str
    host: str = ""


@dataclass(frozen=True)
class WorkerRow:
    index: int
    cpu: int | None
    node: int
    actual_cpu: int | None
    actual_node: int | None
    uses: str                 # replica / slice / copy this worker reads
    busy: float               # 0..1 since the previous sample
    misplaced: bool
    thread: str = "pool"      # who runs its share: "pool" (its pinned thread) or "caller" (see below)
    host: str = ""


@dataclass(frozen=True)
class Rates:
    prompt_tps: tuple[float, ...] = ()   # one value per finished reply (newest last)
    decode_tps: tuple[float, ...] = ()
    ttft: tuple[float, ...] = ()         # seconds
    live_decode_tps: float | None = None  # while a reply streams
    generating: bool = False

    @staticmethod
    def cap(values: Iterable[float]) -> tuple[float, ...]:
        return tuple(values)[-HISTORY:]

    @staticmethod
    def cur_avg_peak(values: tuple[float, ...]) -> tuple[float, float, float] | None:
        if not values:
            return None
        return values[-1], sum(values) / len(values), max(values)

    @property
    def current_decode(self) -> float | None:
        if self.live_decode_tps is not None:
            return self.live_decode_tps
        return self.decode_tps[-1] if self.decode_tps else None


@dataclass(frozen=True)
class TopoInfo:
    node_ids: tuple[int, ...] = ()
    node_cpus: tuple[str, ...] = ()
    distances: tuple[tuple[int, ...], ...] = ()
    sockets: int = 0
    numa_balancing: int | None = None
    thp: str | None = None
    hugepages: str = ""
    kernel_path: str = ""
    simd: str = ""
    degraded: str | None = None


@dataclass(frozen=True)
class RoutingInfo:
    """A mixture-of-experts model's routing over the engine's sliding window (from
    ``Engine.routing()``), in a JSON-friendly form: routed hits per MoE layer and expert, and the
    expert bytes read from each node per token. Counted by the runtime, not estimated."""

    window: int = 0                                  # tokens counted per layer (at most the window)
    n_expert: int = 0
    layers: tuple[int, ...] = ()                     # the MoE layers, in order
    hits: tuple[tuple[int, ...], ...] = ()           # per layer in ``layers``: hits per expert
    node_bytes: tuple[tuple[int, float], ...] = ()   # (node, expert bytes read per token)

    @classmethod
    def from_routing(cls, r: Any) -> "RoutingInfo":
        """From the engine's ``RoutingSnapshot``."""
        layers = tuple(int(il) for il in r.layers)
        n_expert = int(r.hits.shape[1]) if r.hits.ndim == 2 else 0
        return cls(int(r.window), n_expert, layers, tuple(tuple(int(v) for v in r.hits[il]) for il in layers),
                   tuple((int(n), float(b)) for n, b in sorted(r.node_bytes.items())))

    @property
    def node_shares(self) -> dict[int, float]:
        total = sum(b for _, b in self.node_bytes)
        return {n: b / total for n, b in self.node_bytes} if total else {}

    @property
    def imbalance(self) -> float:
        """Busiest node's expert bytes over the mean across nodes (1.0: even), as the engine's."""
        vals = [b for _, b in self.node_bytes]
        mean = sum(vals) / len(vals) if vals else 0.0
        return max(vals) / mean if mean else 1.0

    @property
    def bytes_per_token(self) -> float:
        return sum(b for _, b in self.node_bytes)


@dataclass(frozen=True)
class RequestRow:
    """One request of the in-process server (``numawb --serve``), from ``Scheduler.active()``."""

    id: str
    state: str                 # queued | prompt | decode | done
    slot: int                  # -1 while queued
    prompt_tokens: int
    tokens: int                # generated so far
    tps: float                 # its own decode rate
    kv_nodes: tuple[int, ...]  # nodes its slot's KV cache is on
    age: float                 # seconds since it was submitted
    reused_tokens: int = 0
    kv_bytes: tuple[tuple[int, int], ...] = ()  # (node, bytes) of its slot's KV cache, from its pages


@dataclass(frozen=True)
class Snapshot:
    seq: int
    t: float                              # wall clock (time.time()) of the sample
    source: str                           # 'live' | 'simulated:<fixture>' | 'replay'
    simulated: bool
    model: str = ""
    placement: dict[str, Any] = field(default_factory=dict)
    weight_bytes: int = 0
    nodes: tuple[NodeMem, ...] = ()
    buffers: tuple[BufferShare, ...] = ()
    workers: tuple[WorkerRow, ...] = ()
    rates: Rates = field(default_factory=Rates)
    bandwidth: float | None = None        # bytes/s implied: weight bytes per token x current decode t/s
    topo: TopoInfo = field(default_factory=TopoInfo)
    notes: tuple[str, ...] = ()
    sample_seconds: float = 0.0           # what taking this sample cost
    routing: RoutingInfo | None = None    # mixture-of-experts models only
    serving: str = ""                     # the in-process server's address and slots ('' when not serving)
    requests: tuple[RequestRow, ...] = ()  # its active requests
    hosts: tuple[str, ...] = ()           # a pipeline over Ray hosts: one heading per host, in order

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Snapshot":
        d = dict(d)
        d["nodes"] = tuple(NodeMem(**n) for n in d.get("nodes", ()))
        d["buffers"] = tuple(BufferShare(**{**b, "intended": tuple(b["intended"])}) for b in d.get("buffers", ()))
        d["workers"] = tuple(WorkerRow(**w) for w in d.get("workers", ()))
        d["rates"] = Rates(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.get("rates", {}).items()})
        topo = d.get("topo", {})
        d["topo"] = TopoInfo(**{**topo,
                                "node_ids": tuple(topo.get("node_ids", ())),
                                "node_cpus": tuple(topo.get("node_cpus", ())),
                                "distances": tuple(tuple(r) for r in topo.get("distances", ()))})
        d["notes"] = tuple(d.get("notes", ()))
        r = d.get("routing")
        if r is not None:
            d["routing"] = RoutingInfo(int(r.get("window", 0)), int(r.get("n_expert", 0)),
                                       tuple(r.get("layers", ())), tuple(tuple(h) for h in r.get("hits", ())),
                                       tuple((int(n), float(b)) for n, b in r.get("node_bytes", ())))
        d["requests"] = tuple(RequestRow(**{**q, "kv_nodes": tuple(q.get("kv_nodes", ())),
                                            "kv_bytes": tuple(tuple(kb) for kb in q.get("kv_bytes", ()))})
                              for q in d.get("requests", ()))
        d["hosts"] = tuple(d.get("hosts", ()))
        return cls(**d)


def host_heading(label: str, layers: tuple[int, int] | list[int], path: str = "") -> str:
    """How a pipeline host is titled on the dashboard (the rows under it carry `label`)."""
    return f"host {label} · layers {layers[0]}..{layers[1] - 1}" + (f" · {path}" if path else "")


def pipeline_snapshot(proofs: list[dict[str, Any]], seq: int = 0, now: float | None = None, model: str = "",
                      rates: Rates | None = None) -> Snapshot:
    """A snapshot of a model pipelined over Ray hosts, from each host's own proof
    (`StageHost.proof`, in pipeline order): memory per node, the proof per buffer and the workers,
    every row tagged with its host, so the dashboard groups by host, then node."""
    nodes: list[NodeMem] = []
    buffers: list[BufferShare] = []
    workers: list[WorkerRow] = []
    headings: list[str] = []
    weight_bytes = 0
    first = proofs[0] if proofs else {}
    for p in proofs:
        host = p["label"]
        headings.append(host_heading(host, p["layers"], p.get("path", "")))
        mem = p.get("mem", {})
        by_node = p.get("nodes", {})
        meant: dict[int, list[int]] = {}
        for b in p["buffers"]:
            pages = {int(k): v for k, v in b["pages_by_node"].items()}
            total = sum(pages.values())
            for n in b["intended"]:
                m = meant.setdefault(int(n), [0, 0])
                m[0] += total
                m[1] += pages.get(int(n), 0)
            buffers.append(BufferShare(b["label"], b["kind"], tuple(b["intended"]), int(b["bytes"]),
                                       b.get("share_in_place"), "", host))
            if b["kind"] == "weights":
                weight_bytes += int(b["bytes"])
        for key in sorted({int(k) for k in list(mem) + list(by_node)}):
            kinds = by_node.get(str(key), {})
            total, free = mem.get(str(key), (0, 0))
            mine = int(kinds.get("weights", 0)) + int(kinds.get("kv", 0)) + int(kinds.get("other", 0))
            m = meant.get(key)
            nodes.append(NodeMem(key, p.get("cpus", {}).get(str(key), ""), int(total), int(free),
                                 int(kinds.get("weights", 0)), int(kinds.get("kv", 0)), int(kinds.get("other", 0)),
                                 max(0, int(total) - int(free) - mine), (m[1] / m[0]) if m and m[0] else None, host))
        for w in p["workers"]:
            workers.append(WorkerRow(w["index"], w["wanted_cpu"], w["wanted_node"], w["cpu"], w["node"],
                                     f"layers {p['layers'][0]}..{p['layers'][1] - 1}",
                                     float(w.get("busy", 0.0)), bool(w["misplaced"]), w.get("thread", "pool"), host))
    placement = {"weights": first.get("weights_mode", ""), "kv": first.get("kv_mode", ""),
                 "threads": len(workers), "policy": f"{len(proofs)} hosts"}
    return Snapshot(seq=seq, t=time.time() if now is None else now, source="live", simulated=False, model=model,
                    placement=placement, weight_bytes=weight_bytes, nodes=tuple(nodes), buffers=tuple(buffers),
                    workers=tuple(workers), rates=rates or Rates(), hosts=tuple(headings))


def empty_snapshot(source: str = "live", simulated: bool = False) -> Snapshot:
    return Snapshot(seq=0, t=0.0, source=source, simulated=simulated)


# ---- rates ----------------------------------------------------------------

class RateTracker:
    """Token rates fed from engine events (any thread); ``rates()`` gives an immutable view."""

    WINDOW = 1.0  # seconds of tokens behind the live decode rate

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prompt: list[float] = []
        self._decode: list[float] = []
        self._ttft: list[float] = []
        self._recent: list[float] = []
        self._generating = False

    def start(self) -> None:
        with self._lock:
            self._generating, self._recent = True, []

    def token(self, t: float) -> None:
        with self._lock:
            self._recent.append(t)
            cut = t - self.WINDOW
            while self._recent and self._recent[0] < cut:
                self._recent.pop(0)

    def done(self, stats: Any) -> None:
        """``stats``: the engine's Stats of a finished (or stopped) reply."""
        with self._lock:
            self._generating, self._recent = False, []
            if stats.prompt_tokens:
                self._prompt = list(Rates.cap(self._prompt + [stats.prompt_tps]))
            if stats.decode_tokens:
                self._decode = list(Rates.cap(self._decode + [stats.decode_tps]))
            if stats.ttft:
                self._ttft = list(Rates.cap(self._ttft + [stats.ttft]))

    def failed(self) -> None:
        with self._lock:
            self._generating, self._recent = False, []

    def rates(self, now: float | None = None) -> Rates:
        with self._lock:
            live = None
            if self._generating and len(self._recent) >= 2:
                span = self._recent[-1] - self._recent[0]
                live = (len(self._recent) - 1) / span if span > 0 else None
            return Rates(tuple(self._prompt), tuple(self._decode), tuple(self._ttft), live, self._generating)


# ---- helpers --------------------------------------------------------------

def _hugepage_text(t: Topology) -> str:
    parts = []
    for n in t.nodes:
        for h in n.hugepages:
            if h.total:
                parts.append(f"node {n.id}: {h.free}/{h.total} x {h.size_kb} kB free")
    return "; ".join(parts) or "none reserved"


def topo_info(t: Topology, kernel: str) -> TopoInfo:
    ids = t.node_ids
    return TopoInfo(ids, tuple(format_cpulist(t.node(n).cpus) for n in ids),
                    tuple(tuple(t.distance(a, b) for b in ids) for a in ids), len(t.sockets),
                    t.numa_balancing, t.thp, _hugepage_text(t), kernel, t.simd, t.degraded)


def thread_cpu(tid: int) -> int | None:
    """The CPU thread ``tid`` of this process last ran on (``/proc/self/task/<tid>/stat`` field 39,
    ``processor``); None when the thread is gone or the file unreadable."""
    try:
        with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    try:
        return int(fields[36])  # field 39 counted from 1; fields[0] here is field 3 (state)
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class CallerSeen:
    """Where the thread that drives the engine (and so runs worker 0's share) was last seen."""
    tid: int
    cpu: int | None
    node: int | None


def _kernel_path() -> str:
    try:
        from .engine.kernels import kernel_path
        return kernel_path()
    except Exception:  # noqa: BLE001 - the dashboard shows "unknown" instead of dying
        return "unknown"


def worker_uses(node: int, weight_buffers: list[tuple[str, tuple[int, ...]]]) -> str:
    """What a worker on ``node`` reads: the weight buffer meant for its node, else the shared one."""
    mine = [lab for lab, nodes in weight_buffers if nodes == (node,)]
    if mine:
        return mine[0].removeprefix("weights ")
    shared = [lab for lab, nodes in weight_buffers if node in nodes or not nodes]
    return shared[0].removeprefix("weights ") if shared else "-"


def node_in_place(proofs: list[BufferProof], node: int) -> float | None:
    """Pages of buffers meant (partly) for ``node`` found on it, over the pages expected there."""
    got = expected = 0.0
    for p in proofs:
        if node in p.intended and p.present:
            got += p.pages_by_node.get(node, 0)
            expected += p.present / len(p.intended)
    return min(1.0, got / expected) if expected else None


# ---- the sampler ----------------------------------------------------------

class Telemetry:
    """Takes snapshots of one engine (or none); ``simulate`` names a topology fixture."""

    def __init__(self, engine: Any = None, simulate: str | None = None, max_pages: int = 1024):
        self.engine = engine
        self.simulate = simulate
        self.max_pages = max_pages
        self.rates = RateTracker()
        self._seq = 0
        self._kernel = _kernel_path()
        self._fixture: Topology | None = load_topology(fixture_path(simulate)) if simulate else None
        self._lock = threading.Lock()
        self._caller: int | None = None
        self._caller_seen: CallerSeen | None = None
        #: the in-process server (``numawb --serve``): anything with ``label`` and ``active()``
        #: returning the scheduler's ``ActiveRequest`` list (``workbench.server.app.ServerState``-like)
        self.server: Any = None

    def note_caller(self, tid: int | None = None) -> None:
        """Call from the thread that runs the engine's forward passes (default: the calling
        thread): worker 0's share runs there, and its row follows that thread."""
        self._caller = threading.get_native_id() if tid is None else tid

    def _caller_where(self, topo: Topology, pool: Any = None) -> CallerSeen | None:
        """Where worker 0's share last ran (the pool's record at the end of the last pass), else
        where the engine's calling thread runs now, else where it was last seen."""
        seen = getattr(pool, "lead_seen", None)
        if seen is not None:
            tid, cpu = seen
            return CallerSeen(tid, cpu, topo.cpu_node.get(cpu))
        tid = self._caller
        if tid is None:
            return None
        cpu = thread_cpu(tid)
        if cpu is not None:
            node = topo.cpu_node.get(cpu)
            self._caller_seen = CallerSeen(tid, cpu, node)
        elif self._caller_seen is None or self._caller_seen.tid != tid:
            self._caller_seen = CallerSeen(tid, None, None)
        return self._caller_seen

    @property
    def source(self) -> str:
        return f"simulated:{self.simulate}" if self.simulate else "live"

    def sample(self, now: float | None = None) -> Snapshot:
        with self._lock:
            t0 = time.perf_counter()
            self._seq += 1
            eng = self.engine
            if eng is not None and hasattr(eng, "proofs"):  # a pipeline over Ray hosts
                snap = self._pipeline(eng)
            elif self._fixture is not None:
                snap = self._simulated(eng, self._fixture)
            else:
                snap = self._live(eng)
            rates = self.rates.rates()
            wb = getattr(eng, "weight_bytes", 0) if eng is not None else 0
            cur = rates.current_decode
            serving, requests = self._serving()
            routing = self._routing(eng)
            notes = snap.notes
            if routing is not None and self._fixture is not None:
                notes += ("expert routing is counted on this machine's own placement, not the simulated one",)
            return dataclasses.replace(
                snap, seq=self._seq, t=time.time() if now is None else now, rates=rates,
                bandwidth=wb * cur if (cur and wb) else None, routing=routing, notes=notes,
                serving=serving, requests=requests, sample_seconds=time.perf_counter() - t0)

    def _pipeline(self, pipe: Any) -> Snapshot:
        """Every host's own proof, grouped by host (`pipeline_snapshot`); a host that does not
        answer leaves a note instead."""
        from .errors import UserError
        if not pipe.hosts:
            return empty_snapshot()
        try:
            proofs = pipe.proofs()
        except UserError as e:
            return dataclasses.replace(empty_snapshot(), model=os.path.basename(pipe.path), notes=(str(e),))
        return pipeline_snapshot(proofs, model=os.path.basename(pipe.path))

    @staticmethod
    def _routing(eng: Any) -> RoutingInfo | None:
        """The engine's routing window (None for a dense model or no engine)."""
        fn = getattr(eng, "routing", None) if eng is not None else None
        r = fn() if fn is not None else None
        return RoutingInfo.from_routing(r) if r is not None else None

    def _serving(self) -> tuple[str, tuple[RequestRow, ...]]:
        """The in-process server's label and its active requests (thread-safe snapshot)."""
        srv = self.server
        if srv is None:
            return "", ()
        rows = tuple(RequestRow(a.id, a.state, a.slot, a.prompt_tokens, a.tokens, float(a.tps),
                                tuple(a.kv_nodes), float(a.age), a.reused_tokens,
                                tuple(getattr(a, "kv_bytes", ())))
                     for a in srv.active())
        return srv.label, rows

    # -- common engine facts
    @staticmethod
    def _engine_facts(eng: Any) -> tuple[str, dict[str, Any], int]:
        if eng is None:
            return "", {}, 0
        p = eng.placement
        placement = {"weights": p.weights, "kv": p.kv, "threads": eng.pool.n_threads, "policy": p.policy}
        return os.path.basename(eng.path), placement, int(eng.weight_bytes)

    def _live(self, eng: Any) -> Snapshot:
        topo = load_topology()
        model, placement, wb = self._engine_facts(eng)
        notes: list[str] = []
        proofs: list[BufferProof] = []
        workers: tuple[WorkerRow, ...] = ()
        if eng is not None:
            try:
                bufs = eng.buffers()
                proofs = prove(bufs, self.max_pages)
            except Exception as e:  # noqa: BLE001 - a buffer closed by a switch mid-sample
                notes.append(f"proof skipped this sample: {e}")
                bufs = []
            weight_bufs = [(b.label, tuple(b.intended)) for b in bufs if b.kind == "weights"]
            pool = eng.pool
            busy = pool.busy_fraction()
            caller = self._caller_where(topo, pool)
            rows = []
            for i, w in enumerate(pool.workers):
                b = busy[i] if i < len(busy) else 0.0
                uses = worker_uses(w.node, weight_bufs)
                if i == 0:  # worker 0's share runs on the calling thread (unknown until it says so)
                    cpu, node = (caller.cpu, caller.node) if caller is not None else (None, None)
                    rows.append(WorkerRow(0, w.cpu, w.node, cpu, node, uses, b,
                                          node is not None and node != w.node, "caller"))
                else:
                    rows.append(WorkerRow(w.index, w.cpu, w.node, w.actual_cpu, w.actual_node, uses, b,
                                          w.misplaced))
            workers = tuple(rows)
            notes.extend(getattr(pool, "notes", []))
        kinds: dict[str, dict[int, int]] = {"weights": {}, "kv": {}}
        for p in proofs:
            if not p.sampled:
                continue
            page_bytes = p.nbytes / p.sampled
            d = kinds.setdefault(p.kind, {})
            for node, n in p.pages_by_node.items():
                d[node] = d.get(node, 0) + int(n * page_bytes)
        total: dict[int, int] = {}
        for v in read_numa_maps():
            for node, n in v.bytes_by_node.items():
                total[node] = total.get(node, 0) + n
        nodes = []
        for n in topo.nodes:
            w, k = kinds["weights"].get(n.id, 0), kinds["kv"].get(n.id, 0)
            other = max(0, total.get(n.id, 0) - w - k)
            used = max(0, n.mem_total - n.mem_free)
            nodes.append(NodeMem(n.id, format_cpulist(n.cpus), n.mem_total, n.mem_free, w, k, other,
                                 max(0, used - w - k - other), node_in_place(proofs, n.id)))
        shares = tuple(BufferShare(p.label, p.kind, tuple(p.intended), p.nbytes, p.share, p.line())
                       for p in proofs)
        if topo.numa_balancing and len(topo.nodes) > 1:
            notes.append("numa_balancing is on: the kernel may move pages behind the placement")
        return Snapshot(0, 0.0, "live", False, model, placement, wb, tuple(nodes), shares, workers,
                        topo=topo_info(topo, self._kernel), notes=tuple(notes))

    def _simulated(self, eng: Any, topo: Topology) -> Snapshot:
        """Deterministic figures for ``topo``: the NUMA layer's planners applied to this model."""
        model, placement, wb = self._engine_facts(eng)
        notes = [f"SIMULATED topology '{self.simulate}': memory and worker figures are computed, "
                 "not measured; rates are measured on this machine"]
        need_w: dict[int, int] = {}
        need_kv: dict[int, int] = {}
        workers: list[WorkerRow] = []
        buffers: list[BufferShare] = []
        if eng is not None:
            p = eng.placement
            plan, plan_notes = plan_cpus(topo, p.threads, p.policy.split(":")[0] if p.policy else "distribute")
            notes.extend(plan_notes)
            specs = list(eng.layout.specs.values()) if hasattr(eng.layout, "specs") else \
                [TensorSpec("weights", 1, wb)]
            kv_total = sum(b.nbytes for b in eng.buffers() if b.kind == "kv")
            per_worker = max(1, kv_total // max(1, len(plan) * eng.cfg.n_layer))
            try:
                sim = make_plan(specs, p.weights, plan, topo, free={n.id: n.mem_free for n in topo.nodes},
                                kv=KVRequest(eng.cfg.n_layer, per_worker, p.kv) if kv_total else None)
                per_tensor = {name: t.placement for name, t in sim.tensors.items()}
                need_w, need_kv = sim.weights_need(), sim.kv_need()
            except ValueError as e:
                notes.append(str(e))
                per_tensor = {}
            kinds = sorted(set(per_tensor.values()))
            for n in sorted(need_w):
                label = f"weights {'+'.join(kinds)} node {n}" if p.weights != "none" else "weights none (OS default)"
                buffers.append(BufferShare(label, "weights", (n,), need_w[n], 1.0, f"{label}: 100.0% (simulated)"))
            for n in sorted(need_kv):
                label = f"kv {p.kv} node {n}"
                buffers.append(BufferShare(label, "kv", (n,), need_kv[n], 1.0, f"{label}: 100.0% (simulated)"))
            real_busy = eng.pool.busy_fraction()
            busy = sum(real_busy) / len(real_busy) if real_busy else 0.0
            wlabels = [(b.label, b.intended) for b in buffers if b.kind == "weights"]
            for i, (cpu, node) in enumerate(plan):
                workers.append(WorkerRow(i, cpu, node, cpu, node, worker_uses(node, wlabels), busy, False,
                                         "caller" if i == 0 else "pool"))
        nodes = []
        for n in topo.nodes:
            w, k = need_w.get(n.id, 0), need_kv.get(n.id, 0)
            nodes.append(NodeMem(n.id, format_cpulist(n.cpus), n.mem_total, n.mem_free, w, k, 0,
                                 max(0, n.mem_total - n.mem_free - w - k),
                                 1.0 if (w or k) else None))
        return Snapshot(0, 0.0, self.source, True, model, placement, wb, tuple(nodes), tuple(buffers),
                        tuple(workers), topo=topo_info(topo, self._kernel), notes=tuple(notes))


class SnapshotSource(Protocol):
    """What feeds the dashboard: ``live`` (the sampler), ``frozen`` (one fixed snapshot, for
    screenshots) or ``replay`` (a recording, ``workbench.replay``). Each hands snapshots to the
    callback it was made with; the app treats the three alike."""

    kind: str
    interval: float

    @property
    def paused(self) -> bool: ...

    @property
    def current(self) -> Snapshot | None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def pause(self, paused: bool = True) -> None: ...

    def set_interval(self, interval: float) -> float: ...

    def sample_now(self) -> Snapshot | None: ...

    def status(self) -> str: ...


class Ticker:
    """A thread that calls ``tick()`` every ``interval`` seconds; pausable, re-timable, stoppable.
    ``tick()`` returns False when there is nothing more to do (the thread then ends)."""

    MIN_INTERVAL, MAX_INTERVAL = 0.25, 10.0
    name = "numawb-ticker"

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = self.clamp(interval)
        self._paused = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    @classmethod
    def clamp(cls, interval: float) -> float:
        return min(cls.MAX_INTERVAL, max(cls.MIN_INTERVAL, float(interval)))

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def start(self) -> None:
        self._thread.start()

    def set_interval(self, interval: float) -> float:
        self.interval = self.clamp(interval)
        self._wake.set()
        return self.interval

    def pause(self, paused: bool = True) -> None:
        (self._paused.set if paused else self._paused.clear)()
        self._wake.set()

    def status(self) -> str:
        return "telemetry paused" if self.paused else f"refresh {self.interval:g} s"

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    def tick(self) -> bool:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Runs first on the ticker's own thread."""

    def _run(self) -> None:
        self._prepare()
        while not self._stop.is_set():
            last = time.monotonic()
            if not self._paused.is_set():
                try:
                    if self.tick() is False:
                        return
                except Exception:  # noqa: BLE001 - one bad tick must not end the source
                    pass
            woke = self._wake.wait(self.interval)
            self._wake.clear()
            # an interval made longer while waiting (set without a wake-up): wait out the rest of it
            while not woke and not self._stop.is_set() and (left := self.interval - (time.monotonic() - last)) > 1e-3:
                woke = self._wake.wait(left)
                self._wake.clear()


class Sampler(Ticker):
    """The live source: ``telemetry.sample()`` every ``interval`` s on its own thread, handed to
    ``on_snapshot`` (from that thread). Pausable; ``sample_now()`` forces one."""

    kind = "live"
    name = "numawb-telemetry"

    def __init__(self, telemetry: Telemetry, on_snapshot: Callable[[Snapshot], None], interval: float = 1.0):
        super().__init__(interval)
        self.telemetry = telemetry
        self.on_snapshot = on_snapshot
        self._current: Snapshot | None = None

    @property
    def current(self) -> Snapshot | None:
        return self._current

    def sample_now(self) -> Snapshot:
        snap = self.telemetry.sample()
        self._current = snap
        self.on_snapshot(snap)
        return snap

    def tick(self) -> bool:
        self.sample_now()
        return True

    def _prepare(self) -> None:
        """Nice this thread and keep it off the workers' CPUs when spare CPUs exist."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (OSError, AttributeError):
            pass
        eng = self.telemetry.engine
        if eng is None:
            return
        busy = {w.cpu for w in eng.pool.workers if w.cpu is not None}
        spare = [c for c in os.sched_getaffinity(0) if c not in busy]
        if spare:
            sc.sched_setaffinity(spare)


class FrozenSource:
    """One fixed snapshot, shown as it is (deterministic screenshots): no thread, no refresh."""

    kind = "frozen"
    interval = 0.0
    paused = False

    def __init__(self, snapshot: Snapshot, on_snapshot: Callable[[Snapshot], None] | None = None) -> None:
        self.snapshot = snapshot
        self.on_snapshot = on_snapshot

    @property
    def current(self) -> Snapshot:
        return self.snapshot

    def start(self) -> None:
        if self.on_snapshot is not None:
            self.on_snapshot(self.snapshot)

    def stop(self) -> None:
        pass

    def pause(self, paused: bool = True) -> None:
        pass

    def set_interval(self, interval: float) -> float:
        return self.interval

    def sample_now(self) -> Snapshot:
        return self.snapshot

    def status(self) -> str:
        return ""

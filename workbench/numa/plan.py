"""The placement plan: one object that answers "which bytes go where, who computes what, does it fit".

Built from the topology, the workers (CPU and node each), the tensors (name, rows,
row bytes, experts stacked along the rows) and the requested modes, a plan says
for every tensor which node(s) hold which rows, how many bytes each node needs
for weights and KV cache, and which workers compute which rows. It is checked
against free memory per node once, and ``WeightLayout``/``KVLayout`` execute
exactly what was checked. The engine, ``bench``, the dashboard's simulated
topologies and the advisor all read this object.

Per tensor, a placement is one of:
  mirror     - a full copy on every node in use (each bound to its node)
  slice      - each node holds the rows its own workers compute (of every expert)
  experts    - whole experts owned by nodes (expert tensors only)
  interleave - one copy, pages round-robin over the nodes in use
  none       - one copy, OS default policy (first touch by the loader)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from .budget import BudgetCheck, BudgetError, check_need, fmt_bytes, free_per_node
from .modes import ModeError, kv_node, parse_kv, parse_weights
from .topology import Topology, load_topology

ROW_ALIGN = 8


@dataclass(frozen=True)
class TensorSpec:
    """One weight tensor: ``rows`` rows of ``row_bytes`` bytes (GGUF block layout).

    ``groups`` > 1 marks a stack of equal matrices along the rows (the routed experts
    of a mixture-of-experts layer: expert e is rows [e * rows/groups, (e+1) * rows/groups)).
    """

    name: str
    rows: int
    row_bytes: int
    groups: int = 1

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def group_rows(self) -> int:
        return self.rows // self.groups

    @property
    def routed(self) -> bool:
        """A mixture-of-experts layer's routed experts (GGUF names them ``*_exps``)."""
        return self.groups > 1 and "_exps" in self.name


@dataclass(frozen=True)
class WorkerSlot:
    """A worker as the plan sees it: its index, CPU and node."""

    index: int
    cpu: int | None
    node: int


@dataclass(frozen=True)
class Piece:
    """Rows [lo, hi) of experts [g0, g1) of one tensor, in one arena, read by ``node``'s workers
    (``node`` None: read by everyone). Dense tensors have one group."""

    arena: str        # 'node<N>' | 'interleave' | 'default'
    node: int | None
    lo: int
    hi: int
    g0: int = 0
    g1: int = 1

    def nbytes(self, spec: TensorSpec) -> int:
        return (self.g1 - self.g0) * (self.hi - self.lo) * spec.row_bytes


@dataclass(frozen=True)
class TensorPlan:
    spec: TensorSpec
    placement: str
    pieces: tuple[Piece, ...]

    def need(self, plan: "PlacementPlan") -> dict[int, int]:
        out: dict[int, int] = {}
        for p in self.pieces:
            b = p.nbytes(self.spec)
            if p.arena.startswith("node"):
                n = int(p.arena[4:])
                out[n] = out.get(n, 0) + b
            elif p.arena == "interleave":
                share = math.ceil(b / len(plan.nodes))
                for n in plan.nodes:
                    out[n] = out.get(n, 0) + share
            else:
                out[plan.loader_node] = out.get(plan.loader_node, 0) + b
        return out


@dataclass(frozen=True)
class KVPlan:
    """The KV cache: each owner (the first worker of a node) holds its positions of every layer."""

    mode: str
    n_layers: int
    sizes: tuple[int, ...]   # bytes per layer, per worker (0 for workers that own nothing)

    def need(self, plan: "PlacementPlan") -> dict[int, int]:
        total = self.n_layers * sum(self.sizes)
        if self.mode == "first-touch":
            out: dict[int, int] = {}
            for w, b in zip(plan.workers, self.sizes):
                out[w.node] = out.get(w.node, 0) + self.n_layers * b
            return out
        if self.mode == "interleave":
            return {n: math.ceil(total / len(plan.nodes)) for n in plan.nodes}
        return {kv_node(self.mode): total}

    @property
    def nbytes(self) -> int:
        return self.n_layers * sum(self.sizes)


def row_split(rows: int, workers: int | Sequence[float]) -> list[tuple[int, int]]:
    """Split ``rows`` into consecutive ranges, one per worker, in worker order.

    ``workers`` is a count (equal shares) or relative weights. Boundaries fall on
    multiples of ROW_ALIGN (8) rows when every worker can get at least that many; ranges may be empty
    when rows < workers. Workers of one node are numbered consecutively, so each
    node's rows form one block: slice placement and the compute split agree.
    """
    weights = [1.0] * workers if isinstance(workers, int) else [float(w) for w in workers]
    n = len(weights)
    if n == 0:
        raise ValueError("row_split needs at least one worker")
    if rows < 0 or any(w < 0 for w in weights):
        raise ValueError("rows and weights must be >= 0")
    total = sum(weights) or float(n)
    if not sum(weights):
        weights = [1.0] * n
    align = ROW_ALIGN if rows >= ROW_ALIGN * n else 1
    blocks = rows // align  # the last worker also takes the rows % align leftover
    bounds = [0]
    acc = 0.0
    for w in weights[:-1]:
        acc += w
        b = int(round(blocks * acc / total)) * align
        bounds.append(min(rows, max(bounds[-1], b)))
    bounds.append(rows)
    return list(zip(bounds[:-1], bounds[1:]))


def _node_ranges(rows: int, workers: Sequence[WorkerSlot]) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for w, (lo, hi) in zip(workers, row_split(rows, len(workers))):
        a, b = out.get(w.node, (lo, hi))
        out[w.node] = (min(a, lo), max(b, hi))
    return out


def expert_owners(groups: int, nodes: Sequence[int]) -> list[int]:
    """The node owning each expert in ``experts`` mode: consecutive, equal blocks per node."""
    return [nodes[e * len(nodes) // groups] for e in range(groups)]


@dataclass
class PlacementPlan:
    """Every tensor's and the KV cache's placement, the need per node, and the compute split."""

    weights_mode: str
    topology: Topology
    workers: tuple[WorkerSlot, ...]
    tensors: dict[str, TensorPlan]
    kv: KVPlan | None
    free: dict[int, int]
    loader_node: int
    notes: list[str] = field(default_factory=list)

    # ---- who --------------------------------------------------------------
    @property
    def nodes(self) -> list[int]:
        seen: dict[int, None] = {}
        for w in self.workers:
            seen.setdefault(w.node, None)
        return list(seen)

    @property
    def n_workers(self) -> int:
        return len(self.workers)

    def node_workers(self, node: int) -> list[int]:
        return [w.index for w in self.workers if w.node == node]

    def node_rows(self, rows: int) -> dict[int, tuple[int, int]]:
        """The consecutive row block each node's workers compute."""
        return _node_ranges(rows, self.workers)

    def expert_node(self, name: str, expert: int) -> int | None:
        """The node that alone holds (and computes) ``expert``, or None when every node reads it."""
        for p in self.tensors[name].pieces:
            if p.g0 <= expert < p.g1 and (p.g1 - p.g0) < self.tensors[name].spec.groups:
                return p.node
        return None

    def expert_read_bytes(self, name: str, expert: int) -> dict[int, float]:
        """Bytes of one expert of ``name`` read per use, by the node whose memory serves them."""
        t = self.tensors[name]
        rb = t.spec.row_bytes
        owner = self.expert_node(name, expert)
        if owner is not None:
            return {owner: float(t.spec.group_rows * rb)}
        if t.placement in ("mirror", "slice"):  # each node's workers read their rows locally
            return {n: float((hi - lo) * rb) for n, (lo, hi) in self.node_rows(t.spec.group_rows).items()}
        total = float(t.spec.group_rows * rb)
        if t.placement == "interleave":
            return {n: total / len(self.nodes) for n in self.nodes}
        return {self.loader_node: total}

    # ---- how much ---------------------------------------------------------
    @property
    def kv_mode(self) -> str | None:
        return self.kv.mode if self.kv else None

    def weights_need(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for t in self.tensors.values():
            _add(out, t.need(self))
        return out

    def kv_need(self) -> dict[int, int]:
        return self.kv.need(self) if self.kv else {}

    def need(self) -> dict[int, int]:
        out = self.weights_need()
        _add(out, self.kv_need())
        return out

    @property
    def weight_bytes(self) -> int:
        return sum(t.spec.nbytes for t in self.tensors.values())

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.placement] = out.get(t.placement, 0) + 1
        return out

    @property
    def fits(self) -> bool:
        return BudgetCheck(self.need(), self.free).fits

    def what(self) -> str:
        w = f"weights '{self.weights_mode}'"
        return w + (f" + KV '{self.kv.mode}'" if self.kv and self.tensors else "") if self.tensors else \
            f"KV cache '{self.kv.mode}'" if self.kv else w

    def check(self, what: str | None = None) -> BudgetCheck:
        """Raise BudgetError (need and free per node, nothing allocated) unless the plan fits."""
        return check_need(self.need(), self.topology, what or self.what(), free=self.free)

    def summary(self) -> str:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts().items()))
        per = ", ".join(f"node {n} {fmt_bytes(v)}" for n, v in sorted(self.need().items()))
        return f"weights {self.weights_mode}: {counts}" + (f" ({per})" if per else "")

    def as_dict(self) -> dict[str, Any]:
        return {"weights": self.weights_mode, "kv": self.kv_mode, "nodes": self.nodes,
                "workers": [{"index": w.index, "cpu": w.cpu, "node": w.node} for w in self.workers],
                "tensors": self.counts(),
                "weights_per_node": {str(k): v for k, v in sorted(self.weights_need().items())},
                "kv_per_node": {str(k): v for k, v in sorted(self.kv_need().items())},
                "free_per_node": {str(k): v for k, v in sorted(self.free.items())},
                "fits": self.fits}


def _add(need: dict[int, int], more: Mapping[int, int], sign: int = 1) -> None:
    for k, v in more.items():
        need[k] = need.get(k, 0) + sign * v


def sliceable(spec: TensorSpec, n_workers: int) -> bool:
    """Big enough that every worker gets whole 4-row blocks; smaller tensors are mirrored."""
    return spec.group_rows > 1 and spec.group_rows >= ROW_ALIGN * n_workers


def _pieces(spec: TensorSpec, placement: str, workers: Sequence[WorkerSlot],
            nodes: Sequence[int]) -> tuple[Piece, ...]:
    g, r = spec.groups, spec.group_rows
    if placement == "mirror":
        return tuple(Piece(f"node{n}", n, 0, r, 0, g) for n in nodes)
    if placement == "slice":
        return tuple(Piece(f"node{n}", n, lo, hi, 0, g) for n, (lo, hi) in _node_ranges(r, workers).items())
    if placement == "experts":
        owners = expert_owners(g, nodes)
        out = []
        for n in nodes:
            mine = [e for e in range(g) if owners[e] == n]
            if mine:
                out.append(Piece(f"node{n}", n, 0, r, mine[0], mine[-1] + 1))
        return tuple(out)
    if placement == "interleave":
        return (Piece("interleave", None, 0, r, 0, g),)
    return (Piece("default", None, 0, r, 0, g),)


def as_workers(workers: Iterable[Any]) -> tuple[WorkerSlot, ...]:
    """WorkerSlots from a pool's workers, (cpu, node) pairs or WorkerSlots."""
    out = []
    for i, w in enumerate(workers):
        if isinstance(w, WorkerSlot):
            out.append(w)
        elif isinstance(w, tuple):
            out.append(WorkerSlot(i, w[0], w[1]))
        else:
            out.append(WorkerSlot(getattr(w, "index", i), getattr(w, "cpu", None), w.node))
    return tuple(out)


def _loader_node(topology: Topology) -> int:
    from . import syscalls as sc
    r = sc.getcpu() if topology.root == "/" else None
    return topology.node_of(r.value[0]) if r else topology.nodes[0].id


def free_memory(topology: Topology, budget: int | Mapping[int, int] | None = None) -> dict[int, int]:
    """Bytes each node can give: fresh free memory on the live machine (a fixture's own
    figures otherwise), or a budget (bytes per node, or {node: bytes})."""
    if budget is None:
        return free_per_node(load_topology() if topology.root == "/" else topology)
    if isinstance(budget, int):
        return {n.id: budget for n in topology.nodes}
    return dict(budget)


@dataclass(frozen=True)
class KVRequest:
    """A KV cache to plan beside the weights: layers, bytes per layer per worker, mode."""

    n_layers: int
    bytes_per_layer_per_worker: int | Sequence[int]
    mode: str = "first-touch"


def _kv_plan(req: KVRequest, n_workers: int) -> KVPlan:
    b = req.bytes_per_layer_per_worker
    sizes = tuple([int(b)] * n_workers if isinstance(b, int) else [int(x) for x in b])
    if len(sizes) != n_workers:
        raise ValueError(f"{len(sizes)} KV sizes for {n_workers} workers")
    return KVPlan(parse_kv(req.mode), req.n_layers, sizes)


def make_plan(specs: Sequence[TensorSpec], weights_mode: str | None, workers: Iterable[Any],
              topology: Topology, *, kv: KVRequest | None = None,
              budget: int | Mapping[int, int] | None = None,
              free: Mapping[int, int] | None = None) -> PlacementPlan:
    """Plan weights (``weights_mode``; None plans the KV cache alone) and a KV cache together.

    ``auto`` decides per tensor within the memory left after the KV cache: routed experts
    sliced, everything else mirrored if it fits, else the biggest tensors sliced
    first, then small leftovers interleaved. Nothing is allocated or checked here:
    call ``check()`` (or read ``fits``).
    """
    ws = as_workers(workers)
    if not ws:
        raise ValueError("a plan needs at least one worker")
    mode = parse_weights(weights_mode) if weights_mode is not None else "none"
    free_d = dict(free) if free is not None else free_memory(topology, budget)
    plan = PlacementPlan(mode, topology, ws, {}, _kv_plan(kv, len(ws)) if kv else None, free_d,
                         _loader_node(topology))
    if weights_mode is None:
        return plan
    nodes, nw = plan.nodes, len(ws)

    if mode == "experts" and not any(s.routed for s in specs):
        raise ModeError("weights mode 'experts' needs a mixture-of-experts model (this one has no routed "
                        "experts); use slice, mirror, interleave or auto")

    def first_choice(s: TensorSpec) -> str:
        if mode in ("slice", "auto") and s.routed and sliceable(s, nw):
            return "slice"
        if mode == "slice":
            return "slice" if sliceable(s, nw) else "mirror"
        if mode == "experts":
            return "experts" if s.routed else "mirror"
        if mode == "auto":
            return "mirror"
        return mode

    def put(s: TensorSpec, placement: str) -> None:
        plan.tensors[s.name] = TensorPlan(s, placement, _pieces(s, placement, ws, nodes))

    for s in specs:
        put(s, first_choice(s))
    if mode == "auto":
        room = dict(free_d)
        _add(room, plan.kv_need(), -1)
        need = plan.weights_need()
        fits = lambda: all(v <= room.get(k, 0) for k, v in need.items())  # noqa: E731
        by_size = sorted(specs, key=lambda s: -s.nbytes)
        steps = [(s, "slice") for s in by_size if sliceable(s, nw) and plan.tensors[s.name].placement != "slice"]
        steps += [(s, "interleave") for s in by_size if not sliceable(s, nw)]
        for s, new in steps:
            if fits():
                break
            _add(need, plan.tensors[s.name].need(plan), -1)
            put(s, new)
            _add(need, plan.tensors[s.name].need(plan))
    return plan


def plan_for_pool(specs: Sequence[TensorSpec], weights_mode: str | None, pool: Any, *,
                  kv: KVRequest | None = None, budget: int | Mapping[int, int] | None = None,
                  topology: Topology | None = None) -> PlacementPlan:
    """``make_plan`` for a live ``WorkerPool`` (or anything with ``workers`` and ``topology``)."""
    return make_plan(specs, weights_mode, pool.workers, topology or pool.topology, kv=kv, budget=budget)


__all__ = ["BudgetError", "KVPlan", "KVRequest", "Piece", "PlacementPlan", "TensorPlan", "TensorSpec",
           "WorkerSlot", "as_workers", "expert_owners", "free_memory", "make_plan", "plan_for_pool",
           "row_split", "sliceable"]

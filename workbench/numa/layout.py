"""Weight and KV-cache placement modes, the row split shared with the engine, and loading.

Per tensor, a placement is one of:
  mirror     - a full copy in every node's arena (each bound to its node)
  slice      - each node's arena holds the rows its own workers compute (``row_split``)
  interleave - one copy, pages round-robin over the nodes in use
  none       - one copy, OS default policy (first touch by the loader)
Weight modes set every tensor to one placement (``slice`` mirrors tensors too small
to split); ``auto`` picks per tensor within a memory budget: everything mirrored if it
fits, else the biggest tensors sliced first, then small leftovers interleaved.

Memory comes in a few big arenas (one per node, plus one interleaved and one default)
instead of one mapping per tensor; each tensor is a 64-byte aligned piece of an arena.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from . import syscalls as sc
from .budget import BudgetError, check_need, fmt_bytes, free_per_node
from .modes import kv_node, parse_kv, parse_weights
from .memory import DEFAULT, PAGE, THP_SIZE, PlacedBuffer, Policy, alloc, first_touch, migrate
from .topology import Topology, load_topology

if TYPE_CHECKING:
    from .workers import WorkerPool

ROW_ALIGN = 4
PIECE_ALIGN = 64


@dataclass(frozen=True)
class TensorSpec:
    """One weight tensor: ``rows`` output rows of ``row_bytes`` bytes (GGUF block layout)."""

    name: str
    rows: int
    row_bytes: int
    experts: int = 1  # a 3-D expert tensor: ``rows`` = experts x rows per expert (expert e first)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class ProgressEvent:
    stage: str            # 'plan' | 'load' | 'switch' | 'kv'
    done: int = 0         # bytes
    total: int = 0
    bytes_per_s: float = 0.0
    message: str = ""


Progress = Callable[[ProgressEvent], None]


def row_split(rows: int, workers: int | Sequence[float]) -> list[tuple[int, int]]:
    """Split ``rows`` into consecutive ranges, one per worker, in worker order.

    ``workers`` is a count (equal shares) or relative weights. Boundaries fall on
    multiples of 4 rows when every worker can get at least 4; ranges may be empty
    when rows < workers. Since the pool numbers the workers of one node
    consecutively, each node's rows form one consecutive block. The engine calls
    ``row_split(rows, pool.n_threads)``; slice mode places rows with the same call.
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


def node_ranges(rows: int, pool: "WorkerPool") -> dict[int, tuple[int, int]]:
    """The consecutive row block each node's workers compute under ``row_split``."""
    split = row_split(rows, pool.n_threads)
    out: dict[int, tuple[int, int]] = {}
    for w, (lo, hi) in zip(pool.workers, split):
        a, b = out.get(w.node, (lo, hi))
        out[w.node] = (min(a, lo), max(b, hi))
    return out


def sliceable(spec: TensorSpec, n_workers: int) -> bool:
    """Big enough that every worker gets whole 4-row blocks; smaller tensors are mirrored."""
    return spec.rows > 1 and spec.rows >= ROW_ALIGN * n_workers


# ---------------------------------------------------------------------------
# planning and budget


def _live(topology: Topology) -> Topology:
    """Fresh free-memory numbers for the live machine; fixtures stay as they are."""
    return load_topology() if topology.root == "/" else topology


def _budget_free(topology: Topology, budget: int | Mapping[int, int] | None) -> dict[int, int]:
    if budget is None:
        return free_per_node(_live(topology))
    if isinstance(budget, int):
        return {n.id: budget for n in topology.nodes}
    return dict(budget)


def _loader_node(topology: Topology) -> int:
    r = sc.getcpu()
    return topology.node_of(r.value[0]) if r else topology.nodes[0].id


def _tensor_need(spec: TensorSpec, placement: str, pool: "WorkerPool", topology: Topology) -> dict[int, int]:
    nodes = pool.nodes
    if placement == "mirror":
        return {n: spec.nbytes for n in nodes}
    if placement == "slice":
        return {n: (hi - lo) * spec.row_bytes for n, (lo, hi) in node_ranges(spec.rows, pool).items()}
    if placement == "interleave":
        share = math.ceil(spec.nbytes / len(nodes))
        return {n: share for n in nodes}
    return {_loader_node(topology): spec.nbytes}


def _add(need: dict[int, int], more: Mapping[int, int], sign: int = 1) -> None:
    for k, v in more.items():
        need[k] = need.get(k, 0) + sign * v


def plan_weights(specs: Sequence[TensorSpec], mode: str, pool: "WorkerPool", topology: Topology,
                 free: Mapping[int, int] | None = None) -> tuple[dict[str, str], dict[int, int]]:
    """Placement per tensor and the bytes needed per node (``free`` only matters for auto)."""
    parse_weights(mode)
    nw = pool.n_threads
    if mode == "slice":
        placement = {s.name: "slice" if sliceable(s, nw) else "mirror" for s in specs}
    elif mode == "auto":
        placement = {s.name: "mirror" for s in specs}
    else:
        placement = {s.name: mode for s in specs}
    need: dict[int, int] = {}
    for s in specs:
        _add(need, _tensor_need(s, placement[s.name], pool, topology))
    if mode == "auto":
        free = free if free is not None else free_per_node(_live(topology))
        fits = lambda: all(v <= free.get(k, 0) for k, v in need.items())  # noqa: E731
        steps = [(s, "slice") for s in sorted(specs, key=lambda s: -s.nbytes) if sliceable(s, nw)]
        steps += [(s, "interleave") for s in sorted(specs, key=lambda s: -s.nbytes) if not sliceable(s, nw)]
        for s, new in steps:
            if fits():
                break
            _add(need, _tensor_need(s, placement[s.name], pool, topology), -1)
            placement[s.name] = new
            _add(need, _tensor_need(s, new, pool, topology))
    return placement, need


def kv_need(n_layers: int, bytes_per_layer_per_worker: int | Sequence[int], mode: str,
            pool: "WorkerPool") -> dict[int, int]:
    """Bytes of KV cache per node for ``mode``."""
    per_worker = _kv_sizes(bytes_per_layer_per_worker, pool.n_threads)
    total = n_layers * sum(per_worker)
    if mode == "first-touch":
        need: dict[int, int] = {}
        for w, b in zip(pool.workers, per_worker):
            need[w.node] = need.get(w.node, 0) + n_layers * b
        return need
    if mode == "interleave":
        return {n: math.ceil(total / len(pool.nodes)) for n in pool.nodes}
    return {_kv_node(mode): total}


def check_plan(specs: Sequence[TensorSpec], weights_mode: str, pool: "WorkerPool",
               n_layers: int = 0, kv_bytes_per_layer_per_worker: int | Sequence[int] = 0,
               kv_mode: str = "first-touch", topology: Topology | None = None,
               budget: int | Mapping[int, int] | None = None) -> dict[int, int]:
    """Check weights + KV together before allocating either; returns need per node."""
    topo = topology or pool.topology
    free = _budget_free(topo, budget)
    kv = kv_need(n_layers, kv_bytes_per_layer_per_worker, kv_mode, pool) if n_layers else {}
    room = {k: v - kv.get(k, 0) for k, v in free.items()}
    _, need = plan_weights(specs, weights_mode, pool, topo, room)
    _add(need, kv)
    check_need(need, topo, f"weights '{weights_mode}' + KV '{kv_mode}'", free=free)
    return need


# ---------------------------------------------------------------------------
# weights


@dataclass(frozen=True)
class _Piece:
    arena: str       # 'node<N>' | 'interleave' | 'default'
    node: int | None  # node whose workers read this piece (None: everyone)
    lo: int
    hi: int
    offset: int


class WeightLayout:
    """Where every weight tensor lives; ``array_for`` gives a worker its local copy."""

    def __init__(self, specs: Sequence[TensorSpec], mode: str, placement: Mapping[str, str],
                 pool: "WorkerPool", thp: bool = True, hugetlb_kb: int | None = None):
        self.mode = mode
        self.specs = {s.name: s for s in specs}
        self.placement = dict(placement)
        self.pool = pool
        self.nodes = pool.nodes
        self.worker_node = [w.node for w in pool.workers]
        self.thp, self.hugetlb_kb = thp, hugetlb_kb
        self.switch_seconds: float | None = None
        self.switch_method = ""
        self._pieces: dict[str, list[_Piece]] = {}
        sizes: dict[str, int] = {}

        def put(arena: str, node: int | None, spec: TensorSpec, lo: int, hi: int) -> None:
            off = sizes.get(arena, 0)
            self._pieces.setdefault(spec.name, []).append(_Piece(arena, node, lo, hi, off))
            sizes[arena] = off + (-(-(hi - lo) * spec.row_bytes // PIECE_ALIGN)) * PIECE_ALIGN

        for s in specs:
            p = self.placement[s.name]
            if p == "mirror":
                for n in self.nodes:
                    put(f"node{n}", n, s, 0, s.rows)
            elif p == "slice":
                for n, (lo, hi) in node_ranges(s.rows, pool).items():
                    put(f"node{n}", n, s, lo, hi)
            else:
                put("interleave" if p == "interleave" else "default", None, s, 0, s.rows)
        self._arenas: dict[str, PlacedBuffer] = {}
        for key, size in sizes.items():
            self._arenas[key] = alloc(size, self._arena_policy(key), label=self._arena_label(key),
                                      kind="weights", thp=thp, hugetlb_kb=hugetlb_kb,
                                      topology=pool.topology)
        self._index()

    def _arena_policy(self, key: str) -> Policy:
        if key.startswith("node"):
            return Policy("bind", (int(key[4:]),))
        if key == "interleave":
            return Policy("interleave", tuple(self.nodes))
        return DEFAULT

    def _arena_label(self, key: str) -> str:
        if key == "interleave":
            return f"weights interleave (nodes {','.join(map(str, self.nodes))})"
        if key == "default":
            return "weights none (OS default)"
        n = int(key[4:])
        kinds = {self.placement[name] for name, ps in self._pieces.items() for p in ps if p.arena == key}
        if kinds == {"mirror"}:
            return f"weights mirror replica {self.nodes.index(n)} (node {n})"
        if kinds == {"slice"} or self.mode == "slice":
            return f"weights slice node {n}"
        return f"weights {'+'.join(sorted(kinds))} node {n}"

    def _index(self) -> None:
        """Cache (view, first row) per tensor and node so array_for is two dict lookups."""
        self._views: dict[str, dict[int | None, tuple[np.ndarray, int]]] = {}
        for name, pieces in self._pieces.items():
            s = self.specs[name]
            d: dict[int | None, tuple[np.ndarray, int]] = {}
            for p in pieces:
                a = self._arenas[p.arena].array
                n = (p.hi - p.lo) * s.row_bytes
                d[p.node] = (a[p.offset:p.offset + n].reshape(p.hi - p.lo, s.row_bytes), p.lo)
            self._views[name] = d

    # ---- engine API ----------------------------------------------------
    def array_for(self, name: str, worker: int) -> tuple[np.ndarray, int]:
        """uint8 [rows_held, row_bytes] that ``worker`` reads, and the first row it holds."""
        d = self._views[name]
        v = d.get(None)
        return v if v is not None else d[self.worker_node[worker]]

    def expert_rows(self, name: str, worker: int, expert: int) -> tuple[np.ndarray, int]:
        """uint8 [rows, row_bytes]: the rows of ``expert`` (rows [e*n, (e+1)*n) of the tensor
        viewed as 2-D, n = rows per expert) that ``worker`` reads, and the index within the
        expert of the first one. The runtime has worker w compute rows ``row_split(n,
        n_workers)[w]`` of every routed expert; the array returned must hold them.

        Today's body serves the whole expert from the worker's own copy when it holds it, else
        from any copy that does (a tensor-wide slice may put the expert on another node, or split
        it between two: then a joined copy, made once per layout).
        """
        s = self.specs[name]
        per = s.rows // max(s.experts, 1)
        lo, hi = expert * per, (expert + 1) * per
        if not 0 <= expert < max(s.experts, 1):
            raise IndexError(f"{name}: expert {expert} outside [0, {s.experts})")
        arr, first = self.array_for(name, worker)
        if first <= lo and hi <= first + arr.shape[0]:
            return arr[lo - first:hi - first], 0
        for arr, first in self._views[name].values():
            if first <= lo and hi <= first + arr.shape[0]:
                return arr[lo - first:hi - first], 0
        joined = getattr(self, "_joined", None)
        if joined is None:
            joined = self._joined = {}
        key = (name, expert)
        if key not in joined:
            joined[key] = np.ascontiguousarray(self.rows(name, lo, hi))
        return joined[key], 0

    def full_array(self, name: str) -> np.ndarray | None:
        """A complete copy (the caller's node's replica when mirrored), else None."""
        d = self._views[name]
        rows = self.specs[name].rows
        if None in d:
            return d[None][0]
        r = sc.getcpu()
        here = self.pool.topology.node_of(r.value[0]) if r else None
        for node in ([here] if here in d else []) + list(d):
            arr, lo = d[node]
            if lo == 0 and arr.shape[0] == rows:
                return arr
        return None

    def rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) from whichever copy holds them (a view when one piece has them all)."""
        full = self.full_array(name)
        if full is not None:
            return full[lo:hi]
        parts = []
        for arr, first in sorted(self._views[name].values(), key=lambda t: t[1]):
            a, b = max(lo, first), min(hi, first + arr.shape[0])
            if a < b:
                parts.append(arr[a - first:b - first])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def write_rows(self, name: str, row_lo: int, data: np.ndarray) -> None:
        """Write rows [row_lo, row_lo+n) into every copy that holds them."""
        s = self.specs[name]
        src = np.asarray(data, dtype=np.uint8).reshape(-1, s.row_bytes)
        row_hi = row_lo + src.shape[0]
        if row_lo < 0 or row_hi > s.rows:
            raise ValueError(f"{name}: rows [{row_lo}, {row_hi}) outside [0, {s.rows})")
        for arr, first in self._views[name].values():
            a, b = max(row_lo, first), min(row_hi, first + arr.shape[0])
            if a < b:
                arr[a - first:b - first] = src[a - row_lo:b - row_lo]

    def dest_views(self, name: str) -> list[tuple[int, np.ndarray]]:
        """(first row, view) the loader fills from the file; other replicas follow by ``replicate``."""
        seen: set[tuple[int, int]] = set()
        out = []
        for arr, first in self._views[name].values():
            key = (first, first + arr.shape[0])
            if key not in seen and arr.shape[0]:
                seen.add(key)
                out.append((first, arr))
        return out

    def replicate(self, name: str) -> None:
        """Copy the loaded primary into the other replicas (memory to memory)."""
        primaries = {id(a) for _, a in self.dest_views(name)}
        src = {first: a for first, a in self.dest_views(name)}
        for arr, first in self._views[name].values():
            if id(arr) not in primaries and arr.shape[0]:
                np.copyto(arr, src[first])

    def load(self, path: str | os.PathLike[str], offsets: Mapping[str, int | tuple[str, int]],
             progress: Progress | None = None) -> float:
        """Read every tensor from ``path`` (tensor data at ``offsets[name]``) with large
        sequential reads straight into its placed memory; returns seconds taken.
        ``offsets[name]`` may be ``(file, offset)`` for a tensor in another file (a split model's
        part): each tensor is read straight from its own file."""
        total = sum(s.nbytes for s in self.specs.values())
        t0 = time.perf_counter()
        done = 0

        def step(n: int) -> None:
            nonlocal done
            done += n
            if progress:
                dt = time.perf_counter() - t0
                progress(ProgressEvent("load", done, total, done / dt if dt > 0 else 0.0))

        fds = {os.fspath(path): os.open(path, os.O_RDONLY)}
        try:
            for name, s in self.specs.items():
                where = offsets[name]
                file, off = (os.fspath(where[0]), where[1]) if isinstance(where, tuple) else (os.fspath(path), where)
                if file not in fds:
                    fds[file] = os.open(file, os.O_RDONLY)
                for first, view in self.dest_views(name):
                    read_into(fds[file], off + first * s.row_bytes, view, step)
                self.replicate(name)
        finally:
            for fd in fds.values():
                os.close(fd)
        return time.perf_counter() - t0

    def buffers(self) -> list[PlacedBuffer]:
        return list(self._arenas.values())

    def bytes_per_node(self) -> dict[int, int]:
        """Bytes placed per node by policy (the OS-default arena is not counted)."""
        out: dict[int, int] = {}
        for b in self._arenas.values():
            for n in b.policy.nodes:
                out[n] = out.get(n, 0) + b.nbytes // len(b.policy.nodes)
        return out

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for p in self.placement.values():
            counts[p] = counts.get(p, 0) + 1
        per = ", ".join(f"node {n} {fmt_bytes(v)}" for n, v in self.bytes_per_node().items())
        return (f"weights {self.mode}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                + (f" ({per})" if per else ""))

    def close(self) -> None:
        self._views = {}
        self._joined = {}
        for b in self._arenas.values():
            b.close()
        self._arenas = {}


def place_weights(specs: Sequence[TensorSpec], mode: str, pool: "WorkerPool",
                  topology: Topology | None = None, budget: int | Mapping[int, int] | None = None,
                  progress: Progress | None = None, *, thp: bool = True,
                  hugetlb_kb: int | None = None) -> WeightLayout:
    """Plan, check the budget per node (refusing before allocating), and allocate.

    ``budget``: bytes per node (int or {node: bytes}); default: free memory per node.
    Memory is not touched here; ``WeightLayout.load``/``write_rows`` fill it.
    """
    topo = topology or pool.topology
    free = _budget_free(topo, budget)
    placement, need = plan_weights(specs, mode, pool, topo, free)
    check_need(need, topo, f"weights mode '{mode}'", free=free)
    layout = WeightLayout(specs, mode, placement, pool, thp=thp, hugetlb_kb=hugetlb_kb)
    if progress:
        progress(ProgressEvent("plan", 0, sum(need.values()), message=layout.summary()))
    return layout


def _single_copy_arena(layout: WeightLayout) -> str | None:
    """Arena that holds every tensor complete and at distinct offsets, if there is one."""
    if layout.mode in ("none", "interleave"):
        return "default" if layout.mode == "none" else "interleave"
    if layout.mode == "mirror":
        return f"node{layout.nodes[0]}"
    return None


def switch_weights(layout: WeightLayout, new_mode: str, pool: "WorkerPool | None" = None,
                   progress: Progress | None = None, budget: int | Mapping[int, int] | None = None
                   ) -> WeightLayout:
    """Change the weights mode without touching the disk; the old layout is closed.

    Fast path (same pool, target none/interleave/mirror from a layout with one full
    copy): migrate that copy's pages in place (mbind MPOL_MF_MOVE) and build or drop
    replicas from memory. Otherwise: allocate the new layout and copy from the old.
    ``switch_seconds`` and ``switch_method`` on the result report what happened.
    """
    pool = pool or layout.pool
    topo = pool.topology
    specs = list(layout.specs.values())
    t0 = time.perf_counter()
    src_key = _single_copy_arena(layout)
    same_pool = pool is layout.pool
    total = sum(s.nbytes for s in specs)
    if same_pool and new_mode == layout.mode and new_mode != "auto":
        layout.switch_seconds, layout.switch_method = 0.0, "unchanged"
        return layout
    if same_pool and src_key and new_mode in ("none", "interleave", "mirror"):
        placement = {s.name: new_mode for s in specs}
        new = WeightLayout.__new__(WeightLayout)
        new.mode, new.specs, new.placement, new.pool = new_mode, layout.specs, placement, pool
        new.nodes, new.worker_node = layout.nodes, layout.worker_node
        new.thp, new.hugetlb_kb = layout.thp, layout.hugetlb_kb
        src = layout._arenas[src_key]
        key = {"none": "default", "interleave": "interleave"}.get(new_mode, f"node{layout.nodes[0]}")
        extra = {n: src.map_len for n in layout.nodes[1:]} if new_mode == "mirror" else {}
        if extra:
            check_need(extra, topo, f"weights switch to '{new_mode}'", free=_budget_free(topo, budget))
        new._pieces = {name: [_Piece(key, None if new_mode != "mirror" else layout.nodes[0], p.lo, p.hi,
                                     p.offset)]
                       for name, ps in layout._pieces.items() for p in ps if p.arena == src_key}
        new._arenas = {}
        res = migrate(src, new._arena_policy(key), intended=() if new_mode == "none" else None)
        if not res.ok:
            src.note = res.reason
        new._arenas[key] = src
        src.label = new._arena_label(key)
        method = [f"{res.method} migrate {fmt_bytes(src.nbytes)} in place ({res.seconds:.3f} s)"]
        if new_mode == "mirror":
            for k, n in enumerate(layout.nodes[1:], start=1):
                nk = f"node{n}"
                b = alloc(src.nbytes, Policy("bind", (n,)), label=f"weights mirror replica {k} (node {n})",
                          kind="weights", thp=layout.thp, hugetlb_kb=layout.hugetlb_kb, topology=topo)
                np.copyto(b.array, src.array)
                new._arenas[nk] = b
                for name in new._pieces:
                    p0 = new._pieces[name][0]
                    new._pieces[name].append(_Piece(nk, n, p0.lo, p0.hi, p0.offset))
                if progress:
                    progress(ProgressEvent("switch", k * src.nbytes, (len(layout.nodes) - 1) * src.nbytes))
            method.append(f"copied {len(layout.nodes) - 1} replica(s) from memory")
        for k2, b in layout._arenas.items():
            if k2 != src_key:
                b.close()
        layout._arenas = {}
        layout._views = {}
        new._index()
    else:
        free = _budget_free(topo, budget)
        placement, need = plan_weights(specs, new_mode, pool, topo, free)
        check_need(need, topo, f"weights switch to '{new_mode}' (old copy is freed after)", free=free)
        new = WeightLayout(specs, new_mode, placement, pool, thp=layout.thp, hugetlb_kb=layout.hugetlb_kb)
        done = 0
        for s in specs:
            for first, view in new.dest_views(s.name):
                np.copyto(view, layout.rows(s.name, first, first + view.shape[0]))
                done += view.nbytes
            new.replicate(s.name)
            if progress:
                progress(ProgressEvent("switch", done, total))
        layout.close()
        method = [f"copied {fmt_bytes(total)} from memory into a new '{new_mode}' layout"]
    new.switch_seconds = time.perf_counter() - t0
    new.switch_method = "; ".join(method)
    if progress:
        progress(ProgressEvent("switch", total, total,
                               message=f"{layout.mode} -> {new_mode} in {new.switch_seconds:.3f} s: "
                                       + new.switch_method))
    return new


# ---------------------------------------------------------------------------
# loading


def read_into(src: int | str | os.PathLike[str], offset: int, dest: np.ndarray,
              progress: Callable[[int], None] | None = None,
              chunk: int = 32 << 20) -> int:
    """Fill ``dest`` from file ``src`` (fd or path) at ``offset`` with large preadv calls.

    No mapping of the file is involved, so there are no 4 KiB page faults on the
    source and readahead works. ``progress(n_bytes)`` is called after each chunk
    with the bytes just read; callers that want bytes/s wrap it (see WeightLayout.load).
    """
    fd = src if isinstance(src, int) else os.open(src, os.O_RDONLY)
    try:
        mv = memoryview(dest.reshape(-1)).cast("B")
        total = len(mv)
        done = 0
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, offset, total, os.POSIX_FADV_SEQUENTIAL)
        while done < total:
            n = os.preadv(fd, [mv[done:done + chunk]], offset + done)
            if n <= 0:
                raise EOFError(f"file ended at offset {offset + done}, {total - done} bytes short")
            done += n
            if progress:
                progress(n)
        return done
    finally:
        if not isinstance(src, int):
            os.close(fd)


# ---------------------------------------------------------------------------
# KV cache


def _kv_sizes(b: int | Sequence[int], n: int) -> list[int]:
    sizes = [int(b)] * n if isinstance(b, int) else [int(x) for x in b]
    if len(sizes) != n:
        raise ValueError(f"{len(sizes)} KV sizes for {n} workers")
    return sizes


def _kv_node(mode: str) -> int:
    return kv_node(parse_kv(mode))


class KVLayout:
    """KV cache: each worker owns a contiguous region holding its part of every layer.

    ``first-touch``: one arena per node with default policy; each worker zero-fills its
    own region (region starts are huge-page aligned so a THP never spans two owners).
    ``interleave`` / ``node:N``: one arena with that policy.
    """

    def __init__(self, n_layers: int, bytes_per_layer_per_worker: int | Sequence[int], mode: str,
                 pool: "WorkerPool", thp: bool = True, hugetlb_kb: int | None = None):
        self.mode, self.n_layers, self.pool = mode, n_layers, pool
        self.sizes = _kv_sizes(bytes_per_layer_per_worker, pool.n_threads)
        gran = hugetlb_kb * 1024 if hugetlb_kb else (THP_SIZE if thp else PAGE)
        if mode != "first-touch" and mode != "interleave":
            _kv_node(mode)
        # region offsets inside each arena
        groups: dict[str, list[int]] = {}
        for w in pool.workers:
            key = f"node{w.node}" if mode == "first-touch" else "kv"
            groups.setdefault(key, []).append(w.index)
        self._region: dict[int, tuple[str, int]] = {}
        self._arenas: dict[str, PlacedBuffer] = {}
        for key, idxs in groups.items():
            off = 0
            for i in idxs:
                self._region[i] = (key, off)
                size = n_layers * self.sizes[i]
                off += -(-size // gran) * gran if mode == "first-touch" else -(-size // PIECE_ALIGN) * PIECE_ALIGN
            if mode == "first-touch":
                node = int(key[4:])
                policy, intended, label = DEFAULT, (node,), f"kv first-touch node {node}"
            elif mode == "interleave":
                policy = Policy("interleave", tuple(pool.nodes))
                intended, label = policy.nodes, f"kv interleave (nodes {','.join(map(str, pool.nodes))})"
            else:
                policy = Policy("bind", (_kv_node(mode),))
                intended, label = policy.nodes, f"kv node {policy.nodes[0]}"
            self._arenas[key] = alloc(max(off, 1), policy, label=label, kind="kv", thp=thp,
                                      hugetlb_kb=hugetlb_kb, intended=intended, topology=pool.topology)
        self._views = [[self._view(i, layer) for layer in range(n_layers)] for i in range(pool.n_threads)]
        if mode == "first-touch":
            for key, buf in self._arenas.items():
                ranges = [(0, 0)] * pool.n_threads
                for i in groups[key]:
                    off = self._region[i][1]
                    ranges[i] = (off, off + n_layers * self.sizes[i])
                first_touch(buf.array, ranges, pool)

    def _view(self, worker: int, layer: int) -> np.ndarray:
        key, off = self._region[worker]
        b = self.sizes[worker]
        start = off + layer * b
        return self._arenas[key].array[start:start + b]

    def array_for(self, layer: int, worker: int) -> np.ndarray:
        """uint8 [bytes_per_layer_per_worker] of ``worker``'s KV for ``layer``."""
        return self._views[worker][layer]

    def worker_region(self, worker: int) -> np.ndarray:
        key, off = self._region[worker]
        return self._arenas[key].array[off:off + self.n_layers * self.sizes[worker]]

    def buffers(self) -> list[PlacedBuffer]:
        return list(self._arenas.values())

    def close(self) -> None:
        self._views = []
        for b in self._arenas.values():
            b.close()
        self._arenas = {}


def place_kv(n_layers: int, bytes_per_layer_per_worker: int | Sequence[int], mode: str,
             pool: "WorkerPool", *, budget: int | Mapping[int, int] | None = None, thp: bool = True,
             hugetlb_kb: int | None = None) -> KVLayout:
    """Check the KV need per node against the budget, then allocate (and first-touch) it."""
    need = kv_need(n_layers, bytes_per_layer_per_worker, mode, pool)
    check_need(need, pool.topology, f"KV cache '{mode}'", free=_budget_free(pool.topology, budget))
    return KVLayout(n_layers, bytes_per_layer_per_worker, mode, pool, thp=thp, hugetlb_kb=hugetlb_kb)


__all__ = [
    "BudgetError", "KVLayout", "ProgressEvent", "TensorSpec", "WeightLayout", "check_plan", "kv_need",
    "node_ranges", "place_kv", "place_weights", "plan_weights", "read_into", "row_split", "sliceable",
    "switch_weights",
]

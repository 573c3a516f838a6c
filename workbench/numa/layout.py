"""Executing a placement plan: weight and KV-cache arenas, loading, live switches.

``workbench.numa.plan`` decides where every tensor's rows and the KV cache go and
checks that it fits; the classes here allocate exactly that plan. Memory comes in
a few big arenas (one per node, plus one interleaved and one default) instead of
one mapping per tensor; each tensor is a 64-byte aligned piece of an arena.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from . import syscalls as sc
from .budget import BudgetError, check_need, fmt_bytes
from .memory import DEFAULT, PAGE, THP_SIZE, PlacedBuffer, Policy, alloc, first_touch, migrate
from .modes import kv_node
from .plan import KVPlan, KVRequest, Piece, PlacementPlan, TensorSpec, plan_for_pool, row_split, sliceable

if TYPE_CHECKING:
    from .topology import Topology
    from .workers import WorkerPool

PIECE_ALIGN = 64


@dataclass(frozen=True)
class ProgressEvent:
    stage: str            # 'plan' | 'load' | 'switch' | 'kv'
    done: int = 0         # bytes
    total: int = 0
    bytes_per_s: float = 0.0
    message: str = ""


Progress = Callable[[ProgressEvent], None]


# ---------------------------------------------------------------------------
# weights


@dataclass(frozen=True)
class _Placed:
    """A plan piece at its offset in its arena."""
    piece: Piece
    offset: int


class WeightLayout:
    """A placement plan's weights in memory; ``array_for`` gives a worker its local copy."""

    def __init__(self, plan: PlacementPlan, pool: "WorkerPool", thp: bool = True,
                 hugetlb_kb: int | None = None):
        self.plan = plan
        self.mode = plan.weights_mode
        self.specs = {name: t.spec for name, t in plan.tensors.items()}
        self.placement = {name: t.placement for name, t in plan.tensors.items()}
        self.pool = pool
        self.nodes = pool.nodes
        self.worker_node = [w.node for w in pool.workers]
        self.thp, self.hugetlb_kb = thp, hugetlb_kb
        self.switch_seconds: float | None = None
        self.switch_method = ""
        self._pieces: dict[str, list[_Placed]] = {}
        sizes: dict[str, int] = {}
        for name, t in plan.tensors.items():
            for p in t.pieces:
                off = sizes.get(p.arena, 0)
                self._pieces.setdefault(name, []).append(_Placed(p, off))
                sizes[p.arena] = off + (-(-p.nbytes(t.spec) // PIECE_ALIGN)) * PIECE_ALIGN
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
        kinds = {self.placement[name] for name, ps in self._pieces.items() for p in ps if p.piece.arena == key}
        if kinds == {"mirror"}:
            return f"weights mirror replica {self.nodes.index(n)} (node {n})"
        if kinds == {"slice"} or self.mode == "slice":
            return f"weights slice node {n}"
        return f"weights {'+'.join(sorted(kinds))} node {n}"

    def _view(self, name: str, pl: _Placed) -> np.ndarray:
        """The piece as uint8 [experts, rows, row_bytes]."""
        p, s = pl.piece, self.specs[name]
        n = p.nbytes(s)
        a = self._arenas[p.arena].array
        return a[pl.offset:pl.offset + n].reshape(p.g1 - p.g0, p.hi - p.lo, s.row_bytes)

    def _index(self) -> None:
        """Cache (view, first row) per tensor and node so array_for is two dict lookups."""
        self._views: dict[str, dict[int | None, tuple[np.ndarray, int]]] = {}
        self._experts: dict[str, dict[int | None, tuple[np.ndarray, int, int]]] = {}
        for name, pieces in self._pieces.items():
            s = self.specs[name]
            d: dict[int | None, tuple[np.ndarray, int]] = {}
            g: dict[int | None, tuple[np.ndarray, int, int]] = {}
            for pl in pieces:
                v = self._view(name, pl)
                p = pl.piece
                d[p.node] = (v.reshape(-1, s.row_bytes), p.lo)
                g[p.node] = (v, p.lo, p.g0)
            self._views[name] = d
            self._experts[name] = g

    # ---- engine API ----------------------------------------------------
    def array_for(self, name: str, worker: int) -> tuple[np.ndarray, int]:
        """uint8 [rows_held, row_bytes] that ``worker`` reads, and the first row it holds
        (dense tensors; expert tensors are read through ``expert_rows``)."""
        d = self._views[name]
        v = d.get(None)
        return v if v is not None else d[self.worker_node[worker]]

    def expert_rows(self, name: str, worker: int, expert: int) -> tuple[np.ndarray, int]:
        """uint8 [rows, row_bytes] of ``expert`` that ``worker`` reads, and the first row (within
        the expert) they start at: the worker's node's copy when it has one, else the owner's."""
        d = self._experts[name]
        if not 0 <= expert < self.specs[name].groups:
            raise IndexError(f"{name}: expert {expert} outside [0, {self.specs[name].groups})")
        v = d.get(None) or d.get(self.worker_node[worker])
        if v is None or not (v[2] <= expert < v[2] + v[0].shape[0]):
            v = next(x for x in d.values() if x[2] <= expert < x[2] + x[0].shape[0])
        arr, lo, g0 = v
        return arr[expert - g0], lo

    def expert_split(self, name: str, expert: int) -> list[tuple[int, int]]:
        """Rows of ``expert`` each worker computes: an expert owned whole by one node (weights
        mode ``experts``) by that node's workers alone, from their own memory; else every worker
        its ``row_split`` range (which ``slice`` placed on the worker's node)."""
        plan = self.plan
        rows = plan.tensors[name].spec.group_rows
        owner = plan.expert_node(name, expert)
        if owner is None:
            return row_split(rows, plan.n_workers)
        mine = plan.node_workers(owner)
        parts = iter(row_split(rows, len(mine)))
        return [next(parts) if w.index in mine else (0, 0) for w in plan.workers]

    def copies(self, name: str) -> list[tuple[np.ndarray, int, int, int | None]]:
        """Every placed piece of ``name`` (replicas included): uint8 [experts, rows, row_bytes], the
        first row (within each expert) and the first expert it holds, and its node (None:
        interleaved or the OS's choice); for rewriting a tensor's bytes in place."""
        return [(self._view(name, pl), pl.piece.lo, pl.piece.g0, pl.piece.node) for pl in self._pieces[name]
                if pl.piece.hi > pl.piece.lo and pl.piece.g1 > pl.piece.g0]

    def full_array(self, name: str) -> np.ndarray | None:
        """A complete copy (the caller's node's replica when mirrored), else None."""
        d = self._views[name]
        if None in d:
            return d[None][0]
        rows = self.specs[name].rows
        r = sc.getcpu()
        here = self.pool.topology.node_of(r.value[0]) if r else None
        for node in ([here] if here in d else []) + list(d):
            arr, lo = d[node]
            if lo == 0 and arr.shape[0] == rows:
                return arr
        return None

    def _segments(self, name: str, row_lo: int, row_hi: int):
        """(destination view, source row offset from row_lo) for every copy of rows [row_lo, row_hi)."""
        s = self.specs[name]
        gr = s.group_rows
        for pl in self._pieces[name]:
            v = self._view(name, pl)
            p = pl.piece
            for e in range(p.g0, p.g1):
                a, b = max(row_lo, e * gr + p.lo), min(row_hi, e * gr + p.hi)
                if a < b:
                    yield v[e - p.g0, a - e * gr - p.lo:b - e * gr - p.lo], a - row_lo, pl

    def rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) (of the tensor viewed as 2-D) from whichever copies hold them."""
        full = self.full_array(name)
        if full is not None:
            return full[lo:hi]
        out = np.empty((hi - lo, self.specs[name].row_bytes), dtype=np.uint8)
        for view, at, _ in self._segments(name, lo, hi):
            out[at:at + view.shape[0]] = view
        return out

    def write_rows(self, name: str, row_lo: int, data: np.ndarray) -> None:
        """Write rows [row_lo, row_lo+n) into every copy that holds them."""
        s = self.specs[name]
        src = np.asarray(data, dtype=np.uint8).reshape(-1, s.row_bytes)
        row_hi = row_lo + src.shape[0]
        if row_lo < 0 or row_hi > s.rows:
            raise ValueError(f"{name}: rows [{row_lo}, {row_hi}) outside [0, {s.rows})")
        for view, at, _ in self._segments(name, row_lo, row_hi):
            view[:] = src[at:at + view.shape[0]]

    def _primaries(self, name: str) -> list[_Placed]:
        """One piece per distinct part of the tensor: the loader fills these, ``replicate`` the rest."""
        seen: set[tuple[int, int, int, int]] = set()
        out = []
        for pl in self._pieces[name]:
            p = pl.piece
            key = (p.lo, p.hi, p.g0, p.g1)
            if key not in seen and p.hi > p.lo and p.g1 > p.g0:
                seen.add(key)
                out.append(pl)
        return out

    def replicate(self, name: str) -> None:
        """Copy the loaded primaries into the other replicas (memory to memory)."""
        prim = {(pl.piece.lo, pl.piece.hi, pl.piece.g0, pl.piece.g1): pl for pl in self._primaries(name)}
        for pl in self._pieces[name]:
            p = pl.piece
            src = prim.get((p.lo, p.hi, p.g0, p.g1))
            if src is not None and src is not pl:
                np.copyto(self._view(name, pl), self._view(name, src))

    def fill_from(self, name: str, read: Callable[[int, int, np.ndarray], None]) -> None:
        """Fill every copy of ``name``: ``read(row_lo, row_hi, dest)`` writes rows of the 2-D tensor
        into ``dest`` (one call per expert piece), then replicas are copied from memory."""
        gr = self.specs[name].group_rows
        for pl in self._primaries(name):
            p, v = pl.piece, self._view(name, pl)
            if p.lo == 0 and p.hi == gr:  # whole experts: one contiguous run of rows
                read(p.g0 * gr, p.g1 * gr, v.reshape(-1, v.shape[-1]))
            else:
                for e in range(p.g0, p.g1):
                    read(e * gr + p.lo, e * gr + p.hi, v[e - p.g0])
        self.replicate(name)

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
                self.fill_from(name, lambda lo, hi, dest, fd=fds[file], off=off, s=s:
                               read_into(fd, off + lo * s.row_bytes, dest, step))
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
        self._experts = {}
        for b in self._arenas.values():
            b.close()
        self._arenas = {}


def place_weights(specs: Sequence[TensorSpec], mode: str, pool: "WorkerPool",
                  topology: "Topology | None" = None, budget: int | Mapping[int, int] | None = None,
                  progress: Progress | None = None, *, thp: bool = True,
                  hugetlb_kb: int | None = None) -> WeightLayout:
    """Plan, check the budget per node (refusing before allocating), and allocate.

    ``budget``: bytes per node (int or {node: bytes}); default: free memory per node.
    Memory is not touched here; ``WeightLayout.load``/``write_rows`` fill it.
    """
    plan = plan_for_pool(specs, mode, pool, budget=budget, topology=topology)
    plan.check(f"weights mode '{mode}'")
    return execute_weights(plan, pool, progress, thp=thp, hugetlb_kb=hugetlb_kb)


def execute_weights(plan: PlacementPlan, pool: "WorkerPool", progress: Progress | None = None, *,
                    thp: bool = True, hugetlb_kb: int | None = None) -> WeightLayout:
    """Allocate the weights of an already checked plan, exactly as planned."""
    layout = WeightLayout(plan, pool, thp=thp, hugetlb_kb=hugetlb_kb)
    if progress:
        progress(ProgressEvent("plan", 0, sum(plan.weights_need().values()), message=layout.summary()))
    return layout


def _single_copy_arena(layout: WeightLayout) -> str | None:
    """Arena that holds every tensor complete and at distinct offsets, if there is one."""
    if layout.mode in ("none", "interleave"):
        return "default" if layout.mode == "none" else "interleave"
    if layout.mode == "mirror":
        return f"node{layout.nodes[0]}"
    return None


def switch_weights(layout: WeightLayout, new: "str | PlacementPlan", pool: "WorkerPool | None" = None,
                   progress: Progress | None = None, budget: int | Mapping[int, int] | None = None
                   ) -> WeightLayout:
    """Change the weights to a new mode (or a ready plan) without touching the disk; the old
    layout is closed.

    Fast path (same pool, target none/interleave/mirror from a layout with one full
    copy): migrate that copy's pages in place (mbind MPOL_MF_MOVE) and build or drop
    replicas from memory; only the new replicas are checked against free memory. Otherwise
    the whole new plan is checked, allocated and filled from the old copy, which is freed after.
    ``switch_seconds`` and ``switch_method`` on the result report what happened.
    """
    pool = pool or layout.pool
    topo = pool.topology
    specs = list(layout.specs.values())
    plan = new if isinstance(new, PlacementPlan) else plan_for_pool(specs, new, pool, budget=budget)
    new_mode = plan.weights_mode
    t0 = time.perf_counter()
    src_key = _single_copy_arena(layout)
    same_pool = pool is layout.pool
    total = sum(s.nbytes for s in specs)
    if same_pool and new_mode == layout.mode and new_mode != "auto":
        layout.switch_seconds, layout.switch_method = 0.0, "unchanged"
        return layout
    if same_pool and src_key and new_mode in ("none", "interleave", "mirror"):
        key = {"none": "default", "interleave": "interleave"}.get(new_mode, f"node{layout.nodes[0]}")
        src = layout._arenas[src_key]
        extra = {n: src.map_len for n in layout.nodes[1:]} if new_mode == "mirror" else {}
        if extra:
            check_need(extra, topo, f"weights switch to '{new_mode}'", free=plan.free)
        out = WeightLayout.__new__(WeightLayout)
        out.plan, out.mode, out.specs, out.pool = plan, new_mode, layout.specs, pool
        out.placement = {name: t.placement for name, t in plan.tensors.items()}
        out.nodes, out.worker_node = layout.nodes, layout.worker_node
        out.thp, out.hugetlb_kb = layout.thp, layout.hugetlb_kb
        # the old single copy keeps its offsets; it becomes the new arena `key`
        old_off = {name: next(pl.offset for pl in ps if pl.piece.arena == src_key)
                   for name, ps in layout._pieces.items()}
        out._pieces = {name: [_Placed(p, old_off[name]) for p in t.pieces if p.arena == key]
                       for name, t in plan.tensors.items()}
        out._arenas = {}
        res = migrate(src, out._arena_policy(key), intended=() if new_mode == "none" else None)
        if not res.ok:
            src.note = res.reason
        out._arenas[key] = src
        src.label = out._arena_label(key)
        method = [f"{res.method} migrate {fmt_bytes(src.nbytes)} in place ({res.seconds:.3f} s)"]
        if new_mode == "mirror":
            for k, n in enumerate(layout.nodes[1:], start=1):
                nk = f"node{n}"
                b = alloc(src.nbytes, Policy("bind", (n,)), label=f"weights mirror replica {k} (node {n})",
                          kind="weights", thp=layout.thp, hugetlb_kb=layout.hugetlb_kb, topology=topo)
                np.copyto(b.array, src.array)
                out._arenas[nk] = b
                for name, t in plan.tensors.items():
                    out._pieces[name] += [_Placed(p, old_off[name]) for p in t.pieces if p.arena == nk]
                if progress:
                    progress(ProgressEvent("switch", k * src.nbytes, (len(layout.nodes) - 1) * src.nbytes))
            method.append(f"copied {len(layout.nodes) - 1} replica(s) from memory")
        for k2, b in layout._arenas.items():
            if k2 != src_key:
                b.close()
        layout._arenas = {}
        layout._views = {}
        out._index()
    else:
        plan.check(f"weights switch to '{new_mode}' (old copy is freed after)")
        out = WeightLayout(plan, pool, thp=layout.thp, hugetlb_kb=layout.hugetlb_kb)
        done = 0
        for s in specs:
            out.fill_from(s.name, lambda lo, hi, dest, name=s.name: np.copyto(
                dest, layout.rows(name, lo, hi).reshape(dest.shape)))
            done += s.nbytes
            if progress:
                progress(ProgressEvent("switch", done, total))
        layout.close()
        method = [f"copied {fmt_bytes(total)} from memory into a new '{new_mode}' layout"]
    out.switch_seconds = time.perf_counter() - t0
    out.switch_method = "; ".join(method)
    if progress:
        progress(ProgressEvent("switch", total, total,
                               message=f"{layout.mode} -> {new_mode} in {out.switch_seconds:.3f} s: "
                                       + out.switch_method))
    return out


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


class KVLayout:
    """A planned KV cache in memory: each worker owns a contiguous region holding its part of
    every layer (only the first worker of each node owns positions; the others hold 0 bytes).

    ``first-touch``: one arena per node with default policy; each worker zero-fills its
    own region (region starts are huge-page aligned so a THP never spans two owners).
    ``interleave`` / ``node:N``: one arena with that policy.
    """

    def __init__(self, kv: KVPlan, pool: "WorkerPool", thp: bool = True, hugetlb_kb: int | None = None):
        mode, n_layers = kv.mode, kv.n_layers
        self.plan = kv
        self.mode, self.n_layers, self.pool = mode, n_layers, pool
        self.sizes = list(kv.sizes)
        if len(self.sizes) != pool.n_threads:
            raise ValueError(f"{len(self.sizes)} KV sizes for {pool.n_threads} workers")
        gran = hugetlb_kb * 1024 if hugetlb_kb else (THP_SIZE if thp else PAGE)
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
                policy = Policy("bind", (kv_node(mode),))
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
    """Plan the KV cache alone, check it per node against the budget, then allocate (and
    first-touch) it."""
    plan = plan_for_pool((), None, pool, kv=KVRequest(n_layers, bytes_per_layer_per_worker, mode), budget=budget)
    plan.check()
    return KVLayout(plan.kv, pool, thp=thp, hugetlb_kb=hugetlb_kb)


__all__ = [
    "BudgetError", "KVLayout", "ProgressEvent", "TensorSpec", "WeightLayout", "execute_weights", "place_kv",
    "place_weights", "read_into", "row_split", "sliceable", "switch_weights",
]

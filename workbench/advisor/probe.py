"""Measure the memory system: node-to-node read bandwidth, idle latency, bandwidth per thread count.

Like Intel MLC's matrices, but with the NUMA layer's own tools: a buffer bound to node j
(``memory.alloc`` with ``Policy('bind', (j,))``) is streamed by the workers of a ``WorkerPool``
pinned on node i. Memory-only nodes (CXL expanders) are sources like any other node. A full
probe takes seconds; the result is cached per machine (topology + CPU model) as JSON under
``$XDG_CACHE_HOME/numawb/`` with its date, and ``refresh=True`` probes again.

Machines that cannot be probed (the NUMA layer's fixture trees) get a profile from a file in the
fixture (``advisor.json``: figures from published specifications, its sources named there), or,
failing that, one assumed from the SLIT distances (marked ``source: assumed``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..numa.budget import free_per_node
from ..numa.topology import Topology, load_topology

GB = 1e9
#: progress(done, total, message)
ProgressFn = Callable[[int, int, str], None]
PROFILE_VERSION = 3  # 2: kernel rates per thread count; 3: bandwidth read in vector loads (the old loop was the limit)


@dataclass
class MemoryProfile:
    """What the probe measured (or what a fixture states), bandwidths in bytes/s."""

    key: str
    date: str
    cpu_model: str
    source: str                                   # probed | published | assumed
    nodes: list[int]                              # nodes with memory (sources)
    cpu_nodes: list[int]                          # nodes with CPUs (readers)
    bandwidth: dict[int, dict[int, float]]        # reader node -> source node -> bytes/s, all cores
    latency_ns: dict[int, dict[int, float]]       # reader node -> source node -> idle load-to-use ns
    scaling: dict[int, list[tuple[int, float]]]   # node -> [(threads, local bytes/s)]
    seconds: float = 0.0
    buffer_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    flops_per_core: float = 0.0                   # fixtures: assumed sustained FLOP/s per core
    engine: dict = field(default_factory=dict)    # the engine's own measured constants (engine_cal)
    version: int = PROFILE_VERSION

    # ---- lookups -------------------------------------------------------
    def local(self, node: int) -> float:
        return self.bandwidth.get(node, {}).get(node, 0.0)

    def threads_bw(self, node: int, threads: int) -> float:
        """Local bandwidth of ``threads`` workers on ``node`` (linear between measured counts)."""
        pts = sorted(self.scaling.get(node) or [])
        if not pts:
            return self.local(node)
        if threads <= pts[0][0]:
            return pts[0][1] * threads / pts[0][0]
        for (t0, b0), (t1, b1) in zip(pts, pts[1:]):
            if threads <= t1:
                return b0 + (b1 - b0) * (threads - t0) / (t1 - t0)
        return pts[-1][1]

    def bw(self, reader: int, source: int, threads: int) -> float:
        """Bytes/s that ``threads`` workers on ``reader`` get from memory on ``source``."""
        full = self.bandwidth.get(reader, {}).get(source, 0.0)
        loc = self.local(reader)
        if loc <= 0:
            return full
        # the thread curve is measured locally; a remote source keeps the full-node ratio
        return self.threads_bw(reader, threads) * full / loc

    def capacity(self, source: int) -> float:
        """What one node's memory can serve in total: its best reader's bandwidth, or the best
        point of its own thread curve (on a busy machine fewer threads can measure higher)."""
        best = max((row.get(source, 0.0) for row in self.bandwidth.values()), default=0.0)
        return max([best] + [b for _, b in self.scaling.get(source, [])])

    # ---- (de)serialisation ---------------------------------------------
    def to_json(self) -> dict:
        d = asdict(self)
        d["bandwidth"] = {str(i): {str(j): v for j, v in row.items()} for i, row in self.bandwidth.items()}
        d["latency_ns"] = {str(i): {str(j): v for j, v in row.items()} for i, row in self.latency_ns.items()}
        d["scaling"] = {str(i): [list(p) for p in pts] for i, pts in self.scaling.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "MemoryProfile":
        def mat(m: dict) -> dict[int, dict[int, float]]:
            return {int(i): {int(j): float(v) for j, v in row.items()} for i, row in (m or {}).items()}
        return cls(key=d.get("key", ""), date=d.get("date", ""), cpu_model=d.get("cpu_model", ""),
                   source=d.get("source", "probed"), nodes=[int(n) for n in d["nodes"]],
                   cpu_nodes=[int(n) for n in d["cpu_nodes"]], bandwidth=mat(d["bandwidth"]),
                   latency_ns=mat(d.get("latency_ns", {})),
                   scaling={int(i): [(int(t), float(b)) for t, b in pts] for i, pts in d.get("scaling", {}).items()},
                   seconds=float(d.get("seconds", 0.0)), buffer_bytes=int(d.get("buffer_bytes", 0)),
                   notes=list(d.get("notes", [])), flops_per_core=float(d.get("flops_per_core", 0.0)),
                   engine=dict(d.get("engine", {})), version=int(d.get("version", PROFILE_VERSION)))


# ------------------------------------------------------------------------------------ machine key


def cpu_model(topology: Topology) -> str:
    """``model name`` from the topology root's /proc/cpuinfo ('' when absent)."""
    try:
        with open(Path(topology.root) / "proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_key(topology: Topology) -> str:
    """Stable id of a machine for the cache: nodes, their CPUs and distances, memory-only nodes, and
    the CPU model. Memory sizes are left out: a VM's node MemTotal moves with memory hot-plug."""
    desc = {"cpu": cpu_model(topology),
            "nodes": [[n.id, list(n.cpus), n.memory_only, sorted(n.distances.items())]
                      for n in topology.nodes]}
    return hashlib.sha1(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "numawb"


def cache_path(topology: Topology) -> Path:
    return cache_dir() / f"probe-{machine_key(topology)}.json"


# the engine constants' parts that depend on the revisions `engine_cal.ensure_engine` checks
ENGINE_REVISIONS = ("kernel_path", "kernels_revision", "engine_revision")


def _fill_missing(mine: dict, theirs: dict) -> None:
    """Copy into ``mine`` every key of ``theirs`` it lacks, at any depth (``mine`` wins on both)."""
    for k, v in theirs.items():
        if k not in mine:
            mine[k] = v
        elif isinstance(mine[k], dict) and isinstance(v, dict):
            _fill_missing(mine[k], v)


def save_profile(profile: MemoryProfile, topology: Topology) -> Path:
    """Write the profile to the machine's cache file. Engine constants another process saved there
    meanwhile for the same revisions are kept (the app and `numawb advise` measuring two models at
    once each wrote its whole profile, and the last writer dropped the other's); each writer has a
    temporary file of its own."""
    p = cache_path(topology)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = profile.to_json()
    try:
        disk = json.loads(p.read_text())
    except (OSError, ValueError):
        disk = None
    mine, theirs = data.get("engine") or {}, (disk or {}).get("engine") or {}
    if (isinstance(disk, dict) and isinstance(theirs, dict) and disk.get("key") == data.get("key")
            and disk.get("version") == data.get("version")
            and all(mine.get(k) == theirs.get(k) for k in ENGINE_REVISIONS)):
        _fill_missing(mine, theirs)
        profile.engine = mine
        data["engine"] = mine
    tmp = p.with_name(f"{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(p)
    return p


def cached_profile(topology: Topology) -> MemoryProfile | None:
    p = cache_path(topology)
    try:
        prof = MemoryProfile.from_json(json.loads(p.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return prof if prof.version == PROFILE_VERSION else None


# ----------------------------------------------------------------------------------------- probing


def _l3_bytes(topology: Topology, node: int) -> int:
    """Sum of the distinct L3 caches the node's CPUs use (0 when sysfs does not say)."""
    seen: set[str] = set()
    total = 0
    for c in topology.node(node).cpus:
        d = Path(topology.root) / f"sys/devices/system/cpu/cpu{c}/cache/index3"
        try:
            shared = (d / "shared_cpu_list").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        if shared in seen:
            continue
        seen.add(shared)
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        total += int(size.rstrip("KMG")) * mult
    return total


def _thread_counts(n: int) -> list[int]:
    out, c = [], 1
    while c < n:
        out.append(c)
        c *= 2
    return out + [n]


def probe(topology: Topology | None = None, *, size_mb: int = 256, reps: int = 5,
          progress: ProgressFn | None = None) -> MemoryProfile:
    """Measure this machine (seconds): see the module docstring. ``size_mb`` is the buffer per
    source node (raised to 4x the largest L3 so caches do not flatter the figures)."""
    from ..numa.memory import Policy, alloc
    from ..numa.workers import WorkerPool
    from ._kernels import chase, stream_read

    topo = topology or load_topology()
    if topo.root != "/":
        raise ValueError(f"topology {topo.root} is a fixture: it cannot be probed (use its published profile)")
    t_start = time.perf_counter()
    cpu_nodes = list(topo.cpu_node_ids)
    src_nodes = [n.id for n in topo.nodes if n.mem_total > 0 or n.cpus]
    free = free_per_node(topo)
    l3 = max((_l3_bytes(topo, n) for n in cpu_nodes), default=0)
    size = max(size_mb << 20, 4 * l3)
    notes: list[str] = []
    pools = {i: WorkerPool(policy=f"distribute:{i}", topology=topo) for i in cpu_nodes}
    singles = {i: WorkerPool(1, policy=f"distribute:{i}", topology=topo) for i in cpu_nodes}
    counts = {i: _thread_counts(pools[i].n_threads) for i in cpu_nodes}
    total = len(cpu_nodes) * len(src_nodes) * 2 + sum(len(c) for c in counts.values())
    done = 0

    def tick(msg: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, msg)

    def read_bw(pool, arr: np.ndarray) -> float:
        n = pool.n_threads
        k = arr.shape[0] // n
        parts = [arr[w * k:(w + 1) * k] for w in range(n)]
        loops = 1

        def fn(w: int) -> None:
            for _ in range(loops):
                stream_read(parts[w])
        t0 = time.perf_counter()
        pool.run(fn)  # warm-up (and compile on a cold cache)
        first = time.perf_counter() - t0
        loops = max(1, min(64, math.ceil(0.02 / max(first, 1e-6))))  # >= 20 ms per timed read
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            pool.run(fn)
            best = min(best, time.perf_counter() - t0)
        return n * k * 8 * loops / best

    bandwidth: dict[int, dict[int, float]] = {i: {} for i in cpu_nodes}
    latency: dict[int, dict[int, float]] = {i: {} for i in cpu_nodes}
    scaling: dict[int, list[tuple[int, float]]] = {}
    rng = np.random.default_rng(0)
    used_size = size
    try:
        for j in src_nodes:
            nbytes = size
            if free.get(j, 0) < 2 * size:
                nbytes = max(16 << 20, (free.get(j, 0) // 4) >> 21 << 21)
                notes.append(f"node {j}: only {free.get(j, 0) >> 20} MiB free, probed with "
                             f"{nbytes >> 20} MiB")
                if free.get(j, 0) < 2 * nbytes:
                    notes.append(f"node {j}: too little free memory to probe")
                    for i in cpu_nodes:
                        tick(f"node {j}: skipped (no free memory)")
                        tick(f"node {j}: skipped")
                    continue
            used_size = min(used_size, nbytes)
            buf = alloc(nbytes, Policy("bind", (j,)), label=f"probe node {j}", topology=topo)
            try:
                if buf.note:
                    notes.append(f"node {j}: {buf.note}")
                arr = buf.array.view(np.uint64)
                ring = None
                arr[:] = 1  # fault every page in, on node j (the policy decides, not the writer)
                for i in cpu_nodes:
                    bandwidth[i][j] = read_bw(pools[i], arr)
                    tick(f"bandwidth node {i} <- node {j}: {bandwidth[i][j] / GB:.1f} GB/s")
                    if i == j:
                        pts = []
                        for c in counts[i]:
                            if c == pools[i].n_threads:
                                pts.append((c, bandwidth[i][j]))
                            else:
                                with WorkerPool(c, policy=f"distribute:{i}", topology=topo) as p:
                                    pts.append((c, read_bw(p, arr)))
                            tick(f"node {i}, {c} threads: {pts[-1][1] / GB:.1f} GB/s")
                        scaling[i] = pts
                # idle latency: one thread chasing a random ring of cache lines over 64 MiB
                lines = min(nbytes, 64 << 20) // 64
                ring = arr.view(np.int64)
                idx = rng.permutation(lines).astype(np.int64) * 8
                ring[idx[:-1]] = idx[1:]
                ring[idx[-1]] = idx[0]
                steps = min(lines, 1 << 19)
                for i in cpu_nodes:
                    res = [0.0]

                    def run(w: int, steps: int = steps) -> None:
                        chase(ring, int(idx[0]), steps // 8)
                        t0 = time.perf_counter()
                        chase(ring, int(idx[0]), steps)
                        res[0] = time.perf_counter() - t0
                    singles[i].run(run)
                    latency[i][j] = res[0] / steps * 1e9
                    tick(f"latency node {i} <- node {j}: {latency[i][j]:.0f} ns")
            finally:
                arr = ring = None  # noqa: F841 - drop the views before unmapping
                buf.close()
    finally:
        for p in list(pools.values()) + list(singles.values()):
            p.close()
    for i in cpu_nodes:
        scaling.setdefault(i, [])
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    if load > 0.5 * len(topo.allowed_cpus):
        notes.append(f"load average {load:.1f} on {len(topo.allowed_cpus)} CPUs while probing: other work "
                     "shares the machine, the figures (best of several reads) may still be low")
    return MemoryProfile(
        key=machine_key(topo), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), cpu_model=cpu_model(topo),
        source="probed", nodes=src_nodes, cpu_nodes=cpu_nodes, bandwidth=bandwidth, latency_ns=latency,
        scaling=scaling, seconds=time.perf_counter() - t_start, buffer_bytes=used_size, notes=notes)


# ------------------------------------------------------------------------------ fixture machines


def assumed_profile(topology: Topology, local_gbs: float = 100.0, per_core_gbs: float = 10.0) -> MemoryProfile:
    """A profile for a machine that cannot be probed and has no published figures: every node's
    local bandwidth ``min(local_gbs, per_core_gbs x cores)`` (memory-only nodes: ``local_gbs / 2``),
    remote bandwidth scaled by 10 / SLIT distance, latency 90 ns x distance / 10. Clearly a guess:
    ``source`` says ``assumed``."""
    cpu_nodes = list(topology.cpu_node_ids)
    nodes = [n.id for n in topology.nodes]
    phys = {i: len(topology.physical_cpus(list(topology.node(i).cpus))) for i in cpu_nodes}
    loc = {n: (min(local_gbs, per_core_gbs * phys[n]) if n in phys else local_gbs / 2) * GB for n in nodes}
    bw = {i: {j: loc[j] * 10.0 / max(topology.distance(i, j), 10) for j in nodes} for i in cpu_nodes}
    lat = {i: {j: 90.0 * max(topology.distance(i, j), 10) / 10.0 for j in nodes} for i in cpu_nodes}
    scaling = {i: [(c, min(loc[i], per_core_gbs * GB * c)) for c in _thread_counts(phys[i])] for i in cpu_nodes}
    return MemoryProfile(key=machine_key(topology), date="", cpu_model=cpu_model(topology), source="assumed",
                         nodes=nodes, cpu_nodes=cpu_nodes, bandwidth=bw, latency_ns=lat, scaling=scaling,
                         notes=[f"not measured: {local_gbs:g} GB/s per node (at most {per_core_gbs:g} GB/s "
                                f"per core), remote scaled by 10/SLIT distance"])


def fixture_profile(topology: Topology) -> MemoryProfile:
    """The profile stored with a fixture tree (``advisor.json``), else an assumed one."""
    p = Path(topology.root) / "advisor.json"
    if p.is_file():
        d = json.loads(p.read_text())
        d.setdefault("key", machine_key(topology))
        return MemoryProfile.from_json(d)
    return assumed_profile(topology)


def machine_profile(topology: Topology | None = None, *, refresh: bool = False,
                    progress: ProgressFn | None = None) -> tuple[MemoryProfile, bool]:
    """(profile, from_cache): the cached probe of this machine, probing (and caching) when there is
    none or ``refresh``; for a fixture topology, its stored or assumed profile."""
    topo = topology or load_topology()
    if topo.root != "/":
        return fixture_profile(topo), False
    if not refresh:
        prof = cached_profile(topo)
        if prof is not None:
            return prof, True
    prof = probe(topo, progress=progress)
    old = cached_profile(topo)
    if old is not None and not refresh:
        prof.engine = old.engine
    save_profile(prof, topo)
    return prof, False


def format_profile(prof: MemoryProfile) -> str:
    """The matrices as text, like MLC's output."""
    out = [f"memory profile ({prof.source}{', ' + prof.date if prof.date else ''})"
           + (f", {prof.cpu_model}" if prof.cpu_model else "")
           + (f", probed in {prof.seconds:.1f} s with {prof.buffer_bytes >> 20} MiB per node"
              if prof.source == "probed" else "")]
    head = "".join(f"{'node ' + str(j):>12}" for j in prof.nodes)

    def matrix(title: str, table: dict, fmt: str, scale: float = 1.0) -> None:
        out.extend(["", title, f"{'':10}{head}"])
        for i in prof.cpu_nodes:
            out.append(f"{'node ' + str(i):10}" + "".join(
                format(table.get(i, {}).get(j, float('nan')) / scale, fmt) for j in prof.nodes))

    matrix("read bandwidth, GB/s (rows: CPUs of node; columns: memory of node)", prof.bandwidth, "12.1f", GB)
    if prof.latency_ns:
        matrix("idle latency, ns", prof.latency_ns, "12.0f")
    out.append("")
    out.append("local bandwidth by threads, GB/s")
    for i in prof.cpu_nodes:
        pts = prof.scaling.get(i, [])
        out.append(f"node {i}: " + ", ".join(f"{t} -> {b / GB:.1f}" for t, b in pts))
    out += [f"note: {n}" for n in prof.notes]
    return "\n".join(out)

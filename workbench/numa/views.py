"""Text and JSON views: ``numactl --hardware``-like topology, ``numastat -p``-like memory."""
from __future__ import annotations

from typing import Any, Mapping

from .topology import Topology, format_cpulist

_BALANCING = {0: "off", 1: "on", 2: "on (memory tiering)", 3: "on (normal + tiering)"}
_SHOWN_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
                "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "sve")


def _mb(n: int) -> int:
    return n // (1024 * 1024)


def _smt_summary(t: Topology) -> str:
    multi = [g for g in t.smt_groups if len(g) > 1]
    if not multi:
        return "off (1 thread per core)"
    per = max(len(g) for g in t.smt_groups)
    return f"{per} threads per core, {len(t.smt_groups)} cores"


def format_topo(t: Topology) -> str:
    """numactl --hardware plus sockets, SMT pairs, numa_balancing, hugepages and CPU path."""
    ids = t.node_ids
    lines = [f"available: {len(ids)} nodes ({format_cpulist(ids)})"]
    for n in t.nodes:
        cpus = " ".join(map(str, n.cpus)) if n.cpus else "(none: memory-only node)"
        lines.append(f"node {n.id} cpus: {cpus}")
        lines.append(f"node {n.id} size: {_mb(n.mem_total)} MB")
        lines.append(f"node {n.id} free: {_mb(n.mem_free)} MB")
        for h in n.hugepages:
            if h.total:
                lines.append(f"node {n.id} hugepages {h.size_kb}kB: {h.total} total, {h.free} free")
    lines.append("node distances:")
    lines.append("node " + "".join(f"{i:>4}" for i in ids))
    for a in ids:
        lines.append(f"{a:>4}:" + "".join(f"{t.distance(a, b):>4}" for b in ids))
    lines.append(f"sockets: {len(t.sockets)}")
    for s, cpus in t.sockets.items():
        nodes = sorted({t.node_of(c) for c in cpus})
        lines.append(f"  socket {s}: cpus {format_cpulist(cpus)} (nodes {format_cpulist(nodes)})")
    lines.append(f"SMT: {_smt_summary(t)}")
    pairs = [g for g in t.smt_groups if len(g) > 1]
    if pairs:
        shown = " ".join(",".join(map(str, g)) for g in pairs[:16])
        more = f" ... (+{len(pairs) - 16})" if len(pairs) > 16 else ""
        lines.append(f"  sibling groups: {shown}{more}")
    lines.append(f"online cpus: {format_cpulist(t.online_cpus)}"
                 + (f"; offline: {format_cpulist(t.offline_cpus)}" if t.offline_cpus else ""))
    if t.allowed_cpus != t.online_cpus:
        lines.append(f"this process may use cpus: {format_cpulist(t.allowed_cpus)}")
    nb = t.numa_balancing
    nb_text = "not available" if nb is None else f"{nb} ({_BALANCING.get(nb, 'on')})"
    if nb and len(ids) > 1:
        nb_text += " - pages may be moved behind the placement; consider disabling it for the run"
    lines.append(f"numa_balancing: {nb_text}")
    lines.append(f"transparent hugepages: {t.thp or 'not available'}")
    flags = [f for f in _SHOWN_FLAGS if f in t.cpu_flags]
    lines.append(f"cpu kernel path: {t.simd} (flags: {' '.join(flags) or 'none of interest'})")
    if t.degraded:
        lines.append(f"note: {t.degraded}")
    return "\n".join(lines)


def topo_json(t: Topology) -> dict[str, Any]:
    """Everything format_topo shows, as plain JSON-able data (bytes as integers)."""
    return {
        "root": t.root,
        "degraded": t.degraded,
        "nodes": [{
            "id": n.id, "cpus": list(n.cpus), "memory_only": n.memory_only,
            "distances": {str(k): v for k, v in n.distances.items()},
            "mem_total": n.mem_total, "mem_free": n.mem_free,
            "file_pages": n.file_pages, "anon_pages": n.anon_pages,
            "hugepages": [{"size_kb": h.size_kb, "total": h.total, "free": h.free} for h in n.hugepages],
        } for n in t.nodes],
        "sockets": {str(s): list(c) for s, c in t.sockets.items()},
        "smt_groups": [list(g) for g in t.smt_groups],
        "online_cpus": list(t.online_cpus),
        "offline_cpus": list(t.offline_cpus),
        "allowed_cpus": list(t.allowed_cpus),
        "numa_balancing": t.numa_balancing,
        "thp": t.thp,
        "simd": t.simd,
        "cpu_flags": sorted(f for f in t.cpu_flags if f in _SHOWN_FLAGS),
    }


def format_numastat(stat: Mapping[str, Mapping[int, int]], topology: Topology | None = None) -> str:
    """``numastat -p``-like table (MB per node) of process memory split by kind,
    followed by per-node system memory from sysfs when ``topology`` is given."""
    nodes = sorted({n for d in stat.values() for n in d} | set(topology.node_ids if topology else ()))
    w = 12
    head = f"{'':<16}" + "".join(f"{'Node ' + str(n):>{w}}" for n in nodes) + f"{'Total':>{w}}"
    rows = [head, "-" * len(head)]
    names = {"weights": "Weights", "kv": "KV cache", "other": "Other"}
    totals = {n: 0 for n in nodes}
    for kind in ("weights", "kv", "other"):
        d = stat.get(kind, {})
        rows.append(f"{names[kind]:<16}" + "".join(f"{d.get(n, 0) / 2**20:>{w}.2f}" for n in nodes)
                    + f"{sum(d.values()) / 2**20:>{w}.2f}")
        for n in nodes:
            totals[n] += d.get(n, 0)
    rows.append("-" * len(head))
    rows.append(f"{'Total':<16}" + "".join(f"{totals[n] / 2**20:>{w}.2f}" for n in nodes)
                + f"{sum(totals.values()) / 2**20:>{w}.2f}")
    if topology is not None:
        rows.append("")
        rows.append(f"{'System (MB)':<16}" + "".join(f"{'Node ' + str(n):>{w}}" for n in topology.node_ids))
        for label, attr in (("MemTotal", "mem_total"), ("MemFree", "mem_free"),
                            ("FilePages", "file_pages"), ("AnonPages", "anon_pages")):
            rows.append(f"{label:<16}" + "".join(f"{_mb(getattr(n, attr)):>{w}}" for n in topology.nodes))
    return "\n".join(rows)

"""NUMA topology read from sysfs/procfs (or from a fixture tree under a root path).

Everything is read from plain files so a copied tree (``fixtures/<name>/sys/...``)
loads exactly like the live machine. Boxes without ``/sys/devices/system/node``
(kernels without CONFIG_NUMA, some containers) degrade to one node holding all
online CPUs, and ``Topology.degraded`` says why.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"

# CPU feature tiers the engine's kernels can use, best first (x86 then arm).
_SIMD_TIERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("avx512-vnni", ("avx512f", "avx512bw", "avx512_vnni")),
    ("avx512", ("avx512f", "avx512bw")),
    ("avx2-vnni", ("avx2", "fma", "avx_vnni")),
    ("avx2", ("avx2", "fma")),
    ("sse4.2", ("sse4_2",)),
    ("sve", ("sve",)),
    ("neon-dotprod", ("asimd", "asimddp")),
    ("neon", ("asimd",)),
)


@dataclass(frozen=True)
class HugePages:
    """Explicit (hugetlbfs) pages of one size on one node."""

    size_kb: int
    total: int
    free: int


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple[int, ...]                 # online CPUs of this node (empty: memory-only node)
    distances: dict[int, int]             # node id -> SLIT distance
    mem_total: int                        # bytes
    mem_free: int
    file_pages: int
    anon_pages: int
    shmem: int = 0
    hugepages: tuple[HugePages, ...] = ()

    @property
    def memory_only(self) -> bool:
        return not self.cpus and self.mem_total > 0


@dataclass(frozen=True)
class Topology:
    nodes: tuple[Node, ...]
    online_cpus: tuple[int, ...]
    offline_cpus: tuple[int, ...]
    allowed_cpus: tuple[int, ...]           # this process's affinity (== online for fixtures)
    sockets: dict[int, tuple[int, ...]]     # physical_package_id -> CPUs
    smt_groups: tuple[tuple[int, ...], ...] # thread_siblings_list groups (one per core)
    numa_balancing: int | None
    thp: str | None                         # selected value of transparent_hugepage/enabled
    cpu_flags: frozenset[str]
    root: str = "/"
    degraded: str | None = None             # why the topology is a single synthetic node
    cpu_node: dict[int, int] = field(default_factory=dict)

    # ---- lookups -------------------------------------------------------
    def node(self, node_id: int) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(f"no NUMA node {node_id} (nodes: {self.node_ids})")

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def cpu_node_ids(self) -> tuple[int, ...]:
        """Nodes that have online CPUs (memory-only nodes excluded)."""
        return tuple(n.id for n in self.nodes if n.cpus)

    def node_of(self, cpu: int) -> int:
        return self.cpu_node.get(cpu, self.nodes[0].id)

    def distance(self, a: int, b: int) -> int:
        return self.node(a).distances.get(b, 10 if a == b else 20)

    def physical_cpus(self, cpus: list[int] | tuple[int, ...] | None = None) -> list[int]:
        """One CPU per core among ``cpus`` (default: allowed CPUs): its lowest listed sibling."""
        pool = list(self.allowed_cpus if cpus is None else cpus)
        group_of = {c: g for g in self.smt_groups for c in g}
        pool_set = set(pool)
        return [c for c in pool
                if min((s for s in group_of.get(c, (c,)) if s in pool_set), default=c) == c]

    def smt_order(self, cpus: list[int]) -> list[int]:
        """CPUs ordered physical cores first, then second siblings, third ... ."""
        rank: dict[int, int] = {}
        for g in self.smt_groups:
            for i, c in enumerate(g):
                rank[c] = i
        return sorted(cpus, key=lambda c: (rank.get(c, 0), cpus.index(c)))

    @property
    def simd(self) -> str:
        """Best kernel path the CPU flags allow (what the engine's kernels can use)."""
        for name, need in _SIMD_TIERS:
            if all(f in self.cpu_flags for f in need):
                return name
        return "generic"

# ---- parsing helpers ----------------------------------------------------

def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel cpulist/nodelist such as ``0-3,8,10-11``."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            step = 1
            if ":" in hi:  # 0-15:2 style (rare)
                hi, s = hi.split(":", 1)
                step = int(s.split("/")[0])
            out.extend(range(int(lo), int(hi) + 1, step))
        else:
            out.append(int(part))
    return out


def format_cpulist(cpus: list[int] | tuple[int, ...]) -> str:
    """Inverse of parse_cpulist: ``[0,1,2,5]`` -> ``0-2,5``."""
    s = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _meminfo_fields(text: str) -> dict[str, int]:
    """Parse node or /proc meminfo lines to bytes: ``Node 0 MemFree: 123 kB``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, val = line.split(":", 1)
        key = key.split()[-1]
        bits = val.split()
        if not bits:
            continue
        n = int(bits[0])
        out[key] = n * 1024 if len(bits) > 1 and bits[1] == "kB" else n
    return out


def _hugepages(base: Path) -> tuple[HugePages, ...]:
    out = []
    hp = base / "hugepages"
    if hp.is_dir():
        for d in sorted(hp.iterdir()):
            if not d.name.startswith("hugepages-"):
                continue
            size_kb = int(d.name[len("hugepages-"):-2])
            total = int((_read(d / "nr_hugepages") or "0").strip() or 0)
            free = int((_read(d / "free_hugepages") or "0").strip() or 0)
            out.append(HugePages(size_kb, total, free))
    return tuple(sorted(out, key=lambda h: h.size_kb))


def _cpu_flags(root: Path) -> frozenset[str]:
    text = _read(root / "proc/cpuinfo") or ""
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip()
        if key in ("flags", "Features"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _thp(root: Path) -> str | None:
    text = _read(root / "sys/kernel/mm/transparent_hugepage/enabled")
    if text is None:
        return None
    for word in text.split():
        if word.startswith("["):
            return word.strip("[]")
    return text.strip() or None


def load_topology(root: str | os.PathLike[str] | None = None) -> Topology:
    """Read the topology of the live machine (``root=None``) or of a fixture tree."""
    live = root is None
    rootp = Path("/" if root is None else root)
    sysn = rootp / "sys/devices/system/node"
    sysc = rootp / "sys/devices/system/cpu"

    online_text = _read(sysc / "online")
    if online_text is not None:
        online = parse_cpulist(online_text)
    else:
        online = list(range(os.cpu_count() or 1)) if live else [0]
    possible = parse_cpulist(_read(sysc / "possible") or "") or online
    offline = [c for c in possible if c not in set(online)]
    if live:
        try:
            allowed = sorted(os.sched_getaffinity(0))
        except OSError:
            allowed = list(online)
    else:
        allowed = list(online)

    sockets: dict[int, list[int]] = {}
    groups: dict[tuple[int, ...], None] = {}
    for c in online:
        topo = sysc / f"cpu{c}/topology"
        pkg = _read(topo / "physical_package_id")
        sockets.setdefault(int(pkg) if pkg is not None else 0, []).append(c)
        sib = _read(topo / "thread_siblings_list")
        g = tuple(s for s in parse_cpulist(sib) if s in online) if sib else (c,)
        groups.setdefault(g or (c,), None)

    nb_text = _read(rootp / "proc/sys/kernel/numa_balancing")
    numa_balancing = int(nb_text.strip()) if nb_text and nb_text.strip().lstrip("-").isdigit() else None

    nodes: list[Node] = []
    degraded = None
    node_dirs = sorted(
        (int(p.name[4:]) for p in sysn.glob("node[0-9]*") if p.name[4:].isdigit())
    ) if sysn.is_dir() else []
    if node_dirs:
        online_nodes = parse_cpulist(_read(sysn / "online") or "") or node_dirs
        for nid in node_dirs:
            if nid not in online_nodes:
                continue
            d = sysn / f"node{nid}"
            cpus = tuple(c for c in parse_cpulist(_read(d / "cpulist") or "") if c in set(online))
            dist_vals = [int(x) for x in (_read(d / "distance") or "").split()]
            distances = {online_nodes[i]: v for i, v in enumerate(dist_vals) if i < len(online_nodes)}
            mi = _meminfo_fields(_read(d / "meminfo") or "")
            nodes.append(Node(
                id=nid, cpus=cpus, distances=distances or {nid: 10},
                mem_total=mi.get("MemTotal", 0), mem_free=mi.get("MemFree", 0),
                file_pages=mi.get("FilePages", 0), anon_pages=mi.get("AnonPages", 0),
                shmem=mi.get("Shmem", 0), hugepages=_hugepages(d),
            ))
    if not nodes:
        why = (f"{sysn} is missing (kernel without NUMA support, or a container hiding sysfs)"
               if not sysn.is_dir() else f"{sysn} lists no online nodes")
        degraded = f"{why}: treating the machine as one node with all online CPUs"
        mi = _meminfo_fields(_read(rootp / "proc/meminfo") or "")
        hp_total = mi.get("HugePages_Total", 0)
        hp_size = mi.get("Hugepagesize", 0) // 1024
        nodes.append(Node(
            id=0, cpus=tuple(online), distances={0: 10},
            mem_total=mi.get("MemTotal", 0), mem_free=mi.get("MemFree", 0),
            file_pages=mi.get("Cached", 0) + mi.get("Buffers", 0), anon_pages=mi.get("AnonPages", 0),
            shmem=mi.get("Shmem", 0),
            hugepages=(HugePages(hp_size, hp_total, mi.get("HugePages_Free", 0)),) if hp_size else (),
        ))

    cpu_node = {c: n.id for n in nodes for c in n.cpus}
    # CPUs the node files did not claim (should not happen) go to the first node.
    for c in online:
        cpu_node.setdefault(c, nodes[0].id)

    return Topology(
        nodes=tuple(nodes),
        online_cpus=tuple(online),
        offline_cpus=tuple(offline),
        allowed_cpus=tuple(c for c in allowed if c in set(online)) or tuple(online),
        sockets={s: tuple(v) for s, v in sorted(sockets.items())},
        smt_groups=tuple(sorted(groups, key=lambda g: g[0])),
        numa_balancing=numa_balancing,
        thp=_thp(rootp),
        cpu_flags=_cpu_flags(rootp),
        root=str(rootp),
        degraded=degraded,
        cpu_node=cpu_node,
    )


def fixture_names() -> list[str]:
    return sorted(p.name for p in FIXTURES_DIR.iterdir() if p.is_dir()) if FIXTURES_DIR.is_dir() else []


def fixture_path(name: str) -> Path:
    """Root of a shipped fixture tree (``load_topology(fixture_path('epyc-2socket'))``)."""
    p = FIXTURES_DIR / name
    if not p.is_dir():
        raise FileNotFoundError(f"no topology fixture {name!r}; available: {', '.join(fixture_names())}")
    return p

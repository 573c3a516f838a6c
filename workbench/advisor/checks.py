"""Warnings with the fix: machine settings and model-file states that cost NUMA performance.

Every check reads the ``Topology`` the NUMA layer loaded from its root (the live machine, or a
fixture tree under ``workbench/numa/fixtures`` or a test's copy of one), so tests point the checks
at a tree: automatic NUMA balancing, sub-NUMA clustering / NPS modes, NPS0, transparent huge pages
off, memory-only nodes, free huge pages per node. The page-cache check asks the live kernel where
the model file's cached pages are: ``mincore(2)`` for residency (sampled on large files) and
``move_pages(2)`` with no target nodes for the node of a sample of resident pages; only pages
already in the cache are touched (a minor fault maps them, nothing is read from disk).

Nothing here imports Numba or Textual.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..numa.topology import Topology

GiB = 1 << 30
MiB = 1 << 20
PAGE = mmap.PAGESIZE
FULL_SCAN_PAGES = 1 << 18     # files up to 1 GiB (4 KiB pages): every page checked
SAMPLE_WINDOWS = 4096         # larger files: this many evenly spaced windows ...
WINDOW_PAGES = 64             # ... of this many pages each (1 GiB of the file checked)
NODE_SAMPLES = 4096           # resident pages asked for their node
MIN_CACHED = 64 * MiB         # less of a file in the cache than this (and < 1 %) says nothing


@dataclass(frozen=True)
class SystemWarning:
    """One finding: ``code`` (stable, for scripts), ``message`` (what and why it costs),
    ``fix`` (what to do), ``level`` ("warn": costs speed or fails a load; "info": worth knowing)."""

    code: str
    message: str
    fix: str
    level: str = "warn"

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "fix": self.fix, "level": self.level}

    def lines(self) -> list[str]:
        return [f"{'warning' if self.level == 'warn' else 'note'} [{self.code}]: {self.message}",
                f"  fix: {self.fix}"]


def format_warnings(warnings: Sequence[SystemWarning]) -> str:
    """The warnings as text, two lines each (the command line's table and probe output)."""
    return "\n".join(line for w in warnings for line in w.lines())


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


# ------------------------------------------------------------------------------ machine settings


def machine_warnings(topology: Topology, profile: Any = None) -> list[SystemWarning]:
    """Settings of the machine (read from the topology's root): automatic NUMA balancing, sub-NUMA
    clustering / NPS modes, NPS0, transparent huge pages off, memory-only nodes. ``profile`` (a
    ``MemoryProfile``) adds the probed bandwidth of memory-only nodes to their warning."""
    out: list[SystemWarning] = []
    root = topology.root.rstrip("/") or ""
    cpu_nodes = list(topology.cpu_node_ids)
    multi = len(topology.node_ids) > 1
    nb = topology.numa_balancing
    if multi and nb:
        what = "on" if nb == 1 else f"on (mode {nb}: memory tiering)"
        out.append(SystemWarning(
            "numa-balancing",
            f"automatic NUMA balancing is {what} ({root}/proc/sys/kernel/numa_balancing = {nb}): the kernel "
            "unmaps pages to sample accesses (page faults during decode) and migrates them behind the "
            "placement: interleaved weights and every page all nodes' workers read look misplaced to it",
            "echo 0 > /proc/sys/kernel/numa_balancing (root; or run numawb with --no-numa-balancing, "
            "which turns it off for the run and restores it at exit)"))
    n_sockets = len(topology.sockets)
    if n_sockets and len(cpu_nodes) > n_sockets:
        per = len(cpu_nodes) / n_sockets
        out.append(SystemWarning(
            "sub-numa",
            f"{len(cpu_nodes)} NUMA nodes with CPUs on {n_sockets} socket{'s' if n_sockets > 1 else ''} "
            f"({per:g} per socket): sub-NUMA clustering (Intel SNC) or NPS{int(per) if per == int(per) else ''} "
            "(AMD) splits each socket's memory channels between nodes; mirror keeps one copy of the "
            f"weights per node ({len(cpu_nodes)} copies), and each node's workers read only "
            "their node's share of the channels",
            "prefer slice or interleave over mirror here (the table predicts them for this layout); or "
            "set NPS1 / SNC off in the BIOS (a reboot) for one node per socket"))
    if n_sockets > 1 and len(cpu_nodes) == 1:
        out.append(SystemWarning(
            "nps0",
            f"one NUMA node for {n_sockets} sockets: the BIOS interleaves memory over the sockets "
            "(NPS0 or node interleaving), so about half of every read crosses the socket link and no "
            "placement mode can keep reads local",
            "set NPS1 (AMD) or turn node interleaving off (Intel) in the BIOS, then use mirror or "
            "slice (numawb advise predicts them once the nodes are visible)"))
    if topology.thp == "never":
        out.append(SystemWarning(
            "thp-off",
            f"transparent huge pages are off ({root}/sys/kernel/mm/transparent_hugepage/enabled = never): "
            "weights and KV cache sit in 4 KiB pages, so streaming them costs a TLB miss every 4 KiB",
            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (root; numawb asks for huge pages "
            "with madvise on its buffers), or reserve explicit ones and run with --hugepages 2M"))
    for n in topology.nodes:
        if not n.memory_only:
            continue
        bw = ""
        if profile is not None and getattr(profile, "bandwidth", None):
            rows = [(i, profile.bandwidth.get(i, {}).get(n.id)) for i in cpu_nodes]
            rows = [(i, v) for i, v in rows if v]
            if rows:
                i, v = max(rows, key=lambda r: r[1])
                loc = profile.bandwidth.get(i, {}).get(i, 0.0)
                src = {"probed": "probed", "published": "published figures:"}.get(profile.source, "assumed")
                bw = (f"; {src} {v / 1e9:.1f} GB/s from node {i}'s CPUs"
                      + (f" against {loc / 1e9:.1f} GB/s from their own memory" if loc else ""))
        out.append(SystemWarning(
            "memory-only-node",
            f"node {n.id} has {_gib(n.mem_total)} of memory and no CPUs (a CXL expander or similar): every "
            f"read from it is remote for all workers{bw}; a default allocation or interleave=all can spill "
            "weights onto it",
            f"numawb's weights modes use only CPU nodes; put the KV cache there only when DRAM is short "
            f"(--kv node:{n.id}, predicted in the table); keep numactl --interleave=all off it",
            level="info"))
    return out


# ------------------------------------------------------------------------------------ huge pages


def hugepage_warnings(topology: Topology, need_per_node: Mapping[int, int], size_kb: int,
                      what: str = "the recommended placement") -> list[SystemWarning]:
    """Too few free explicit huge pages of ``size_kb`` on a node for ``need_per_node`` (bytes):
    what ``--hugepages`` would allocate there (numawb's loader checks the same before allocating)."""
    out: list[SystemWarning] = []
    size = size_kb * 1024
    label = f"{size_kb // 1024} MiB" if size_kb < 1 << 20 else f"{size_kb >> 20} GiB"
    flag = "2M" if size_kb == 2048 else "1G" if size_kb == 1 << 20 else f"{size_kb}kB"
    root = topology.root.rstrip("/") or ""
    short: list[str] = []
    fixes: list[str] = []
    missing: list[int] = []
    for nid, need in sorted(need_per_node.items()):
        if need <= 0:
            continue
        node = topology.node(nid)
        hp = next((h for h in node.hugepages if h.size_kb == size_kb), None)
        if hp is None:
            missing.append(nid)
            continue
        pages = -(-need // size)
        if hp.free < pages:
            short.append(f"node {nid} has {hp.free} free of {hp.total} ({_gib(hp.free * size)}), "
                         f"{what} needs about {pages} ({_gib(need)})")
            fixes.append(f"echo {hp.total + pages - hp.free} > /sys/devices/system/node/node{nid}/hugepages/"
                         f"hugepages-{size_kb}kB/nr_hugepages")
    if missing:
        out.append(SystemWarning(
            "hugepages-size",
            f"--hugepages {flag}: this kernel offers no {label} pages on node"
            f"{'s' if len(missing) > 1 else ''} {','.join(map(str, missing))} "
            f"({root}/sys/devices/system/node/nodeN/hugepages/ has no hugepages-{size_kb}kB)",
            "boot with hugepagesz=1G hugepages=N for 1 GiB pages, use --hugepages 2M, or leave huge pages "
            "to the kernel (transparent huge pages, the default)"))
    if short:
        out.append(SystemWarning(
            "hugepages-free",
            f"too few free {label} huge pages: " + "; ".join(short)
            + " (the load would stop at the per-node check)",
            " && ".join(fixes) + " (root; reserve early, before memory fragments"
            + ("; 1 GiB pages are best reserved at boot" if size_kb >= 1 << 20 else "")
            + "), or run without --hugepages (transparent huge pages)"))
    return out


# ------------------------------------------------------------------------------------ page cache


@dataclass
class PageCacheState:
    """Where a file's pages are in the page cache (estimated from samples on large files)."""

    path: str
    file_bytes: int
    checked_pages: int                      # pages mincore() was asked about
    resident_pages: int                     # of those, in the page cache
    exact: bool                             # every page was checked
    node_pages: dict[int, int] = field(default_factory=dict)  # sampled resident pages per node
    node_unknown: int = 0                   # sampled pages move_pages() could not place
    node_error: str = ""                    # why nodes are unknown (move_pages failed)

    @property
    def resident_fraction(self) -> float:
        return self.resident_pages / self.checked_pages if self.checked_pages else 0.0

    @property
    def resident_bytes(self) -> float:
        return self.resident_fraction * self.file_bytes

    def bytes_by_node(self) -> dict[int, float]:
        """Estimated cached bytes of the file per node (the sampled shares times the resident bytes)."""
        known = sum(self.node_pages.values())
        if not known:
            return {}
        return {n: self.resident_bytes * k / known for n, k in sorted(self.node_pages.items())}

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "file_bytes": self.file_bytes, "checked_pages": self.checked_pages,
                "resident_pages": self.resident_pages, "resident_fraction": self.resident_fraction,
                "exact": self.exact, "node_pages": {str(k): v for k, v in self.node_pages.items()},
                "node_unknown": self.node_unknown, "node_error": self.node_error}


PROT_READ = 1
MAP_SHARED = 1
MADV_RANDOM = 1
MAP_FAILED = ctypes.c_void_p(-1).value
_libc: Any = None


def _libc_fns() -> Any:
    """libc's mmap, munmap, madvise and mincore with their C signatures (once)."""
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.mincore  # noqa: B018 - not every libc has it
        except (OSError, AttributeError):
            raise OSError(errno.ENOSYS, "no mincore() in this C library") from None
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.mmap.restype = ctypes.c_void_p
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.munmap.restype = ctypes.c_int
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.madvise.restype = ctypes.c_int
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.mincore.restype = ctypes.c_int
        _libc = lib
    return _libc


def page_cache_state(path: str | os.PathLike[str], *, node_samples: int = NODE_SAMPLES) -> PageCacheState:
    """Residency of ``path`` in the page cache and the nodes of its resident pages, without reading
    anything from disk: the file is mapped read-only (MADV_RANDOM: no read-ahead), ``mincore``
    says which pages are cached (every page up to 1 GiB, else 4096 evenly spaced 256 KiB windows),
    and up to ``node_samples`` of the resident ones are touched (a minor fault maps the cached page)
    and asked for their node with ``move_pages(2)`` (no target nodes: a query). Seconds on a
    700 GB file. Raises OSError when the file cannot be opened or mapped."""
    from ..numa import syscalls as sc
    path = os.fspath(path)
    size = os.path.getsize(path)
    st = PageCacheState(path, size, 0, 0, True)
    if size == 0:
        return st
    n_pages = -(-size // PAGE)
    libc = _libc_fns()
    fd = os.open(path, os.O_RDONLY)
    try:
        base = libc.mmap(None, ctypes.c_size_t(size), PROT_READ, MAP_SHARED, fd, ctypes.c_long(0))
        if base is None or base == MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap: {os.strerror(err)}", path)
    finally:
        os.close(fd)
    try:
        libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(size), MADV_RANDOM)  # no read-ahead
        if n_pages <= FULL_SCAN_PAGES:
            windows = [(0, n_pages)]
        else:
            st.exact = False
            step = n_pages / SAMPLE_WINDOWS
            windows = [(int(k * step), min(WINDOW_PAGES, n_pages - int(k * step))) for k in range(SAMPLE_WINDOWS)]
        resident: list[int] = []  # page indices found resident
        vec = (ctypes.c_ubyte * max(w for _, w in windows))()
        for first, count in windows:
            if libc.mincore(ctypes.c_void_p(base + first * PAGE), ctypes.c_size_t(count * PAGE), vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore: {os.strerror(err)}", path)
            st.checked_pages += count
            flags = bytes(vec[:count])
            resident.extend(first + k for k in range(count) if flags[k] & 1)
        st.resident_pages = len(resident)
        if resident:
            stride = max(1, len(resident) // node_samples)
            sample = resident[::stride][:node_samples]
            addrs = [base + p * PAGE for p in sample]
            for a in addrs:  # map the cached page into this process (a minor fault, no disk read)
                ctypes.c_char.from_address(a).value
            r = sc.move_pages(addrs)
            if r:
                for s in r.value:
                    if s >= 0:
                        st.node_pages[s] = st.node_pages.get(s, 0) + 1
                    else:
                        st.node_unknown += 1
            else:
                st.node_unknown = len(sample)
                st.node_error = r.reason
    finally:
        libc.munmap(ctypes.c_void_p(base), ctypes.c_size_t(size))
    return st


def page_cache_warnings(path: str | os.PathLike[str], topology: Topology,
                        need_per_node: Mapping[int, int] | None = None,
                        what: str = "the recommended placement",
                        state: PageCacheState | None = None) -> list[SystemWarning]:
    """The model file's pages in the page cache: on a node where ``need_per_node`` (bytes of the
    placement) exceeds free memory (the load must evict them first), or, left from an earlier read,
    holding memory and making the next load a warm one. Live machine only."""
    try:
        st = state if state is not None else page_cache_state(path)
    except OSError as e:
        return [SystemWarning("page-cache-unknown", f"cannot check the page cache of {path}: {e.strerror or e}",
                              "none needed; the advice does not depend on it", level="info")]
    cached = st.resident_bytes
    if cached < MIN_CACHED and st.resident_fraction < 0.01:
        return []
    name = os.path.basename(st.path)
    q = shlex.quote(st.path)
    by_node = st.bytes_by_node()
    sampled = "" if st.exact else ", estimated from samples"
    where = (", " + ", ".join(f"node {n}: {_gib(b)}" for n, b in by_node.items()) if by_node else
             f", node unknown ({st.node_error or 'not mappable'})")
    drop = (f"dd if={q} iflag=nocache count=0 drops this file's cached pages (no root); "
            "echo 1 > /proc/sys/vm/drop_caches drops every file's (root; numawb run --drop-caches does it "
            "before loading)")
    out: list[SystemWarning] = []
    if need_per_node and len(topology.node_ids) > 1:
        free = {n.id: n.mem_free for n in topology.nodes}
        tight = [(n, b) for n, b in by_node.items()
                 if need_per_node.get(n, 0) > free.get(n, 0) and b >= MIN_CACHED]
        if tight:
            parts = [f"node {n} holds {_gib(b)} of it with {_gib(free.get(n, 0))} free and {what} needs "
                     f"{_gib(need_per_node[n])} there" for n, b in tight]
            out.append(SystemWarning(
                "page-cache-node",
                f"{name} is in the page cache on the wrong node ({_gib(cached)}, {st.resident_fraction:.0%}"
                f"{sampled}{where}): " + "; ".join(parts) + ": the load must evict it first, slower, and a "
                "bound or huge-page allocation can fail",
                f"before loading, {drop}. Interleave-reading the file (numactl --interleave=all cat {q} > "
                "/dev/null) only helps programs that read weights from the page cache through mmap, such "
                "as llama.cpp; numawb copies the weights into its own placed memory, so a cold cache is "
                "what it needs"))
            return out
    out.append(SystemWarning(
        "page-cache-warm",
        f"{_gib(cached)} ({st.resident_fraction:.0%}{sampled}) of {name} is in the page cache, left by a "
        f"read of it (an earlier run, or this load){where}: the next load reads no disk (a load time measured now is a warm one) "
        "and the cache holds that memory until the kernel needs it (numawb copies the weights into its "
        "own placed memory, so where the cache sits does not change decode speed)",
        f"for a cold load, {drop}; numawb bench evicts the file itself for its cold load",
        level="info"))
    return out


# ------------------------------------------------------------------------------------ all together


def advice_warnings(topology: Topology, *, profile: Any = None, model_path: str | None = None,
                    need_per_node: Mapping[int, int] | None = None, hugepages_kb: int | None = None,
                    what: str = "the recommended placement",
                    page_cache: PageCacheState | None = None) -> list[SystemWarning]:
    """Every check that applies: the machine's settings; with ``hugepages_kb`` (``--hugepages``)
    free huge pages per node against ``need_per_node``; with ``model_path`` on the live machine
    (``topology.root == '/'``), the file's page cache (``page_cache``: its state taken earlier,
    e.g. before the header was read)."""
    out = machine_warnings(topology, profile)
    if hugepages_kb and need_per_node:
        out += hugepage_warnings(topology, need_per_node, hugepages_kb, what)
    if model_path and topology.root == "/" and os.path.isfile(model_path):
        out += page_cache_warnings(model_path, topology, need_per_node, what, state=page_cache)
    return out

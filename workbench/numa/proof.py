"""Proof of placement: where the pages of every placed buffer really are.

``prove`` samples pages with move_pages (nodes=NULL only queries) and reports,
per buffer, the share of touched pages on the nodes the mode intends.
``process_numastat`` reads /proc/self/numa_maps (like ``numastat -p``) and
splits this process's memory per node into weights / KV / other by address.
"""
from __future__ import annotations

import errno
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from . import syscalls as sc
from .memory import PAGE, PlacedBuffer


ABSENT = (-errno.ENOENT, -errno.EFAULT)   # move_pages' status for a page with no frame (yet)
ABSENT_RECHECK_PAUSES = (0.0, 0.01)  # seconds before each further look at the absent pages


@dataclass(frozen=True)
class BufferProof:
    label: str
    kind: str
    intended: tuple[int, ...]
    nbytes: int
    sampled: int                              # pages queried
    pages_by_node: dict[int, int] = field(default_factory=dict)
    absent: int = 0                           # never-touched pages (first touch still to come)
    reason: str = ""                          # why no answer (move_pages unavailable)

    @property
    def present(self) -> int:
        return sum(self.pages_by_node.values())

    @property
    def share(self) -> float | None:
        """Share of touched sampled pages on the intended node(s); None if nothing to judge."""
        if not self.intended or not self.present:
            return None
        return sum(v for k, v in self.pages_by_node.items() if k in self.intended) / self.present

    def node_share(self, node: int) -> float:
        return self.pages_by_node.get(node, 0) / self.present if self.present else 0.0

    @property
    def spread(self) -> float | None:
        """For several intended nodes: smallest node share / even share (1.0 = perfectly even)."""
        if len(self.intended) < 2 or not self.present:
            return None
        even = 1.0 / len(self.intended)
        return min(self.node_share(n) for n in self.intended) / even

    def line(self) -> str:
        if self.reason:
            return f"{self.label}: unknown ({self.reason})"
        dist = ", ".join(f"node {n} {100 * self.node_share(n):.1f}%" for n in sorted(self.pages_by_node))
        tail = f" ({self.present}/{self.sampled} pages sampled"
        tail += f", {self.absent} not touched yet)" if self.absent else ")"
        if self.share is None:
            return f"{self.label}: {dist or 'no pages touched yet'}{tail}"
        where = f"node {self.intended[0]}" if len(self.intended) == 1 else \
            "nodes " + ",".join(map(str, self.intended))
        extra = f" [{dist}]" if len(self.intended) > 1 or self.share < 0.995 else ""
        return f"{self.label}: {100 * self.share:.1f}% on {where}{extra}{tail}"


def _sample(array: np.ndarray, max_pages: int) -> list[int]:
    """Addresses of up to ``max_pages`` evenly spaced pages of ``array``."""
    if array.nbytes == 0:
        return []
    start = array.ctypes.data // PAGE * PAGE
    n_pages = (array.ctypes.data + array.nbytes - start + PAGE - 1) // PAGE
    return [start + i * PAGE for i in range(0, n_pages, max(1, n_pages // max_pages))]


def _statuses(samples: list[list[int]]) -> list[sc.CallResult]:
    """move_pages statuses (node, or -errno) of each list of page addresses.

    A page being migrated, compacted or having its entry rewritten reads as absent for a moment:
    the absent pages of all the lists are asked about again, together, before being called
    untouched (so a proof of many buffers waits once, not once per buffer)."""
    results: list[sc.CallResult] = []
    for addrs in samples:
        out: list[int] = []
        for i in range(0, len(addrs), 4096):
            r = sc.move_pages(addrs[i:i + 4096])
            if not r:
                break
            out.extend(r.value)
        results.append(r if addrs and not r else sc.CallResult(True, out))
    for pause in ABSENT_RECHECK_PAUSES:
        again = [(k, j) for k, r in enumerate(results) if r for j, st in enumerate(r.value) if st in ABSENT]
        if not again:
            break
        time.sleep(pause)
        r = sc.move_pages([samples[k][j] for k, j in again])
        if not r:
            break
        for (k, j), st in zip(again, r.value):
            results[k].value[j] = st
    return results


def page_nodes(array: np.ndarray, max_pages: int = 4096) -> sc.CallResult:
    """Node of up to ``max_pages`` evenly spaced pages of ``array`` (negative: -errno)."""
    return _statuses([_sample(array, max_pages)])[0]


def _proof(r: sc.CallResult, label: str, intended: tuple[int, ...], kind: str, nbytes: int) -> BufferProof:
    if not r:
        return BufferProof(label, kind, intended, nbytes, 0, reason=r.reason)
    counts: dict[int, int] = {}
    absent = 0
    for s in r.value:
        if s >= 0:
            counts[s] = counts.get(s, 0) + 1
        elif s in ABSENT:  # not faulted in / zero page
            absent += 1
    return BufferProof(label, kind, intended, nbytes, len(r.value), counts, absent)


def prove_array(array: np.ndarray, label: str, intended: tuple[int, ...] = (), kind: str = "other",
                max_pages: int = 4096) -> BufferProof:
    """Proof for any array view (e.g. the rows one worker computes inside a slice)."""
    return _proof(page_nodes(array, max_pages), label, intended, kind, int(array.nbytes))


def prove_buffer(buf: PlacedBuffer, max_pages: int = 4096) -> BufferProof:
    return prove_array(buf.array, buf.label, buf.intended, buf.kind, max_pages)


def prove(buffers: Iterable[PlacedBuffer], max_pages: int = 4096) -> list[BufferProof]:
    """Proof for every buffer (pass ``layout.buffers()`` of weights and KV)."""
    bufs = [b for b in buffers if not b.closed]
    results = _statuses([_sample(b.array, max_pages) for b in bufs])
    return [_proof(r, b.label, b.intended, b.kind, int(b.array.nbytes)) for r, b in zip(results, bufs)]


def format_proof(proofs: Iterable[BufferProof]) -> str:
    return "\n".join(p.line() for p in proofs)


# ---- numa_maps (numastat -p) -------------------------------------------

@dataclass(frozen=True)
class Vma:
    start: int
    end: int
    policy: str
    bytes_by_node: dict[int, int]


def read_numa_maps(pid: int | str = "self", proc: str = "/proc") -> list[Vma]:
    """Per-VMA bytes per node from numa_maps (ends joined from maps)."""
    base = Path(proc) / str(pid)
    try:
        maps = (base / "maps").read_text().splitlines()
        numa = (base / "numa_maps").read_text().splitlines()
    except OSError:
        return []
    ends = {}
    for line in maps:
        a, b = line.split(None, 1)[0].split("-")
        ends[int(a, 16)] = int(b, 16)
    out = []
    for line in numa:
        parts = line.split()
        if len(parts) < 2:
            continue
        start = int(parts[0], 16)
        kb = 4
        counts: dict[int, int] = {}
        for p in parts[2:]:
            if p.startswith("kernelpagesize_kB="):
                kb = int(p.split("=")[1])
            elif p[0] == "N" and "=" in p and p[1:p.index("=")].isdigit():
                k, v = p[1:].split("=")
                counts[int(k)] = int(v)
        out.append(Vma(start, ends.get(start, start), parts[1],
                       {k: v * kb * 1024 for k, v in counts.items()}))
    return out


def process_numastat(buffers: Iterable[PlacedBuffer], vmas: list[Vma] | None = None,
                     max_pages: int = 4096) -> dict[str, dict[int, int]]:
    """Bytes per node of this process split into 'weights', 'kv' and 'other'.

    Buffers are measured by sampling their pages (numa_maps cannot tell them apart:
    neighbouring mappings with the same policy merge into one VMA); 'other' is the
    process total from numa_maps minus what the buffers hold.
    """
    out: dict[str, dict[int, int]] = {"weights": {}, "kv": {}, "other": {}}
    for b in buffers:
        p = prove_buffer(b, max_pages) if not b.closed else None
        if p is None or not p.sampled:
            continue
        page_bytes = b.nbytes / p.sampled
        d = out.setdefault(b.kind, {})
        for node, n in p.pages_by_node.items():
            d[node] = d.get(node, 0) + int(n * page_bytes)
    total: dict[int, int] = {}
    for v in read_numa_maps() if vmas is None else vmas:
        for node, n in v.bytes_by_node.items():
            total[node] = total.get(node, 0) + n
    for node, n in total.items():
        placed = sum(d.get(node, 0) for k, d in out.items() if k != "other")
        out["other"][node] = max(0, n - placed)
    return out

"""Placed buffers: anonymous mmap + mbind, exposed as numpy uint8 arrays.

The policy is set with ``mbind`` right after ``mmap`` and before any byte is
touched, so every page faults in where the policy says, whichever thread writes
it. Explicit hugetlbfs pages are anonymous ``MAP_HUGETLB`` mappings: the kernel
returns them to the pool when the mapping goes away (close or process exit), so
no stale file on a hugetlbfs mount can ever be reused by a later run.
"""
from __future__ import annotations

import errno
import math
import mmap
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import syscalls as sc
from .budget import check_hugepages

if TYPE_CHECKING:
    from .topology import Topology
    from .workers import WorkerPool

PAGE = mmap.PAGESIZE
THP_SIZE = 2 * 1024 * 1024
MAP_HUGETLB = 0x40000
MAP_HUGE_SHIFT = 26

_MODES = {"default": sc.MPOL_DEFAULT, "bind": sc.MPOL_BIND,
          "interleave": sc.MPOL_INTERLEAVE, "preferred": sc.MPOL_PREFERRED}


@dataclass(frozen=True)
class Policy:
    """A memory policy: ``default`` (first touch), ``bind``, ``interleave`` or ``preferred``."""

    kind: str = "default"
    nodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _MODES:
            raise ValueError(f"unknown memory policy {self.kind!r} (one of {', '.join(_MODES)})")
        if self.kind == "default" and self.nodes:
            raise ValueError("the default policy takes no nodes")
        if self.kind != "default" and not self.nodes:
            raise ValueError(f"policy {self.kind!r} needs at least one node")
        if self.kind == "preferred" and len(self.nodes) != 1:
            raise ValueError("policy 'preferred' takes exactly one node")

    @classmethod
    def parse(cls, text: str) -> "Policy":
        """``default`` | ``bind:1`` | ``interleave:0,1`` | ``interleave:0-3`` | ``preferred:0``."""
        from .topology import parse_cpulist
        kind, _, rest = text.partition(":")
        return cls(kind, tuple(parse_cpulist(rest)) if rest else ())

    @property
    def mode(self) -> int:
        return _MODES[self.kind]

    def __str__(self) -> str:
        return self.kind if not self.nodes else f"{self.kind}:{','.join(map(str, self.nodes))}"


DEFAULT = Policy()


@dataclass
class PlacedBuffer:
    """An anonymous mapping with a memory policy, seen as a uint8 array.

    ``intended`` is where its pages should be (for the proof); for first-touch
    buffers it is the owner's node although the policy is ``default``.
    """

    label: str
    kind: str                       # 'weights' | 'kv' | 'other'
    policy: Policy
    array: np.ndarray
    base: int                       # start address of the whole mapping
    map_len: int
    intended: tuple[int, ...]
    hugetlb_kb: int | None = None
    thp: bool = False
    note: str = ""                  # why placement degraded ('' when it worked)
    _mm: mmap.mmap | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    @property
    def address(self) -> int:
        return int(self.array.ctypes.data)

    @property
    def closed(self) -> bool:
        return self._mm is None

    def close(self) -> None:
        """Unmap now if no other view of the array is alive (else when the last one dies)."""
        mm, self._mm = self._mm, None
        self.array = np.empty(0, np.uint8)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views still exported; the mapping goes with the last of them


def _apply_policy(base: int, length: int, policy: Policy, flags: int = 0) -> sc.CallResult:
    if policy.kind == "default":
        return sc.mbind(base, length, sc.MPOL_DEFAULT, (), 0)
    return sc.mbind(base, length, policy.mode, policy.nodes, flags)


def hugepage_need(nbytes: int, policy: Policy, size_kb: int, topology: "Topology") -> dict[int, int]:
    """Explicit huge pages needed per node for ``nbytes`` under ``policy``."""
    pages = math.ceil(nbytes / (size_kb * 1024))
    if policy.kind == "interleave":
        n = len(policy.nodes)
        return {nd: pages // n + (1 if i < pages % n else 0) for i, nd in enumerate(policy.nodes)}
    if policy.kind in ("bind", "preferred"):
        return {policy.nodes[0]: pages}
    cur = sc.getcpu()
    return {topology.node_of(cur.value[0]) if cur else topology.nodes[0].id: pages}


def alloc(nbytes: int, policy: Policy = DEFAULT, *, label: str = "buffer", kind: str = "other",
          thp: bool = True, hugetlb_kb: int | None = None, intended: tuple[int, ...] | None = None,
          topology: "Topology | None" = None) -> PlacedBuffer:
    """Allocate ``nbytes`` placed by ``policy``; nothing is touched yet.

    ``thp``: madvise(MADV_HUGEPAGE) and start the array on a 2 MiB boundary so huge
    pages never straddle two buffers' owners. ``hugetlb_kb`` (e.g. 2048, 1048576):
    explicit huge pages, checked per node against free pages before mapping.
    """
    if nbytes < 0:
        raise ValueError("nbytes must be >= 0")
    notes: list[str] = []
    if hugetlb_kb:
        from .topology import load_topology
        topo = topology or load_topology()
        check_hugepages(hugepage_need(nbytes, policy, hugetlb_kb, topo), hugetlb_kb, topo)
        hsize = hugetlb_kb * 1024
        map_len = max(hsize, math.ceil(nbytes / hsize) * hsize)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB | (hsize.bit_length() - 1) << MAP_HUGE_SHIFT
        mm = mmap.mmap(-1, map_len, flags=flags)
        offset = 0
    else:
        pad = THP_SIZE if thp and nbytes >= THP_SIZE else 0
        map_len = max(PAGE, math.ceil((nbytes + pad) / PAGE) * PAGE)
        mm = mmap.mmap(-1, map_len, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:  # thp=False opts out even where THP is 'always' (page-granular interleave)
            mm.madvise(mmap.MADV_HUGEPAGE if thp else mmap.MADV_NOHUGEPAGE)
        except (OSError, AttributeError) as e:  # THP compiled out
            if thp:
                notes.append(f"MADV_HUGEPAGE refused: {e}")
        offset = 0
    whole = np.frombuffer(mm, dtype=np.uint8)
    base = int(whole.ctypes.data)
    if not hugetlb_kb and thp and nbytes >= THP_SIZE:
        offset = (-base) % THP_SIZE
    r = _apply_policy(base, map_len, policy)
    if not r:
        notes.append(f"placement {policy} not applied, plain allocation: {r.reason}")
    arr = whole[offset:offset + nbytes]
    del whole
    return PlacedBuffer(label=label, kind=kind, policy=policy, array=arr, base=base, map_len=map_len,
                        intended=policy.nodes if intended is None else tuple(intended),
                        hugetlb_kb=hugetlb_kb, thp=thp and not hugetlb_kb,
                        note="; ".join(notes), _mm=mm)


@dataclass(frozen=True)
class MigrateResult:
    ok: bool
    seconds: float
    method: str
    reason: str = ""


MOVE_ATTEMPTS = 4  # move_pages passes over the pages that did not move (transient refusals)


def _present_pages(buf: PlacedBuffer) -> list[int]:
    addrs = list(range(buf.base, buf.base + buf.map_len, PAGE))
    out: list[int] = []
    for i in range(0, len(addrs), 4096):
        chunk = addrs[i:i + 4096]
        r = sc.move_pages(chunk)
        if not r:
            return []
        out.extend(a for a, s in zip(chunk, r.value) if s >= 0)
    return out


def _move_pages_to(buf: PlacedBuffer, policy: Policy) -> sc.CallResult:
    """Move present pages: bind/preferred -> that node, interleave -> round robin
    (per huge page when the buffer uses THP, so one huge page gets one target)."""
    pages = _present_pages(buf)
    nodes = policy.nodes
    gran = THP_SIZE if buf.thp else PAGE
    for i in range(0, len(pages), 4096):
        chunk = pages[i:i + 4096]
        targets = [nodes[((a - buf.base) // gran) % len(nodes)] for a in chunk]
        for attempt in range(MOVE_ATTEMPTS):
            r = sc.move_pages(chunk, targets, sc.MPOL_MF_MOVE)
            if not r:
                return r
            # a page the kernel could not take this time (locked, under a huge-page split or
            # collapse: -EBUSY/-EAGAIN, or left where it was) is asked for again
            left = [(a, t) for a, t, st in zip(chunk, targets, r.value)
                    if st != t and st not in (-errno.ENOENT, -errno.EFAULT)]
            if not left:
                break
            chunk, targets = [a for a, _ in left], [t for _, t in left]
            time.sleep(0.01 * (attempt + 1))
    return sc.CallResult(True, len(pages))


def migrate(buf: PlacedBuffer, policy: Policy, *, intended: tuple[int, ...] | None = None) -> MigrateResult:
    """Give ``buf`` a new policy and move its existing pages accordingly (timed).

    mbind(MPOL_MF_MOVE|MPOL_MF_STRICT) sets the policy and moves the pages that sit
    outside the new nodemask; when some pages refuse (EIO) move_pages takes over.
    For interleave, mbind leaves pages already inside the set where they are (all
    on node 0 stays all on node 0), so move_pages then spreads them round robin.
    """
    t0 = time.perf_counter()
    method = "mbind"
    r = _apply_policy(buf.base, buf.map_len, policy, sc.MPOL_MF_MOVE | sc.MPOL_MF_STRICT)
    if not r and policy.kind != "default" and r.errno == errno.EIO:
        method = "move_pages"
        r = _move_pages_to(buf, policy)
    elif r and policy.kind == "interleave" and len(policy.nodes) > 1:
        method = "mbind+move_pages"
        r = _move_pages_to(buf, policy)
    dt = time.perf_counter() - t0
    if r:
        buf.policy = policy
        buf.intended = policy.nodes if intended is None else tuple(intended)
        buf.note = ""
    return MigrateResult(bool(r), dt, method, r.reason)


def first_touch(array: np.ndarray, ranges: list[tuple[int, int]], workers: "WorkerPool",
                value: int = 0) -> None:
    """Worker i writes ``array[lo:hi]`` for ``ranges[i]``, so those pages land on its node."""
    if len(ranges) != len(workers.workers):
        raise ValueError(f"{len(ranges)} ranges for {len(workers.workers)} workers")

    def touch(i: int) -> None:
        lo, hi = ranges[i]
        if hi > lo:
            array[lo:hi] = value

    workers.run(touch)

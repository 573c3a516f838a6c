"""Memory need per node vs free memory per node, checked BEFORE allocating.

A refused plan raises ``BudgetError`` whose message lists need and free per node,
so a long load never dies halfway through on one full node.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from ..errors import UserError

if TYPE_CHECKING:
    from .topology import Topology


class BudgetError(UserError, MemoryError):
    """The plan does not fit; ``str()`` gives need and free per node (a user error: one line)."""

    def __init__(self, message: str, need: Mapping[int, int], free: Mapping[int, int]):
        super().__init__(message)
        self.need = dict(need)
        self.free = dict(free)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def free_per_node(topology: "Topology") -> dict[int, int]:
    """Memory a new allocation can get per node: MemFree plus reclaimable page cache
    (FilePages minus Shmem, which cannot be dropped)."""
    return {n.id: n.mem_free + max(0, n.file_pages - n.shmem) for n in topology.nodes}


@dataclass(frozen=True)
class BudgetCheck:
    need: dict[int, int]
    free: dict[int, int]

    def lines(self) -> list[str]:
        out = []
        for nid in sorted(set(self.need) | set(self.free)):
            need, free = self.need.get(nid, 0), self.free.get(nid, 0)
            short = f"  <- short by {fmt_bytes(need - free)}" if need > free else ""
            out.append(f"  node {nid}: need {fmt_bytes(need)}, free {fmt_bytes(free)}{short}")
        return out

    @property
    def fits(self) -> bool:
        return all(v <= self.free.get(k, 0) for k, v in self.need.items() if v > 0)


def check_need(need: Mapping[int, int], topology: "Topology", what: str = "placement",
               free: Mapping[int, int] | None = None, reserve: int = 0) -> BudgetCheck:
    """Raise BudgetError unless ``need`` (bytes per node) fits ``free`` minus ``reserve`` per node."""
    avail = dict(free if free is not None else free_per_node(topology))
    avail = {k: max(0, v - reserve) for k, v in avail.items()}
    chk = BudgetCheck({k: int(v) for k, v in need.items()}, avail)
    if not chk.fits:
        raise BudgetError(f"{what} does not fit in memory per node (nothing was allocated):\n"
                          + "\n".join(chk.lines()), chk.need, chk.free)
    return chk


def check_hugepages(need_pages: Mapping[int, int], size_kb: int, topology: "Topology") -> None:
    """Raise BudgetError unless each node has ``need_pages`` free explicit huge pages of ``size_kb``."""
    free: dict[int, int] = {}
    for n in topology.nodes:
        hp = next((h for h in n.hugepages if h.size_kb == size_kb), None)
        free[n.id] = hp.free if hp else 0
    short = {k: v for k, v in need_pages.items() if v > free.get(k, 0)}
    if short:
        size = fmt_bytes(size_kb * 1024)
        lines = [f"  node {k}: need {need_pages.get(k, 0)} x {size} pages, free {free.get(k, 0)}"
                 for k in sorted(set(need_pages) | set(free))]
        raise BudgetError(
            f"not enough free {size} huge pages (nothing was allocated); reserve more with "
            f"echo N > /sys/devices/system/node/nodeX/hugepages/hugepages-{size_kb}kB/nr_hugepages:\n"
            + "\n".join(lines),
            {k: v * size_kb * 1024 for k, v in need_pages.items()},
            {k: v * size_kb * 1024 for k, v in free.items()})

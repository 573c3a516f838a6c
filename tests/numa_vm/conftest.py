"""In-guest placement suite: skipped unless the running kernel has >= 2 NUMA nodes.

Run by .ci/numa_vm.sh inside virtme-ng guests with 2 and 4 nodes (one memory-only).
Every measured placement share is printed in the terminal summary.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from workbench.numa import WorkerPool, load_topology

SHARES: list[str] = []


def pytest_collection_modifyitems(config, items):
    topo = load_topology()
    if len(topo.node_ids) < 2:
        skip = pytest.mark.skip(reason=f"needs a kernel with >= 2 NUMA nodes (this one has {len(topo.node_ids)})")
        here = Path(__file__).parent
        for item in items:  # this hook sees the whole session: mark only our own tests
            if here in Path(item.fspath).parents:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def no_numa_balancing():
    """Automatic NUMA balancing off while the guest proves placements (as numawb's docs advise for
    measurements): its scanner unmaps pages for hinting faults and migrates them, and a proof
    taken then read 254 of a first-touched buffer's 256 pages as absent (CI, 4-node guest, a
    busy host). The placement mechanics are what these tests prove, not the balancer."""
    from workbench.numa import disable_numa_balancing, numa_balancing
    guard = None
    if numa_balancing() and os.geteuid() == 0:
        guard = disable_numa_balancing()
    yield
    if guard is not None:
        guard.restore()


@pytest.fixture(scope="session")
def topo():
    return load_topology()


@pytest.fixture(scope="session")
def pool(topo):
    p = WorkerPool(policy="distribute", smt=True, topology=topo)
    yield p
    p.close()


@pytest.fixture
def record():
    """record(test_label, proof) keeps a line for the summary."""
    def add(what: str, proof) -> None:
        SHARES.append(f"{what}: {proof.line()}")
    return add


def pytest_terminal_summary(terminalreporter):
    if SHARES:
        topo = load_topology()
        terminalreporter.section(f"NUMA placement measured on {len(topo.node_ids)} nodes "
                                 f"(cpu nodes {list(topo.cpu_node_ids)})")
        for line in SHARES:
            terminalreporter.write_line(line)

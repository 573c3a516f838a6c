"""The one-node host seen as the 2-node guest of `scripts/numa_vm_proof.sh`, for its `--warm` runs.

The guest loads numawb's compiled code from the Numba cache the host fills first; a call the host
never ran, the guest compiles under emulation (~20 minutes for the `slice` decode of the `--record`
session). On one node `slice`, `mirror`, `experts` and `auto` hold one whole copy of every tensor,
so the products, the prompt's split and the token's jobs take the one-copy paths; the guest's two
nodes take the others. `two_nodes()` makes `load_topology()` answer the host's CPUs as two nodes,
the first half on node 0, the rest on node 1 (the guest: CPU 0 on node 0, CPU 1 on node 1), each
with the guest's 4 GiB, so the plans (`auto`'s choice included), the layouts, the KV owners and the
compiled calls are the guest's. Memory policies naming node 1 are refused by the host's kernel
(`memory.alloc` keeps the plain allocation and notes it), the workers report themselves misplaced:
nothing about placement is proven on the host, only the code is compiled.
"""
from __future__ import annotations

import dataclasses
import sys

GUEST_NODE_BYTES = 4112756736      # MemTotal of each of the guest's two 4 GiB nodes
GUEST_NODE_FREE = 3870000000       # about what the guest's nodes have free before a load


def two_nodes() -> None:
    """Every `load_topology` of the live machine (root None) -> the host's CPUs as two nodes."""
    import workbench.app  # noqa: F401 - the modules that bind load_topology by name, imported first
    import workbench.cli  # noqa: F401
    import workbench.numa  # noqa: F401
    import workbench.numa.plan  # noqa: F401
    import workbench.numa.workers  # noqa: F401
    import workbench.telemetry  # noqa: F401
    from workbench.numa import topology as topo_mod
    real = topo_mod.load_topology
    if getattr(real, "two_nodes", False):
        return

    def load_topology(root=None):
        t = real(root)
        if root is not None or len(t.nodes) != 1 or len(t.online_cpus) < 2:
            return t
        n, cpus = t.nodes[0], t.online_cpus
        half = (len(cpus) + 1) // 2
        parts = (tuple(cpus[:half]), tuple(cpus[half:]))
        nodes = tuple(dataclasses.replace(
            n, id=i, cpus=cs, distances={0: 10, 1: 21} if i == 0 else {0: 21, 1: 10},
            mem_total=GUEST_NODE_BYTES, mem_free=min(GUEST_NODE_FREE, n.mem_free // 2),
            file_pages=0, anon_pages=0, shmem=0, hugepages=()) for i, cs in enumerate(parts))
        return dataclasses.replace(t, nodes=nodes, cpu_node={c: i for i, cs in enumerate(parts) for c in cs},
                                   degraded=None)
    load_topology.two_nodes = True
    for m in list(sys.modules.values()):
        if getattr(m, "load_topology", None) is real:
            m.load_topology = load_topology

"""A decoded token's attention on two real nodes reads only its node's KV pages (issue 47).

A dense GQA llama and a deepseek2 with MLA (tests/numa_vm/vm_models.py) decode past a 100-token
prompt with two workers, one per node; each node's worker owns the cache's position blocks it
first-touched. Every chunk the crew runs is logged with the CPU that ran it
(`engine.chunk_log.ChunkLog`): each worker's key chunks read only its own owner's positions, the
two together every position once, and every KV byte a worker read is on its node (move_pages), as
are the owner's pages. benchmarks/numa_vm_proof.py prints the same figures as tables.

The engine's compiled code comes from the host: `.ci/numa_vm.sh` writes the files and runs the
proof once on the host (`--warm`, two owners standing for two nodes) into a Numba cache built for
one fixed target, and gives the guest its folder (NUMAWB_VM_MODELS, NUMBA_CACHE_DIR, ...);
compiling under emulation would take far longer. Without that folder the test is skipped.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

OK = 0.99
PROMPT, DECODE = 100, 3


class Line:
    def __init__(self, text: str):
        self.text = text

    def line(self) -> str:
        return self.text


def models() -> list[str]:
    folder = os.environ.get("NUMAWB_VM_MODELS", "")
    from vm_models import FILES
    paths = [os.path.join(folder, f) for f in FILES]
    if not folder or not all(os.path.exists(p) for p in paths):
        pytest.skip("needs the files and warm Numba cache of .ci/numa_vm.sh (NUMAWB_VM_MODELS)")
    return paths


@pytest.mark.parametrize("which", [0, 1], ids=["llama-gqa", "deepseek2-mla"])
def test_decoded_attention_reads_only_its_nodes_kv(which, topo, record):
    if len(topo.cpu_node_ids) != 2:
        pytest.skip("the host-warmed cache holds the two-owner calls (a 2-node guest)")
    from workbench.engine import Engine
    from workbench.engine import runtime
    from workbench.engine.chunk_log import ChunkLog, bytes_by_node, kv_reads
    from workbench.engine.engine import Placement
    from workbench.numa.proof import BufferProof, page_nodes
    runtime.CREW_STARVED = 1 << 40   # no solo passes (the caller taking the other node's chunks)
    eng = Engine.load(models()[which], placement=Placement(threads=2))
    try:
        pool = eng.pool
        assert sorted(w.node for w in pool.workers) == sorted(topo.cpu_node_ids)
        s = eng.new_session(256)
        rng = np.random.default_rng(7)
        s.eval([int(t) for t in rng.integers(4, eng.cfg.n_vocab, PROMPT)])
        s.eval([int(rng.integers(4, eng.cfg.n_vocab))])   # the crew starts here
        kv = s.kv
        assert kv.n_workers == 2
        owner_node = [pool.workers[ws[0]].node for ws in kv.owner_workers]
        assert sorted(owner_node) == sorted(topo.cpu_node_ids)
        with ChunkLog(eng.rt.crew) as log:
            for _ in range(DECODE):
                s.eval([int(rng.integers(4, eng.cfg.n_vocab))])
        assert log.reads and log.dropped == 0
        n_pos = PROMPT + 1 + DECODE
        for o, node in enumerate(owner_node):   # the owner's pages, every layer
            counts: dict[int, int] = {}
            for il in range(eng.cfg.n_layer):
                for a in kv.k_bytes[il][o] + kv.v_bytes[il][o]:
                    for st in page_nodes(a).value:
                        counts[st] = counts.get(st, 0) + 1
            p = BufferProof(f"KV owner {o}", "kv", (node,), 0, sum(counts.values()),
                            {k: v for k, v in counts.items() if k >= 0})
            record(f"{eng.cfg.arch} KV pages", p)
            assert p.share >= OK, counts
        cpu_node = {w.cpu: w.node for w in pool.workers}
        seen: list[int] = []
        by_cpu = kv_reads(log.reads, kv)
        assert sorted(by_cpu) == sorted(cpu_node)   # both nodes' workers attended
        for cpu, (owner_pos, reads) in by_cpu.items():
            node = cpu_node[cpu]
            assert {owner_node[o] for o, _ in owner_pos} == {node}   # only its node's owner
            by = bytes_by_node(reads)
            local = by.get(node, 0) / sum(by.values())
            record(f"{eng.cfg.arch} KV reads", Line(f"cpu {cpu} (node {node}): {len(owner_pos)} positions, "
                                                   f"{sum(by.values())} bytes, {100 * local:.1f}% on node {node}"))
            assert local >= OK, by
            seen.extend(pos for _, pos in owner_pos)
        assert sorted(seen) == list(range(n_pos))   # every position, by exactly one node's worker
    finally:
        eng.close()

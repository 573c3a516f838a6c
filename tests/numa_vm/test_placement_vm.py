"""Real placement on a multi-node kernel: every weights mode, KV modes, live switches.

Shares are asserted (>= 99 %), not exact page counts: a page at a boundary may land
either way (see ../shared/docs/numa-vm.md). Buffers are a few MiB: the guest is
emulated and slow.
"""
from __future__ import annotations

import numpy as np

from workbench.numa import (Policy, TensorSpec, alloc, migrate, place_kv, place_weights, prove,
                            row_split, switch_weights)
from workbench.numa import syscalls as sc
from workbench.numa.proof import prove_array, prove_buffer

SPECS = [TensorSpec("blk.0.ffn_up", 512, 8192),     # 4 MiB: sliced
         TensorSpec("blk.0.attn_q", 96, 4096),
         TensorSpec("blk.0.attn_norm", 1, 4096)]    # 1-D: mirrored in slice mode
OK = 0.99


def fill(layout, seed=0):
    rng = np.random.default_rng(seed)
    data = {s.name: rng.integers(0, 256, (s.rows, s.row_bytes), dtype=np.uint8) for s in SPECS}
    for s in SPECS:
        layout.write_rows(s.name, 0, data[s.name])
    return data


def check_bytes(layout, data, pool):
    for s in SPECS:
        for w in range(pool.n_threads):
            arr, first = layout.array_for(s.name, w)
            np.testing.assert_array_equal(arr, data[s.name][first:first + arr.shape[0]])


def numa_maps_of(buf):
    """The kernel's own per-node count for the mapping (numa_maps walks the page tables itself):
    evidence for a failure message when move_pages and the pages disagree."""
    from workbench.numa.proof import read_numa_maps
    lo = buf.array.ctypes.data
    return [v for v in read_numa_maps() if v.start <= lo < v.end]


class Pinned:
    """Pin the calling thread to one CPU for a block (the 'loader' of none mode)."""

    def __init__(self, cpu):
        self.cpu = cpu

    def __enter__(self):
        import os
        self.old = os.sched_getaffinity(0)
        assert sc.sched_setaffinity([self.cpu])

    def __exit__(self, *a):
        sc.sched_setaffinity(sorted(self.old))


def test_workers_run_on_their_nodes(pool, topo):
    assert pool.nodes == list(topo.cpu_node_ids)
    for w in pool.check():
        assert w.actual_cpu == w.cpu and w.actual_node == w.node and not w.misplaced


def test_alloc_bind_each_node(topo, record):
    for n in topo.node_ids:  # includes memory-only nodes
        buf = alloc(4 << 20, Policy("bind", (n,)), label=f"bind node {n}")
        buf.array[:] = 1
        p = prove_buffer(buf)
        record("alloc", p)
        assert p.share >= OK
        buf.close()


def test_mirror_replicas_on_their_nodes(pool, record):
    layout = place_weights(SPECS, "mirror", pool)
    data = fill(layout)
    proofs = prove(layout.buffers())
    assert len(proofs) == len(pool.nodes)
    for p in proofs:
        record("mirror", p)
        assert len(p.intended) == 1 and p.share >= OK
    for w in pool.workers:  # each worker reads its own node's replica
        arr, first = layout.array_for("blk.0.ffn_up", w.index)
        assert first == 0
        assert prove_array(arr, f"replica of worker {w.index}", (w.node,)).share >= OK
    check_bytes(layout, data, pool)
    layout.close()


def test_interleave_spreads(pool, record):
    layout = place_weights(SPECS, "interleave", pool, thp=False)
    data = fill(layout)
    (p,) = prove(layout.buffers())
    record("interleave", p)
    assert p.share >= OK and set(p.intended) == set(pool.nodes)
    assert p.spread >= 0.8
    check_bytes(layout, data, pool)
    layout.close()


def _worker_rows_proof(layout, pool, name):
    """Share of each worker's own rows (row_split) that sit on the worker's node."""
    spec = layout.specs[name]
    out = []
    for w, (lo, hi) in zip(pool.workers, row_split(spec.rows, pool.n_threads)):
        arr, first = layout.array_for(name, w.index)
        rows = arr[lo - first:hi - first]
        out.append(prove_array(rows, f"{name} rows {lo}-{hi} of worker {w.index}", (w.node,)))
    return out


def test_slice_rows_on_node_of_their_workers(pool, record):
    layout = place_weights(SPECS, "slice", pool)
    data = fill(layout)
    assert layout.placement["blk.0.attn_norm"] == "mirror"
    assert layout.placement["blk.0.ffn_up"] == "slice"
    for p in prove(layout.buffers()):
        record("slice", p)
        assert p.share >= OK
    for p in _worker_rows_proof(layout, pool, "blk.0.ffn_up"):
        record("slice", p)
        assert p.share >= OK
    held = sum(layout.array_for("blk.0.ffn_up", pool.node_workers(n)[0])[0].shape[0] for n in pool.nodes)
    assert held == 512  # each row held exactly once
    assert layout.full_array("blk.0.ffn_up") is None
    check_bytes(layout, data, pool)
    layout.close()


def test_none_is_first_touch_by_loader(pool, topo, record):
    cpu = topo.node(pool.nodes[-1]).cpus[0]
    with Pinned(cpu):
        layout = place_weights(SPECS, "none", pool)
        fill(layout)
    (p,) = prove(layout.buffers())
    record("none (loader on node %d)" % pool.nodes[-1], p)
    assert p.node_share(pool.nodes[-1]) >= OK
    layout.close()


def test_auto_mixes_within_budget(pool, record):
    big = SPECS[0].nbytes
    # room for everything except a second copy of the big tensor per node
    budget = sum(s.nbytes for s in SPECS) - big // 2
    layout = place_weights(SPECS, "auto", pool, budget=budget)
    assert layout.placement["blk.0.ffn_up"] == "slice"
    assert layout.placement["blk.0.attn_norm"] == "mirror"
    data = fill(layout)
    for p in prove(layout.buffers()):
        record("auto", p)
        assert p.share >= OK
    check_bytes(layout, data, pool)
    layout.close()


def test_kv_first_touch_on_owner_node(pool, record):
    # small pages, as the interleave test: a 1 MiB region in a 2 MiB madvise(MADV_HUGEPAGE) arena
    # is a candidate for khugepaged, whose collapse briefly unmaps the range (move_pages then finds
    # no page): what this test proves is the first touch, not huge pages
    kv = place_kv(4, 256 << 10, "first-touch", pool, thp=False)
    for p in prove(kv.buffers()):
        record("kv first-touch", p)
        assert p.share >= OK and p.absent == 0
    for w in pool.workers:
        region = kv.worker_region(w.index)
        p = prove_array(region, f"kv worker {w.index}", (w.node,), "kv")
        record("kv first-touch", p)
        assert p.share >= OK
    kv.close()


def test_kv_interleave_and_node(pool, topo, record):
    kv = place_kv(4, 256 << 10, "interleave", pool, thp=False)
    for layer in range(4):
        for w in range(pool.n_threads):
            kv.array_for(layer, w)[:] = 1
    (p,) = prove(kv.buffers())
    record("kv interleave", p)
    assert p.share >= OK and p.spread >= 0.8
    kv.close()
    last = topo.node_ids[-1]  # a memory-only node in the 4-node guest
    kv = place_kv(4, 256 << 10, f"node:{last}", pool)
    for layer in range(4):
        for w in range(pool.n_threads):
            kv.array_for(layer, w)[:] = 1
    (p,) = prove(kv.buffers())
    record(f"kv node:{last}", p)
    assert p.share >= OK
    kv.close()


def test_live_switch_moves_pages(pool, topo, record):
    with Pinned(topo.node(pool.nodes[0]).cpus[0]):
        layout = place_weights(SPECS, "none", pool, thp=False)
        data = fill(layout)
    (p,) = prove(layout.buffers())
    assert p.node_share(pool.nodes[0]) >= OK, f"{p.line()}; numa_maps: {numa_maps_of(layout.buffers()[0])}"
    steps = ["interleave", "mirror", "slice", "auto", "interleave", "none"]
    for new in steps:
        layout = switch_weights(layout, new, pool)
        check_bytes(layout, data, pool)
        for p in prove(layout.buffers()):
            record(f"switch -> {new} ({layout.switch_seconds * 1e3:.1f} ms, {layout.switch_method})", p)
            if p.intended:
                assert p.share >= OK
            if len(p.intended) > 1:
                assert p.spread >= 0.8
    layout.close()


def test_migrate_bind_between_nodes(topo, record):
    a, b = topo.node_ids[0], topo.node_ids[-1]
    buf = alloc(4 << 20, Policy("bind", (a,)), label="migrate")
    buf.array[:] = 9
    assert prove_buffer(buf).share >= OK
    res = migrate(buf, Policy("bind", (b,)))
    assert res.ok, res.reason
    p = prove_buffer(buf)
    record(f"migrate node {a} -> {b} ({res.seconds * 1e3:.1f} ms)", p)
    assert p.share >= OK and (buf.array == 9).all()
    buf.close()


def test_interleave_includes_memory_only_nodes(topo, record):
    ids = topo.node_ids
    buf = alloc(8 << 20, Policy("interleave", ids), label="interleave all nodes", thp=False)
    buf.array[:] = 1
    p = prove_buffer(buf)
    record("alloc", p)
    assert p.share >= OK and p.spread >= 0.8
    buf.close()


# ---- mixture-of-experts tensors: experts per node -------------------------------------------

N_EXP, EXP_ROWS, EXP_ROW_BYTES = 8, 128, 4096  # 4 MiB of routed experts


def test_experts_sliced_and_owned_per_node(pool, record):
    """slice: every node holds its rows of every expert; experts: whole experts per node. Each
    expert's rows read back through expert_rows, and the pages are proven on their nodes."""
    spec = TensorSpec("blk.0.ffn_up_exps.weight", N_EXP * EXP_ROWS, EXP_ROW_BYTES, groups=N_EXP)
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, (spec.rows, spec.row_bytes), dtype=np.uint8)
    nodes = pool.nodes
    for mode in ("slice", "experts"):
        layout = place_weights([spec], mode, pool)
        layout.write_rows(spec.name, 0, data)
        pieces = layout.plan.tensors[spec.name].pieces
        assert sorted(p.node for p in pieces) == sorted(nodes)
        if mode == "slice":
            assert all((p.g0, p.g1) == (0, N_EXP) for p in pieces)
        else:
            assert all((p.lo, p.hi) == (0, EXP_ROWS) for p in pieces)
            assert sum(p.g1 - p.g0 for p in pieces) == N_EXP
            for e in range(N_EXP):  # an owned expert is computed by its owner node's workers only
                owner = layout.plan.expert_node(spec.name, e)
                split = layout.expert_split(spec.name, e)
                assert sum(hi - lo for lo, hi in split) == EXP_ROWS
                assert all(hi == lo for w, (lo, hi) in zip(pool.workers, split) if w.node != owner)
        for w in range(pool.n_threads):
            for e in range(N_EXP):
                arr, first = layout.expert_rows(spec.name, w, e)
                np.testing.assert_array_equal(arr, data[e * EXP_ROWS + first:e * EXP_ROWS + first + arr.shape[0]])
        for b in layout.buffers():
            p = prove_buffer(b)
            record(f"{mode} experts {b.label}", p)
            assert p.share >= OK
        layout.close()


def test_each_worker_is_handed_only_local_expert_bytes(pool, record):
    """R1's routed-expert count, narrow (256 experts of 64 rows; the R1-shaped file itself is
    proven by benchmarks/numa_vm_proof.py): in `slice`, `experts` and `mirror` the rows the engine
    hands each worker (`expert_split`, read through `expert_rows`) sit on that worker's node, page
    by page (move_pages); `interleave` spreads them. Every expert row is computed exactly once."""
    from workbench.numa.proof import BufferProof
    n_exp, rows, row_bytes = 256, 64, 1024   # 16 MiB
    spec = TensorSpec("blk.3.ffn_down_exps.weight", n_exp * rows, row_bytes, groups=n_exp)
    data = np.random.default_rng(8).integers(0, 256, (spec.rows, spec.row_bytes), dtype=np.uint8)
    for mode in ("slice", "experts", "mirror", "interleave"):
        layout = place_weights([spec], mode, pool, thp=False)
        layout.write_rows(spec.name, 0, data)
        for e in range(n_exp):
            assert sum(hi - lo for lo, hi in layout.expert_split(spec.name, e)) == rows
        for w in pool.workers:
            pages: set[int] = set()
            for e in range(n_exp):
                lo, hi = layout.expert_split(spec.name, e)[w.index]
                if hi > lo:
                    arr, first = layout.expert_rows(spec.name, w.index, e)
                    part = arr[lo - first:hi - first]
                    np.testing.assert_array_equal(part, data[e * rows + lo:e * rows + hi])
                    a = part.ctypes.data
                    pages.update(range(a // 4096 * 4096, a + part.nbytes, 4096))
            r = sc.move_pages(sorted(pages))
            assert r, r.reason
            counts: dict[int, int] = {}
            for st in r.value:
                counts[st] = counts.get(st, 0) + 1
            p = BufferProof(f"worker {w.index}'s expert rows", "weights", (w.node,), len(pages) * 4096,
                            len(pages), {k: v for k, v in counts.items() if k >= 0})
            record(f"{mode} experts handed", p)
            if mode == "interleave":
                assert p.share < 0.9
            else:
                assert p.share >= OK, f"{mode}: {counts}"
        layout.close()

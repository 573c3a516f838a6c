"""`numawb probe` and `numawb advise` on a real multi-node kernel (2 and 4 nodes, one memory-only).

The probe measures every CPU node against every memory node (in an emulated guest the figures
are the emulator's, so only their shape and sign are asserted); `advise --no-measure` predicts
every placement of the tiny model from them (the engine's constants would need its kernels
compiled in the emulated guest: minutes). The page-cache check names the node a file's cached
pages were written on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench.advisor.checks import page_cache_state
from workbench.numa.modes import WEIGHT_MODES

MiB = 1 << 20


def numawb(*args: str, cache: str, timeout: int = 300) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    r = subprocess.run([sys.executable, "-m", "workbench", *args, "--json", "-q"], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(scope="module")
def probed(cache) -> dict:
    return numawb("probe", cache=cache)


def test_probe_matrices_have_a_row_per_cpu_node_and_a_column_per_node(probed, topo):
    cpu_nodes, nodes = list(topo.cpu_node_ids), list(topo.node_ids)
    assert probed["cpu_nodes"] == cpu_nodes and probed["nodes"] == nodes
    for name in ("bandwidth", "latency_ns"):
        m = probed[name]
        assert sorted(int(i) for i in m) == cpu_nodes, name
        for i in cpu_nodes:
            assert sorted(int(j) for j in m[str(i)]) == nodes, name
            assert all(v > 0 for v in m[str(i)].values()), name
    for i in cpu_nodes:
        assert probed["scaling"][str(i)][0][0] == 1
    print(f"probe on {len(nodes)} nodes: " + "; ".join(
        f"node {i}: " + ", ".join(f"{float(v) / 1e9:.2f}" for v in probed["bandwidth"][str(i)].values())
        + " GB/s" for i in cpu_nodes))
    mem_only = [n.id for n in topo.nodes if n.memory_only]
    assert [w["code"] == "memory-only-node" for w in probed["warnings"]].count(True) == len(mem_only)


def test_advise_predicts_every_mode_and_memory_adds_up(probed, cache, tiny_model, topo):
    d = numawb("advise", "-m", tiny_model, "-c", "512", "--no-measure", cache=cache)
    assert d["machine"]["simulated"] is False and d["machine"]["profile_source"] == "probed"
    weight_bytes = d["model"]["weight_bytes"]
    cands = d["candidates"]
    everywhere = [c for c in cands if c["nodes"] == list(topo.cpu_node_ids)]
    assert everywhere, [c["nodes"] for c in cands]
    covered = {(c["weights"], c["kv"]) for c in everywhere} | \
        {tuple(s.split("/", 1)) for c in everywhere for s in c["same_as"]}
    kvs = ["first-touch"] + (["interleave"] if len(topo.cpu_node_ids) > 1 else []) + \
        [f"node:{n.id}" for n in topo.nodes if n.memory_only]
    for w in WEIGHT_MODES:
        for kv in kvs:
            assert (w, kv) in covered, (w, kv)
    for c in cands:
        assert c["predicted_decode_tps"] > 0 and c["bytes_per_token"] > 0
        mem, wpn, kpn = (c[k] for k in ("memory_per_node", "weights_per_node", "kv_per_node"))
        assert set(mem) <= {str(n) for n in topo.node_ids}
        for n, v in mem.items():
            assert v == wpn.get(n, 0) + kpn.get(n, 0)
        w_total, n_nodes = sum(wpn.values()), len(c["nodes"])
        if c["weights"] == "none" or n_nodes == 1:
            assert w_total == weight_bytes, c["weights"]
        elif c["weights"] == "interleave":  # each tensor's bytes split over the nodes, rounded up per node
            assert weight_bytes <= w_total <= weight_bytes * 1.001
        elif c["weights"] == "mirror":
            assert w_total == n_nodes * weight_bytes and all(int(n) in c["nodes"] for n in wpn)
        elif c["weights"] == "slice":  # 1-D tensors are mirrored: slightly more than one copy
            assert weight_bytes <= w_total < 1.1 * weight_bytes
        if c["kv"].startswith("node:"):
            assert list(kpn) == [c["kv"][5:]]
    kv_totals = {sum(c["kv_per_node"].values()) for c in everywhere}
    assert len(kv_totals) == 1 and kv_totals.pop() > 0
    assert isinstance(d["recommended"], int) and d["reason"]
    print(f"advise on {len(topo.node_ids)} nodes: {d['reason']}")


def test_page_cache_is_attributed_to_the_node_that_wrote_it(tmp_path, topo):
    node = topo.cpu_node_ids[-1]
    old = os.sched_getaffinity(0)
    p = tmp_path / "model.bin"
    try:
        os.sched_setaffinity(0, topo.node(node).cpus)
        with open(p, "wb") as f:
            f.write(os.urandom(8 * MiB))
        p.read_bytes()
    finally:
        os.sched_setaffinity(0, old)
    st = page_cache_state(p)
    assert st.resident_fraction > 0.9 and not st.node_error
    known = sum(st.node_pages.values())
    assert known and st.node_pages.get(node, 0) / known >= 0.9, st.node_pages
    print(f"page cache of a file written on node {node}: {st.node_pages}")

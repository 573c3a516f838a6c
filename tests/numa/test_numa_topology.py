"""Topology from the shipped fixture trees, the degrade path, views and CPU plans."""
from __future__ import annotations

import json

import pytest

from workbench.numa import fixture_names, fixture_path, format_topo, load_topology, plan_cpus, topo_json
from workbench.numa.topology import format_cpulist, parse_cpulist


def topo(name):
    return load_topology(fixture_path(name))


def test_all_fixtures_shipped():
    assert fixture_names() == sorted(["laptop-1node", "epyc-2socket", "xeon-8node-smt", "snc-2x2",
                                      "cxl-memory-only", "offline-cpus",
                                      # the advisor's machines of the seeds' published runs
                                      "epyc-9275f-2s", "epyc-9115-2s", "xeon-e5-2690v3-2s"])
    with pytest.raises(FileNotFoundError, match="available: cxl-memory-only"):
        fixture_path("nope")


def test_cpulist_roundtrip():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert format_cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_laptop():
    t = topo("laptop-1node")
    assert t.node_ids == (0,)
    assert t.nodes[0].cpus == tuple(range(8))
    assert t.nodes[0].distances == {0: 10}
    assert t.sockets == {0: tuple(range(8))}
    assert t.smt_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert t.physical_cpus() == [0, 1, 2, 3]
    assert t.numa_balancing is None
    assert t.thp == "madvise"
    assert t.simd == "avx2"
    assert t.nodes[0].mem_total == 16 * 2**30
    assert t.degraded is None


def test_epyc_2socket():
    t = topo("epyc-2socket")
    assert t.node_ids == (0, 1)
    assert t.nodes[0].cpus == tuple(range(16)) + tuple(range(32, 48))
    assert t.nodes[1].cpus == tuple(range(16, 32)) + tuple(range(48, 64))
    assert t.distance(0, 1) == 32 and t.distance(1, 1) == 10
    assert set(t.sockets) == {0, 1}
    assert t.sockets[1] == tuple(range(16, 32)) + tuple(range(48, 64))
    assert (0, 32) in t.smt_groups and len(t.smt_groups) == 32
    hp = t.node(1).hugepages
    assert [(h.size_kb, h.total, h.free) for h in hp] == [(2048, 1024, 512), (1048576, 0, 0)]
    assert t.numa_balancing == 1
    assert t.simd == "avx512-vnni"


def test_xeon_8node_smt():
    t = topo("xeon-8node-smt")
    assert t.node_ids == tuple(range(8))
    for i, n in enumerate(t.nodes):
        assert n.cpus == tuple(range(4 * i, 4 * i + 4)) + tuple(range(32 + 4 * i, 36 + 4 * i))
    assert t.distance(0, 3) == 12 and t.distance(0, 4) == 32 and t.distance(5, 7) == 12
    assert t.sockets[0] == tuple(range(16)) + tuple(range(32, 48))
    assert len(t.smt_groups) == 32 and all(len(g) == 2 for g in t.smt_groups)
    assert t.node(5).mem_free < 200 * 2**20  # the nearly-full node of the discussion
    assert "amx_tile" in t.cpu_flags


def test_snc_2x2():
    t = topo("snc-2x2")
    assert t.node_ids == (0, 1, 2, 3)
    assert [n.cpus for n in t.nodes] == [tuple(range(4 * i, 4 * i + 4)) for i in range(4)]
    assert t.sockets == {0: tuple(range(8)), 1: tuple(range(8, 16))}
    assert t.distance(0, 1) == 12 and t.distance(1, 2) == 21
    assert all(len(g) == 1 for g in t.smt_groups)
    assert [(h.size_kb, h.total) for h in t.node(0).hugepages] == [(2048, 0), (1048576, 4)]


def test_cxl_memory_only():
    t = topo("cxl-memory-only")
    assert t.node_ids == (0, 1)
    assert t.node(1).cpus == () and t.node(1).memory_only
    assert t.cpu_node_ids == (0,)
    assert t.node(1).mem_total == 128 * 2**30
    assert t.thp == "always"


def test_offline_cpus():
    t = topo("offline-cpus")
    assert t.online_cpus == (0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13)
    assert t.offline_cpus == (6, 7, 14, 15)
    assert t.node(1).cpus == (8, 9, 10, 11, 12, 13)
    assert t.sockets == {0: (0, 1, 2, 3, 4, 5), 1: (8, 9, 10, 11, 12, 13)}
    assert 6 not in t.cpu_node


def test_degrades_without_node_dir(tmp_path):
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1024 kB\nMemFree: 512 kB\nCached: 100 kB\n")
    t = load_topology(tmp_path)
    assert t.node_ids == (0,) and t.nodes[0].cpus == (0, 1, 2, 3)
    assert t.nodes[0].mem_free == 512 * 1024
    assert "missing" in t.degraded and "one node" in t.degraded
    assert "note:" in format_topo(t)
    assert t.numa_balancing is None and t.thp is None and t.simd == "generic"


def test_live_topology_loads():
    t = load_topology()
    assert t.nodes and set(t.allowed_cpus) <= set(t.online_cpus)
    assert all(t.node_of(c) in t.node_ids for c in t.online_cpus)


def test_format_topo_like_numactl():
    out = format_topo(topo("epyc-2socket"))
    assert out.splitlines()[0] == "available: 2 nodes (0-1)"
    assert "node 0 size: 262144 MB" in out
    assert "node 1 hugepages 2048kB: 1024 total, 512 free" in out
    assert "   0:  10  32" in out and "   1:  32  10" in out
    assert "socket 1: cpus 16-31,48-63 (nodes 1)" in out
    assert "SMT: 2 threads per core, 32 cores" in out
    assert "numa_balancing: 1 (on)" in out
    assert "cpu kernel path: avx512-vnni" in out
    cxl = format_topo(topo("cxl-memory-only"))
    assert "node 1 cpus: (none: memory-only node)" in cxl
    assert "offline: 6-7,14-15" in format_topo(topo("offline-cpus"))


@pytest.mark.parametrize("name", ["laptop-1node", "epyc-2socket", "xeon-8node-smt", "snc-2x2",
                                  "cxl-memory-only", "offline-cpus"])
def test_topo_json_roundtrips(name):
    t = topo(name)
    d = json.loads(json.dumps(topo_json(t)))
    assert [n["id"] for n in d["nodes"]] == list(t.node_ids)
    assert d["online_cpus"] == list(t.online_cpus)
    assert d["numa_balancing"] == t.numa_balancing


# ---- CPU plans on fixtures ----------------------------------------------

def test_distribute_8_nodes_consecutive_physical():
    t = topo("xeon-8node-smt")
    plan, notes = plan_cpus(t, None, "distribute")
    assert len(plan) == 32 and not notes
    assert [nd for _, nd in plan] == [i // 4 for i in range(32)]
    assert [c for c, _ in plan[:4]] == [0, 1, 2, 3]
    plan, _ = plan_cpus(t, 16, "distribute")
    assert [nd for _, nd in plan] == [i // 2 for i in range(16)]
    plan, _ = plan_cpus(t, None, "distribute", smt=True)
    assert len(plan) == 64 and [c for c, _ in plan[:8]] == [0, 1, 2, 3, 32, 33, 34, 35]


def test_isolate_and_subset():
    t = topo("snc-2x2")
    plan, _ = plan_cpus(t, None, "isolate:2")
    assert plan == [(8, 2), (9, 2), (10, 2), (11, 2)]
    plan, _ = plan_cpus(t, 4, "distribute:0,1")
    assert plan == [(0, 0), (1, 0), (4, 1), (5, 1)]


def test_explicit_cpus_regrouped_by_node():
    t = topo("epyc-2socket")
    plan, notes = plan_cpus(t, None, "distribute", cpus=[0, 16, 1, 17])
    assert plan == [(0, 0), (1, 0), (16, 1), (17, 1)]
    assert any("regrouped" in n for n in notes)


def test_memory_only_and_offline_get_no_workers():
    plan, _ = plan_cpus(topo("cxl-memory-only"), None, "distribute")
    assert {nd for _, nd in plan} == {0}
    plan, _ = plan_cpus(topo("offline-cpus"), None, "distribute")
    assert [c for c, _ in plan] == [0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13]


def test_oversubscription_noted():
    plan, notes = plan_cpus(topo("laptop-1node"), 6, "distribute")
    assert len(plan) == 6 and any("oversubscribed" in n for n in notes)
    with pytest.raises(ValueError):
        plan_cpus(topo("laptop-1node"), 2, "bogus")

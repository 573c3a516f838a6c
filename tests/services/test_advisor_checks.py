"""Warnings with the fix (`advise`, `probe`, the app's advice panel): each detected on a fixture
tree that has the problem and absent on a clean one; the page-cache check on real files."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


from workbench.advisor.checks import (PageCacheState, advice_warnings, hugepage_warnings, machine_warnings,
                                      page_cache_state, page_cache_warnings)
from workbench.numa.topology import fixture_path, load_topology

CLEAN = "epyc-9275f-2s"  # 2 sockets, 2 nodes, numa_balancing 0, THP madvise, no memory-only node
MiB, GiB = 1 << 20, 1 << 30


def tree(tmp_path: Path, name: str = CLEAN) -> Path:
    """A writable copy of a shipped fixture tree."""
    dst = tmp_path / name
    shutil.copytree(fixture_path(name), dst)
    return dst


def codes(warnings) -> list[str]:
    return [w.code for w in warnings]


def test_clean_machine_has_no_warnings(tmp_path):
    ws = machine_warnings(load_topology(tree(tmp_path)))
    assert ws == []


def test_numa_balancing_on(tmp_path):
    root = tree(tmp_path)
    (root / "proc/sys/kernel/numa_balancing").write_text("1\n")
    ws = machine_warnings(load_topology(root))
    assert codes(ws) == ["numa-balancing"]
    assert "numa_balancing = 1" in ws[0].message and "echo 0 > /proc/sys/kernel/numa_balancing" in ws[0].fix
    assert "numa-balancing" in codes(machine_warnings(load_topology(fixture_path("epyc-2socket"))))


def test_numa_balancing_on_one_node_says_nothing(tmp_path):
    root = tree(tmp_path, "laptop-1node")
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/numa_balancing").write_text("1\n")
    topo = load_topology(root)
    assert topo.numa_balancing == 1 and machine_warnings(topo) == []


def test_sub_numa_clustering():
    ws = machine_warnings(load_topology(fixture_path("snc-2x2")))
    assert codes(ws) == ["sub-numa"]
    assert "4 NUMA nodes with CPUs on 2 sockets" in ws[0].message and "NPS1" in ws[0].fix


def test_nps0_one_node_over_two_sockets(tmp_path):
    root = tree(tmp_path, "laptop-1node")
    cpus = sorted(load_topology(root).online_cpus)
    for c in cpus[len(cpus) // 2:]:
        (root / f"sys/devices/system/cpu/cpu{c}/topology/physical_package_id").write_text("1\n")
    topo = load_topology(root)
    assert len(topo.sockets) == 2 and len(topo.node_ids) == 1
    assert codes(machine_warnings(topo)) == ["nps0"]


def test_transparent_huge_pages_off(tmp_path):
    root = tree(tmp_path)
    (root / "sys/kernel/mm/transparent_hugepage/enabled").write_text("always madvise [never]\n")
    ws = machine_warnings(load_topology(root))
    assert codes(ws) == ["thp-off"]
    assert "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled" in ws[0].fix


def test_memory_only_node():
    topo = load_topology(fixture_path("cxl-memory-only"))
    ws = [w for w in machine_warnings(topo) if w.code == "memory-only-node"]
    assert len(ws) == 1 and "node 1 has" in ws[0].message and "no CPUs" in ws[0].message
    assert "--kv node:1" in ws[0].fix


def test_too_few_free_huge_pages():
    topo = load_topology(fixture_path("epyc-2socket"))  # 2 MiB pages: node 0 1024 free, node 1 512 of 1024
    assert hugepage_warnings(topo, {0: 1 * GiB, 1: 1 * GiB}, 2048) == []
    ws = hugepage_warnings(topo, {0: 3 * GiB // 2, 1: 3 * GiB // 2}, 2048)
    assert codes(ws) == ["hugepages-free"]
    assert "node 1 has 512 free of 1024" in ws[0].message and "node 0" not in ws[0].message
    # node 1 needs 768 pages, has 512 free of 1024 reserved: reserve 256 more
    assert "echo 1280 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages" in ws[0].fix
    assert codes(hugepage_warnings(topo, {0: GiB}, 1 << 20)) == ["hugepages-free"]  # no 1 GiB page reserved


def test_huge_page_size_the_kernel_lacks(tmp_path):
    root = tree(tmp_path)
    for n in (0, 1):
        shutil.rmtree(root / f"sys/devices/system/node/node{n}/hugepages/hugepages-1048576kB")
    ws = hugepage_warnings(load_topology(root), {0: GiB, 1: GiB}, 1 << 20)
    assert codes(ws) == ["hugepages-size"]


def _cold(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _written(path: Path, nbytes: int) -> Path:
    with open(path, "wb") as f:
        f.write(os.urandom(nbytes))
        f.flush()
        os.fsync(f.fileno())
    return path


def test_page_cache_of_a_real_file(tmp_path):
    topo = load_topology()
    p = _written(tmp_path / "model.bin", 24 * MiB)
    p.read_bytes()
    st = page_cache_state(p)
    assert st.exact and st.checked_pages == 24 * MiB // os.sysconf("SC_PAGE_SIZE")
    assert st.resident_fraction > 0.95
    assert st.node_pages and set(st.node_pages) <= set(topo.node_ids) and not st.node_error
    if len(topo.node_ids) == 1:
        assert set(st.node_pages) == {topo.node_ids[0]}
    ws = page_cache_warnings(p, topo)
    assert codes(ws) == ["page-cache-warm"] and "iflag=nocache" in ws[0].fix
    _cold(p)
    st = page_cache_state(p)
    assert st.resident_fraction < 0.05 and sum(st.node_pages.values()) <= st.resident_pages
    assert page_cache_warnings(p, topo) == []


def test_page_cache_sampled_on_a_large_file(tmp_path):
    p = tmp_path / "big.bin"
    with open(p, "wb") as f:  # 4 GiB, sparse after its first 64 MiB
        f.write(os.urandom(64 * MiB))
        f.truncate(4 * GiB)
        os.fsync(f.fileno())
    with open(p, "rb") as f:
        f.read(64 * MiB)
    st = page_cache_state(p)
    assert not st.exact and st.checked_pages < 4 * GiB // os.sysconf("SC_PAGE_SIZE")
    assert 0.5 < st.resident_bytes / (64 * MiB) < 2.0  # the sample's estimate of what was read
    _cold(p)


def test_page_cache_on_the_wrong_node():
    """Placement arithmetic on a fixture machine: the cache sits where the plan lacks free memory."""
    topo = load_topology(fixture_path("epyc-2socket"))
    free1 = topo.node(1).mem_free
    st = PageCacheState("/models/r1.gguf", 40 * GiB, 1000, 1000, True, node_pages={1: 100})
    ws = page_cache_warnings("/models/r1.gguf", topo, {0: free1 // 2, 1: free1 + GiB}, state=st)
    assert codes(ws) == ["page-cache-node"]
    assert "node 1 holds 40.0 GiB" in ws[0].message and "iflag=nocache" in ws[0].fix
    ws = page_cache_warnings("/models/r1.gguf", topo, {0: free1 // 2, 1: free1 // 2}, state=st)
    assert codes(ws) == ["page-cache-warm"]  # room enough: only the warm-load note


def test_fixture_topology_skips_the_live_page_cache(tmp_path):
    p = _written(tmp_path / "m.bin", 4 * MiB)
    p.read_bytes()
    assert advice_warnings(load_topology(tree(tmp_path)), model_path=str(p)) == []


def numawb(*args: str, cache: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_advise_and_probe_report_warnings(tmp_path):
    cache = str(tmp_path / "cache")
    r = numawb("advise", "--topology", "snc-2x2", "--hugepages", "2M", "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    ws = json.loads(r.stdout)["warnings"]
    assert {"sub-numa", "hugepages-free"} <= {w["code"] for w in ws}
    assert all(set(w) >= {"code", "message", "fix"} and w["fix"] for w in ws)
    r = numawb("advise", "--topology", str(tree(tmp_path)), cache=cache)
    assert r.returncode == 0 and "warning [" not in r.stdout
    r = numawb("probe", "--topology", "epyc-2socket", "--json", cache=cache)
    assert [w["code"] for w in json.loads(r.stdout)["warnings"]] == ["numa-balancing"]
    r = numawb("probe", "--topology", "cxl-memory-only", cache=cache)
    assert "note [memory-only-node]: node 1" in r.stdout and "  fix: " in r.stdout


def test_advice_panel_shows_each_warning_with_its_fix():
    from workbench.advisor import advise
    from workbench.screens.dashboard import AdviceView, advice_view
    adv = advise(None, "snc-2x2", 1024, measure=False)
    view = AdviceView(machine="SIMULATED snc-2x2", warnings=tuple((w.level, w.message, w.fix) for w in adv.warnings))
    text = advice_view(view, None).plain
    assert "warning: 4 NUMA nodes with CPUs on 2 sockets" in text and "fix: prefer slice" in text


def test_advise_on_this_machine_checks_the_model_files_page_cache(tmp_path, tiny_model):
    cache = str(tmp_path / "cache")
    Path(tiny_model).read_bytes()
    r = numawb("advise", "-m", tiny_model, "--no-measure", "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    ws = {w["code"]: w for w in json.loads(r.stdout)["warnings"]}
    assert "page-cache-warm" in ws and os.path.basename(tiny_model) in ws["page-cache-warm"]["message"]
    _cold(Path(tiny_model))
    r = numawb("advise", "-m", tiny_model, "--no-measure", "--json", cache=cache)
    assert not [w for w in json.loads(r.stdout)["warnings"] if w["code"].startswith("page-cache")]

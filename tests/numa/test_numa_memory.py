"""Syscalls, placed buffers, migration, budget refusal, proof and system knobs on this box."""
from __future__ import annotations

import errno

import numpy as np
import pytest

from workbench.numa import (BudgetError, Policy, WorkerPool, alloc, check_need, disable_numa_balancing,
                            drop_page_cache, first_touch, load_topology, migrate, process_numastat, prove)
from workbench.numa import syscalls as sc
from workbench.numa.proof import Vma, read_numa_maps
from workbench.numa.topology import fixture_path

MiB = 1 << 20


@pytest.fixture(scope="module")
def topo():
    return load_topology()


def test_getcpu_and_mempolicy():
    r = sc.getcpu()
    assert r.ok and r.value[0] in load_topology().online_cpus
    assert sc.get_mempolicy().ok


def test_syscall_degrades_with_reason(monkeypatch):
    monkeypatch.setattr(sc, "NR", {})
    r = sc.mbind(0, 4096, sc.MPOL_BIND, [0])
    assert not r and r.errno == errno.ENOSYS and "unknown for architecture" in r.reason
    buf = alloc(MiB, Policy("bind", (0,)))
    assert "plain allocation" in buf.note
    buf.array[:] = 7  # still a working buffer
    assert buf.array.sum() == 7 * MiB


def test_mbind_bad_node_reason():
    buf = alloc(MiB, Policy("bind", (200,)))
    assert "EINVAL" in buf.note
    buf.close()


def test_policy_parse_and_validation():
    assert Policy.parse("interleave:0-2") == Policy("interleave", (0, 1, 2))
    assert str(Policy.parse("bind:1")) == "bind:1"
    for bad in ("bogus", "bind", "preferred:0,1"):
        with pytest.raises(ValueError):
            Policy.parse(bad)


@pytest.mark.parametrize("policy", ["default", "bind:0", "interleave:0", "preferred:0"])
def test_alloc_policies_place_on_node0(policy):
    buf = alloc(4 * MiB, Policy.parse(policy), label=policy, intended=(0,))
    assert buf.array.dtype == np.uint8 and buf.array.shape == (4 * MiB,)
    assert buf.note == ""
    assert buf.address % (2 * MiB) == 0  # THP-aligned start
    buf.array[:] = 1
    p = prove([buf])[0]
    assert p.share == 1.0 and p.absent == 0 and p.pages_by_node == {0: p.sampled}
    if policy != "default":
        assert sc.get_mempolicy(buf.base).value == (Policy.parse(policy).mode, [0])
    buf.close()
    assert buf.closed and prove([buf]) == []


def test_proof_reports_untouched_pages():
    buf = alloc(MiB, Policy("bind", (0,)), thp=False)
    buf.array[: MiB // 2] = 1
    p = prove([buf])[0]
    assert p.absent == p.sampled // 2 and p.share == 1.0
    assert "not touched yet" in p.line()


def test_proof_asks_again_about_pages_that_read_absent(monkeypatch):
    """A page mid-migration reads as absent for a moment: the proof asks again before calling it
    untouched, about the absent pages of every buffer at once; a page still absent after the last
    look is reported as such."""
    bufs = [alloc(MiB, Policy("bind", (0,)), thp=False) for _ in range(2)]
    for b in bufs:
        b.array[:] = 1
    real = sc.move_pages
    calls: list[int] = []

    def blinking(addrs, nodes=None, flags=0):
        r = real(addrs, nodes, flags)
        calls.append(len(addrs))
        if len(calls) <= 2:  # each buffer's first look: every other page has no frame
            return sc.CallResult(True, [(-errno.ENOENT if i % 2 else s) for i, s in enumerate(r.value)])
        if len(calls) == 3:  # the second look, both buffers together: one page still missing
            return sc.CallResult(True, [-errno.ENOENT] + r.value[1:])
        return r
    monkeypatch.setattr(sc, "move_pages", blinking)
    proofs = prove(bufs)
    n = MiB // 4096
    assert calls == [n, n, n, 1]
    assert all(p.absent == 0 and p.share == 1.0 for p in proofs)
    calls.clear()
    monkeypatch.setattr(sc, "move_pages", lambda addrs, nodes=None, flags=0: (
        calls.append(len(addrs)), sc.CallResult(True, [-errno.ENOENT] * len(addrs)))[1])
    (p,) = prove(bufs[:1])  # never there: reported untouched after the last look
    assert calls == [n, n, n] and p.absent == n and p.present == 0


def test_migrate_reports_time():
    buf = alloc(2 * MiB, label="m")
    buf.array[:] = 3
    res = migrate(buf, Policy("bind", (0,)))
    assert res.ok and res.seconds >= 0 and buf.policy == Policy("bind", (0,))
    assert (buf.array == 3).all()
    assert migrate(buf, Policy("interleave", (0,))).ok


def test_move_pages_asks_again_for_pages_it_could_not_move(monkeypatch):
    """A page move_pages refuses this time (-EBUSY: locked, in a huge-page split or collapse) is
    asked for again, so a live switch does not leave pages behind on a transient refusal."""
    from workbench.numa import memory
    buf = alloc(2 * MiB, label="m", thp=False)
    buf.array[:] = 1
    real = sc.move_pages
    calls: list[int] = []

    def flaky(addrs, nodes=None, flags=0):
        r = real(addrs, nodes, flags)
        if nodes is None:
            return r
        calls.append(len(addrs))
        if len(calls) == 1:  # the first pass refuses every other page
            return sc.CallResult(True, [(-errno.EBUSY if i % 2 else s) for i, s in enumerate(r.value)])
        return r
    monkeypatch.setattr(sc, "move_pages", flaky)
    assert memory._move_pages_to(buf, Policy("interleave", (0,)))
    n = 2 * MiB // memory.PAGE
    assert calls == [n, n // 2]


def test_first_touch_by_workers():
    with WorkerPool(2, smt=True) as pool:
        buf = alloc(4 * MiB, intended=(0,))
        first_touch(buf.array, [(0, 2 * MiB), (2 * MiB, 4 * MiB)], pool, value=5)
        assert (buf.array == 5).all()
        assert prove([buf])[0].share == 1.0
        with pytest.raises(ValueError):
            first_touch(buf.array, [(0, 1)], pool)


def test_hugetlb_need_checked_before_allocating(topo):
    free = {n.id: next((h.free for h in n.hugepages if h.size_kb == 2048), 0) for n in topo.nodes}
    want = (free[0] + 1) * 2 * MiB
    with pytest.raises(BudgetError, match=r"node 0: need \d+ x 2.0 MiB pages, free \d+"):
        alloc(want, Policy("bind", (0,)), hugetlb_kb=2048)


def test_budget_refusal_message_gives_need_and_free():
    t = load_topology(fixture_path("xeon-8node-smt"))
    need = {n: 10 << 30 for n in range(8)}
    with pytest.raises(BudgetError) as e:
        check_need(need, t, "weights mode 'mirror'")
    msg = str(e.value)
    assert "nothing was allocated" in msg
    assert "node 5: need 10.0 GiB, free" in msg and "short by" in msg
    assert "node 0: need 10.0 GiB, free 20.4 GiB" in msg
    assert e.value.need[5] == 10 << 30 and e.value.free[5] < 1 << 30


def test_numastat_split_by_kind():
    w = alloc(4 * MiB, kind="weights")
    k = alloc(2 * MiB, kind="kv")
    w.array[:] = 1
    k.array[:] = 1
    stat = process_numastat([w, k])
    assert stat["weights"].get(0, 0) >= 4 * MiB * 0.99
    assert stat["kv"].get(0, 0) >= 2 * MiB * 0.99
    assert stat["other"].get(0, 0) > 0
    vmas = read_numa_maps()
    assert vmas and all(v.end >= v.start for v in vmas)
    # 'other' is the process total minus the buffers
    fake = [Vma(w.base, w.base + w.map_len, "default", {0: 5 * MiB, 1: MiB})]
    s = process_numastat([w], fake)
    assert s["weights"] == {0: 4 * MiB} and s["other"] == {0: MiB, 1: MiB}


def test_numa_balancing_guard_restores(tmp_path):
    f = tmp_path / "numa_balancing"
    f.write_text("1\n")
    g = disable_numa_balancing(str(f))
    assert f.read_text().strip() == "0" and g.previous == 1
    g.restore()
    assert f.read_text().strip() == "1"
    g.restore()  # idempotent


def test_numa_balancing_refused_without_root(tmp_path, monkeypatch):
    f = tmp_path / "numa_balancing"
    f.write_text("1\n")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(PermissionError, match="needs root"):
        disable_numa_balancing(str(f))
    assert f.read_text().strip() == "1"
    with pytest.raises(PermissionError, match="page cache needs root"):
        drop_page_cache(str(f))
    with pytest.raises(FileNotFoundError, match="no automatic NUMA balancing"):
        disable_numa_balancing(str(tmp_path / "missing"))


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_trim_heap_gives_freed_heap_pages_back():
    """Objects freed between others that live leave free pages inside the malloc heap, resident
    until malloc_trim(0) returns them (what `Engine.load` does after loading)."""
    if sc.trim_heap() is False:
        pytest.skip("no malloc_trim in this libc")
    blocks = [bytearray(4000) for _ in range(12000)]   # ~46 MiB from the heap (under mmap's threshold)
    for b in blocks:
        b[::4096] = b"\x01" * len(b[::4096])             # touched: resident
    kept = blocks[::16]
    del blocks
    before = _rss_mib()
    assert sc.trim_heap() is True
    after = _rss_mib()
    del kept   # (alive until here: the holes between them are what the trim gives back)
    assert before - after > 20, (before, after)

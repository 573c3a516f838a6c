"""row_split, weight layouts in every mode, switching, loading, KV placement, budget (1 node)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.numa import (BudgetError, KVRequest, ProgressEvent, TensorSpec, WorkerPool, load_topology,
                            make_plan, place_kv, place_weights, plan_for_pool, prove, read_into, row_split,
                            switch_weights)
from workbench.numa.topology import fixture_path
from workbench.numa.plan import ROW_ALIGN

MODES = ["mirror", "interleave", "slice", "none", "auto"]
SPECS = [TensorSpec("tok_embd", 96, 72), TensorSpec("blk.0.attn_norm", 1, 256),
         TensorSpec("blk.0.ffn_up", 130, 144), TensorSpec("tiny", 3, 18)]


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(smt=True)
    yield p
    p.close()


def data_for(specs, seed=0):
    rng = np.random.default_rng(seed)
    return {s.name: rng.integers(0, 256, (s.rows, s.row_bytes), dtype=np.uint8) for s in specs}


# ---- row_split -----------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(rows=st.integers(0, 5000), n=st.integers(1, 64))
def test_row_split_properties(rows, n):
    r = row_split(rows, n)
    assert len(r) == n and r[0][0] == 0 and r[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(r, r[1:]))  # consecutive
    assert all(lo <= hi for lo, hi in r)
    a = ROW_ALIGN  # 8: llama.cpp repacks Q4_0/Q4_K/IQ4_NL/Q2_K in groups of 8 rows
    if rows >= a * n:
        assert all(lo % a == 0 for lo, _ in r)  # aligned boundaries
        sizes = [hi - lo for lo, hi in r]
        assert max(sizes) - min(sizes) <= 2 * a  # proportional (equal shares) up to alignment
        assert min(sizes) >= a


def test_row_split_weights():
    assert row_split(64, [1, 3]) == [(0, 16), (16, 64)]
    assert row_split(10, 1) == [(0, 10)]
    assert row_split(1, 3)[0] == (0, 0) or row_split(1, 3)[-1][1] == 1
    with pytest.raises(ValueError):
        row_split(10, 0)


# ---- weights in every mode ---------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_layout_mode_roundtrip(pool, mode):
    data = data_for(SPECS)
    layout = place_weights(SPECS, mode, pool)
    assert layout.mode == mode
    for s in SPECS:
        half = s.rows // 2
        layout.write_rows(s.name, 0, data[s.name][:half])
        layout.write_rows(s.name, half, data[s.name][half:])
    for s in SPECS:
        for w, (lo, hi) in enumerate(row_split(s.rows, pool.n_threads)):
            arr, first = layout.array_for(s.name, w)
            assert arr.dtype == np.uint8 and arr.shape[1] == s.row_bytes
            assert first <= lo and hi <= first + arr.shape[0]  # holds the rows it computes
            np.testing.assert_array_equal(arr, data[s.name][first:first + arr.shape[0]])
        np.testing.assert_array_equal(layout.rows(s.name, 0, s.rows), data[s.name])
        full = layout.full_array(s.name)
        assert full is not None  # one node: even slices are complete
        np.testing.assert_array_equal(full, data[s.name])
    for b in layout.buffers():
        assert b.kind == "weights" and b.note == ""
    proofs = prove(layout.buffers())
    assert all(p.share in (None, 1.0) for p in proofs)
    layout.close()


def test_slice_mirrors_small_tensors(pool):
    placement = {n: t.placement for n, t in plan_for_pool(SPECS, "slice", pool).tensors.items()}
    assert placement["blk.0.attn_norm"] == "mirror" and placement["tiny"] == "mirror"
    assert placement["blk.0.ffn_up"] == "slice"


@pytest.mark.parametrize("old", MODES)
@pytest.mark.parametrize("new", MODES)
def test_switch_preserves_bytes(pool, old, new):
    data = data_for(SPECS, seed=1)
    layout = place_weights(SPECS, old, pool)
    for s in SPECS:
        layout.write_rows(s.name, 0, data[s.name])
    events = []
    new_layout = switch_weights(layout, new, pool, progress=events.append)
    assert new_layout.mode == new and new_layout.switch_seconds is not None
    assert new_layout.switch_method
    for s in SPECS:
        for w in range(pool.n_threads):
            arr, first = new_layout.array_for(s.name, w)
            np.testing.assert_array_equal(arr, data[s.name][first:first + arr.shape[0]])
    if new != old:
        assert layout.buffers() == [] and events[-1].stage == "switch"
    new_layout.close()


def test_auto_fits_budget_by_slicing_big_tensors():
    """On the 8-node fixture (plan only): auto mirrors while it fits, then slices the biggest."""
    fake = load_topology(fixture_path("xeon-8node-smt"))

    workers = [(i, i // 4) for i in range(32)]  # (cpu, node): 4 workers on each of 8 nodes
    specs = [TensorSpec("big", 4096, 1 << 20), TensorSpec("mid", 4096, 1 << 14), TensorSpec("norm", 1, 4096)]
    total = sum(s.nbytes for s in specs)

    def placement(plan):
        return {n: t.placement for n, t in plan.tensors.items()}

    plan = make_plan(specs, "auto", workers, fake, free={n: 2 * total for n in range(8)})
    assert set(placement(plan).values()) == {"mirror"} and plan.fits
    plan = make_plan(specs, "auto", workers, fake, free={n: (1 << 30) for n in range(8)})
    assert placement(plan) == {"big": "slice", "mid": "mirror", "norm": "mirror"}
    assert all(v <= 1 << 30 for v in plan.need().values()) and plan.fits
    with pytest.raises(BudgetError, match="node 5: need"):
        make_plan(specs, "auto", workers, fake).check()  # node 5 has ~150 MB free


def test_auto_plans_around_the_kv_cache_and_allocates_what_was_checked():
    """Bug: auto was checked against free minus the KV cache but allocated against all free
    memory, so it could mirror more than was checked. Now one plan is checked and executed."""
    fake = load_topology(fixture_path("xeon-8node-smt"))
    workers = [(i, i // 4) for i in range(32)]
    specs = [TensorSpec("big", 4096, 1 << 20), TensorSpec("mid", 4096, 1 << 14)]
    free = {n: 5 << 30 for n in range(8)}  # room to mirror everything (4.06 GiB) ...
    kv = KVRequest(8, [(1 << 30) // 8 if i % 4 == 0 else 0 for i in range(32)])  # ... but not beside 1 GiB of KV
    plan = make_plan(specs, "auto", workers, fake, free=free, kv=kv)
    assert plan.tensors["big"].placement == "slice"
    assert plan.kv_need() == {n: 1 << 30 for n in range(8)}
    assert plan.fits and all(v <= free[n] for n, v in plan.need().items())
    assert make_plan(specs, "auto", workers, fake, free=free).tensors["big"].placement == "mirror"


def test_expert_tensors_slice_per_expert_and_experts_mode_owns_whole_experts():
    fake = load_topology(fixture_path("xeon-8node-smt"))
    workers = [(i, i // 4) for i in range(8)]  # 2 nodes x 4 workers
    exps = TensorSpec("blk.0.ffn_up_exps.weight", 8 * 64, 32, groups=8)
    plan = make_plan([exps], "slice", workers, fake, free={n: 1 << 30 for n in range(8)})
    pieces = plan.tensors[exps.name].pieces
    assert [(p.node, p.lo, p.hi, p.g0, p.g1) for p in pieces] == [(0, 0, 32, 0, 8), (1, 32, 64, 0, 8)]
    assert plan.weights_need() == {0: exps.nbytes // 2, 1: exps.nbytes // 2}
    plan = make_plan([exps], "experts", workers, fake, free={n: 1 << 30 for n in range(8)})
    assert [(p.node, p.g0, p.g1) for p in plan.tensors[exps.name].pieces] == [(0, 0, 4), (1, 4, 8)]
    assert plan.expert_node(exps.name, 5) == 1 and plan.weights_need() == {0: exps.nbytes // 2, 1: exps.nbytes // 2}


def test_budget_refused_before_allocating(pool):
    specs = [TensorSpec("huge", 1 << 20, 1 << 20)]  # 1 TiB
    with pytest.raises(BudgetError) as e:
        place_weights(specs, "mirror", pool)
    assert "node 0: need 1024.0 GiB, free" in str(e.value)
    with pytest.raises(BudgetError, match="KV 'first-touch'"):
        plan_for_pool(SPECS, "mirror", pool, kv=KVRequest(1000, 1 << 30)).check()
    with pytest.raises(BudgetError):
        place_kv(1000, 1 << 30, "first-touch", pool)
    assert plan_for_pool(SPECS, "mirror", pool, kv=KVRequest(2, 4096)).check().need[0] > 0


def test_load_from_file_with_progress(pool, tmp_path):
    data = data_for(SPECS, seed=2)
    path = tmp_path / "weights.bin"
    offsets, blob, off = {}, b"", 100
    blob = b"\0" * off
    for s in SPECS:
        offsets[s.name] = len(blob)
        blob += data[s.name].tobytes() + b"\1" * 7
    path.write_bytes(blob)
    for mode in ("mirror", "slice"):
        layout = place_weights(SPECS, mode, pool)
        events: list[ProgressEvent] = []
        secs = layout.load(path, offsets, events.append)
        assert secs >= 0 and events[-1].done == sum(s.nbytes for s in SPECS) == events[-1].total
        assert events[-1].bytes_per_s > 0
        for s in SPECS:
            np.testing.assert_array_equal(layout.rows(s.name, 0, s.rows), data[s.name])
            for w in range(pool.n_threads):
                arr, first = layout.array_for(s.name, w)
                np.testing.assert_array_equal(arr, data[s.name][first:first + arr.shape[0]])
        layout.close()
    dest = np.zeros(10, np.uint8)
    got = []
    assert read_into(str(path), offsets["tiny"], dest, got.append) == 10 and sum(got) == 10
    np.testing.assert_array_equal(dest, data["tiny"].reshape(-1)[:10])
    with pytest.raises(EOFError):
        read_into(str(path), len(blob) - 3, np.zeros(10, np.uint8))


# ---- KV -----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["first-touch", "interleave", "node:0"])
def test_kv_modes(pool, mode):
    kv = place_kv(3, 10000, mode, pool)
    seen = set()
    for layer in range(3):
        for w in range(pool.n_threads):
            a = kv.array_for(layer, w)
            assert a.shape == (10000,) and a.dtype == np.uint8
            a[:] = layer * 10 + w
            seen.add(a.ctypes.data)
    assert len(seen) == 3 * pool.n_threads  # no overlaps
    for layer in range(3):
        for w in range(pool.n_threads):
            assert (kv.array_for(layer, w) == layer * 10 + w).all()
    for p in prove(kv.buffers()):
        assert p.kind == "kv" and p.share == 1.0
    kv.close()


def test_kv_bad_mode(pool):
    with pytest.raises(ValueError, match="unknown KV mode"):
        place_kv(1, 10, "sideways", pool)

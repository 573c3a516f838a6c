"""The advisor's predictions on fixture topologies: memory per node per mode, fits / does not fit,
bytes each node reads from each node, decode rates from a memory profile, the recommendation."""
from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from workbench.advisor import EngineModel, advise, model_cost, predict, recommend
from workbench.advisor.predict import kernel_time, PlanPool, plan_memory
from workbench.advisor.probe import GB, MemoryProfile, fixture_profile
from workbench.advisor.synthetic import deepseek_r1, write_header
from workbench.numa.budget import free_per_node
from workbench.numa.topology import fixture_path, load_topology

GiB = 1 << 30


def topo(name):
    return load_topology(fixture_path(name))


def dense_header(path, n_layer=4, d=512, ff=1024, vocab=2048, q=T.Q8_0):
    """Rows of every matrix are multiples of 128, so 32 workers split them exactly."""
    md = {"general.name": "dense", "llama.block_count": n_layer, "llama.embedding_length": d,
          "llama.attention.head_count": 8, "llama.attention.head_count_kv": 4, "llama.context_length": 4096}
    ts = [("token_embd.weight", (d, vocab), q), ("output.weight", (d, vocab), q), ("output_norm.weight", (d,), T.F32)]
    for il in range(n_layer):
        p = f"blk.{il}."
        ts += [(p + "attn_q.weight", (d, d), q), (p + "attn_k.weight", (d, d // 2), q),
               (p + "attn_v.weight", (d, d // 2), q), (p + "attn_output.weight", (d, d), q),
               (p + "ffn_up.weight", (d, ff), q), (p + "ffn_gate.weight", (d, ff), q),
               (p + "ffn_down.weight", (ff, d), q), (p + "attn_norm.weight", (d,), T.F32)]
    write_header(path, "llama", md, ts)
    return ts


def size(shape, q):
    block, s = GGML_QUANT_SIZES[q]
    return int(np.prod(shape)) // block * s


def profile_2node(local=100 * GB, remote=40 * GB) -> MemoryProfile:
    return MemoryProfile(key="t", date="", cpu_model="", source="published", nodes=[0, 1], cpu_nodes=[0, 1],
                         bandwidth={0: {0: local, 1: remote}, 1: {0: remote, 1: local}}, latency_ns={},
                         scaling={0: [(16, local)], 1: [(16, local)]})


@pytest.fixture
def dense(tmp_path):
    p = tmp_path / "dense.gguf"
    ts = dense_header(p)
    return p, ts


def test_memory_per_node_for_each_weights_mode(dense):
    path, ts = dense
    t = topo("epyc-2socket")  # 2 nodes x 16 physical cores
    cost = model_cost(path)
    pool = PlanPool(t, None, "distribute")
    assert pool.n_threads == 32 and pool.nodes == [0, 1]
    free = {0: 10 * GiB, 1: 10 * GiB}
    total = sum(size(s, q) for _, s, q in ts)
    _, mirror, _ = plan_memory(cost, "mirror", "first-touch", pool, t, 1024, free)
    assert mirror == {0: total, 1: total}
    _, inter, _ = plan_memory(cost, "interleave", "first-touch", pool, t, 1024, free)
    expect = sum(math.ceil(size(s, q) / 2) for _, s, q in ts)
    assert inter == {0: expect, 1: expect}
    _, sl, _ = plan_memory(cost, "slice", "first-touch", pool, t, 1024, free)
    # matrices split in halves (rows divisible by 4 x 32); 1-row norms are mirrored
    norms = sum(size(s, q) for _, s, q in ts if len(s) == 1)
    assert sl[0] == sl[1] == (total - norms) // 2 + norms


def test_kv_memory_per_node(dense):
    path, _ = dense
    t = topo("epyc-2socket")
    cost = model_cost(path)
    pool = PlanPool(t, None, "distribute")
    free = {0: 10 * GiB, 1: 10 * GiB}
    per_pos = 4 * 4 * (64 + 64) * 2  # layers x kv heads x (k + v) x f16
    assert cost.kv_bytes_per_position == per_pos
    _, _, ft = plan_memory(cost, "none", "first-touch", pool, t, 1000, free)
    half = math.ceil(math.ceil(1000 / 32) / 2) * 32 * per_pos  # 32-position blocks dealt to 2 owners
    assert ft == {0: half, 1: half}
    _, _, n1 = plan_memory(cost, "none", "node:1", pool, t, 1000, free)
    assert n1 == {1: 2 * half}


def test_fits_and_does_not_fit_on_the_seed_004_machine(tmp_path):
    p = tmp_path / "r1.gguf"
    deepseek_r1(p, "Q4_K_M", mla=True)   # 377 GiB of weights, ~200 GiB free per node
    t = topo("xeon-e5-2690v3-2s")
    free = free_per_node(t)  # MemFree + reclaimable page cache
    cands = predict(model_cost(p), t, fixture_profile(t), n_ctx=8192, engine=EngineModel())
    both = {c.weights: c for c in cands if c.nodes == [0, 1] and c.kv == "first-touch"}
    assert not both["mirror"].fits and not both["none"].fits
    assert both["interleave"].fits and both["slice"].fits and both["auto"].fits
    for c in cands:
        assert c.fits == all(v <= free[n] for n, v in c.memory_per_node.items())
    best, reason = recommend(cands)
    assert cands[best].fits and cands[best].weights in ("slice", "auto", "interleave")
    assert "fits" in reason and "GiB" in reason


def test_reads_and_remote_share(dense):
    path, _ = dense
    t = topo("epyc-2socket")
    cands = predict(model_cost(path), t, profile_2node(), engine=EngineModel(), kvs=["first-touch"])
    by = {c.weights: c for c in cands if c.nodes == [0, 1]}
    assert by["mirror"].remote_share == 0.0 and by["slice"].remote_share == 0.0
    assert by["interleave"].remote_share == pytest.approx(0.5)
    assert by["none"].remote_share == pytest.approx(0.5, abs=0.01)  # node 1's workers read everything from node 0
    # what each node reads is its workers' half of every product
    cost = model_cost(path)
    wpt = cost.weight_bytes_per_token
    m = by["mirror"].reads
    assert m[0][0] + m[1][1] == pytest.approx(wpt)
    assert m[0][0] == pytest.approx(wpt / 2, rel=0.01)


def test_decode_rate_from_the_bandwidth_matrix(dense):
    path, _ = dense
    t = topo("epyc-2socket")
    local, remote = 100 * GB, 40 * GB
    cands = predict(model_cost(path), t, profile_2node(local, remote), engine=EngineModel(), kvs=["first-touch"])
    by = {c.weights: c for c in cands if c.nodes == [0, 1]}
    r = by["mirror"].reads
    assert by["mirror"].predicted_decode_tps == pytest.approx(1 / max(r[0][0], r[1][1]) * local, rel=1e-6)
    # interleave: each node reads half locally, half remotely
    ri = by["interleave"].reads
    t_int = max(ri[0][0] / local + ri[0][1] / remote, ri[1][1] / local + ri[1][0] / remote)
    assert by["interleave"].predicted_decode_tps == pytest.approx(1 / t_int, rel=1e-6)
    # none: node 0's memory serves both nodes (its capacity binds) or node 1's remote reads do
    rn = by["none"].reads
    t_none = max(rn[1][0] / remote, (rn[0][0] + rn[1][0]) / local)
    assert by["none"].predicted_decode_tps == pytest.approx(1 / t_none, rel=1e-6)
    assert by["mirror"].predicted_decode_tps > by["interleave"].predicted_decode_tps > by["none"].predicted_decode_tps


def test_engine_overhead_and_compute_limits(dense):
    path, _ = dense
    t = topo("epyc-2socket")
    cost = model_cost(path)
    base = predict(cost, t, profile_2node(), engine=EngineModel(), kvs=["first-touch"], weights=["mirror"])[0]
    slow = EngineModel(overhead={32: (1e-3, 1e-4)})
    c = predict(cost, t, profile_2node(), engine=slow, kvs=["first-touch"], weights=["mirror"])[0]
    assert 1 / c.predicted_decode_tps == pytest.approx(1 / base.predicted_decode_tps + 1e-3 + 4 * 1e-4)
    # a kernel slower than memory bounds decode: 1 GB/s per thread for Q8_0
    k = EngineModel(decode_rates={32: {8: 1 * GB, 0: 100 * GB}})
    c2 = predict(cost, t, profile_2node(), engine=k, kvs=["first-touch"], weights=["mirror"])[0]
    assert c2.decode_limit.startswith("kernels on node")
    q8 = sum(tc.nbytes * cost.read_fraction[tc.name] for tc in cost.tensors if tc.ggml_type == 8)
    assert 1 / c2.predicted_decode_tps == pytest.approx(q8 / 2 / (16 * GB), rel=0.01)


def test_kernel_time_is_compute_plus_the_exposed_memory_wait():
    """On local memory a type costs what its kernel was measured streaming; from slower (remote)
    memory, more by the share of the memory wait the kernel did not hide; a kernel that hides all
    of it (streamed = in-cache rate) pays nothing extra until the memory time itself binds."""
    threads, local, remote = 2, 20 * GB, 5 * GB
    stream, cache = {12: 5 * GB, 8: 10 * GB}, {12: 10 * GB, 8: 10 * GB}  # per thread
    b = {12: 1e8}
    t_loc = kernel_time(b, {0: 1e8}, threads, stream, cache, {0: local}, local)
    assert t_loc == pytest.approx(1e8 / (threads * 5 * GB))
    # Q4_K: in cache 0.05 ns/byte, streamed 0.1: 0.05 ns exposed of local's 0.05 ns memory time (beta 1)
    t_rem = kernel_time(b, {1: 1e8}, threads, stream, cache, {1: remote}, local)
    assert t_rem == pytest.approx(1e8 * (1 / (threads * 10 * GB) + 1.0 / remote))
    # Q8_0 hides its memory wait: the same time from remote memory (the caller's memory bound decides)
    q8 = {8: 1e8}
    assert kernel_time(q8, {1: 1e8}, threads, stream, cache, {1: remote}, local) == \
        pytest.approx(kernel_time(q8, {0: 1e8}, threads, stream, cache, {0: local}, local))
    # half from each node: the average memory time per byte
    t_half = kernel_time(b, {0: 5e7, 1: 5e7}, threads, stream, cache, {0: local, 1: remote}, local)
    assert t_half == pytest.approx(1e8 * (1 / (threads * 10 * GB) + 0.5 / local + 0.5 / remote))


def test_moe_candidates_on_the_seed_machine(tmp_path):
    p = tmp_path / "r1q8.gguf"
    deepseek_r1(p, "Q8_0")
    t = topo("epyc-9275f-2s")
    adv = advise(p, t, 4096)
    mirror = adv.find("mirror", "first-touch", nodes=[0, 1])
    inter = adv.find("interleave", "first-touch", nodes=[0, 1])
    assert mirror.fits and inter.fits
    assert max(mirror.memory_per_node.values()) > 600 * GiB
    assert mirror.predicted_decode_tps > inter.predicted_decode_tps
    assert mirror.bytes_per_token == pytest.approx(adv.cost.weight_bytes_per_token)
    d = adv.to_json()
    for c in d["candidates"]:
        assert {"weights", "kv", "threads", "predicted_decode_tps", "predicted_prompt_tps", "bytes_per_token",
                "memory_per_node", "fits"} <= set(c)
    assert isinstance(d["recommended"], int) and d["candidates"][d["recommended"]]["fits"]


@pytest.mark.parametrize("fixture", ["laptop-1node", "epyc-2socket", "xeon-8node-smt", "snc-2x2",
                                     "cxl-memory-only", "offline-cpus", "epyc-9275f-2s", "epyc-9115-2s",
                                     "xeon-e5-2690v3-2s"])
def test_every_fixture_topology(dense, fixture):
    path, _ = dense
    adv = advise(path, fixture, 2048)
    assert adv.candidates and adv.simulated
    assert all(c.predicted_decode_tps > 0 for c in adv.candidates)
    assert adv.recommended is not None
    text = adv.format_table()
    assert "SIMULATED" in text and "recommended:" in text


def test_memory_only_node_as_kv_source(dense):
    path, _ = dense
    adv = advise(path, "cxl-memory-only", 2048, depth=1024)
    kv_cxl = [c for c in adv.candidates if c.kv == "node:1"]
    assert kv_cxl, "the CXL node is offered as a KV cache place"
    c = kv_cxl[0]
    assert c.kv_per_node.get(1, 0) > 0 and c.reads[0].get(1, 0) == pytest.approx(model_cost(path).kv_read_bytes(1024))


def test_nothing_fits(tmp_path):
    p = tmp_path / "r1q8.gguf"
    deepseek_r1(p, "Q8_0")   # 664 GiB of weights on a machine with 2 x ~200 GiB free
    adv = advise(p, "xeon-e5-2690v3-2s", 4096)
    assert not any(c.fits for c in adv.candidates)
    assert adv.recommended is None and adv.best is None
    assert adv.reason.startswith("nothing fits") and "GiB" in adv.reason
    assert adv.to_json()["recommended"] is None

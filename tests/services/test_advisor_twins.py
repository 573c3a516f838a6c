"""The advisor at the seeds' shapes: twins of a target's structure, the cache fill the attention
twin is measured on, the engine calibration's cache, the per-token breakdown of a prediction, and
llama.cpp's cost model for the seeds' machines."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from workbench.advisor import advise, engine_cal, model_cost
from workbench.advisor.cost import read_header
from workbench.advisor.llamacpp import barrier_s, graph_nodes, llama_kv_traffic
from workbench.advisor.predict import EngineModel, block_counts, products_per_token
from workbench.advisor.probe import MemoryProfile
from workbench.advisor.synthetic import deepseek_r1, qwq_32b
from workbench.advisor.twins import TwinShape, write_twin


@pytest.fixture(scope="module")
def r1_header(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("r1") / "r1-mla.gguf")
    deepseek_r1(p, "Q4_K_M", mla=True)
    return p


def test_twin_keeps_the_targets_structure_not_its_widths(r1_header, tmp_path):
    shape = TwinShape.from_header(read_header(r1_header))
    assert (shape.arch, shape.n_head, shape.mla, shape.kv_lora, shape.n_rot) == ("deepseek2", 128, True, 512, 64)
    assert (shape.n_expert, shape.n_expert_used, shape.n_expert_shared) == (256, 8, 1)
    small = str(tmp_path / "twin.gguf")
    write_twin(small, shape, 1, 2)
    c = model_cost(small)
    assert (c.n_layer, c.expert_count, c.expert_used_count, c.mla) == (3, 256, 8, True)
    assert block_counts(c) == (1, 2)
    target = model_cost(r1_header)
    assert c.weight_bytes < target.weight_bytes / 10000  # tiny widths: the fixed costs, not the bytes
    full = str(tmp_path / "attn.gguf")
    write_twin(full, shape, 2, 0, full_attention=True)
    a = model_cost(full)
    # the attention twin's cache rows are the target's: the same work per cached position
    assert a.kv_bytes_per_layer_position[0] == target.kv_bytes_per_layer_position[0]
    assert a.attn_flops_per_key / a.n_layer == target.attn_flops_per_key / target.n_layer
    half = str(tmp_path / "half.gguf")
    write_twin(half, shape, 1, 2, used=4)
    assert model_cost(half).expert_used_count == 4


def test_twin_of_old_mla_layout_is_refused(tmp_path):
    p = str(tmp_path / "old.gguf")
    deepseek_r1(p, "Q8_0", mla=False)
    with pytest.raises(ValueError, match="old attn_kv_b layout"):
        TwinShape.from_header(read_header(p))


def test_filled_cache_is_what_a_decoded_token_attends(r1_header, tmp_path):
    """The attention twin's depth is written straight into the cache: a token decoded at that depth
    reads the written rows (changing an early row changes its logits), and setting the depth back
    after a truncation restores the positions (truncate alone only shortens)."""
    from workbench.engine import Engine
    from workbench.engine.engine import Placement
    shape = TwinShape.from_header(read_header(r1_header))
    p = str(tmp_path / "attn.gguf")
    write_twin(p, TwinShape(**{**shape.to_json(), "n_head": 4}), 2, 0, full_attention=True)
    eng = Engine.load(p, placement=Placement(threads=1))
    try:
        s = eng.new_session(512)
        engine_cal._fill(s, 300, np.random.default_rng(0))
        assert s.kv.n == 300 and len(s.tokens) == 300
        a = s.eval([280]).copy()
        s.kv.truncate(10)
        engine_cal._at_depth(s, 300)
        assert s.kv.n == 300
        b = s.eval([280]).copy()
        np.testing.assert_array_equal(a, b)  # the same 300 rows attended again
        s.kv.k[0][0][5, :] = np.float16(20.0).view(np.uint16)
        engine_cal._at_depth(s, 300)
        c = s.eval([280])
        assert np.abs(c - a).max() > 0
    finally:
        eng.close()


def test_structure_costs_are_cached_per_engine_revision(r1_header, tmp_path, monkeypatch):
    calls = []

    def fake(shape, threads, n_dense, bpp, progress=None, weight_bytes_block=0.0, weight_bytes_token=0.0):
        calls.append((shape.key, threads, n_dense, bpp))
        return {"base": 1e-4, "dense_block": 2e-5, "moe_block": 3e-5, "expert": 1e-6, "prompt_base": 0.0,
                "prompt_dense_block": 1e-5, "prompt_moe_block": 2e-5, "prompt_expert": 0.0,
                "decode_attention_s@1024": 1e-4, "prompt_attention_s@1024": 2e-4}
    monkeypatch.setattr(engine_cal, "measure_structure", fake)
    monkeypatch.setattr(engine_cal, "engine_revision", lambda: "rev-a")
    prof = MemoryProfile(key="t", date="", cpu_model="", source="probed", nodes=[0], cpu_nodes=[0],
                         bandwidth={0: {0: 1e10}}, latency_ns={}, scaling={0: [(1, 1e10)]})
    from workbench.engine import kernels as K
    prof.engine.update(kernel_path=K.kernel_path(), kernels_revision=engine_cal.kernels_revision(),
                       overhead={"deepseek2": {"1": [0.0, 0.0]}})
    shape = TwinShape.from_header(read_header(r1_header))
    assert engine_cal.ensure_engine(prof, {}, "deepseek2", [1], shape=shape, n_dense=3, kv_bpp_block=1152)
    assert calls == [(shape.key, 1, 3, 1152)]
    assert not engine_cal.ensure_engine(prof, {}, "deepseek2", [1], shape=shape, n_dense=3, kv_bpp_block=1152)
    assert len(calls) == 1
    monkeypatch.setattr(engine_cal, "engine_revision", lambda: "rev-b")  # the engine changed
    prof.engine["overhead"] = {"deepseek2": {"1": [0.0, 0.0]}}
    assert engine_cal.ensure_engine(prof, {}, "deepseek2", [1], shape=shape, n_dense=3, kv_bpp_block=1152)
    assert len(calls) == 2
    eng = EngineModel.from_profile(prof, "deepseek2", structure_key=shape.key)
    assert eng.fixed_s(1, 3, 58) == pytest.approx(1e-4 + 3 * 2e-5 + 58 * 3e-5)
    assert eng.fixed_s(1, 3, 58, prompt=True) == pytest.approx(3 * 1e-5 + 58 * 2e-5)


def _one_node_profile(bw: float) -> MemoryProfile:
    return MemoryProfile(key="t", date="", cpu_model="", source="probed", nodes=[0], cpu_nodes=[0],
                         bandwidth={0: {0: bw}}, latency_ns={}, scaling={0: [(1, bw / 2), (2, bw)]})


def test_breakdown_adds_up_and_attention_grows_with_depth(r1_header):
    from workbench.advisor.predict import predict
    from workbench.numa.topology import load_topology
    cost = model_cost(r1_header)
    eng = EngineModel(decode_rates={1: {12: 5e9, 8: 5e9, 14: 5e9, 0: 5e9}}, cache_rates={1: {12: 8e9}},
                      prompt_rates={1: {12: 5e10, 8: 5e10, 14: 5e10, 0: 5e10}},
                      structure={1: {"base": 1e-4, "dense_block": 1e-5, "moe_block": 2e-5, "expert": 0.0,
                                     "prompt_base": 0.0, "prompt_dense_block": 1e-6, "prompt_moe_block": 2e-6,
                                     "prompt_expert": 0.0, "decode_attention_s@1024": 1e-4,
                                     "decode_attention_s@4096": 4e-4, "decode_attention_s@16384": 2e-3,
                                     "prompt_attention_s@1024": 3e-4, "prompt_attention_s@16384": 5e-3}},
                      cold={1: {12: 1e-6}})
    topo = load_topology()
    prof = _one_node_profile(20e9)
    got = {}
    for depth in (0, 4096, 8192, 16384, 32768):
        c = predict(cost, topo, prof, n_ctx=9000, depth=depth, threads=[1], weights=["none"], kvs=["first-touch"],
                    engine=eng, free={n: 1 << 50 for n in topo.node_ids})[0]
        d = c.decode_breakdown
        assert d["total_s"] == pytest.approx(d["weights_s"] + max(d["kv_s"], d["attention_s"]) + d["fixed_s"])
        assert c.predicted_decode_tps == pytest.approx(1 / d["total_s"])
        assert d["fixed_s"] == pytest.approx(1e-4 + 3 * 1e-5 + 58 * 2e-5)
        assert d["products_cold_s"] == pytest.approx(products_per_token(cost).get(12, 0) * 1e-6)
        p = c.prompt_breakdown
        assert p["total_s"] == pytest.approx(p["products_s"] + p["attention_s"] + p["fixed_s"])
        got[depth] = (d["attention_s"], d["kv_bytes"], p["attention_s"])
        assert set(json.loads(json.dumps(c.to_json()))["decode_breakdown"]) >= {
            "weight_bytes", "kv_bytes", "attention_flops", "weights_s", "kv_s", "attention_s", "fixed_s", "total_s"}
    # the twin's times at its depths, linear between them, the last segment's slope beyond
    assert got[0][0] == 0 and got[4096][0] == pytest.approx(61 * 4e-4)
    assert got[8192][0] == pytest.approx(61 * (4e-4 + (2e-3 - 4e-4) / 3))
    assert got[32768][0] == pytest.approx(61 * (2e-3 + (2e-3 - 4e-4) / 12288 * 16384))
    assert got[8192][1] == pytest.approx(2 * got[4096][1])
    assert got[8192][2] > got[4096][2] > got[0][2] > 0  # a prompt attends its own rows too


def test_cold_starts_add_to_the_memory_bound_reads(r1_header):
    """A product on a matrix in no cache waits for its first lines (`cold`): time the memory does not
    stream, so it adds to the weights' time whether their reads are bound by the kernels or by the
    memory (R1's narrow experts at 2 threads on the Zen 4 host, where 2 cores read 36 GB/s against 34
    for one: predicted 151 t/s with the cold starts hidden under the memory time, measured 125)."""
    from workbench.advisor.predict import predict
    from workbench.numa.topology import load_topology
    cost = model_cost(r1_header)
    topo = load_topology()
    got = {}
    for bw in (1e12, 1e9):  # kernels bound, then memory bound
        eng = EngineModel(decode_rates={1: {12: 5e9, 8: 5e9, 14: 5e9, 0: 5e9}}, cache_rates={1: {12: 8e9}},
                          cold={1: {12: 1e-6}})
        c = predict(cost, topo, _one_node_profile(bw), n_ctx=9000, threads=[1], weights=["none"],
                    kvs=["first-touch"], engine=eng, free={n: 1 << 50 for n in topo.node_ids})[0]
        got[bw] = c.decode_breakdown
    cold = products_per_token(cost).get(12, 0) * 1e-6
    fast, slow = got[1e12], got[1e9]
    assert cold > 0 and fast["products_cold_s"] == slow["products_cold_s"] == pytest.approx(cold)
    assert slow["weights_memory_s"] > fast["weights_s"]  # the slow memory is the bound
    assert slow["weights_s"] == pytest.approx(slow["weights_memory_s"] + cold)
    assert fast["weights_s"] > fast["weights_memory_s"] + cold  # the kernels' time, plus the cold starts


def test_llamacpp_model_counts_graph_barriers_and_the_transposed_copy(r1_header, tmp_path):
    cost = model_cost(r1_header)
    assert graph_nodes(cost) == pytest.approx(5025 + 10)  # seed 003's log: 5025 nodes for 61 blocks
    q = str(tmp_path / "qwq.gguf")
    qwq_32b(q)
    assert graph_nodes(model_cost(q)) < graph_nodes(cost)
    prof = MemoryProfile(key="t", date="", cpu_model="", source="published", nodes=[0, 1], cpu_nodes=[0, 1],
                         bandwidth={}, latency_ns={0: {0: 100.0, 1: 200.0}, 1: {0: 200.0, 1: 100.0}}, scaling={})
    assert barrier_s(prof, 48) == pytest.approx(2 * barrier_s(prof, 24))
    assert barrier_s(prof, 24) == pytest.approx(24 * 200e-9)
    # MLA: the cache read plus the latent's transposed copy written and read again
    assert llama_kv_traffic(cost, 1000) > cost.llama_kv_bytes_per_position * 1000
    assert llama_kv_traffic(cost, 2000) == pytest.approx(2 * llama_kv_traffic(cost, 1000))


def test_seed_machines_rank_modes_and_attention_dominates_at_depth(r1_header):
    adv8 = advise(r1_header, "xeon-e5-2690v3-2s", 65536, depth=8000, kvs=["first-touch"])
    adv64 = advise(r1_header, "xeon-e5-2690v3-2s", 65536, depth=64000, kvs=["first-touch"])
    for adv in (adv8, adv64):
        sl, inter = adv.find("slice", nodes=[0, 1]), adv.find("interleave", nodes=[0, 1])
        assert sl.llamacpp_decode_tps > inter.llamacpp_decode_tps > 0
        assert sl.predicted_decode_tps >= inter.predicted_decode_tps
    share = lambda c: c.llamacpp_breakdown["attention_s"] / c.llamacpp_breakdown["total_s"]  # noqa: E731
    assert share(adv64.find("slice", nodes=[0, 1])) > share(adv8.find("slice", nodes=[0, 1]))
    c = adv64.find("slice", nodes=[0, 1])
    assert c.kv_per_node[0] == pytest.approx(c.kv_per_node[1], rel=0.01)  # the cache split between sockets


def test_advise_prints_the_breakdown(r1_header):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "workbench", "advise", "-m", r1_header, "--topology",
                        "xeon-e5-2690v3-2s", "-c", "16384", "-d", "8000"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "per decoded token at depth 8000" in r.stdout and "attention ms" in r.stdout
    r = subprocess.run([sys.executable, "-m", "workbench", "advise", "-m", r1_header, "--topology",
                        "xeon-e5-2690v3-2s", "-c", "16384", "-d", "8000", "--json"], capture_output=True,
                       text=True, timeout=300, env=env)
    d = json.loads(r.stdout)
    for c in d["candidates"]:
        assert c["decode_breakdown"]["attention_flops"] > 0 and c["llamacpp_breakdown"]["graph_nodes"] > 0


def test_attention_twin_streams_a_token_of_the_targets_bytes():
    """The attention twin's blocks stream, a token, what the target streams between two visits of a
    block's cache (its whole token's weights), so a narrow deep target's cache at depth is read from
    memory in the twin too: R1's narrow shape, 61 blocks of 1.6 MB, a 16-block twin."""
    block, token = 1.6e6, 61 * 1.6e6
    per = engine_cal.twin_block_bytes(block, token, 16)
    assert 16 * per == pytest.approx(token) and 16 * per > engine_cal.LLC_BYTES > 16 * block
    # a deeper target: twice the cache, not more
    assert 16 * engine_cal.twin_block_bytes(block, 200 * block, 16) == pytest.approx(2 * engine_cal.LLC_BYTES)
    # a wide target: its own block's bytes (capped at 64 MiB a block) are already more
    assert engine_cal.twin_block_bytes(300e6, 4 * 300e6, 7) == float(64 << 20)
    # a small model: no more than it streams itself
    assert engine_cal.twin_block_bytes(1e5, 6e5, 4) == pytest.approx(1.5e5)


def test_attention_times_never_fall_with_depth():
    """A depth's attention figure is a difference of two timings; one spoiled by other work came out
    0 at depth 1024 for 2 threads on SmolLM2's shape (4096: 181 us a block). Such a point is put on
    the line through the next deeper one; good points are kept as measured."""
    mend = engine_cal.monotone_in_depth
    good = {1024: 60e-6, 4096: 320e-6, 16384: 1300e-6}
    assert mend(good) == good
    out = mend({1024: 0.0, 4096: 320e-6, 16384: 1300e-6})
    assert out[1024] == pytest.approx(80e-6) and out[4096] == 320e-6
    # a middle point below the shallower one: on the line to the deepest
    out = mend({1024: 100e-6, 4096: 90e-6, 16384: 1600e-6})
    assert out[4096] == pytest.approx(400e-6)
    # the deepest point spoiled: the shallower one's time per position
    out = mend({1024: 100e-6, 4096: 400e-6, 16384: -5e-6})
    assert out[16384] == pytest.approx(1600e-6)
    assert mend({1024: 0.0, 4096: -1e-6, 16384: 0.0}) == {1024: 0.0, 4096: 0.0, 16384: 0.0}
    noisy = mend({1024: 5e-6, 4096: 1e-6, 16384: 3e-6})
    seq = [noisy[d] for d in sorted(noisy)]
    assert all(a <= b for a, b in zip(seq, seq[1:])) and seq[0] == 5e-6


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3moe"])
def test_attention_twin_with_a_wide_ffn_loads(arch, tmp_path):
    """The attention twin's dense blocks get a wide FFN to stream a token of the target's bytes:
    its header names that FFN, so the engine loads it (it was written with the small twins' FFN in
    the header and every dense architecture refused it: `numawb advise` on SmolLM2 stopped there)."""
    from workbench.engine import Engine
    from workbench.engine.engine import Placement
    shape = TwinShape(arch=arch, n_head=4, n_head_kv=2, head_dim=16, width=64,
                      **({"n_expert": 8, "n_expert_used": 2} if arch == "qwen3moe" else {}))
    p = str(tmp_path / f"{arch}.gguf")
    write_twin(p, shape, 2, 0, full_attention=True, ffn=256, n_ctx=512)
    eng = Engine.load(p, placement=Placement(threads=1))
    try:
        assert eng.cfg.n_ff == 256
        assert np.isfinite(eng.new_session(64).eval([2, 3, 4])).all()
    finally:
        eng.close()


def test_advice_at_another_depth_is_the_advice_made_there(r1_header):
    """`Advice.at_depth` predicts again from what the advice holds (no header read, no checks): the
    same candidates `advise` makes at that depth."""
    a = advise(r1_header, "epyc-2socket", 9000, measure=False)
    b = a.at_depth(8192)
    want = advise(r1_header, "epyc-2socket", 9000, depth=8192, measure=False)
    assert b.depth == 8192 and b.reason == want.reason and b.recommended == want.recommended
    assert [c.to_json() for c in b.candidates] == [c.to_json() for c in want.candidates]
    assert b.best.predicted_decode_tps < a.best.predicted_decode_tps  # a token reads the cache too
    one = a.at_depth(8192, threads=[b.best.threads], weights=[b.best.weights], kvs=[b.best.kv])
    assert one.find(b.best.weights, b.best.kv, b.best.threads).predicted_decode_tps == b.best.predicted_decode_tps
    with pytest.raises(ValueError, match="depth 9000"):
        a.at_depth(9000)


def test_two_writers_keep_each_others_engine_constants(tmp_path, monkeypatch):
    """The app and `numawb advise` may measure two models at once and each save its whole profile:
    the engine constants the other saved meanwhile (same revisions) are kept; another revision's
    are not."""
    from workbench.advisor.probe import cached_profile, fixture_profile, save_profile
    from workbench.numa.topology import fixture_path, load_topology
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    topo = load_topology(fixture_path("epyc-2socket"))
    base = fixture_profile(topo)
    base.engine = {"kernel_path": "avx2", "kernels_revision": "k1", "engine_revision": "e1",
                   "structure": {"shape-a": {"1": {"base": 1e-5}}}}
    save_profile(base, topo)
    a, b = cached_profile(topo), cached_profile(topo)   # two processes read the same file
    a.engine["structure"]["shape-b"] = {"2": {"base": 2e-5}}
    b.engine["structure"]["shape-a"]["2"] = {"base": 3e-5}
    b.engine.setdefault("cold", {})["1"] = {"Q4_K@256x256": 1e-6}
    save_profile(a, topo)
    save_profile(b, topo)   # without the merge: shape-b lost
    eng = cached_profile(topo).engine
    assert set(eng["structure"]) == {"shape-a", "shape-b"} and set(eng["structure"]["shape-a"]) == {"1", "2"}
    assert eng["cold"]["1"] == {"Q4_K@256x256": 1e-6}
    c = cached_profile(topo)   # a writer of another engine revision replaces them
    c.engine = {"kernel_path": "avx2", "kernels_revision": "k1", "engine_revision": "e2", "structure": {}}
    save_profile(c, topo)
    assert cached_profile(topo).engine["structure"] == {}
    assert not list(tmp_path.rglob("*.tmp"))

"""Pipeline stages without Ray: a model run as contiguous layer ranges, each loaded on its own
(`Engine.load(layers=...)`), gives the single-process greedy tokens and logits bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine.engine import Engine, Placement, stage_tensors
from workbench.engine.gguf_file import ModelLoadError, read_gguf



SPECS = {
    "gemma3": TinySpec(arch="gemma3", qtype=T.Q4_0, n_layer=3, n_ctx=256),           # tied head, SWA
    "llama-untied": TinySpec(arch="llama", qtype=T.Q8_0, n_layer=3, tied=False, n_ctx=256),
    "qwen3moe": TinySpec(arch="qwen3moe", qtype=T.Q8_0, n_layer=3, n_expert=4, n_expert_used=2,
                         n_ff=128, n_ff_exp=128, n_ctx=256),
    "deepseek2": TinySpec(arch="deepseek2", qtype=T.Q8_0, n_layer=3, n_head=4, head_dim=64, n_ff=256,
                          n_ff_exp=64, n_expert=4, n_expert_used=2, n_ctx=256),
}


@pytest.fixture(scope="module", params=sorted(SPECS))
def model(request, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("stages") / f"{request.param}.gguf"
    write_tiny_model(path, SPECS[request.param])
    return str(path)


def _greedy_whole(path: str, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    eng = Engine.load(path, placement=Placement(threads=1))
    try:
        s = eng.new_session(128)
        logits = [s.eval(prompt)]
        out = []
        for _ in range(n):
            out.append(int(np.argmax(logits[-1])))
            logits.append(s.eval([out[-1]]))
        return out, logits
    finally:
        eng.close()


def test_stages_match_single_process(model):
    prompt = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37]
    want, want_logits = _greedy_whole(model, prompt, 6)
    ranges = [(0, 1), (1, 2), (2, 3)]
    engines = [Engine.load(model, placement=Placement(threads=1), layers=r) for r in ranges]
    try:
        sessions = [e.new_session(128) for e in engines]
        assert [tuple((e.layers.start, e.layers.stop)) for e in engines] == ranges
        # each stage read only its own tensors
        assert not any(n.startswith("blk.1.") for n in engines[0].gguf.tensors)
        assert all(n.startswith("blk.1.") or not n.startswith("blk.") for n in engines[1].gguf.tensors)
        x: np.ndarray = np.asarray(prompt, dtype=np.int64)
        n_past = 0
        got, got_logits = [], []
        for step in range(7):
            h = x
            for s in sessions:
                h = s.forward_stage(h, n_past)
            got_logits.append(h[-1])
            n_past += len(x)
            if step < 6:
                got.append(int(np.argmax(h[-1])))
                x = np.asarray([got[-1]], dtype=np.int64)
        assert got == want
        for a, b in zip(got_logits, want_logits):
            np.testing.assert_array_equal(a, b)
    finally:
        for e in engines:
            e.close()


def test_stage_tensors_and_refusals(model):
    g = read_gguf(model)
    names = list(g.tensors)
    parts = [stage_tensors(names, 3, r) for r in [(0, 1), (1, 3)]]
    blocks = [n for n in names if n.startswith("blk.")]
    assert sorted(n for p in parts for n in p if n.startswith("blk.")) == sorted(blocks)
    assert "token_embd.weight" in parts[0] and "output_norm.weight" in parts[1]
    assert "output_norm.weight" not in parts[0]
    with pytest.raises(ModelLoadError, match="not within the model's 3 layers"):
        Engine.load(model, placement=Placement(threads=1), layers=(2, 5))


def test_split_follows_free_memory_and_refusals_name_hosts():
    from workbench.cluster import ClusterError
    from workbench.cluster.split import HostNeed, check_files, check_room, split_layers
    even = split_layers([10] * 12, [1, 1, 1])
    assert even == [(0, 4), (4, 8), (8, 12)]
    # a host with three times the free memory takes about three times the layers
    lo, hi = split_layers([10] * 12, [1, 3])
    assert lo == (0, 3) and hi == (3, 12)
    # the embedding (first) and the head (last) count against their hosts
    assert split_layers([10] * 12, [1, 1], first_extra=40) == [(0, 4), (4, 12)]
    # every host gets a layer, even a tiny one
    assert split_layers([10] * 3, [100, 1, 100]) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ClusterError, match="2 layers, fewer than the cluster's 3 hosts"):
        split_layers([10, 10], [1, 1, 1])
    ok = HostNeed("10.0.0.1/aa", (0, 6), {0: 100, 1: 100}, {0: 200, 1: 200})
    short = HostNeed("10.0.0.2/bb", (6, 12), {0: 300, 1: 10}, {0: 200, 1: 200})
    check_room([ok])
    with pytest.raises(ClusterError) as e:
        check_room([ok, short])
    msg = str(e.value)
    assert "host(s) 10.0.0.2/bb (nothing was loaded)" in msg and "\n" not in msg
    assert "host 10.0.0.1/aa layers 0..5: node 0 need 100 B free 200 B, node 1 need 100 B free 200 B" in msg
    assert "host 10.0.0.2/bb layers 6..11: node 0 need 300 B free 200 B" in msg and msg.endswith("<- no room")
    check_files([("a", "/m", 10, "x"), ("b", "/m", 10, "x")])
    with pytest.raises(ClusterError, match="host b: /n is 9 bytes, host a's /m is 10"):
        check_files([("a", "/m", 10, "x"), ("b", "/n", 9, "x")])
    with pytest.raises(ClusterError, match="host c: /m has another GGUF header than host a's /m"):
        check_files([("a", "/m", 10, "x"), ("b", "/m", 10, "x"), ("c", "/m", 10, "y")])
    with pytest.raises(ClusterError, match="host b: /m: No such file"):
        check_files([("a", "/m", 10, "x"), ("b", "/m", -1, "No such file or directory")])


def test_split_by_measured_bandwidth_within_free_memory():
    """With a probe for every host, each host's bytes follow its bandwidth (every stage then takes
    the same time per token), none above its free memory; without, free memory decides."""
    from workbench.advisor.probe import fixture_profile
    from workbench.cluster.split import bandwidth_shares, host_bandwidth, split_layers
    from workbench.numa.topology import fixture_path, load_topology
    epyc = fixture_profile(load_topology(fixture_path("epyc-9275f-2s")))     # 460.8 GB/s per node
    xeon = fixture_profile(load_topology(fixture_path("xeon-e5-2690v3-2s")))  # 51.2 GB/s per node
    # a node's figure at the host's worker count on it (the probe's thread curve), summed over nodes
    assert host_bandwidth(epyc, {0: 24, 1: 24}) == 2 * epyc.local(0)
    assert host_bandwidth(epyc, {0: 2}) == epyc.threads_bw(0, 2) == 60e9
    bw = [host_bandwidth(epyc, {0: 24, 1: 24}), host_bandwidth(xeon, {0: 12, 1: 12})]
    assert bw[0] / bw[1] == pytest.approx(9.0, rel=1e-3)
    roomy = [10 ** 6, 10 ** 6]
    assert split_layers([10] * 100, roomy, bandwidth=bw) == [(0, 90), (90, 100)]
    # the same hosts by free memory alone (no probe on one of them): halves
    assert split_layers([10] * 100, roomy, bandwidth=[bw[0], None]) == [(0, 50), (50, 100)]
    assert split_layers([10] * 100, roomy) == [(0, 50), (50, 100)]
    # the fast host has room for 600 bytes only: it takes that, the rest goes to the slow one
    assert bandwidth_shares(1000, [600, 10 ** 6], bw) == [600.0, 400.0]
    assert split_layers([10] * 100, [600, 10 ** 6], bandwidth=bw) == [(0, 60), (60, 100)]
    # three hosts: the middle one full, the others share the rest by bandwidth (9:1)
    assert bandwidth_shares(1000, [10 ** 6, 100, 10 ** 6], [bw[0], bw[0], bw[1]]) == pytest.approx([810, 100, 90], rel=1e-3)


def test_a_host_reports_its_bandwidth_from_the_probe_cached_there(tmp_path, monkeypatch):
    """What each Ray actor answers before the split: its probe cache ($XDG_CACHE_HOME/numawb/),
    read at its own workers' count per node; nothing when the machine has not been probed."""
    from workbench.advisor.probe import fixture_profile, save_profile
    from workbench.cluster.host import StageHost
    from workbench.numa.topology import fixture_path, load_topology
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host = StageHost("test")
    try:
        one = Placement(threads=1)
        assert host.bandwidth(one) is None  # not probed here
        prof = fixture_profile(load_topology(fixture_path("epyc-9275f-2s")))
        save_profile(prof, load_topology())  # as if `numawb probe` had measured these figures here
        node = host._pool(one).workers[0].node
        assert host.bandwidth(one) == prof.threads_bw(node, 1) == 30e9
    finally:
        host.close()

"""Mixture-of-experts architectures (qwen3moe, Mixtral-style llama): engine vs an independent NumPy
forward pass, generation through the public API at 1 and 2 threads, and only routed experts read."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from reference_forward import forward as ref_forward
from workbench.engine import Engine
from workbench.engine.chat import Message
from workbench.engine.engine import Chat, Placement
from workbench.engine.sampling import SamplingParams

IDS = [2, 270, 262, 280, 265, 285, 271, 268, 288, 262, 275, 281]
TOL = {T.F16: 2e-3, T.Q8_0: 2e-2, T.Q4_K: 4e-2, T.Q6_K: 4e-2, T.Q4_0: 2e-2}


def moe_spec(arch: str, qtype: T = T.Q8_0, seed: int = 0) -> TinySpec:
    # 8 experts, 2 routed; expert rows a multiple of 256 so K-quants fit
    return TinySpec(arch=arch, qtype=qtype, n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256, seed=seed)


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2) / (np.mean(b ** 2) + 1e-12)))


@pytest.mark.parametrize("arch", ["qwen3moe", "llama"])
@pytest.mark.parametrize("qtype", [T.F16, T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_moe_logits_match_numpy_reference(tmp_path, arch, qtype):
    # the routing must not hinge on a near-tie (the engine's f32/quantized router could then pick
    # the other expert legitimately): take the first seed whose reference routing has every
    # k-th/(k+1)-th probability gap clear of rounding
    path = tmp_path / f"{arch}-moe-{qtype.name}.gguf"
    base = zlib.crc32(f"{arch}{qtype.name}".encode()) % 1000
    for seed in range(base, base + 30):
        spec = moe_spec(arch, qtype, seed)
        W = write_tiny_model(path, spec)
        info: dict = {}
        ref = ref_forward(W, arch, IDS, spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_layer,
                          n_expert_used=spec.n_expert_used, info=info)
        if info["margin"] > 2e-3:
            break
    assert info["margin"] > 2e-3
    eng = Engine.load(str(path))
    try:
        assert type(eng.model).__name__ == ("Qwen3MoE" if arch == "qwen3moe" else "LlamaMoE")
        got = eng.new_session(64).eval(IDS, logit_rows=slice(0, len(IDS)))
        assert _rel_err(got, ref) < TOL[qtype]
        s = eng.new_session(64)
        for t in IDS:
            last = s.eval([t])
        assert _rel_err(last, ref[-1]) < TOL[qtype]
    finally:
        eng.close()


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "qwen3moe-q8.gguf"
    write_tiny_model(path, moe_spec("qwen3moe", T.Q8_0, seed=7))
    return str(path)


def _greedy(path: str, threads: int, prompt: str = "the cat sat on", n: int = 12) -> tuple[list[int], list[int]]:
    eng = Engine.load(path, placement=Placement(threads=threads))
    try:
        ids = eng.tokenizer.encode(prompt, add_bos=True)
        toks = [ev.token for ev in eng.new_session(128).generate(ids, SamplingParams(temperature=0.0), n)
                if hasattr(ev, "token") and ev.token >= 0]
        chat = Chat(eng, n_ctx=256)
        reply = [ev.token for ev in chat.send("hello world", SamplingParams(temperature=0.0), n_predict=8)
                 if hasattr(ev, "token") and ev.token >= 0]
        assert chat.messages[-1] == Message("assistant", chat.messages[-1].content)
        return toks, reply
    finally:
        eng.close()


def test_generate_and_chat_same_tokens_at_1_and_2_threads(moe_file):
    one = _greedy(moe_file, 1)
    two = _greedy(moe_file, 2)
    assert len(one[0]) == 12 and one[1]
    assert one == two


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_reads_only_routed_experts(moe_file, threads, monkeypatch):
    """The weight rows handed to the kernels for one decoded token are those of the k routed
    experts of each layer, never the others'."""
    from workbench.engine import crew, experts
    from workbench.engine.crew import T_W

    eng = Engine.load(moe_file, placement=Placement(threads=threads))
    try:
        s = eng.new_session(64)
        s.eval([2, 270, 262])   # the prompt first (its last row's experts are a compiled call too)
        read: list[int] = []
        run = crew.Crew.run

        def spy(self, job, xa, xb, outs):
            read.extend(int(a) for a in job.tasks[:, T_W])
            return run(self, job, xa, xb, outs)
        monkeypatch.setattr(crew.Crew, "run", spy)
        # decode's compiled expert FFN composes its jobs from per-expert tables: note the rows of
        # the tables it is given for the routed ids (expert_token.compose picks exactly those)
        make = experts.expert_runner

        def spy_runner(*a):
            real = make(*a)

            def fn(ctl, nw, x, ids, wts, gu_t3, gu_c3, gu_w, gu_wa, d_t3, d_c3, d_w, d_wa, *rest):
                for t3, wa in ((gu_t3, gu_wa), (d_t3, d_wa)):
                    # compact tables: the routed ids' weight addresses; else their full task rows
                    addrs = wa[ids] if wa.shape[0] else t3[ids][:, :, T_W]
                    read.extend(int(v) for v in addrs.reshape(-1) if v)
                return real(ctl, nw, x, ids, wts, gu_t3, gu_c3, gu_w, gu_wa, d_t3, d_c3, d_w, d_wa, *rest)
            return fn
        monkeypatch.setattr(experts, "expert_runner", spy_runner)
        eng.rt._etoken.clear()
        routed: dict[str, set[int]] = {}
        tap = eng.model.tap

        def note(name, t):
            if name.startswith("ffn_moe_topk-"):
                il = int(name.split("-")[1])
                for kind in ("gate", "up", "down"):
                    routed[f"blk.{il}.ffn_{kind}_exps.weight"] = {int(e) for e in t.reshape(-1)}
        eng.model.tap = note
        read.clear()
        s.eval([280])  # one decoded token
        eng.model.tap = tap
        cfg, lay = eng.cfg, eng.layout
        owner = {}
        for il in range(cfg.n_layer):
            for kind in ("gate", "up", "down"):
                name = f"blk.{il}.ffn_{kind}_exps.weight"
                for e in range(cfg.n_expert):
                    for wk in range(threads):
                        arr, _ = lay.expert_rows(name, wk, e)
                        owner[arr.ctypes.data] = (name, e)
        got: dict[str, set[int]] = {}
        for a in read:
            if a in owner:
                name, e = owner[a]
                got.setdefault(name, set()).add(e)
        assert got == routed and all(len(v) == cfg.n_expert_used for v in got.values())
        assert len(got) == 3 * cfg.n_layer
    finally:
        eng.close()


def test_expert_rows_layout_method(moe_file):
    """WeightLayout.expert_rows: expert e is rows [e*n, (e+1)*n) of the tensor as 2-D."""
    eng = Engine.load(moe_file)
    try:
        lay = eng.layout
        name = "blk.0.ffn_up_exps.weight"
        info = eng.gguf.tensors[name]
        n_ff, n_exp = info.shape[1], info.shape[2]
        full = lay.full_array(name)
        for e in (0, n_exp - 1):
            arr, first = lay.expert_rows(name, 0, e)
            assert first == 0 and arr.shape == (n_ff, info.row_bytes)
            assert np.array_equal(arr, full[e * n_ff:(e + 1) * n_ff])
        with pytest.raises(IndexError):
            lay.expert_rows(name, 0, n_exp)
    finally:
        eng.close()


def _greedy_ids(eng, n: int = 10) -> list[int]:
    s = eng.new_session(128)
    out = []
    for ev in s.generate(IDS, SamplingParams(temperature=0.0), n):
        if hasattr(ev, "token") and ev.token >= 0:
            out.append(ev.token)
    s.close()
    return out


def test_moe_generation_identical_in_every_weights_mode_and_across_live_switches(moe_file):
    """Every placement (experts sliced per expert, owned whole by nodes, mirrored, ...) and every
    live switch gives the same greedy tokens; the plan covers every expert tensor."""
    ref_eng = Engine.load(moe_file, placement=Placement(threads=2))
    try:
        ref = _greedy_ids(ref_eng)
    finally:
        ref_eng.close()
    for mode in ("slice", "experts", "mirror", "interleave", "auto"):
        eng = Engine.load(moe_file, placement=Placement(weights=mode, threads=2))
        try:
            plan = eng.plan
            exps = [n for n in eng.gguf.tensors if "_exps" in n]
            assert exps and all(plan.tensors[n].spec.groups == eng.cfg.n_expert for n in exps)
            want = {"slice": "slice", "experts": "experts", "mirror": "mirror", "interleave": "interleave",
                    "auto": "slice"}[mode]
            assert {plan.tensors[n].placement for n in exps} == {want}
            assert _greedy_ids(eng) == ref, mode
        finally:
            eng.close()
    eng = Engine.load(moe_file, placement=Placement(threads=2))
    try:
        for mode in ("experts", "slice", "mirror", "none"):
            eng.switch(weights=mode)
            assert _greedy_ids(eng) == ref, f"after switch to {mode}"
    finally:
        eng.close()


def test_routing_statistics_count_routed_experts_and_their_nodes(moe_file):
    eng = Engine.load(moe_file, placement=Placement(weights="slice", threads=2))
    try:
        s = eng.new_session(128)
        s.eval(IDS)
        for t in IDS[:5]:
            s.eval([t])
        snap = eng.routing()
        k = eng.cfg.n_expert_used
        assert snap.layers == tuple(range(eng.cfg.n_layer))
        # every token routes to k experts in every layer (the last layer of a prompt finishes only
        # the row whose logits are wanted, as llama.cpp does)
        assert all(int(snap.hits[il].sum()) == (len(IDS) + 5) * k for il in snap.layers[:-1])
        assert int(snap.hits[snap.layers[-1]].sum()) == (1 + 5) * k
        assert snap.window == len(IDS) + 5
        # one node here: every expert byte is read from it; a decode token reads k experts' 3 matrices
        assert set(snap.node_bytes) == {0} and snap.imbalance == 1.0
        per_expert = sum(eng.gguf.tensors[f"blk.0.ffn_{m}_exps.weight"].nbytes for m in ("gate", "up", "down")) \
            / eng.cfg.n_expert
        assert snap.node_bytes[0] <= eng.cfg.n_layer * k * per_expert + 1e-6
        assert snap.as_dict()["node_shares"] == {"0": 1.0}
        eng.switch(weights="mirror")
        assert eng.routing().node_bytes == {}  # cleared: reads now come from other copies
    finally:
        eng.close()


def test_router_selection_groups_bias_norm_scale():
    from workbench.engine.gating import route, softmax_rows

    p = np.array([[0.9, 0.0, 0.5, 0.45, 0.1, 0.2, 0.3, 0.35]], dtype=np.float32)
    ids, w = route(p, 2)
    assert ids.tolist() == [[0, 2]] and np.allclose(w, [[0.9, 0.5]])
    # groups of 2: group sums 0.9, 0.95, 0.3, 0.65 -> the best two groups are 1 and 0
    ids, _ = route(p, 2, n_groups=4, n_group_used=2)
    assert ids.tolist() == [[0, 2]]
    ids, _ = route(p, 3, n_groups=4, n_group_used=2)
    assert ids.tolist() == [[0, 2, 3]]  # 0.35 (group 3) is masked out
    # the bias moves the choice, the weights stay the unbiased probabilities, normalised and scaled
    bias = np.array([0, 0, 0, 0, 0, 0, 0, 1.0], dtype=np.float32)
    ids, w = route(p, 2, bias, norm=True, scale=2.0)
    assert ids.tolist() == [[7, 0]]
    assert np.allclose(w, [[0.35 / 1.25 * 2, 0.9 / 1.25 * 2]], rtol=1e-6)
    # softmax rows sum to one, in float32, whatever the width (16-lane blocks and leftovers)
    x = np.random.default_rng(0).standard_normal((3, 37)).astype(np.float32)
    s = softmax_rows(x)
    assert s.dtype == np.float32 and np.allclose(s.sum(axis=1), 1, atol=1e-6)
    assert np.allclose(s, np.exp(x) / np.exp(x).sum(axis=1, keepdims=True), rtol=1e-5)


class _OwnedExperts:
    """A layout whose experts are each computed whole by one worker (as a placement that gives
    every expert to one node would): the runtime asks `expert_split` who computes which rows."""

    def __init__(self, base, n_workers: int):
        self._base, self._n = base, n_workers

    def __getattr__(self, name):
        return getattr(self._base, name)

    def expert_split(self, name: str, expert: int) -> list[tuple[int, int]]:
        spec = self._base.specs[name]
        per = spec.group_rows
        return [(0, per) if wk == expert % self._n else (0, 0) for wk in range(self._n)]


def test_expert_split_hook_gives_the_same_results(moe_file):
    eng = Engine.load(moe_file, placement=Placement(threads=2))
    try:
        ids = [2, 270, 262, 280, 265, 285]

        def run() -> tuple[np.ndarray, np.ndarray]:
            s = eng.new_session(64)
            prompt = s.eval(ids, logit_rows=slice(0, len(ids)))
            return prompt, s.eval([281])
        want = run()
        eng.rt.set_layout(_OwnedExperts(eng.layout, 2), eng.pool)
        got = run()
        assert all(np.array_equal(a, b) for a, b in zip(want, got))
    finally:
        eng.rt.set_layout(eng.layout._base if isinstance(eng.layout, _OwnedExperts) else eng.layout, eng.pool)
        eng.close()


def test_step_imbalance_of_owned_experts_is_measured_per_layer_step():
    """With experts owned by nodes, a layer step waits for the node whose experts were routed
    most: two nodes, 4 of 8 experts each; a step routing 3 experts to node 0 and 1 to node 1
    reads 3/2 of the mean from node 0."""
    from workbench.engine.routing import RoutingStats
    owner = lambda e: 0 if e < 4 else 1  # noqa: E731
    st = RoutingStats(2, 8, bytes_by_node=lambda name, e: {owner(e): 100.0}, nodes=lambda: [0, 1])
    st.record("blk.0.ffn_gate_exps.weight", np.array([[0, 1, 2, 5]]), ("blk.0.ffn_gate_exps.weight",))
    st.record("blk.1.ffn_gate_exps.weight", np.array([[0, 4, 5, 6]]), ("blk.1.ffn_gate_exps.weight",))
    snap = st.snapshot()
    assert snap.node_bytes == {0: 400.0, 1: 400.0} and snap.imbalance == 1.0  # even over the window ...
    assert snap.step_imbalance == pytest.approx((1.5 + 1.5) / 2)             # ... but not per step


def test_a_batch_pass_is_counted_as_its_layers_recorded_one_by_one():
    """A decode batch's pass (`record_pass`: every routed layer's rows at once, counted later) gives
    the snapshot that recording each layer's rows in turn gives: hits, bytes per node (each distinct
    expert once per layer and pass) and the per-step imbalance; past PASSES_DUE passes too."""
    from workbench.engine.routing import PASSES_DUE, RoutingStats
    owner = lambda e: 0 if e < 4 else 1  # noqa: E731
    rng = np.random.default_rng(3)
    keys = [(f"blk.{il}.ffn_gate_exps.weight", (f"blk.{il}.ffn_gate_exps.weight",)) for il in (1, 2)]

    def stats():
        return RoutingStats(3, 8, window=16, bytes_by_node=lambda name, e: {owner(e): 100.0}, nodes=lambda: [0, 1])
    one, passes = stats(), stats()
    for _ in range(PASSES_DUE + 3):
        ids = rng.integers(0, 8, size=(2, int(rng.integers(1, 5)), 2))   # [layers, rows, k]
        for (tensor, tensors), rows in zip(keys, ids):
            one.record(tensor, rows, tensors)
        passes.record_pass(keys, ids)
        ids[:] = 0   # the caller's buffer is reused: the pass keeps its own copy
    a, b = one.snapshot(), passes.snapshot()
    assert b.window == a.window == 16 and b.layers == a.layers == (1, 2)
    np.testing.assert_array_equal(b.hits, a.hits)
    assert b.node_bytes == a.node_bytes and b.step_imbalance == a.step_imbalance


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_fused_gate_up_experts_give_the_same_logits(tmp_path, arch):
    """A file converted with --fuse-gate-up-exps (one ffn_gate_up_exps per layer) computes the same
    logits, bit for bit, as the file with separate gate and up experts holding the same weights."""
    if arch == "deepseek2":
        kw = dict(n_layer=3, n_head=4, head_dim=64, n_ff=256, n_ff_exp=64, n_expert=8, n_expert_used=2, q_lora_rank=64)
    else:
        kw = dict(n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256)
    outs = []
    for fused in (False, True):
        path = tmp_path / f"{arch}-{fused}.gguf"
        write_tiny_model(path, TinySpec(arch=arch, qtype=T.Q8_0, seed=5, fuse_gate_up=fused, **kw))
        eng = Engine.load(str(path))
        try:
            assert eng.rt.has("blk.1.ffn_gate_up_exps.weight") == fused
            s = eng.new_session(64)
            outs.append((s.eval(IDS, logit_rows=slice(0, len(IDS))), s.eval([281])))
        finally:
            eng.close()
    assert all(np.array_equal(a, b) for a, b in zip(*outs))


def test_routing_window_and_node_bytes_match_a_brute_force_count():
    """RoutingStats keeps each layer's last `window` tokens (calls of 1 to more than `window` tokens,
    wrapping the ring) and counts, per call, each distinct expert's bytes once per node."""
    from workbench.engine.routing import RoutingStats
    rng = np.random.default_rng(5)
    n_layer, n_exp, k, window = 2, 6, 2, 4
    table = {e: {0: 10.0 * (e + 1), 1: 1.0 * e} for e in range(n_exp)}
    stats = RoutingStats(n_layer, n_exp, window, bytes_by_node=lambda name, e: table[e], nodes=lambda: [0, 1])
    rows: dict[int, list] = {0: [], 1: []}
    calls = []
    for n in (1, 3, 1, 6, 2, 1, 5):
        for il in range(n_layer):
            ids = np.stack([rng.choice(n_exp, k, replace=False) for _ in range(n)])
            stats.record(f"blk.{il}.ffn_up_exps.weight", ids, (f"blk.{il}.ffn_up_exps.weight",))
            rows[il] += ids.tolist()
            calls.append((n, sorted(set(ids.ravel().tolist()))))
    snap = stats.snapshot()
    for il in range(n_layer):
        want = np.bincount(np.array(rows[il][-window:]).ravel(), minlength=n_exp)
        assert snap.hits[il].tolist() == want.tolist()
    assert snap.window == window
    kept = calls[-window * n_layer:]
    tokens = sum(n for n, _ in kept) / n_layer
    want_bytes = {nd: sum(table[e][nd] for _, used in kept for e in used) / tokens for nd in (0, 1)}
    assert snap.node_bytes == pytest.approx(want_bytes)
    ratios = [max(v) * 2 / sum(v) for v in ([sum(table[e][nd] for e in used) for nd in (0, 1)] for _, used in kept)]
    assert snap.step_imbalance == pytest.approx(sum(ratios) / len(ratios))
    stats.clear()
    assert stats.snapshot().window == 0 and stats.snapshot().node_bytes == {}


def test_top_k_keeps_the_largest_in_order_with_ties_to_the_lower_index():
    """gating._best (ggml_argsort_top_k's selection): the k largest, largest first, ties by lower
    index, masked (-inf) groups last: against a sort by (value down, index up), over many ties."""
    from workbench.engine.gating import _best
    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.integers(2, 300))
        k = int(rng.integers(1, min(n, 10) + 1))
        v = (rng.integers(-3, 4, n) if trial % 2 else rng.standard_normal(n)).astype(np.float32)
        if trial % 5 == 0:
            v[rng.integers(0, n, n // 3)] = -np.inf
        got = np.empty(k, dtype=np.int64)
        _best(v, k, got)
        want = sorted(range(n), key=lambda j: (-float(v[j]), j))[:k]
        assert got.tolist() == want

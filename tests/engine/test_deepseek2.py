"""deepseek2 (DeepSeek V2/V3/R1 layout): multi-head latent attention with and without q-LoRA,
leading dense layers, shared experts, softmax or sigmoid gating with the selection bias, groups,
weight normalisation and scale, YaRN; engine vs a naive NumPy forward pass, 1 vs 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from reference_forward import deepseek2_forward
from workbench.engine import Engine
from workbench.engine.engine import Chat, Placement
from workbench.engine.gguf_file import ModelLoadError
from workbench.engine.kv_cache import MLACache, owner_slots, slots_per_worker
from workbench.engine.sampling import SamplingParams

IDS = [2, 270, 262, 280, 265, 285, 271, 268, 288, 262, 275, 281]
VARIANTS = {
    "plain-q": dict(),
    "q-lora": dict(q_lora_rank=64, weights_norm=True),
    # DeepSeek V3 / R1 style: sigmoid gating, selection bias, 4 groups of which 2 are used,
    # normalised and scaled weights, YaRN RoPE with mscale_all_dim
    "v3": dict(q_lora_rank=64, gating=2, probs_bias=True, n_groups=4, n_group_used=2, weights_norm=True,
               weights_scale=2.5, yarn=(4.0, 64, 0.707)),
}


def ds_spec(qtype: T = T.Q8_0, seed: int = 0, **kw) -> TinySpec:
    return TinySpec(arch="deepseek2", qtype=qtype, n_layer=3, n_head=4, head_dim=64, n_ff=256, n_ff_exp=64,
                    n_expert=8, n_expert_used=2, seed=seed, **kw)


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2) / (np.mean(b ** 2) + 1e-12)))


def _clear_model(path, variant: str, qtype: T) -> tuple[TinySpec, dict, np.ndarray]:
    """The first seed whose reference routing has no near-tie (see test_moe)."""
    for seed in range(40):
        spec = ds_spec(qtype, seed, **VARIANTS[variant])
        W = write_tiny_model(path, spec)
        info: dict = {}
        ref = deepseek2_forward(W, spec, IDS, info)
        if info["margin"] > 2e-3:
            return spec, W, ref
    raise AssertionError("no seed with a clear routing")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("qtype", [T.F16, T.Q8_0], ids=lambda t: t.name)
def test_deepseek2_matches_numpy_reference(tmp_path, variant, qtype):
    path = tmp_path / f"ds-{variant}-{qtype.name}.gguf"
    spec, _W, ref = _clear_model(path, variant, qtype)
    tol = 3e-3 if qtype == T.F16 else 3e-2
    lasts = []
    for threads in (1, 2):
        eng = Engine.load(str(path), placement=Placement(threads=threads))
        try:
            assert type(eng.model).__name__ == "DeepSeek2"
            got = eng.new_session(64).eval(IDS, logit_rows=slice(0, len(IDS)))
            assert _rel_err(got, ref) < tol
            s = eng.new_session(64)
            for t in IDS:
                last = s.eval([t])
            assert _rel_err(last, ref[-1]) < tol
            lasts.append(last)
        finally:
            eng.close()
    assert np.array_equal(lasts[0], lasts[1])


def test_mla_cache_holds_latent_and_rotary_key_only(tmp_path):
    path = tmp_path / "ds.gguf"
    spec = ds_spec(**VARIANTS["q-lora"])
    write_tiny_model(path, spec)
    eng = Engine.load(str(path))
    try:
        s = eng.new_session(128)
        assert isinstance(s.kv, MLACache)
        per_token = (2 * spec.kv_lora_rank + spec.n_rot) * 2  # f16 rows and the latent transposed
        assert s.kv.nbytes == spec.n_layer * slots_per_worker(128, 1) * per_token
        # a per-head cache would hold n_head x (key + value) per token
        assert per_token < spec.n_head * (spec.head_dim + spec.head_dim_v_mla) * 2
        ids = eng.tokenizer.encode("the cat sat on", add_bos=True)
        toks = [ev.token for ev in s.generate(ids, SamplingParams(temperature=0.0), 10) if hasattr(ev, "token")]
        assert len(toks) >= 1
        reply = list(Chat(eng, n_ctx=128).send("hello", SamplingParams(temperature=0.0), n_predict=6))
        assert reply
    finally:
        eng.close()


def test_generation_same_tokens_at_1_and_2_threads(tmp_path):
    path = tmp_path / "ds-v3.gguf"
    write_tiny_model(path, ds_spec(**VARIANTS["v3"]))
    outs = []
    for threads in (1, 2):
        eng = Engine.load(str(path), placement=Placement(threads=threads))
        try:
            ids = eng.tokenizer.encode("hello world the cat", add_bos=True)
            outs.append([ev.token for ev in eng.new_session(128).generate(ids, SamplingParams(temperature=0.0), 16)
                         if hasattr(ev, "token")])
        finally:
            eng.close()
    assert outs[0] == outs[1] and len(outs[0]) >= 2


def test_old_mla_layout_is_refused_in_one_line(tmp_path):
    path = tmp_path / "ds-old.gguf"
    write_tiny_model(path, ds_spec(old_mla=True))
    with pytest.raises(ModelLoadError) as e:
        Engine.load(str(path))
    msg = str(e.value)
    assert "\n" not in msg and "re-convert" in msg and "llama.cpp" in msg


def test_live_switches_keep_the_conversation_and_the_tokens(tmp_path):
    """Weights mode, KV mode and thread count switched mid-conversation: the MLA cache is moved,
    expert plans are rebuilt, and greedy tokens stay those of an untouched engine."""
    path = tmp_path / "ds-v3.gguf"
    write_tiny_model(path, ds_spec(**VARIANTS["v3"]))
    params = SamplingParams(temperature=0.0)

    def run(switch: bool) -> list[int]:
        eng = Engine.load(str(path))
        try:
            s = eng.new_session(128)
            ids = eng.tokenizer.encode("the cat sat on the mat", add_bos=True)
            first = [ev.token for ev in s.generate(ids, params, 6) if hasattr(ev, "token")]
            if switch:
                eng.switch(weights="slice", kv="interleave", threads=2)
                assert eng.rt.n_workers == 2 and isinstance(s.kv, MLACache)
            more = [ev.token for ev in s.generate(ids + first + [262], params, 6) if hasattr(ev, "token")]
            return first + more
        finally:
            eng.close()
    assert run(True) == run(False)


def test_mla_cache_split_between_owners(tmp_path):
    """Positions dealt to two owners in 32-position blocks (two nodes' first-touch parts): the same
    logits as one owner (to the bit while one block holds everything, to rounding after), and a
    cache copied between owner counts continues identically."""
    path = tmp_path / "ds.gguf"
    write_tiny_model(path, ds_spec(**VARIANTS["q-lora"]))
    eng = Engine.load(str(path), placement=Placement(threads=2))
    try:
        ids = [2] + [260 + (i * 7) % 30 for i in range(44)]
        one = MLACache(eng.cfg, 128, 1)
        two = MLACache(eng.cfg, 128, 2, owner_workers=[[0], [1]])
        a = eng.model.forward(np.array(ids[:20]), one, slice(0, 20))
        b = eng.model.forward(np.array(ids[:20]), two, slice(0, 20))
        assert np.array_equal(a, b)
        a = eng.model.forward(np.array(ids[20:]), one, slice(0, 25))
        b = eng.model.forward(np.array(ids[20:]), two, slice(0, 25))
        assert np.allclose(a, b, rtol=1e-4, atol=1e-4)
        moved = MLACache(eng.cfg, 128, 1)
        moved.copy_from(two)
        assert moved.n == two.n == 45
        owners, slots = owner_slots(np.arange(45), 2)
        for il in range(eng.cfg.n_layer):
            for pos in range(45):
                assert np.array_equal(moved.k[il][0][pos], two.k[il][owners[pos]][slots[pos]])
    finally:
        eng.close()

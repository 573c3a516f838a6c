"""A DeepSeek (deepseek2) token in one compiled call (`mla_token`, `expert_token.shared_runner`)
against the step-by-step path, bit for bit.

A decoded token of a deepseek2 model runs its multi-head latent attention, its routed + shared
experts and its leading dense layers from the token id to the logits in one compiled call; the
general path (the model's own Python steps, taken when a tap watches) must give the same logits to
the bit, with and without q-LoRA, softmax or grouped sigmoid gating, a file mixing activation
formats (the router, shared and routed experts then run as three crew jobs:
`expert_token.shared_fused_runner`), at 1 and 2 threads, and past a 64-slot boundary of the latent
cache."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine
from workbench.engine.engine import Placement

PROMPT = [2, 270, 262, 280, 265, 285, 271]
VARIANTS = {
    # DeepSeek V2-Lite: no q-LoRA, softmax gating, two shared experts
    "v2-lite": dict(n_expert_shared=2),
    # V3 / R1: q-LoRA, sigmoid gating with the selection bias, 4 groups of which 2 are used,
    # normalised and scaled weights, two leading dense layers
    "v3": dict(q_lora_rank=64, gating=2, probs_bias=True, n_groups=4, n_group_used=2, weights_norm=True,
               weights_scale=2.5, n_layer_dense_lead=2),
    # the same in Q4_K with Q8_0 attn_k_b / attn_v_b: a file mixing Q8_K and Q8_0 activations
    "v3-q4k": dict(qtype=T.Q4_K, q_lora_rank=256, head_dim_v_mla=64, n_ff=256, n_ff_exp=256, gating=2,
                   probs_bias=True, n_groups=4, n_group_used=2, weights_norm=True, weights_scale=2.5,
                   n_layer_dense_lead=2),
}


def _decode(path: str, threads: int, compiled: bool, n: int) -> tuple[list[np.ndarray], dict]:
    """Logits of the prompt and n decoded tokens (greedy on odd steps), and the compiled calls
    taken by name; `compiled` False: a tap on the model forces the step-by-step path."""
    eng = Engine.load(path, placement=Placement(threads=threads))
    taken: dict = {}
    try:
        rt = eng.rt
        for name in ("token_program", "token_layers", "layer_token"):
            real = getattr(rt, name)

            def spy(*a, _real=real, _name=name, **k):
                o = _real(*a, **k)
                taken[_name] = taken.get(_name, 0) + (o is not None)
                return o
            setattr(rt, name, spy)
        if not compiled:
            eng.model.tap = lambda name, t: None
        s = eng.new_session(128)
        out = [s.eval(PROMPT).copy()]
        for i in range(n):
            out.append(s.eval([int(np.argmax(out[-1])) if i % 2 else 262 + i % 20]).copy())
        # the layers whose FFN took the three merged jobs (`Runtime._fused_parts`)
        taken["fused"] = sum(1 for key, c in rt._rparts.items() if key[0] == "fused" and c.ready is not None)
        return out, taken
    finally:
        eng.close()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("threads", [1, 2])
def test_a_deepseek2_token_in_one_call_equals_the_step_path(tmp_path, variant, threads):
    path = tmp_path / f"{variant}.gguf"
    spec = dict(arch="deepseek2", qtype=T.Q8_0, n_layer=4, n_head=4, head_dim=64, n_ff=256, n_ff_exp=64, n_expert=8,
                n_expert_used=2, seed=7)
    write_tiny_model(path, TinySpec(**{**spec, **VARIANTS[variant]}))
    n = 64  # the cache crosses its first 64-slot boundary (the values' steps)
    fast, calls = _decode(str(path), threads, True, n)
    slow, none = _decode(str(path), threads, False, n)
    assert calls == {"token_program": n, "fused": 4}  # every decoded token: one call from its id to its
    # logits, every layer's FFN (routed + shared, or dense) in the three merged crew jobs
    assert none.get("token_program", 0) == 0 and none.get("layer_token", 0) == 0
    for a, b in zip(fast, slow):
        assert a.dtype == np.float32 and np.array_equal(a, b)

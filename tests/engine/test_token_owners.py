"""Decoded tokens over a KV cache split between owners (the nodes of a multi-socket machine) in one
compiled call, bit for bit against the step-by-step path.

On a machine with several nodes the cache's positions are dealt to one owner per node in blocks of
32 (first-touched by that node's workers); a decoded token's compiled call then runs
`attention.owners_attention`, each owner's chunks on its own workers. Here two owners on one node
(workers 0 and 1) stand for two nodes: a dense model, a mixture of experts and a DeepSeek model
(MLA over its latent cache) decode 40 tokens past a 40-token prompt (the positions cross several
blocks, so both owners hold keys) with the token program and with the model's Python steps."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine
from workbench.engine.engine import Placement
from workbench.engine.kv_cache import make_cache

SPECS = {
    "llama": dict(arch="llama", qtype=T.Q4_K, n_layer=2),
    "qwen3moe": dict(arch="qwen3moe", qtype=T.Q8_0, n_layer=2, n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256),
    "deepseek2": dict(arch="deepseek2", qtype=T.Q8_0, n_layer=3, n_head=4, head_dim=64, n_ff=256, n_ff_exp=64,
                      n_expert=8, n_expert_used=2, q_lora_rank=64, gating=2, probs_bias=True, n_groups=4,
                      n_group_used=2, weights_norm=True, weights_scale=2.5),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_token_over_two_owners_in_one_call_equals_the_step_path(tmp_path, name):
    path = tmp_path / f"{name}.gguf"
    write_tiny_model(path, TinySpec(seed=9, **SPECS[name]))
    eng = Engine.load(str(path), placement=Placement(threads=2))
    try:
        rt, model = eng.rt, eng.model
        taken = [0]
        real = rt.token_program

        def spy(*a, **k):
            o = real(*a, **k)
            taken[0] += o is not None
            return o
        rt.token_program = spy
        prompt = np.array([2] + [260 + (i * 7) % 28 for i in range(39)])
        runs = []
        for compiled in (True, False):
            model.tap = None if compiled else (lambda n, t: None)
            kv = make_cache(eng.cfg, 128, 2, owner_workers=[[0], [1]])
            out = [model.forward(prompt, kv).copy()]
            for i in range(40):
                tok = int(np.argmax(out[-1])) if i % 2 else 262 + i % 20
                out.append(model.forward(np.array([tok]), kv).copy())
            runs.append(out)
        model.tap = None
        assert taken[0] == 40   # every decoded token of the first run: one call, over both owners
        for a, b in zip(*runs):
            assert np.array_equal(a, b)
    finally:
        eng.close()

"""Decode's compiled attention sub-layer (`token_attention`) against the general path, bit for bit.

A decoded token's attention (q/k/v products, biases, q/k norms, RoPE, attention over the cache,
output product) takes one compiled call with the crew; the step-by-step path must give the same
logits to the bit, for every family switch the block takes (biases, QK-norm, NEOX or normal RoPE,
query prescaling, a sliding window crossed) and at 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine
from workbench.engine.engine import Placement

PROMPT = [5, 17, 29, 3, 41]


def _decode(path: str, threads: int, compiled: bool, n: int = 14, layers: bool = True, by: dict | None = None,
            tokens: bool = True) -> tuple[list[np.ndarray], int]:
    """Logits of a prompt and n decoded tokens, and how many layers took a compiled call (the
    attention sub-layer's, or a MoE layer's whole; `layers` False: not the latter; `tokens` False:
    not a token's every layer at once); `by` gets the count per call."""
    eng = Engine.load(path, placement=Placement(threads=threads))
    by = {} if by is None else by
    try:
        rt = eng.rt
        taken = [0]

        def spy_on(name: str, on: bool) -> None:
            real = getattr(rt, name)

            def spy(*a, **k):
                if not on:
                    return None
                o = real(*a, **k)
                taken[0] += o is not None
                by[name] = by.get(name, 0) + (o is not None)
                return o
            setattr(rt, name, spy)
        spy_on("attention_token", compiled)
        spy_on("layer_token", compiled and layers)
        spy_on("token_layers", compiled and layers and tokens)
        s = eng.new_session(64)
        out = [s.eval(PROMPT).copy()]
        for i in range(n):
            out.append(s.eval([int(np.argmax(out[-1])) if i % 2 else 7 + i]).copy())
        return out, taken[0]
    finally:
        eng.close()


@pytest.mark.parametrize("arch,qtype", [("gemma3", T.Q8_0), ("qwen3", T.Q4_K), ("qwen2", T.Q8_0),
                                        ("llama", T.Q6_K), ("qwen3moe", T.Q4_K)])
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_attention_equals_general_path(tmp_path, arch, qtype, threads):
    path = tmp_path / f"{arch}.gguf"
    extra = dict(n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256) if arch == "qwen3moe" else {}
    write_tiny_model(path, TinySpec(arch=arch, qtype=qtype, n_layer=2, seed=11, **extra))
    fast, taken = _decode(str(path), threads, True)
    slow, none = _decode(str(path), threads, False)
    # every decoded token's every layer took one call (a MoE token: one call for all its layers)
    assert none == 0 and taken == (14 if arch == "qwen3moe" else 14 * 2)
    for a, b in zip(fast, slow):
        assert a.dtype == np.float32 and np.array_equal(a, b)


@pytest.mark.parametrize("fused,qtype", [(False, T.Q4_K), (True, T.Q8_0)])
@pytest.mark.parametrize("threads", [1, 2])
def test_whole_moe_layer_in_one_call_equals_its_sub_layers(tmp_path, fused, qtype, threads):
    """`Runtime.token_layers` (a token's every layer in one compiled call) and `layer_token`
    (attention, residual adds, norms and the routed FFN of one layer) give the same logits to the bit
    as the sub-layers' own calls and as the general path, with separate and fused gate/up experts;
    every decoded token takes the one call."""
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=qtype, n_layer=3, seed=4, n_expert=8, n_expert_used=2,
                                    n_ff=256, n_ff_exp=256, fuse_gate_up=fused))
    calls, per_layer = {}, {}
    token, _ = _decode(str(path), threads, True, by=calls)
    whole, _ = _decode(str(path), threads, True, by=per_layer, tokens=False)
    parts, taken_parts = _decode(str(path), threads, True, layers=False)
    general, none = _decode(str(path), threads, False)
    assert calls == {"token_layers": 14}  # (one call a token: the other two were not called)
    assert per_layer == {"layer_token": 14 * 3}
    assert taken_parts == 14 * 3 and none == 0
    for a, b, c, d in zip(token, whole, parts, general):
        assert np.array_equal(a, b) and np.array_equal(a, c) and np.array_equal(a, d)

"""Decode's compiled expert FFN (`expert_token`) against the general path, bit for bit.

One token through `Runtime.moe` with the crew running takes one compiled call; the general path
(task tables composed in Python) must give the same floats: same kernel call per output row, same
activation, same f32 weighting and sum in slot order."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine, kernels
from workbench.engine.engine import Placement


def _moe_outputs(path: str, threads: int, fused: bool, activation: str) -> list[np.ndarray]:
    eng = Engine.load(path, placement=Placement(threads=threads))
    try:
        rt = eng.rt
        if not fused:
            rt._moe_token = lambda *a: None
        cfg = eng.cfg
        names = [n for n in rt.weights if n.endswith("_exps.weight")]
        fused_gu = any("gate_up" in n for n in names)
        rng = np.random.default_rng(3)
        outs = []
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            gate = None if fused_gu else p + "ffn_gate_exps.weight"
            up = p + ("ffn_gate_up_exps.weight" if fused_gu else "ffn_up_exps.weight")
            for _ in range(3):
                x = rng.standard_normal((1, cfg.n_embd)).astype(np.float32)
                ids = rng.choice(cfg.n_expert, size=(1, cfg.n_expert_used), replace=False).astype(np.int64)
                w = rng.random((1, cfg.n_expert_used)).astype(np.float32)
                with rt.step(1):
                    assert rt.crewing
                    outs.append(rt.moe(x, gate, up, p + "ffn_down_exps.weight", ids, w, activation))
        # the compiled path really ran (it falls back to the general one for types it cannot take)
        assert fused == any(entry[1] is not None for entry in rt._etoken.values())
        return outs
    finally:
        eng.close()


@pytest.mark.parametrize("qtype,fuse", [(T.Q8_0, False), (T.Q4_K, False), (T.Q8_0, True), (T.Q6_K, True)],
                         ids=["q8_0", "q4_k", "q8_0-fused", "q6_k-fused"])
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_token_path_equals_general_path(tmp_path, qtype, fuse, threads):
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=qtype, n_expert=8, n_expert_used=3, n_ff=256,
                                    n_ff_exp=256, fuse_gate_up=fuse, seed=5))
    for activation in ("silu", "gelu"):
        fast = _moe_outputs(str(path), threads, True, activation)
        slow = _moe_outputs(str(path), threads, False, activation)
        for a, b in zip(fast, slow):
            assert a.shape == b.shape and a.dtype == np.float32
            assert np.array_equal(a, b)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=["q4_k", "q6_k"])
def test_loading_compiles_the_experts_prompt_products(tmp_path, qtype):
    """A MoE model's load compiles the products of an expert's tokens (the type's mul_mat_id kernel
    and the runtime's loop over it) for the signatures a prompt uses: the prompt adds none (on a
    first start it stopped 5.6 s for them)."""
    from workbench.engine import kernels
    from workbench.engine.experts import _expert_loop
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=qtype, n_expert=8, n_expert_used=3, n_ff=256,
                                    n_ff_exp=256, seed=5))
    eng = Engine.load(str(path), placement=Placement(threads=1))
    try:
        loop, idk = _expert_loop(int(qtype)), kernels.mul_mat_id_kernel(int(qtype))
        before = (set(loop.signatures), set(idk.signatures))
        assert before[0] and before[1]
        s = eng.new_session(64)
        s.eval(list(range(3, 40)))  # a prompt: several tokens per routed expert
        assert (set(loop.signatures), set(idk.signatures)) == before
    finally:
        eng.close()


def _decoded_ffn(path: str, threads: int, routed: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every MoE layer's FFN output and the routing statistics' expert hits, for random normed
    inputs of one token, through `Runtime.routed_token` or through the model's router + `moe`."""
    eng = Engine.load(path, placement=Placement(threads=threads))
    try:
        model, rt = eng.model, eng.rt
        ran: list[bool] = []  # per call: did the compiled path take it (it returns None where it cannot)
        real = rt.routed_token

        def spy(*a, **k):
            out = real(*a, **k) if routed else None
            ran.append(out is not None)
            return out
        rt.routed_token = spy
        rng = np.random.default_rng(11)
        outs = []
        for il in eng.layers:
            if not model.is_moe_layer(il):
                continue
            for _ in range(3):
                h = (rng.standard_normal((1, eng.cfg.n_embd)) * 3).astype(np.float32)
                with rt.step(1):
                    assert rt.crewing
                    outs.append(model.ffn(il, h))
        hits = eng.routing().hits.copy()
        assert ran and all(ran) == routed  # every decoded token took the compiled call, or none did
        return outs + [hits]
    finally:
        eng.close()


@pytest.mark.parametrize("spec", [
    dict(arch="qwen3moe", qtype=T.Q4_K, n_expert=8, n_expert_used=3),
    dict(arch="qwen3moe", qtype=T.Q8_0, n_expert=8, n_expert_used=2, fuse_gate_up=True),
    dict(arch="deepseek2", qtype=T.Q8_0, n_expert=8, n_expert_used=3, gating=2, probs_bias=True, n_groups=4,
         n_group_used=2, n_expert_shared=1),
], ids=["qwen3moe-q4_k", "qwen3moe-fused", "deepseek2-sigmoid-groups"])
@pytest.mark.parametrize("threads", [1, 2])
def test_routed_token_equals_router_then_moe(tmp_path, spec, threads):
    """A decoded token's router, gating and experts in one compiled call give the same bits as the
    model's router (`linear`, the gating functions) followed by `moe`, and the same routing hits."""
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(n_ff=256, n_ff_exp=256, seed=7, **spec))
    fast = _decoded_ffn(str(path), threads, True)
    slow = _decoded_ffn(str(path), threads, False)
    assert len(fast) == len(slow) > 1
    for a, b in zip(fast, slow):
        assert a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("spec", [
    dict(arch="qwen3moe", qtype=T.Q4_K, n_expert=8, n_expert_used=3),
    dict(arch="deepseek2", qtype=T.Q8_0, n_expert=8, n_expert_used=3, gating=2, probs_bias=True, n_groups=4,
         n_group_used=2, n_expert_shared=1, q_lora_rank=64),
], ids=["qwen3moe-q4_k", "deepseek2-q-lora"])
def test_short_prompt_on_the_calling_thread_keeps_every_bit(tmp_path, monkeypatch, spec):
    """A short prompt's small products run on the calling thread, each worker's share in turn
    (`handoff.HANDOFF_SECONDS`: a thread hand-off costs more than they take): the same logits,
    to the bit, as with every product handed to the workers; and the workers got none. (Without
    the prompt's crew jobs, `test_prompt_jobs.py`'s, which take such prompts by default.)"""
    from workbench.engine import handoff, runtime
    monkeypatch.setattr(runtime, "PROMPT_CREW", False)
    from workbench.numa.workers import WorkerPool
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(n_ff=256, n_ff_exp=256, seed=3, **spec))
    eng = Engine.load(str(path), placement=Placement(threads=2))
    runs = []
    real_run = WorkerPool.run

    def counted(self, fn, lead=False):
        runs.append(fn)
        return real_run(self, fn, lead)
    monkeypatch.setattr(WorkerPool, "run", counted)
    calls = []   # (weight rows, r0, r1) of every quantized product the prompt runs
    real_matmat = kernels.matmat

    def matmat(t, w, xp, out, r0, r1):
        if t != kernels.F16:
            calls.append((w.shape[0], r0, r1))
        return real_matmat(t, w, xp, out, r0, r1)
    monkeypatch.setattr(kernels, "matmat", matmat)
    prompt = [3 + (i * 5) % 200 for i in range(12)]
    try:
        s = eng.new_session(64)
        runs.clear()   # (the cache's first touch, by each worker)
        inline = s.eval(prompt, logit_rows=slice(0, 12))
        assert not runs
        # on the calling thread each product is one call over all its rows, as one worker runs it
        assert calls and all(r0 == 0 and r1 == rows for rows, r0, r1 in calls)
        monkeypatch.setattr(handoff, "HANDOFF_SECONDS", 0.0)
        s = eng.new_session(64)
        runs.clear()
        handed = s.eval(prompt, logit_rows=slice(0, 12))
        assert len(runs) > 10
        np.testing.assert_array_equal(inline, handed)
    finally:
        eng.close()

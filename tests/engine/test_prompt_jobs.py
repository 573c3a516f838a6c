"""A short prompt's products as crew jobs (`engine.prompt_jobs`): the same bits as the Python path."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine, runtime
from workbench.engine.crew import Crew
from workbench.engine.engine import Placement

SPECS = [
    dict(arch="qwen3moe", qtype=T.Q4_K, n_expert=8, n_expert_used=3),
    dict(arch="qwen3moe", qtype=T.Q8_0, n_expert=8, n_expert_used=2, fuse_gate_up=True),
    dict(arch="deepseek2", qtype=T.Q8_0, n_expert=8, n_expert_used=3, gating=2, probs_bias=True, n_groups=4,
         n_group_used=2, n_expert_shared=1, q_lora_rank=64),
    dict(arch="llama", qtype=T.Q4_K),
    dict(arch="gemma3", qtype=T.Q8_0, types=(("blk.0.ffn_down.weight", T.F16),)),
]


def _eval(path, threads: int, prompt: list[int], more: list[int]) -> tuple[np.ndarray, np.ndarray]:
    eng = Engine.load(str(path), placement=Placement(threads=threads))
    try:
        s = eng.new_session(64)
        first = s.eval(prompt, logit_rows=slice(0, len(prompt)))
        second = s.eval(more, logit_rows=slice(0, len(more)))   # a second piece, at depth
        return first, second
    finally:
        eng.close()


@pytest.mark.parametrize("spec", SPECS, ids=["qwen3moe-q4_k", "qwen3moe-fused-q8_0", "deepseek2-q-lora",
                                             "llama-q4_k", "gemma3-f16-down"])
def test_short_prompt_crew_jobs_keep_every_bit(tmp_path, monkeypatch, spec):
    """A 12-token prompt (and a 5-token piece after it) at two workers: its product groups run as
    crew jobs, and every logit is the one the Python hand-offs give and the one one worker gives."""
    path = tmp_path / "m.gguf"
    write_tiny_model(path, TinySpec(n_ff=256, n_ff_exp=256, seed=5, **spec))
    prompt = [3 + (i * 7) % 200 for i in range(12)]
    more = [11, 12, 13, 14, 15]
    jobs = []
    real = Crew.run_with

    def counted(self, fn, job, xa, xb, outs):
        jobs.append(job)
        return real(self, fn, job, xa, xb, outs)
    monkeypatch.setattr(Crew, "run_with", counted)
    crew = _eval(path, 2, prompt, more)
    assert len(jobs) > 10
    monkeypatch.setattr(runtime, "PROMPT_CREW", False)
    jobs.clear()
    handed = _eval(path, 2, prompt, more)
    assert not jobs
    one = _eval(path, 1, prompt, more)
    for a, b, c in zip(crew, handed, one):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_long_prompts_and_single_tokens_do_not_take_prompt_jobs(tmp_path, monkeypatch):
    """The prompt jobs are for prompts shorter than TOKEN_SPLIT_MIN x workers (longer ones share out
    their tokens, one token is the decode path)."""
    path = tmp_path / "m.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=T.Q8_0, n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256))
    jobs = []
    real = Crew.run_with
    monkeypatch.setattr(Crew, "run_with", lambda self, *a: (jobs.append(a), real(self, *a))[1])
    eng = Engine.load(str(path), placement=Placement(threads=2))
    try:
        s = eng.new_session(256)
        s.eval([5 + i % 100 for i in range(runtime.TOKEN_SPLIT_MIN * 2)])
        s.eval([7])
        assert not jobs
        s.eval([9, 10, 11])
        assert jobs
    finally:
        eng.close()

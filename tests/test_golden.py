"""End-to-end agreement with llama.cpp on the default model (Gemma 3 270M Q4_K_M).

Golden data: tests/data/gemma3_golden.json, written by scripts/reference.py with
llama-cpp-python 0.3.36 (llama.cpp 0c1e570, CPU, flash attention off, f16 KV
cache, n_batch 512). Our engine follows ggml's CPU numerics (see ops.py,
attention.py and the kernels), so greedy continuations must be identical and the
logits close; scripts/dump_llama_tensors.py + scripts/compare_llama_tensors.py
find the first diverging tensor when they are not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "gemma3_golden.json").read_text())
CASES = GOLDEN["greedy"]

#: tokens compared per prompt (the golden file has 40)
N_TOKENS = 32

#: prompts whose llama.cpp continuation we do not reproduce yet, with the reason
#: (index -> reason); see the first-step logit tolerance below for the residual error
KNOWN_DIVERGENT: dict[int, str] = {}

#: max |our logit - llama.cpp's| over the first step's top-10 (logits are ~15-25).
#: Measured: see the report of the numerics work; the remaining difference comes from
#: K-quant products whose float accumulation order (llama.cpp's repacked Q4_K gemm and
#: tiled Q6_K matmul for >= 8 rows) we do not emulate bit for bit.
TOP10_TOL = 0.25

PPL_GOLDEN = GOLDEN["perplexity"]["ppl"]


@pytest.fixture(scope="module")
def engine():
    from workbench.engine import Engine
    return Engine.load()


def test_prompt_tokenization(engine):
    for case in CASES:
        assert engine.tokenizer.encode(case["prompt"], add_bos=True) == case["prompt_ids"], case["prompt"]


@pytest.fixture(scope="module")
def greedy_runs(engine):
    """Per prompt: (first-step logits, greedy tokens) with the KV cache, as llama.cpp ran them."""
    runs = []
    for case in CASES:
        s = engine.new_session(512)
        logits = s.eval(case["prompt_ids"])
        first = logits.copy()
        out = []
        for _ in range(min(N_TOKENS, len(case["generated_ids"]))):
            t = int(np.argmax(logits))
            out.append(t)
            if t in GOLDEN["meta"]["eog_ids"]:
                break
            logits = s.eval([t])
        runs.append((first, out))
    return runs


@pytest.mark.parametrize("i", range(len(CASES)))
def test_greedy_matches_llama_cpp(greedy_runs, i):
    if i in KNOWN_DIVERGENT:
        pytest.skip(KNOWN_DIVERGENT[i])
    _, ours = greedy_runs[i]
    ref = CASES[i]["generated_ids"][:len(ours)]
    assert ours == ref, f"prompt {i} {CASES[i]['prompt']!r}: first difference at step " \
        f"{next(k for k, (a, b) in enumerate(zip(ours, ref)) if a != b)}"


@pytest.mark.parametrize("i", range(len(CASES)))
def test_first_step_top10_logits(greedy_runs, i):
    first, _ = greedy_runs[i]
    top = CASES[i]["first_step"]["top10"]
    ids = [t for t, _ in top]
    ref = np.array([v for _, v in top], dtype=np.float32)
    assert int(np.argmax(first)) == ids[0]
    np.testing.assert_allclose(first[ids], ref, rtol=0, atol=TOP10_TOL)


def test_perplexity(engine):
    from workbench.engine.perplexity import perplexity
    text = (DATA / "ppl_text.txt").read_text(encoding="utf-8")
    res = perplexity(engine, text, 512)
    assert res.chunks == GOLDEN["perplexity"]["n_chunks"]
    assert res.scored_tokens == GOLDEN["perplexity"]["n_scored"]
    assert abs(res.ppl - PPL_GOLDEN) / PPL_GOLDEN < 0.01, (res.ppl, PPL_GOLDEN)

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

#: Greedy continuations are checked teacher-forced: at every one of the first N_TOKENS steps
#: (llama.cpp's own tokens fed back, as it ran them) llama.cpp's token must be our top-1, or
#: within TIE_TOL of our top logit (a near-tie), and at least MIN_EXACT of all steps must be
#: exact top-1s.  Why not free-running equality: llama.cpp's K-quant products (Q4_K weights
#: repacked to q4_K_8x8 and run by its gemm/gemv, Q6_K by the "tiled" matmul for >= 8 rows and
#: vec_dot_q6_K_q8_K for one) sum their per-superblock results in other float orders than our
#: kernels; the ~1e-7 relative differences flip a few activation quantizations downstream and
#: end as logit differences of up to ~0.7, so free-running continuations part at near-ties
#: (measured top-1/llama-token gaps at the partings: 0.002-0.33) and which prompts part where
#: changes with any rounding change in the kernels.  Every other tensor of the forward pass
#: (norms, RoPE, GELU, attention, legacy-quant products) is bit-exact with llama.cpp; see
#: scripts/compare_llama_tensors.py.
TIE_TOL = 0.5
MIN_EXACT = 0.9

#: max |our logit - llama.cpp's| over the first step's top-10 (logits are ~15-25).
#: Measured over the 10 prompts: at most 0.70 (same cause as above); 1.0 leaves headroom
#: while still catching any real bug (those move logits by whole units).
TOP10_TOL = 1.0

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
    """Per prompt: (first-step logits, [(our top-1, top logit - logit of llama.cpp's token)])."""
    runs = []
    for case in CASES:
        s = engine.new_session(512)
        logits = s.eval(case["prompt_ids"])
        first = logits.copy()
        steps = []
        for t in case["generated_ids"][:N_TOKENS]:
            steps.append((int(np.argmax(logits)), float(logits.max() - logits[t])))
            if t in GOLDEN["meta"]["eog_ids"]:
                break
            logits = s.eval([t])
        runs.append((first, steps))
    return runs


@pytest.mark.parametrize("i", range(len(CASES)))
def test_greedy_matches_llama_cpp(greedy_runs, i):
    _, steps = greedy_runs[i]
    gaps = [(k, gap) for k, (_, gap) in enumerate(steps) if gap > 0]
    assert all(gap <= TIE_TOL for _, gap in gaps), \
        f"prompt {i} {CASES[i]['prompt']!r}: llama.cpp's token is not (near) our top-1 at {gaps}"


def test_greedy_mostly_exact(greedy_runs):
    steps = [st for _, run in greedy_runs for st in run]
    exact = sum(gap <= 0 for _, gap in steps)
    assert exact >= MIN_EXACT * len(steps), (exact, len(steps))


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

"""Agreement with llama.cpp on SmolLM2-135M-Instruct Q4_1 (the model `numawb pull` fetches).

Golden data: tests/data/smollm2_golden.json, written by scripts/reference_server.py with
llama-server (-t 2, flash attention off, f16 KV cache): /tokenize's ids of varied strings and
/completion's greedy tokens of four prompts (two ChatML chats, two plain texts).

* Tokenization runs on every CI run: the tokenizer comes from tests/data/smollm2_vocab.gguf, the
  model's tokenizer metadata without tensors (1.8 MB, written by the same script).
* Greedy tokens need the 98 MB model: the test runs when it was pulled into
  $XDG_DATA_HOME/numawb/models (or NUMAWB_SMOLLM2 names the file) and skips otherwise; tests
  never download.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from workbench import models_store
from workbench.engine.gguf_file import read_metadata
from workbench.engine.kernels.llama_build import WIDE
from workbench.engine.tokenizer import StreamDecoder, Tokenizer

DATA = Path(__file__).parents[1] / "data"
GOLDEN = json.loads((DATA / "smollm2_golden.json").read_text(encoding="utf-8"))
VOCAB = DATA / "smollm2_vocab.gguf"

#: the pulled model, looked up when this module is imported: tests/conftest.py points
#: $XDG_DATA_HOME at an empty folder while tests run, so the app under test never sees it
_PULLED = os.environ.get("NUMAWB_SMOLLM2") or models_store.find_pulled()
MODEL = str(_PULLED) if _PULLED and os.path.isfile(_PULLED) else None

#: a step where llama.cpp's own top-2 logit gap is below this is one where another float order may
#: legitimately pick the other token: the comparison stops there (none of the golden steps is one:
#: their smallest gap is 0.018)
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_metadata(read_metadata(VOCAB))


def test_vocab_file_is_the_one_the_golden_ids_came_with():
    meta = GOLDEN["meta"]
    assert hashlib.sha256(VOCAB.read_bytes()).hexdigest() == meta["vocab_sha256"]
    assert VOCAB.stat().st_size < 3_000_000


@pytest.mark.parametrize("special", [False, True], ids=["text", "parse_special"])
def test_tokenize_matches_llama_server(tokenizer, special):
    key = "ids_special" if special else "ids"
    bad = [(c["text"], tokenizer.encode(c["text"], parse_special=special), c[key])
           for c in GOLDEN["tokenize"]
           if tokenizer.encode(c["text"], parse_special=special) != c[key]]
    assert not bad, f"{len(bad)} of {len(GOLDEN['tokenize'])} strings differ from llama.cpp: {bad[:3]}"


def test_prompt_ids_and_decoding(tokenizer):
    for case in GOLDEN["greedy"]:
        assert tokenizer.encode(case["prompt"], parse_special=case["parse_special"]) == case["prompt_ids"]
        assert tokenizer.decode(case["generated_ids"]) == case["generated_text"]
        dec = StreamDecoder(tokenizer)
        assert "".join(dec.feed(t) for t in case["generated_ids"]) + dec.flush() == case["generated_text"]


def test_vocab_file_holds_the_models_tokenizer():
    """The vocab-only file carries the pulled model's tokenizer metadata unchanged."""
    if MODEL is None:
        pytest.skip("SmolLM2-135M-Instruct not pulled (`numawb pull`)")
    full, vocab = read_metadata(MODEL), read_metadata(VOCAB)
    keys = sorted(k for k in full if k.startswith("tokenizer."))
    assert keys == sorted(k for k in vocab if k.startswith("tokenizer."))
    for k in keys:
        a, b = full[k], vocab[k]
        assert (np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b), k


@pytest.mark.skipif(MODEL is None, reason="SmolLM2-135M-Instruct not pulled (`numawb pull`); tests never download")
@pytest.mark.skipif(not WIDE, reason="golden tokens from llama.cpp's AVX-512 build (its AVX2 build rounds "
                                     "attention differently: kernels/llama_build.py)")
def test_greedy_matches_llama_server():
    from workbench.engine import Engine, kernels
    from workbench.engine.engine import Placement
    if kernels.kernel_path() == "portable":
        pytest.skip("portable kernels: products are not in llama.cpp's float order")
    if hashlib.sha256(Path(MODEL).read_bytes()).hexdigest() != GOLDEN["meta"]["model_sha256"]:
        pytest.skip(f"{MODEL} is not the file the golden data came from")
    eng = Engine.load(MODEL, placement=Placement(threads=GOLDEN["meta"]["n_threads"]))
    try:
        eog = eng.tokenizer.eot_ids
        results = []
        for case in GOLDEN["greedy"]:
            s = eng.new_session(GOLDEN["meta"]["n_ctx"])
            logits = s.eval(case["prompt_ids"])
            ref = case["generated_ids"]
            margins = case["generated_margins"]
            n = next((k for k, m in enumerate(margins) if m is not None and m < NEAR_TIE), len(ref))
            gen: list[int] = []
            for _ in range(n):
                t = int(np.argmax(logits[-1] if logits.ndim > 1 else logits))
                gen.append(t)
                if t in eog:
                    break
                logits = s.eval([t])
            results.append((case["prompt"], gen, ref[:n]))
    finally:
        eng.close()
    bad = [(p[-40:], next(k for k, (a, b) in enumerate(zip(g, r)) if a != b) if g[:len(r)] != r[:len(g)] else len(g))
           for p, g, r in results if g != r]
    assert not bad, f"greedy tokens part from llama.cpp's (prompt tail, first differing token): {bad}"

"""Agreement with llama.cpp on tiny MoE and MLA models (qwen3moe, Mixtral-style llama, deepseek2).

Golden data: tests/data/moe_golden.json, written by scripts/reference_moe.py with
llama-cpp-python (flash attention off, f16 KV cache): the tiny files are rebuilt here from the
stored specs with the test factory and must be byte-identical to the ones llama.cpp ran.
Greedy continuations must be identical up to the first step where llama.cpp's own top-2 logit
gap is below NEAR_TIE (there another implementation may legitimately pick the other token), and
the first step's top-10 logits identical bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf_factory import write_tiny_model
from workbench.engine import Engine, kernels
from workbench.engine.engine import Placement

from workbench.engine.kernels.llama_build import WIDE

#: llama.cpp's AVX-512 build's output, or its AVX2 build's on a host without AVX-512 (see test_golden.py)
DATA = Path(__file__).parents[1] / "data" / ("moe_golden.json" if WIDE else "moe_golden_avx2.json")
GOLDEN = json.loads(DATA.read_text()) if DATA.exists() else {"models": {}}
sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
#: measured on this machine (AVX-512 VNNI kernels): the first step's top-10 logits are bit-identical to
#: llama.cpp's for every file -- Q8_0 (MoE, MLA, q-LoRA, fused gate/up, sigmoid+bias+groups, YaRN) and
#: the Q4_K/Q5_K/Q6_K ones, whose expert products take the tiled matmul from 8 routed tokens (Q5_K,
#: Q6_K), the repacked gemv per token (Q4_K) and whose F32 router takes tinyBLAS / vec_dot_f32; every
#: greedy token of every file is identical at 1 and 2 threads, through llama.cpp top-2 gaps as small as
#: 1.3e-4.  NEAR_TIE only stops at a gap that is rounding noise
NEAR_TIE = 1e-5


def _spec(fields: dict):
    from reference_moe import spec_of
    return spec_of(fields)


@pytest.fixture(scope="module", params=sorted(GOLDEN["models"]) or [None])
def model(request, tmp_path_factory):
    name = request.param
    if name is None:
        pytest.skip("no golden data (run scripts/reference_moe.py)")
    g = GOLDEN["models"][name]
    path = tmp_path_factory.mktemp("golden") / f"{name}.gguf"
    write_tiny_model(path, _spec(g["spec"]))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == g["sha256"], \
        f"{name}: the factory no longer writes the file llama.cpp ran (rerun scripts/reference_moe.py)"
    return name, str(path), g["cases"]


@pytest.mark.skipif(kernels.kernel_path() == "portable",
                    reason="portable kernels: products are not in llama.cpp's float order, and a "
                           "router's top-k turns their last-bit differences into other experts")
@pytest.mark.parametrize("threads", [1, 2])
def test_greedy_tokens_and_first_logits_match_llama_cpp(model, threads):
    name, path, cases = model
    eng = Engine.load(path, placement=Placement(threads=threads))
    try:
        for case in cases:
            s = eng.new_session(256)
            logits = s.eval(case["prompt_ids"])
            top = np.array([lg for _, lg in case["first_top10"]])
            ids = [i for i, _ in case["first_top10"]]
            diff = float(np.max(np.abs(logits[ids] - top)))
            # every product in llama.cpp's float order: the first step's logits bit for bit
            assert np.array_equal(logits[ids], top.astype(np.float32)), \
                f"{name}: first-step top-10 logits differ from llama.cpp's by up to {diff:.3g}"
            for step, (want, margin) in enumerate(zip(case["generated_ids"], case["generated_margins"])):
                got = int(np.argmax(logits))
                if margin < NEAR_TIE:
                    break
                assert got == want, f"{name}: step {step} of {case['prompt_ids']}: {got} != llama.cpp's {want}"
                logits = s.eval([got])
    finally:
        eng.close()

#!/usr/bin/env python3
"""Write llama.cpp golden data for tiny mixture-of-experts and MLA models.

The reference side of tests/test_golden_moe.py: the tiny GGUF files are written
deterministically by the test factory (tests/gguf_factory.py, fixed seeds), run through
llama.cpp (llama-cpp-python, as scripts/reference.py does) with greedy decoding, and
llama.cpp's tokens and first-step top logits are stored in ``tests/data/moe_golden.json``
together with each file's spec and sha256 (the test rebuilds the same bytes and checks them).

Models: qwen3moe (Q8_0 and Q4_K, 8 experts; Q8_0 with 32), a Mixtral-style llama file
(Q8_0), deepseek2 with a plain attn_q, with q-LoRA, with fused gate/up experts, with 32 experts in 4 softmax groups, and
V3-style (sigmoid gating, selection bias, expert groups, normalised and scaled weights, YaRN).

Rerun (llama-cpp-python lives in its own venv, see scripts/reference.py)::

    /opt/refvenv/bin/python scripts/reference_moe.py

Greedy = argmax of the raw logits at every step (ties -> lowest id), no sampler; the
prompts are token ids (no tokenizer involved); flash attention off, f16 KV cache
(the bindings' defaults), n_threads 2, n_batch 512.

llama.cpp's native build rounds attention's sums and exps differently with and without AVX-512
(workbench/engine/kernels/llama_build.py), so there is a file per build: ``moe_golden.json`` written on an
AVX-512 host, ``moe_golden_avx2.json`` on an AVX2-only one (``--out tests/data/moe_golden_avx2.json``); the golden tests read the
one of the host's build.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from gguf_factory import TinySpec, write_tiny_model  # noqa: E402

OUT_JSON = REPO / "tests" / "data" / "moe_golden.json"
N_THREADS = 2
N_GEN = 24
N_CTX = 256

_MOE = dict(tied=False, n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256)
_DS = dict(tied=False, arch="deepseek2", n_layer=3, n_head=4, head_dim=64, n_ff=256, n_ff_exp=64, n_expert=8, n_expert_used=2)
MODELS: dict[str, dict] = {
    "qwen3moe-q8_0": dict(arch="qwen3moe", qtype=8, seed=11, **_MOE),
    "qwen3moe-q4_k": dict(arch="qwen3moe", qtype=12, seed=12, **_MOE),
    "mixtral-q8_0": dict(arch="llama", qtype=8, seed=13, **_MOE),
    # K-quants that x86 llama.cpp does not repack: an expert with >= 8 of a batch's tokens takes
    # ggml's tiled mul_mat_id (ggml-cpu/tiled), fewer take vec_dot
    "qwen3moe-q6_k": dict(arch="qwen3moe", qtype=14, seed=20, **_MOE),
    "qwen3moe-q5_k": dict(arch="qwen3moe", qtype=13, seed=21, **_MOE),
    "deepseek2-q8_0": dict(qtype=8, seed=14, **_DS),
    "deepseek2-qlora-q8_0": dict(qtype=8, seed=15, q_lora_rank=64, weights_norm=True, **_DS),
    # 32 experts: the router's softmax takes ggml's 16-lane exp blocks (8 experts are all leftovers)
    "qwen3moe-e32-q8_0": dict(arch="qwen3moe", qtype=8, seed=17, tied=False, n_expert=32, n_expert_used=4,
                              n_ff=256, n_ff_exp=64),
    "deepseek2-e32-groups-q8_0": dict(qtype=8, seed=18, q_lora_rank=64, n_groups=4, n_group_used=2, weights_norm=True,
                                      **{**_DS, "n_expert": 32, "n_expert_used": 4}),
    # converted with --fuse-gate-up-exps: one ffn_gate_up_exps tensor per MoE layer
    "deepseek2-fused-q8_0": dict(qtype=8, seed=19, q_lora_rank=64, fuse_gate_up=True, **_DS),
    "deepseek2-v3-q8_0": dict(qtype=8, seed=16, q_lora_rank=64, gating=2, probs_bias=True, n_groups=4, n_group_used=2,
                              weights_norm=True, weights_scale=2.5, yarn=(4.0, 64, 0.707), **_DS),
}
PROMPTS = [
    [2, 270, 262, 280, 265],
    [2, 270, 262, 280, 265, 285, 271, 268, 288, 262, 275, 281],
    [2, 267, 263, 272, 279, 262, 264, 283, 270, 266, 261, 287, 277, 263, 269, 284, 262, 276, 273, 282],
    # 48 tokens: at 2 of 8 experts, experts get 8 or more of the batch's tokens
    [2] + [260 + (7 * i) % 30 for i in range(47)],
]


def spec_of(fields: dict) -> TinySpec:
    """A TinySpec from the JSON-able fields stored with the golden data."""
    from gguf import GGMLQuantizationType as T
    f = dict(fields)
    f["qtype"] = T(int(f["qtype"]))
    if f.get("yarn") is not None:
        f["yarn"] = tuple(f["yarn"])
    return TinySpec(**f)


def spec_fields(spec: TinySpec) -> dict:
    d = dataclasses.asdict(spec)
    d["qtype"] = int(spec.qtype)
    return d


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_model(path: str) -> list[dict]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=512, n_ubatch=512, logits_all=False,
                          seed=1234, n_threads=N_THREADS, n_threads_batch=N_THREADS, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llm.n_vocab()
    eog = {t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}

    def logits() -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy()

    out = []
    for ids in PROMPTS:
        llm.reset()
        llm.eval(ids)
        lg = logits()
        order = np.argsort(-lg, kind="stable")[:10]
        first = [[int(i), float(lg[i])] for i in order]
        gen: list[int] = []
        margins: list[float] = []
        for step in range(N_GEN):
            if step:
                llm.eval([gen[-1]])
                lg = logits()
            nxt = int(np.argmax(lg))
            top2 = np.partition(lg, -2)[-2:]
            gen.append(nxt)
            margins.append(float(top2[1] - top2[0]))
            if nxt in eog:
                break
        out.append({"prompt_ids": ids, "generated_ids": gen, "generated_margins": margins, "first_top10": first})
    del llm
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT_JSON))
    ap.add_argument("--only", nargs="*", help="model names (default: all)")
    args = ap.parse_args()
    import gguf
    import llama_cpp

    t0 = time.time()
    result: dict = {"meta": {
        "generator": "scripts/reference_moe.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "gguf_py_version": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "n_threads": N_THREADS, "n_ctx": N_CTX, "n_batch": 512, "flash_attn": False, "kv_type": "f16",
        "greedy_note": "argmax over raw logits each step (ties -> lowest id); stops early only at an EOG id",
    }, "models": {}}
    with tempfile.TemporaryDirectory() as d:
        for name, fields in MODELS.items():
            if args.only and name not in args.only:
                continue
            spec = spec_of({**spec_fields(TinySpec()), **fields})
            path = os.path.join(d, f"{name}.gguf")
            write_tiny_model(path, spec)
            try:
                cases = run_model(path)
            except Exception as e:  # llama.cpp refused the file: say which, keep going
                print(f"{name}: llama.cpp failed: {e}", file=sys.stderr)
                continue
            result["models"][name] = {"spec": spec_fields(spec), "sha256": sha256_file(path), "cases": cases}
            print(f"{name}: {[c['generated_ids'][:8] for c in cases]}", file=sys.stderr)
    result["meta"]["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(result['models'])} models) in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())

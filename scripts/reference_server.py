#!/usr/bin/env python3
"""Write llama.cpp golden data for SmolLM2-135M-Instruct (the model `numawb pull` fetches) with
llama-server, and the vocab-only GGUF the tokenizer test reads on every CI run.

This is the reference side of numawb's exactness tests for the instruct model, like
scripts/reference.py for the default model, but it needs no llama-cpp-python: it starts the
``llama-server`` binary that ``benchmarks/llamacpp_build.sh`` builds (loopback, a free port,
``-t 2``, flash attention off, f16 KV cache, one slot) on the given GGUF and asks it

* ``POST /tokenize`` for each string of ``TOKENIZE_STRINGS`` with ``add_special`` true (what
  ``llama_tokenize(add_special=true)`` does: BOS only when the file says ``add_bos_token``;
  SmolLM2 says no) and ``parse_special`` false (``ids``) and true (``ids_special``);
* ``POST /completion`` for each prompt of ``GREEDY_PROMPTS``, given as token ids (the ids
  /tokenize returned, ChatML markers parsed for the chat prompts): ``N_GEN`` greedy tokens
  (``top_k`` 1, samplers ``["top_k"]`` only, no prompt cache, tokens returned as ids; generation
  stops at an end-of-generation token as llama.cpp's does), with the two best log-probabilities
  of the raw logits at every step (``n_probs`` 2): their difference is the top1-top2 logit gap,
  so a near-tie where another implementation may legitimately part is visible in the file.

Output:

* ``tests/data/smollm2_golden.json``: ``meta`` (the model file's name and sha256, the server's
  command line and build, the vocab file's sha256), ``tokenize`` and ``greedy``.
* ``tests/data/smollm2_vocab.gguf``: the model's ``tokenizer.*`` and ``general.*`` metadata and
  no tensors (about 2 MB, gguf.GGUFWriter), so tests/engine/test_smollm2_golden.py checks
  numawb's tokenizer against the golden ids without the 98 MB model.

How to rerun::

    numawb pull                                     # once: the model, into $XDG_DATA_HOME/numawb/models
    python3 scripts/reference_server.py             # that file, the llama-server of llamacpp_build.sh
    python3 scripts/reference_server.py -m FILE.gguf --llama-server PATH/llama-server

Greedy decoding is deterministic for a given build and thread count; the golden tokens were the
same on numawb's side at 1 and 2 threads when written (the test uses 2).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_JSON = REPO / "tests" / "data" / "smollm2_golden.json"
OUT_VOCAB = REPO / "tests" / "data" / "smollm2_vocab.gguf"
LLAMA_SERVER = os.path.expanduser("~/.cache/numawb/llama.cpp-0.3.36/build/bin/llama-server")

N_THREADS = 2
N_GEN = 32
N_CTX = 2048

# ASCII, contractions, digits (SmolLM2's pre-tokenizer splits every digit), accents, other
# scripts, emoji, code and indentation, whitespace and newline runs, ChatML markers (CONTROL
# tokens: text without parse_special, ids with it), other special tokens of the vocabulary.
TOKENIZE_STRINGS: list[str] = [
    "",
    " ",
    "Hello world",
    " Hello, world!",
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
    "spaces:  two   three    four        eight",
    "   leading and trailing   ",
    "\t\n \r\n",
    "\n" * 7,
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user<|im_end|><|endoftext|>",
    "a<|im_end|>b <|im_start|> c",
    "<repo_name>numawb<file_sep>README.md<filename>x.py<gh_stars>",
    "URL https://example.com/path?q=1&r=2#frag and email a.b@c.org",
    "Mixed\u00a0nbsp\u2003em\u3000ideographic space, zero\u200bwidth",
    "math: ∑ ∫ √ ∞ ≤ ≥ ≠ ± × ÷ α β γ π",
    "Repeated!!!!!??? ... ---- ____ ====",
    (
        "In the beginning of the nineteenth century, the small town of Middlemarch was a place "
        "where the ordinary business of life went on at a comfortable pace. Its inhabitants rose "
        "early, worked steadily, and gathered in the evenings to talk of the weather."
    ),
]

_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def _chat(question: str) -> str:
    """The prompt SmolLM2's chat template makes of one user message (add_generation_prompt)."""
    return f"{_SYSTEM}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


# (prompt text, parse special tokens): two chats in the model's own template, two plain texts
GREEDY_PROMPTS: list[tuple[str, bool]] = [
    (_chat("What is the capital of France?"), True),
    (_chat("Explain in a few sentences why the sky is blue."), True),
    ("The three primary colors are", False),
    ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
]


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# llama-server
# ---------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """llama-server on a loopback port for the duration of a ``with`` block."""

    def __init__(self, binary: str, model: str, threads: int) -> None:
        self.port = _free_port()
        self.argv = [binary, "-m", model, "-t", str(threads), "-tb", str(threads), "-c", str(N_CTX),
                     "-np", "1", "-b", "512", "-ub", "512", "-fa", "off", "--no-webui",
                     "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"llama-server did not start (log: {self.log.name})")
            time.sleep(0.3)

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __exit__(self, exc_type, *exc) -> None:
        self._stop()
        if exc_type is None:
            os.unlink(self.log.name)  # kept when something went wrong

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"llama-server {path}: HTTP {resp.status}: {data[:300]!r}")
        return json.loads(data)

    def tokenize(self, text: str, parse_special: bool) -> list[int]:
        r = self.request("POST", "/tokenize", {"content": text, "add_special": True, "parse_special": parse_special})
        return [int(t) for t in r["tokens"]]

    def greedy(self, ids: list[int], n: int) -> dict:
        return self.request("POST", "/completion", {
            "prompt": ids, "n_predict": n, "top_k": 1, "samplers": ["top_k"], "cache_prompt": False,
            "return_tokens": True, "n_probs": 2, "post_sampling_probs": False, "seed": 0})


def tokenize_cases(srv: Server) -> list[dict]:
    return [{"text": s, "ids": srv.tokenize(s, False), "ids_special": srv.tokenize(s, True)}
            for s in TOKENIZE_STRINGS]


def greedy_cases(srv: Server, n: int) -> list[dict]:
    out = []
    for text, special in GREEDY_PROMPTS:
        ids = srv.tokenize(text, special)
        r = srv.greedy(ids, n)
        gen = [int(t) for t in r["tokens"]]
        margins = []
        for step in r.get("completion_probabilities", []):
            top = [p["logprob"] for p in step.get("top_logprobs", [])]
            margins.append(round(top[0] - top[1], 6) if len(top) >= 2 else None)
        out.append({
            "prompt": text,
            "parse_special": special,
            "prompt_ids": ids,
            "generated_ids": gen,
            "generated_text": r.get("content", ""),
            "generated_margins": margins,
            "stop_type": r.get("stop_type"),
        })
        print(f"  greedy: {text[-40:]!r} -> {r.get('content', '')[:60]!r}", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------
# the vocab-only GGUF
# ---------------------------------------------------------------------------------------------

#: general.* keys that describe tensors, not kept in a file without any
_DROP = {"general.architecture", "general.file_type", "general.quantization_version", "general.type"}


def write_vocab_gguf(model: str, out: str | Path) -> None:
    """``out``: every ``tokenizer.*`` and descriptive ``general.*`` key of ``model``, no tensors."""
    import gguf

    reader = gguf.GGUFReader(model)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type("vocab")
    writer.add_description(f"tokenizer of {os.path.basename(model)} (sha256 {sha256_file(model)}), "
                           "no tensors: written by numawb's scripts/reference_server.py")
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in _DROP or not name.startswith(("tokenizer.", "general.")):
            continue
        if name == "general.description":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _host_avx512f() -> bool:
    """Whether llama.cpp's native build here is its AVX-512 one (attention's sums and exps round
    differently from the AVX2 build's: workbench/engine/kernels/llama_build.py)."""
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None,
                    help="GGUF path (default: the pulled SmolLM2-135M-Instruct, see `numawb pull`)")
    ap.add_argument("--llama-server", default=LLAMA_SERVER)
    ap.add_argument("-t", "--threads", type=int, default=N_THREADS)
    ap.add_argument("-n", type=int, default=N_GEN, help="greedy tokens per prompt")
    ap.add_argument("--out", default=str(OUT_JSON))
    ap.add_argument("--vocab-out", default=str(OUT_VOCAB))
    args = ap.parse_args()

    model = args.model
    if model is None:
        sys.path.insert(0, str(REPO))
        from workbench import models_store
        found = models_store.find_pulled()
        if found is None:
            print(f"no pulled model in {models_store.models_dir()}: run `numawb pull` or give -m", file=sys.stderr)
            return 1
        model = str(found)

    t0 = time.time()
    write_vocab_gguf(model, args.vocab_out)
    vocab_size = os.path.getsize(args.vocab_out)
    print(f"wrote {args.vocab_out} ({vocab_size / 1e6:.2f} MB)", file=sys.stderr)

    with Server(args.llama_server, model, args.threads) as srv:
        props = srv.request("GET", "/props")
        print("tokenizing ...", file=sys.stderr)
        tok = tokenize_cases(srv)
        print("greedy ...", file=sys.stderr)
        greedy = greedy_cases(srv, args.n)
        argv = [os.path.basename(a) if i in (0, 2) else a for i, a in enumerate(srv.argv)]
        argv[-1] = "PORT"

    build_info = Path(args.llama_server).resolve().parent.parent / "build-info.txt"
    result = {
        "meta": {
            "generator": "scripts/reference_server.py",
            "llama_server_argv": argv,
            "llama_server_build": props.get("build_info"),
            "llama_server_build_info": build_info.read_text().strip().splitlines() if build_info.is_file() else None,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "host_avx512f": _host_avx512f(),
            "model_file": os.path.basename(model),
            "model_sha256": sha256_file(model),
            "vocab_file": os.path.basename(args.vocab_out),
            "vocab_sha256": sha256_file(args.vocab_out),
            "vocab_bytes": vocab_size,
            "n_threads": args.threads,
            "n_ctx": N_CTX,
            "flash_attn": False,
            "kv_cache": "f16 (llama-server default)",
            "tokenize_note": "/tokenize with add_special=true; ids: parse_special=false, ids_special: parse_special=true",
            "greedy_note": ("/completion on token ids: top_k 1, samplers [top_k], cache_prompt false; stops at an "
                            "end-of-generation token; generated_margins: top1 - top2 raw logit per step"),
        },
        "tokenize": tok,
        "greedy": greedy,
    }
    result["meta"]["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out} in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

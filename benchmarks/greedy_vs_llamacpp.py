"""Greedy tokens of numawb and of llama.cpp on one file, side by side (an exactness check for files
too large for the golden tests: the seeds' shapes from `make_moe_model.py --shape r1 / v3-attn`).

    python3 benchmarks/greedy_vs_llamacpp.py -m MODEL [-t 1,2] [-n 32] [--prompts 3] [--prompt-len 16,3000]
                                             [--llama-server PATH]

llama.cpp's side is llama-server (built by `llamacpp_build.sh`) on a loopback port with the same
thread count, flash attention off and no context checkpoints, asked for `-n` tokens of each prompt
given as token ids (greedy: top-k 1, no other sampler; no prompt cache), its tokens returned as ids.
numawb follows llama.cpp's non-flash attention (as the golden tests' references run); the server's
default `-fa auto` turns flash attention on for the CPU, whose f16 sums of the weighted values moved a
tiny DeepSeek file's logits by 0.3-0.6 and its greedy tokens with them (issue 46). With checkpoints
on (its default, `--ctx-checkpoints 32`) the server evaluates an SWA model's prompt (Gemma 3) in two
batches, the last 4 tokens apart, so each product of the prompt runs at other column counts (other
kernels: the tiled matmul from 8 columns, vec_dot below) than numawb's one batch and the logits
differ in the last bits (the default model at Q5_K_M: already the first token of one prompt in 64,
Intel Xeon, 1 thread). `--ctx-checkpoints 0` evaluates the prompt as one batch, as `Session.eval`
does; numawb given the server's two batches gives its bits (that prompt: every tensor and the logits,
scripts/llama_dump.cpp with DECODE_BATCH=4 and scripts/compare_llama_tensors.py --decode-batch 4). numawb's side is the engine in this process
(greedy: the argmax of the logits). Prompts are token ids drawn with a fixed seed from the
vocabulary's ordinary tokens, of each length in `--prompt-len` (several thousand tokens check the
attention at depth). Prints, per thread count and prompt, whether the tokens agree and where they
first differ; exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict, timeout: float = 3600) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"llama-server {path}: HTTP {resp.status}: {data[:200]!r}")
    return json.loads(data)


def llama_tokens(server: str, model: str, threads: int, prompts: list[list[int]], n: int, n_ctx: int) -> list[list[int]]:
    """llama-server's greedy continuation of each prompt (token ids in, token ids out)."""
    port = _free_port()
    log = open(f"/tmp/greedy_llama_{port}.log", "w")
    proc = subprocess.Popen([server, "-m", model, "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx),
                             "-np", "1", "--port", str(port), "--host", "127.0.0.1", "-b", "512", "-ub", "512",
                             "-fa", "off", "--ctx-checkpoints", "0"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start (log: {log.name})")
            time.sleep(0.5)
        out = []
        for ids in prompts:
            r = _post(port, "/completion", {"prompt": ids, "n_predict": n, "top_k": 1, "samplers": ["top_k"],
                                            "cache_prompt": False, "return_tokens": True, "ignore_eos": True})
            out.append([int(t) for t in r["tokens"]])
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def numawb_tokens(model: str, threads: int, prompts: list[list[int]], n: int, n_ctx: int) -> list[list[int]]:
    """numawb's greedy continuation of each prompt: argmax of the logits, one token at a time."""
    from workbench.engine import Engine
    from workbench.engine.engine import Placement
    eng = Engine.load(model, placement=Placement(threads=threads))
    try:
        out = []
        for ids in prompts:
            s = eng.new_session(n_ctx)
            logits = s.eval(ids)
            toks = []
            for _ in range(n):
                t = int(np.argmax(logits[-1] if logits.ndim > 1 else logits))
                toks.append(t)
                logits = s.eval([t])
            out.append(toks)
        return out
    finally:
        eng.close()


def _prompts(model: str, count: int, lengths: list[int]) -> list[list[int]]:
    from workbench.engine.gguf_file import read_gguf
    md = read_gguf(model).metadata
    types = np.asarray(md.get("tokenizer.ggml.token_type", []))
    normal = np.flatnonzero(types == 1) if types.size else np.arange(4, 100)
    bos = md.get("tokenizer.ggml.bos_token_id")
    rng = np.random.default_rng(7)
    out = []
    for length in lengths:
        for _ in range(count):
            body = [int(t) for t in rng.choice(normal, length - (bos is not None))]
            out.append(([int(bos)] if bos is not None else []) + body)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-n", type=int, default=32, help="tokens generated per prompt")
    ap.add_argument("--prompts", type=int, default=3, help="prompts of each length")
    ap.add_argument("--prompt-len", default="16", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--llama-server", default=os.path.expanduser("~/.cache/numawb/llama.cpp-0.3.36/build/bin/llama-server"))
    args = ap.parse_args()
    lengths = [int(x) for x in args.prompt_len.split(",")]
    prompts = _prompts(args.model, args.prompts, lengths)
    n_ctx = max(lengths) + args.n + 64
    bad = 0
    for t in (int(x) for x in args.threads.split(",")):
        ref = llama_tokens(args.llama_server, args.model, t, prompts, args.n, n_ctx)
        got = numawb_tokens(args.model, t, prompts, args.n, n_ctx)
        for i, (a, b) in enumerate(zip(ref, got)):
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
            what = "same" if first is None else f"DIFFER at token {first}: llama.cpp {a[first]}, numawb {b[first]}"
            bad += first is not None
            print(f"-t {t} prompt {i} ({len(prompts[i])} tokens): {args.n} tokens {what}", flush=True)
    print(f"{os.path.basename(args.model)}: {'all greedy tokens identical' if not bad else f'{bad} prompt(s) differ'}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

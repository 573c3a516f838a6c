"""Time to first token on a fresh install: a copy of the package with no compiled kernels cached.

    python3 benchmarks/first_start.py [-m MODEL] [-t THREADS] [-n TOKENS]

Copies `workbench/` (sources only) into a temporary folder, points the kernel cache there too
(``XDG_CACHE_HOME``), and runs ``python -m workbench generate -p hi -n 1 --ignore-eos`` twice in fresh
processes: the first compiles the kernels the model's tensor types need, the second finds them
in the cache. Prints both wall times (a benchmark, not a test: the figures depend on the host).
``-n 2`` times the first *decoded* token too (the first comes from the prompt's logits; a decoded
token of a mixture-of-experts model runs a compiled call of its own, compiled on first use).

AMD EPYC VM, 2 threads, the synthetic qwen3moe (`make_moe_model.py`), 2026-12-02: ``-n 2`` took
88-100 s before that call's compile was cut down (commit 57c832a), 71-74 s after. In one process
(`Engine.load`, a prompt, a token), before: load 46.6 s, prompt 8.3 s, first decoded token 73.2 s;
after: 34.1 / 1.7 / 33.5 s.

AVX2-only AMD EPYC VM, 2 threads, the default model, 2026-12-03: ``-n 1`` 53.1 s and ``-n 2`` 80.7 s
before the job loop called the kernels through an address and the duplicate and shape-message
compiles went; 39.7 s and 71.4 s after (second start 3.3-3.5 s).

AVX2-only AMD EPYC VM of another generation (cpuinfo family 25), 2 threads, the default model,
2026-12-03, alternating runs of the commit before (fa2a3d3) and after one shared compile task list
with LLVM -O2: ``-n 1`` 30.9 / 32.2 / 35.0 s before, 27.8 / 29.0 / 30.5 s after (an earlier
alternation: 33.1 / 37.8 / 34.2 against 31.7 / 28.9 / 28.6 s); ``-n 2`` 62.8 -> 57.7 s.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(tree: str, env: dict, args: list[str], n: int = 1) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "workbench", "generate", "-p", "hi", "-n", str(n), "--ignore-eos", *args]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"first_start: generate failed: {p.stderr.strip()[-400:]}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model")
    ap.add_argument("-t", "--threads", type=int)
    ap.add_argument("-n", type=int, default=1, help="tokens to generate (2: the first decoded one too)")
    a = ap.parse_args()
    extra = (["-m", a.model] if a.model else []) + (["-t", str(a.threads)] if a.threads else [])
    with tempfile.TemporaryDirectory(prefix="numawb-fresh-") as tmp:
        tree = os.path.join(tmp, "tree")
        shutil.copytree(os.path.join(ROOT, "workbench"), os.path.join(tree, "workbench"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"), PYTHONDONTWRITEBYTECODE="0")
        env.pop("NUMBA_CACHE_DIR", None)
        cold = run_once(tree, env, extra, a.n)
        warm = run_once(tree, env, extra, a.n)
    what = "first token" if a.n == 1 else f"{a.n} tokens"
    print(f"fresh install, time to {what}: {cold:.1f} s (compiling the model's kernels); "
          f"second start {warm:.1f} s (kernels from the cache)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

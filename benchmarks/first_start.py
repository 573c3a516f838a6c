"""Time to first token on a fresh install: a copy of the package with no compiled kernels cached.

    python3 benchmarks/first_start.py [-m MODEL] [-t THREADS]

Copies `workbench/` (sources only) into a temporary folder, points the kernel cache there too
(``XDG_CACHE_HOME``), and runs ``python -m workbench generate -p hi -n 1`` twice in fresh
processes: the first compiles the kernels the model's tensor types need, the second finds them
in the cache. Prints both wall times (a benchmark, not a test: the figures depend on the host).
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


def run_once(tree: str, env: dict, args: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "workbench", "generate", "-p", "hi", "-n", "1", *args],
                       cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"first_start: generate failed: {p.stderr.strip()[-400:]}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model")
    ap.add_argument("-t", "--threads", type=int)
    a = ap.parse_args()
    extra = (["-m", a.model] if a.model else []) + (["-t", str(a.threads)] if a.threads else [])
    with tempfile.TemporaryDirectory(prefix="numawb-fresh-") as tmp:
        tree = os.path.join(tmp, "tree")
        shutil.copytree(os.path.join(ROOT, "workbench"), os.path.join(tree, "workbench"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"), PYTHONDONTWRITEBYTECODE="0")
        env.pop("NUMBA_CACHE_DIR", None)
        cold = run_once(tree, env, extra)
        warm = run_once(tree, env, extra)
    print(f"fresh install, time to first token: {cold:.1f} s (compiling the model's kernels); "
          f"second start {warm:.1f} s (kernels from the cache)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time to first token on a fresh install: a copy of the package with no compiled kernels cached.

    python3 benchmarks/first_start.py [-m MODEL] [-t THREADS] [-n TOKENS] [--trace]

Copies `workbench/` (sources only) into a temporary folder, points the kernel cache there too
(``XDG_CACHE_HOME``), and runs ``python -m workbench generate -p hi -n 1 --ignore-eos`` twice in fresh
processes: the first compiles the kernels the model's tensor types need, the second finds them
in the cache. Prints both wall times (a benchmark, not a test: the figures depend on the host).
``-n 2`` times the first *decoded* token too (the first comes from the prompt's logits; a decoded
token of a mixture-of-experts model runs a compiled call of its own, compiled on first use).
``--trace`` also lists the first run's Numba compiles in every process (the engine and its
compile helper): each function's own time (its callees' compiles taken out), the longest first,
and when each process was compiling.

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
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# installed as sitecustomize in the traced run: every process (the engine and its helper) logs
# its Numba compiles, one JSON line each, to $NUMAWB_COMPILE_TRACE.<pid>
TRACER = """
import json, os, threading, time
from numba.core import event

_out, _stack, _lock = os.environ["NUMAWB_COMPILE_TRACE"] + "." + str(os.getpid()), threading.local(), threading.Lock()


class _Trace(event.Listener):
    def on_start(self, ev):
        st = getattr(_stack, "s", None) or []
        st.append([time.time(), 0.0])
        _stack.s = st

    def on_end(self, ev):
        t0, inner = _stack.s.pop()
        total = time.time() - t0
        if _stack.s:
            _stack.s[-1][1] += total
        d = ev.data.get("dispatcher")
        name = getattr(getattr(d, "py_func", None), "__qualname__", str(d))
        mod = getattr(getattr(d, "py_func", None), "__module__", "")
        row = {"name": mod.rsplit(".", 1)[-1] + "." + name, "start": t0, "total": total,
               "own": total - inner, "depth": len(_stack.s)}
        with _lock, open(_out, "a") as f:  # each row at once: processes may leave by os._exit
            f.write(json.dumps(row) + "\\n")


event.register("numba:compile", _Trace())
"""


def report_trace(prefix: str, t_start: float, top: int = 25) -> None:
    """The traced run's compiles: per process, its busy span; then the functions by own time."""
    folder, base = os.path.split(prefix)
    rows = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(base + "."):
            pid = name.rsplit(".", 1)[1]
            with open(os.path.join(folder, name)) as f:
                rows += [dict(json.loads(line), pid=pid) for line in f if line.strip()]
    if not rows:
        print("trace: no compiles recorded")
        return
    for pid in sorted({r["pid"] for r in rows}):
        mine = [r for r in rows if r["pid"] == pid]
        own = sum(r["own"] for r in mine)
        end = max(r["start"] + r["total"] for r in mine) - t_start
        print(f"process {pid}: {len(mine)} compiles, {own:.1f} s compiling, last one ended at {end:.1f} s")
    print(f"{'own s':>7} {'total s':>8} {'at s':>6}  pid     function")
    for r in sorted(rows, key=lambda r: -r["own"])[:top]:
        print(f"{r['own']:7.2f} {r['total']:8.2f} {r['start'] - t_start:6.1f}  {r['pid']:<7} {r['name']}")


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
    ap.add_argument("--trace", action="store_true", help="list the first run's Numba compiles per process")
    a = ap.parse_args()
    extra = (["-m", a.model] if a.model else []) + (["-t", str(a.threads)] if a.threads else [])
    with tempfile.TemporaryDirectory(prefix="numawb-fresh-") as tmp:
        tree = os.path.join(tmp, "tree")
        shutil.copytree(os.path.join(ROOT, "workbench"), os.path.join(tree, "workbench"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"), PYTHONDONTWRITEBYTECODE="0")
        env.pop("NUMBA_CACHE_DIR", None)
        cold_env, prefix = env, os.path.join(tmp, "trace", "compiles")
        if a.trace:
            os.makedirs(os.path.dirname(prefix))
            with open(os.path.join(tmp, "trace", "sitecustomize.py"), "w") as f:
                f.write(TRACER)
            cold_env = dict(env, NUMAWB_COMPILE_TRACE=prefix, PYTHONPATH=os.pathsep.join(
                p for p in (os.path.join(tmp, "trace"), env.get("PYTHONPATH", "")) if p))
        t_start = time.time()
        cold = run_once(tree, cold_env, extra, a.n)
        if a.trace:
            report_trace(prefix, t_start)
        warm = run_once(tree, env, extra, a.n)
    what = "first token" if a.n == 1 else f"{a.n} tokens"
    print(f"fresh install, time to {what}: {cold:.1f} s (compiling the model's kernels); "
          f"second start {warm:.1f} s (kernels from the cache)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

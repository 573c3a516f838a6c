"""Decode speed and where a decoded token's time goes (a benchmark, not a test).

    PYTHONPATH=. python3 benchmarks/decode_profile.py [-t 1,2] [-n 32] [-r 5] [--profile]
    python3 benchmarks/decode_profile.py --ab /path/to/tree_a,/path/to/tree_b [-t 1,2] [-r 15]

Prints decode tokens/s (median of ``-r`` runs of ``-n`` tokens, after a short prompt) per thread
count, with the load average: the machine is shared, so compare runs made side by side.
``--profile`` also times, per token, every Runtime product/attention call, every ``ops`` call
and every kernel call (exclusive wall-clock time on the calling thread; kernels on worker
threads are summed per worker), by wrapping those functions for a separate run.
``--ab`` compares source trees (e.g. a ``git archive`` of HEAD and the working tree): one
process per tree and thread count, all loaded at once and taking turns run by run, so that
every variant sees the same background load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict

from workbench.engine import Engine
from workbench.engine import kernels, ops
from workbench.engine.engine import Placement

PROMPT = "The capital of France is"


def decode_tps(session, n: int) -> float:
    session.reset()
    session.eval(session.engine.tokenizer.encode(PROMPT))
    for i in range(3):
        session.eval([100 + i])
    t = time.perf_counter()
    for i in range(n):
        session.eval([200 + i])
    return n / (time.perf_counter() - t)


class Timers:
    """Exclusive wall-clock time per wrapped function, per thread."""

    def __init__(self) -> None:
        self.total: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.local = threading.local()
        self.undo: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, attr: str, label: str) -> None:
        fn = getattr(owner, attr)
        local, total, calls = self.local, self.total, self.calls

        def timed(*a, **k):
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            thread = threading.current_thread().name
            t0 = time.perf_counter()
            stack.append(0.0)
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                inner = stack.pop()
                total[(thread, label)] += dt - inner
                calls[(thread, label)] += 1
                if stack:
                    stack[-1] += dt
        self.undo.append((owner, attr, fn))
        setattr(owner, attr, timed)

    def restore(self) -> None:
        for owner, attr, fn in reversed(self.undo):
            setattr(owner, attr, fn)


def profile(engine, session, n: int) -> None:
    rt = engine.rt
    timers = Timers()
    for name in ("linear", "gated", "attention", "rows", "f32"):
        if hasattr(rt, name):
            timers.wrap(rt, name, f"rt.{name}")
    for name in dir(ops):
        if not name.startswith("_") and hasattr(getattr(ops, name), "py_func"):
            timers.wrap(ops, name, f"ops.{name}")
    for name in ("prepare", "matvec", "matmat"):
        timers.wrap(kernels, name, f"kernels.{name}")
    timers.wrap(engine.model, "forward", "forward (rest)")
    try:
        session.reset()
        session.eval(engine.tokenizer.encode(PROMPT))
        timers.total.clear()
        timers.calls.clear()
        t = time.perf_counter()
        for i in range(n):
            session.eval([300 + i])
        wall = (time.perf_counter() - t) / n
    finally:
        timers.restore()
    print(f"  per token: {wall * 1e3:.2f} ms wall (profiled run)")
    rows = sorted(timers.total.items(), key=lambda kv: -kv[1])
    for (thread, label), tot in rows:
        c = timers.calls[(thread, label)] / n
        print(f"  {thread:16s} {label:24s} {tot / n * 1e3:7.3f} ms/token  {c:6.1f} calls/token")


def child(threads: int, n: int) -> None:
    """--ab worker process: one decode run per line read from stdin, its t/s printed."""
    engine = Engine.load(placement=Placement(threads=threads))
    session = engine.new_session(512)
    decode_tps(session, 4)
    print("ready", flush=True)
    for _ in sys.stdin:
        print(f"{decode_tps(session, n):.3f}", flush=True)
    engine.close()


def ab(trees: list[str], threads: list[int], n: int, reps: int) -> None:
    procs = {}
    for nt in threads:
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=tree)
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", str(nt), "-n", str(n)],
                                 cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs[(nt, tree)] = p
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"{tree}: child failed to start")
    results: dict[tuple[int, str], list[float]] = {k: [] for k in procs}
    loads = []
    for _ in range(reps):
        for key, p in procs.items():
            p.stdin.write("go\n")
            p.stdin.flush()
            results[key].append(float(p.stdout.readline()))
        loads.append(os.getloadavg()[0])
    for p in procs.values():
        p.stdin.close()
        p.wait()
    print(f"load average during the runs: {min(loads):.2f}-{max(loads):.2f}")
    for (nt, tree), tps in results.items():
        print(f"threads={nt} {tree:30s} decode {statistics.median(tps):6.1f} t/s "
              f"(median of {reps}; min {min(tps):.1f}, max {max(tps):.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-n", "--tokens", type=int, default=32)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ab", help="comma-separated source trees to compare side by side")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.tokens)
    threads = [int(t) for t in args.threads.split(",")]
    if args.ab:
        return ab(args.ab.split(","), threads, args.tokens, args.reps)
    engine = Engine.load(placement=Placement(threads=threads[0]))
    try:
        for nt in threads:
            if nt != engine.pool.n_threads:
                engine.switch(threads=nt)
            session = engine.new_session(512)
            decode_tps(session, 4)
            tps = [decode_tps(session, args.tokens) for _ in range(args.reps)]
            print(f"threads={nt}: decode {statistics.median(tps):.1f} t/s "
                  f"(median of {args.reps}; min {min(tps):.1f}, max {max(tps):.1f}); "
                  f"load average {os.getloadavg()[0]:.2f}")
            if args.profile:
                profile(engine, session, args.tokens)
            session.close()
    finally:
        engine.close()


if __name__ == "__main__":
    main()

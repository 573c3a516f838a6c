"""Shared machinery of the profiling benchmarks (decode_profile.py, prefill_profile.py).

* :class:`Timers` wraps functions to time them (exclusive wall-clock time per thread);
* :func:`wrap_engine` wraps the usual suspects: Runtime methods, every compiled ``ops`` function
  and the model's forward;
* :func:`serve` and :func:`run_ab` are the two halves of an ``--ab`` comparison: one child process
  per source tree and thread count, all loaded at once and taking turns run by run, so every variant
  sees the same background load;
* :func:`cli` is the command line both scripts share.
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
from typing import Callable


class Timers:
    """Exclusive wall-clock time per wrapped function, per thread.

    Time spent in a wrapped function called from another wrapped function counts for the inner one
    only.  Keys are ``(thread name, label)``.
    """

    def __init__(self) -> None:
        self.total: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.flops: dict[tuple[str, str], float] = defaultdict(float)
        self.local = threading.local()
        self.undo: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, attr: str, label, flops=None) -> None:
        """Replace ``owner.attr`` by a timed wrapper (until :meth:`restore`).

        label: a string, or ``label(*args)`` giving one per call (e.g. per weight type);
        flops: ``flops(*args)``, the work of one call (for GFLOP/s), or None.
        """
        fn = getattr(owner, attr)
        local, total, calls, flop_sums = self.local, self.total, self.calls, self.flops
        name_of = label if callable(label) else None

        def timed(*a, **k):
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            key = (threading.current_thread().name, name_of(*a) if name_of else label)
            t0 = time.perf_counter()
            stack.append(0.0)
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                inner = stack.pop()
                total[key] += dt - inner
                calls[key] += 1
                if flops is not None:
                    flop_sums[key] += flops(*a)
                if stack:
                    stack[-1] += dt
        self.undo.append((owner, attr, fn))
        setattr(owner, attr, timed)

    def restore(self) -> None:
        """Put every wrapped function back."""
        for owner, attr, fn in reversed(self.undo):
            setattr(owner, attr, fn)
        self.undo.clear()

    def clear(self) -> None:
        """Forget what was timed so far (the wrappers stay)."""
        self.total.clear()
        self.calls.clear()
        self.flops.clear()

    def rows(self) -> list[tuple[str, str, float, int]]:
        """``(thread, label, seconds, calls)``, most time first."""
        return [(thread, label, t, self.calls[(thread, label)])
                for (thread, label), t in sorted(self.total.items(), key=lambda kv: -kv[1])]


def wrap_engine(timers: Timers, engine, rt_methods: tuple[str, ...]) -> None:
    """Wrap the Runtime methods ``rt_methods`` that exist ("rt.<name>"), every compiled function of
    ``workbench.engine.ops`` ("ops.<name>") and the model's forward ("forward (rest)": the time not
    spent in any other wrapped function)."""
    from workbench.engine import ops
    for name in rt_methods:
        if hasattr(engine.rt, name):
            timers.wrap(engine.rt, name, f"rt.{name}")
    for name in dir(ops):
        if not name.startswith("_") and hasattr(getattr(ops, name), "py_func"):
            timers.wrap(ops, name, f"ops.{name}")
    timers.wrap(engine.model, "forward", "forward (rest)")


# ----------------------------------------------------------------------------- --ab
def serve(engine, run: Callable[[], float]) -> None:
    """--ab child process: print "ready", then one ``run()`` result a line per line read from stdin."""
    print("ready", flush=True)
    for _ in sys.stdin:
        print(f"{run():.3f}", flush=True)
    engine.close()


def run_ab(script: str, trees: list[str], threads: list[int], child_args: list[str],
           reps: int, procs: int = 1) -> dict[tuple[int, str], list[float]]:
    """Start ``script --child <threads> *child_args`` once per thread count and tree (with that tree
    on PYTHONPATH and as the working directory), then ask each for one result per repetition, in
    turn.  With ``procs`` > 1 that happens in ``procs`` rounds, each with fresh processes taking
    its share of the repetitions: a process keeps the memory it was given for its life, and on the
    Intel Xeon host two processes of the same tree decoded 5-8 % apart for their whole run (one
    round compares placements as much as code).  Prints the load average over the runs; returns
    the results per (threads, tree)."""
    results: dict[tuple[int, str], list[float]] = {(nt, tree): [] for nt in threads for tree in trees}
    loads = []
    per_round = [reps // procs + (r < reps % procs) for r in range(procs)]
    for r, n in enumerate(per_round):
        if n == 0:
            continue
        order = trees if r % 2 == 0 else trees[::-1]   # which tree starts first alternates too
        procs_now = {}
        for nt in threads:
            for tree in order:
                env = dict(os.environ, PYTHONPATH=tree)
                p = subprocess.Popen([sys.executable, os.path.abspath(script), "--child", str(nt), *child_args],
                                     cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                procs_now[(nt, tree)] = p
                if p.stdout.readline().strip() != "ready":
                    raise SystemExit(f"{tree}: child failed to start")
        for _ in range(n):
            for key, p in procs_now.items():
                p.stdin.write("go\n")
                p.stdin.flush()
                results[key].append(float(p.stdout.readline()))
            loads.append(os.getloadavg()[0])
        for p in procs_now.values():
            p.stdin.close()
            p.wait()
    print(f"load average during the runs: {min(loads):.2f}-{max(loads):.2f}")
    return results


def print_ab(results: dict[tuple[int, str], list[float]], what: str, reps: int, ratio: bool = False) -> None:
    """One line per (threads, tree): median t/s of ``what`` (e.g. "decode", "pp512"), min and max,
    and with ``ratio`` its ratio to the first tree at the same thread count."""
    base: dict[int, float] = {}
    for (nt, tree), tps in results.items():
        med = statistics.median(tps)
        base.setdefault(nt, med)
        print(f"threads={nt} {tree:30s} {what} {med:6.1f} t/s (median of {reps}; "
              f"min {min(tps):.1f}, max {max(tps):.1f})" + (f"  x{med / base[nt]:.3f}" if ratio else ""))


# ----------------------------------------------------------------------------- command line
def cli(doc: str, script: str, size_flags: tuple[str, str], default: int, what: Callable[[int], str],
        ctx: Callable[[int], int], runner: Callable, profile: Callable, ratio: bool = False) -> None:
    """``-t 1,2``, the work size (``size_flags``), ``-r``, ``--profile`` and ``--ab`` (plus the
    hidden ``--child`` of --ab). ``runner(engine, session, size)`` warms up and returns a function
    that measures once (tokens/s); ``profile(engine, session, size)`` prints a breakdown;
    ``what(size)`` names the measurement; ``ctx(size)`` is the context the session needs."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument(*size_flags, dest="size", type=int, default=default)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ab", help="comma-separated source trees to compare side by side")
    ap.add_argument("--procs", type=int, default=1,
                    help="--ab: fresh processes per tree, in rounds sharing the repetitions (default 1)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from workbench.engine import Engine, kernels
    from workbench.engine.engine import Placement
    if args.child:
        engine = Engine.load(args.model, placement=Placement(threads=args.child))
        serve(engine, runner(engine, engine.new_session(ctx(args.size)), args.size))
        return
    threads = [int(t) for t in args.threads.split(",")]
    if args.ab:
        extra = ["-m", args.model] if args.model else []
        results = run_ab(script, args.ab.split(","), threads, [size_flags[0], str(args.size), *extra], args.reps,
                         max(1, args.procs))
        print_ab(results, what(args.size), args.reps, ratio=ratio)
        return
    engine = Engine.load(args.model, placement=Placement(threads=threads[0]))
    try:
        for nt in threads:
            if nt != engine.pool.n_threads:
                engine.switch(threads=nt)
            session = engine.new_session(ctx(args.size))
            once = runner(engine, session, args.size)
            tps = [once() for _ in range(args.reps)]
            print(f"threads={nt}: {what(args.size)} {statistics.median(tps):.1f} t/s "
                  f"(median of {args.reps}; min {min(tps):.1f}, max {max(tps):.1f}); "
                  f"load average {os.getloadavg()[0]:.2f}; kernels {kernels.kernel_path()}")
            if args.profile:
                profile(engine, session, args.size)
            session.close()
    finally:
        engine.close()

"""Decode speed and where a decoded token's time goes (a benchmark, not a test).

    PYTHONPATH=. python3 benchmarks/decode_profile.py [-t 1,2] [-n 32] [-r 5] [--profile]
    python3 benchmarks/decode_profile.py --ab /path/to/tree_a,/path/to/tree_b [-t 1,2] [-r 16] [--procs 4]

Prints decode tokens/s (median of ``-r`` runs of ``-n`` tokens, after a short prompt) per thread
count, with the load average: the machine is shared, so compare runs made side by side.
``--profile`` also times, per token, every Runtime product/attention call, every ``ops`` call
and every kernel call (exclusive wall-clock time on the calling thread; kernels on worker
threads are summed per worker), by wrapping those functions for a separate run.
``--ab`` compares source trees (e.g. a ``git archive`` of HEAD and the working tree): one
process per tree and thread count, all loaded at once and taking turns run by run, so that
every variant sees the same background load; ``--procs P`` does that in P rounds of fresh
processes (one process's memory placement moved its decode 5-8 % on the Intel Xeon host: with
one round, two copies of one tree differ as much as two trees). ``NUMAWB_BENCH_RANDOM=1`` decodes random token ids
(as llama-bench does; see RANDOM below).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profiling import Timers, cli, wrap_engine  # noqa: E402

from workbench.engine import kernels  # noqa: E402

PROMPT = "The capital of France is"


# NUMAWB_BENCH_RANDOM=1: random token ids, as llama-bench and `numawb bench` decode (a MoE model
# routes each token to other experts; with the ids 200, 201, ... of the default, neighbouring
# tokens of the synthetic MoE file share experts that stay in the caches, which flatters it)
RANDOM = os.environ.get("NUMAWB_BENCH_RANDOM", "0") != "0"


def decode_tps(session, n: int) -> float:
    session.reset()
    session.eval(session.engine.tokenizer.encode(PROMPT))
    for i in range(3):
        session.eval([100 + i])
    if RANDOM:
        ids = [int(v) for v in np.random.default_rng().integers(4, session.engine.cfg.n_vocab, n)]
    else:
        ids = [200 + i for i in range(n)]
    t = time.perf_counter()
    for tok in ids:
        session.eval([tok])
    return n / (time.perf_counter() - t)


def profile(engine, session, n: int) -> None:
    timers = Timers()
    for name in ("prepare", "matvec", "matmat"):
        timers.wrap(kernels, name, f"kernels.{name}")
    wrap_engine(timers, engine, ("linear", "gated", "attention", "rows", "f32"))
    try:
        session.reset()
        session.eval(engine.tokenizer.encode(PROMPT))
        timers.clear()
        t = time.perf_counter()
        for i in range(n):
            session.eval([300 + i])
        wall = (time.perf_counter() - t) / n
    finally:
        timers.restore()
    print(f"  per token: {wall * 1e3:.2f} ms wall (profiled run)")
    for thread, label, tot, calls in timers.rows():
        print(f"  {thread:16s} {label:24s} {tot / n * 1e3:7.3f} ms/token  {calls / n:6.1f} calls/token")


def runner(engine, session, n: int):
    decode_tps(session, 4)
    return lambda: decode_tps(session, n)


if __name__ == "__main__":
    cli(__doc__, __file__, ("-n", "--tokens"), 32, lambda n: "decode", lambda n: 512, runner, profile)

"""Prompt-processing speed (pp512) and where a prefill's time goes (a benchmark, not a test).

    PYTHONPATH=. python3 benchmarks/prefill_profile.py [-t 1,2] [-p 512] [-r 5] [--profile]
    python3 benchmarks/prefill_profile.py --ab /path/to/tree_a,/path/to/tree_b [-t 1,2] [-r 7]

Prints prefill tokens/s (median of ``-r`` evaluations of a ``-p``-token prompt of random ids into
an empty cache, like llama-bench's pp test) per thread count.
``--profile`` then times one more prefill with every kernel call (per weight type), every
``prepare`` (per type), every Runtime product/attention call, the attention helpers and every
``ops`` call wrapped: exclusive wall-clock time per thread (kernels on worker threads are summed
per worker), so "rt.*" rows are the Python glue around the kernels.
``--ab`` compares source trees (e.g. a ``git archive`` of HEAD and the working tree): one process
per tree and thread count, all loaded at once and taking turns run by run, so every variant sees
the same background load.  Quote the ratio, not the absolute numbers: the machine is shared.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profiling import Timers, cli, wrap_engine  # noqa: E402

from workbench.engine import kernels  # noqa: E402
from workbench.engine import attention as _attention  # noqa: E402
from workbench.engine.kv_cache import KVCache  # noqa: E402

TYPE_NAMES = dict(kernels.SUPPORTED_TYPES)


def prompt_ids(engine, n: int, seed: int = 1) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.integers(4, engine.cfg.n_vocab, n)]


def prefill_tps(session, ids: list[int]) -> float:
    session.reset()
    t = time.perf_counter()
    session.eval(ids)
    return len(ids) / (time.perf_counter() - t)


def _by_type(what: str):
    return lambda t, *a: f"{what}.{TYPE_NAMES.get(t, t)}"


def _matmat_flops(t, w, xp, out, r0, r1) -> float:
    n, k = xp[0].shape
    return 2.0 * n * k * (r1 - r0)


def profile(engine, session, ids: list[int]) -> None:
    timers = Timers()
    for name in ("softmax_stats", "probabilities", "merge_stats"):   # where the attention calls them
        timers.wrap(_attention, name, f"attention.{name}")
    timers.wrap(KVCache, "store", "kv.store")
    for name in ("prepare", "matvec"):
        timers.wrap(kernels, name, _by_type(name))
    timers.wrap(kernels, "matmat", _by_type("matmat"), _matmat_flops)
    timers.wrap(kernels, "dequantize_rows", "kernels.dequantize_rows")
    wrap_engine(timers, engine, ("linear", "gated", "attention", "rows", "f32", "_products", "_run"))
    try:
        session.reset()
        t = time.perf_counter()
        session.eval(ids)
        wall = time.perf_counter() - t
    finally:
        timers.restore()
    tot = sum(timers.total.values())
    print(f"  one prefill of {len(ids)} tokens: {wall * 1e3:.1f} ms wall (profiled run, "
          f"{len(ids) / wall:.1f} t/s); per-thread sums {tot * 1e3:.1f} ms")
    for thread, label, t, c in timers.rows():
        fl = timers.flops.get((thread, label))
        rate = f"  {fl / t * 1e-9:6.1f} GFLOP/s" if fl else ""
        print(f"  {thread:16s} {label:28s} {t * 1e3:8.2f} ms {100 * t / wall:5.1f} %  {c:6d} calls{rate}")


def runner(engine, session, n: int):
    ids = prompt_ids(engine, n)
    prefill_tps(session, ids)
    return lambda: prefill_tps(session, ids)


if __name__ == "__main__":
    cli(__doc__, __file__, ("-p", "--prompt"), 512, lambda n: f"pp{n}", lambda n: max(n, 512), runner,
        lambda engine, session, n: profile(engine, session, prompt_ids(engine, n)), ratio=True)

"""Short weight runs read cold, one after another in a random order, with and without the next
run's start asked for first (a benchmark, not a test): what `crew.RUN_AHEAD` is measured with.

    python3 benchmarks/cold_runs_probe.py [--type Q4_K_x8] [--k 256] [--rows 128] [--mb 600]

A decoded token's routed experts are such runs (R1's widths: a worker's half of an expert matrix is
128 rows x 256 of Q4_K, 18 KiB). One thread, one compiled loop over the engine's one-token kernel
for the type (no Python between runs), the matrix on 2 MB pages as the engine's weights. Per
variant: before each run, nothing / the first N bytes of the next run with prefetcht2 (the crew's
`prefetch_l2_at`) / with prefetcht0 (`prefetch_at`); best of 5 passes of 2000 runs; then the same
run taken again and again from the caches. Variants alternate twice in one process.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from attention_kernel_bench import cpu  # noqa: E402 (cpuinfo's name, family and model)
from kernels_bench import FILE_TYPE, weights  # noqa: E402
from workbench.engine import kernels as K  # noqa: E402
from workbench.engine.kernels.intrinsics.streams import prefetch_at, prefetch_l2_at  # noqa: E402

VARIANTS = [("nothing", 0, False), ("4 KiB, t2", 4096, True), ("8 KiB, t2", 8192, True),
            ("whole run, t2", 1 << 40, True), ("4 KiB, t0", 4096, False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="Q4_K_x8", help="a type or engine layout name (default Q4_K_x8)")
    ap.add_argument("--k", type=int, default=256, help="row length in weights (default 256)")
    ap.add_argument("--rows", type=int, default=128, help="rows a run (default 128)")
    ap.add_argument("--mb", type=float, default=600, help="bytes of runs in all, MB (default 600)")
    a = ap.parse_args()
    names = {v: k for k, v in K.SUPPORTED_TYPES.items()}
    names.update({K.TYPE_NAMES[t]: t for t in FILE_TYPE})
    t = names[a.type]
    base = FILE_TYPE.get(t, t)
    rb = K.row_bytes(base, a.k)
    r = a.rows
    rng = np.random.default_rng(0)
    w = weights(t, int(a.mb * 1e6 / rb) // r * r, a.k, rng)
    xp = K.prepare(base, rng.standard_normal(a.k).astype(np.float32))
    out = np.empty(w.shape[0], np.float32)
    mv = K.matvec_kernels()[t]

    @numba.njit(nogil=True)
    def run(w, xp, out, order, ahead, l2):
        at = w.ctypes.data
        for i in range(order.shape[0]):
            if ahead > 0 and i + 1 < order.shape[0]:
                a0 = at + order[i + 1] * r * rb
                for pa in range(a0, a0 + min(r * rb, ahead), 64):
                    if l2:
                        prefetch_l2_at(pa)
                    else:
                        prefetch_at(pa)
            c = order[i]
            mv(w, xp, out, c * r, c * r + r)

    n_runs = w.shape[0] // r
    print(f"# {a.type}, runs of {r} x {a.k} ({r * rb / 1024:.1f} KiB), {n_runs} runs, 1 thread, "
          f"kernels {K.kernel_path()}; host: {cpu()}")
    print("| next run's start asked for | us a run | GB/s |")
    print("|---|---:|---:|")
    for _ in range(2):
        for label, ahead, l2 in VARIANTS:
            run(w, xp, out, np.arange(3, dtype=np.int64), ahead, l2)
            best = min(_timed(run, w, xp, out, rng.permutation(n_runs)[:2000].astype(np.int64), ahead, l2)
                       for _ in range(5))
            print(f"| {label} | {best / 2000 * 1e6:.2f} | {2000 * r * rb / best / 1e9:.1f} |", flush=True)
    hot = np.zeros(2000, dtype=np.int64)
    best = min(_timed(run, w, xp, out, hot, 0, False) for _ in range(5))
    print(f"| the same run again (from the caches) | {best / 2000 * 1e6:.2f} | {2000 * r * rb / best / 1e9:.1f} |")


def _timed(run, *args) -> float:
    t0 = time.perf_counter()
    run(*args)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()

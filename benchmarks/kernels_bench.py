"""Single-thread throughput of workbench.engine.kernels per GGUF type (a script, not a test).

matvec: GB/s of weight bytes streamed (matrix larger than the caches), compared with ~30 GB/s
one-core memory bandwidth.  matmat: GFLOP/s (2*rows*k*n) on an L2-sized matrix.
Also the Python wrapper overhead of one matvec call on a tiny matrix.

    python3 benchmarks/kernels_bench.py [--mb 64] [--paths avx512-vnni,avx2] [--types Q8_0,Q4_K]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from workbench.engine import kernels as K  # noqa: E402

ONE_CORE_GBS = 30.0
SCALE_OFFSETS = {  # byte offsets of f16 scale fields inside a block (kept finite and small)
    "F16": None, "BF16": None, "F32": None, "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2),
    "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,),
    "IQ4_XS": (0,), "Q3_K": (108,), "Q2_K": (80, 82),
}


def make_matrix(t: int, rows: int, k: int, rng) -> np.ndarray:
    name = K.SUPPORTED_TYPES[t]
    bs, ts = K.BLOCK_SIZES[t]
    if name in ("F32", "F16", "BF16"):
        x = rng.standard_normal((rows, k), dtype=np.float32) * 0.05
        if name == "F32":
            return x.view(np.uint8)
        if name == "F16":
            return x.astype(np.float16).view(np.uint8)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    w = rng.integers(0, 256, (rows, k // bs, ts), dtype=np.uint8)
    for off in SCALE_OFFSETS[name]:
        w[..., off:off + 2] = np.array([0.01], np.float16).view(np.uint8)
    return w.reshape(rows, -1)


def bench(fn, min_time=0.3, min_reps=3) -> float:
    fn()  # warm up (JIT)
    best = float("inf")
    t_end = time.perf_counter() + min_time
    reps = 0
    while reps < min_reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=64.0, help="matvec matrix size in MB")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=64, help="matmat batch columns")
    ap.add_argument("--paths", default=",".join(K.available_paths()))
    ap.add_argument("--types", default=",".join(K.SUPPORTED_TYPES.values()))
    ap.add_argument("--no-matmat", action="store_true")
    ap.add_argument("--rows-multiple", type=int, default=1,
                    help="round the matvec row count down to a multiple of this (8: the repacked orders of Q4_0, IQ4_NL, Q2_K)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    names = {v: k for k, v in K.SUPPORTED_TYPES.items()}
    types = [names[s] for s in args.types.split(",")]
    paths = args.paths.split(",")
    k = args.k
    x = rng.standard_normal(k, dtype=np.float32)
    X = rng.standard_normal((args.n, k), dtype=np.float32)
    print(f"kernel paths: {paths}   (available: {K.available_paths()}), k={k}, matvec ~{args.mb:.0f} MB, "
          f"matmat n={args.n}")
    hdr = f"{'type':6} {'path':12} {'matvec GB/s':>12} {'% of 30GB/s':>11} {'prepare us':>10} {'matmat GFLOP/s':>15}"
    print(hdr)
    print("-" * len(hdr))
    for t in types:
        rb = K.row_bytes(t, k)
        rows = max(64, int(args.mb * 1e6 / rb)) // args.rows_multiple * args.rows_multiple
        w = make_matrix(t, rows, k, rng)
        out = np.empty(rows, np.float32)
        mrows = max(16, int(0.5e6 / rb))  # ~0.5 MB: stays in L2 across batch columns
        wm = w[:mrows]
        outm = np.empty((args.n, mrows), np.float32)
        for p in paths:
            K.set_kernel_path(p)
            xp = K.prepare(t, x)
            sec = bench(lambda: K.matvec(t, w, xp, out, 0, rows), 1.0)
            gbs = w.nbytes / sec / 1e9
            tp = bench(lambda: K.prepare(t, x), 0.05)
            gf = float("nan")
            if not args.no_matmat:
                Xp = K.prepare(t, X)
                sm = bench(lambda: K.matmat(t, wm, Xp, outm, 0, mrows), 0.2, 2)
                gf = 2.0 * mrows * k * args.n / sm / 1e9
            print(f"{K.SUPPORTED_TYPES[t]:6} {p:12} {gbs:12.1f} {100 * gbs / ONE_CORE_GBS:10.0f}% "
                  f"{tp * 1e6:10.1f} {gf:15.1f}", flush=True)
    # wrapper overhead on a tiny product
    K.set_kernel_path(paths[0])
    t = names["Q8_0"]
    w = make_matrix(t, 4, 256, rng)
    xs = rng.standard_normal(256, dtype=np.float32)
    xp = K.prepare(t, xs)
    out = np.empty(4, np.float32)
    n = 20000
    K.matvec(t, w, xp, out, 0, 4)
    t0 = time.perf_counter()
    for _ in range(n):
        K.matvec(t, w, xp, out, 0, 4)
    dt = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        K.prepare(t, xs)
    dp = (time.perf_counter() - t0) / n
    print(f"\nper-call overhead (4x256 Q8_0): matvec {dt * 1e6:.2f} us, prepare {dp * 1e6:.2f} us")


if __name__ == "__main__":
    main()

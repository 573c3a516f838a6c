"""Single-thread throughput of workbench.engine.kernels per GGUF type (a script, not a test).

matvec: GB/s of weight bytes streamed (by default a matrix of four times the last-level cache, at
least 256 MB: the Intel Xeon host reports 480 MiB of L3, where 64 MB ran from the cache, and on the
AMD EPYC Zen 5 host, 32 MiB of L3, a 67 MB matrix still partly did: Q8_0_x2 read 51.2 GB/s there
against 41.4 at 400 MB), on 2 MB pages like the engine's weights, compared with ~30 GB/s one-core
memory bandwidth.  matmat: GFLOP/s (2*rows*k*n) on an L2-sized matrix.  ``Q4_K_x8``, ``Q5_0_x2``,
``Q8_0_x2``, ``Q4_0_x8``, ``IQ4_NL_x8``: the layouts the engine keeps Q4_K, Q5_0, Q8_0, Q4_0 and
IQ4_NL weight matrices in (`engine/packing.py`: llama.cpp's 8-row Q4_K layout on the SIMD paths,
Q5_0 and Q8_0 row pairs and Q4_0 / IQ4_NL 8-row groups on AVX-512 VNNI), each with its own
one-token kernel (Q4_0 at K = 2048 with ``--rows-multiple 8``, 1 thread, 2026-12-05: 13.0 ->
37.7 GB/s from memory, 27.0 -> 88.4 in the L2; the prompt product 139 -> 372 GFLOP/s).  AMD EPYC host (Zen 5), 2026-12-05, K = 640, 1
thread: Q5_0 34.8-35.6 GB/s, Q5_0_x2 41.2-41.5 (67 MB); 34.8-35.9 and 41.3-41.9 in the L2 (``--mb
0.8``); Q8_0 43.5 and Q8_0_x2 82.6 in the L2, 42.4 and 41.4 from memory (400 MB: the memory's limit).
Also the Python wrapper overhead of one matvec call on a tiny matrix.

    python3 benchmarks/kernels_bench.py [--mb MB] [--paths avx512-vnni,avx2] [--types Q8_0,Q4_K,Q4_K_x8,Q5_0_x2]
    python3 benchmarks/kernels_bench.py --cold-rows 640 --k 1024 --types Q4_K,Q4_K_x8 --no-matmat

``--cold-rows R``: the matvec column streams the same bytes as matrices of R rows each (a layer's
weight), taken one after another in a shuffled order, so each starts cold as in a decoded token: a
small matrix pays its stream's start, which one long matrix hides. Intel Xeon host, 2026-12-04,
avx512-vnni path, before -> after this stop's kernel changes: Q4_K 640 x 1024 13.3 -> 14.8 GB/s and
640 x 2048 13.0 -> 15.8 (every line of a block prefetched 1536 bytes ahead instead of two lines 4096
ahead); Q5_0 2048 x 640 15.1 -> 16.6 (two rows a step).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from workbench.engine import kernels as K  # noqa: E402
from compare_llamacpp import llc_bytes  # noqa: E402  (the last-level cache's size, sysfs)

ONE_CORE_GBS = 30.0
FILE_TYPE = {packed: file for file, packed in K.PACKED_LAYOUTS.items()}   # the engine's layouts
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


def weights(t: int, rows: int, k: int, rng) -> np.ndarray:
    """A random matrix of type t on 2 MB pages (as the engine's weights); a packed layout: its file
    type's matrix repacked."""
    from workbench.engine import packing
    from workbench.numa.memory import alloc
    base = FILE_TYPE.get(t, t)
    w0 = make_matrix(base, rows, k, rng)
    buf = alloc(w0.nbytes, thp=True)
    w = buf.array[:w0.nbytes].reshape(w0.shape)
    w[:] = w0
    if t != base:
        packing.movers(t)[0](w, 0, rows)
    return w


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
    ap.add_argument("--mb", type=float, help="matvec matrix size in MB (default: 4 x the last-level cache, "
                    "at least 256)")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=64, help="matmat batch columns")
    ap.add_argument("--paths", default=",".join(K.available_paths()))
    ap.add_argument("--types", default=",".join(K.SUPPORTED_TYPES.values()))
    ap.add_argument("--no-matmat", action="store_true")
    ap.add_argument("--rows-multiple", type=int, default=1,
                    help="round the matvec row count down to a multiple of this (8: the repacked orders of Q4_0, IQ4_NL, Q2_K)")
    ap.add_argument("--cold-rows", type=int, default=0,
                    help="matvec over matrices of this many rows in a shuffled order (each read cold)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    names = {v: k for k, v in K.SUPPORTED_TYPES.items()}
    names.update({K.TYPE_NAMES[t]: t for t in FILE_TYPE})
    unknown = [s for s in args.types.split(",") if s not in names]
    if unknown:
        ap.error(f"unknown type {unknown[0]!r}; known: {', '.join(sorted(names))}")
    types = [names[s] for s in args.types.split(",")]
    mb = args.mb if args.mb else max(256.0, 4 * llc_bytes() / 1e6)
    paths = args.paths.split(",")
    k = args.k
    x = rng.standard_normal(k, dtype=np.float32)
    X = rng.standard_normal((args.n, k), dtype=np.float32)
    print(f"kernel paths: {paths}   (available: {K.available_paths()}), k={k}, matvec ~{mb:.0f} MB, "
          f"matmat n={args.n}" + (f", matvec over {args.cold_rows}-row matrices read cold" if args.cold_rows else ""))
    hdr = f"{'type':7} {'path':12} {'matvec GB/s':>12} {'% of 30GB/s':>11} {'prepare us':>10} {'matmat GFLOP/s':>15}"
    print(hdr)
    print("-" * len(hdr))
    for t in types:
        x8 = t in FILE_TYPE   # a packed layout (whole 8-row groups)
        base = FILE_TYPE.get(t, t)
        rb = K.row_bytes(base, k)
        step = 8 if x8 else args.rows_multiple
        rows = max(64, int(mb * 1e6 / rb)) // step * step
        w = weights(t, rows, k, rng)
        out = np.empty(rows, np.float32)
        mrows = max(16, int(0.5e6 / rb)) // step * step  # ~0.5 MB: stays in L2 across batch columns
        wm = w[:mrows]
        outm = np.empty((args.n, mrows), np.float32)
        for p in paths:
            K.set_kernel_path(p)
            if x8 and K.packed_type(base) != t:  # no such layout there: the engine keeps the file's
                continue
            xp = K.prepare(base, x)
            if args.cold_rows:
                r = max(step, args.cold_rows // step * step)
                order = rng.permutation(rows // r)
                mats = [w[i * r:(i + 1) * r] for i in order]

                def run_cold():
                    for m in mats:
                        K.matvec(t, m, xp, out, 0, r)
                sec = bench(run_cold, 1.0) * rows / (len(mats) * r)
            else:
                sec = bench(lambda: K.matvec(t, w, xp, out, 0, rows), 1.0)
            gbs = w.nbytes / sec / 1e9
            tp = bench(lambda: K.prepare(base, x), 0.05)
            gf = float("nan")
            if not args.no_matmat:
                Xp = K.prepare(base, X)
                sm = bench(lambda: K.matmat(t, wm, Xp, outm, 0, mrows), 0.2, 2)
                gf = 2.0 * mrows * k * args.n / sm / 1e9
            print(f"{K.TYPE_NAMES[t]:7} {p:12} {gbs:12.1f} {100 * gbs / ONE_CORE_GBS:10.0f}% "
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

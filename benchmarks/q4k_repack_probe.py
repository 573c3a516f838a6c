"""Would repacking Q4_K weights pay off? The gemv over the 8-row interleaved layout
(`kernels/x86/k4_x8.py`, the layout the engine keeps experts in on the AVX-512 VNNI path) against
the kernel on the file's layout (a benchmark, not a test).

Today's one-token Q4_K kernel (`kernels/x86/k4_rows.py`) reads GGUF's own layout: per row and
super-block it unpacks the 6-bit scales, broadcasts each sub-block's scale with a shuffle and
reduces the row's lanes, ~60 vector instructions per 144-byte block: one core tops out near 26 GB/s
even in cache. llama.cpp repacks Q4_K on x86 into blocks of 8 rows; `k4_x8` does the same in place
(same size, see its docstring) and computes 8 rows per i32 vector with the activations as broadcast
operands. The outputs are bit-identical (checked below).

    python3 benchmarks/q4k_repack_probe.py [--k 1024] [--mb 96] [-r 5]

AMD EPYC (Zen 4) 2026-12-01 20:43 UTC, K=1024, one core, best of 5: in cache (0.25 MB) 26.2 -> 39.6
GB/s, from memory (96 MB) 23.7 -> 27.6 GB/s (the probe's streaming read: 27.7).

AMD EPYC without AVX-512 (avx2 path) 2026-12-03 08:00 UTC, K=1024: in cache 7.0 -> 7.3 GB/s, from
memory 7.0-7.2 -> 4.8-6.9 GB/s over a dozen processes (the GGUF layout steady, the packed one not;
prefetching every line of the packed records did not steady it): `engine/packing.py` packs only on
the AVX-512 VNNI path by default.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workbench.engine import kernels as K  # noqa: E402
from workbench.engine.kernels.x86 import MODES  # noqa: E402
from workbench.engine.kernels.x86 import k4_rows, k4_x8  # noqa: E402


def q4k_matrix(rows: int, k: int, rng) -> np.ndarray:
    w = rng.integers(0, 256, (rows, k // 256 * 144), dtype=np.uint8)
    for b in range(k // 256):  # finite, small d and dmin
        w[:, b * 144:b * 144 + 4] = np.frombuffer(np.float16([0.01, 0.001]).tobytes(), np.uint8)
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=1024, help="row length (multiple of 256)")
    ap.add_argument("--mb", type=float, default=96.0, help="size of the from-memory matrix")
    ap.add_argument("-r", type=int, default=5, help="timed rounds (best is reported)")
    a = ap.parse_args()
    if K.kernel_path() not in MODES:
        sys.exit(f"the packed gemv needs an x86 SIMD kernel path (here: {K.kernel_path()})")
    mode = MODES[K.kernel_path()]
    rng = np.random.default_rng(0)
    xp = K.prepare(K.Q4_K, rng.standard_normal(a.k).astype(np.float32))
    plain = k4_rows.q4_K_gemv_rows8(mode)
    gemv_x8 = k4_x8.gemv_x8(mode)
    print(f"{os.uname().machine}, kernel path {K.kernel_path()}, K={a.k}, one thread; GGUF bytes per second (both layouts are the same size)")
    for mb, reps in ((0.25, 3000), (a.mb, 12)):
        rows = max(8, int(mb * 1e6 / (a.k // 256 * 144)) // 8 * 8)
        w = q4k_matrix(rows, a.k, rng)
        wp = w.copy()
        k4_x8.repack_rows(wp, 0, rows)
        oa, ob = np.empty(rows, np.float32), np.empty(rows, np.float32)
        plain(w, xp, oa, 0, rows)
        gemv_x8(wp, xp, ob, 0, rows)
        if not np.array_equal(oa, ob):
            sys.exit("the repacked kernel's outputs differ from the current kernel's")
        ta, tb = [], []
        for _ in range(a.r):
            for f, m, o, tl in ((plain, w, oa, ta), (gemv_x8, wp, ob, tb)):
                t = time.perf_counter()
                for _ in range(reps):
                    f(m, xp, o, 0, rows)
                tl.append((time.perf_counter() - t) / reps)
        where = "in cache" if mb < 1 else "from memory"
        print(f"{mb:g} MB {where}: GGUF layout (today) {w.nbytes / min(ta) / 1e9:.1f} GB/s, "
              f"8-row repacked {w.nbytes / min(tb) / 1e9:.1f} GB/s; outputs bit-identical")


if __name__ == "__main__":
    main()

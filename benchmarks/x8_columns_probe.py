"""The crew's choice for a span of inputs over one Q4_K_x8 weight (`engine/crew.py`, `run_chunk`):
the one-token gemv per input, or `kernels.x8_columns_kernel`'s 4 inputs a weight load.

    python3 benchmarks/x8_columns_probe.py [--rows 256] [--k 256] [--experts 1024] [--tile 112]

Many copies of one matrix (so each is read from memory, as a server pass reads its weights), each
run in row tiles of `--tile` rows as the crew runs them, for 2 .. 8 inputs: microseconds a matrix,
best of several rounds, one core, from memory and (one matrix again and again) from cache.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "engine")]

from gguf import GGMLQuantizationType as T  # noqa: E402

from attention_kernel_bench import cpu  # noqa: E402
from kernel_emulation import weights  # noqa: E402
from workbench.engine import kernels as K  # noqa: E402
from workbench.engine.kernels import llvm_ir  # noqa: E402
from workbench.engine.kernels.x86 import k4_x8  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--experts", type=int, default=1024, help="copies of the matrix (more than the caches hold)")
    ap.add_argument("--tile", type=int, default=112, help="rows a tile (the crew: 16 KB of rows, at least 16)")
    a = ap.parse_args()
    mode = llvm_ir.VNNI if K.kernel_path() == "avx512-vnni" else llvm_ir.AVX2
    w0 = weights(T.Q4_K, a.rows, a.k, seed=1)
    k4_x8.repack_rows(w0, 0, a.rows)
    many = np.stack([w0] * a.experts)
    gemv, cols = k4_x8.gemv_x8(mode), k4_x8.columns_kernel(mode)
    xq, xd, xb = K.prepare(int(T.Q4_K), np.random.default_rng(0).standard_normal((8, a.k)).astype(np.float32))
    xu = xq.view(np.uint8)
    out = np.zeros((8, a.rows), np.float32)
    evict = np.zeros(64 << 20, np.uint8)

    @numba.njit
    def run(ws, xq, xu, xd, xb, out, n, quads, rows, tile):
        for e in range(ws.shape[0]):
            w = ws[e]
            for r0 in range(0, rows, tile):
                r1 = min(r0 + tile, rows)
                c = 0
                while quads and c + 3 <= n:
                    a0, a1, a2, a3 = c, c + 1, c + 2, min(c + 3, n - 1)
                    cols(w, (xu[a0], xu[a1], xu[a2], xu[a3]), (xd[a0], xd[a1], xd[a2], xd[a3]),
                         (xb[a0], xb[a1], xb[a2], xb[a3]), (out[a0], out[a1], out[a2], out[a3]), r0, r1, True)
                    c += 4
                for j in range(c, n):
                    gemv(w, (xq[j], xd[j], xb[j]), out[j], r0, r1)

    def best(ws, n, quads, rounds, cold):
        t = float("inf")
        for _ in range(rounds):
            if cold:
                evict[::64] += 1
            t0 = time.perf_counter()
            run(ws, xq, xu, xd, xb, out, n, quads, a.rows, a.tile)
            t = min(t, time.perf_counter() - t0)
        return t / ws.shape[0] * 1e6

    run(many[:1], xq, xu, xd, xb, out, 4, True, a.rows, a.tile)
    print(f"{cpu()}; {a.rows} x {a.k} Q4_K_x8, {a.tile}-row tiles, one core, us a matrix\n")
    print("| inputs | gemvs, from memory | quads, from memory | gemvs, in cache | quads, in cache |")
    print("|---:|---:|---:|---:|---:|")
    for n in (2, 3, 4, 6, 8):
        r = [best(many, n, False, 7, True), best(many, n, True, 7, True),
             best(many[:1], n, False, 50, False), best(many[:1], n, True, 50, False)]
        print(f"| {n} | " + " | ".join(f"{v:.2f}" for v in r) + " |")


if __name__ == "__main__":
    main()

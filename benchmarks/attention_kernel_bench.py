"""The one-token attention kernel alone (`kernels.f16_heads`): GFLOP/s a core on the seeds' widths
(a benchmark, not a test).

    python3 benchmarks/attention_kernel_bench.py [--positions 1024,16384] [--heads 8,16,128] [-r 20]

Key rows of R1's MLA cache (576 f16: latent 512 + rotary 64) and of the narrow R1-shape file (192),
against `--heads` f16-rounded queries, over `--positions` rows: the scores of one block of a decoded
token at that depth on one core. The rows are in memory once (a cache of 61 blocks' worth is cycled
through), as a decode reads them after the token's weights went through the caches.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workbench.engine import kernels  # noqa: E402


def cpu() -> str:
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    info.setdefault(k.strip(), v.strip())
    except OSError:
        return platform.processor()
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--positions", default="1024,16384")
    ap.add_argument("--heads", default="8,16,128")
    ap.add_argument("--widths", default="192,576")
    ap.add_argument("-r", type=int, default=10)
    a = ap.parse_args()
    print(f"{cpu()}, kernels {kernels.kernel_path()}")
    print("| width | heads | positions | us a block | GFLOP/s |")
    print("|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for width in (int(w) for w in a.widths.split(",")):
        for n in (int(p) for p in a.positions.split(",")):
            copies = max(2, min(61, (256 << 20) // (n * width * 2)))   # cycle through ~256 MB of keys
            ws = [rng.standard_normal((n, width)).astype(np.float16).view(np.uint8).reshape(n, -1)
                  for _ in range(copies)]
            for nh in (int(h) for h in a.heads.split(",")):
                x = rng.standard_normal(nh * width).astype(np.float16).astype(np.float32)
                out = np.empty(nh * n, dtype=np.float32)
                kernels.f16_heads(ws[0], x, width, width, nh, out, n, 0, n)
                best = float("inf")
                for _ in range(a.r):
                    t = time.perf_counter()
                    for w in ws:
                        kernels.f16_heads(w, x, width, width, nh, out, n, 0, n)
                    best = min(best, (time.perf_counter() - t) / len(ws))
                print(f"| {width} | {nh} | {n} | {best * 1e6:.0f} | {2 * width * nh * n / best / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()

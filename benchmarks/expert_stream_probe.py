"""How fast the threads can stream randomly placed expert-sized pieces against one long stream
(a benchmark, not a test).

    python3 benchmarks/expert_stream_probe.py [-t 2] [--piece-kb 432] [--pieces 2000] [--mb 1300]

A decoded MoE token reads its k routed experts' matrices: pieces of a few hundred KB at random
places in a GB-sized tensor. This sums (vectorized, as the bandwidth probe) `--pieces` random
pieces per run, split between the threads two ways -- whole pieces dealt in turn, or every piece
in halves (as the crew's owned chunks) -- and, for reference, the whole array in one contiguous
part per thread. Median and best GB/s of the runs.

AMD EPYC VM, 2 threads, 432 KB pieces (a 768 x 1024 Q4_K expert matrix), 2026-12-02: random
pieces 35.8-37.5 GB/s median (best 40-43), contiguous halves 41.3 (best 44.0); the decode's
gate/up job measured 33-35 GB/s in `crew_timeline.py` the same hour.
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import prange


@numba.njit(parallel=True, nogil=True)
def _whole_pieces(a, offs, size, nt):
    s = np.zeros(nt, np.uint64)
    per = (offs.shape[0] + nt - 1) // nt
    for t in prange(nt):
        acc = np.uint64(0)
        for i in range(t * per, min((t + 1) * per, offs.shape[0])):
            for x in a[offs[i]:offs[i] + size]:
                acc += x
        s[t] = acc
    return s.sum()


@numba.njit(parallel=True, nogil=True)
def _halves(a, offs, size, nt):
    s = np.zeros(nt, np.uint64)
    h = size // nt
    for t in prange(nt):
        acc = np.uint64(0)
        for i in range(offs.shape[0]):
            o = offs[i] + t * h
            for x in a[o:o + h]:
                acc += x
        s[t] = acc
    return s.sum()


@numba.njit(parallel=True, nogil=True)
def _contiguous(a, nt):
    s = np.zeros(nt, np.uint64)
    per = a.shape[0] // nt
    for t in prange(nt):
        acc = np.uint64(0)
        for x in a[t * per:(t + 1) * per]:
            acc += x
        s[t] = acc
    return s.sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--piece-kb", type=int, default=432)
    ap.add_argument("--pieces", type=int, default=2000)
    ap.add_argument("--mb", type=int, default=1300, help="array size (MB)")
    ap.add_argument("-r", "--reps", type=int, default=15)
    a = ap.parse_args()
    numba.set_num_threads(a.threads)
    arr = np.ones((a.mb << 20) // 8, np.uint64)
    size = (a.piece_kb << 10) // 8 // a.threads * a.threads
    rng = np.random.default_rng(0)
    for name, fn in (("whole pieces dealt in turn", _whole_pieces), ("every piece in halves", _halves)):
        rates = []
        for _ in range(a.reps + 1):
            offs = rng.integers(0, arr.shape[0] - size, a.pieces) // 8 * 8
            t0 = time.perf_counter()
            fn(arr, offs, size, a.threads)
            rates.append(a.pieces * size * 8 / (time.perf_counter() - t0) / 1e9)
        rates = rates[1:]  # the first run compiles
        print(f"{a.pieces} random {a.piece_kb} KB pieces, {name}: median {np.median(rates):.1f} GB/s, "
              f"best {max(rates):.1f}")
    _contiguous(arr, a.threads)
    rates = []
    for _ in range(max(a.reps // 3, 3)):
        t0 = time.perf_counter()
        _contiguous(arr, a.threads)
        rates.append(arr.nbytes / (time.perf_counter() - t0) / 1e9)
    print(f"one contiguous part per thread ({a.mb} MB): median {np.median(rates):.1f} GB/s, best {max(rates):.1f}")


if __name__ == "__main__":
    main()

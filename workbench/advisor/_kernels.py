"""The probe's compiled loops (Numba): a streaming read and a pointer chase.

Kept apart so that importing the advisor (e.g. to advise for a fixture machine) never compiles.
"""
from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(nogil=True, cache=True)
def stream_sum(a: np.ndarray) -> np.uint64:
    """Read every 8-byte word of ``a`` once (LLVM vectorizes this reduction with several
    accumulators, so many loads stay in flight: measured 28 GB/s on one core here, where an
    indexed loop with four hand-made sums reached 17-22)."""
    s = np.uint64(0)
    for x in a:
        s += x
    return s


@nb.njit(nogil=True, cache=True)
def chase(nxt: np.ndarray, start: int, steps: int) -> int:  # nxt: int64
    """Follow ``steps`` dependent loads through ``nxt`` (each load's address is the last one's value)."""
    i = start
    for _ in range(steps):
        i = nxt[i]
    return i

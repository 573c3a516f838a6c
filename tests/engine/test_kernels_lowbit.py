"""The grouped-rows matvec of Q2_K, Q3_K, Q4_0, IQ4_NL, IQ4_XS (kernels/x86/rows_lowbit.py) against the
per-row kernels of the family modules: bit-identical for every row count and row range (whole groups,
the per-row tail, both float orders of the types whose order depends on rows % 8), on every SIMD path."""
from __future__ import annotations

import numpy as np
import pytest

from kernel_emulation import SIMD_PATHS
from workbench.engine import kernels as K
from workbench.engine.kernels import x86

pytestmark = pytest.mark.skipif(not SIMD_PATHS, reason="no SIMD kernel path on this CPU")

# type name -> (ggml id, block elements, block bytes, byte offsets of f16 fields and their ranges)
TYPES = {
    "Q4_0": (K.Q4_0, 32, 18, ((0, 1e-3, 2e-2),)),
    "IQ4_NL": (K.IQ4_NL, 32, 18, ((0, 1e-3, 2e-2),)),
    "IQ4_XS": (K.IQ4_XS, 256, 136, ((0, 1e-4, 2e-3),)),
    "Q3_K": (K.Q3_K, 256, 110, ((108, 1e-4, 2e-3),)),
    "Q2_K": (K.Q2_K, 256, 84, ((80, 1e-3, 2e-2), (82, 1e-4, 5e-3))),
}
ROW_COUNTS = list(range(1, 41))


def random_weights(name: str, rows: int, k: int, seed: int) -> np.ndarray:
    """Any quant bytes, finite scales of both signs (so no lane sum is special)."""
    _, bs, ts, fields = TYPES[name]
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (rows, k // bs, ts), dtype=np.uint8)
    for off, lo, hi in fields:
        v = rng.uniform(lo, hi, (rows, k // bs, 1)) * rng.choice([-1.0, 1.0], (rows, k // bs, 1))
        w[..., off:off + 2] = v.astype(np.float16).view(np.uint8)
    return w.reshape(rows, -1)


def per_row_matvec(path: str, name: str):
    """The family module's (per-row) matvec of a type on a path: the reference."""
    mode = x86.MODES[path]
    family = x86.legacy_quants if name == "Q4_0" else x86.i_quants if name.startswith("IQ") else x86.k_quants
    return family.kernels(mode)[name][0]


def ranges(rows: int) -> list[tuple[int, int]]:
    out = {(0, rows), (min(1, rows), rows), (0, max(rows - 3, 0)), (min(3, rows), max(rows - 2, min(3, rows)))}
    return sorted(r for r in out if r[0] <= r[1])


@pytest.mark.parametrize("name", list(TYPES))
def test_grouped_rows_bit_identical(path, name):
    t, bs, _, _ = TYPES[name]
    mv_new = x86.tables(path)[0][t]
    mv_old = per_row_matvec(path, name)
    ks = (32, 96, 352, 1024) if bs == 32 else (256, 768, 2048)
    rng = np.random.default_rng(42)
    checked = 0
    for k in ks:
        x = (rng.standard_normal(k) * rng.uniform(0.1, 10.0)).astype(np.float32)
        xp = K.prepare(t, x)
        for rows in ROW_COUNTS:
            w = random_weights(name, rows, k, seed=rows * 1000 + k)
            for r0, r1 in ranges(rows):
                a = np.full(rows, np.nan, np.float32)
                b = np.full(rows, np.nan, np.float32)
                mv_new(w, xp, a, r0, r1)
                mv_old(w, xp, b, r0, r1)
                assert np.isnan(a[:r0]).all() and np.isnan(a[r1:]).all(), (name, path, rows, k, r0, r1)
                assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (name, path, rows, k, r0, r1)
                checked += 1
    assert checked > 300


@pytest.mark.parametrize("name", ["Q4_0", "IQ4_NL", "Q2_K"])
def test_grouped_rows_large_k_and_row_offsets(path, name):
    """Many super-blocks (long FMA chains) and a row range starting mid-matrix in the grouped part."""
    t, bs, _, _ = TYPES[name]
    k = 256 * 23
    rows = 64
    w = random_weights(name, rows, k, seed=7)
    rng = np.random.default_rng(3)
    xp = K.prepare(t, rng.standard_normal(k).astype(np.float32))
    mv_new = x86.tables(path)[0][t]
    mv_old = per_row_matvec(path, name)
    for r0, r1 in ((0, 64), (5, 61), (8, 56), (13, 14)):
        a = np.zeros(rows, np.float32)
        b = np.zeros(rows, np.float32)
        mv_new(w, xp, a, r0, r1)
        mv_old(w, xp, b, r0, r1)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (r0, r1)


def test_public_matvec_uses_grouped_rows(path):
    """kernels.matvec dispatches these types to the grouped-rows functions."""
    from workbench.engine.kernels.x86 import rows_lowbit
    for name, (t, *_rest) in TYPES.items():
        fn = K.matvec_kernels([t])[t]
        assert fn.py_func.__module__ == rows_lowbit.__name__, name

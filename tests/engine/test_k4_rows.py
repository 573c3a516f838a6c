"""The Q4_K one-token product over groups of 8 rows (kernels/x86/k4_rows.py) is bit-identical to the
per-row gemv (ggml_gemv_q4_K_8x8_q8_K's order) for any row range and row length of a matrix llama.cpp
repacks (rows % 8 == 0); other matrices keep ggml_vec_dot_q4_K_q8_K's order in every row."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kernel_emulation import SIMD_PATHS, emulate_k4_vec, emulate_q4_K, f32, weights
from workbench.engine import kernels as K
from workbench.engine.kernels import x86
from workbench.engine.kernels.x86 import k4_rows

pytestmark = pytest.mark.skipif(not SIMD_PATHS, reason="no SIMD kernel path on this CPU")
Q4_K = int(T.Q4_K)


def _x(k, seed, extreme=False):
    rng = np.random.default_rng(seed)
    if extreme:   # every activation at +-max: quants +-127, bsums +-32*127 (the i16 limits of the kernel)
        return np.where(rng.random(k) < 0.9, 1.0, -1.0).astype(f32) * f32(3.0)
    return rng.standard_normal(k).astype(f32)


def _per_row(w, xp, r0, r1):
    """The per-row kernel: the gemv columns of matmat with one column (q4_K_gemv_rows, row by row)."""
    out = np.full((1, w.shape[0]), np.nan, f32)
    K.matmat(Q4_K, w, tuple(a[None] for a in xp), out, r0, r1)
    return out[0]


def _saturated(rows, k, seed):
    """Q4_K rows with every quant 15 and every 6-bit scale and min 63 (the largest integer sums)."""
    w = weights(T.Q4_K, rows, k, seed).reshape(rows, -1, 144)
    w[..., 4:16] = 0xFF
    w[..., 16:] = 0xFF
    return np.ascontiguousarray(w.reshape(rows, -1))


@pytest.mark.parametrize("k", [256, 512, 1280, 4096])
def test_matvec_rows_1_to_40(path, k):
    """Every row count 1..40 (groups of 8 plus a per-row tail) against the per-row kernel and the
    NumPy emulation of llama.cpp's gemv order."""
    w = weights(T.Q4_K, 40, k, seed=k)
    xp = K.prepare(Q4_K, _x(k, k))
    ref = emulate_q4_K(w, xp[0][None], xp[1][None], 0)[0]
    for rows in range(1, 41):
        wr = np.ascontiguousarray(w[:rows])
        out = np.full(rows, np.nan, f32)
        K.matvec(Q4_K, wr, xp, out, 0, rows)
        np.testing.assert_array_equal(out, _per_row(wr, xp, 0, rows), err_msg=f"rows={rows}")
        if rows % 8 == 0:  # repacked by llama.cpp: the gemv's order
            np.testing.assert_array_equal(out, ref[:rows], err_msg=f"rows={rows}")
        else:  # not repacked: vec_dot's order
            vec = emulate_k4_vec(wr, xp[0][None], xp[1][None])[0]
            np.testing.assert_array_equal(out, vec, err_msg=f"rows={rows}")


@pytest.mark.parametrize("k", [256, 768, 2048])
def test_matvec_row_ranges(path, k):
    """Ranges r0..r1 that start and end off the multiples of 8 (threads split the rows anywhere)."""
    rows = 48  # a repacked matrix: the 8-row groups and the per-row tail of a range both run
    w = weights(T.Q4_K, rows, k, seed=3 + k)
    xp = K.prepare(Q4_K, _x(k, 7))
    full = _per_row(w, xp, 0, rows)
    rng = np.random.default_rng(k)
    cuts = [(0, 48), (1, 9), (3, 30), (5, 13), (7, 44), (9, 10), (12, 45), (17, 41)]
    cuts += [tuple(sorted(rng.integers(0, rows + 1, 2))) for _ in range(8)]
    for r0, r1 in cuts:
        out = np.full(rows, np.nan, f32)
        K.matvec(Q4_K, w, xp, out, r0, r1)
        np.testing.assert_array_equal(out[r0:r1], full[r0:r1], err_msg=f"rows {r0}..{r1}")
        assert np.isnan(out[:r0]).all() and np.isnan(out[r1:]).all(), "wrote outside its row range"


@pytest.mark.parametrize("k", [256, 1024])
def test_matvec_integer_extremes(path, k):
    """The largest integer sums (quants 15, scales and mins 63, activations +-127) stay exact."""
    rows = 24
    w = _saturated(rows, k, seed=11)
    for extreme in (True, False):
        xp = K.prepare(Q4_K, _x(k, 5, extreme))
        out = np.full(rows, np.nan, f32)
        K.matvec(Q4_K, w, xp, out, 0, rows)
        np.testing.assert_array_equal(out, _per_row(w, xp, 0, rows))
        np.testing.assert_array_equal(out, emulate_q4_K(w, xp[0][None], xp[1][None], 0)[0])


def test_rows8_kernel_alone(path):
    """The 8-row kernel by itself (no per-row tail) on a row range inside a larger matrix."""
    k, rows = 1536, 40
    w = weights(T.Q4_K, rows, k, seed=21)
    xp = K.prepare(Q4_K, _x(k, 22))
    fn = k4_rows.q4_K_gemv_rows8(x86.MODES[path])
    out = np.full(rows, np.nan, f32)
    fn(w, xp, out, 5, 29)
    np.testing.assert_array_equal(out[5:29], _per_row(w, xp, 5, 29)[5:29])
    assert np.isnan(out[:5]).all() and np.isnan(out[29:]).all()

"""Bit-exactness of the prefill (matmat) kernels on shapes that reach every tiling path.

test_kernels_exact.py checks the float operation orders on 13 rows split at row 7; here the row
ranges are large enough for the rows-in-lanes paths (groups of 8 rows, Q4_K / Q6_K), the 2 x 8
register tiles (Q4_0 / Q5_0, and Q8_0 on AVX-512) and the 3 x 4 tiles of F16, with split points that leave partial
groups and tiles on both sides, and column counts around the tile widths.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from workbench.engine import kernels as K

from kernel_emulation import SIMD_PATHS, activations, emulate, tinyblas_float, weights  # noqa: F401
from workbench.engine.kernels.llama_build import WIDE

pytestmark = pytest.mark.skipif(not SIMD_PATHS, reason="no SIMD kernel path on this CPU")

ROWS = 43
SPLITS = [(0, ROWS), (0, 19), (19, ROWS)]  # (0, 19): two groups of 8 + 3; (19, 43): three of 8


def _matmat_split(t, w, xp, n, splits):
    out = np.full((n, w.shape[0]), np.nan, np.float32)
    for r0, r1 in splits:
        K.matmat(int(t), w, xp, out, r0, r1)
    return out


@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K])
@pytest.mark.parametrize("n", [3, 4, 8, 9, 12, 17, 32, 37])  # Q4_K/Q6_K regroup rows from 32 columns
def test_quant_matmat_tiles(path, t, n):
    w = weights(t, rows=ROWS)
    xp = K.prepare(int(t), activations(n))
    ref = emulate(t, w, xp, n)
    np.testing.assert_array_equal(_matmat_split(t, w, xp, n, SPLITS[:1]), ref)
    np.testing.assert_array_equal(_matmat_split(t, w, xp, n, SPLITS[1:]), ref)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 11])
@pytest.mark.parametrize("k", [64, 256])
def test_f16_matmat_tiles(path, n, k):
    rng = np.random.default_rng(n + k)
    w16 = rng.standard_normal((ROWS, k)).astype(np.float16)
    x = rng.standard_normal((n, k)).astype(np.float32)
    xp = K.prepare(int(T.F16), x)
    ref = tinyblas_float(w16.astype(np.float32), xp[0], WIDE)  # this host's llama.cpp build
    w = w16.view(np.uint8).reshape(ROWS, -1)
    np.testing.assert_array_equal(_matmat_split(T.F16, w, xp, n, SPLITS[:1]), ref)
    np.testing.assert_array_equal(_matmat_split(T.F16, w, xp, n, SPLITS[1:]), ref)

"""Q5_0 in the row-pair layout (kernels/x86/q5_pairs.py, internal type Q5_0_x2): the repack is
lossless and every product over it gives llama.cpp's Q5_0 numbers to the bit (against the NumPy
emulation of ggml_vec_dot_q5_0_q8_0's order and the file layout's kernels), for ranges with odd
ends, for every column count a prompt product takes, and at the integer extremes."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kernel_emulation import emulate_legacy, f32, packed, random_activations, weights
from workbench.engine import kernels as K

pytestmark = pytest.mark.skipif(K.packed_type(K.Q5_0) is None,
                                reason="the active kernel path keeps Q5_0 in the file's layout")
Q5_0 = int(T.Q5_0)


@pytest.mark.parametrize("k", [256, 640, 2048])
def test_one_token_product_is_ggml_order(k):
    rows = 46
    w = weights(T.Q5_0, rows, k, seed=3 + k)
    w2 = packed(K.Q5_0_X2, w)
    for seed, extreme in ((1, False), (2, True)):
        xp = K.prepare(Q5_0, random_activations(1, k, seed, extreme)[0])
        ref = emulate_legacy(T.Q5_0, w, xp[0][None], xp[1][None])[0]
        for r0, r1 in [(0, rows), (3, 45), (8, 9), (44, 46), (6, 6)]:
            out = np.full(rows, np.nan, f32)
            K.matvec(K.Q5_0_X2, w2, xp, out, r0, r1)
            np.testing.assert_array_equal(out[r0:r1], ref[r0:r1], err_msg=f"rows {r0}..{r1}")
            assert np.isnan(out[:r0]).all() and np.isnan(out[r1:]).all()


@pytest.mark.parametrize("n", [1, 5, 7, 8, 9, 16, 21])
def test_prompt_product_equals_the_file_layout(n):
    """Below 8 columns the one-token product per column, from 8 the Q5_0 tiles reading each row's
    blocks from its pair (ranges with odd ends: a tile's two rows from two pairs)."""
    rows, k = 38, 640
    w = weights(T.Q5_0, rows, k, seed=n)
    w2 = packed(K.Q5_0_X2, w)
    xp = K.prepare(Q5_0, random_activations(n, k, 10 + n, extreme=n == 9))
    for r0, r1 in [(0, rows), (1, 37), (3, 6), (10, 12), (13, 30)]:
        want = np.full((n, rows), np.nan, f32)
        got = want.copy()
        K.matmat(Q5_0, w, xp, want, r0, r1)
        K.matmat(K.Q5_0_X2, w2, xp, got, r0, r1)
        np.testing.assert_array_equal(got, want, err_msg=f"rows {r0}..{r1}")
    ids = np.zeros((n, rows), f32)
    K.mul_mat_id_kernel(K.Q5_0_X2)(w2, xp, ids, 0, rows, rows)
    K.matmat(Q5_0, w, xp, want, 0, rows)
    np.testing.assert_array_equal(ids, want)


def test_dequantized_rows_equal_the_file_layout():
    w = weights(T.Q5_0, 20, 512, seed=7)
    w2 = packed(K.Q5_0_X2, w)
    for r0, r1 in [(0, 20), (3, 4), (5, 18)]:
        np.testing.assert_array_equal(K.dequantize_rows(K.Q5_0_X2, w2, r0, r1), K.dequantize_rows(Q5_0, w, r0, r1))

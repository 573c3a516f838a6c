"""Q8_0 in the row-pair layout (kernels/x86/q8_pairs.py, internal type Q8_0_x2): the one-token
product gives llama.cpp's Q8_0 numbers to the bit (against the NumPy emulation of
ggml_vec_dot_q8_0_q8_0's order and the file layout's kernel) for ranges with odd ends and at the
integer extremes; its rows are looked up (a tied output matrix is the token embedding) as the
file's. The repack round trip and the prompt and batch products of both row-pair layouts are in
test_packing.py."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kernel_emulation import emulate_legacy, f32, packed, random_activations, weights
from workbench.engine import kernels as K

pytestmark = pytest.mark.skipif(K.packed_type(K.Q8_0) is None,
                                reason="the active kernel path keeps Q8_0 in the file's layout")
Q8_0 = int(T.Q8_0)


def _extreme(w):
    """Every quant at -128, -127 or 127 (-128 is a valid weight byte; activations stop at -127)."""
    w = w.copy()
    nb = w.shape[1] // 34
    q = w.reshape(w.shape[0], nb, 34)[:, :, 2:]
    q[:] = np.array([128, 129, 127], np.uint8)[np.arange(q.size).reshape(q.shape) % 3]
    return w


@pytest.mark.parametrize("k", [256, 640, 2048])
def test_one_token_product_is_ggml_order(k):
    rows = 46
    for w in (weights(T.Q8_0, rows, k, seed=3 + k), _extreme(weights(T.Q8_0, rows, k, seed=4))):
        w2 = packed(K.Q8_0_X2, w)
        for seed, extreme in ((1, False), (2, True)):
            xp = K.prepare(Q8_0, random_activations(1, k, seed, extreme)[0])
            ref = emulate_legacy(T.Q8_0, w, xp[0][None], xp[1][None])[0]
            file = np.empty(rows, f32)
            K.matvec(Q8_0, w, xp, file, 0, rows)
            np.testing.assert_array_equal(file, ref)
            for r0, r1 in [(0, rows), (3, 45), (8, 9), (44, 46), (6, 6)]:
                out = np.full(rows, np.nan, f32)
                K.matvec(K.Q8_0_X2, w2, xp, out, r0, r1)
                np.testing.assert_array_equal(out[r0:r1], ref[r0:r1], err_msg=f"rows {r0}..{r1}")
                assert np.isnan(out[:r0]).all() and np.isnan(out[r1:]).all()


def test_rows_are_looked_up_as_the_file_layout():
    """A tied output matrix kept in pairs is the token embedding: its rows dequantize to the file
    layout's numbers, through the compiled lookup a token's call uses too."""
    w = weights(T.Q8_0, 20, 512, seed=7)
    w2 = packed(K.Q8_0_X2, w)
    lookup = K.dequantizer(K.Q8_0_X2)
    assert lookup is not None
    for r0, r1 in [(0, 20), (3, 4), (5, 18), (18, 20)]:
        want = K.dequantize_rows(Q8_0, w, r0, r1)
        np.testing.assert_array_equal(K.dequantize_rows(K.Q8_0_X2, w2, r0, r1), want)
        np.testing.assert_array_equal(lookup(w2, r0, r1), want)

"""Q5_0 in the row-pair layout (kernels/x86/q5_pairs.py, internal type Q5_0_x2): the one-token
product gives llama.cpp's Q5_0 numbers to the bit (against the NumPy emulation of
ggml_vec_dot_q5_0_q8_0's order) for ranges with odd ends and at the integer extremes; its rows
dequantize as the file's. The repack round trip and the prompt and batch products of both
row-pair layouts are in test_packing.py."""
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


def test_dequantized_rows_equal_the_file_layout():
    w = weights(T.Q5_0, 20, 512, seed=7)
    w2 = packed(K.Q5_0_X2, w)
    for r0, r1 in [(0, 20), (3, 4), (5, 18)]:
        np.testing.assert_array_equal(K.dequantize_rows(K.Q5_0_X2, w2, r0, r1), K.dequantize_rows(Q5_0, w, r0, r1))


@pytest.mark.parametrize("variant", ["pair_step_gfni", "pair_step_shift"])
def test_both_nibble_steps_are_ggml_order(variant):
    """The step the CPU does not use is built and checked too (GFNI where the CPU has it; the shift
    and mask of CPUs without it everywhere), so a fresh machine of either kind runs tested code."""
    from workbench.engine.kernels.x86 import blocks, q5_pairs as Q
    if variant == "pair_step_gfni" and not Q.GFNI:
        pytest.skip("this CPU has no GFNI")
    matvec, _ = blocks.pair_matvec(Q.PAIR, getattr(Q, variant), Q.row_lanes, Q._pair_inputs, 64, 16)
    k, rows = 640, 22
    w = weights(T.Q5_0, rows, k, seed=11)
    w2 = packed(K.Q5_0_X2, w)
    xp = K.prepare(Q5_0, random_activations(1, k, 5, True)[0])
    ref = emulate_legacy(T.Q5_0, w, xp[0][None], xp[1][None])[0]
    out = np.full(rows, np.nan, f32)
    matvec(w2, xp, out, 1, rows)
    np.testing.assert_array_equal(out[1:], ref[1:])

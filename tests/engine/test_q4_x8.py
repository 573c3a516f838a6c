"""Q4_0 and IQ4_NL kept in 8-row groups (kernels/x86/q4_x8.py, internal types Q4_0_x8 and IQ4_NL_x8):
the one-token and prompt products give llama.cpp's repacked-gemv numbers to the bit (against a NumPy
emulation of ggml_gemv_q4_0_8x8_q8_0's order and the file layout's kernel) for ranges that cut
groups, any column count and the integer extremes; both ways of taking the high nibbles out (GFNI,
shift and mask) are built and checked; rows are looked up as the file's; the layout moves whole
groups and back."""
from __future__ import annotations

import numpy as np
import pytest

from kernel_emulation import emulate_q4_0_repacked, f32, fma32, packed, random_activations
from workbench.engine import kernels as K
from workbench.engine import packing

pytestmark = pytest.mark.skipif(K.packed_type(K.Q4_0) is None,
                                reason="the active kernel path keeps Q4_0 in the file's layout")
LAYOUTS = {K.Q4_0: K.Q4_0_X8, K.IQ4_NL: K.IQ4_NL_X8}
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int64)


def random_weights(rows: int, k: int, seed: int, extreme: bool = False) -> np.ndarray:
    """Any quant bytes (extreme: every nibble 0 or 15), finite scales of both signs."""
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (rows, k // 32, 18), dtype=np.uint8)
    if extreme:
        w[..., 2:] = np.array([0x00, 0xFF, 0x0F, 0xF0], np.uint8)[rng.integers(0, 4, w[..., 2:].shape)]
    d = rng.uniform(1e-3, 2e-2, (rows, k // 32, 1)) * rng.choice([-1.0, 1.0], (rows, k // 32, 1))
    w[..., 0:2] = d.astype(np.float16).view(np.uint8)
    return w.reshape(rows, -1)


def emulate_iq4_nl_repacked(w, xq, xd):
    """ggml's repacked IQ4_NL gemv order (as Q4_0's): one f32 chain per output over the blocks,
    acc = fma(f32(S_b), d_w * d_x, acc), S_b the exact dot product of the grid values."""
    rows = w.shape[0]
    b = w.reshape(rows, -1, 18)
    dw = b[..., :2].copy().view(np.float16)[..., 0].astype(f32)
    qs = b[..., 2:].astype(np.int64)
    q = KVALUES[np.concatenate([qs & 15, qs >> 4], -1)]
    n, nb = xq.shape[0], dw.shape[1]
    x = xq.astype(np.int64).reshape(n, nb, 32)
    out = np.empty((n, rows), f32)
    for j in range(n):
        s = (q * x[j][None]).sum(-1)
        acc = np.zeros(rows, f32)
        for bb in range(nb):
            acc = fma32(s[:, bb].astype(f32), dw[:, bb] * xd[j, bb], acc)
        out[j] = acc
    return out


def emulate(t, w, xp):
    return (emulate_q4_0_repacked if t == K.Q4_0 else emulate_iq4_nl_repacked)(w, xp[0], xp[1])


@pytest.mark.parametrize("t", list(LAYOUTS), ids=lambda t: K.TYPE_NAMES[t])
@pytest.mark.parametrize("k", [256, 640, 2048])
def test_one_token_product_is_the_repacked_gemv_order(t, k):
    rows = 48
    for wseed, extreme_w in ((k, False), (k + 1, True)):
        w = random_weights(rows, k, wseed, extreme_w)
        w8 = packed(LAYOUTS[t], w)
        for seed, extreme in ((1, False), (2, True)):
            xp = K.prepare(t, random_activations(1, k, seed, extreme)[0])
            ref = emulate(t, w, tuple(a[None] for a in xp))[0]
            file = np.empty(rows, f32)
            K.matvec(t, w, xp, file, 0, rows)
            np.testing.assert_array_equal(file, ref)
            for r0, r1 in [(0, rows), (3, 45), (8, 9), (40, 48), (6, 6), (9, 23)]:
                out = np.full(rows, np.nan, f32)
                K.matvec(LAYOUTS[t], w8, xp, out, r0, r1)
                np.testing.assert_array_equal(out[r0:r1], ref[r0:r1], err_msg=f"rows {r0}..{r1}")
                assert np.isnan(out[:r0]).all() and np.isnan(out[r1:]).all()


def test_two_streams_over_a_long_range():
    """A range long enough for two streams (halves over 64 KB): every group of both halves and the
    odd one left after them."""
    t, rows, k = K.Q4_0, 8 * 61, 2048
    w = random_weights(rows, k, 5)
    w8 = packed(K.Q4_0_X8, w)
    xp = K.prepare(t, random_activations(1, k, 3)[0])
    want = np.empty(rows, f32)
    K.matvec(t, w, xp, want, 0, rows)
    got = np.full(rows, np.nan, f32)
    K.matvec(K.Q4_0_X8, w8, xp, got, 0, rows)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("t", list(LAYOUTS), ids=lambda t: K.TYPE_NAMES[t])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9])
def test_prompt_and_expert_products_are_each_columns_gemv(t, n):
    """4 columns per unpacked record, the rest 1-3: every column the one-token product's numbers and
    the file layout's prompt product's; mul_mat_id is the prompt product."""
    rows, k = 40, 640
    w = random_weights(rows, k, 20 + n)
    w8 = packed(LAYOUTS[t], w)
    xp = K.prepare(t, random_activations(n, k, 30 + n, extreme=n == 9))
    ref = emulate(t, w, xp)
    for r0, r1 in [(0, rows), (3, 37), (8, 16), (13, 14)]:
        want = np.full((n, rows), np.nan, f32)
        got = want.copy()
        K.matmat(t, w, xp, want, r0, r1)
        K.matmat(LAYOUTS[t], w8, xp, got, r0, r1)
        np.testing.assert_array_equal(got, want, err_msg=f"rows {r0}..{r1}")
        np.testing.assert_array_equal(got[:, r0:r1], ref[:, r0:r1])
    ids = np.zeros((n, rows), f32)
    K.mul_mat_id_kernel(LAYOUTS[t])(w8, xp, ids, 0, rows, rows)
    np.testing.assert_array_equal(ids, ref)


@pytest.mark.parametrize("gfni", [1, 0], ids=["gfni", "shift"])
@pytest.mark.parametrize("t", list(LAYOUTS), ids=lambda t: K.TYPE_NAMES[t])
def test_both_nibble_steps_are_the_repacked_order(t, gfni):
    """The way of taking the high nibbles out the CPU does not use is built and checked too (GFNI
    where the CPU has it; the shift and mask of CPUs without it everywhere)."""
    from workbench.engine.kernels.x86 import q4_x8
    if gfni and not q4_x8.GFNI:
        pytest.skip("this CPU has no GFNI")
    matvec, matmat = q4_x8._products(int(t == K.IQ4_NL), gfni)
    rows, k = 24, 640
    w = random_weights(rows, k, 11, extreme=True)
    w8 = packed(LAYOUTS[t], w)
    xp = K.prepare(t, random_activations(3, k, 5, True))
    ref = emulate(t, w, xp)
    out = np.full(rows, np.nan, f32)
    matvec(w8, tuple(a[1] for a in xp), out, 1, rows)
    np.testing.assert_array_equal(out[1:], ref[1, 1:])
    outm = np.full((3, rows), np.nan, f32)
    matmat(w8, xp, outm, 0, rows)
    np.testing.assert_array_equal(outm, ref)


@pytest.mark.parametrize("t", list(LAYOUTS), ids=lambda t: K.TYPE_NAMES[t])
def test_rows_are_looked_up_as_the_file_layout(t):
    """A tied output matrix kept in groups is the token embedding: its rows dequantize to the file
    layout's numbers, through the compiled lookup a token's call uses too."""
    w = random_weights(24, 512, 7)
    w8 = packed(LAYOUTS[t], w)
    lookup = K.dequantizer(LAYOUTS[t])
    assert lookup is not None
    for r0, r1 in [(0, 24), (3, 4), (5, 18), (16, 24)]:
        want = K.dequantize_rows(t, w, r0, r1)
        np.testing.assert_array_equal(K.dequantize_rows(LAYOUTS[t], w8, r0, r1), want)
        np.testing.assert_array_equal(lookup(w8, r0, r1), want)


def test_repack_round_trip_keeps_each_group():
    """Whole 8-row groups are rewritten in place, each keeping its own bytes, and back; a range
    that cuts a group is refused."""
    repack, unpack = packing.movers(K.Q4_0_X8)
    w = random_weights(32, 640, 9)
    w2 = w.copy()
    repack(w2, 8, 32)                                   # rows 0-7 stay as they were
    assert np.array_equal(w2[:8], w[:8]) and not np.array_equal(w2[8:], w[8:])
    for g in range(1, 4):
        assert sorted(w2[8 * g:8 * g + 8].ravel()) == sorted(w[8 * g:8 * g + 8].ravel())
    unpack(w2, 8, 32)
    assert np.array_equal(w2, w)
    with pytest.raises(ValueError, match="whole 8-row groups"):
        repack(w2, 4, 32)

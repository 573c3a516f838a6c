"""Q4_K in the 8-row interleaved layout (kernels/x86/k4_x8.py): the repack is lossless and the gemv
over it gives llama.cpp's gemv order to the bit (against the NumPy emulation and today's kernel on
the GGUF layout), including the largest integer sums."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kernel_emulation import SIMD_PATHS, emulate_q4_K, f32, weights
from test_k4_rows import _saturated, _x
from workbench.engine import kernels as K
from workbench.engine.kernels import llvm_ir
from workbench.engine.kernels.x86 import k4_x8

pytestmark = pytest.mark.skipif(not SIMD_PATHS, reason="no SIMD kernel path on this CPU")
Q4_K = int(T.Q4_K)
MODES = {"avx2": llvm_ir.AVX2, "avx512-vnni": llvm_ir.VNNI}


@pytest.mark.parametrize("k", [256, 768, 1024, 2048])
def test_repack_round_trip_and_group_bytes(k):
    w = weights(T.Q4_K, 32, k, seed=k)
    x8 = w.copy()
    k4_x8.repack_rows(x8, 8, 32)                        # the first group stays as it was
    assert np.array_equal(x8[:8], w[:8]) and not np.array_equal(x8[8:], w[8:])
    for g in range(1, 4):                               # each group keeps its own bytes
        assert sorted(x8[8 * g:8 * g + 8].ravel()) == sorted(w[8 * g:8 * g + 8].ravel())
    k4_x8.unpack_rows(x8, 8, 32)
    assert np.array_equal(x8, w)


@pytest.mark.parametrize("path", [p for p in SIMD_PATHS if p in MODES])
@pytest.mark.parametrize("k", [256, 768, 1024, 2048])
def test_gemv_equals_the_gemv_order(path, k):
    rows = 48
    w = weights(T.Q4_K, rows, k, seed=5 + k)
    xp = K.prepare(Q4_K, _x(k, k))
    ref = emulate_q4_K(w, xp[0][None], xp[1][None], 0)[0]
    today = np.full(rows, np.nan, f32)
    K.matvec(Q4_K, w, xp, today, 0, rows)
    x8 = w.copy()
    k4_x8.repack_rows(x8, 0, rows)
    gemv = k4_x8.gemv_x8(MODES[path])
    for r0, r1 in [(0, rows), (8, 40), (16, 24), (40, 48)]:
        out = np.full(rows, np.nan, f32)
        gemv(x8, xp, out, r0, r1)
        np.testing.assert_array_equal(out[r0:r1], ref[r0:r1], err_msg=f"rows {r0}..{r1}")
        np.testing.assert_array_equal(out[r0:r1], today[r0:r1])
        assert np.isnan(out[:r0]).all() and np.isnan(out[r1:]).all()


@pytest.mark.parametrize("path", [p for p in SIMD_PATHS if p in MODES])
def test_gemv_integer_extremes(path):
    """Quants 15, scales and mins 63, activations +-127: the lanes' integer sums stay exact."""
    rows, k = 24, 1024
    w = _saturated(rows, k, seed=11)
    x8 = w.copy()
    k4_x8.repack_rows(x8, 0, rows)
    gemv = k4_x8.gemv_x8(MODES[path])
    gemm = k4_x8.gemv_x8_cols(MODES[path], gemm=True)
    for extreme in (True, False):
        xp = K.prepare(Q4_K, _x(k, 5, extreme))
        out = np.full(rows, np.nan, f32)
        gemv(x8, xp, out, 0, rows)
        np.testing.assert_array_equal(out, emulate_q4_K(w, xp[0][None], xp[1][None], 0)[0])
        # the prompt's 4-column tiles (two groups in zmm lanes on AVX-512 VNNI) and one column more
        X = K.prepare(Q4_K, np.stack([_x(k, 5 + j, extreme) for j in range(5)]))
        out = np.full((5, rows), np.nan, f32)
        gemm(x8, X, out, 0, rows)
        np.testing.assert_array_equal(out, emulate_q4_K(w, X[0], X[1], 4))


@pytest.mark.parametrize("path", [p for p in SIMD_PATHS if p in MODES])
@pytest.mark.parametrize("n", [1, 3, 4, 7])
def test_columns_kernel_is_the_gemv_per_column(path, n):
    """The prompt / mul_mat_id product over the x8 layout (4 columns per weight load): every output
    is the one-column gemv's (llama.cpp's repacked mul_mat_id runs the gemv per token), for ranges
    that cut groups too; nothing outside the range is written."""
    rows, k = 40, 768
    w = weights(T.Q4_K, rows, k, seed=21 + n)
    xp = K.prepare(Q4_K, np.stack([_x(k, 3 + j) for j in range(n)]))
    ref = emulate_q4_K(w, xp[0], xp[1], 0)
    x8 = w.copy()
    k4_x8.repack_rows(x8, 0, rows)
    cols = k4_x8.gemv_x8_cols(MODES[path])
    for r0, r1 in [(0, rows), (3, 37), (8, 40), (0, 16), (8, 16), (13, 14)]:
        out = np.full((n, rows), np.nan, f32)
        cols(x8, xp, out, r0, r1)
        np.testing.assert_array_equal(out[:, r0:r1], ref[:, r0:r1], err_msg=f"rows {r0}..{r1}")
        assert np.isnan(out[:, :r0]).all() and np.isnan(out[:, r1:]).all()


@pytest.mark.parametrize("path", [p for p in SIMD_PATHS if p in MODES])
def test_scattered_columns_kernel_is_the_gemv_per_column(path):
    """The crew's product of 4 columns that live in separate arrays (a server pass's tokens routed
    to one expert): each output the one-column gemv's, a repeated column (the crew pads a last 2
    or 3 with repeats) gives the same outputs twice, ranges that cut groups write only their rows."""
    rows, k = 40, 768
    w = weights(T.Q4_K, rows, k, seed=41)
    x8 = w.copy()
    k4_x8.repack_rows(x8, 0, rows)
    cols = k4_x8.columns_kernel(MODES[path])
    xps = [K.prepare(Q4_K, _x(k, 9 + j)) for j in range(3)]
    ref = [emulate_q4_K(w, xp[0][None], xp[1][None], 0)[0] for xp in xps]
    pick = (0, 1, 2, 2)
    for r0, r1 in [(0, rows), (3, 37), (8, 40), (0, 16), (13, 14)]:
        outs = [np.full(rows, np.nan, f32) for _ in pick]
        cols(x8, tuple(xps[j][0].view(np.uint8) for j in pick), tuple(xps[j][1] for j in pick),
             tuple(xps[j][2] for j in pick), tuple(outs), r0, r1, True)
        for out, j in zip(outs, pick):
            np.testing.assert_array_equal(out[r0:r1], ref[j][r0:r1], err_msg=f"rows {r0}..{r1}")
            assert np.isnan(out[:r0]).all() and np.isnan(out[r1:]).all()
    out = np.full(rows, np.nan, f32)   # one column: the first of each tuple
    x = xps[1]
    cols(x8, (x[0].view(np.uint8),) * 4, (x[1],) * 4, (x[2],) * 4, (out,) * 4, 0, rows, False)
    np.testing.assert_array_equal(out, ref[1])


@pytest.mark.parametrize("path", [p for p in SIMD_PATHS if p in MODES])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 11])
def test_dense_prompt_kernel_is_the_gemm_order(path, n):
    """A dense weight's prompt product over the x8 layout (llama.cpp's repacked mul_mat): the
    columns [0, n - n % 4) in ggml_gemm_q4_K_8x8_q8_K's order (an FMA per pair of sub-blocks), the
    rest in the gemv's; equal to the file layout's matmat to the bit, for ranges that cut groups."""
    rows, k = 40, 768
    w = weights(T.Q4_K, rows, k, seed=31 + n)
    xp = K.prepare(Q4_K, np.stack([_x(k, 7 + j) for j in range(n)]))
    n_gemm = n - n % 4
    ref = emulate_q4_K(w, xp[0], xp[1], n_gemm)
    x8 = w.copy()
    k4_x8.repack_rows(x8, 0, rows)
    gemm = k4_x8.gemv_x8_cols(MODES[path], gemm=True)
    # AVX-512 VNNI takes two groups at a time (16 rows in zmm lanes): pairs from group 0 and from
    # group 1, a last odd group alone, one pair exactly, ranges that cut both groups of a pair
    for r0, r1 in [(0, rows), (3, 37), (8, 40), (0, 16), (8, 16), (13, 14)]:
        out = np.full((n, rows), np.nan, f32)
        gemm(x8, xp, out, r0, r1)
        np.testing.assert_array_equal(out[:, r0:r1], ref[:, r0:r1], err_msg=f"rows {r0}..{r1}")
        assert np.isnan(out[:, :r0]).all() and np.isnan(out[:, r1:]).all()
    if n_gemm and n % 4:   # the two orders differ somewhere: the gemm tiles are not the gemv's
        gemv = emulate_q4_K(w, xp[0], xp[1], 0)
        assert not np.array_equal(ref[:n_gemm], gemv[:n_gemm])


def test_engine_type_dispatch_and_dequantization():
    """Through the kernel tables (kernels.Q4_K_X8): matvec over a range that cuts groups, mul_mat_id,
    and dequantized rows equal Q4_K's on the GGUF bytes."""
    if K.packed_type(Q4_K) is None:
        pytest.skip("the active kernel path keeps Q4_K in the file's layout")
    rows, k = 32, 512
    w = weights(T.Q4_K, rows, k, seed=3)
    x8 = w.copy()
    k4_x8.repack_rows(x8, 0, rows)
    xp = K.prepare(Q4_K, _x(k, 9))
    want, got = np.full(rows, np.nan, f32), np.full(rows, np.nan, f32)
    K.matvec(Q4_K, w, xp, want, 5, 29)
    K.matvec(K.Q4_K_X8, x8, xp, got, 5, 29)
    np.testing.assert_array_equal(got, want)
    X = K.prepare(Q4_K, np.stack([_x(k, j) for j in range(5)]))
    want, got = np.zeros((5, rows), f32), np.zeros((5, rows), f32)
    K.mul_mat_id_kernel(Q4_K)(w, X, want, 0, rows, rows)
    K.mul_mat_id_kernel(K.Q4_K_X8)(x8, X, got, 0, rows, rows)
    np.testing.assert_array_equal(got, want)
    want, got = np.zeros((5, rows), f32), np.zeros((5, rows), f32)   # a dense weight's prompt product
    K.matmat(Q4_K, w, X, want, 0, rows)
    K.matmat(K.Q4_K_X8, x8, X, got, 0, rows)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(K.dequantize_rows(K.Q4_K_X8, x8, 3, 19), K.dequantize_rows(Q4_K, w, 3, 19))
    assert not np.array_equal(x8, w)  # dequantizing left x8 as it was (packed)
    k4_x8.unpack_rows(x8, 0, rows)
    assert np.array_equal(x8, w)


def test_repack_refuses_rows_that_cut_a_group():
    w = weights(T.Q4_K, 16, 256, seed=1)
    with pytest.raises(ValueError, match="8-row groups"):
        k4_x8.repack_rows(w, 4, 16)

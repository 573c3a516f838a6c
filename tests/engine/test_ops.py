"""Element-wise operations: the vector forms equal the scalar functions they replace, to the bit."""
from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.engine import ops


def _inputs(rows: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal((rows, d)) * rng.choice([0.01, 1.0, 8.0, 40.0], (rows, d))).astype(np.float32)
    special = np.array([0.0, -0.0, 1e-40, -1e-40, 1e-7, -1e-7, 87.5, -87.5, 88.8, -88.8, 103.0, -103.0,
                        132.9, -132.9, 140.0, -140.0, 192.5, -192.5, 300.0, -300.0, 1e30, -1e30], dtype=np.float32)
    flat = g.reshape(-1)
    flat[:special.size] = special
    u = rng.standard_normal((rows, d)).astype(np.float32)
    return g, u


def _strided(a: np.ndarray) -> np.ndarray:
    """The same values with a row stride of 8 bytes between elements (the scalar loop's input)."""
    wide = np.zeros((a.shape[0], 2 * a.shape[1]), dtype=np.float32)
    wide[:, ::2] = a
    return wide[:, ::2]


def test_silu_mul_vector_path_equals_the_scalar_ggml_expf_to_the_bit() -> None:
    # 8 x 768: a MoE layer's routed activations; 3 x 200: rows with a 8-value tail (libm expf there)
    for rows, d, seed in ((8, 768, 0), (3, 200, 1), (5, 16, 2)):
        g, u = _inputs(rows, d, seed)
        fast = np.empty_like(g)
        ops.silu_mul(g, u, fast)                       # adjacent values: 16 lanes at a time
        slow_out = _strided(np.zeros_like(g))
        ops.silu_mul(_strided(g), _strided(u), slow_out)  # the per-element loop over ggml_expf
        assert np.array_equal(fast.view(np.uint32), np.ascontiguousarray(slow_out).view(np.uint32))
        # and both are SiLU: x * sigmoid(x) * u within float32 rounding where it is finite
        with np.errstate(over="ignore"):
            ref = (g.astype(np.float64) / (1.0 + np.exp(-g.astype(np.float64)))) * u
        ok = np.isfinite(ref) & (np.abs(ref) < 1e30)
        assert np.allclose(fast[ok], ref[ok], rtol=1e-5, atol=1e-30)


def test_silu_mul_on_column_ranges_of_a_fused_gate_up_output() -> None:
    # the fused gate_up tensor's output is [k, 2 * n_ff]: gate = [:, :n_ff], up = [:, n_ff:]
    g, u = _inputs(4, 256, 3)
    gu = np.concatenate([g, u], axis=1)
    out = np.empty((4, 256), dtype=np.float32)
    ops.silu_mul(gu[:, :256], gu[:, 256:], out)
    want = np.empty_like(out)
    ops.silu_mul(g, u, want)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def _gelu_both_paths(g: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gelu_mul of rows g (at most GELU_COMPUTE_ROWS: the computed path), and of the same rows
    repeated past that count (the table path), cut back to g's rows."""
    assert g.shape[0] <= ops.GELU_COMPUTE_ROWS
    computed = np.empty_like(g)
    ops.gelu_mul(g, u, computed, ops.GELU_F16)
    reps = ops.GELU_COMPUTE_ROWS // g.shape[0] + 1
    looked_up = np.empty((reps * g.shape[0], g.shape[1]), np.float32)
    ops.gelu_mul(np.tile(g, (reps, 1)), np.tile(u, (reps, 1)), looked_up, ops.GELU_F16)
    return computed, looked_up[:g.shape[0]]


def test_gelu_computed_for_a_few_rows_equals_the_table_for_every_half() -> None:
    # the result depends on the input only through its value rounded to half (or through the
    # +-10 cut-offs): every half, and edges around the cut-offs and past the half range
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.array([9.999, 10.0, 10.001, -9.999, -10.0, -10.001, 65519.0, 65520.0, 1e30, -1e30, np.inf,
                      -np.inf], dtype=np.float32)
    g = np.concatenate([halves, edges]).reshape(1, -1)
    u = np.random.default_rng(3).standard_normal(g.shape).astype(np.float32)
    computed, looked_up = _gelu_both_paths(g, u)
    nan = np.isnan(looked_up)
    np.testing.assert_array_equal(np.isnan(computed), nan)
    np.testing.assert_array_equal(computed[~nan].view(np.uint32), looked_up[~nan].view(np.uint32))
    # and decode's shapes: a token's 2048 activations, MoE's 4 rows of 768 (vectorized body and tail)
    for n, d in ((1, 2048), (4, 768), (2, 37)):
        computed, looked_up = _gelu_both_paths(*_inputs(n, d, n + d))
        np.testing.assert_array_equal(computed.view(np.uint32), looked_up.view(np.uint32))


def _ggml_inv_rms(row: np.ndarray, eps: float) -> np.float32:
    """ggml_compute_forward_rms_norm_f32's scale: float32 squares summed one by one in float64."""
    s = 0.0
    for v in row.astype(np.float32):
        s += float(np.float32(v * v))
    return np.float32(1.0) / np.float32(math.sqrt(np.float32(s / row.shape[0]) + np.float32(eps)))


@pytest.mark.parametrize("n", [1, 3, 4, 7, 9])
def test_rms_norms_follow_ggml_row_by_row(n):
    """rms_norm, add_rms_norm and rms_norm_heads (which sum four rows side by side) give each row
    ggml's float64 sum in its order: the same bits as a row-at-a-time reference, whatever the
    number of rows."""
    from workbench.engine import ops
    rng = np.random.default_rng(n)
    d, eps = 96, 1e-6
    x = (rng.standard_normal((n, d)) * 3).astype(np.float32)
    y = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    yw = rng.standard_normal(d).astype(np.float32)

    def norm(r, weight):
        s = _ggml_inv_rms(r, eps)
        return (r * s) * weight if weight.size else r * s

    out = np.empty_like(x)
    ops.rms_norm(x, w, eps, out)
    assert np.array_equal(out, np.stack([norm(r, w) for r in x]))
    ops.rms_norm(x, np.empty(0, np.float32), eps, out)
    assert np.array_equal(out, np.stack([norm(r, np.empty(0, np.float32)) for r in x]))
    for norm_y in (True, False):
        xa = x.copy()
        ops.add_rms_norm(xa, y, yw if norm_y else np.empty(0, np.float32), norm_y, w, eps, out)
        want_x = np.stack([xr + (norm(yr, yw) if norm_y else yr) for xr, yr in zip(x, y)])
        assert np.array_equal(xa, want_x), norm_y
        assert np.array_equal(out, np.stack([norm(r, w) for r in want_x])), norm_y
    q = (rng.standard_normal((n, 3, 32)) * 2).astype(np.float32)
    qw = rng.standard_normal(32).astype(np.float32)
    want_q = np.stack([[norm(h, qw) for h in t] for t in q])
    ops.rms_norm_heads(q, qw, eps)
    assert np.array_equal(q, want_q)

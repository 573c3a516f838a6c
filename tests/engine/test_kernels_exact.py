"""Bit-exactness of the SIMD kernels with llama.cpp's float operation order (kernels/x86/).

Each product is re-implemented here in NumPy following the float operation order of the llama.cpp
(0c1e570) CPU code that runs on an AVX2 / AVX512-VNNI machine for that type and column count,
independently of the kernel code: integers are computed exactly (int64), every float step is
emulated with correctly rounded float32 arithmetic (products and sums in float64 are exact or
corrected, FMAs rounded once).  The kernels must equal the emulation bit for bit.

    Q8_0 / Q5_0, any column count  ggml_vec_dot_q{8,5}_0_q8_0 (1 column) and tinyBLAS_Q0_AVX (more):
        acc[l] = fma(f32(lane_l), d_w * d_x, acc[l]) per 32-block, lane l = elements 4l..4l+3;
        hsum_float_8
    Q4_K, rows % 8 == 0 (repacked)  columns [0, n - n%4): ggml_gemm_q4_K_8x8_q8_K (FMA per pair of
                                    sub-blocks); the last n%4: ggml_gemv_q4_K_8x8_q8_K (FMA per super-block)
    Q4_K, rows % 8 != 0, Q5_K       n >= 8: the tiled matmul (r = f32(S) d_w; r = fma(-dmin, f32(M), r);
                                    out = fma(r, d_x, out)); n < 8: the type's vec_dot (Q4_K: 8 f32
                                    lanes, mins in 4 lanes; Q5_K: 8 f32 lanes, mins in one chain
                                    summs = fma(-d_x dmin, f32(M), summs), GCC's contraction)
    mul_mat_id (one expert)         the same per token count, except a repacked Q4_K: the gemv per token
    Q6_K, n < 8                     ggml_vec_dot_q6_K_q8_K (AVX2 lanes, hsum_float_8)
    Q6_K, n >= 8                    tiled matmul: out = fma(f32(S_b) * d_w, d_x, out) (the source's
                                    mul + add, contracted to an FMA by GCC's -ffp-contract=fast)
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from workbench.engine import kernels as K
from kernel_emulation import (KDIM, ROWS, SIMD_PATHS, activations, emulate, emulate_legacy,  # noqa: F401
                              emulate_k4_tiled, emulate_q4_0_repacked, emulate_q4_K, emulate_k4_vec, emulate_q6_K,
                              f16, f32, f64, fma32, hsum8, tinyblas_float, vec_dot_float, weights)
from workbench.engine.kernels.llama_build import WIDE

pytestmark = pytest.mark.skipif(not SIMD_PATHS, reason="no SIMD kernel path on this CPU")


def _ref_matvec(t, w, x):
    xp = K.prepare(int(t), x[None])
    return emulate(t, w, xp, 1)[0]


@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K])
def test_matvec_bit_exact(path, t):
    w = weights(t)
    x = activations(1)[0]
    out = np.full(ROWS, np.nan, f32)
    K.matvec(int(t), w, K.prepare(int(t), x), out, 0, ROWS)
    np.testing.assert_array_equal(out, _ref_matvec(t, w, x))
    # row sub-ranges (threads split rows) give the same values
    out2 = np.full(ROWS, np.nan, f32)
    K.matvec(int(t), w, K.prepare(int(t), x), out2, 0, 5)
    K.matvec(int(t), w, K.prepare(int(t), x), out2, 5, ROWS)
    np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0])
@pytest.mark.parametrize("k", [32, 96, 160, 2080, 2112])
def test_legacy_matvec_bit_exact_for_any_block_count(path, t, k):
    """The one-token Q8_0 / Q5_0 products step two blocks at a time: an odd block count ends on one
    block of its own, and rows longer than 2048 weights prefetch nothing ahead; both stay exact."""
    w = weights(t, k=k)
    x = np.random.default_rng(k).standard_normal((1, k)).astype(f32)
    xp = K.prepare(int(t), x)
    out = np.full(ROWS, np.nan, f32)
    K.matvec(int(t), w, K.prepare(int(t), x[0]), out, 0, ROWS)
    np.testing.assert_array_equal(out, emulate(t, w, xp, 1)[0])


@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 13])
def test_matmat_bit_exact(path, t, n):
    w = weights(t)
    X = activations(n)
    xp = K.prepare(int(t), X)
    out = np.full((n, ROWS), np.nan, f32)
    K.matmat(int(t), w, xp, out, 0, 7)
    K.matmat(int(t), w, xp, out, 7, ROWS)
    np.testing.assert_array_equal(out, emulate(t, w, xp, n))


@pytest.mark.parametrize("rows", [16, 13, 40])
@pytest.mark.parametrize("n", [1, 3, 7, 8, 9, 33])
def test_q5_K_and_plain_q4_K_follow_the_tiled_matmul(path, rows, n):
    """Q5_K (never repacked on x86) and a Q4_K weight llama.cpp does not repack (rows % 8 != 0): from 8
    columns ggml's tiled matmul, below that vec_dot (each emulated).
    Q5_K on AVX-512 VNNI: whole 16-row groups in zmm lanes, a last 8 in ymm lanes, the rest per row."""
    for t in (T.Q5_K, T.Q4_K):
        w = weights(t, rows=rows)
        X = activations(n)
        xp = K.prepare(int(t), X)
        out = np.full((n, rows), np.nan, f32)
        K.matmat(int(t), w, xp, out, 0, 5)
        K.matmat(int(t), w, xp, out, 5, rows)
        if t == T.Q4_K and rows % 8 == 0:
            ref = emulate_q4_K(w, xp[0], xp[1], n - n % 4 if n > 1 else 0)
        elif n >= 8:
            ref = emulate_k4_tiled(w, xp[0], xp[1], q5=t == T.Q5_K)
        else:
            ref = emulate_k4_vec(w, xp[0], xp[1], q5=t == T.Q5_K)
            np.testing.assert_array_equal(np.stack([_matvec(t, w, X[c], rows) for c in range(n)]), ref)
        np.testing.assert_array_equal(out, ref)
        whole = np.full((n, rows), np.nan, f32)
        K.matmat(int(t), w, xp, whole, 0, rows)
        np.testing.assert_array_equal(whole, ref)


def _matvec(t, w, x, rows):
    out = np.full(rows, np.nan, f32)
    K.matvec(int(t), w, K.prepare(int(t), x), out, 0, rows)
    return out


@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K])
@pytest.mark.parametrize("rows", [16, 13])
@pytest.mark.parametrize("n", [2, 5, 8, 13, 33])
def test_mul_mat_id_kernels_follow_llama_cpp(path, t, rows, n):
    """One expert's routed tokens at once (several tokens per unpacked weight block): every output is
    what ggml's mul_mat_id computes for that many tokens -- the repacked gemv per token (Q4_K/Q4_0 with
    rows % 8 == 0), the tiled matmul from 8 tokens (Q4_K unrepacked, Q5_K, Q6_K), else vec_dot (the
    matvec per token); independent of the row split."""
    idk = K.mul_mat_id_kernel(int(t))
    assert idk is not None
    w = weights(t, rows=rows)
    X = activations(n)
    xp = K.prepare(int(t), X)
    out = np.full((n, rows), np.nan, f32)
    idk(w, xp, out, 0, 3, rows)
    idk(w, xp, out, 3, rows, rows)
    per_token = np.stack([_matvec(t, w, X[c], rows) for c in range(n)])
    if t == T.Q4_K and rows % 8 == 0:
        ref = emulate_q4_K(w, xp[0], xp[1], 0)  # ggml_gemv_q4_K_8x8_q8_K for every token
        np.testing.assert_array_equal(per_token, ref)
    elif t in (T.Q4_K, T.Q5_K, T.Q6_K) and n >= 8:
        ref = emulate_q6_K(w, xp[0], xp[1], True) if t == T.Q6_K else emulate_k4_tiled(w, xp[0], xp[1], t == T.Q5_K)
    else:
        ref = per_token
    np.testing.assert_array_equal(out, ref)


def test_orders_differ():
    """The emulated orders are not interchangeable (guards against a test that cannot fail)."""
    w = weights(T.Q6_K, rows=64)
    xp = K.prepare(int(T.Q6_K), activations(8))
    assert not np.array_equal(emulate_q6_K(w, xp[0], xp[1], True), emulate_q6_K(w, xp[0], xp[1], False))
    w = weights(T.Q4_K, rows=64)
    xp = K.prepare(int(T.Q4_K), activations(4))
    assert not np.array_equal(emulate_q4_K(w, xp[0], xp[1], 4), emulate_q4_K(w, xp[0], xp[1], 0))


def test_fma32_emulation():
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(1000).astype(f32) for _ in range(3))
    from fractions import Fraction
    for i in range(0, 1000, 37):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        r = fma32(a[i:i + 1], b[i:i + 1], c[i:i + 1])[0]
        lo, hi = np.nextafter(r, f32(-np.inf)), np.nextafter(r, f32(np.inf))
        assert abs(Fraction(float(r)) - exact) <= abs(Fraction(float(lo)) - exact)
        assert abs(Fraction(float(r)) - exact) <= abs(Fraction(float(hi)) - exact)


# ----------------------------------------------------------------------------- Q4_0: repacked or not
@pytest.mark.parametrize("rows", [16, 13, 24])
@pytest.mark.parametrize("n", [1, 3, 4, 9])
def test_q4_0_follows_llama_cpp_repack_rule(path, rows, n):
    """Rows % 8 == 0: the repacked q4_0_8x8 gemv/gemm order; otherwise vec_dot / tinyBLAS (row splits
    that are not multiples of 4 included, as threads may cut anywhere)."""
    w = weights(T.Q4_0, rows=rows)
    X = activations(n)
    xp = K.prepare(int(T.Q4_0), X)
    out = np.full((n, rows), np.nan, f32)
    K.matmat(int(T.Q4_0), w, xp, out, 0, 7)
    K.matmat(int(T.Q4_0), w, xp, out, 7, rows)
    ref = emulate(T.Q4_0, w, xp, n)
    np.testing.assert_array_equal(out, ref)
    for j in range(n):
        v = np.full(rows, np.nan, f32)
        xv = K.prepare(int(T.Q4_0), X[j])
        K.matvec(int(T.Q4_0), w, xv, v, 0, 5)
        K.matvec(int(T.Q4_0), w, xv, v, 5, rows)
        np.testing.assert_array_equal(v, ref[j])


def test_q4_0_orders_differ():
    w = weights(T.Q4_0, rows=64)
    xp = K.prepare(int(T.Q4_0), activations(2))
    assert not np.array_equal(emulate_q4_0_repacked(w, xp[0], xp[1]), emulate_legacy(T.Q4_0, w, xp[0], xp[1]))


# ----------------------------------------------------------------------------- IQ4_NL
KV_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int64)


def iq4_nl_weights(rows, k, seed=5):
    """Random IQ4_NL rows: any index bytes, finite positive scales."""
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (rows, k // 32, 18), dtype=np.uint8)
    w[..., 0:2] = rng.uniform(1e-3, 2e-2, (rows, k // 32, 1)).astype(np.float16).view(np.uint8)
    return w.reshape(rows, -1)


def iq4_nl_quants(w):
    b = w.reshape(w.shape[0], -1, 18)
    qs = b[..., 2:].astype(np.int64)
    return f16(b[..., 0:2]), np.concatenate([KV_IQ4NL[qs & 15], KV_IQ4NL[qs >> 4]], -1)


def emulate_iq4_nl(w, xq, xd):
    """The order llama.cpp runs for this weight and column count (see x86/i_quants.py)."""
    dw, q = iq4_nl_quants(w)
    rows, nb = dw.shape
    n = xq.shape[0]
    x = xq.astype(np.int64).reshape(n, nb, 32)
    out = np.empty((n, rows), f32)
    for j in range(n):
        prod = q * x[j][None]                           # [rows, nb, 32] exact
        s_int = prod.sum(-1)
        lanes = prod.reshape(rows, nb, 8, 4).sum(-1)
        if rows % 8 == 0:                               # repacked iq4_nl_8x8 gemv / gemm
            acc = np.zeros(rows, f32)
            for b in range(nb):
                acc = fma32(s_int[:, b].astype(f32), dw[:, b] * xd[j, b], acc)
            out[j] = acc
        elif n == 1:                                    # ggml_vec_dot_iq4_nl_q8_0 (AVX2)
            a1 = np.zeros((rows, 8), f32)
            a2 = np.zeros((rows, 8), f32)
            b = 0
            while b + 1 < nb:
                a1 = fma32(lanes[:, b].astype(f32), (xd[j, b] * dw[:, b])[:, None], a1)
                a2 = fma32(lanes[:, b + 1].astype(f32), (xd[j, b + 1] * dw[:, b + 1])[:, None], a2)
                b += 2
            s = hsum8(a1 + a2)
            if b < nb:                                  # scalar tail: sumf += d * sumi (contracted)
                s = fma32(xd[j, b] * dw[:, b], s_int[:, b].astype(f32), s)
            out[j] = s
        else:                                           # tinyBLAS_Q0_AVX
            acc = np.zeros((rows, 8), f32)
            for b in range(nb):
                acc = fma32(lanes[:, b].astype(f32), (dw[:, b] * xd[j, b])[:, None], acc)
            out[j] = hsum8(acc)
    return out


@pytest.mark.parametrize("rows", [16, 13])
@pytest.mark.parametrize("k", [512, 480])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_iq4_nl_bit_exact(path, rows, k, n):
    w = iq4_nl_weights(rows, k)
    X = np.random.default_rng(1).standard_normal((n, k)).astype(f32)
    xp = K.prepare(K.IQ4_NL, X)
    out = np.full((n, rows), np.nan, f32)
    K.matmat(K.IQ4_NL, w, xp, out, 0, 7)
    K.matmat(K.IQ4_NL, w, xp, out, 7, rows)
    np.testing.assert_array_equal(out, emulate_iq4_nl(w, xp[0], xp[1]))
    # one-token products: the 1-column order of this weight
    v = np.full(rows, np.nan, f32)
    xv = K.prepare(K.IQ4_NL, X[0])
    K.matvec(K.IQ4_NL, w, xv, v, 0, 6)
    K.matvec(K.IQ4_NL, w, xv, v, 6, rows)
    np.testing.assert_array_equal(v, emulate_iq4_nl(w, xv[0][None], xv[1][None])[0])


def test_iq4_nl_orders_differ():
    w = iq4_nl_weights(13, 480)
    xp = K.prepare(K.IQ4_NL, activations(2)[:, :480])
    one = emulate_iq4_nl(w, xp[0][:1], xp[1][:1])
    two = emulate_iq4_nl(w, xp[0], xp[1])[:1]
    rep = emulate_iq4_nl(np.concatenate([w, w[:3]]), xp[0][:1], xp[1][:1])[:, :13]
    assert not np.array_equal(one, two) and not np.array_equal(one, rep)


def test_iq4_nl_dequantize_matches_gguf_py():
    w = iq4_nl_weights(9, 256)
    np.testing.assert_array_equal(K.dequantize_rows(K.IQ4_NL, w, 0, 9), gq.dequantize(w, T.IQ4_NL))
    np.testing.assert_array_equal(K.dequantize_rows(K.IQ4_NL, w, 3, 5), gq.dequantize(w[3:5], T.IQ4_NL))


# ----------------------------------------------------------------------------- IQ4_XS
def iq4_xs_weights(rows, k, seed=6):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (rows, k // 256, 136), dtype=np.uint8)
    w[..., 0:2] = rng.uniform(1e-4, 2e-3, (rows, k // 256, 1)).astype(np.float16).view(np.uint8)
    return w.reshape(rows, -1)


def emulate_iq4_xs(w, xq, xd, tiled=False):
    """ggml_vec_dot_iq4_xs_q8_K (AVX2) for every output: exact lanes per super-block, one FMA each;
    ``tiled`` (8 or more columns): ggml's tiled matmul, out = fma(f32(S) * d_w, d_x, out) per super-block."""
    b = w.reshape(w.shape[0], -1, 136)
    rows, nb = b.shape[:2]
    dw = f16(b[..., 0:2])
    sh = b[..., 2:4].copy().view(np.uint16)[..., 0].astype(np.int64)
    sl = b[..., 4:8].astype(np.int64)
    j = np.arange(8)
    ls = ((sl[..., j // 2] >> (4 * (j % 2))) & 15 | (((sh[..., None] >> (2 * j)) & 3) << 4)) - 32  # [rows, nb, 8]
    qs = b[..., 8:].astype(np.int64).reshape(rows, nb, 8, 16)
    q = np.concatenate([KV_IQ4NL[qs & 15], KV_IQ4NL[qs >> 4]], -1)            # [rows, nb, 8, 32]
    n = xq.shape[0]
    out = np.empty((n, rows), f32)
    for c in range(n):
        x = xq[c].astype(np.int64).reshape(nb, 8, 32)
        lanes = ((q * x[None]).reshape(rows, nb, 8, 8, 4).sum(-1) * ls[..., None]).sum(2)  # [rows, nb, 8 lanes]
        if tiled:
            out[c] = _tiled_chain(lanes.sum(-1), dw, xd[c])
            continue
        acc = np.zeros((rows, 8), f32)
        for bb in range(nb):
            acc = fma32(lanes[:, bb].astype(f32), (dw[:, bb] * xd[c, bb])[:, None], acc)
        out[c] = hsum8(acc)
    return out


@pytest.mark.parametrize("n", [1, 3, 7, 8, 13])
def test_iq4_xs_bit_exact(path, n):
    w = iq4_xs_weights(ROWS, KDIM)
    X = activations(n)
    xp = K.prepare(K.IQ4_XS, X)
    out = np.full((n, ROWS), np.nan, f32)
    K.matmat(K.IQ4_XS, w, xp, out, 0, 5)
    K.matmat(K.IQ4_XS, w, xp, out, 5, ROWS)
    np.testing.assert_array_equal(out, emulate_iq4_xs(w, xp[0], xp[1], tiled=n >= 8))
    v = np.full(ROWS, np.nan, f32)
    K.matvec(K.IQ4_XS, w, K.prepare(K.IQ4_XS, X[0]), v, 0, ROWS)
    np.testing.assert_array_equal(v, emulate_iq4_xs(w, xp[0], xp[1])[0])


def test_iq4_xs_dequantize_matches_gguf_py():
    w = iq4_xs_weights(5, 512)
    np.testing.assert_array_equal(K.dequantize_rows(K.IQ4_XS, w, 0, 5), gq.dequantize(w, T.IQ4_XS))


def _tiled_chain(S, dw, xd):
    """ggml's tiled matmul without mins: per super-block b, out = fma(f32(S_b) * d_w, d_x, out)."""
    acc = np.zeros(S.shape[0], f32)
    for bb in range(S.shape[1]):
        acc = fma32(S[:, bb].astype(f32) * dw[:, bb], np.full(S.shape[0], xd[bb], f32), acc)
    return acc


# ----------------------------------------------------------------------------- Q3_K
def q3_K_weights(rows, k, seed=7):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (rows, k // 256, 110), dtype=np.uint8)
    w[..., 108:110] = rng.uniform(1e-4, 2e-3, (rows, k // 256, 1)).astype(np.float16).view(np.uint8)
    return w.reshape(rows, -1)


def emulate_q3_K(w, xq, xd, tiled=False):
    """ggml_vec_dot_q3_K_q8_K (AVX2) for every output: exact lanes per super-block, one FMA each;
    ``tiled`` (8 or more columns): ggml's tiled matmul, out = fma(f32(S) * d_w, d_x, out) per super-block."""
    b = w.reshape(w.shape[0], -1, 110)
    rows, nb = b.shape[:2]
    hm = b[..., 0:32].astype(np.int64)
    qs = b[..., 32:96].astype(np.int64)
    a = b[..., 96:108].copy().view(np.uint32).astype(np.int64)          # [rows, nb, 3]
    k1, k2 = 0x03030303, 0x0F0F0F0F
    words = [(a[..., 0] & k2) | ((a[..., 2] & k1) << 4), (a[..., 1] & k2) | (((a[..., 2] >> 2) & k1) << 4),
             ((a[..., 0] >> 4) & k2) | (((a[..., 2] >> 4) & k1) << 4), ((a[..., 1] >> 4) & k2) | (((a[..., 2] >> 6) & k1) << 4)]
    sc = np.stack([(words[s // 4] >> (8 * (s % 4))) & 0xFF for s in range(16)], -1) - 32   # [rows, nb, 16]
    q = np.empty((rows, nb, 256), np.int64)
    for j in range(2):
        for i in range(4):
            low = (qs[..., 32 * j:32 * j + 32] >> (2 * i)) & 3
            high = (hm >> (4 * j + i)) & 1
            q[..., 128 * j + 32 * i:128 * j + 32 * i + 32] = low + 4 * high - 4
    dw = f16(b[..., 108:110])
    esc = np.repeat(sc, 16, axis=-1)
    n = xq.shape[0]
    out = np.empty((n, rows), f32)
    for c in range(n):
        x = xq[c].astype(np.int64).reshape(nb, 256)
        lanes = (q * x[None] * esc).reshape(rows, nb, 8, 8, 4).sum(-1).sum(2)   # [rows, nb, lane]
        if tiled:
            out[c] = _tiled_chain(lanes.sum(-1), dw, xd[c])
            continue
        acc = np.zeros((rows, 8), f32)
        for bb in range(nb):
            acc = fma32(lanes[:, bb].astype(f32), (xd[c, bb] * dw[:, bb])[:, None], acc)
        out[c] = hsum8(acc)
    return out


@pytest.mark.parametrize("n", [1, 3, 7, 8, 13])
def test_q3_K_bit_exact(path, n):
    w = q3_K_weights(ROWS, KDIM)
    X = activations(n)
    xp = K.prepare(K.Q3_K, X)
    out = np.full((n, ROWS), np.nan, f32)
    K.matmat(K.Q3_K, w, xp, out, 0, 5)
    K.matmat(K.Q3_K, w, xp, out, 5, ROWS)
    np.testing.assert_array_equal(out, emulate_q3_K(w, xp[0], xp[1], tiled=n >= 8))
    v = np.full(ROWS, np.nan, f32)
    K.matvec(K.Q3_K, w, K.prepare(K.Q3_K, X[0]), v, 0, ROWS)
    np.testing.assert_array_equal(v, emulate_q3_K(w, xp[0], xp[1])[0])


@pytest.mark.parametrize("rows", [16, 40, 56])
@pytest.mark.parametrize("n", [8, 13])
def test_q3_K_and_iq4_xs_prompts_in_16_row_groups(path, rows, n):
    """From 8 columns the tiled order; on AVX-512 VNNI whole groups of 16 rows run in zmm lanes
    (`repack.rows16_tiled`), a last 8 in ymm lanes, the rest per row: every split gives the same bits."""
    X = activations(n)
    for t, w, emu in ((K.Q3_K, q3_K_weights(rows, KDIM), emulate_q3_K),
                      (K.IQ4_XS, iq4_xs_weights(rows, KDIM), emulate_iq4_xs)):
        xp = K.prepare(t, X)
        ref = emu(w, xp[0], xp[1], tiled=True)
        for cuts in ((0, rows), (0, 3, rows)) + (((0, 16, 24, rows),) if rows > 24 else ()):
            out = np.full((n, rows), np.nan, f32)
            for a, b in zip(cuts, cuts[1:]):
                K.matmat(t, w, xp, out, a, b)
            np.testing.assert_array_equal(out, ref, err_msg=f"{t} {cuts}")


def test_q3_K_dequantize_matches_gguf_py():
    w = q3_K_weights(5, 512)
    np.testing.assert_array_equal(K.dequantize_rows(K.Q3_K, w, 0, 5), gq.dequantize(w, T.Q3_K))


# ----------------------------------------------------------------------------- Q2_K
def q2_K_weights(rows, k, seed=8):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (rows, k // 256, 84), dtype=np.uint8)
    w[..., 80:82] = rng.uniform(1e-3, 2e-2, (rows, k // 256, 1)).astype(np.float16).view(np.uint8)
    w[..., 82:84] = rng.uniform(1e-4, 5e-3, (rows, k // 256, 1)).astype(np.float16).view(np.uint8)
    return w.reshape(rows, -1)


def emulate_q2_K(w, xq, xd, xb, repacked):
    """Not repacked: ggml_vec_dot_q2_K_q8_K (AVX2) below 8 columns, ggml's tiled matmul from 8
    (r = f32(S) * d_w; r = fma(-dmin, f32(M), r); out = fma(r, d_x, out) per super-block).  Repacked (AVX-512, rows % 8 == 0): gemm order
    (FMA per half super-block) for columns < n - n % 4 when n > 3, gemv order (per super-block) else."""
    b = w.reshape(w.shape[0], -1, 84)
    rows, nb = b.shape[:2]
    sc = (b[..., :16] & 15).astype(np.int64)
    m = (b[..., :16] >> 4).astype(np.int64)
    qs = b[..., 16:80].astype(np.int64)
    q = np.empty((rows, nb, 256), np.int64)
    for j in range(2):
        for i in range(4):
            q[..., 128 * j + 32 * i:128 * j + 32 * i + 32] = (qs[..., 32 * j:32 * j + 32] >> (2 * i)) & 3
    dw, dmin = f16(b[..., 80:82]), f16(b[..., 82:84])
    esc = np.repeat(sc, 16, axis=-1)
    n = xq.shape[0]
    n_gemm = n - n % 4 if n > 3 else 0
    out = np.empty((n, rows), f32)
    for c in range(n):
        x = xq[c].astype(np.int64).reshape(nb, 256)
        bs = xb[c].astype(np.int64).reshape(nb, 16)
        prod = q * x[None] * esc                                           # [rows, nb, 256]
        mins = m * bs[None]                                                # [rows, nb, 16]
        if not repacked and n >= 8:
            acc = np.zeros(rows, f32)
            for bb in range(nb):
                r = prod[:, bb].sum(-1).astype(f32) * dw[:, bb]
                r = fma32(-dmin[:, bb], mins[:, bb].sum(-1).astype(f32), r)
                acc = fma32(r, np.full(rows, xd[c, bb], f32), acc)
            out[c] = acc
            continue
        if not repacked:
            lanes = prod.reshape(rows, nb, 8, 8, 4).sum(-1).sum(2)          # [rows, nb, lane]
            mlanes = mins.reshape(rows, nb, 8, 2).sum(-1)
            acc = np.zeros((rows, 8), f32)
            for bb in range(nb):
                acc = fma32(mlanes[:, bb].astype(f32), (-xd[c, bb] * dmin[:, bb])[:, None], acc)
                acc = fma32(lanes[:, bb].astype(f32), (xd[c, bb] * dw[:, bb])[:, None], acc)
            out[c] = hsum8(acc)
            continue
        acc = np.zeros(rows, f32)
        accm = np.zeros(rows, f32)
        for bb in range(nb):
            dd, dm = dw[:, bb] * xd[c, bb], dmin[:, bb] * xd[c, bb]
            if c < n_gemm:
                for j in range(2):
                    acc = fma32(prod[:, bb, 128 * j:128 * j + 128].sum(-1).astype(f32), dd, acc)
                    accm = fma32(mins[:, bb, 8 * j:8 * j + 8].sum(-1).astype(f32), dm, accm)
            else:
                acc = fma32(prod[:, bb].sum(-1).astype(f32), dd, acc)
                accm = fma32(mins[:, bb].sum(-1).astype(f32), dm, accm)
        out[c] = acc - accm
    return out


@pytest.mark.parametrize("rows", [16, 13])
@pytest.mark.parametrize("n", [1, 3, 4, 6, 8, 9])
def test_q2_K_bit_exact(path, rows, n):
    w = q2_K_weights(rows, KDIM)
    X = activations(n)
    xp = K.prepare(K.Q2_K, X)
    out = np.full((n, rows), np.nan, f32)
    K.matmat(K.Q2_K, w, xp, out, 0, 5)
    K.matmat(K.Q2_K, w, xp, out, 5, rows)
    repacked = path == "avx512-vnni" and rows % 8 == 0
    ref = emulate_q2_K(w, xp[0], xp[1], xp[2], repacked)
    np.testing.assert_array_equal(out, ref)
    v = np.full(rows, np.nan, f32)
    xv = K.prepare(K.Q2_K, X[0])
    K.matvec(K.Q2_K, w, xv, v, 0, rows)
    np.testing.assert_array_equal(v, emulate_q2_K(w, xv[0][None], xv[1][None], xv[2][None], repacked)[0])


def test_q2_K_orders_differ():
    w = q2_K_weights(16, KDIM)
    xp = K.prepare(K.Q2_K, activations(4))
    a, b = emulate_q2_K(w, *xp, True), emulate_q2_K(w, *xp, False)
    assert not np.array_equal(a, b)


def test_q2_K_dequantize_matches_gguf_py():
    w = q2_K_weights(5, 512)
    np.testing.assert_array_equal(K.dequantize_rows(K.Q2_K, w, 0, 5), gq.dequantize(w, T.Q2_K))


def _emulate_f32(w, X, tiny):
    """llama.cpp's F32 products in this host's build (`llama_build.WIDE`): tinyBLAS<16> or <8> (one FMA
    chain per lane, then the reduce tree) or ggml_vec_dot_f32 (4 accumulators x 16 or 8 lanes, (0+2)+(1+3),
    the build's reduction, leftovers in f32 FMAs)."""
    if tiny:
        return tinyblas_float(w, X, WIDE)
    return np.stack([vec_dot_float(w, x, WIDE, f16=False) for x in X])


@pytest.mark.parametrize("k,rows,n", [(256, 8, 1), (256, 8, 2), (256, 8, 13), (320, 12, 5), (272, 8, 1), (64, 16, 9),
                                      (272, 8, 3), (256, 6, 4)])
def test_f32_follows_llama_cpp(path, k, rows, n):
    """F32 weights (a mixture of experts' router): one column ggml_vec_dot_f32, more llamafile's
    tinyBLAS<16> (AVX2 build: <8>) when k % 16 (8) == 0 and rows % 4 == 0, else vec_dot per column."""
    rng = np.random.default_rng(k + rows + n)
    w = rng.standard_normal((rows, k)).astype(f32)
    X = rng.standard_normal((n, k)).astype(f32)
    wb = w.view(np.uint8)
    if n == 1:
        out = np.full(rows, np.nan, f32)
        K.matvec(int(T.F32), wb, K.prepare(int(T.F32), X[0]), out, 0, rows)
        np.testing.assert_array_equal(out, _emulate_f32(w, X, False)[0])
        return
    out = np.full((n, rows), np.nan, f32)
    K.matmat(int(T.F32), wb, K.prepare(int(T.F32), X), out, 0, 3)
    K.matmat(int(T.F32), wb, K.prepare(int(T.F32), X), out, 3, rows)
    np.testing.assert_array_equal(out, _emulate_f32(w, X, k % (16 if WIDE else 8) == 0 and rows % 4 == 0))


@pytest.mark.parametrize("rows", [16, 13])
@pytest.mark.parametrize("n", [2, 5, 8, 13])
def test_mul_mat_id_kernels_of_q2_K_q3_K_iq4_xs(path, rows, n):
    """Q3_K and IQ4_XS (never repacked): vec_dot per token below 8 tokens, the tiled matmul from 8;
    Q2_K: the repacked gemv per token where llama.cpp repacks it (AVX-512, rows % 8 == 0), else the same."""
    X = activations(n)
    for t, w in ((T.Q3_K, q3_K_weights(rows, KDIM)), (T.IQ4_XS, iq4_xs_weights(rows, KDIM)),
                 (T.Q2_K, q2_K_weights(rows, KDIM))):
        xp = K.prepare(int(t), X)
        out = np.full((n, rows), np.nan, f32)
        idk = K.mul_mat_id_kernel(int(t))
        idk(w, xp, out, 0, 3, rows)
        idk(w, xp, out, 3, rows, rows)
        if t == T.Q3_K:
            ref = emulate_q3_K(w, xp[0], xp[1], tiled=n >= 8)
        elif t == T.IQ4_XS:
            ref = emulate_iq4_xs(w, xp[0], xp[1], tiled=n >= 8)
        elif path == "avx512-vnni" and rows % 8 == 0:
            ref = np.stack([emulate_q2_K(w, xp[0][c:c + 1], xp[1][c:c + 1], xp[2][c:c + 1], True)[0] for c in range(n)])
        else:
            ref = emulate_q2_K(w, *xp, False)
        np.testing.assert_array_equal(out, ref, err_msg=t.name)

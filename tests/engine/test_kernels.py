"""Tests of workbench.engine.kernels against gguf's dequantizers and float64 NumPy references.

Two references per product:
* tight: float64 dot of the exactly dequantized weights with ggml-style quantized activations
  (independent NumPy re-implementation of ggml's x86 quantizers).  Only f32 rounding of the
  kernel's accumulation separates it from the kernel, so the tolerance is a few ulps per block
  times the sum of absolute terms.
* loose: float64 dot with the original float activations.  The difference is the activation
  quantization error, bounded term by term (see ``_act_error_bound``), so the test still fails
  on any mis-paired block or scale.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from workbench.engine import kernels as K

K_DIM = 512          # two K-quant super-blocks, 16 legacy blocks
ROWS = 13            # odd on purpose
TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.Q3_K, T.Q2_K]
PATHS = K.available_paths()
EPS32 = 2.0 ** -24


# ----------------------------------------------------------------------------- weights
def _f16_field(shape, rng, lo=1e-3, hi=2e-2):
    return rng.uniform(lo, hi, shape).astype(np.float16).view(np.uint8).reshape(*shape, 2)


def make_weights(t: T, rows: int = ROWS, k: int = K_DIM, seed: int = 0) -> np.ndarray:
    """uint8 [rows, row_bytes] of valid blocks of type t."""
    rng = np.random.default_rng(seed + int(t))
    data = rng.standard_normal((rows, k)).astype(np.float32)
    if t in (T.F32, T.F16):
        return np.ascontiguousarray(gq.quantize(data, t)).view(np.uint8)
    if t not in (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.Q3_K, T.Q2_K):
        return np.ascontiguousarray(gq.quantize(data, t))
    # gguf cannot quantize K types or IQ4_NL: random bytes with sane f16 scales (every bit pattern of
    # the quant / scale fields is a valid block).
    bs, ts = {T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210), T.IQ4_NL: (32, 18), T.IQ4_XS: (256, 136),
              T.Q3_K: (256, 110), T.Q2_K: (256, 84)}[t]
    nb = k // bs
    blocks = rng.integers(0, 256, (rows, nb, ts), dtype=np.uint8)
    if t == T.Q6_K:
        blocks[..., 208:210] = _f16_field((rows, nb), rng)
    elif t == T.Q3_K:
        blocks[..., 108:110] = _f16_field((rows, nb), rng)
    elif t == T.Q2_K:
        blocks[..., 80:82] = _f16_field((rows, nb), rng)
        blocks[..., 82:84] = _f16_field((rows, nb), rng, 1e-4, 5e-3)
    elif t in (T.IQ4_NL, T.IQ4_XS):
        blocks[..., 0:2] = _f16_field((rows, nb), rng)
    else:
        blocks[..., 0:2] = _f16_field((rows, nb), rng)
        blocks[..., 2:4] = _f16_field((rows, nb), rng, 1e-4, 5e-3)
    return blocks.reshape(rows, nb * ts)


def _set_f16(w: np.ndarray, t: T, field: int, value: float) -> np.ndarray:
    """Copy of w with f16 field number ``field`` of every block set to ``value``."""
    bs, ts = gq.GGML_QUANT_SIZES[t]
    b = w.copy().reshape(w.shape[0], -1, ts)
    off = {T.Q6_K: 208, T.Q2_K: 80 + 2 * field}.get(t, 2 * field)
    b[..., off:off + 2] = np.array([value], np.float16).view(np.uint8)
    return b.reshape(w.shape)


def weight_parts(t: T, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scaled part, offset part, per-block offset m or None) in float64, each exact.

    For Q4_1/Q5_1: scaled = d*q (offset m kept apart since ggml uses m*s_x);
    for Q4_K/Q5_K: scaled = d*sc*q, offset = -dmin*m; else scaled = dequantized weights.
    """
    deq = lambda a: gq.dequantize(a, t).astype(np.float64).reshape(w.shape[0], -1)
    if t in (T.Q4_1, T.Q5_1):
        m = _set_f16(_set_f16(w, t, 0, 0.0), t, 0, 0.0)  # d = 0 -> dequant gives m
        m_blk = deq(m)[:, ::32]
        a = deq(_set_f16(w, t, 1, 0.0))
        return a, np.zeros_like(a), m_blk
    if t in (T.Q4_K, T.Q5_K, T.Q2_K):
        return deq(_set_f16(w, t, 1, 0.0)), deq(_set_f16(w, t, 0, 0.0)), None
    a = deq(w)
    return a, np.zeros_like(a), None


# ----------------------------------------------------------------------------- activations (NumPy ggml)
def ref_q8_0(x: np.ndarray):
    """ggml x86 quantize_row_q8_0/q8_1: d = f16(amax/127), q = rint(x * (127/amax)); also s."""
    b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * idv).astype(np.int32)
    s = (d[..., 0] * q.sum(-1).astype(np.float32)).astype(np.float16).astype(np.float64)
    return q.reshape(x.shape), d[..., 0].astype(np.float16).astype(np.float64), s


def ref_q8_K(x: np.ndarray):
    """ggml quantize_row_q8_K_ref: signed max, iscale = -127/max, RNE, clamp 127, d = 1/iscale."""
    b = x.reshape(x.shape[0], -1, 256).astype(np.float32)
    idx = np.abs(b).argmax(-1)[..., None]                       # first max, like the C loop
    mx = np.take_along_axis(b, idx, -1)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / mx, np.float32(0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(iscale * b), 127).astype(np.int32)
    return q.reshape(x.shape), d[..., 0].astype(np.float64), q.reshape(x.shape[0], -1, 16).sum(-1)


def quantized_x(t: T, x: np.ndarray):
    """(x as ggml's vec_dot_type, dequantized to float64; per-32-block s or None)."""
    if t == T.F32:
        return x.astype(np.float64), None
    if t == T.F16:
        return x.astype(np.float16).astype(np.float64), None
    if t == T.BF16:
        return gq.dequantize(gq.quantize(x, T.BF16), T.BF16).astype(np.float64).reshape(x.shape), None
    if t in (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.Q3_K, T.Q2_K):
        q, d, _ = ref_q8_K(x)
        return (q.reshape(x.shape[0], -1, 256) * d[..., None]).reshape(x.shape), None
    q, d, s = ref_q8_0(x)
    return (q.reshape(x.shape[0], -1, 32) * d[..., None]).reshape(x.shape), s


def _act_error_bound(t: T, x: np.ndarray) -> np.ndarray:
    """Per-element bound |x_quantized - x| of ggml's activation conversion, float64 [n, k]."""
    ax = np.abs(x.astype(np.float64))
    if t == T.F32:
        return np.zeros_like(ax)
    if t == T.F16:
        return ax * 2.0 ** -11 + 2.0 ** -25
    if t == T.BF16:
        return ax * 2.0 ** -8
    bs = 256 if t in (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.Q3_K, T.Q2_K) else 32
    amax = ax.reshape(x.shape[0], -1, bs).max(-1, keepdims=True)
    # half a quantization step, plus the f16 rounding of d (relative 2^-11 of the value)
    return (np.broadcast_to(amax / 254.0 * 1.0001, ax.reshape(x.shape[0], -1, bs).shape).reshape(ax.shape)
            + ax * 2.0 ** -10)


def reference(t: T, w: np.ndarray, x: np.ndarray):
    """(tight reference, tight tolerance, loose reference, loose tolerance), each [n, rows]."""
    a, b, m_blk = weight_parts(t, w)
    xq, s = quantized_x(t, x)
    ref = xq @ a.T + xq @ b.T
    mag = np.abs(xq) @ np.abs(a).T + np.abs(xq) @ np.abs(b).T
    if m_blk is not None:                        # Q4_1/Q5_1: + sum_b m_b * s_b
        ref += s @ m_blk.T
        mag += np.abs(s) @ np.abs(m_blk).T
    nblocks = x.shape[1] // (256 if t in (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.Q3_K, T.Q2_K) else 32)
    steps = x.shape[1] if t in (T.F32, T.F16, T.BF16) else nblocks
    tight_tol = (2 * steps + 8) * EPS32 * mag + 1e-30
    wdeq = gq.dequantize(w, t).astype(np.float64).reshape(w.shape[0], -1)
    loose = x.astype(np.float64) @ wdeq.T
    loose_tol = _act_error_bound(t, x) @ np.abs(wdeq).T + 2 * tight_tol + 1e-6 * mag
    return ref, tight_tol, loose, loose_tol


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(params=PATHS)
def path(request):
    old = K.kernel_path()
    K.set_kernel_path(request.param)
    yield request.param
    K.set_kernel_path(old)


def _x(n: int, k: int = K_DIM, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed + n)
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[:, 5] *= 20.0                               # an outlier, as real activations have
    return x


# ----------------------------------------------------------------------------- tests
def test_api_tables():
    assert set(K.SUPPORTED_TYPES) == {int(t) for t in TYPES}
    for t in TYPES:
        assert K.is_supported(int(t))
        assert K.SUPPORTED_TYPES[int(t)] == t.name
        assert K.row_bytes(int(t), K_DIM) == gq.quant_shape_to_byte_shape((K_DIM,), t)[0]
    assert not K.is_supported(int(T.IQ2_XXS))
    assert K.kernel_path() in K.available_paths()
    with pytest.raises(ValueError):
        K.set_kernel_path("no-such-path")


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_rows_exact(t):
    w = make_weights(t)
    full = gq.dequantize(w, t).reshape(ROWS, -1)
    got = K.dequantize_rows(int(t), w, 0, ROWS)
    assert got.dtype == np.float32 and got.shape == (ROWS, K_DIM)
    np.testing.assert_array_equal(got, full)
    np.testing.assert_array_equal(K.dequantize_rows(int(t), w, 3, 7), full[3:7])


def test_activation_quantizers_bit_exact():
    x = _x(3, 1024)
    x[1, 256:512] = 0.0                           # an all-zero super-block
    x[2, 40] = -x[2, 32:64].__abs__().max() * 1.5  # negative max magnitude in a block
    qs, d, n4 = K.prepare(int(T.Q8_0), x)
    rq, rd, rs = ref_q8_0(x)
    np.testing.assert_array_equal(qs, rq)
    np.testing.assert_array_equal(d, rd)
    np.testing.assert_array_equal(n4, -rq.reshape(3, -1, 4).sum(-1))
    qs, d, s = K.prepare(int(T.Q4_1), x)
    np.testing.assert_array_equal(qs, rq)
    np.testing.assert_array_equal(s, rs)
    qs, d, bs = K.prepare(int(T.Q4_K), x)
    rq, rd, rb = ref_q8_K(x)
    np.testing.assert_array_equal(qs, rq)
    np.testing.assert_array_equal(d, rd)
    np.testing.assert_array_equal(bs, rb)
    # 1-D input gives the row views of the 2-D result
    for t in (T.Q8_0, T.Q4_1, T.Q6_K, T.F16, T.BF16, T.F32):
        one, two = K.prepare(int(t), x[1]), K.prepare(int(t), x[1:2])
        assert len(one) == len(two)
        for a, b in zip(one, two):
            np.testing.assert_array_equal(a, b[0])


def test_q8_K_takes_the_first_of_equal_magnitudes_and_rounds_half_to_even():
    """quantize_q8_K (eight lanes at a time) against ggml's reference: a block's largest magnitude
    appearing as -m before +m (the first sets the sign of iscale) and the reverse, at the first
    and the last lane of a block; values whose product lands on .5 (half to even); the +127
    clamp; an all-zero block; tiny and huge blocks; a strided input; rows of 768 (an expert's
    down input)."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((6, 768)).astype(np.float32)
    x[0, 10], x[0, 200] = -4.0, 4.0          # -m first
    x[1, 10], x[1, 200] = 4.0, -4.0          # +m first
    x[2, 256], x[2, 511] = -7.5, 7.5         # the block's first and last lanes
    x[3, 0:256] = 0.0                        # an all-zero block
    x[3, 256:512] = rng.standard_normal(256).astype(np.float32) * np.float32(1e-30)
    x[3, 512:768] *= np.float32(1e30)
    halves = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5], dtype=np.float32)
    x[4, 0:8] = halves
    x[4, 8] = np.float32(-127.0)             # iscale = 1: the halves above round as written
    x[5] = np.float32(3.0)                   # every lane the max: +127 after the -127/3 scale
    x[5, 1] = np.float32(-3.0)
    for arr in (x, np.asfortranarray(x)[:, :], x[:, ::1], np.repeat(x, 2, axis=1)[:, ::2]):
        qs, d, bs = K.prepare(int(T.Q4_K), arr)
        rq, rd, rb = ref_q8_K(np.ascontiguousarray(arr))
        np.testing.assert_array_equal(qs, rq)
        np.testing.assert_array_equal(d, rd)
        np.testing.assert_array_equal(bs, rb)
    assert (K.prepare(int(T.Q4_K), x)[0][4, :6] == [0, 2, 2, 0, -2, -2]).all()  # half to even


def _check(got, ref, tol, what):
    err = np.abs(got.astype(np.float64) - ref)
    bad = err > tol
    assert not bad.any(), f"{what}: {bad.sum()} mismatches, worst err {err.max():.3g}, tol {tol[bad].min():.3g}"


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matvec(t, path):
    w = make_weights(t)
    x = _x(1)
    ref, tol, loose, ltol = reference(t, w, x)
    xp = K.prepare(int(t), x[0])
    out = np.full(ROWS, np.nan, np.float32)
    K.matvec(int(t), w, xp, out, 0, ROWS)
    _check(out[None], ref, tol, "tight")
    _check(out[None], loose, ltol, "loose")
    # row range: only [r0, r1) is written
    out2 = np.full(ROWS, np.nan, np.float32)
    K.matvec(int(t), w, xp, out2, 2, ROWS - 3)
    assert np.isnan(out2[:2]).all() and np.isnan(out2[ROWS - 3:]).all()
    np.testing.assert_array_equal(out2[2:ROWS - 3], out[2:ROWS - 3])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matmat(t, n, path):
    w = make_weights(t)
    x = _x(n)
    ref, tol, loose, ltol = reference(t, w, x)
    xp = K.prepare(int(t), x)
    out = np.full((n, ROWS), np.nan, np.float32)
    K.matmat(int(t), w, xp, out, 0, ROWS)
    _check(out, ref, tol, "tight")
    _check(out, loose, ltol, "loose")
    out2 = np.full((n, ROWS), np.nan, np.float32)
    K.matmat(int(t), w, xp, out2, 1, 6)
    assert np.isnan(out2[:, :1]).all() and np.isnan(out2[:, 6:]).all()
    _check(out2[:, 1:6], ref[:, 1:6], tol[:, 1:6], "range")
    # each column equals the single-vector product of that column
    for j in range(n):
        o = np.full(ROWS, np.nan, np.float32)
        K.matvec(int(t), w, K.prepare(int(t), x[j]), o, 0, ROWS)
        _check(out[j][None], o[None].astype(np.float64), tol[j][None], "matmat vs matvec")


@pytest.mark.parametrize("r0,r1,unit,row_bytes", [(0, 100, 1, 10), (3, 104, 1, 10), (5, 6, 1, 1000),
                                                  (0, 99, 2, 10), (8, 88, 8, 10), (0, 40, 8, 3), (7, 7, 1, 10)])
def test_stream_order_reads_each_row_once_from_both_halves(r0, r1, unit, row_bytes):
    """The two-stream order (intrinsics.streams.stream_halves / stream_row, group_steps / step_groups): each
    step of [r0, r1) exactly once, the halves in turn while both last, one stream when a half would
    be under the minimum bytes."""
    from workbench.engine.kernels.intrinsics.streams import group_steps, step_groups, stream_halves, stream_row
    min_bytes = 100
    mid = stream_halves(r0, r1, unit, row_bytes, min_bytes)
    half = (r1 - r0) // (2 * unit) * unit
    assert mid == (r0 + half if half * row_bytes >= min_bytes else r0)
    steps = [stream_row(j, r0, mid, unit) for j in range((r1 - r0) // unit)]
    assert sorted(steps) == list(range(r0, r0 + (r1 - r0) // unit * unit, unit))
    n = (mid - r0) // unit
    assert steps[:2 * n:2] == list(range(r0, mid, unit)) and steps[1:2 * n:2] == list(range(mid, 2 * mid - r0, unit))
    assert steps[2 * n:] == sorted(steps[2 * n:])
    pairs, n_steps = group_steps(r0, r1, unit, row_bytes, min_bytes)
    assert pairs == n
    seen = []
    for st in range(n_steps):
        a, b, nh = step_groups(st, r0, mid, pairs, unit)
        assert nh == (2 if st < pairs else 1)
        seen += [a, b][:nh]
    assert sorted(seen) == sorted(steps)


@pytest.mark.parametrize("extra", [0, 4], ids=["rows%8=0", "rows%8=4"])
@pytest.mark.parametrize("t", TYPES + ["Q4_K_x8"], ids=lambda t: getattr(t, "name", t))
def test_matvec_over_two_streams_equals_short_ranges(t, extra, path):
    """A one-token product over a range of at least 2 x TWO_STREAMS_MIN bytes reads rows from both
    halves in turn (intrinsics.streams.stream_halves): every row of the range gets exactly the value the
    same kernel gives it over short ranges (one stream), nothing outside the range is written."""
    from workbench.engine.kernels.intrinsics.streams import TWO_STREAMS_MIN
    min_bytes = min(TWO_STREAMS_MIN, 64 << 10)   # (one stream where unmeasured: the same values)
    x8 = t == "Q4_K_x8"
    if x8 and (path == "portable" or extra):
        pytest.skip("the x8 layout exists on the SIMD paths only, for rows % 8 == 0")
    gt = T.Q4_K if x8 else t
    row_bytes = make_weights(gt, rows=1).shape[1]
    # halves over the minimum; rows % 8 == 0 takes the repacked orders (8-row groups), else vec_dot's
    rows = (2 * min_bytes // row_bytes + 24) // 8 * 8 + 8 + extra
    w = make_weights(gt, rows=rows, seed=3)
    tid = int(gt)
    if x8:
        from workbench.engine.kernels.x86 import k4_x8
        k4_x8.repack_rows(w, 0, rows)
        tid = K.Q4_K_X8
    xp = K.prepare(tid, _x(1)[0])
    ref = np.full(rows, np.nan, np.float32)
    for r in range(0, rows, 8):              # 8-row ranges: far under the minimum, one stream
        K.matvec(tid, w, xp, ref, r, min(r + 8, rows))
    assert not np.isnan(ref).any()
    for r0, r1 in ((0, rows), (3, rows - 5), (8, rows - 1), (1, rows)):
        out = np.full(rows, np.nan, np.float32)
        K.matvec(tid, w, xp, out, r0, r1)
        assert np.isnan(out[:r0]).all() and np.isnan(out[r1:]).all(), (r0, r1)
        np.testing.assert_array_equal(out[r0:r1], ref[r0:r1])


def test_large_values_no_overflow(path):
    """Extreme quants (all +-127 activations against max-magnitude weights) must not overflow."""
    k = 4096
    x = np.where(np.arange(k) % 2 == 0, 1.0, -1.0).astype(np.float32)[None]
    for t in (T.Q8_0, T.Q6_K, T.Q5_K):
        w = make_weights(t, rows=3, k=k)
        ref, tol, _, _ = reference(t, w, x)
        out = np.empty(3, np.float32)
        K.matvec(int(t), w, K.prepare(int(t), x[0]), out, 0, 3)
        _check(out[None], ref, tol, t.name)


def test_cpu_vendor_reads_vendor_id(tmp_path):
    """The prefetch distances tuned per vendor read the first processor's vendor_id."""
    from workbench.engine.kernels.cpu import cpu_vendor
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\nprocessor\t: 1\n"
                    "vendor_id\t: AuthenticAMD\n")
    assert cpu_vendor(str(info)) == "GenuineIntel"
    assert cpu_vendor(str(tmp_path / "missing")) == ""

"""Float32 element-wise and attention operations, following ggml's CPU numerics.

Matrix products live in `kernels/` (grouped by tensor type); these are the
remaining operations of a transformer layer (attention is in ``attention.py``).
They are bit-exact with ggml's x86 CPU build (GCC), checked tensor by
tensor with scripts/compare_llama_tensors.py: float32 squares summed in float64
(RMS norm), the FMAs GCC contracts (RoPE rotation, GELU), libm cosf/sinf/tanhf,
GELU through f16 like ggml's table, and ggml_v_expf for the softmax -- in the form
of the build llama.cpp makes on this host (`kernels.llama_build.WIDE`: AVX-512's
or AVX2's, which round the last bit differently).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernels.intrinsics.scalars import round_f16
from .kernels.llama_build import SOFTMAX_LANES, WIDE

from .kernels.jitcache import JIT as _JIT


def _fma(nbty, llty, name: str):
    """An intrinsic a * b + c with a single rounding in one float type (llvm.fma)."""
    def fma(typingctx, a, b, c):
        def cg(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(llty, [llty] * 3), f"llvm.fma.{name}")
            return builder.call(fn, list(args))
        return nbty(nbty, nbty, nbty), cg
    fma.__name__ = fma.__qualname__ = f"fma_{name}"
    return fma


#: a * b + c in float32 with a single rounding (as the FMA instructions GCC contracts to)
fma32 = intrinsic(_fma(types.float32, ir.FloatType(), "f32"))
#: a * b + c in float64 with a single rounding
fma64 = intrinsic(_fma(types.float64, ir.DoubleType(), "f64"))


_EXP_R = np.float32(float.fromhex("0x1.8p23"))
_EXP_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_EXP_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_EXP_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_EXP_C5 = np.float32(float.fromhex("0x1.0e4020p-7"))
_EXP_C4 = np.float32(float.fromhex("0x1.573e2ep-5"))
_EXP_C3 = np.float32(float.fromhex("0x1.555e66p-3"))
_EXP_C2 = np.float32(float.fromhex("0x1.fffdb6p-2"))
_EXP_C1 = np.float32(float.fromhex("0x1.ffffecp-1"))


@nb.njit(**_JIT, inline="always")
def ggml_expf(x):
    """exp(x) in float32 exactly as ggml_v_expf (ggml-cpu/vec.h, the SIMD exp of the softmax and
    SiLU) of this host's llama.cpp build: the __m512 form (j = P u + (1 + c1 b), then scalef) or
    the __m256 one (j = P u + c1 b, then fma(j, 2^n, 2^n), with its own scaling where |n| > 126).

    Branch-free (selects, no libm call) so that loops over it vectorize.
    """
    x = np.float32(x)
    z = fma32(x, _EXP_LOG2E, _EXP_R)
    n = z - _EXP_R
    b = fma32(-n, _EXP_LN2_LO, fma32(-n, _EXP_LN2_HI, x))
    u = b * b
    p = fma32(fma32(_EXP_C5, b, _EXP_C4), u, fma32(_EXP_C3, b, _EXP_C2))
    nc = n if n > np.float32(-193.0) else np.float32(-193.0)
    nc = nc if nc < np.float32(193.0) else np.float32(193.0)
    out = np.float32(0.0) if n <= np.float32(0.0) else np.float32(np.inf)
    if WIDE:
        j = fma32(p, u, fma32(_EXP_C1, b, np.float32(1.0)))
        r = np.float32(np.float64(j) * pow2_f64(nc))  # _mm512_scalef_ps: j * 2^n, one rounding
        return out if abs(n) > np.float32(192.0) else r
    j = fma32(p, u, _EXP_C1 * b)
    kn = nc if nc > np.float32(-126.0) else np.float32(-126.0)
    kn = kn if kn < np.float32(126.0) else np.float32(126.0)
    k = np.float32(pow2_f64(kn))  # 2^n from the bits of z, exact where it is used (|n| <= 126)
    near = fma32(j, k, k)
    pos = n > np.float32(0.0)
    # 126 < |n| <= 192: 2^n (1 + j) as 2^(n -+ ...) (1 + j) times 2^127 or 2^-125 (two roundings)
    s2 = np.float32(pow2_f64(nc - np.float32(127.0) if pos else nc + np.float32(125.0)))
    s1 = _EXP_S1_POS if pos else _EXP_S1_NEG
    far = fma32(j, s2, s2) * s1
    an = abs(n)
    return out if an > np.float32(192.0) else (far if an > np.float32(126.0) else near)


_EXP_S1_POS = np.float32(2.0 ** 127)
_EXP_S1_NEG = np.float32(2.0 ** -125)


@nb.njit(**_JIT, inline="always")
def tree8(v, o):
    """v[o] + ... + v[o+7] as ggml_vec_soft_max_f32 adds 8 exps on AVX2: ((0+4)+(2+6))+((1+5)+(3+7))."""
    return ((v[o] + v[o + 4]) + (v[o + 2] + v[o + 6])) + ((v[o + 1] + v[o + 5]) + (v[o + 3] + v[o + 7]))


@nb.njit(**_JIT, inline="always")
def softmax_group_sum(v, o):
    """The sum of the SOFTMAX_LANES exps v[o:] as this host's llama.cpp build adds them."""
    if WIDE:
        return tree16(v, o)
    return tree8(v, o)


@nb.njit(**_JIT, inline="always")
def tree16(v, o):
    """v[o] + ... + v[o+15] in the order of GCC's _mm512_reduce_add_ps."""
    a0 = v[o] + v[o + 8]; a1 = v[o + 1] + v[o + 9]; a2 = v[o + 2] + v[o + 10]; a3 = v[o + 3] + v[o + 11]
    a4 = v[o + 4] + v[o + 12]; a5 = v[o + 5] + v[o + 13]; a6 = v[o + 6] + v[o + 14]; a7 = v[o + 7] + v[o + 15]
    b0 = a0 + a4; b1 = a1 + a5; b2 = a2 + a6; b3 = a3 + a7
    return (b0 + b2) + (b1 + b3)


@nb.njit(inline="always")
def _inv_rms(v: np.ndarray, eps: float) -> np.float32:
    """1 / rms(v) as ggml computes it: float32 squares summed in float64 (ggml_float)."""
    d = v.shape[0]
    s = 0.0
    for j in range(d):
        s += np.float64(v[j] * v[j])
    return _rms_scale(s, d, eps)


@nb.njit(inline="always")
def _rms_scale(s: float, d: int, eps: float) -> np.float32:
    """1 / sqrt(mean + eps) from the float64 sum of squares `s` of d values, as ggml."""
    return np.float32(1.0) / np.float32(math.sqrt(np.float32(s / d) + np.float32(eps)))


@nb.njit(inline="always")
def _inv_rms4(a: np.ndarray, b: np.ndarray, c: np.ndarray, e: np.ndarray, eps: float):
    """`_inv_rms` of four rows at once: each row's float64 sum is a chain of dependent adds in
    ggml's order (one add's latency per element); four independent chains side by side keep the
    adder busy, each sum unchanged (same bits)."""
    d = a.shape[0]
    sa = 0.0
    sb = 0.0
    sc = 0.0
    se = 0.0
    for j in range(d):
        sa += np.float64(a[j] * a[j])
        sb += np.float64(b[j] * b[j])
        sc += np.float64(c[j] * c[j])
        se += np.float64(e[j] * e[j])
    return _rms_scale(sa, d, eps), _rms_scale(sb, d, eps), _rms_scale(sc, d, eps), _rms_scale(se, d, eps)


@nb.njit(inline="always")
def _scale_row(v: np.ndarray, scale: np.float32, weight: np.ndarray, out: np.ndarray) -> None:
    """out = v * scale * weight (weight may be empty: no scale)."""
    if weight.shape[0] == v.shape[0]:
        for j in range(v.shape[0]):
            out[j] = (v[j] * scale) * weight[j]
    else:
        for j in range(v.shape[0]):
            out[j] = v[j] * scale


@nb.njit(inline="always")
def _norm_rows(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """`_norm_row` of every row of x [n, d] into out, four rows' sums at a time."""
    n = x.shape[0]
    i = 0
    while i + 4 <= n:
        s0, s1, s2, s3 = _inv_rms4(x[i], x[i + 1], x[i + 2], x[i + 3], eps)
        _scale_row(x[i], s0, weight, out[i])
        _scale_row(x[i + 1], s1, weight, out[i + 1])
        _scale_row(x[i + 2], s2, weight, out[i + 2])
        _scale_row(x[i + 3], s3, weight, out[i + 3])
        i += 4
    while i < n:
        _norm_row(x[i], weight, eps, out[i])
        i += 1


@nb.njit(inline="always")
def _norm_row(v: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out = v / rms(v) * weight (weight may be empty: no scale)."""
    _scale_row(v, _inv_rms(v, eps), weight, out)


@nb.njit(**_JIT)
def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out[i] = x[i] / rms(x[i]) * weight for each row i (weight may be empty: no scale)."""
    _norm_rows(x, weight, eps, out)


@nb.njit(**_JIT)
def weighted_slots(d: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[t] = d[t, 0] * w[t, 0] + d[t, 1] * w[t, 1] + ... in slot order, each product and sum
    rounded to f32 (llama.cpp's ggml_mul then chain of ggml_add over a MoE layer's routed slots):
    d [n, k, e], w [n, k], out [n, e]. One pass, where NumPy's expression made 2 k temporaries."""
    n, k, e = d.shape
    for t in range(n):
        w0 = w[t, 0]
        for j in range(e):
            out[t, j] = d[t, 0, j] * w0
        for i in range(1, k):
            wi = w[t, i]
            for j in range(e):
                out[t, j] = out[t, j] + d[t, i, j] * wi


@nb.njit(**_JIT)
def add_rms_norm(x: np.ndarray, y: np.ndarray, y_weight: np.ndarray, norm_y: bool, weight: np.ndarray,
                 eps: float, out: np.ndarray) -> None:
    """x += rms_norm(y) * y_weight (x += y unless norm_y); out = rms_norm(x) * weight (may be empty).

    A residual add and the norms around it in one call, with the operations of
    `rms_norm` and of a separate add in the same order (same bits). Each row's sums of squares are
    a chain of dependent float64 adds: four rows' chains side by side (512 x 640 on the AMD EPYC
    host: 0.385 -> 0.200 ms a call, 36 calls a Gemma 3 270M prefill).
    """
    n, d = x.shape
    i = 0
    while i < n:   # four rows at a time: their sums' chains side by side (`_inv_rms4`)
        m = min(4, n - i)
        if norm_y:
            if m == 4:
                s0, s1, s2, s3 = _inv_rms4(y[i], y[i + 1], y[i + 2], y[i + 3], eps)
                _add_scaled(x[i], y[i], s0, y_weight)
                _add_scaled(x[i + 1], y[i + 1], s1, y_weight)
                _add_scaled(x[i + 2], y[i + 2], s2, y_weight)
                _add_scaled(x[i + 3], y[i + 3], s3, y_weight)
            else:
                for r in range(i, i + m):
                    _add_scaled(x[r], y[r], _inv_rms(y[r], eps), y_weight)
        else:
            for r in range(i, i + m):
                for j in range(d):
                    x[r, j] += y[r, j]
        _norm_rows(x[i:i + m], weight, eps, out[i:i + m])
        i += m


@nb.njit(inline="always")
def _add_scaled(x: np.ndarray, y: np.ndarray, scale: np.float32, y_weight: np.ndarray) -> None:
    """x += (y * scale) * y_weight, as a separate rms_norm and add would round it."""
    for j in range(x.shape[0]):
        x[j] += (y[j] * scale) * y_weight[j]


@nb.njit(**_JIT)
def rms_norm_heads(x: np.ndarray, weight: np.ndarray, eps: float) -> None:
    """In-place RMS norm over the last axis of [n, heads, head_dim] (QK-norm)."""
    n, h, d = x.shape
    rows = x.reshape(n * h, d)
    _norm_rows(rows, weight, eps, rows)   # (each row read whole for its sum before it is written)


@nb.njit(**_JIT)
def rope_cache(positions: np.ndarray, n_dims: int, base: float, freq_scale: float,
               freq_factors: np.ndarray, ext_factor: float, attn_factor: float,
               corr_lo: float, corr_hi: float) -> np.ndarray:
    """cos/sin table [n, n_dims/2, 2] computed like ggml (theta accumulated in float32)."""
    half = n_dims // 2
    out = np.empty((positions.shape[0], half, 2), dtype=np.float32)
    theta_scale = np.float32(np.float32(base) ** np.float32(-2.0 / n_dims))
    fs = np.float32(freq_scale)
    has_ff = freq_factors.shape[0] == half
    for p in range(positions.shape[0]):
        theta = np.float32(positions[p])
        for i in range(half):
            ff = freq_factors[i] if has_ff else np.float32(1.0)
            extrap = np.float32(theta / ff)
            interp = np.float32(fs * extrap)
            th = interp
            mscale = np.float32(attn_factor)
            if ext_factor != 0.0:
                y = (np.float32(i) - np.float32(corr_lo)) / max(np.float32(0.001), np.float32(corr_hi - corr_lo))
                ramp = np.float32(1.0) - min(np.float32(1.0), max(np.float32(0.0), np.float32(y)))
                mix = np.float32(ramp * np.float32(ext_factor))
                th = np.float32(interp * (np.float32(1.0) - mix) + extrap * mix)
                mscale = np.float32(mscale * (np.float32(1.0) + np.float32(0.1) * np.float32(math.log(1.0 / fs))))
            out[p, i, 0] = np.float32(math.cos(th)) * mscale
            out[p, i, 1] = np.float32(math.sin(th)) * mscale
            theta = np.float32(theta * theta_scale)
    return out


@nb.njit(**_JIT)
def apply_rope(x: np.ndarray, cs: np.ndarray, neox: bool) -> None:
    """In-place rotary embedding on [n, heads, head_dim]; NEOX pairs (i, i+d/2), else (2i, 2i+1)."""
    n, h, d = x.shape
    half = cs.shape[1]
    for t in range(n):
        for k in range(h):
            for i in range(half):
                c = cs[t, i, 0]
                s = cs[t, i, 1]
                # ggml's rotate_pairs is compiled with FMA contraction (GCC's default
                # -ffp-contract=fast): x0*cos - x1*sin -> fma(x0, cos, -(x1*sin)), etc.
                if neox:
                    a = x[t, k, i]
                    b = x[t, k, i + half]
                    x[t, k, i] = fma32(a, c, -(b * s))
                    x[t, k, i + half] = fma32(a, s, b * c)
                else:
                    a = x[t, k, 2 * i]
                    b = x[t, k, 2 * i + 1]
                    x[t, k, 2 * i] = fma32(a, c, -(b * s))
                    x[t, k, 2 * i + 1] = fma32(a, s, b * c)


@nb.njit(inline="always")
def qkv_steps(q, k, v, bq, bk, bv, q_norm, k_norm, eps, cs, neox, prescale, scale):
    """The steps between the q/k/v products and the attention, in place on each row of q, k, v
    ([n, heads, head_dim]): the biases, the q/k norms, RoPE (`cs` [n, rot / 2, 2]) and, with
    `prescale`, q times `scale`. A bias, a norm weight or `cs` of size 0 is skipped. Returns the
    scale the attention still applies (1.0 after a prescale). The compiled attention calls of one
    token (`token_attention`) and of a decode batch's rows (`rows_attention`) share it."""
    for r in range(q.shape[0]):
        if bq.size:
            q[r] += bq.reshape(q.shape[1:])
        if bk.size:
            k[r] += bk.reshape(k.shape[1:])
        if bv.size:
            v[r] += bv.reshape(v.shape[1:])
    if q_norm.size:
        rms_norm_heads(q, q_norm, eps)
    if k_norm.size:
        rms_norm_heads(k, k_norm, eps)
    if cs.size:
        apply_rope(q, cs, neox)
        apply_rope(k, cs, neox)
    if not prescale:
        return scale
    for r in range(q.shape[0]):
        for i in range(q.shape[1]):
            for j in range(q.shape[2]):
                q[r, i, j] *= np.float32(scale)
    return 1.0


@intrinsic
def f16_bits(typingctx, x):
    """Bits of float32 x rounded to the nearest half (ties to even), as an int32 in [0, 65536)."""
    sig = types.int32(types.float32)

    def cg(context, builder, sig, args):
        h = builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return builder.zext(h, ir.IntType(32))

    return sig, cg


@nb.njit(**_JIT)
def gelu_f16_table(halves: np.ndarray) -> np.ndarray:
    """GELU of every half value (float32 `halves`, indexed by bits), rounded to half: ggml's f16 GELU table."""
    c = np.float32(0.7978845608028654)
    a = np.float32(0.044715)
    table = np.empty(halves.shape[0], dtype=np.float32)
    for bits in range(halves.shape[0]):
        xh = halves[bits]
        # ggml_gelu_f32 as GCC contracts it: 1 + A*x*x -> fma(A*x, x, 1)
        inner = fma32(a * xh, xh, np.float32(1.0))
        table[bits] = round_f16(np.float32(0.5) * xh * (np.float32(1.0) + np.float32(math.tanh(c * xh * inner))))
    return table


# GELU without the table: tanh(z) = expm1(2z) / (expm1(2z) + 2) in float64, expm1(2z) = 2^k (1 +
# p(r)) - 1 with 2z = k ln2 + r, |r| <= ln2 / 2 and p the Taylor polynomial of degree 9 (degree 6
# already gives every table entry; 5 misses 9 of them). Rounded to float32, then ggml's float32
# operations and the rounding to half: equal to the table for all 65,536 halves, which is all the
# inputs there are (tests/engine/test_ops.py checks every one).
_GELU_C = np.float32(0.7978845608028654)
_GELU_A = np.float32(0.044715)
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 in two parts: k * _LN2_HI is exact for |k| < 2^20
_LN2_LO = 1.90821492927058770002e-10


@intrinsic
def pow2_f64(typingctx, k):
    """2.0 ** k for an int64 k in the normal range (|k| < 1023), built from its exponent bits: an
    exact power of two. (A 65-entry table read per lane kept LLVM from a plain vector loop: the
    computed GELU of 2048 values took 6.3 us on the Intel Xeon host, 4.1 us with this.)"""
    def cg(context, builder, sig, args):
        i64 = ir.IntType(64)
        bits = builder.shl(builder.add(args[0], ir.Constant(i64, 1023)), ir.Constant(i64, 52))
        return builder.bitcast(bits, ir.DoubleType())
    return types.float64(types.int64), cg


_I3, _I4, _I5, _I6, _I7, _I8, _I9 = (1.0 / math.factorial(n) for n in range(3, 10))
#: up to this many rows, `gelu_mul` computes (a decoded token: the table's lookups miss the caches
#: after the weights streamed, 12-19 us for 2048 values against 4-8 computed); more rows (a prompt)
#: read the table, warm after the first row (1.5 us per 2048 values against 4 computed)
GELU_COMPUTE_ROWS = 4


@nb.njit(**_JIT)
def _gelu_mul_row(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """One row of `gelu_mul` computed (the comment above _GELU_C says how); LLVM vectorizes it
    over a contiguous row (8 float64 lanes)."""
    for j in range(g.shape[0]):
        x = g[j]
        xh = round_f16(x)
        inner = fma32(_GELU_A * xh, xh, np.float32(1.0))
        t2 = 2.0 * min(max(np.float64(_GELU_C * xh * inner), -10.0), 10.0)  # tanh(10) rounds to 1
        k = np.rint(t2 * _LOG2E)
        r = (t2 - k * _LN2_HI) - k * _LN2_LO
        # Horner's steps as FMAs: 8 cycles of latency each as a product and a sum, 4 as one (LLVM
        # does not contract them itself); 2048 values 4.7 -> 3.4 us, still equal to the table
        q = fma64(r, fma64(r, fma64(r, fma64(r, fma64(r, fma64(r, fma64(r, _I9, _I8), _I7), _I6), _I5), _I4),
                           _I3), 0.5)
        p = r * fma64(r, q, 1.0)
        s = pow2_f64(np.int64(k))  # |k| <= 29: |2z| <= 20 after the clamp
        em1 = s * p + (s - 1.0)
        t = np.float32(em1 / (em1 + 2.0))
        y = round_f16(np.float32(0.5) * xh * (np.float32(1.0) + t))
        y = x if x >= np.float32(10.0) else y
        y = np.float32(0.0) if x <= np.float32(-10.0) else y
        out[j] = y * u[j]


@nb.njit(**_JIT)
def gelu_mul(g: np.ndarray, u: np.ndarray, out: np.ndarray, table: np.ndarray) -> None:
    """out = gelu_tanh(g) * u, with ggml's f16 GELU table semantics (`table` = `GELU_F16`):
    computed for a few rows (`GELU_COMPUTE_ROWS`), looked up for more; the same bits."""
    n, d = g.shape
    if n <= GELU_COMPUTE_ROWS:
        for i in range(n):
            _gelu_mul_row(g[i], u[i], out[i])
        return
    for i in range(n):
        for j in range(d):
            x = g[i, j]
            if x <= -10.0:
                y = np.float32(0.0)
            elif x >= 10.0:
                y = x
            else:
                y = table[f16_bits(x)]
            out[i, j] = y * u[i, j]


@intrinsic
def swiglu16(typingctx, g, u, out, j):
    """out[j:j+16] = ggml_v_silu(g[j:j+16]) * u[j:j+16] on one 16-float vector (1-D float32 arrays
    whose elements are adjacent): `ggml_expf`'s operations lane by lane (the FMAs, the rounding
    trick, scalef as a float64 product rounded once, the overflow selects), so each lane equals the
    scalar function to the bit; LLVM lowers it to AVX-512 here (the scalar loop did not vectorize:
    3 us for a MoE layer's 8 x 768 activations, on the path between two crew jobs)."""
    sig = types.void(g, u, out, types.int64)

    def cg(context, builder, sig, args):
        f32, f64, i64 = ir.FloatType(), ir.DoubleType(), ir.IntType(64)
        vf, vd, vi = ir.VectorType(f32, 16), ir.VectorType(f64, 16), ir.VectorType(i64, 16)

        def ptr(k):
            ary = context.make_array(sig.args[k])(context, builder, args[k])
            return builder.bitcast(builder.gep(ary.data, [args[3]]), vf.as_pointer())

        def splat(c, vty=vf, ty=f32):
            return ir.Constant(vty, [ir.Constant(ty, float(c))] * 16)

        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")
        x = builder.load(ptr(0), align=4)
        neg = builder.fneg(x)
        r = splat(_EXP_R)
        z = builder.call(fma, [neg, splat(_EXP_LOG2E), r])
        n = builder.fsub(z, r)
        nn = builder.fneg(n)
        b = builder.call(fma, [nn, splat(_EXP_LN2_LO), builder.call(fma, [nn, splat(_EXP_LN2_HI), neg])])
        uu = builder.fmul(b, b)
        poly = builder.call(fma, [builder.call(fma, [splat(_EXP_C5), b, splat(_EXP_C4)]), uu,
                                  builder.call(fma, [splat(_EXP_C3), b, splat(_EXP_C2)])])
        lo, hi = splat(-193.0), splat(193.0)
        nc = builder.select(builder.fcmp_ordered(">", n, lo), n, lo)
        nc = builder.select(builder.fcmp_ordered("<", nc, hi), nc, hi)
        # to int32 first (nc is clamped to +-193): AVX2 and AVX-512F convert f32 lanes to int32 in one
        # instruction, to int64 only with AVX512DQ (else LLVM converts the 16 lanes one by one)
        vi32 = ir.VectorType(ir.IntType(32), 16)
        alt = builder.select(builder.fcmp_ordered("<=", n, splat(0.0)), splat(0.0), splat(math.inf))
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf]), "llvm.fabs.v16f32")
        an = builder.call(fabs, [n])
        if WIDE:  # ggml_v_expf's __m512 form: scalef(P u + (1 + c1 b), n)
            jj = builder.call(fma, [poly, uu, builder.call(fma, [splat(_EXP_C1), b, splat(1.0)])])
            e = builder.add(builder.sext(builder.fptosi(nc, vi32), vi), ir.Constant(vi, [ir.Constant(i64, 1023)] * 16))
            p2 = builder.bitcast(builder.shl(e, ir.Constant(vi, [ir.Constant(i64, 52)] * 16)), vd)
            res = builder.fptrunc(builder.fmul(builder.fpext(jj, vd), p2), vf)
        else:  # the __m256 form: fma(j, 2^n, 2^n), j = P u + c1 b; 126 < |n| <= 192 scaled in two steps
            jj = builder.call(fma, [poly, uu, builder.fmul(splat(_EXP_C1), b)])

            def i32s(c):
                return ir.Constant(vi32, [ir.Constant(ir.IntType(32), c)] * 16)

            def pow2(ei):  # 2^ei as float32 lanes (ei in the normal range)
                return builder.bitcast(builder.shl(builder.add(ei, i32s(127)), i32s(23)), vf)

            kn = builder.select(builder.fcmp_ordered(">", nc, splat(-126.0)), nc, splat(-126.0))
            kn = builder.select(builder.fcmp_ordered("<", kn, splat(126.0)), kn, splat(126.0))
            k = pow2(builder.fptosi(kn, vi32))
            near = builder.call(fma, [jj, k, k])
            pos = builder.fcmp_ordered(">", n, splat(0.0))
            ni = builder.fptosi(nc, vi32)
            s2 = pow2(builder.select(pos, builder.sub(ni, i32s(127)), builder.add(ni, i32s(125))))
            s1 = builder.select(pos, splat(_EXP_S1_POS), splat(_EXP_S1_NEG))
            far = builder.fmul(builder.call(fma, [jj, s2, s2]), s1)
            res = builder.select(builder.fcmp_ordered(">", an, splat(126.0)), far, near)
        ex = builder.select(builder.fcmp_ordered(">", an, splat(192.0)), alt, res)
        y = builder.fmul(builder.fdiv(x, builder.fadd(splat(1.0), ex)), builder.load(ptr(1), align=4))
        builder.store(y, ptr(2), align=4)
        return context.get_dummy_value()

    return sig, cg


@nb.njit(**_JIT)
def silu_mul(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """out = silu(g) * u (SwiGLU) as ggml_vec_swiglu_f32: ggml_v_silu, x / (1 + ggml_v_expf(-x)), on
    the build's blocks of 16 or 8 (`swiglu16` where a row's values are adjacent), expf on a row's
    last d % 16 (AVX2 build: d % 8) values (rows passed whole, or from a multiple of 16: the blocks are counted
    from the start of what is passed)."""
    n, d = g.shape
    d16 = d - d % 16
    dv = d - d % SOFTMAX_LANES  # the build's vector blocks (16 or 8 lanes); its tail takes expf
    vec = g.strides[1] == 4 and u.strides[1] == 4 and out.strides[1] == 4
    for i in range(n):
        if vec:
            gi, ui, oi = g[i], u[i], out[i]
            for j in range(0, d16, 16):
                swiglu16(gi, ui, oi, j)
            for j in range(d16, dv):
                x = g[i, j]
                out[i, j] = (x / (np.float32(1.0) + ggml_expf(-x))) * u[i, j]
        else:
            for j in range(dv):
                x = g[i, j]
                out[i, j] = (x / (np.float32(1.0) + ggml_expf(-x))) * u[i, j]
        for j in range(dv, d):
            x = g[i, j]
            out[i, j] = (x / (np.float32(1.0) + np.float32(math.exp(-x)))) * u[i, j]


GELU_F16 = gelu_f16_table(np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32))

#: a gated FFN's activation as the compiled calls take it (`gate_mul`'s kind; `activation_kind`)
SILU, GELU = 0, 1


def activation_kind(name: str) -> int:
    """A model's activation name ("gelu", else SiLU) as `gate_mul`'s kind."""
    return GELU if name == "gelu" else SILU


@nb.njit(inline="always")
def gate_mul(g, u, out, kind, gelu_table):
    """out = act(g) * u, a gated FFN's activation in a compiled call: `gelu_mul` over ggml's f16
    table (`GELU_F16`) for GELU, else `silu_mul`."""
    if kind == GELU:
        gelu_mul(g, u, out, gelu_table)
    else:
        silu_mul(g, u, out)


def apply_activation(activation: str, g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """`gate_mul` from Python, by the activation's name (the products' general path)."""
    if activation == "gelu":
        gelu_mul(g, u, out, GELU_F16)
    else:
        silu_mul(g, u, out)

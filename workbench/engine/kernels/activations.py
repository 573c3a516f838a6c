"""Quantize activations to the weight type's ggml ``vec_dot_type`` (done once per product).

Bit-exact with ggml's x86 CPU backend:

* Q8_0 / Q8_1 follow ``quantize_row_q8_0/q8_1`` of ggml-cpu/arch/x86 (the AVX2 code that runs on
  x86 builds, which differs from the ``_ref`` C code): ``d = amax/127`` stored as f16,
  ``q = round_half_even(x * (127/amax))``; Q8_1 also stores ``s = f16(d * sum(q))`` with the
  unrounded f32 ``d``.
* Q8_K follows ``quantize_row_q8_K_ref`` (x86 has no SIMD version): the element of largest
  magnitude (first one on ties) defines ``iscale = -127/max``, ``q = min(127, nearest_int(iscale*x))``
  (round half even), ``d = 1/iscale`` in f32, and ``bsums`` are sums of 16 quants.
* F16 / BF16 weights: x rounded to f16 (RNE, as F16C) or bf16 (RNE, as ggml_compute_fp32_to_bf16),
  kept as float32 values (the conversion back is exact).

Extra per-lane data for the SIMD kernels: ``n4`` = minus the sum of each group of 4 quants (int32),
which lets unsigned-weight kernels (Q4_0/Q5_0) remove their offset inside the integer accumulator.
"""
from __future__ import annotations

import numba
import numpy as np

from .intrinsics.lanes import abs_bits, i_add, i_max, q8_lanes
from .intrinsics.load_store import load_f32x8, store_i8x8
from .intrinsics.reductions import hmax_i, hsum_i
from .intrinsics.scalars import f32_of_bits, round_f16

from .jitcache import JIT as _NB
f32 = np.float32


@numba.njit(**_NB)
def quantize_q8_0(x):
    """x: float32 [n, k] -> (qs int8 [n, k], d float32 [n, k/32], n4 int32 [n, k/4]).

    Eight lanes at a time, as quantize_q8_K: the block's largest magnitude by integer compare of
    the bits, then rint(x * (127 / amax)) per lane (the product rounded once, as _mm256_mul_ps
    then _mm256_round_ps). A 640-wide token (twice a layer of Gemma 3, on the caller's path
    between two crew jobs) 0.99 -> 0.34 us against the scalar loop, called from compiled code
    on the Intel Xeon host; tests/engine/test_kernels.py holds it to ggml's reference."""
    n, k = x.shape
    nb = k // 32
    qs = np.empty((n, k), np.int8)
    d = np.empty((n, nb), np.float32)
    n4 = np.empty((n, k // 4), np.int32)
    xf = np.ascontiguousarray(x).reshape(-1)
    qf = qs.reshape(-1)
    df = d.reshape(-1)
    nf = n4.reshape(-1)
    for rb in range(n * nb):
        o = rb * 32
        m = i_max(i_max(abs_bits(load_f32x8(xf, o)), abs_bits(load_f32x8(xf, o + 8))),
                  i_max(abs_bits(load_f32x8(xf, o + 16)), abs_bits(load_f32x8(xf, o + 24))))
        amax = f32_of_bits(hmax_i(m))
        df[rb] = round_f16(amax / f32(127.0))
        idv = f32(127.0) / amax if amax != f32(0.0) else f32(0.0)
        for g in range(4):   # |x * idv| <= 127 rounds to at most 127: q8_lanes' cap never binds
            store_i8x8(qf, o + 8 * g, q8_lanes(load_f32x8(xf, o + 8 * g), idv))
        for g in range(8):
            s = np.int32(0)
            for j in range(4):
                s += np.int32(qf[o + 4 * g + j])
            nf[rb * 8 + g] = -s
    return qs, d, n4


@numba.njit(**_NB)
def quantize_q8_1(x):
    """x: float32 [n, k] -> (qs int8 [n, k], d float32 [n, k/32], s float32 [n, k/32])."""
    n, k = x.shape
    nb = k // 32
    qs = np.empty((n, k), np.int8)
    d = np.empty((n, nb), np.float32)
    s = np.empty((n, nb), np.float32)
    for r in range(n):
        for b in range(nb):
            base = b * 32
            amax = f32(0.0)
            for j in range(32):
                a = abs(x[r, base + j])
                amax = a if a > amax else amax
            dd = amax / f32(127.0)
            d[r, b] = round_f16(dd)
            idv = f32(127.0) / amax if amax != f32(0.0) else f32(0.0)
            tot = 0
            for j in range(32):
                q = np.int32(np.rint(x[r, base + j] * idv))
                qs[r, base + j] = q
                tot += q
            s[r, b] = round_f16(dd * f32(tot))
    return qs, d, s


@numba.njit(**_NB)
def quantize_q8_K(x):
    """x: float32 [n, k] -> (qs int8 [n, k], d float32 [n, k/256], bsums int32 [n, k/16]).

    Eight lanes at a time (generic LLVM vectors, every x86 path): the largest magnitude by integer
    compare of the bits, then a scalar search for its first occurrence (ggml keeps the first on
    ties), then min(127, rint(iscale * x)) with the product rounded once. 4x the scalar loop
    (8x768: 9.5 -> 2.3 us on the EPYC VM); tests/engine/test_kernels.py holds it to ggml's
    reference, ties and zero blocks included."""
    n, k = x.shape
    nb = k // 256
    qs = np.empty((n, k), np.int8)
    d = np.empty((n, nb), np.float32)
    bs = np.empty((n, k // 16), np.int32)
    xf = np.ascontiguousarray(x).reshape(-1)
    xi = xf.view(np.int32)
    qf = qs.reshape(-1)
    bsf = bs.reshape(-1)
    df = d.reshape(-1)
    for rb in range(n * nb):
        o = rb * 256
        m = abs_bits(load_f32x8(xf, o))
        for j in range(o + 8, o + 256, 8):
            m = i_max(m, abs_bits(load_f32x8(xf, j)))
        amax = hmax_i(m)
        if amax == 0:
            df[rb] = f32(0.0)
            qf[o:o + 256] = 0
            bsf[rb * 16:rb * 16 + 16] = 0
            continue
        j = o
        while (xi[j] & np.int32(0x7FFFFFFF)) != amax:
            j += 1
        iscale = f32(-127.0) / xf[j]
        for g in range(16):
            a = q8_lanes(load_f32x8(xf, o + 16 * g), iscale)
            b = q8_lanes(load_f32x8(xf, o + 16 * g + 8), iscale)
            store_i8x8(qf, o + 16 * g, a)
            store_i8x8(qf, o + 16 * g + 8, b)
            bsf[rb * 16 + g] = hsum_i(i_add(a, b))
        df[rb] = f32(1.0) / iscale
    return qs, d, bs


@numba.njit(**_NB)
def quantize_q8_0_or_K(x, k):
    """quantize_q8_K(x) when k is 1, else quantize_q8_0(x): one compiled call for the products of a
    file that takes either format (`kernels.q8_family`), the format picked at run time from the
    job's weight types, so every layer of a file mixing them shares one compiled token."""
    if k == 1:
        return quantize_q8_K(x)
    return quantize_q8_0(x)


VECTOR_ALIGN = 64  # bytes: a zmm load that crosses a cache line costs two


@numba.njit(**_NB)
def empty_aligned(n, k):
    """An uninitialised float32 [n, k] whose data starts on a 64-byte line. Numba's arrays start
    on 32 bytes: half of them put every 16-lane load of a row across two lines, and the F16
    attention kernels, which read their queries and probabilities as memory operands of their
    FMAs, ran 40 instead of 70 GFLOP/s a core (Intel Xeon family 6 model 106, MLA scores of
    576-wide rows against 16 heads, from L2)."""
    per = VECTOR_ALIGN // 4
    buf = np.empty(n * k + per, dtype=np.float32)
    skip = ((-buf.ctypes.data) % VECTOR_ALIGN) // 4
    return buf[skip:skip + n * k].reshape(n, k)


@numba.njit(**_NB)
def round_to_f16(x):
    """float32 [n, k] -> float32 values rounded to f16 (RNE), on a 64-byte line (`empty_aligned`)."""
    out = empty_aligned(x.shape[0], x.shape[1])
    n, k = x.shape
    for r in range(n):
        for j in range(k):
            out[r, j] = round_f16(x[r, j])
    return out


@numba.njit(**_NB)
def round_to_bf16(x):
    """float32 [n, k] -> float32 values rounded to bf16 like ggml_compute_fp32_to_bf16."""
    n, k = x.shape
    out = np.empty_like(x)
    xi = x.view(np.uint32)
    oi = out.view(np.uint32)
    for r in range(n):
        for j in range(k):
            u = xi[r, j]
            if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                oi[r, j] = (u & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)  # quiet NaN
            else:
                oi[r, j] = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)) << np.uint32(16)
    return out

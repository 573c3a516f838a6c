"""NumPy emulation of llama.cpp's float operation order per kernel (shared by the kernel tests)."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from workbench.engine import kernels as K

SIMD_PATHS = [p for p in K.available_paths() if p != "portable"]
ROWS, KDIM = 13, 512
f32, f64 = np.float32, np.float64



def random_activations(n, k, seed, extreme=False):
    """float32 [n, k] standard normal; extreme: quantizes to +-127 in every Q8_0 block."""
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(f32)
    if extreme:
        x[:, ::2] = 50.0
        x[:, 1::2] = -50.0
    return x


def packed(layout, w):
    """A copy of file-layout weights w in one of the engine's layouts (`packing.movers`)."""
    from workbench.engine import packing
    w2 = w.copy()
    packing.movers(layout)[0](w2, 0, w.shape[0])
    return w2


# ----------------------------------------------------------------------------- exact float32 helpers
def fma32(a, b, c):
    """Correctly rounded float32 a*b + c (arrays), via an exact float64 product and TwoSum."""
    a, b, c = (np.asarray(v, f32).astype(f64) for v in (a, b, c))
    p = a * b                       # exact: 24 + 24 bits
    s = p + c
    bp = s - c
    e = (p - bp) + (c - (s - bp))   # p + c == s + e exactly
    r = s.astype(f32)
    # s rounds correctly to f32 unless it is exactly half-way between two floats and e breaks the tie
    other = np.where(r.astype(f64) < s, np.nextafter(r, f32(np.inf)), np.nextafter(r, f32(-np.inf)))
    mid = (r.astype(f64) + other.astype(f64)) / 2 == s
    toward_other = np.sign(e) == np.sign(other.astype(f64) - s)
    return np.where(mid & (e != 0) & toward_other, other, r).astype(f32)


def hsum8(v):
    """ggml's hsum_float_8 on the last axis (8 float32 lanes)."""
    v = np.asarray(v, f32)
    s4 = v[..., 4:] + v[..., :4]
    s2 = np.stack([s4[..., 0] + s4[..., 2], s4[..., 1] + s4[..., 3]], -1)
    return s2[..., 0] + s2[..., 1]


def f16(b):
    """float32 of little-endian f16 bytes (last axis 2)."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(f32)


# ----------------------------------------------------------------------------- weights
def weights(t, rows=ROWS, k=KDIM, seed=0):
    rng = np.random.default_rng(seed + int(t))
    if t in (T.Q8_0, T.Q5_0, T.Q4_0):
        return np.ascontiguousarray(gq.quantize(rng.standard_normal((rows, k)).astype(f32), t))
    ts = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}[t]
    w = rng.integers(0, 256, (rows, k // 256, ts), dtype=np.uint8)
    sc = rng.uniform(1e-3, 2e-2, (rows, k // 256, 1)).astype(np.float16).view(np.uint8)
    if t == T.Q6_K:
        w[..., 208:210] = sc
    else:
        w[..., 0:2] = sc
        w[..., 2:4] = rng.uniform(1e-4, 5e-3, (rows, k // 256, 1)).astype(np.float16).view(np.uint8)
    return w.reshape(rows, -1)


def activations(n, seed=1):
    return np.random.default_rng(seed).standard_normal((n, KDIM)).astype(f32)


# ----------------------------------------------------------------------------- emulations
def legacy_quants(t, w):
    """(d_w float32 [rows, nb], signed integer quants int64 [rows, nb, 32]) of Q8_0 / Q5_0 / Q4_0."""
    bsz = {T.Q8_0: 34, T.Q5_0: 22, T.Q4_0: 18}[t]
    b = w.reshape(w.shape[0], -1, bsz)
    d = f16(b[..., 0:2])
    if t == T.Q8_0:
        return d, b[..., 2:].view(np.int8).astype(np.int64)
    if t == T.Q4_0:
        qs = b[..., 2:].astype(np.int64)
        return d, np.concatenate([qs & 15, qs >> 4], -1) - 8
    qh = b[..., 2:6].copy().view(np.uint32)[..., 0].astype(np.int64)
    qs = b[..., 6:].astype(np.int64)
    nib = np.concatenate([qs & 15, qs >> 4], -1)
    hi = (qh[..., None] >> np.arange(32)) & 1
    return d, (nib | (hi << 4)) - 16


def emulate_legacy(t, w, xq, xd):
    """out [n, rows]; xq int8 [n, k], xd float32 [n, nb] (Q8_0 activations)."""
    dw, q = legacy_quants(t, w)
    rows, nb = dw.shape
    n = xq.shape[0]
    x = xq.astype(np.int64).reshape(n, nb, 32)
    out = np.empty((n, rows), f32)
    for j in range(n):
        lanes = (q * x[j][None]).reshape(rows, nb, 8, 4).sum(-1)  # exact
        acc = np.zeros((rows, 8), f32)
        for b in range(nb):
            acc = fma32(lanes[:, b].astype(f32), (dw[:, b] * xd[j, b])[:, None], acc)
        out[j] = hsum8(acc)
    return out


def k4_scales(w):
    """(sc, m) int64 [rows, nb, 8] of Q4_K blocks (get_scale_min_k4)."""
    s = w.reshape(w.shape[0], -1, 144)[..., 4:16].astype(np.int64)
    sc = np.empty(s.shape[:-1] + (8,), np.int64)
    m = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[..., j] = s[..., j] & 63
            m[..., j] = s[..., j + 4] & 63
        else:
            sc[..., j] = (s[..., j + 4] & 0xF) | ((s[..., j - 4] >> 6) << 4)
            m[..., j] = (s[..., j + 4] >> 4) | ((s[..., j] >> 6) << 4)
    return sc, m


def emulate_q4_K(w, xq, xd, n_gemm):
    """Columns < n_gemm: gemm order (FMA per sub-block pair); the others: gemv order."""
    b = w.reshape(w.shape[0], -1, 144)
    rows, nb = b.shape[:2]
    dw, dmin = f16(b[..., 0:2]), f16(b[..., 2:4])
    sc, m = k4_scales(w)
    qs = b[..., 16:].astype(np.int64).reshape(rows, nb, 4, 32)
    q = np.concatenate([qs & 15, qs >> 4], -1).reshape(rows, nb, 8, 32)  # sub-block j = 2g (low), 2g+1 (high)
    n = xq.shape[0]
    out = np.empty((n, rows), f32)
    for j in range(n):
        x = xq[j].astype(np.int64).reshape(nb, 8, 32)
        dots = (q * x[None]).sum(-1) * sc                # [rows, nb, 8]
        mins = m * x.sum(-1)[None]                       # bsum over each 32-element sub-block
        acc = np.zeros(rows, f32)
        accm = np.zeros(rows, f32)
        for bb in range(nb):
            dd = dw[:, bb] * xd[j, bb]
            dm = dmin[:, bb] * xd[j, bb]
            if j < n_gemm:
                for g in range(4):
                    acc = fma32(dots[:, bb, 2 * g:2 * g + 2].sum(-1).astype(f32), dd, acc)
                    accm = fma32(mins[:, bb, 2 * g:2 * g + 2].sum(-1).astype(f32), dm, accm)
            else:
                acc = fma32(dots[:, bb].sum(-1).astype(f32), dd, acc)
                accm = fma32(mins[:, bb].sum(-1).astype(f32), dm, accm)
        out[j] = acc - accm
    return out


def k4_quants(w, q5=False):
    """(d_w, dmin [rows, nb], unsigned quants int64 [rows, nb, 8, 32] by sub-block, sc, m [rows, nb, 8])
    of Q4_K (144-byte) or Q5_K (176-byte) blocks."""
    bsz = 176 if q5 else 144
    b = w.reshape(w.shape[0], -1, bsz)
    rows, nb = b.shape[:2]
    sc, m = k4_scales(np.ascontiguousarray(b[..., :144] if not q5 else
                                           np.concatenate([b[..., :16], np.zeros(b.shape[:2] + (128,), np.uint8)], -1)
                                           ).reshape(rows, -1))
    qs = b[..., bsz - 128:].astype(np.int64).reshape(rows, nb, 4, 32)
    q = np.stack([qs & 15, qs >> 4], 3).reshape(rows, nb, 8, 32)   # sub-block 2g: low nibbles, 2g+1: high
    if q5:
        qh = b[..., 16:48].astype(np.int64)                          # [rows, nb, 32]
        for j in range(8):
            q[:, :, j] |= ((qh >> j) & 1) << 4
    return f16(b[..., 0:2]), f16(b[..., 2:4]), q, sc, m


def emulate_k4_tiled(w, xq, xd, q5=False):
    """ggml's tiled matmul (Q4_K / Q5_K, HAS_MIN): per output and super-block r = f32(S) * d_w,
    r = fma(-dmin, f32(M), r), out = fma(r, d_x, out); S = sum_j sc_j * dot_j, M = sum_j m_j * bsum_j."""
    dw, dmin, q, sc, m = k4_quants(w, q5)
    rows, nb = dw.shape
    n = xq.shape[0]
    out = np.empty((n, rows), f32)
    for j in range(n):
        x = xq[j].astype(np.int64).reshape(nb, 8, 32)
        S = ((q * x[None]).sum(-1) * sc).sum(-1)      # [rows, nb]
        M = (m * x.sum(-1)[None]).sum(-1)
        acc = np.zeros(rows, f32)
        for bb in range(nb):
            r = S[:, bb].astype(f32) * dw[:, bb]
            r = fma32(-dmin[:, bb], M[:, bb].astype(f32), r)
            acc = fma32(r, np.full(rows, xd[j, bb], f32), acc)
        out[j] = acc
    return out


def emulate_k4_vec(w, xq, xd, q5=False):
    """ggml_vec_dot_q4_K_q8_K / ggml_vec_dot_q5_K_q8_K (AVX2) per column: 8 f32 lanes fma(f32(lane),
    d_x * d_w, acc) with lane l = sum_j sc_j * (elements 4l..4l+3 of sub-block j); hsum_float_8(acc) plus
    the mins, each product of -d_x * dmin and its integer sum rounded once in an FMA: Q4_K's in 4 lanes
    fma(-d_x * dmin, f32(m_2l bs_2l + m_2l+1 bs_2l+1), .), + ((m0 + m2) + (m1 + m3)); Q5_K's in one chain
    summs = fma(-d_x * dmin, f32(M), summs), M = sum_j m_j * bs_j (the source's `summs += dmin * M`,
    contracted by GCC's -ffp-contract=fast), + summs."""
    dw, dmin, q, sc, m = k4_quants(w, q5)
    rows, nb = dw.shape
    n = xq.shape[0]
    out = np.empty((n, rows), f32)
    for j in range(n):
        x = xq[j].astype(np.int64).reshape(nb, 8, 32)
        lanes = ((q * x[None]).reshape(rows, nb, 8, 8, 4).sum(-1) * sc[..., None]).sum(2)  # [rows, nb, 8]
        bs = x.sum(-1)                                                                     # [nb, 8]
        L = (m * bs[None]).reshape(rows, nb, 1 if q5 else 4, -1).sum(-1)                   # [rows, nb, 1 or 4]
        acc = np.zeros((rows, 8), f32)
        mins = np.zeros((rows, L.shape[-1]), f32)
        for bb in range(nb):
            acc = fma32(lanes[:, bb].astype(f32), (xd[j, bb] * dw[:, bb])[:, None], acc)
            mins = fma32((-(xd[j, bb] * dmin[:, bb]))[:, None], L[:, bb].astype(f32), mins)
        out[j] = hsum8(acc) + (mins[:, 0] if q5 else ((mins[:, 0] + mins[:, 2]) + (mins[:, 1] + mins[:, 3])))
    return out


def q6_quants(w):
    """(d_w [rows, nb], unsigned 6-bit quants int64 [rows, nb, 256], scales int64 [rows, nb, 16])."""
    b = w.reshape(w.shape[0], -1, 210)
    ql = b[..., 0:128].astype(np.int64)
    qh = b[..., 128:192].astype(np.int64)
    sc = b[..., 192:208].view(np.int8).astype(np.int64)
    q = np.empty(b.shape[:2] + (256,), np.int64)
    for h in range(2):
        l1, l2, hh = ql[..., 64 * h:64 * h + 32], ql[..., 64 * h + 32:64 * h + 64], qh[..., 32 * h:32 * h + 32]
        q[..., 128 * h + 0:128 * h + 32] = (l1 & 15) | ((hh & 3) << 4)
        q[..., 128 * h + 32:128 * h + 64] = (l2 & 15) | (((hh >> 2) & 3) << 4)
        q[..., 128 * h + 64:128 * h + 96] = (l1 >> 4) | (((hh >> 4) & 3) << 4)
        q[..., 128 * h + 96:128 * h + 128] = (l2 >> 4) | (((hh >> 6) & 3) << 4)
    return f16(b[..., 208:210]), q, sc


def emulate_q6_K(w, xq, xd, tiled):
    dw, q, sc = q6_quants(w)
    rows, nb = dw.shape
    n = xq.shape[0]
    out = np.empty((n, rows), f32)
    esc = np.repeat(sc, 16, axis=-1)                      # scale of every element
    for j in range(n):
        x = xq[j].astype(np.int64).reshape(nb, 256)
        if tiled:
            acc = np.zeros(rows, f32)
            for bb in range(nb):
                s_int = ((q[:, bb] - 32) * x[bb][None] * esc[:, bb]).sum(-1)
                acc = fma32(s_int.astype(f32) * dw[:, bb], xd[j, bb], acc)  # mul + add contracted by GCC
            out[j] = acc
            continue
        acc = np.zeros((rows, 8), f32)
        for bb in range(nb):
            prod = (q[:, bb] * x[bb][None] * esc[:, bb]).reshape(rows, 8, 8, 4).sum(-1)  # [rows, chunk, lane]
            lanes = prod.sum(1)
            bs = x[bb].reshape(16, 16).sum(-1)
            lanes = lanes - 32 * (sc[:, bb, 0::2] * bs[0::2] + sc[:, bb, 1::2] * bs[1::2])
            acc = fma32(lanes.astype(f32), (xd[j, bb] * dw[:, bb])[:, None], acc)
        out[j] = hsum8(acc)
    return out


def emulate_q4_0_repacked(w, xq, xd):
    """ggml_gemv / ggml_gemm_q4_0_8x8_q8_0: per output one f32 chain over the blocks,
    acc = fma(f32(S_b), d_w * d_x, acc), S_b the block's exact integer dot product."""
    dw, q = legacy_quants(T.Q4_0, w)
    rows, nb = dw.shape
    n = xq.shape[0]
    x = xq.astype(np.int64).reshape(n, nb, 32)
    out = np.empty((n, rows), f32)
    for j in range(n):
        s_int = (q * x[j][None]).sum(-1)  # [rows, nb], exact
        acc = np.zeros(rows, f32)
        for b in range(nb):
            acc = fma32(s_int[:, b].astype(f32), dw[:, b] * xd[j, b], acc)
        out[j] = acc
    return out


def emulate(t, w, xp, n):
    xq, xd = xp[0], xp[1]
    if t == T.Q4_0 and w.shape[0] % 8 == 0:  # llama.cpp repacks it (AVX2 / AVX-512, rows % 8 == 0)
        return emulate_q4_0_repacked(w, xq, xd)
    if t in (T.Q8_0, T.Q5_0, T.Q4_0):
        return emulate_legacy(t, w, xq, xd)
    if t == T.Q4_K and w.shape[0] % 8:  # not repacked by llama.cpp: tiled matmul from 8 columns, else vec_dot
        return emulate_k4_tiled(w, xq, xd) if n >= 8 else emulate_k4_vec(w, xq, xd)
    if t == T.Q4_K:
        return emulate_q4_K(w, xq, xd, n - n % 4 if n > 1 else 0)
    if t == T.Q5_K:  # never repacked on x86: the tiled matmul from 8 columns, else vec_dot
        return emulate_k4_tiled(w, xq, xd, q5=True) if n >= 8 else emulate_k4_vec(w, xq, xd, q5=True)
    return emulate_q6_K(w, xq, xd, tiled=n >= 8)


# ----------------------------------------------------------------------------- tests


# ---- the orders that differ between llama.cpp's AVX-512 and AVX2 builds (kernels/llama_build.py)
_EXP = {name: f32(float.fromhex(h)) for name, h in (
    ("r", "0x1.8p23"), ("log2e", "0x1.715476p+0"), ("ln2_hi", "0x1.62e4p-1"), ("ln2_lo", "0x1.7f7d1cp-20"),
    ("c5", "0x1.0e4020p-7"), ("c4", "0x1.573e2ep-5"), ("c3", "0x1.555e66p-3"), ("c2", "0x1.fffdb6p-2"),
    ("c1", "0x1.ffffecp-1"))}


def ggml_v_expf(x, wide: bool):
    """ggml_v_expf (ggml-cpu/vec.h) lane by lane: the __m512 form (wide) or the __m256 one, the latter
    with its integer bit operations on 2^n as written there."""
    c = _EXP
    x = np.asarray(x, f32)
    with np.errstate(over="ignore", invalid="ignore"):
        z = fma32(x, c["log2e"], c["r"])
        n = (z - c["r"]).astype(f32)
        b = fma32(-n, c["ln2_lo"], fma32(-n, c["ln2_hi"], x))
        u = (b * b).astype(f32)
        p = fma32(fma32(c["c5"], b, c["c4"]), u, fma32(c["c3"], b, c["c2"]))
        an = np.abs(n)
        if wide:
            j = fma32(p, u, fma32(c["c1"], b, f32(1.0)))
            r = (j.astype(f64) * np.exp2(np.clip(n, -193, 193).astype(f64))).astype(f32)  # scalef: one rounding
            return np.where(an > 192, np.where(n <= 0, f32(0.0), f32(np.inf)), r).astype(f32)
        j = fma32(p, u, (c["c1"] * b).astype(f32))
        e = (z.view(np.uint32).astype(np.uint64) << 23) & 0xFFFFFFFF
        k = ((e + 0x3F800000) & 0xFFFFFFFF).astype(np.uint32).view(f32)
        g = np.where(n <= 0, 0x82000000, 0).astype(np.uint64)
        s1 = ((g + 0x7F000000) & 0xFFFFFFFF).astype(np.uint32).view(f32)
        s2 = ((e - g) & 0xFFFFFFFF).astype(np.uint32).view(f32)
        far = (fma32(s2, j, s2) * s1).astype(f32)
        return np.where(an > 192, (s1 * s1).astype(f32), np.where(an > 126, far, fma32(k, j, k))).astype(f32)


def hadd8(v):
    """GGML_F32x8_REDUCE's end on the last axis: t_i = v_i + v_(i+4), then two hadds: (t0+t1)+(t2+t3)."""
    v = np.asarray(v, f32)
    t = v[..., :4] + v[..., 4:]
    return (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])


def red16(v):
    """GCC's _mm512_reduce_add_ps on 16 float32 lanes (last axis): 8 + 8, then hsum_float_8's tree."""
    v = np.asarray(v, f32)
    return hsum8(v[..., :8] + v[..., 8:])


def vec_dot_float(wf, x, wide: bool, f16: bool):
    """ggml_vec_dot_f16 / _f32 of each row of wf (float32 values) with x: 4 accumulators of 16
    (wide) or 8 lanes over steps of 64 / 32, (0+2)+(1+3), the build's reduction; leftovers in
    float64 (f16) or f32 FMAs (f32)."""
    rows, k = wf.shape
    lanes = 16 if wide else 8
    step = 4 * lanes
    acc = np.zeros((4, rows, lanes), f32)
    np_ = k - k % step
    for j in range(0, np_, step):
        for a in range(4):
            sl = slice(j + lanes * a, j + lanes * (a + 1))
            acc[a] = fma32(wf[:, sl], np.broadcast_to(x[sl][None], (rows, lanes)), acc[a])
    v = (acc[0] + acc[2]) + (acc[1] + acc[3])
    s = red16(v) if wide else hadd8(v)
    if f16:
        s = s.astype(f64)
        for j in range(np_, k):
            s = s + (wf[:, j] * x[j]).astype(f32).astype(f64)
        return s.astype(f32)
    for j in range(np_, k):
        s = fma32(wf[:, j], np.full(rows, x[j], f32), s)
    return s


def tinyblas_float(wf, X, wide: bool):
    """llamafile tinyBLAS<16> / <8> per output: lane j % lanes accumulates by FMA in order, then the
    build's horizontal sum (_mm512_reduce_add_ps or hsum of 8)."""
    lanes = 16 if wide else 8
    rows, k = wf.shape
    acc = np.zeros((X.shape[0], rows, lanes), f32)
    for j in range(0, k, lanes):
        acc = fma32(np.broadcast_to(wf[None, :, j:j + lanes], acc.shape),
                    np.broadcast_to(X[:, None, j:j + lanes], acc.shape), acc)
    return red16(acc) if wide else hsum8(acc)

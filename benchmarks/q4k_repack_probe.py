"""Would repacking Q4_K weights pay off? A prototype gemv over an 8-row interleaved layout, measured
against the kernel numawb runs today (a benchmark, not a test; nothing in the engine uses it yet).

Today's one-token Q4_K kernel (`kernels/x86/k4_rows.py`) reads GGUF's own layout: per row and
super-block it unpacks the 6-bit scales, broadcasts each sub-block's scale with a shuffle and
reduces the row's lanes, ~60 vector instructions per 144-byte block: one core tops out near 26 GB/s
even in cache. llama.cpp repacks Q4_K on x86 into blocks of 8 rows (block_q4_Kx8: the same 8 x 144
bytes, interleaved). Here, per 8-row group and super-block (1152 bytes, GGUF's size):

    8 x (d, dmin) f16 | dword u0 of the 8 rows' scale bytes | u1 x 8 | u2 x 8 | quants: for each pair
    of sub-blocks, 8 chunks of (8 rows x 4 bytes)

so one 32-byte load holds 4 quant bytes of each of the 8 rows, each i32 lane is one row, and the
activations are a broadcast operand of vpdpbusd: no shuffles, no horizontal sums; the 8 rows' scales
and mins unpack with lane-wise shifts. The integer sums per row are exact, and the float steps are
the current kernel's (ggml_gemv_q4_K_8x8_q8_K's), so the outputs are bit-identical (checked below).

    python3 benchmarks/q4k_repack_probe.py [--k 1024] [--mb 96] [-r 5]

AMD EPYC (Zen 4) 2026-12-01 20:55 UTC, K=1024, one core, best of 5: in cache (0.25 MB) 26.2 -> 39.6
GB/s, from memory (96 MB) 23.7 -> 27.6 GB/s (the probe's streaming read: 27.7).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np
from llvmlite import ir
from numba.extending import intrinsic

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workbench.engine import kernels as K  # noqa: E402
from workbench.engine.kernels.intrinsics import (VNNI, _BYTES, _V8I, _check_array, b_and, b_shr,  # noqa: E402
                                                 bcast_b4, bcast_i32, dot_us, f_lane, f_scale, f_sub, f_zero,
                                                 fmadd_v, i_add, i_mul, i_zero, load_b32, prefetch, v8i)
from workbench.engine.kernels.jitcache import JIT  # noqa: E402
from workbench.engine.kernels.x86 import k4_rows  # noqa: E402
from workbench.engine.kernels.x86.k4_rows import f16x8_pairs  # noqa: E402

GROUP = 8 * 144  # bytes of one 8-row group's super-block, as in GGUF


@intrinsic
def load_u32x8(typingctx, a, off):
    """8 little-endian dwords at byte ``off`` of a uint8 array."""
    _check_array(a, _BYTES)
    sig = v8i(a, off)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), _V8I.as_pointer()), align=1)
    return sig, cg


@intrinsic
def srl_and(typingctx, v, n, mask):
    """(v >> n) & mask per i32 lane (n, mask: integer scalars)."""
    sig = v8i(v, n, mask)

    def cg(context, builder, sig, args):
        def splat(s):
            s = builder.trunc(s, ir.IntType(32)) if s.type.width > 32 else s
            one = builder.insert_element(ir.Constant(_V8I, None), s, ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(one, ir.Constant(_V8I, None), ir.Constant(_V8I, [0] * 8))
        return builder.and_(builder.lshr(args[0], splat(args[1])), splat(args[2]))
    return sig, cg


@intrinsic
def or_shl4(typingctx, a, b):
    """a | (b << 4) per i32 lane."""
    sig = v8i(a, b)
    return sig, lambda context, builder, sig, args: builder.or_(args[0], builder.shl(args[1], ir.Constant(_V8I, [4] * 8)))


def repack(w: np.ndarray) -> np.ndarray:
    """GGUF Q4_K rows [rows, nb * 144] (rows % 8 == 0) -> [rows / 8, nb * 1152] in the layout above."""
    rows, rb = w.shape
    nb = rb // 144
    blk = w.reshape(rows // 8, 8, nb, 144).transpose(0, 2, 1, 3)          # [g, b, r, 144]
    out = np.empty((rows // 8, nb, GROUP), np.uint8)
    out[:, :, :32] = blk[:, :, :, 0:4].reshape(rows // 8, nb, 32)          # (d, dmin) per row
    for u in range(3):                                                      # scale dwords, row-major
        out[:, :, 32 + 32 * u:64 + 32 * u] = blk[:, :, :, 4 + 4 * u:8 + 4 * u].reshape(rows // 8, nb, 32)
    qs = blk[:, :, :, 16:].reshape(rows // 8, nb, 8, 4, 8, 4)               # [g, b, r, pair, chunk, 4]
    out[:, :, 128:] = qs.transpose(0, 1, 3, 4, 2, 5).reshape(rows // 8, nb, 1024)
    return out.reshape(rows // 8, nb * GROUP)


@numba.njit(inline="always")
def scale_min(u0, u1, u2, j):
    """Sub-block j's 6-bit scale and min of the 8 rows (get_scale_min_k4, rows in lanes)."""
    if j < 4:
        return srl_and(u0, 8 * j, 63), srl_and(u1, 8 * j, 63)
    t = 8 * (j - 4)
    return (or_shl4(srl_and(u2, t, 15), srl_and(u0, t + 6, 3)),
            or_shl4(srl_and(u2, t + 4, 15), srl_and(u1, t + 6, 3)))


@numba.njit(**JIT)
def gemv_x8(wp, xp, out, g0, g1):
    """out[8g:8g+8] for groups g in [g0, g1) of a repacked matrix; xp: Q8_K activations."""
    xq, xd, xb = xp
    nb = xd.shape[0]
    xqu = xq.view(np.uint8)
    bs = np.empty(nb * 8, np.int32)
    for b in range(nb):
        for j in range(8):
            bs[b * 8 + j] = np.int32(xb[b * 16 + 2 * j]) + np.int32(xb[b * 16 + 2 * j + 1])
    for g in range(g0, g1):
        acc = f_zero()
        accm = f_zero()
        wg = wp[g]
        for b in range(nb):
            o = b * GROUP
            prefetch(wg, o + 4096)
            u0, u1, u2 = load_u32x8(wg, o + 32), load_u32x8(wg, o + 64), load_u32x8(wg, o + 96)
            s = i_zero()
            m = i_zero()
            for p in range(4):
                ae = i_zero()
                ao = i_zero()
                for c in range(8):
                    raw = load_b32(wg, o + 128 + p * 256 + c * 32)
                    ae = dot_us(VNNI, ae, b_and(raw, 15), bcast_b4(xqu, b * 256 + 64 * p + 4 * c))
                    ao = dot_us(VNNI, ao, b_shr(raw, 4), bcast_b4(xqu, b * 256 + 64 * p + 32 + 4 * c))
                sce, mne = scale_min(u0, u1, u2, 2 * p)
                sco, mno = scale_min(u0, u1, u2, 2 * p + 1)
                s = i_add(s, i_add(i_mul(ae, sce), i_mul(ao, sco)))
                m = i_add(m, i_add(i_mul(mne, bcast_i32(bs, b * 8 + 2 * p)),
                                   i_mul(mno, bcast_i32(bs, b * 8 + 2 * p + 1))))
            d, dm = f16x8_pairs(wg, o, 4)
            acc = fmadd_v(acc, s, f_scale(d, xd[b]))
            accm = fmadd_v(accm, m, f_scale(dm, xd[b]))
        r = f_sub(acc, accm)
        for q in range(8):
            out[g * 8 + q] = f_lane(r, q)


def q4k_matrix(rows: int, k: int, rng) -> np.ndarray:
    w = rng.integers(0, 256, (rows, k // 256 * 144), dtype=np.uint8)
    for b in range(k // 256):  # finite, small d and dmin
        w[:, b * 144:b * 144 + 4] = np.frombuffer(np.float16([0.01, 0.001]).tobytes(), np.uint8)
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=1024, help="row length (multiple of 256)")
    ap.add_argument("--mb", type=float, default=96.0, help="size of the from-memory matrix")
    ap.add_argument("-r", type=int, default=5, help="timed rounds (best is reported)")
    a = ap.parse_args()
    if K.kernel_path() != "avx512-vnni":
        sys.exit(f"this prototype needs AVX512-VNNI (kernel path here: {K.kernel_path()})")
    rng = np.random.default_rng(0)
    xp = K.prepare(K.Q4_K, rng.standard_normal(a.k).astype(np.float32))
    plain = k4_rows.q4_K_gemv_rows8(VNNI)
    print(f"{os.uname().machine}, K={a.k}, one thread; GGUF bytes per second (both layouts are the same size)")
    for mb, reps in ((0.25, 3000), (a.mb, 12)):
        rows = max(8, int(mb * 1e6 / (a.k // 256 * 144)) // 8 * 8)
        w = q4k_matrix(rows, a.k, rng)
        wp = repack(w)
        oa, ob = np.empty(rows, np.float32), np.empty(rows, np.float32)
        plain(w, xp, oa, 0, rows)
        gemv_x8(wp, xp, ob, 0, rows // 8)
        if not np.array_equal(oa, ob):
            sys.exit("the repacked kernel's outputs differ from the current kernel's")
        ta, tb = [], []
        for _ in range(a.r):
            for f, m, o, n, tl in ((plain, w, oa, rows, ta), (gemv_x8, wp, ob, rows // 8, tb)):
                t = time.perf_counter()
                for _ in range(reps):
                    f(m, xp, o, 0, n)
                tl.append((time.perf_counter() - t) / reps)
        where = "in cache" if mb < 1 else "from memory"
        print(f"{mb:g} MB {where}: GGUF layout (today) {w.nbytes / min(ta) / 1e9:.1f} GB/s, "
              f"8-row repacked {w.nbytes / min(tb) / 1e9:.1f} GB/s; outputs bit-identical")


if __name__ == "__main__":
    main()

"""Q4_K in llama.cpp's 8-row interleaved layout (block_q4_Kx8's size: 8 x 144 bytes a super-block).

The engine keeps a mixture-of-experts model's Q4_K expert tensors in this layout (`..packing`
repacks them in place after loading; kernels see the internal type id `kernels.Q4_K_X8`).
`benchmarks/q4k_repack_probe.py` measured the gemv below at 26.3 -> 40.8 GB/s in cache against
the `k4_rows` kernel on the GGUF layout on the EPYC host, the same outputs to the bit.

Layout: a matrix of `rows` x `rb` bytes (rows % 8 == 0) keeps its size and its 8-row groups in place;
group g's bytes [8g * rb, (8g + 8) * rb) hold, per super-block b, a 1152-byte record:

    8 x (d, dmin) f16 | dword u0 of the 8 rows' scale bytes | u1 x 8 | u2 x 8 |
    quants: for each pair of sub-blocks p (4), 8 chunks c of (8 rows x 4 bytes: bytes 4c..4c+3 of
    the pair's 32 quant bytes)

so any copy or placement at 8-row boundaries moves whole groups, exactly as it moved rows before.
The gemv keeps one row per i32 lane: a 32-byte load is 4 quant bytes of each of 8 rows, the
activations are a broadcast operand of vpdpbusd, the 8 rows' scales and mins unpack with lane
shifts; no shuffles, no horizontal sums. Integer sums are exact and the float steps are those of
ggml_gemv_q4_K_8x8_q8_K (and of `k4_rows`), so the outputs are the same to the bit.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.extending import intrinsic

from ..llvm_ir import BYTE_DTYPES, i32_vector_type, splat, to_i32, v8i, vector_load_intrinsic, VNNI
from ..intrinsics.dots import dot_us, dot_us16
from ..intrinsics.lanes import (b_and, b_shr, concat, f_lane, f_scale, f_sub, f_zero, f_zero16, fmadd_v, i_add, i_mul,
                                i_muls, i_zero, i_zero16)
from ..intrinsics.load_store import bcast_b4, bcast_b4_16, bcast_i32, load_b32
from ..intrinsics.streams import prefetch, PREFETCH_NEAR, prime_streams, stream_halves
from ..jitcache import JIT as _NB
from .k4_rows import f16x8_pairs

GROUP = 8 * 144  # one 8-row group's super-block record
# bytes of each record the one-token product prefetches: all of it (faster than its first line
# only; benchmarks/HISTORY.md, "The x8 layout's prefetch span")
PREFETCH_SPAN = GROUP


load_u32x8 = vector_load_intrinsic("load_u32x8", v8i, BYTE_DTYPES, "8 little-endian dwords at byte ``off`` of a uint8 array.")


@intrinsic
def srl_and(typingctx, v, n, mask):
    """(v >> n) & mask per i32 lane (i32x8 or i32x16; n, mask: integer scalars)."""
    sig = i32_vector_type(v)(v, n, mask)

    def cg(context, builder, sig, args):
        n, mask = (splat(builder, to_i32(builder, a), args[0].type) for a in args[1:])
        return builder.and_(builder.lshr(args[0], n), mask)
    return sig, cg


@intrinsic
def or_shl4(typingctx, a, b):
    """a | (b << 4) per i32 lane (i32x8 or i32x16)."""
    sig = i32_vector_type(a, b)(a, b)
    return sig, lambda context, builder, sig, args: builder.or_(
        args[0], builder.shl(args[1], ir.Constant(args[1].type, [4] * args[1].type.count)))


def group_order(rb: int) -> np.ndarray:
    """For one 8-row group of rows `rb` bytes long: the GGUF byte (row * rb + offset) that each byte
    of the x8 layout holds, in x8 order."""
    nb = rb // 144
    order = np.empty((nb, GROUP), np.int64)
    r = np.arange(8)[:, None] * rb
    for b in range(nb):
        s = r + b * 144                                                     # [8, 1]: each row's block
        order[b, :32] = (s + np.arange(4)).ravel()                          # (d, dmin) of rows 0..7
        for u in range(3):                                                  # scale dword u of rows 0..7
            order[b, 32 + 32 * u:64 + 32 * u] = (s + 4 + 4 * u + np.arange(4)).ravel()
        q = s[None, None] + 16 + 32 * np.arange(4)[:, None, None, None] + 4 * np.arange(8)[None, :, None, None] \
            + np.arange(4)[None, None, None, :]                              # [pair, chunk, row, byte]
        order[b, 128:] = q.ravel()
    return order.ravel()


_WORDS: dict[int, np.ndarray] = {}


def _word_order(rb: int) -> np.ndarray:
    """`group_order` in 4-byte words: every field of the layout is whole aligned dwords (rb is a
    multiple of 144, so of 4), so the permutation moves words."""
    o = _WORDS.get(rb)
    if o is None:
        b = group_order(rb)
        o = _WORDS[rb] = np.ascontiguousarray(b[::4] // 4).astype(np.int32)
    return o


@numba.njit(**_NB)
def _permute(w: np.ndarray, r0: int, r1: int, order: np.ndarray, to_x8: bool) -> None:
    """Groups r0 // 8 .. r1 // 8 of w permuted in place, one group (8 x rb bytes) at a time."""
    wf = w.reshape(-1).view(np.uint32)
    n = order.shape[0]
    tmp = np.empty(n, np.uint32)
    for g in range(r0 // 8, r1 // 8):
        at = g * n
        for i in range(n):  # (not tmp[:] = ...: a slice copy compiles a shape check's message, seconds)
            tmp[i] = wf[at + i]
        if to_x8:
            for i in range(n):
                wf[at + i] = tmp[order[i]]
        else:
            for i in range(n):
                wf[at + order[i]] = tmp[i]


def _check_rows(w: np.ndarray, r0: int, r1: int) -> None:
    if r0 % 8 or r1 % 8 or not 0 <= r0 <= r1 <= w.shape[0] or w.shape[1] % 144 or not w.flags.c_contiguous:
        raise ValueError(f"x8 layout: rows [{r0}, {r1}) of a {w.shape} matrix are not whole 8-row groups "
                         "of C-contiguous Q4_K rows")


def repack_rows(w: np.ndarray, r0: int, r1: int) -> None:
    """In place: rows [r0, r1) of a GGUF Q4_K matrix w [rows, rb] (r0, r1 multiples of 8) -> the x8
    layout, group by group."""
    _check_rows(w, r0, r1)
    _permute(w, r0, r1, _word_order(w.shape[1]), True)


def unpack_rows(w: np.ndarray, r0: int, r1: int) -> None:
    """The inverse of `repack_rows`: rows [r0, r1) back to GGUF's layout, in place."""
    _check_rows(w, r0, r1)
    _permute(w, r0, r1, _word_order(w.shape[1]), False)


def dequant_x8(w: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """float32 [r1 - r0, k]: rows r0..r1-1 of a matrix in the x8 layout (its groups unpacked into a
    copy, then GGUF Q4_K's dequantization)."""
    from ..k_quants import dequant_q4_K
    g0, g1 = r0 // 8 * 8, -(-r1 // 8) * 8
    tmp = w[g0:g1].copy()
    unpack_rows(tmp, 0, g1 - g0)
    return dequant_q4_K(tmp, r0 - g0, r1 - g0)


def _scale_min():
    @numba.njit(inline="always")
    def scale_min(u0, u1, u2, j):
        """Sub-block j's 6-bit scale and min of the 8 rows (get_scale_min_k4, rows in lanes)."""
        if j < 4:
            return srl_and(u0, 8 * j, 63), srl_and(u1, 8 * j, 63)
        t = 8 * (j - 4)
        return (or_shl4(srl_and(u2, t, 15), srl_and(u0, t + 6, 3)),
                or_shl4(srl_and(u2, t + 4, 15), srl_and(u1, t + 6, 3)))
    return scale_min


@numba.njit(**_NB)
def _pair_sums(xb, nb):
    """[c, b * 8 + j]: the activation sum of sub-block j (32 elements) of column c, block b."""
    n = xb.shape[0]
    bs = np.empty((n, nb * 8), np.int32)
    for c in range(n):
        for b in range(nb):
            for j in range(8):
                bs[c, b * 8 + j] = np.int32(xb[c, b * 16 + 2 * j]) + np.int32(xb[c, b * 16 + 2 * j + 1])
    return bs


def gemv_x8(mode: int):
    """``fn(w, xp, out, r0, r1)``: out[r0:r1] for a matrix in the x8 layout (w [rows, rb], rows % 8
    == 0), xp the Q8_K activations of one column; bit-identical to `k4_rows.q4_K_gemv_rows8` on the
    GGUF layout. A range that cuts a group computes the whole group and writes its own rows."""
    scale_min = _scale_min()

    @numba.njit(inline="always")
    def block(wf, o, xqu, xd, bs, b, acc, accm):
        """Super-block b of one group at byte o: its sums added into acc (scales), accm (mins)."""
        for j in range(0, PREFETCH_SPAN, 64):   # (see intrinsics.streams.PREFETCH_NEAR)
            prefetch(wf, o + PREFETCH_NEAR + j)
        u0, u1, u2 = load_u32x8(wf, o + 32), load_u32x8(wf, o + 64), load_u32x8(wf, o + 96)
        s = i_zero()
        m = i_zero()
        for p in range(4):
            ae = i_zero()
            ao = i_zero()
            for c in range(8):
                raw = load_b32(wf, o + 128 + p * 256 + c * 32)
                ae = dot_us(mode, ae, b_and(raw, 15), bcast_b4(xqu, b * 256 + 64 * p + 4 * c))
                ao = dot_us(mode, ao, b_shr(raw, 4), bcast_b4(xqu, b * 256 + 64 * p + 32 + 4 * c))
            sce, mne = scale_min(u0, u1, u2, 2 * p)
            sco, mno = scale_min(u0, u1, u2, 2 * p + 1)
            s = i_add(s, i_add(i_mul(ae, sce), i_mul(ao, sco)))
            m = i_add(m, i_add(i_mul(mne, bcast_i32(bs, b * 8 + 2 * p)),
                               i_mul(mno, bcast_i32(bs, b * 8 + 2 * p + 1))))
        d, dm = f16x8_pairs(wf, o, 4)
        return fmadd_v(acc, s, f_scale(d, xd[b])), fmadd_v(accm, m, f_scale(dm, xd[b]))

    @numba.njit(inline="always")
    def put(out, g, r0, r1, r):
        if 8 * g >= r0 and 8 * g + 8 <= r1:
            for q in range(8):
                out[8 * g + q] = f_lane(r, q)
        else:
            for q in range(8):
                if r0 <= 8 * g + q < r1:
                    out[8 * g + q] = f_lane(r, q)

    @numba.njit(**_NB)
    def fn(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        xqu = xq.view(np.uint8)
        bs = _pair_sums(xb.reshape(1, -1), nb).reshape(-1)
        g0, g1 = r0 // 8, (r1 + 7) // 8
        # two streams (intrinsics.streams.TWO_STREAMS_MIN): a group of each half, super-block by super-block
        # (whole groups in turn, 4.6-9 KB apart in time, would leave one stream idle)
        gm = stream_halves(g0, g1, 1, 8 * rb)
        prime_streams(wf, g0, gm, 8 * rb, PREFETCH_NEAR)
        for g in range(g0, gm):
            h = g + gm - g0
            acc, accm, acc2, accm2 = f_zero(), f_zero(), f_zero(), f_zero()
            for b in range(nb):
                acc, accm = block(wf, 8 * g * rb + b * GROUP, xqu, xd, bs, b, acc, accm)
                acc2, accm2 = block(wf, 8 * h * rb + b * GROUP, xqu, xd, bs, b, acc2, accm2)
            put(out, g, r0, r1, f_sub(acc, accm))
            put(out, h, r0, r1, f_sub(acc2, accm2))
        for g in range(2 * gm - g0, g1):
            acc = f_zero()
            accm = f_zero()
            for b in range(nb):
                acc, accm = block(wf, 8 * g * rb + b * GROUP, xqu, xd, bs, b, acc, accm)
            put(out, g, r0, r1, f_sub(acc, accm))

    return fn


def _tile(mode: int, gemm: bool, wide: bool):
    """``tile(wf, xs, ds, bs, outs, g, r0, r1, rb, nb, four)``: the rows of 8-row group g (ymm lanes),
    or of groups g and g + 1 side by side (``wide``: 16 rows in zmm lanes, AVX-512 VNNI), that lie in
    [r0, r1), for 4 columns (one when not ``four``: the first of each tuple). Column j's Q8_K
    activations are xs[j] (its quants as bytes), ds[j] (a scale a super-block), bs[j] (its 16 sums a
    super-block), its outputs outs[j]: each a 1-D array of its own, so the columns can be any rows of
    any arrays (a server pass's tokens routed to one expert). Every lane runs the 8-row steps of its
    own row, so both widths give the same bits: a zmm vpdpbusd is the two groups' ymm ones, the
    integer sums stay exact, the float steps are lane-wise."""
    scale_min = _scale_min()
    lanes = 16 if wide else 8
    izero, fzero = (i_zero16, f_zero16) if wide else (i_zero, f_zero)

    if wide:
        @numba.njit(inline="always")
        def ld(wf, o, o8):
            return concat(load_b32(wf, o), load_b32(wf, o + o8))

        @numba.njit(inline="always")
        def ld_u(wf, o, o8):
            return concat(load_u32x8(wf, o), load_u32x8(wf, o + o8))

        @numba.njit(inline="always")
        def scales(wf, o, o8):
            da, dma = f16x8_pairs(wf, o, 4)
            db, dmb = f16x8_pairs(wf, o + o8, 4)
            return concat(da, db), concat(dma, dmb)

        @numba.njit(inline="always")
        def sub(e, o, lo, hi, xf, xo):
            return dot_us16(e, lo, bcast_b4_16(xf, xo)), dot_us16(o, hi, bcast_b4_16(xf, xo + 32))
    else:
        @numba.njit(inline="always")
        def ld(wf, o, o8):
            return load_b32(wf, o)

        @numba.njit(inline="always")
        def ld_u(wf, o, o8):
            return load_u32x8(wf, o)

        @numba.njit(inline="always")
        def scales(wf, o, o8):
            return f16x8_pairs(wf, o, 4)

        @numba.njit(inline="always")
        def sub(e, o, lo, hi, xf, xo):
            return dot_us(mode, e, lo, bcast_b4(xf, xo)), dot_us(mode, o, hi, bcast_b4(xf, xo + 32))

    @numba.njit(inline="always")
    def sums(s, m, e, o, sce, sco, mne, mno, xb, bo):
        """The pair's scaled sums and mins; xb's sums of 16 activations, two to a sub-block
        (the pair's at bo .. bo + 3)."""
        return (i_add(s, i_add(i_mul(e, sce), i_mul(o, sco))),
                i_add(m, i_add(i_muls(mne, xb[bo] + xb[bo + 1]), i_muls(mno, xb[bo + 2] + xb[bo + 3]))))

    @numba.njit(inline="always")
    def put(out, g, r0, r1, acc, accm):
        r = f_sub(acc, accm)
        for q in range(lanes):
            if r0 <= 8 * g + q < r1:
                out[8 * g + q] = f_lane(r, q)

    @numba.njit(inline="always")
    def tile(wf, xs, ds, bs, outs, g, r0, r1, rb, nb, four):
        x0, x1, x2, x3 = xs
        xd0, xd1, xd2, xd3 = ds
        b0, b1, b2, b3 = bs
        a0 = fzero(); a1 = fzero(); a2 = fzero(); a3 = fzero()
        m0 = fzero(); m1 = fzero(); m2 = fzero(); m3 = fzero()
        base = 8 * g * rb
        o8 = 8 * rb   # the next group's record of the same super-block
        for b in range(nb):
            o = base + b * GROUP
            u0, u1, u2 = ld_u(wf, o + 32, o8), ld_u(wf, o + 64, o8), ld_u(wf, o + 96, o8)
            d, dm = scales(wf, o, o8)
            S0 = izero(); S1 = izero(); S2 = izero(); S3 = izero()
            M0 = izero(); M1 = izero(); M2 = izero(); M3 = izero()
            for p in range(4):
                e0 = izero(); e1 = izero(); e2 = izero(); e3 = izero()
                d0 = izero(); d1 = izero(); d2 = izero(); d3 = izero()
                xo = b * 256 + 64 * p
                for ch in range(8):
                    raw = ld(wf, o + 128 + p * 256 + ch * 32, o8)
                    lo = b_and(raw, 15)
                    hi = b_shr(raw, 4)
                    e0, d0 = sub(e0, d0, lo, hi, x0, xo + 4 * ch)
                    if four:
                        e1, d1 = sub(e1, d1, lo, hi, x1, xo + 4 * ch)
                        e2, d2 = sub(e2, d2, lo, hi, x2, xo + 4 * ch)
                        e3, d3 = sub(e3, d3, lo, hi, x3, xo + 4 * ch)
                sce, mne = scale_min(u0, u1, u2, 2 * p)
                sco, mno = scale_min(u0, u1, u2, 2 * p + 1)
                bo = b * 16 + 4 * p
                if gemm and four:   # the gemm's FMAs on this pair's sums
                    S0, M0 = sums(izero(), izero(), e0, d0, sce, sco, mne, mno, b0, bo)
                    S1, M1 = sums(izero(), izero(), e1, d1, sce, sco, mne, mno, b1, bo)
                    S2, M2 = sums(izero(), izero(), e2, d2, sce, sco, mne, mno, b2, bo)
                    S3, M3 = sums(izero(), izero(), e3, d3, sce, sco, mne, mno, b3, bo)
                    a0 = fmadd_v(a0, S0, f_scale(d, xd0[b])); m0 = fmadd_v(m0, M0, f_scale(dm, xd0[b]))
                    a1 = fmadd_v(a1, S1, f_scale(d, xd1[b])); m1 = fmadd_v(m1, M1, f_scale(dm, xd1[b]))
                    a2 = fmadd_v(a2, S2, f_scale(d, xd2[b])); m2 = fmadd_v(m2, M2, f_scale(dm, xd2[b]))
                    a3 = fmadd_v(a3, S3, f_scale(d, xd3[b])); m3 = fmadd_v(m3, M3, f_scale(dm, xd3[b]))
                    continue
                S0, M0 = sums(S0, M0, e0, d0, sce, sco, mne, mno, b0, bo)
                if four:
                    S1, M1 = sums(S1, M1, e1, d1, sce, sco, mne, mno, b1, bo)
                    S2, M2 = sums(S2, M2, e2, d2, sce, sco, mne, mno, b2, bo)
                    S3, M3 = sums(S3, M3, e3, d3, sce, sco, mne, mno, b3, bo)
            if gemm and four:
                continue
            a0 = fmadd_v(a0, S0, f_scale(d, xd0[b])); m0 = fmadd_v(m0, M0, f_scale(dm, xd0[b]))
            if four:
                a1 = fmadd_v(a1, S1, f_scale(d, xd1[b])); m1 = fmadd_v(m1, M1, f_scale(dm, xd1[b]))
                a2 = fmadd_v(a2, S2, f_scale(d, xd2[b])); m2 = fmadd_v(m2, M2, f_scale(dm, xd2[b]))
                a3 = fmadd_v(a3, S3, f_scale(d, xd3[b])); m3 = fmadd_v(m3, M3, f_scale(dm, xd3[b]))
        o0, o1, o2, o3 = outs
        put(o0, g, r0, r1, a0, m0)
        if four:
            put(o1, g, r0, r1, a1, m1)
            put(o2, g, r0, r1, a2, m2)
            put(o3, g, r0, r1, a3, m3)

    return tile


def _columns(mode: int, gemm: bool):
    """``run(w, xs, ds, bs, outs, r0, r1, four)``: rows [r0, r1) of a matrix in the x8 layout for the
    columns of the 4-tuples (`_tile`'s operands; one when not ``four``), the 16-row tiles where they
    fit on AVX-512 VNNI, a last odd group and single columns in 8-row ones."""
    tile8 = _tile(mode, gemm, False)
    wide = mode == VNNI
    tile_w = _tile(mode, gemm, True) if wide else tile8
    step = 2 if wide else 1

    @numba.njit(inline="always")
    def run(w, xs, ds, bs, outs, r0, r1, four):
        rb = w.shape[1]
        nb = rb // 144
        wf = w.reshape(-1)
        g1 = (r1 + 7) // 8
        g = r0 // 8
        if four:
            while g + step <= g1:
                tile_w(wf, xs, ds, bs, outs, g, r0, r1, rb, nb, True)
                g += step
        while g < g1:
            tile8(wf, xs, ds, bs, outs, g, r0, r1, rb, nb, four)
            g += 1

    return run


def gemv_x8_cols(mode: int, gemm: bool = False):
    """``fn(w, xp, out, r0, r1)``: out[c, r0:r1] for every column c of the 2-D prepared xp, over the
    x8 layout, 4 columns per weight load. Per output the arithmetic is the one-column gemv's
    (`gemv_x8`): llama.cpp's repacked mul_mat_id runs ggml_gemv_q4_K_8x8_q8_K once per token.

    gemm: a dense weight's product (llama.cpp's repacked mul_mat): the tiles of 4 columns in
    ggml_gemm_q4_K_8x8_q8_K's order (one FMA per pair of sub-blocks on its exact integer sums, for
    the scaled and the min parts, as `q4_K_gemm_rows8` on the file's layout), the last n % 4
    columns (all of them when n < 4) in the gemv's.

    On AVX-512 VNNI the 4-column tiles take two groups at once (16 rows in zmm lanes, `_tile`),
    a last odd group and single columns one group in ymm lanes. Intel Xeon host (family 6 model
    207), one core, K = 2048 (`kernels_bench.py --types Q4_K_x8 --n 512 / --n 64`): 177 / 176 ->
    277 / 281 GFLOP/s; a synthetic dense Q4_K model's pp512 there 0.97x / 1.00x -> 1.32x / 1.29x
    llama.cpp's (1 / 2 threads)."""
    run = _columns(mode, gemm)

    @numba.njit(**_NB)
    def fn(w, xp, out, r0, r1):
        xq, xd, xb = xp
        n, k = xq.shape
        xf = xq.reshape(-1).view(np.uint8)
        c = 0
        while c < n:
            if c + 4 <= n:
                run(w, (xf[c * k:c * k + k], xf[c * k + k:c * k + 2 * k], xf[c * k + 2 * k:c * k + 3 * k],
                        xf[c * k + 3 * k:c * k + 4 * k]), (xd[c], xd[c + 1], xd[c + 2], xd[c + 3]),
                    (xb[c], xb[c + 1], xb[c + 2], xb[c + 3]), (out[c], out[c + 1], out[c + 2], out[c + 3]),
                    r0, r1, True)
                c += 4
            else:
                x = xf[c * k:c * k + k]
                run(w, (x, x, x, x), (xd[c], xd[c], xd[c], xd[c]), (xb[c], xb[c], xb[c], xb[c]),
                    (out[c], out[c], out[c], out[c]), r0, r1, False)
                c += 1

    return fn


def columns_kernel(mode: int):
    """``fn(w, xs, ds, bs, outs, r0, r1, four)`` compiled: `_columns`' gemv order (as mul_mat_id) for
    compiled callers whose columns are scattered (the crew's spans of one expert's tokens), so the
    expert's weight is unpacked once for 4 of them instead of once a token (where that pays: the
    crew's `run_chunk`)."""
    run = _columns(mode, False)

    @numba.njit(**_NB)
    def fn(w, xs, ds, bs, outs, r0, r1, four):
        run(w, xs, ds, bs, outs, r0, r1, four)

    return fn


def kernels(mode: int) -> dict:
    """{"Q4_K_x8": (matvec, matmat, mul_mat_id)} for one instruction-set mode: a dense weight's
    prompt product in llama.cpp's repacked mul_mat order (the gemm's tiles of 4 columns, the gemv
    for the rest), an expert's tokens the gemv per column, as its repacked mul_mat_id does."""
    cols = gemv_x8_cols(mode)

    @numba.njit(**_NB)
    def mul_mat_id(w, xp, out, r0, r1, rows):
        cols(w, xp, out, r0, r1)

    return {"Q4_K_x8": (gemv_x8(mode), gemv_x8_cols(mode, gemm=True), mul_mat_id)}

"""Q4_K in llama.cpp's 8-row interleaved layout (block_q4_Kx8's size: 8 x 144 bytes a super-block).

Not used by the engine yet (branch work: the load-time repack and the type plumbing come next).
`benchmarks/q4k_repack_probe.py` measured the gemv below at 26.3 -> 40.8 GB/s in cache against
today's `k4_rows` kernel on the EPYC host, the same outputs to the bit.

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

from ..intrinsics import (_BYTES, _V8I, _arr_load, _check_array, _splat, _to_i32, b_and, b_shr, bcast_b4, bcast_i32, dot_us, f_lane, f_scale,
                          f_sub, f_zero, fmadd_v, i_add, i_mul, i_zero, load_b32, prefetch, PREFETCH_BYTES, v8i)
from ..jitcache import JIT as _NB
from .k4_rows import f16x8_pairs

GROUP = 8 * 144  # one 8-row group's super-block record


@intrinsic
def load_u32x8(typingctx, a, off):
    """8 little-endian dwords at byte ``off`` of a uint8 array."""
    _check_array(a, _BYTES)
    sig = v8i(a, off)
    return sig, lambda context, builder, sig, args: _arr_load(context, builder, sig, args, 0, _V8I)


@intrinsic
def srl_and(typingctx, v, n, mask):
    """(v >> n) & mask per i32 lane (n, mask: integer scalars)."""
    sig = v8i(v, n, mask)

    def cg(context, builder, sig, args):
        n, mask = (_splat(builder, _to_i32(builder, a), _V8I) for a in args[1:])
        return builder.and_(builder.lshr(args[0], n), mask)
    return sig, cg


@intrinsic
def or_shl4(typingctx, a, b):
    """a | (b << 4) per i32 lane."""
    sig = v8i(a, b)
    return sig, lambda context, builder, sig, args: builder.or_(args[0], builder.shl(args[1], ir.Constant(_V8I, [4] * 8)))


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


@numba.njit(**_NB)
def _permute(w: np.ndarray, r0: int, r1: int, order: np.ndarray, to_x8: bool) -> None:
    wf = w.reshape(-1)
    n = order.shape[0]
    tmp = np.empty(n, np.uint8)
    for g in range(r0 // 8, r1 // 8):
        at = g * n
        tmp[:] = wf[at:at + n]
        if to_x8:
            for i in range(n):
                wf[at + i] = tmp[order[i]]
        else:
            for i in range(n):
                wf[at + order[i]] = tmp[i]


def repack_rows(w: np.ndarray, r0: int, r1: int) -> None:
    """In place: rows [r0, r1) of a GGUF Q4_K matrix w [rows, rb] (r0, r1 multiples of 8) -> the x8
    layout, group by group."""
    _permute(w, r0, r1, group_order(w.shape[1]), True)


def unpack_rows(w: np.ndarray, r0: int, r1: int) -> None:
    """The inverse of `repack_rows`: rows [r0, r1) back to GGUF's layout, in place."""
    _permute(w, r0, r1, group_order(w.shape[1]), False)


def gemv_x8(mode: int):
    """``fn(w, xp, out, r0, r1)``: out[r0:r1] for a matrix in the x8 layout (w [rows, rb], r0 and r1
    multiples of 8), xp the Q8_K activations; bit-identical to `k4_rows.q4_K_gemv_rows8` on the
    GGUF layout."""
    @numba.njit(inline="always")
    def scale_min(u0, u1, u2, j):
        """Sub-block j's 6-bit scale and min of the 8 rows (get_scale_min_k4, rows in lanes)."""
        if j < 4:
            return srl_and(u0, 8 * j, 63), srl_and(u1, 8 * j, 63)
        t = 8 * (j - 4)
        return (or_shl4(srl_and(u2, t, 15), srl_and(u0, t + 6, 3)),
                or_shl4(srl_and(u2, t + 4, 15), srl_and(u1, t + 6, 3)))

    @numba.njit(**_NB)
    def fn(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        xqu = xq.view(np.uint8)
        bs = np.empty(nb * 8, np.int32)
        for b in range(nb):
            for j in range(8):
                bs[b * 8 + j] = np.int32(xb[b * 16 + 2 * j]) + np.int32(xb[b * 16 + 2 * j + 1])
        for g in range(r0 // 8, r1 // 8):
            acc = f_zero()
            accm = f_zero()
            base = 8 * g * rb
            for b in range(nb):
                o = base + b * GROUP
                prefetch(wf, o + PREFETCH_BYTES)
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
                acc = fmadd_v(acc, s, f_scale(d, xd[b]))
                accm = fmadd_v(accm, m, f_scale(dm, xd[b]))
            r = f_sub(acc, accm)
            for q in range(8):
                out[8 * g + q] = f_lane(r, q)

    return fn

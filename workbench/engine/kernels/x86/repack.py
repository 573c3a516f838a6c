"""Repacked / tiled prompt kernels (ggml-cpu's repack.cpp and tinyBLAS counterparts).

Each factory closes over ``mode`` (llvm_ir.AVX2 or llvm_ir.VNNI) like the family modules and
returns kernels that regroup weights or activations once per call so the inner loop has no
horizontal sums: Q4_0/Q5_0 register tiles of 2 rows x 8 columns over regrouped activations, and Q4_K /
Q6_K with 8 weight rows in the lanes of a vector.  Per output the float order is that of the family
module's per-row code (or llama.cpp's repacked gemm), so results do not depend on the tiling.
"""
from __future__ import annotations

import numba
import numpy as np

from ..llvm_ir import VNNI
from ..intrinsics.dots import dot_ss, dot_us, dot_us16, madd16, madd_bcast16, offset_step16, sub_dot16, tiled_min_step
from ..intrinsics.lanes import (f4_lane, f4_make, f4_scale, f4_zero, f_lane, f_scale, f_sub, f_zero, f_zero16, fma4_i,
                                fma_sv, fmadd_i, fmadd_im, fmadd_v, half_f, i_add, i_mul, i_shl, i_sub, i_zero,
                                i_zero16, scale16)
from ..intrinsics.load_store import (bcast_b4, bcast_i32, load_b32, load_b64, load_f32x16, load_f32x4, load_f32x8,
                                     load_i16, load_i8, store_f32x4)
from ..intrinsics.quant_blocks import unpack_q45x2
from ..intrinsics.reductions import hsum_f, hsum_i, reduce4
from ..intrinsics.regroup import quants_unsigned, store_fields16, transpose_words
from ..intrinsics.scalars import f16_to_f32, fma_s, ld_u32
from ..intrinsics.streams import stream_halves, stream_row

from .blocks import block_scales, k4_scales
from .rows_lowbit import iq4_xs_scales, pairs_of, q3_scales_m32
from ..i_quants import iq4_xs_scale
from ..k_quants import q3_K_scale, q3_K_scales


from ..jitcache import JIT as _NB
f32 = np.float32


# ============================================================================= Q4_0 / Q5_0 prompt tiles
@numba.njit(**_NB)
def _pack_q8_0(xq, xd, n4, shift):
    """Q8_0 activations of columns [0, n - n % 8) regrouped by tiles of 8 columns, block by block:
    xt [tile, block, column, 32] quants, mt [tile, block, column, 8] = n4 << shift (the lanes'
    initial values), st [tile, block, column] scales.  A tile's block is then 3 short contiguous
    runs: few pointers (no register spills) and vector loads of the columns' scales."""
    n = xq.shape[0]
    nb = xd.shape[1]
    nt = n // 8
    xt = np.empty(nt * nb * 256, np.int8)
    mt = np.empty(nt * nb * 64, np.int32)
    st = np.empty(nt * nb * 8, np.float32)
    for t in range(nt):
        for b in range(nb):
            e = (t * nb + b) * 8
            for j in range(8):
                c = 8 * t + j
                for q in range(32):  # (element-wise: a slice copy compiles a shape check and its
                    xt[(e + j) * 32 + q] = xq[c, b * 32 + q]  # message formatting, 3.4 s on a first start)
                for q in range(8):
                    mt[(e + j) * 8 + q] = np.int32(n4[c, b * 8 + q]) << shift
                st[e + j] = xd[c, b]
    return xt, mt, st


@numba.njit(inline="always")
def _tile_setup(w, xp, r0, r1, bsz, shift):
    """A Q4_0 / Q5_0 (or, on AVX-512, Q8_0) prompt product's start: columns, blocks, bytes a row, the
    tiles' regrouped activations (_pack_q8_0) and the weight rows' block scales."""
    xq, xd, n4 = xp
    nb = xd.shape[1]
    xt, mt, st = _pack_q8_0(xq, xd, n4, shift)
    return xq.shape[0], nb, w.shape[1], xt, mt, st, block_scales(w, r0, r1, nb, bsz)


def q0_matmat(mode, unpack, bits, bsz, shift):
    """Q4_0/Q5_0 prompt product over activations regrouped per tile of 8 columns (``unpack``: the
    block's unsigned quants; ``bits``: 4 or 5; ``shift``: log2 of the quant offset). On AVX-512
    (VNNI) two columns of a row share a zmm register (`q0_matmat_pairs`)."""
    if mode == VNNI:
        return q0_matmat_pairs(unpack, _unpack_q45_x2(bits), bsz, shift)
    # ---- matmat: register tiles of 2 rows x 8 columns over activations regrouped per tile
    # (_pack_q8_0).  The loop over column tiles is outermost, so a tile's activations (~10 KB at
    # k=640) stay in L1 while the weight rows stream past.  Per dot the loop issues just the VNNI
    # dot, the int -> float conversion and the FMA (its scale d_w * d_x an embedded-broadcast load
    # from a per-tile table made 4 products per multiply); a weight block is unpacked once for 8
    # columns.  (The FP pipes are the limit: 2 x 8 beats 4 x 4, which unpacks twice as often.)
    # Per (row, column) the block order and the f32 accumulation are those of the single-column
    # loop, so results do not depend on the tiling.
    #
    # Q4_0/Q5_0: lanes = dpbusd(init, u, x) with u the unsigned quants (nibble, nibble | bit5 << 4) and
    # init = n4 << shift (n4 = -sum of each group of 4 activation quants; shift 3 or 4 = log2 of the
    # offset), the shift done once per call instead of per block.  (Q8_0 keeps the sign trick: with
    # u = q + 128 AVX2's pmaddubsw would saturate.)
    @numba.njit(inline="always")
    def col2(a0, a1, u0, u1, xt, xo, mt, mo, sc, so, j):
        """Column j of a tile: both rows' accumulators after one block (scale products at sc[so:])."""
        x = load_b32(xt, xo + 32 * j)
        m = load_i8(mt, mo + 8 * j)
        return fmadd_im(a0, dot_us(mode, m, u0, x), sc, so + j), fmadd_im(a1, dot_us(mode, m, u1, x), sc, so + 8 + j)

    @numba.njit(inline="always")
    def col1(a0, u0, xt, xo, mt, mo, sc, so, j):
        return fmadd_im(a0, dot_us(mode, load_i8(mt, mo + 8 * j), u0, load_b32(xt, xo + 32 * j)), sc, so + j)

    @numba.njit(inline="always")
    def tile_scales(sc, st, t, nb, dws, r, rows):
        """sc[b * 16 + 8 * q + j] = d_w(row r + q, block b) * d_x(column j of tile t, block b) for
        q < rows: a tile's scale products, before its block loop."""
        for b in range(nb):
            lo = load_f32x4(st, (t * nb + b) * 8)
            hi = load_f32x4(st, (t * nb + b) * 8 + 4)
            for q in range(rows):
                d = dws[(r + q) * nb + b]
                store_f32x4(sc, b * 16 + 8 * q, f4_scale(lo, d))
                store_f32x4(sc, b * 16 + 8 * q + 4, f4_scale(hi, d))

    @numba.njit(inline="always")
    def put8(out, c, i, a0, a1, a2, a3, a4, a5, a6, a7):
        out[c, i] = hsum_f(a0); out[c + 1, i] = hsum_f(a1)
        out[c + 2, i] = hsum_f(a2); out[c + 3, i] = hsum_f(a3)
        out[c + 4, i] = hsum_f(a4); out[c + 5, i] = hsum_f(a5)
        out[c + 6, i] = hsum_f(a6); out[c + 7, i] = hsum_f(a7)

    def make_matmat(unpack, bsz, shift):
        unpack_r, at = rowwise(unpack), file_rows(bsz)

        @numba.njit(**_NB)
        def matmat(w, xp, out, r0, r1):
            xq, xd, n4 = xp
            n, nb, rb, xt, mt, st, dws = _tile_setup(w, xp, r0, r1, bsz, shift)
            sc = np.empty(nb * 16, np.float32)
            for t in range(n // 8):
                c = 8 * t
                i = r0
                while i < r1:
                    two = i + 2 <= r1
                    tile_scales(sc, st, t, nb, dws, i - r0, 2 if two else 1)
                    a00 = f_zero(); a01 = f_zero(); a02 = f_zero(); a03 = f_zero()
                    a04 = f_zero(); a05 = f_zero(); a06 = f_zero(); a07 = f_zero()
                    if two:
                        a10 = f_zero(); a11 = f_zero(); a12 = f_zero(); a13 = f_zero()
                        a14 = f_zero(); a15 = f_zero(); a16 = f_zero(); a17 = f_zero()
                        for b in range(nb):
                            o0 = i * rb + b * bsz
                            u0 = unpack(w, o0)
                            u1 = unpack(w, o0 + rb)
                            e = t * nb + b
                            xo = e * 256
                            mo = e * 64
                            so = b * 16
                            a00, a10 = col2(a00, a10, u0, u1, xt, xo, mt, mo, sc, so, 0)
                            a01, a11 = col2(a01, a11, u0, u1, xt, xo, mt, mo, sc, so, 1)
                            a02, a12 = col2(a02, a12, u0, u1, xt, xo, mt, mo, sc, so, 2)
                            a03, a13 = col2(a03, a13, u0, u1, xt, xo, mt, mo, sc, so, 3)
                            a04, a14 = col2(a04, a14, u0, u1, xt, xo, mt, mo, sc, so, 4)
                            a05, a15 = col2(a05, a15, u0, u1, xt, xo, mt, mo, sc, so, 5)
                            a06, a16 = col2(a06, a16, u0, u1, xt, xo, mt, mo, sc, so, 6)
                            a07, a17 = col2(a07, a17, u0, u1, xt, xo, mt, mo, sc, so, 7)
                        put8(out, c, i + 1, a10, a11, a12, a13, a14, a15, a16, a17)
                    else:
                        for b in range(nb):
                            u0 = unpack(w, i * rb + b * bsz)
                            e = t * nb + b
                            xo = e * 256
                            mo = e * 64
                            so = b * 16
                            a00 = col1(a00, u0, xt, xo, mt, mo, sc, so, 0)
                            a01 = col1(a01, u0, xt, xo, mt, mo, sc, so, 1)
                            a02 = col1(a02, u0, xt, xo, mt, mo, sc, so, 2)
                            a03 = col1(a03, u0, xt, xo, mt, mo, sc, so, 3)
                            a04 = col1(a04, u0, xt, xo, mt, mo, sc, so, 4)
                            a05 = col1(a05, u0, xt, xo, mt, mo, sc, so, 5)
                            a06 = col1(a06, u0, xt, xo, mt, mo, sc, so, 6)
                            a07 = col1(a07, u0, xt, xo, mt, mo, sc, so, 7)
                    put8(out, c, i, a00, a01, a02, a03, a04, a05, a06, a07)
                    i += 2 if two else 1
            q0_columns(mode, unpack_r, at, shift, w, xq, xd, n4, out, r0, r1, n - n % 8)
        return matmat
    return make_matmat(unpack, bsz, shift)


@numba.njit(inline="always")
def q0_columns(mode, unpack, at, shift, w, xq, xd, n4, out, r0, r1, c0):
    """Columns c0.. of a Q4_0/Q5_0 prompt product one at a time (the columns a tile of 8 leaves);
    `at`, `unpack`: the weights' layout (`file_rows`)."""
    n, k = xq.shape
    nb = xd.shape[1]
    rb = w.shape[1]
    xf = xq.reshape(-1)
    ns = n4.reshape(-1)
    for c in range(c0, n):
        for i in range(r0, r1):
            acc = f_zero()
            for b in range(nb):
                o0, r = at(i, b, rb)
                m = i_shl(load_i8(ns, c * (k // 4) + b * 8), shift)
                acc = fmadd_i(acc, dot_us(mode, m, unpack(w, o0, r), load_b32(xf, c * k + b * 32)),
                              f16_to_f32(w, o0 + 2 * r) * xd[c, b])
            out[c, i] = hsum_f(acc)


def file_rows(bsz):
    """A layout for the tiles: ``at(i, b, rb)`` -> (byte offset of the record holding row i's block
    b, the row's place r in it; its f16 scale at offset + 2r). The file's: one block per record."""
    @numba.njit(inline="always")
    def at(i, b, rb):
        return i * rb + b * bsz, 0
    return at


def rowwise(unpack):
    """A file-layout unpack(w, o) as the tiles' unpack(w, o, r) (r: the row's place in its record)."""
    @numba.njit(inline="always")
    def u(w, o, r):
        return unpack(w, o)
    return u


@numba.njit(**_NB)
def _pair_scales(st, t, nb, sx):
    """sx[(b * 4 + p) * 16 + l] = d_x of column 2p + l // 8 of tile t in block b: a tile's activation
    scales, each repeated over the 8 lanes of its column's half of a zmm register."""
    for b in range(nb):
        for p in range(4):
            for lane in range(16):
                sx[(b * 4 + p) * 16 + lane] = st[(t * nb + b) * 8 + 2 * p + lane // 8]


@numba.njit(inline="always")
def _pair_step(acc, u, xt, xo, mt, mo, sx, so, d, p):
    """One row's block against columns 2p and 2p + 1 of a tile: the lanes of column 2p in the low
    half, 2p + 1 in the high half, each half what `col1` does for its column."""
    lanes = dot_us16(load_i16(mt, mo + 16 * p), u, load_b64(xt, xo + 64 * p))
    return fmadd_v(acc, lanes, scale16(sx, so + 16 * p, d))


@numba.njit(inline="always")
def _put_pairs(out, c, i, a0, a1, a2, a3):
    out[c, i] = hsum_f(half_f(a0, 0)); out[c + 1, i] = hsum_f(half_f(a0, 1))
    out[c + 2, i] = hsum_f(half_f(a1, 0)); out[c + 3, i] = hsum_f(half_f(a1, 1))
    out[c + 4, i] = hsum_f(half_f(a2, 0)); out[c + 5, i] = hsum_f(half_f(a2, 1))
    out[c + 6, i] = hsum_f(half_f(a3, 0)); out[c + 7, i] = hsum_f(half_f(a3, 1))


def _unpack_q45_x2(bits):
    @numba.njit(inline="always")
    def unpack2(w, o):
        return unpack_q45x2(bits, w, o)
    return unpack2


def q0_matmat_pairs(unpack, unpack2, bsz, shift):
    """q0_matmat on AVX-512 (also Q8_0's, its quants offset by 128: `intrinsics.quant_blocks.q8_offset`; unpack2:
    a block's unsigned quants in both halves of a zmm register, unpack: in a ymm one, for the
    columns a tile leaves). The same tiles of 2 rows x 8 columns, two columns of a row in one zmm
    register (lanes 0-7 the first column's f32x8 chain, 8-15 the second's): a tile's two adjacent
    columns' activations, group sums and scales are 64 contiguous bytes each (_pack_q8_0, _pair_scales),
    and the dot, the conversion and the FMA are one instruction for both columns; the scale products
    d_w * d_x are one multiply per pair (each lane's product rounds as the scalar one). The ymm form
    issued three FP instructions per (row, column, block) and was bound by the FP pipes (AMD EPYC
    host, Zen 5: matmat.Q5_0 58 % of a 512-token prefill at 161 GFLOP/s)."""
    tiles = _pair_tiles(rowwise(unpack), rowwise(unpack2), file_rows(bsz), shift)

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        xq, xd, n4 = xp
        n, nb, rb, xt, mt, st, dws = _tile_setup(w, xp, r0, r1, bsz, shift)
        tiles(w, xq, xd, n4, xt, mt, st, dws, out, r0, r1)
    return matmat


def q0_tiles(unpack, unpack2, at, shift):
    """(setup, tiles) of the AVX-512 Q4_0 / Q5_0 prompt product over another layout of the weights
    (`q5_pairs`): ``at`` its addressing (`file_rows`), ``unpack(w, o, r)``, ``unpack2(w, o, r)`` a
    row's unsigned quants in a ymm / both halves of a zmm register. setup(xq, xd, n4) -> (xt, mt,
    st); tiles(w, xq, xd, n4, xt, mt, st, dws, out, r0, r1) with dws the rows' block scales
    ((i - r0) * nb + b)."""
    @numba.njit(**_NB)
    def setup(xq, xd, n4):
        return _pack_q8_0(xq, xd, n4, shift)
    return setup, _pair_tiles(unpack, unpack2, at, shift)


#: a row-pair product over more bytes than this (a range the caches do not keep between the tiles'
#: passes, one per 8 columns) with at most FEW_MAX columns reads the range once for all columns
#: (`few_columns`): the tied output matrix of Gemma 3 270M (178 MB) times 8 / 12 / 16 / 24 rows
#: (a server batch's logits) 21.8 / 47.2 / 35.8 / 63.5 ms in the tiles, 14.5 / 23.0 / 32.3 / 44.7
#: ms so (AMD EPYC Zen 5, 1 thread); a 2048-row matrix (1.4 MB) stayed faster in the tiles.
FEW_BYTES = 8 << 20
FEW_MAX = 32


def pair_products(few, unpack, unpack2, at, row_scales, shift):
    """(matmat, mul_mat_id) of a row-pair layout (`q5_pairs`, `q8_pairs`): the q0 prompt tiles
    (`q0_tiles`) reading each row's blocks where the layout keeps them (`at`, row_scales(w, r0,
    r1, nb): its addressing and the rows' block scales, `blocks.pair_layout`) for whole tiles of 8
    columns, few(w, xp, out, r0, r1) for the rest, and for every column of a product over a large
    range with few columns (FEW_BYTES). Every column's numbers are the one-token product's, so
    mul_mat_id is the prompt product."""
    setup, tiles = q0_tiles(unpack, unpack2, at, shift)

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        xq, xd, n4 = xp
        n = xq.shape[0]
        big = (r1 - r0) * w.shape[1] > FEW_BYTES and n <= FEW_MAX
        n8 = 0 if big else n // 8 * 8
        if n8 > 0:
            xq8, xd8, n48 = xq[:n8], xd[:n8], n4[:n8]
            xt, mt, st = setup(xq8, xd8, n48)
            tiles(w, xq8, xd8, n48, xt, mt, st, row_scales(w, r0, r1, xd.shape[1]), out[:n8], r0, r1)
        if n8 < n:
            few(w, (xq[n8:], xd[n8:], n4[n8:]), out[n8:], r0, r1)

    @numba.njit(**_NB)
    def mul_mat_id(w, xp, out, r0, r1, rows):
        matmat(w, xp, out, r0, r1)
    return matmat, mul_mat_id


def _pair_tiles(unpack, unpack2, at, shift):
    """`q0_matmat_pairs`' tiles over activations already regrouped (_pack_q8_0), the weights in
    the layout `at` (`file_rows`) unpacks with unpack(w, o, r), unpack2(w, o, r)."""
    @numba.njit(**_NB)
    def tiles(w, xq, xd, n4, xt, mt, st, dws, out, r0, r1):
        n = xq.shape[0]
        nb = xd.shape[1]
        rb = w.shape[1]
        sx = np.empty(nb * 64, np.float32)
        for t in range(n // 8):
            c = 8 * t
            _pair_scales(st, t, nb, sx)
            i = r0
            while i < r1:
                two = i + 2 <= r1
                i1 = i + 1 if two else i   # a last odd row is computed twice (once kept)
                a0 = f_zero16(); a1 = f_zero16(); a2 = f_zero16(); a3 = f_zero16()
                b0 = f_zero16(); b1 = f_zero16(); b2 = f_zero16(); b3 = f_zero16()
                for b in range(nb):
                    o0, s0 = at(i, b, rb)
                    o1, s1 = at(i1, b, rb)
                    u0 = unpack2(w, o0, s0)
                    u1 = unpack2(w, o1, s1)
                    e = t * nb + b
                    xo = e * 256
                    mo = e * 64
                    so = b * 64
                    d0 = dws[(i - r0) * nb + b]
                    d1 = dws[(i1 - r0) * nb + b]
                    a0 = _pair_step(a0, u0, xt, xo, mt, mo, sx, so, d0, 0)
                    b0 = _pair_step(b0, u1, xt, xo, mt, mo, sx, so, d1, 0)
                    a1 = _pair_step(a1, u0, xt, xo, mt, mo, sx, so, d0, 1)
                    b1 = _pair_step(b1, u1, xt, xo, mt, mo, sx, so, d1, 1)
                    a2 = _pair_step(a2, u0, xt, xo, mt, mo, sx, so, d0, 2)
                    b2 = _pair_step(b2, u1, xt, xo, mt, mo, sx, so, d1, 2)
                    a3 = _pair_step(a3, u0, xt, xo, mt, mo, sx, so, d0, 3)
                    b3 = _pair_step(b3, u1, xt, xo, mt, mo, sx, so, d1, 3)
                _put_pairs(out, c, i, a0, a1, a2, a3)
                if two:
                    _put_pairs(out, c, i1, b0, b1, b2, b3)
                i += 2 if two else 1
        q0_columns(VNNI, unpack, at, shift, w, xq, xd, n4, out, r0, r1, n - n % 8)
    return tiles


# ============================================================================= Q4_K rows in lanes
@numba.njit(inline="always")
def _k4_row_fields(w, wf, o, sc, s0, ss, mn, m0, ms, dw, dm, di, dm_sign):
    """The fields of the Q4_K / Q5_K super-block at byte o for `_repack_q4_K`: d, dmin (times
    dm_sign: -1 gives the tiled step's -dmin, exact) at dw[di] / dm[di], scale j at sc[s0 + j * ss],
    the mins as i16 pairs, pair p at mn[m0 + p * ms]."""
    dw[di] = f16_to_f32(w, o)
    dm[di] = dm_sign * f16_to_f32(w, o + 2)
    sl, sh, ml, mh = k4_scales(wf, o + 4)
    for j in range(4):
        sc[s0 + j * ss] = np.int32((sl >> np.uint32(8 * j)) & np.uint32(0xFF))
        sc[s0 + (4 + j) * ss] = np.int32((sh >> np.uint32(8 * j)) & np.uint32(0xFF))
    mn[m0] = np.int32((ml & np.uint32(0xFF)) | ((ml & np.uint32(0xFF00)) << np.uint32(8)))
    mn[m0 + ms] = np.int32(((ml >> np.uint32(16)) & np.uint32(0xFF)) | ((ml >> np.uint32(24)) << np.uint32(16)))
    mn[m0 + 2 * ms] = np.int32((mh & np.uint32(0xFF)) | ((mh & np.uint32(0xFF00)) << np.uint32(8)))
    mn[m0 + 3 * ms] = np.int32(((mh >> np.uint32(16)) & np.uint32(0xFF)) | ((mh >> np.uint32(24)) << np.uint32(16)))


@numba.njit(inline="always")
def _rows_to_lanes(tb, qt, gb, G):
    """A super-block's G rows of 64 words each (tb, row-major) to word c of every row side by side
    (words (gb * 64 + c) * G + r of qt): 64 / G transposes of G x G words in registers."""
    if G == 16:
        for blk in range(4):
            transpose_words(tb, 64 * blk, qt, (gb * 64 + 16 * blk) * 64, 0, 16, 16)
    else:
        for blk in range(8):
            transpose_words(tb, 32 * blk, qt, (gb * 64 + 8 * blk) * 32, 0, 8, 8)


@numba.njit(**_NB)
def _repack_q4_K(w, r0, ng, nb, q5=False, G=8):
    """Q4_K rows r0 .. r0 + G * ng regrouped by G rows (8 or 16: a ymm or zmm register's lanes), for
    dot products whose lanes are rows.

    qt (bytes) [group, block, sub-block j, chunk e, row, 4]: quants 4e..4e+3 of sub-block j (one byte
    each); sc [group, block, j, row] scales; mn [group, block, pair p, row] = m_2p | m_2p+1 << 16;
    dw, dm [group, block, row] the f16 d and dmin as float32. q5: Q5_K rows, each quant with its
    fifth bit (0..31) and dm holding -dmin (the tiled step's negated min scale, exact)."""
    bsz = 176 if q5 else 144
    rb = w.shape[1]
    wf = w.reshape(-1)
    qt = np.empty(ng * nb * 256 * G, np.uint8)
    sc = np.empty(ng * nb * 8 * G, np.int32)
    mn = np.empty(ng * nb * 4 * G, np.int32)
    dw = np.empty(ng * nb * G, np.float32)
    dm = np.empty(ng * nb * G, np.float32)
    fb = np.empty(256 * G, np.uint8)     # (G == 16: each row's scales and pairs, then transposed)
    f32w = fb.view(np.int32)
    scb = sc.view(np.uint8)
    mnb = mn.view(np.uint8)
    tb = np.empty(256 * G, np.uint8)
    for g in range(ng):
        for b in range(nb):
            gb = g * nb + b
            for r in range(G):
                o = (r0 + G * g + r) * rb + b * bsz
                if G == 16:   # the row's 8 scales and 4 pairs side by side, the 16 rows transposed below
                    _k4_row_fields(w, wf, o, f32w, 64 * r, 1, f32w, 64 * r + 8, 1, dw, dm, gb * G + r,
                                   f32(-1.0 if q5 else 1.0))
                else:
                    _k4_row_fields(w, wf, o, sc, gb * 8 * G + r, G, mn, gb * 4 * G + r, G, dw, dm, gb * G + r,
                                   f32(-1.0 if q5 else 1.0))
                # the row's quants in natural order (sub-block j's chunk e is word 8 j + e of 64)
                if q5:
                    quants_unsigned(wf, o, tb, 256 * r, 4)
                else:
                    quants_unsigned(wf, o, tb, 256 * r, 3)
            if G == 16:
                transpose_words(fb, 0, scb, gb * 512, 0, 8, 16)
                transpose_words(fb, 0, mnb, gb * 256, 8, 4, 16)
            _rows_to_lanes(tb, qt, gb, G)
    return qt, sc, mn, dw, dm


@numba.njit(**_NB)
def _bsum_pairs(xb, nb):
    """int32 [n, nb, 4]: per pair p of 32-element sub-blocks, bsum_2p | bsum_2p+1 << 16 (i16 pairs for
    pmaddwd; |bsum| <= 32 * 127 fits)."""
    n = xb.shape[0]
    out = np.empty(n * nb * 4, np.uint32)
    for c in range(n):
        for b in range(nb):
            for p in range(4):
                j = b * 16 + 4 * p
                s0 = np.uint32(np.int32(xb[c, j] + xb[c, j + 1]) & 0xFFFF)
                s1 = np.uint32(np.int32(xb[c, j + 2] + xb[c, j + 3]) & 0xFFFF)
                out[(c * nb + b) * 4 + p] = s0 | (s1 << np.uint32(16))
    return out.view(np.int32)


def q4_K_rows8(mode):
    """The Q4_K gemm over groups of 8 rows regrouped so that a vector lane is a row."""
    # ---- rows in lanes: 8 rows regrouped (_repack_q4_K) so that a vpdpbusd lane is a row: a 32-byte
    # vector holds 4 quants of each of 8 rows, the activations are broadcast 4 bytes at a time, and a
    # sub-block's dot products of 8 rows come out in 8 lanes with no horizontal sums.  Then per pair
    # of sub-blocks, per column: S = dot_2g * sc_2g + dot_2g+1 * sc_2g+1 (vpmulld, exact), the mins'
    # M = m_2g * bsum_2g + m_2g+1 * bsum_2g+1 (one vpdpwssd on i16 pairs), and the gemm's two FMAs
    # with d_w * d_x and dmin * d_x -- the float operations of q4_K_gemm_rows, 8 rows at once.
    @numba.njit(inline="always")
    def k4_sub2(d0, d1, w0, w1, xq, xo):
        """Sub-blocks 2g, 2g+1 (weights w0, w1: one chunk of 4 quants x 8 rows) of one column."""
        return dot_us(mode, d0, w0, bcast_b4(xq, xo)), dot_us(mode, d1, w1, bcast_b4(xq, xo + 32))

    @numba.njit(inline="always")
    def k4_fmas(acc, accm, d0, d1, s0, s1, mn, bs, bo, dv, mv, dx):
        """The gemm's two FMAs of one pair of sub-blocks, one column, 8 rows."""
        acc = fmadd_v(acc, i_add(i_mul(d0, s0), i_mul(d1, s1)), f_scale(dv, dx))
        accm = fmadd_v(accm, madd16(mode, i_zero(), mn, bcast_i32(bs, bo)), f_scale(mv, dx))
        return acc, accm

    @numba.njit(inline="always")
    def put_rows8(out, c, i, acc, accm):
        r = f_sub(acc, accm)
        for q in range(8):
            out[c, i + q] = f_lane(r, q)

    @numba.njit(**_NB)
    def q4_K_gemm_rows8(w, xp, out, r0, r1):
        """Columns [0, n - n % 4) of rows r0..r1-1 ((r1 - r0) % 8 == 0), gemm order."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        k = xq.shape[1]
        ng = (r1 - r0) // 8
        qt, sc, mn, dw, dm = _repack_q4_K(w, r0, ng, nb)
        bs = _bsum_pairs(xb, nb)
        xf = xq.reshape(-1)
        for t in range(n // 4):
            c = 4 * t
            for g in range(ng):
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                m0 = f_zero(); m1 = f_zero(); m2 = f_zero(); m3 = f_zero()
                for b in range(nb):
                    gb = g * nb + b
                    dv = load_f32x8(dw, gb * 8)
                    mv = load_f32x8(dm, gb * 8)
                    for p in range(4):
                        d00 = i_zero(); d01 = i_zero(); d02 = i_zero(); d03 = i_zero()
                        d10 = i_zero(); d11 = i_zero(); d12 = i_zero(); d13 = i_zero()
                        wo = (gb * 8 + 2 * p) * 256
                        xo = c * k + b * 256 + 64 * p
                        for e in range(8):
                            w0 = load_b32(qt, wo + 32 * e)
                            w1 = load_b32(qt, wo + 256 + 32 * e)
                            d00, d10 = k4_sub2(d00, d10, w0, w1, xf, xo + 4 * e)
                            d01, d11 = k4_sub2(d01, d11, w0, w1, xf, xo + k + 4 * e)
                            d02, d12 = k4_sub2(d02, d12, w0, w1, xf, xo + 2 * k + 4 * e)
                            d03, d13 = k4_sub2(d03, d13, w0, w1, xf, xo + 3 * k + 4 * e)
                        s0 = load_i8(sc, (gb * 8 + 2 * p) * 8)
                        s1 = load_i8(sc, (gb * 8 + 2 * p + 1) * 8)
                        mp = load_i8(mn, (gb * 4 + p) * 8)
                        bo = (c * nb + b) * 4 + p
                        a0, m0 = k4_fmas(a0, m0, d00, d10, s0, s1, mp, bs, bo, dv, mv, xd[c, b])
                        a1, m1 = k4_fmas(a1, m1, d01, d11, s0, s1, mp, bs, bo + nb * 4, dv, mv, xd[c + 1, b])
                        a2, m2 = k4_fmas(a2, m2, d02, d12, s0, s1, mp, bs, bo + nb * 8, dv, mv, xd[c + 2, b])
                        a3, m3 = k4_fmas(a3, m3, d03, d13, s0, s1, mp, bs, bo + nb * 12, dv, mv, xd[c + 3, b])
                i = r0 + 8 * g
                put_rows8(out, c, i, a0, m0); put_rows8(out, c + 1, i, a1, m1)
                put_rows8(out, c + 2, i, a2, m2); put_rows8(out, c + 3, i, a3, m3)

    return q4_K_gemm_rows8


@numba.njit(**_NB)
def _repack_k16(w, r0, ng, nb, kind, dm_sign, G=8):
    """Q3_K (kind 0), Q2_K (1) or IQ4_XS (2) rows r0 .. r0 + G * ng regrouped by G rows (8: a ymm
    register's lanes, 16: a zmm register's) for dot products whose lanes are rows, each super-block as
    16 sub-blocks of 16 quants (IQ4_XS: each of its 32-element sub-blocks as two, its scale twice).

    qt (bytes) [group, block, sub-block s, chunk e, row, 4]: quants 4e..4e+3 of sub-block s as
    unsigned bytes (Q3_K: q + 4 in 0..7, the low two bits | the hmask bit << 2; Q2_K: 0..3; IQ4_XS:
    the grid value + 128); sc [group, block, s, row] the scales (Q3_K, IQ4_XS: - 32); sp [group,
    block, pair t, row] i16 pairs of what multiplies the activation's 16-element sums (Q3_K, IQ4_XS:
    the scales, for the offsets -4 / -128 * sc * bsum; Q2_K: its mins); dw, dm [group, block, row]
    d and (Q2_K) dmin times dm_sign (-1: the tiled step's -dmin, exact) as float32."""
    bsz = 84 if kind == 1 else 110 if kind == 0 else 136
    rb = w.shape[1]
    wf = w.reshape(-1)
    qt = np.empty(ng * nb * 256 * G, np.uint8)
    sc = np.empty(ng * nb * 16 * G, np.int32)
    sp = np.empty(ng * nb * 8 * G, np.int32)
    dw = np.empty(ng * nb * G, np.float32)
    dm = np.empty(ng * nb * G, np.float32)
    fb = np.empty(256 * G, np.uint8)     # (G == 16: each row's scales and pairs, then transposed)
    scb = sc.view(np.uint8)
    spb = sp.view(np.uint8)
    tb = np.empty(256 * G, np.uint8)
    for g in range(ng):
        for b in range(nb):
            gb = g * nb + b
            for r in range(G):
                o = (r0 + G * g + r) * rb + b * bsz
                if kind == 1:
                    dw[gb * G + r] = f16_to_f32(wf, o + 80)
                    dm[gb * G + r] = dm_sign * f16_to_f32(wf, o + 82)
                else:
                    dw[gb * G + r] = f16_to_f32(wf, o + (108 if kind == 0 else 0))
                if G == 16 and kind != 1:   # scales and pairs as vectors, the 16 rows transposed below
                    sv = q3_scales_m32(wf, o) if kind == 0 else pairs_of(iq4_xs_scales(wf, o))
                    store_fields16(fb, 256 * r, sv, sv)
                else:
                    _k16_row_fields(wf, o, gb, r, sc, sp, kind, G)
                # the row's quants in natural order (4 per uint32: sub-block sb's chunk e is word
                # 4 sb + e of the row's 64)
                if kind == 0:
                    quants_unsigned(wf, o, tb, 256 * r, 0)
                elif kind == 1:
                    quants_unsigned(wf, o, tb, 256 * r, 1)
                else:
                    quants_unsigned(wf, o, tb, 256 * r, 2)
            if G == 16 and kind != 1:
                transpose_words(fb, 0, scb, gb * 1024, 0, 16, 16)
                transpose_words(fb, 64, spb, gb * 512, 0, 8, 16)
            _rows_to_lanes(tb, qt, gb, G)
    return qt, sc, sp, dw, dm


@numba.njit(inline="always")
def _k16_row_fields(wf, o, gb, r, sc, sp, kind, G):
    """Row r's scales and pairs of `_repack_k16` one at a time (groups of 8 rows)."""
    z = np.uint32(0)
    s0, s1, s2, s3 = q3_K_scales(wf, o) if kind == 0 else (z, z, z, z)
    for t in range(8):
        if kind == 1:
            a, c = np.int32(wf[o + 2 * t]) & 15, np.int32(wf[o + 2 * t + 1]) & 15
            pa, pc = np.int32(wf[o + 2 * t]) >> 4, np.int32(wf[o + 2 * t + 1]) >> 4
        elif kind == 0:
            a, c = q3_K_scale(s0, s1, s2, s3, 2 * t), q3_K_scale(s0, s1, s2, s3, 2 * t + 1)
            pa, pc = a, c
        else:
            a = c = pa = pc = iq4_xs_scale(wf, o, t)
        sc[(gb * 16 + 2 * t) * G + r] = a
        sc[(gb * 16 + 2 * t + 1) * G + r] = c
        sp[(gb * 8 + t) * G + r] = (pa & 0xFFFF) | (pc << 16)


@numba.njit(**_NB)
def _bsum16_i16_pairs(xb, nb):
    """int32 [n * nb * 8]: per pair t of 16-element sub-blocks, bsum_2t | bsum_2t+1 << 16 (i16 pairs;
    |bsum| <= 16 * 127 fits)."""
    n = xb.shape[0]
    out = np.empty(n * nb * 8, np.uint32)
    for c in range(n):
        for b in range(nb):
            for t in range(8):
                s0 = np.uint32(np.int32(xb[c, b * 16 + 2 * t]) & 0xFFFF)
                s1 = np.uint32(np.int32(xb[c, b * 16 + 2 * t + 1]) & 0xFFFF)
                out[(c * nb + b) * 8 + t] = s0 | (s1 << np.uint32(16))
    return out.view(np.int32)


def tiled_from8(lanes, rows, on: bool = True, wide=None):
    """A prompt product that runs `lanes` (8 rows at once in the vector lanes, whole groups of 8
    rows) from 8 columns on and `rows` (one row at a time) for the rows after the last whole group
    and below 8 columns: the types whose order is ggml's tiled matmul from 8 columns and vec_dot
    below (the same float order either way from 8). on False: `rows` alone. wide: a kernel of
    whole groups of 16 rows (zmm lanes), run first, `lanes` for a last group of 8."""
    has_wide = wide is not None
    if wide is None:
        wide = lanes

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        tiled = on and xp[0].shape[0] >= 8
        r16 = r0 + (r1 - r0) // 16 * 16 if tiled and has_wide else r0
        r8 = r16 + (r1 - r16) // 8 * 8 if tiled else r0
        if r16 > r0:
            wide(w, xp, out, r0, r16)
        if r8 > r16:
            lanes(w, xp, out, r16, r8)
        rows(w, xp, out, r8, r1)
    return matmat


def vec_or_tiled(dot, tiled):
    """A prompt product one row at a time for a type llama.cpp never repacks: per output its
    vec_dot (`dot`) below 8 columns, ggml's tiled matmul (`tiled`) from 8; both
    (wf, row byte, blocks, xf, column's first quant, column's scales) -> f32."""

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        xq, xd, _ = xp
        n, k = xq.shape
        nb = xd.shape[1]
        rb = w.shape[1]
        wf = w.reshape(-1)
        xf = xq.reshape(-1)
        on = n >= 8
        for i in range(r0, r1):
            for c in range(n):
                if on:
                    out[c, i] = tiled(wf, i * rb, nb, xf, c * k, xd[c])
                else:
                    out[c, i] = dot(wf, i * rb, nb, xf, c * k, xd[c])
    return matmat


#: the float orders `k16_rows8` follows, per output and super-block (S, M exact integers)
K16_Q3_TILED = 0     # Q3_K, ggml's tiled matmul: out = fma(f32(S - 4 * M) * d_w, d_x, out) (M: sc * bsum)
K16_Q2_REPACKED = 1  # Q2_K, llama.cpp's repacked gemm / gemv (AVX-512, rows % 8 == 0): see q2_K below
K16_Q2_TILED = 2     # Q2_K, ggml's tiled matmul: r = f32(S) * d_w, r = fma(-dmin, f32(M), r), out = fma(r, d_x, out)
K16_Q2_GEMV = 3      # Q2_K, llama.cpp's repacked gemv for every column (its mul_mat_id: the gemv per token)
K16_IQ4_XS_TILED = 4  # IQ4_XS, ggml's tiled matmul: out = fma(f32(S - 128 * M) * d_w, d_x, out) (M: sc * bsum);
                      # VNNI only (AVX2's pmaddubsw saturates on grid values + 128)
Q5_K_TILED = 5        # Q5_K, ggml's tiled matmul: r = f32(S) * d_w, r = fma(-dmin, f32(M), r), out = fma(r, d_x, out)


def k16_rows8(mode, order):
    """Prompt products of the K-quants with 16-element sub-blocks (Q3_K, Q2_K; IQ4_XS as such) in one of the float
    orders above, 8 rows at once in the lanes: the rows regrouped once per call (`_repack_k16`),
    each sub-block's 8 rows' dots from vpdpbusd with the activation's 4-byte runs broadcast, times
    its scale lanes (S), the mins or offsets by vpdpwssd on i16 pairs (M), the float steps lane-wise,
    4 columns per weight load (the last four ending at the last column). `k_quants`' per-row code
    did one output at a time with a horizontal sum each (K = 2048, 64 columns, AMD EPYC Zen 5: Q3_K
    27.5, Q2_K 20.1, IQ4_XS 74.7 GFLOP/s).

    Q2_K repacked: llama.cpp's gemm (columns [0, n - n % 4) when n > 3) takes per half super-block
    acc = fma(f32(S_h), d_w * d_x, acc), accm = fma(f32(M_h), dmin * d_x, accm); its gemv (the other
    columns) the same once per super-block with S = S_0 + S_1, M = M_0 + M_1; out = acc - accm."""
    kind = 0 if order == K16_Q3_TILED else 2 if order == K16_IQ4_XS_TILED else 1
    repacked = order == K16_Q2_REPACKED or order == K16_Q2_GEMV

    @numba.njit(inline="always")
    def sub(w, wo, xf, xo):
        """One 16-element sub-block of one column: 4 chunks of the 8 rows' quants."""
        d = dot_us(mode, i_zero(), load_b32(w, wo), bcast_b4(xf, xo))
        d = dot_us(mode, d, load_b32(w, wo + 32), bcast_b4(xf, xo + 4))
        d = dot_us(mode, d, load_b32(w, wo + 64), bcast_b4(xf, xo + 8))
        return dot_us(mode, d, load_b32(w, wo + 96), bcast_b4(xf, xo + 12))

    @numba.njit(inline="always")
    def half(qt, sc, sp, bs, xf, gb, b, h, nb, k, c0, c1, c2, c3):
        """S and M of half h (sub-blocks 8h..8h+7) of super-block b, 4 columns."""
        s0 = i_zero(); s1 = i_zero(); s2 = i_zero(); s3 = i_zero()
        m0 = i_zero(); m1 = i_zero(); m2 = i_zero(); m3 = i_zero()
        for sb in range(8 * h, 8 * h + 8):
            wo = (gb * 16 + sb) * 128
            xo = b * 256 + 16 * sb
            sv = load_i8(sc, (gb * 16 + sb) * 8)
            s0 = i_add(s0, i_mul(sub(qt, wo, xf, c0 * k + xo), sv))
            s1 = i_add(s1, i_mul(sub(qt, wo, xf, c1 * k + xo), sv))
            s2 = i_add(s2, i_mul(sub(qt, wo, xf, c2 * k + xo), sv))
            s3 = i_add(s3, i_mul(sub(qt, wo, xf, c3 * k + xo), sv))
        for t in range(4 * h, 4 * h + 4):
            pv = load_i8(sp, (gb * 8 + t) * 8)
            m0 = madd16(mode, m0, pv, bcast_i32(bs, (c0 * nb + b) * 8 + t))
            m1 = madd16(mode, m1, pv, bcast_i32(bs, (c1 * nb + b) * 8 + t))
            m2 = madd16(mode, m2, pv, bcast_i32(bs, (c2 * nb + b) * 8 + t))
            m3 = madd16(mode, m3, pv, bcast_i32(bs, (c3 * nb + b) * 8 + t))
        return s0, s1, s2, s3, m0, m1, m2, m3

    @numba.njit(inline="always")
    def step(acc, accm, s, m, dv, mv, dx):
        """One output group's float step (8 rows) for S and M."""
        if order == K16_Q3_TILED:
            return fma_sv(acc, i_sub(s, i_shl(m, 2)), dv, dx), accm
        if order == K16_IQ4_XS_TILED:
            return fma_sv(acc, i_sub(s, i_shl(m, 7)), dv, dx), accm
        if order == K16_Q2_TILED:   # (mv: -dmin)
            return tiled_min_step(acc, s, dv, m, mv, dx), accm
        return fmadd_v(acc, s, f_scale(dv, dx)), fmadd_v(accm, m, f_scale(mv, dx))

    @numba.njit(**_NB)
    def fn(w, xp, out, r0, r1):
        """Every column of rows r0..r1-1 ((r1 - r0) % 8 == 0)."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        k = xq.shape[1]
        ng = (r1 - r0) // 8
        if ng == 0 or n == 0:
            return
        qt, sc, sp, dw, dm = _repack_k16(w, r0, ng, nb, kind, f32(-1.0 if order == K16_Q2_TILED else 1.0))
        bs = _bsum16_i16_pairs(xb, nb)
        xf = xq.reshape(-1)
        n_gemm = n - n % 4 if order == K16_Q2_REPACKED else 0   # (the repacked gemm's columns; the rest: its gemv)
        for g in range(ng):
            for t4 in range((n + 3) // 4):
                c0 = min(4 * t4, n - 4) if n >= 4 else 0
                if repacked and 4 * t4 >= n_gemm:
                    c0 = min(4 * t4, n - 4) if n_gemm == 0 and n >= 4 else n_gemm   # the gemv's columns
                c1, c2, c3 = min(c0 + 1, n - 1), min(c0 + 2, n - 1), min(c0 + 3, n - 1)
                by_halves = 4 * t4 < n_gemm
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                e0 = f_zero(); e1 = f_zero(); e2 = f_zero(); e3 = f_zero()
                for b in range(nb):
                    gb = g * nb + b
                    dv = load_f32x8(dw, gb * 8)
                    mv = load_f32x8(dm, gb * 8)
                    s0, s1, s2, s3, m0, m1, m2, m3 = half(qt, sc, sp, bs, xf, gb, b, 0, nb, k, c0, c1, c2, c3)
                    if by_halves:
                        a0, e0 = step(a0, e0, s0, m0, dv, mv, xd[c0, b])
                        a1, e1 = step(a1, e1, s1, m1, dv, mv, xd[c1, b])
                        a2, e2 = step(a2, e2, s2, m2, dv, mv, xd[c2, b])
                        a3, e3 = step(a3, e3, s3, m3, dv, mv, xd[c3, b])
                        s0, s1, s2, s3, m0, m1, m2, m3 = half(qt, sc, sp, bs, xf, gb, b, 1, nb, k, c0, c1, c2, c3)
                    else:
                        u0, u1, u2, u3, v0, v1, v2, v3 = half(qt, sc, sp, bs, xf, gb, b, 1, nb, k, c0, c1, c2, c3)
                        s0, s1, s2, s3 = i_add(s0, u0), i_add(s1, u1), i_add(s2, u2), i_add(s3, u3)
                        m0, m1, m2, m3 = i_add(m0, v0), i_add(m1, v1), i_add(m2, v2), i_add(m3, v3)
                    a0, e0 = step(a0, e0, s0, m0, dv, mv, xd[c0, b])
                    a1, e1 = step(a1, e1, s1, m1, dv, mv, xd[c1, b])
                    a2, e2 = step(a2, e2, s2, m2, dv, mv, xd[c2, b])
                    a3, e3 = step(a3, e3, s3, m3, dv, mv, xd[c3, b])
                if repacked:
                    a0, a1, a2, a3 = f_sub(a0, e0), f_sub(a1, e1), f_sub(a2, e2), f_sub(a3, e3)
                i = r0 + 8 * g
                for q in range(8):
                    out[c0, i + q] = f_lane(a0, q)
                    out[c1, i + q] = f_lane(a1, q)
                    out[c2, i + q] = f_lane(a2, q)
                    out[c3, i + q] = f_lane(a3, q)

    return fn


def rows16_tiled(order):
    """The prompt products of Q3_K, IQ4_XS and Q5_K in ggml's tiled order (`K16_Q3_TILED`,
    `K16_IQ4_XS_TILED`, `Q5_K_TILED`) with 16 rows at once in the lanes of a zmm register, AVX-512
    VNNI: the steps of the 8-row kernels (`k16_rows8`, `q4_K_gemv_rows8`'s q5), each instruction over
    twice the rows. Each 16-row group is regrouped just before its products (`_repack_k16` /
    `_repack_q4_K`, G = 16: ~64 KB at K = 2048, in the caches); a sub-block's 16 rows' dots are one
    vpdpbusd per 4-weight chunk with the activation's bytes broadcast, times the scales; the offsets
    (Q3_K, IQ4_XS) or mins (Q5_K) by vpdpwssd on i16 pairs; the float step lane-wise; 4 columns per
    weight load, the last four ending at the last column. Whole groups of 16 rows (`tiled_from8`
    gives a last 8 to the ymm kernel)."""
    q5 = order == Q5_K_TILED
    kind = 0 if order == K16_Q3_TILED else 2
    shift = 2 if order == K16_Q3_TILED else 7
    nsb, chunks, npairs = (8, 8, 4) if q5 else (16, 4, 8)    # sub-blocks, their 4-byte chunks, i16 pairs
    # IQ4_XS: a 32-element sub-block's two 16-element halves (one scale, stored twice) taken as one
    # sub-block of 8 chunks: one multiply by the scales per 8 dots, and two dot chains of 4 in
    # `sub_dot16` (exact either way: sc * (a + b) = sc * a + sc * b in int32). Intel Xeon host
    # (family 6 model 207), K = 2048, 512 columns: both forms side by side in one process, 230-245 ->
    # 259-272 GFLOP/s; kernels_bench, five alternating runs against the code before, 323-355 ->
    # 336-395 (a faster hour). With one chain per sub-block the halving alone changed nothing, there
    # or on AMD.
    ssc = 1
    if order == K16_IQ4_XS_TILED:
        nsb, chunks, ssc = 8, 8, 2

    @numba.njit(inline="always")
    def step(acc, s, m, dv, mv, dx):
        if q5:    # (mv: -dmin)
            return tiled_min_step(acc, s, dv, m, mv, dx)
        return offset_step16(acc, s, m, shift, dv, dx)

    @numba.njit(**_NB)
    def fn(w, xp, out, r0, r1):
        """Every column (at least 4) of rows r0..r1-1 ((r1 - r0) % 16 == 0)."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        k = xq.shape[1]
        if r1 - r0 < 16 or n == 0:
            return
        bs = _bsum_pairs(xb, nb) if q5 else _bsum16_i16_pairs(xb, nb)
        xf = xq.reshape(-1)
        for g in range((r1 - r0) // 16):
            if q5:
                qt, sc, sp, dw, dm = _repack_q4_K(w, r0 + 16 * g, 1, nb, True, 16)
            else:
                qt, sc, sp, dw, dm = _repack_k16(w, r0 + 16 * g, 1, nb, kind, f32(1.0), 16)
            for t4 in range((n + 3) // 4):
                c0 = min(4 * t4, n - 4)
                c1, c2, c3 = c0 + 1, c0 + 2, c0 + 3
                a0 = f_zero16(); a1 = f_zero16(); a2 = f_zero16(); a3 = f_zero16()
                for b in range(nb):
                    s0 = i_zero16(); s1 = i_zero16(); s2 = i_zero16(); s3 = i_zero16()
                    m0 = i_zero16(); m1 = i_zero16(); m2 = i_zero16(); m3 = i_zero16()
                    for j in range(nsb):
                        wo = (b * nsb + j) * 64 * chunks
                        xo = b * 256 + 4 * chunks * j
                        sv = load_i16(sc, (b * nsb + j) * 16 * ssc)
                        s0 = sub_dot16(s0, qt, wo, xf, c0 * k + xo, sv, chunks)
                        s1 = sub_dot16(s1, qt, wo, xf, c1 * k + xo, sv, chunks)
                        s2 = sub_dot16(s2, qt, wo, xf, c2 * k + xo, sv, chunks)
                        s3 = sub_dot16(s3, qt, wo, xf, c3 * k + xo, sv, chunks)
                    for t in range(npairs):
                        pv = load_i16(sp, (b * npairs + t) * 16)
                        m0 = madd_bcast16(m0, pv, bs, (c0 * nb + b) * npairs + t)
                        m1 = madd_bcast16(m1, pv, bs, (c1 * nb + b) * npairs + t)
                        m2 = madd_bcast16(m2, pv, bs, (c2 * nb + b) * npairs + t)
                        m3 = madd_bcast16(m3, pv, bs, (c3 * nb + b) * npairs + t)
                    dv = load_f32x16(dw, b * 16)
                    mv = load_f32x16(dm, b * 16)
                    a0 = step(a0, s0, m0, dv, mv, xd[c0, b])
                    a1 = step(a1, s1, m1, dv, mv, xd[c1, b])
                    a2 = step(a2, s2, m2, dv, mv, xd[c2, b])
                    a3 = step(a3, s3, m3, dv, mv, xd[c3, b])
                i = r0 + 16 * g
                for q in range(16):
                    out[c0, i + q] = f_lane(a0, q)
                    out[c1, i + q] = f_lane(a1, q)
                    out[c2, i + q] = f_lane(a2, q)
                    out[c3, i + q] = f_lane(a3, q)

    return fn


def q4_K_gemv_rows8(mode, q5=False):
    """ggml_gemv_q4_K_8x8_q8_K's order for many columns at once, over groups of 8 rows in lanes.

    llama.cpp's repacked mul_mat_id runs the gemv once per routed token; per output (row, token) it is
    one f32 chain per super-block: acc = fma(f32(S_b), d_w * d_x, acc), accm = fma(f32(M_b), dmin * d_x,
    accm), out = acc - accm, with S_b = sum_j sc_j * dot_j and M_b = sum_j m_j * bsum_j exact.  Here the
    8 rows of a group are the lanes (``_repack_q4_K``, once per call) and 4 columns share each weight
    load, so the weights are unpacked once for all tokens of a call; the per-lane float operations are
    exactly the gemv's (the single-column ``q4_K_matvec``).

    q5: Q5_K rows in ggml's tiled matmul order instead (llama.cpp never repacks Q5_K on x86; a prompt's
    outputs take it from 8 columns): per output and super-block r = f32(S) * d_w, r = fma(-dmin,
    f32(M), r), out = fma(r, d_x, out) (`intrinsics.dots.tiled_min_step`, lane-wise), the quants regrouped
    with their fifth bits. `k_quants`' per-row code did that one output at a time with a horizontal
    sum each: 32 GFLOP/s at K = 2048 (n = 64) on the AMD EPYC Zen 5 host, 214-221 here."""
    @numba.njit(inline="always")
    def sub2(d0, d1, w0, w1, xq, xo):
        return dot_us(mode, d0, w0, bcast_b4(xq, xo)), dot_us(mode, d1, w1, bcast_b4(xq, xo + 32))

    @numba.njit(inline="always")
    def pair(s, m, d0, d1, s0, s1, mp, bs, bo):
        """Exact integer sums of one pair of sub-blocks added to the block's S and M (8 rows)."""
        return i_add(s, i_add(i_mul(d0, s0), i_mul(d1, s1))), madd16(mode, m, mp, bcast_i32(bs, bo))

    @numba.njit(inline="always")
    def fmas(acc, accm, s, m, dv, mv, dx):
        if q5:   # (mv: -dmin)
            return tiled_min_step(acc, s, dv, m, mv, dx), accm
        return fmadd_v(acc, s, f_scale(dv, dx)), fmadd_v(accm, m, f_scale(mv, dx))

    @numba.njit(inline="always")
    def put(out, c, i, acc, accm):
        r = acc if q5 else f_sub(acc, accm)
        for q in range(8):
            out[c, i + q] = f_lane(r, q)

    @numba.njit(**_NB)
    def gemv_rows8(w, xp, out, r0, r1):
        """All columns of rows r0..r1-1 ((r1 - r0) % 8 == 0), gemv order per output."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        k = xq.shape[1]
        ng = (r1 - r0) // 8
        if ng == 0 or n == 0:
            return
        qt, sc, mn, dw, dm = _repack_q4_K(w, r0, ng, nb, q5)
        bs = _bsum_pairs(xb, nb)
        xf = xq.reshape(-1)
        c = 0
        while c < n:
            four = c + 4 <= n
            for g in range(ng):
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                m0 = f_zero(); m1 = f_zero(); m2 = f_zero(); m3 = f_zero()
                for b in range(nb):
                    gb = g * nb + b
                    S0 = i_zero(); S1 = i_zero(); S2 = i_zero(); S3 = i_zero()
                    M0 = i_zero(); M1 = i_zero(); M2 = i_zero(); M3 = i_zero()
                    for p in range(4):
                        d00 = i_zero(); d01 = i_zero(); d02 = i_zero(); d03 = i_zero()
                        d10 = i_zero(); d11 = i_zero(); d12 = i_zero(); d13 = i_zero()
                        wo = (gb * 8 + 2 * p) * 256
                        xo = c * k + b * 256 + 64 * p
                        for e in range(8):
                            w0 = load_b32(qt, wo + 32 * e)
                            w1 = load_b32(qt, wo + 256 + 32 * e)
                            d00, d10 = sub2(d00, d10, w0, w1, xf, xo + 4 * e)
                            if four:
                                d01, d11 = sub2(d01, d11, w0, w1, xf, xo + k + 4 * e)
                                d02, d12 = sub2(d02, d12, w0, w1, xf, xo + 2 * k + 4 * e)
                                d03, d13 = sub2(d03, d13, w0, w1, xf, xo + 3 * k + 4 * e)
                        s0 = load_i8(sc, (gb * 8 + 2 * p) * 8)
                        s1 = load_i8(sc, (gb * 8 + 2 * p + 1) * 8)
                        mp = load_i8(mn, (gb * 4 + p) * 8)
                        bo = (c * nb + b) * 4 + p
                        S0, M0 = pair(S0, M0, d00, d10, s0, s1, mp, bs, bo)
                        if four:
                            S1, M1 = pair(S1, M1, d01, d11, s0, s1, mp, bs, bo + nb * 4)
                            S2, M2 = pair(S2, M2, d02, d12, s0, s1, mp, bs, bo + nb * 8)
                            S3, M3 = pair(S3, M3, d03, d13, s0, s1, mp, bs, bo + nb * 12)
                    dv = load_f32x8(dw, gb * 8)
                    mv = load_f32x8(dm, gb * 8)
                    a0, m0 = fmas(a0, m0, S0, M0, dv, mv, xd[c, b])
                    if four:
                        a1, m1 = fmas(a1, m1, S1, M1, dv, mv, xd[c + 1, b])
                        a2, m2 = fmas(a2, m2, S2, M2, dv, mv, xd[c + 2, b])
                        a3, m3 = fmas(a3, m3, S3, M3, dv, mv, xd[c + 3, b])
                i = r0 + 8 * g
                put(out, c, i, a0, m0)
                if four:
                    put(out, c + 1, i, a1, m1); put(out, c + 2, i, a2, m2); put(out, c + 3, i, a3, m3)
            c += 4 if four else 1

    return gemv_rows8


# ============================================================================= Q6_K rows in lanes
@numba.njit(**_NB)
def _repack_q6_K(w, r0, ng, nb):
    """Q6_K rows r0 .. r0 + 8 * ng regrouped by 8 rows (see _repack_q4_K).

    qt (bytes) [group, block, chunk e, row, 4]: unsigned 6-bit quants 4e..4e+3 of the block;
    sc [group, block, j, row] the 16 signed sub-block scales; sp [group, block, pair, row] the same
    as i16 pairs (sc_2p, sc_2p+1); dw [group, block, row] d as float32."""
    rb = w.shape[1]
    wf = w.reshape(-1)
    ws = w.view(np.int8).reshape(-1)
    qt = np.empty(ng * nb * 2048, np.uint8)
    q32 = qt.view(np.uint32)
    sc = np.empty(ng * nb * 128, np.int32)
    sp = np.empty(ng * nb * 64, np.uint32)
    dw = np.empty(ng * nb * 8, np.float32)
    lo4 = np.uint32(0x0F0F0F0F)
    lo2 = np.uint32(0x03030303)
    for g in range(ng):
        for b in range(nb):
            gb = g * nb + b
            for r in range(8):
                o = (r0 + 8 * g + r) * rb + b * 210
                dw[gb * 8 + r] = f16_to_f32(w, o + 208)
                for j in range(16):
                    sc[(gb * 16 + j) * 8 + r] = np.int32(ws[o + 192 + j])
                for p in range(8):
                    lo = np.uint32(np.int32(ws[o + 192 + 2 * p]) & 0xFFFF)
                    hi = np.uint32(np.int32(ws[o + 193 + 2 * p]) & 0xFFFF)
                    sp[(gb * 8 + p) * 8 + r] = lo | (hi << np.uint32(16))
                for h in range(2):
                    for i in range(8):
                        l1 = ld_u32(wf, o + 64 * h + 4 * i)
                        l2 = ld_u32(wf, o + 64 * h + 32 + 4 * i)
                        hh = ld_u32(wf, o + 128 + 32 * h + 4 * i)
                        e = 32 * h + i
                        q32[((gb * 64 + e) * 8 + r)] = (l1 & lo4) | ((hh & lo2) << np.uint32(4))
                        q32[((gb * 64 + e + 8) * 8 + r)] = (l2 & lo4) | (((hh >> np.uint32(2)) & lo2) << np.uint32(4))
                        q32[((gb * 64 + e + 16) * 8 + r)] = ((l1 >> np.uint32(4)) & lo4) | (((hh >> np.uint32(4)) & lo2) << np.uint32(4))
                        q32[((gb * 64 + e + 24) * 8 + r)] = ((l2 >> np.uint32(4)) & lo4) | (((hh >> np.uint32(6)) & lo2) << np.uint32(4))
    return qt, sc, sp.view(np.int32), dw


@numba.njit(**_NB)
def _bsum16_pairs(xb):
    """int32 [n, k / 32]: bsum_2p | bsum_2p+1 << 16 of the 16-element bsums (i16 pairs for pmaddwd)."""
    n, k16 = xb.shape
    out = np.empty(n * (k16 // 2), np.uint32)
    for c in range(n):
        for p in range(k16 // 2):
            s0 = np.uint32(xb[c, 2 * p] & 0xFFFF)
            s1 = np.uint32(xb[c, 2 * p + 1] & 0xFFFF)
            out[c * (k16 // 2) + p] = s0 | (s1 << np.uint32(16))
    return out.view(np.int32)


def q6_K_rows8(mode):
    """The Q6_K tiled-order product over groups of 8 rows regrouped so that a vector lane is a row."""
    # ---- Q6_K tiled order (n >= 8) with rows in lanes (_repack_q6_K, as for Q4_K): per column and
    # block, S = sum_j sc_j * (dot(q_j, x_j) - 32 * bsum_j) exact for 8 rows at once (vpdpbusd on the
    # unsigned 6-bit quants, vpmulld by the sub-block scales, the offsets by vpdpwssd on i16 pairs),
    # then q6_tiled's out = fma(f32(S) * d_w, d_x, out) per lane.
    @numba.njit(inline="always")
    def q6_sub2(d0, d1, w0, w1, xq, xo):
        return dot_us(mode, d0, w0, bcast_b4(xq, xo)), dot_us(mode, d1, w1, bcast_b4(xq, xo + 16))

    @numba.njit(inline="always")
    def q6_block_end(acc, sacc, offs, dv, dx):
        return fma_sv(acc, i_sub(sacc, i_shl(offs, 5)), dv, dx)

    @numba.njit(inline="always")
    def q6_offsets(sp, so, bs, bo):
        """sum_j sc_j * bsum_j (8 rows) from the i16 pairs of scales and bsums."""
        o = i_zero()
        for jp in range(8):
            o = madd16(mode, o, load_i8(sp, so + 8 * jp), bcast_i32(bs, bo + jp))
        return o

    @numba.njit(**_NB)
    def q6_K_tiled_rows8(w, xp, out, r0, r1):
        """All columns (n >= 8) of rows r0..r1-1 ((r1 - r0) % 8 == 0), tiled order."""
        xq, xd, xb = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        k = xq.shape[1]
        ng = (r1 - r0) // 8
        qt, sc, sp, dw = _repack_q6_K(w, r0, ng, nb)
        bs = _bsum16_pairs(xb)
        xf = xq.reshape(-1)
        c = 0
        while c < n:
            four = c + 4 <= n
            for g in range(ng):
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                for b in range(nb):
                    gb = g * nb + b
                    t0 = i_zero(); t1 = i_zero(); t2 = i_zero(); t3 = i_zero()
                    xo = c * k + b * 256
                    for jp in range(8):
                        d00 = i_zero(); d01 = i_zero(); d02 = i_zero(); d03 = i_zero()
                        d10 = i_zero(); d11 = i_zero(); d12 = i_zero(); d13 = i_zero()
                        wo = (gb * 64 + 8 * jp) * 32
                        xj = xo + 32 * jp
                        for e in range(4):
                            w0 = load_b32(qt, wo + 32 * e)
                            w1 = load_b32(qt, wo + 128 + 32 * e)
                            d00, d10 = q6_sub2(d00, d10, w0, w1, xf, xj + 4 * e)
                            if four:
                                d01, d11 = q6_sub2(d01, d11, w0, w1, xf, xj + k + 4 * e)
                                d02, d12 = q6_sub2(d02, d12, w0, w1, xf, xj + 2 * k + 4 * e)
                                d03, d13 = q6_sub2(d03, d13, w0, w1, xf, xj + 3 * k + 4 * e)
                        s0 = load_i8(sc, (gb * 16 + 2 * jp) * 8)
                        s1 = load_i8(sc, (gb * 16 + 2 * jp + 1) * 8)
                        t0 = i_add(t0, i_add(i_mul(d00, s0), i_mul(d10, s1)))
                        if four:
                            t1 = i_add(t1, i_add(i_mul(d01, s0), i_mul(d11, s1)))
                            t2 = i_add(t2, i_add(i_mul(d02, s0), i_mul(d12, s1)))
                            t3 = i_add(t3, i_add(i_mul(d03, s0), i_mul(d13, s1)))
                    dv = load_f32x8(dw, gb * 8)
                    so = gb * 64
                    bo = (c * nb + b) * 8
                    a0 = q6_block_end(a0, t0, q6_offsets(sp, so, bs, bo), dv, xd[c, b])
                    if four:
                        a1 = q6_block_end(a1, t1, q6_offsets(sp, so, bs, bo + nb * 8), dv, xd[c + 1, b])
                        a2 = q6_block_end(a2, t2, q6_offsets(sp, so, bs, bo + nb * 16), dv, xd[c + 2, b])
                        a3 = q6_block_end(a3, t3, q6_offsets(sp, so, bs, bo + nb * 24), dv, xd[c + 3, b])
                i = r0 + 8 * g
                for q in range(8):
                    out[c, i + q] = f_lane(a0, q)
                if four:
                    for q in range(8):
                        out[c + 1, i + q] = f_lane(a1, q)
                        out[c + 2, i + q] = f_lane(a2, q)
                        out[c + 3, i + q] = f_lane(a3, q)
            c += 4 if four else 1

    return q6_K_tiled_rows8


# ============================================================================= Q4_0 repacked (q4_0_8x8)
def q4_0_repacked(mode, unpack, bsz, shift, signed=False):
    """(matvec, matmat) of Q4_0 (or IQ4_NL: ``signed``, grid values from ``unpack``) in the float order of
    llama.cpp's repacked kernels.

    On x86 with AVX2 (or AVX-512) ggml-cpu repacks a Q4_0 weight used by mul_mat whose row count is a
    multiple of 8 into block_q4_0x8 (repack.cpp, q4_0_8x8_q8_0) and runs ggml_gemv_q4_0_8x8_q8_0 /
    ggml_gemm_q4_0_8x8_q8_0 on it.  Both give every output (row i, column c) one f32 chain over the
    32-blocks b in order:  acc = fma(f32(S_ib), d_w(i, b) * d_x(c, b), acc)  with S_ib the block's exact
    integer dot product (no lane-wise partial sums, no final horizontal sum): the order here.  The
    vector lanes hold 4 rows at a time (the integer sums of 4 rows transposed into one i32x4 by
    ``reduce4``), so each row's chain stays scalar and in block order; prompts reuse each unpacked block
    of 4 rows for 4 columns.
    """
    @numba.njit(inline="always")
    def lanes(m, u, x):
        """i32x8 whose sum is the block's exact dot product: unsigned quants with the offset folded into
        the initial lanes m (Q4_0), or signed grid values by the sign trick (IQ4_NL)."""
        if signed:
            return dot_ss(mode, i_zero(), u, x)
        return dot_us(mode, m, u, x)

    @numba.njit(inline="always")
    def sums4(w, o, rb, m, xq, xo):
        """i32x4: the exact integer dot products of the blocks at byte o of 4 consecutive rows."""
        x = load_b32(xq, xo)
        return reduce4(lanes(m, unpack(w, o), x), lanes(m, unpack(w, o + rb), x),
                       lanes(m, unpack(w, o + 2 * rb), x), lanes(m, unpack(w, o + 3 * rb), x))

    @numba.njit(inline="always")
    def dw4(w, o, rb):
        """f32x4 of the f16 block scales at byte o of 4 consecutive rows."""
        return f4_make(f16_to_f32(w, o), f16_to_f32(w, o + rb), f16_to_f32(w, o + 2 * rb), f16_to_f32(w, o + 3 * rb))

    @numba.njit(inline="always")
    def chain1(w, i, nb, ns, no, xq, xo, dx):
        rb = w.shape[1]
        acc = f32(0.0)
        for b in range(nb):
            o = i * rb + b * bsz
            s = hsum_i(lanes(load_i8(ns, no + b * 8), unpack(w, o), load_b32(xq, xo + b * 32)))
            acc = fma_s(f32(s), f16_to_f32(w, o) * dx[b], acc)
        return acc

    @numba.njit(**_NB)
    def matvec(w, xp, out, r0, r1):
        xq, xd, n4 = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        ns = (n4 << shift).astype(np.int32)
        mid = stream_halves(r0, r1, 4, rb)   # two streams: 4 rows of each half in turn
        for j in range((r1 - r0) // 4):
            i = stream_row(j, r0, mid, 4)
            acc = f4_zero()
            for b in range(nb):
                o = i * rb + b * bsz
                s = sums4(w, o, rb, load_i8(ns, b * 8), xq, b * 32)
                acc = fma4_i(acc, s, f4_scale(dw4(w, o, rb), xd[b]))
            out[i] = f4_lane(acc, 0); out[i + 1] = f4_lane(acc, 1)
            out[i + 2] = f4_lane(acc, 2); out[i + 3] = f4_lane(acc, 3)
        i = r0 + (r1 - r0) // 4 * 4
        while i < r1:
            out[i] = chain1(w, i, nb, ns, 0, xq, 0, xd)
            i += 1

    @numba.njit(inline="always")
    def col4(acc, m, u0, u1, u2, u3, xq, xo, sc):
        x = load_b32(xq, xo)
        s = reduce4(lanes(m, u0, x), lanes(m, u1, x), lanes(m, u2, x), lanes(m, u3, x))
        return fma4_i(acc, s, sc)

    @numba.njit(inline="always")
    def put4(out, c, i, acc):
        out[c, i] = f4_lane(acc, 0); out[c, i + 1] = f4_lane(acc, 1)
        out[c, i + 2] = f4_lane(acc, 2); out[c, i + 3] = f4_lane(acc, 3)

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        xq, xd, n4 = xp
        n, k = xq.shape
        nb = xd.shape[1]
        rb = w.shape[1]
        k4 = n4.shape[1]
        ns = (n4 << shift).astype(np.int32).reshape(-1)
        xf = xq.reshape(-1)
        c = 0
        while c < n:
            four = c + 4 <= n   # 4 columns share each unpacked block of 4 rows
            i = r0
            while i + 4 <= r1:
                a0 = f4_zero(); a1 = f4_zero(); a2 = f4_zero(); a3 = f4_zero()
                for b in range(nb):
                    o = i * rb + b * bsz
                    u0 = unpack(w, o); u1 = unpack(w, o + rb); u2 = unpack(w, o + 2 * rb); u3 = unpack(w, o + 3 * rb)
                    d = dw4(w, o, rb)
                    xo = c * k + b * 32
                    no = c * k4 + b * 8
                    a0 = col4(a0, load_i8(ns, no), u0, u1, u2, u3, xf, xo, f4_scale(d, xd[c, b]))
                    if four:
                        a1 = col4(a1, load_i8(ns, no + k4), u0, u1, u2, u3, xf, xo + k, f4_scale(d, xd[c + 1, b]))
                        a2 = col4(a2, load_i8(ns, no + 2 * k4), u0, u1, u2, u3, xf, xo + 2 * k, f4_scale(d, xd[c + 2, b]))
                        a3 = col4(a3, load_i8(ns, no + 3 * k4), u0, u1, u2, u3, xf, xo + 3 * k, f4_scale(d, xd[c + 3, b]))
                put4(out, c, i, a0)
                if four:
                    put4(out, c + 1, i, a1); put4(out, c + 2, i, a2); put4(out, c + 3, i, a3)
                i += 4
            while i < r1:
                for j in range(c, c + 4 if four else c + 1):
                    out[j, i] = chain1(w, i, nb, ns, j * k4, xf, j * k, xd[j])
                i += 1
            c += 4 if four else 1

    return matvec, matmat

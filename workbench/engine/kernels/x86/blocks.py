"""Block-format helpers shared by the x86 kernel families (scale fields, packed 6-bit scales)."""
from __future__ import annotations

import numba
import numpy as np

from ..intrinsics.lanes import f_zero16
from ..intrinsics.load_store import copy_bytes
from ..intrinsics.reductions import hsum_f
from ..intrinsics.scalars import f16_to_f32, ld_u32
from ..intrinsics.streams import prefetch, prefetch_distance, prime_streams, stream_halves

from ..jitcache import JIT as _NB
f32 = np.float32


@numba.njit(**_NB)
def block_scales(w, r0, r1, nb, bsz):
    """float32 [(r1 - r0) * nb]: the f16 scale (first field) of every block of rows r0..r1-1."""
    out = np.empty((r1 - r0) * nb, np.float32)
    rb = w.shape[1]
    for i in range(r0, r1):
        for b in range(nb):
            out[(i - r0) * nb + b] = f16_to_f32(w, i * rb + b * bsz)
    return out


# ============================================================================= row pairs
@numba.njit(**_NB)
def pairs_rewrite(w, r0, r1, to_pairs, at, bsz, unit=2) -> None:
    """Rows [r0, r1) (whole groups of `unit` rows: pairs, or the 8-row groups of `q4_x8`) of a
    C-contiguous matrix of `bsz`-byte blocks rewritten in place between the file's layout and a
    grouped layout whose byte map is `at` (where each byte of a group's file rows sits in the
    group's bytes: `pair_movers`' order)."""
    if r0 % unit or r1 % unit or not 0 <= r0 <= r1 <= w.shape[0] or w.shape[1] % bsz or not w.flags.c_contiguous:
        if unit == 2:
            raise ValueError("row pairs: rows must be whole pairs of a C-contiguous matrix of whole blocks")
        raise ValueError("x8 layout: rows must be whole 8-row groups of a C-contiguous matrix of whole blocks")
    rb = w.shape[1]
    wf = w.reshape(-1)
    t = np.empty(unit * rb, np.uint8)
    runs = _runs(at)
    for p in range(r0 // unit, r1 // unit):
        base = unit * p * rb
        copy_bytes(t, 0, wf, base, unit * rb)
        for k in range(runs.shape[0]):
            src, dst, n = runs[k, 0], runs[k, 1], runs[k, 2]
            if to_pairs:
                copy_bytes(wf, base + dst, t, src, n)
            else:
                copy_bytes(wf, base + src, t, dst, n)


@numba.njit(**_NB)
def _runs(at):
    """A byte map as its runs (file offset, pair offset, length) of consecutive bytes: copied a run
    at a time, a tied Q8_0 output matrix (178 MB) repacks in a fraction of the byte-by-byte time."""
    out = np.empty((at.shape[0], 3), np.int64)
    n = 0
    for j in range(at.shape[0]):
        if n > 0 and at[j] == out[n - 1, 1] + out[n - 1, 2] and j == out[n - 1, 0] + out[n - 1, 2]:
            out[n - 1, 2] += 1
        else:
            out[n, 0], out[n, 1], out[n, 2] = j, at[j], 1
            n += 1
    return out[:n]


def pair_movers(place, bsz: int, unit: int = 2):
    """(repack_rows, unpack_rows, rows_to_file) of a layout of `bsz`-byte blocks grouping `unit`
    rows (2: a row pair) whose record of a column's `unit` blocks keeps byte e of row r's block at
    place(r, e): fn(w, r0, r1) rewrites rows [r0, r1) (whole groups) in place to the layout or
    back; rows_to_file(w, r0, r1, out) writes them in the file's layout into out[0:r1 - r0]."""
    @numba.njit(**_NB)
    def order(rb):
        """Where each byte of a group of rows in the file's layout (row 0's rb bytes, then row
        1's, ...) sits in the group's bytes."""
        at = np.empty(unit * rb, np.int64)
        for j in range(unit * rb):
            r, q = j // rb, j % rb
            at[j] = (q // bsz) * unit * bsz + place(r, q % bsz)
        return at

    def repack_rows(w: np.ndarray, r0: int, r1: int) -> None:
        pairs_rewrite(w, r0, r1, True, order(w.shape[1]), bsz, unit)

    def unpack_rows(w: np.ndarray, r0: int, r1: int) -> None:
        pairs_rewrite(w, r0, r1, False, order(w.shape[1]), bsz, unit)

    @numba.njit(**_NB)
    def rows_to_file(w, r0, r1, out) -> None:
        pairs_to_file(w, r0, r1, out, order(w.shape[1]), unit)
    return repack_rows, unpack_rows, rows_to_file


def pair_layout(pair: int):
    """(at, row_scales) of a row-pair layout whose pair of two rows' blocks of one column of 32
    weights takes `pair` bytes, each row's f16 scale at 2r of them: at(i, b, rb) -> (offset of
    the pair holding row i's block b, the row's place r in it), the prompt tiles' addressing
    (`repack.file_rows`); row_scales(w, r0, r1, nb) -> float32 [(r1 - r0) * nb], the tiles' dws."""
    @numba.njit(inline="always")
    def at(i, b, rb):
        return (i - i % 2) * rb + b * pair, i % 2

    @numba.njit(**_NB)
    def row_scales(w, r0, r1, nb):
        out = np.empty((r1 - r0) * nb, np.float32)
        rb = w.shape[1]
        for i in range(r0, r1):
            for b in range(nb):
                o, r = at(i, b, rb)
                out[(i - r0) * nb + b] = f16_to_f32(w, o + 2 * r)
        return out
    return at, row_scales


def pair_matvec(pair: int, step, row, inputs, x_stride: int, n_stride: int):
    """(matvec, few_columns) of a row-pair layout's one-token product: step(acc, w, o, xa, xo, na,
    no, xs) adds the block pair at byte o to a pair's f32x16 chains, row(acc, r) (r a compile-time
    0 / 1) is row r's 8 lanes, inputs(xq, n4, nb) -> (xa, na) a column's activation as step reads
    it, block b's at xa[b * x_stride], na[b * n_stride]. A range with an odd end computes that
    row's pair and writes its own row; a pair from each half of the range in turn (two streams,
    two chains), as the file layout's kernels. few_columns(w, xp, out, r0, r1): the same for a
    few columns (a server batch's rows, fewer than a prompt tile's 8), each pair read from memory
    once for all of them, the columns in fours with chains of their own: each column's numbers are
    matvec's (the same steps in the same order)."""
    @numba.njit(inline="always")
    def put(out, p, r0, r1, acc):
        if r0 <= 2 * p < r1:
            out[2 * p] = hsum_f(row(acc, 0))
        if r0 <= 2 * p + 1 < r1:
            out[2 * p + 1] = hsum_f(row(acc, 1))

    @numba.njit(**_NB)
    def matvec(w, xp, out, r0, r1):
        xq, xd, n4 = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        xa, na = inputs(xq, n4, nb)
        p0, p1 = r0 // 2, (r1 + 1) // 2
        pfd = prefetch_distance(nb * 32)
        pm = stream_halves(p0, p1, 1, 2 * rb)
        prime_streams(w, p0, pm, 2 * rb, pfd)
        for s in range(pm - p0):
            p, q = p0 + s, pm + s
            bp, bq = 2 * p * rb, 2 * q * rb
            a = f_zero16()
            c = f_zero16()
            for b in range(nb):
                o = b * pair
                prefetch(w, bp + o + pfd)
                prefetch(w, bq + o + pfd)
                a = step(a, w, bp + o, xa, b * x_stride, na, b * n_stride, xd[b])
                c = step(c, w, bq + o, xa, b * x_stride, na, b * n_stride, xd[b])
            put(out, p, r0, r1, a)
            put(out, q, r0, r1, c)
        for p in range(2 * pm - p0, p1):
            bp = 2 * p * rb
            a = f_zero16()
            for b in range(nb):
                prefetch(w, bp + b * pair + pfd)
                a = step(a, w, bp + b * pair, xa, b * x_stride, na, b * n_stride, xd[b])
            put(out, p, r0, r1, a)

    @numba.njit(**_NB)
    def few_columns(w, xp, out, r0, r1):
        xq, xd, n4 = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        rb = w.shape[1]
        lx, ln = nb * x_stride, nb * n_stride
        xa, na = inputs(xq[0], n4[0], nb)
        xs = np.empty(n * lx, xa.dtype)       # every column's inputs, one after another
        ns = np.empty(n * ln, na.dtype)
        for c in range(n):
            if c > 0:
                xa, na = inputs(xq[c], n4[c], nb)
            for j in range(lx):
                xs[c * lx + j] = xa[j]
            for j in range(ln):
                ns[c * ln + j] = na[j]
        pfd = prefetch_distance(nb * 32)
        for p in range(r0 // 2, (r1 + 1) // 2):
            bp = 2 * p * rb
            for c in range(0, n, 8):
                m = min(8, n - c)
                a0 = f_zero16()
                a1 = f_zero16()
                a2 = f_zero16()
                a3 = f_zero16()
                a4 = f_zero16()
                a5 = f_zero16()
                a6 = f_zero16()
                a7 = f_zero16()
                for b in range(nb):
                    o = bp + b * pair
                    if c == 0:
                        prefetch(w, o + pfd)
                    xo, no = c * lx + b * x_stride, c * ln + b * n_stride
                    a0 = step(a0, w, o, xs, xo, ns, no, xd[c, b])
                    if m > 1:
                        a1 = step(a1, w, o, xs, xo + lx, ns, no + ln, xd[c + 1, b])
                    if m > 2:
                        a2 = step(a2, w, o, xs, xo + 2 * lx, ns, no + 2 * ln, xd[c + 2, b])
                    if m > 3:
                        a3 = step(a3, w, o, xs, xo + 3 * lx, ns, no + 3 * ln, xd[c + 3, b])
                    if m > 4:
                        a4 = step(a4, w, o, xs, xo + 4 * lx, ns, no + 4 * ln, xd[c + 4, b])
                    if m > 5:
                        a5 = step(a5, w, o, xs, xo + 5 * lx, ns, no + 5 * ln, xd[c + 5, b])
                    if m > 6:
                        a6 = step(a6, w, o, xs, xo + 6 * lx, ns, no + 6 * ln, xd[c + 6, b])
                    if m > 7:
                        a7 = step(a7, w, o, xs, xo + 7 * lx, ns, no + 7 * ln, xd[c + 7, b])
                put(out[c], p, r0, r1, a0)
                if m > 1:
                    put(out[c + 1], p, r0, r1, a1)
                if m > 2:
                    put(out[c + 2], p, r0, r1, a2)
                if m > 3:
                    put(out[c + 3], p, r0, r1, a3)
                if m > 4:
                    put(out[c + 4], p, r0, r1, a4)
                if m > 5:
                    put(out[c + 5], p, r0, r1, a5)
                if m > 6:
                    put(out[c + 6], p, r0, r1, a6)
                if m > 7:
                    put(out[c + 7], p, r0, r1, a7)
    return matvec, few_columns


@numba.njit(**_NB)
def pairs_to_file(w, r0, r1, out, at, unit=2) -> None:
    """Rows [r0, r1) (whole groups of `unit` rows) of a grouped matrix with byte map `at` in the
    file's layout into out[0:r1 - r0]."""
    rb = w.shape[1]
    wf = w.reshape(-1)
    of = out.reshape(-1)
    for p in range(r0 // unit, r1 // unit):
        for j in range(unit * rb):
            of[(unit * p - r0) * rb + j] = wf[unit * p * rb + at[j]]


# ============================================================================= K quants
@numba.njit(inline="always")
def k4_scales(wf, o):
    """The 12 packed Q4_K/Q5_K scale bytes at wf[o:] -> (scales 0-3, scales 4-7, mins 0-3, mins 4-7),
    one 6-bit value per byte of four uint32 (ggml's kmask word trick)."""
    u0 = ld_u32(wf, o)
    u1 = ld_u32(wf, o + 4)
    u2 = ld_u32(wf, o + 8)
    m6 = np.uint32(0x3F3F3F3F)
    m4 = np.uint32(0x0F0F0F0F)
    m2 = np.uint32(0x03030303)
    sl = u0 & m6
    sh = (u2 & m4) | (((u0 >> np.uint32(6)) & m2) << np.uint32(4))
    ml = u1 & m6
    mh = ((u2 >> np.uint32(4)) & m4) | (((u1 >> np.uint32(6)) & m2) << np.uint32(4))
    return sl, sh, ml, mh

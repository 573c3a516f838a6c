"""Q8_0 products over several activation rows with every output the one-row (matvec) kernel's
to the bit: the decode batch's output matrix on AVX-512 VNNI (engine.batch)."""

from __future__ import annotations

import numba
import numpy as np

from . import Q8_0, kernel_path, matmat, prepare
from .llvm_ir import VNNI
from .intrinsics.dots import dot_us
from .intrinsics.lanes import f_zero, fmadd_i, i_shl, i_sub, i_zero
from .intrinsics.load_store import load_b32
from .intrinsics.reductions import hsum_f
from .intrinsics.scalars import f16_to_f32
from .jitcache import JIT

ONES = np.ones(32, dtype=np.uint8)


@numba.njit(**JIT)
def q8_0_rows_vnni(w, xu, xd, ones, out, r0, r1):
    """out[c, i] = the Q8_0 matvec's dot of weight row i with activation row c, for every c.

    matvec's integer lanes come from the sign trick (|w| . sign(w) x); here each activation row
    is stored offset as u8 (xu = x + 128) and one vpdpbusd per block gives the same exact lanes
    from an accumulator started at -128 * (sum of the lane's weights), computed once per block
    for all rows. The float operations (lanes to f32, one FMA by d_w * d_x per block, the
    pairwise hsum) are matvec's, so every output is matvec's to the bit, at about half the
    instructions per row and block (the output matrix dominates a decode pass). AVX512-VNNI
    only: AVX2's pmaddubsw would saturate u8 x s8 pairs."""
    n, k = xu.shape
    nb = xd.shape[1]
    rb = w.shape[1]
    xf = xu.reshape(-1)
    one = load_b32(ones, 0)
    for i in range(r0, r1):
        base = i * rb
        c = 0
        while c + 8 <= n:
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            a4 = f_zero(); a5 = f_zero(); a6 = f_zero(); a7 = f_zero()
            for b in range(nb):
                o = base + b * 34
                wv = load_b32(w, o + 2)
                dw = f16_to_f32(w, o)
                corr = i_sub(i_zero(), i_shl(dot_us(VNNI, i_zero(), one, wv), 7))
                xo = c * k + b * 32
                a0 = fmadd_i(a0, dot_us(VNNI, corr, load_b32(xf, xo), wv), dw * xd[c, b])
                a1 = fmadd_i(a1, dot_us(VNNI, corr, load_b32(xf, xo + k), wv), dw * xd[c + 1, b])
                a2 = fmadd_i(a2, dot_us(VNNI, corr, load_b32(xf, xo + 2 * k), wv), dw * xd[c + 2, b])
                a3 = fmadd_i(a3, dot_us(VNNI, corr, load_b32(xf, xo + 3 * k), wv), dw * xd[c + 3, b])
                a4 = fmadd_i(a4, dot_us(VNNI, corr, load_b32(xf, xo + 4 * k), wv), dw * xd[c + 4, b])
                a5 = fmadd_i(a5, dot_us(VNNI, corr, load_b32(xf, xo + 5 * k), wv), dw * xd[c + 5, b])
                a6 = fmadd_i(a6, dot_us(VNNI, corr, load_b32(xf, xo + 6 * k), wv), dw * xd[c + 6, b])
                a7 = fmadd_i(a7, dot_us(VNNI, corr, load_b32(xf, xo + 7 * k), wv), dw * xd[c + 7, b])
            out[c, i] = hsum_f(a0)
            out[c + 1, i] = hsum_f(a1)
            out[c + 2, i] = hsum_f(a2)
            out[c + 3, i] = hsum_f(a3)
            out[c + 4, i] = hsum_f(a4)
            out[c + 5, i] = hsum_f(a5)
            out[c + 6, i] = hsum_f(a6)
            out[c + 7, i] = hsum_f(a7)
            c += 8
        while c + 4 <= n:
            a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
            for b in range(nb):
                o = base + b * 34
                wv = load_b32(w, o + 2)
                dw = f16_to_f32(w, o)
                corr = i_sub(i_zero(), i_shl(dot_us(VNNI, i_zero(), one, wv), 7))
                xo = c * k + b * 32
                a0 = fmadd_i(a0, dot_us(VNNI, corr, load_b32(xf, xo), wv), dw * xd[c, b])
                a1 = fmadd_i(a1, dot_us(VNNI, corr, load_b32(xf, xo + k), wv), dw * xd[c + 1, b])
                a2 = fmadd_i(a2, dot_us(VNNI, corr, load_b32(xf, xo + 2 * k), wv), dw * xd[c + 2, b])
                a3 = fmadd_i(a3, dot_us(VNNI, corr, load_b32(xf, xo + 3 * k), wv), dw * xd[c + 3, b])
            out[c, i] = hsum_f(a0)
            out[c + 1, i] = hsum_f(a1)
            out[c + 2, i] = hsum_f(a2)
            out[c + 3, i] = hsum_f(a3)
            c += 4
        while c < n:
            acc = f_zero()
            for b in range(nb):
                o = base + b * 34
                wv = load_b32(w, o + 2)
                corr = i_sub(i_zero(), i_shl(dot_us(VNNI, i_zero(), one, wv), 7))
                acc = fmadd_i(acc, dot_us(VNNI, corr, load_b32(xf, c * k + b * 32), wv), f16_to_f32(w, o) * xd[c, b])
            out[c, i] = hsum_f(acc)
            c += 1


def q8_0_batch(w: np.ndarray, x: np.ndarray, out: np.ndarray, r0: int, r1: int) -> None:
    """out[:, r0:r1] = each row of x (float32 [n, k]) times Q8_0 weight rows r0..r1-1, every row
    with the one-token (matvec) numbers; the VNNI kernel when the active path has it."""
    xq, xd, _ = prepare(Q8_0, x)
    if kernel_path() == "avx512-vnni":
        q8_0_rows_vnni(w, xq.view(np.uint8) ^ np.uint8(0x80), xd, ONES, out, r0, r1)
    else:
        matmat(Q8_0, w, (xq, xd, _), out, r0, r1)

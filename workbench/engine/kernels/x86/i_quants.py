"""I-quants as explicit SIMD: IQ4_NL, IQ4_XS (ggml-cpu arch/x86/quants.c, repack.cpp, llamafile sgemm orders).

The 4-bit indices are mapped to the signed grid values with one vpshufb (``lut_iq4nl``) and dotted with
the Q8_0 activation quants by the sign trick: exact integer lanes, as ggml's mul_add_epi8.  The float
order depends on what llama.cpp runs for the weight and column count (x86, AVX2 / AVX-512):

    rows % 8 == 0 (repacked iq4_nl_8x8)  every output: one f32 chain over the blocks,
                                         acc = fma(f32(S_b), d_w * d_x, acc)    (``repack``)
    otherwise, 1 column                  ggml_vec_dot_iq4_nl_q8_0: blocks in pairs, even blocks into one
                                         f32x8 accumulator and odd ones into another, hsum of their sum,
                                         then a last odd block as sumf = fma(d_x * d_w, f32(S), sumf)
    otherwise, >= 2 columns              tinyBLAS_Q0_AVX: one f32x8 accumulator per output, hsum

IQ4_XS is never repacked nor taken by llamafile's sgemm: below 8 columns every output is
ggml_vec_dot_iq4_xs_q8_K, integer lanes sum_j (ls_j - 32) * (4-element dots of sub-block j) per
super-block, one FMA per super-block with d_w * d_x into an f32x8 accumulator, hsum at the end; from 8
columns ggml's tiled matmul (ggml-cpu/tiled): out = fma(f32(S) * d_w, d_x, out) per super-block, S the
block's exact integer sum (also per expert from 8 routed tokens in mul_mat_id).
"""
from __future__ import annotations

import numba
import numpy as np

from ..i_quants import iq4_xs_scale
from ..llvm_ir import VNNI
from ..intrinsics.dots import dot_ss
from ..intrinsics.lanes import f_add, f_zero, fmadd_i, i_add, i_muls, i_zero
from ..intrinsics.load_store import load_b32
from ..intrinsics.quant_blocks import load_nib, lut_iq4nl
from ..intrinsics.reductions import hsum_f, hsum_i
from ..intrinsics.scalars import f16_to_f32, fma_s
from ..intrinsics.streams import stream_halves, stream_row
from . import repack

from ..jitcache import JIT as _NB
f32 = np.float32


def kernels(mode: int) -> dict:
    """(matvec, matmat) of IQ4_NL and IQ4_XS for one instruction-set mode."""
    @numba.njit(inline="always")
    def u_iq4_nl(w, o):
        return lut_iq4nl(load_nib(mode, w, o + 2))

    @numba.njit(inline="always")
    def block(w, o, xq, xo):
        return dot_ss(mode, i_zero(), u_iq4_nl(w, o), load_b32(xq, xo))

    @numba.njit(**_NB)
    def vec_matvec(w, xp, out, r0, r1):
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        mid = stream_halves(r0, r1, 1, rb)   # two streams: a row of each half in turn
        for j in range(r1 - r0):
            i = stream_row(j, r0, mid, 1)
            base = i * rb
            a1 = f_zero()
            a2 = f_zero()
            b = 0
            while b + 1 < nb:
                o = base + b * 18
                a1 = fmadd_i(a1, block(w, o, xq, b * 32), xd[b] * f16_to_f32(w, o))
                a2 = fmadd_i(a2, block(w, o + 18, xq, b * 32 + 32), xd[b + 1] * f16_to_f32(w, o + 18))
                b += 2
            s = hsum_f(f_add(a1, a2))
            if b < nb:
                o = base + b * 18
                s = fma_s(xd[b] * f16_to_f32(w, o), f32(hsum_i(block(w, o, xq, b * 32))), s)
            out[i] = s

    @numba.njit(**_NB)
    def tiny_matmat(w, xp, out, r0, r1):
        xq, xd, _ = xp
        n, k = xq.shape
        nb = xd.shape[1]
        rb = w.shape[1]
        xf = xq.reshape(-1)
        for i in range(r0, r1):
            base = i * rb
            for c in range(n):
                acc = f_zero()
                for b in range(nb):
                    o = base + b * 18
                    acc = fmadd_i(acc, block(w, o, xf, c * k + b * 32), f16_to_f32(w, o) * xd[c, b])
                out[c, i] = hsum_f(acc)

    rep_matvec, rep_matmat = repack.q4_0_repacked(mode, u_iq4_nl, 18, 0, signed=True)

    @numba.njit(**_NB)
    def iq4_nl_matvec(w, xp, out, r0, r1):
        if w.shape[0] % 8 == 0:
            rep_matvec(w, xp, out, r0, r1)
        else:
            vec_matvec(w, xp, out, r0, r1)

    @numba.njit(**_NB)
    def iq4_nl_plain_matmat(w, xp, out, r0, r1):
        """A weight llama.cpp does not repack (rows % 8 != 0, or a 3-D mul_mat weight:
        kernels.IQ4_NL_PLAIN): tinyBLAS, or vec_dot for one column."""
        if xp[0].shape[0] < 2:   # llamafile_sgemm refuses one column: vec_dot
            vec_matvec(w, (xp[0][0], xp[1][0], xp[2][0]), out[0], r0, r1)
        else:
            tiny_matmat(w, xp, out, r0, r1)

    @numba.njit(**_NB)
    def iq4_nl_matmat(w, xp, out, r0, r1):
        if w.shape[0] % 8 == 0:
            rep_matmat(w, xp, out, r0, r1)
        else:
            iq4_nl_plain_matmat(w, xp, out, r0, r1)

    @numba.njit(inline="always")
    def xs_lanes(w, o, xq, xo):
        """Integer lanes of one IQ4_XS super-block at byte o against activation quants at xq[xo:]."""
        acc = i_zero()
        for j in range(8):
            d = dot_ss(mode, i_zero(), lut_iq4nl(load_nib(mode, w, o + 8 + 16 * j)), load_b32(xq, xo + 32 * j))
            acc = i_add(acc, i_muls(d, iq4_xs_scale(w, o, j)))
        return acc

    @numba.njit(inline="always")
    def xs_dot(w, base, nb, xq, xo, xd):
        acc = f_zero()
        for b in range(nb):
            o = base + b * 136
            acc = fmadd_i(acc, xs_lanes(w, o, xq, xo + b * 256), f16_to_f32(w, o) * xd[b])
        return hsum_f(acc)

    @numba.njit(**_NB)
    def iq4_xs_matvec(w, xp, out, r0, r1):
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        mid = stream_halves(r0, r1, 1, rb)   # two streams: a row of each half in turn
        for j in range(r1 - r0):
            i = stream_row(j, r0, mid, 1)
            out[i] = xs_dot(wf, i * rb, nb, xq, 0, xd)

    @numba.njit(inline="always")
    def xs_tiled(w, base, nb, xq, xo, xd):
        """ggml's tiled matmul (no mins): per super-block out = fma(f32(S) * d_w, d_x, out), S exact."""
        acc = f32(0.0)
        for b in range(nb):
            o = base + b * 136
            acc = fma_s(f32(hsum_i(xs_lanes(w, o, xq, xo + b * 256))) * f16_to_f32(w, o), xd[b], acc)
        return acc

    iq4_xs_rows_matmat = repack.vec_or_tiled(xs_dot, xs_tiled)   # (IQ4_XS is never repacked)

    # from 8 columns the tiled order with 8 rows in lanes (`repack.k16_rows8`) on AVX-512 VNNI (AVX2's
    # pmaddubsw would saturate on the grid values + 128: 241 * 127 * 2)
    iq4_xs_matmat = repack.tiled_from8(repack.k16_rows8(mode, repack.K16_IQ4_XS_TILED), iq4_xs_rows_matmat,
                                       mode == VNNI, repack.rows16_tiled(repack.K16_IQ4_XS_TILED) if mode == VNNI else None)

    @numba.njit(**_NB)
    def iq4_xs_id(w, xp, out, r0, r1, rows):
        iq4_xs_matmat(w, xp, out, r0, r1)

    return dict(IQ4_NL=(iq4_nl_matvec, iq4_nl_matmat), IQ4_XS=(iq4_xs_matvec, iq4_xs_matmat, iq4_xs_id),
                IQ4_NL_plain=(vec_matvec, iq4_nl_plain_matmat))

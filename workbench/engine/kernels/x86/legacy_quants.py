"""Legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) as explicit SIMD (ggml-cpu arch/x86/quants.c).

Integer work per block is exact and follows ggml: Q8_0 uses the sign trick (|w| . sign(w)*x);
Q4_0/Q5_0 multiply unsigned quants and remove the offset inside the i32 lanes with the
precomputed group-of-4 activation sums (``n4``).  Lanes are converted to f32 and fused-multiply-added
with the block scale product, like ggml's AVX2 code.  For Q8_0 and Q5_0 the order is llama.cpp's
(ggml_vec_dot_q{8,5}_0_q8_0 / tinyBLAS_Q0_AVX): the results are bit-identical to it.  The prompt
tiles of Q4_0/Q5_0 are in ``repack``.
"""
from __future__ import annotations

import numba
import numpy as np

from ..llvm_ir import VNNI
from ..intrinsics.dots import dot_ss, dot_us
from ..intrinsics.lanes import b_add, b_or, f_zero, f_zero16, fmadd_i, half_f, i_zero
from ..intrinsics.load_store import load_b32, load_i8
from ..intrinsics.quant_blocks import load_bits16, load_nib, pair_q45, q8_offset, q8_offset_x2
from ..intrinsics.reductions import hsum_f
from ..intrinsics.scalars import f16_lead, f16_to_f32
from ..intrinsics.streams import prefetch, prefetch_distance, prime_streams, stream_halves, stream_row

from . import repack


from ..jitcache import JIT as _NB
f32 = np.float32


@numba.njit(inline="always")
def offset_setup(w, xp, r0, r1, shift):
    """A Q4_0 / Q5_0 one-token product's start: the activation's parts, the group-of-4 sums
    pre-shifted (`ns`), blocks and bytes a row, the prefetch distance and the second stream's first
    row (a pair of rows from each half in turn), each stream's first stretch prefetched."""
    xq, xd, n4 = xp
    nb = xd.shape[0]
    rb = w.shape[1]
    pfd = prefetch_distance(nb * 32)
    mid = stream_halves(r0, r1, 2, rb)
    prime_streams(w, r0, mid, rb, pfd)
    return xq, xd, (n4 << shift).astype(np.int32), nb, rb, pfd, mid


def kernels(mode: int) -> dict:
    """(matvec, matmat) of Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 for one instruction-set mode."""
    @numba.njit(inline="always")
    def q8_0_lanes(w, o, xq, xo):
        return dot_ss(mode, i_zero(), load_b32(w, o + 2), load_b32(xq, xo))

    @numba.njit(inline="always")
    def q4_1_lanes(w, o, xq, xo):
        return dot_us(mode, i_zero(), load_nib(mode, w, o + 4), load_b32(xq, xo))

    @numba.njit(inline="always")
    def q5_1_lanes(w, o, xq, xo):
        q = b_or(load_nib(mode, w, o + 8), load_bits16(w, o + 4))
        return dot_us(mode, i_zero(), q, load_b32(xq, xo))

    # ---- matvec: per-block (lanes, scale, extra) functions and one 4-accumulator driver
    @numba.njit(inline="always")
    def q4_1_blk(w, base, b, xq, xd, xa):
        o = base + b * 20
        return q4_1_lanes(w, o, xq, b * 32), f16_lead(w, o) * xd[b], f16_lead(w, o + 2) * xa[b]

    @numba.njit(inline="always")
    def q5_1_blk(w, base, b, xq, xd, xa):
        o = base + b * 24
        return q5_1_lanes(w, o, xq, b * 32), f16_lead(w, o) * xd[b], f16_lead(w, o + 2) * xa[b]

    def make_matvec(blk, bsz):
        # per row one f32x8 accumulator in block order, then hsum (+ the min terms summed in block
        # order): exactly ggml's x86 vec_dot_q*_q8_* (acc = fmadd(d, q, acc); hsum_float_8(acc) +
        # summs), which llama.cpp runs for these types' products (no repacked or tinyBLAS form);
        # several accumulators a row would round differently. Two rows a step, each its own chain
        # (one row's chain bound the kernel at its latency: Q4_1 at k = 576 ran 16 GB/s a core in
        # cache and from memory alike, AMD EPYC Zen 4), the two streams of make_offset_matvec.
        @numba.njit(**_NB)
        def matvec(w, xp, out, r0, r1):
            xq, xd, xa = xp
            nb = xd.shape[0]
            rb = w.shape[1]
            pfd = prefetch_distance(nb * 32)
            mid = stream_halves(r0, r1, 2, rb)
            prime_streams(w, r0, mid, rb, pfd)
            for j in range((r1 - r0) // 2):
                i = stream_row(j, r0, mid, 2)
                base = i * rb
                a0 = f_zero()
                a1 = f_zero()
                e0 = f32(0.0)
                e1 = f32(0.0)
                for b in range(nb):
                    prefetch(w, base + b * (2 * bsz) + pfd)
                    l0, s0, m0 = blk(w, base, b, xq, xd, xa)
                    l1, s1, m1 = blk(w, base + rb, b, xq, xd, xa)
                    a0 = fmadd_i(a0, l0, s0)
                    a1 = fmadd_i(a1, l1, s1)
                    e0 += m0
                    e1 += m1
                out[i] = hsum_f(a0) + e0
                out[i + 1] = hsum_f(a1) + e1
            if (r1 - r0) % 2:
                i = r1 - 1
                base = i * rb
                a0 = f_zero()
                e0 = f32(0.0)
                for b in range(nb):
                    l0, s0, m0 = blk(w, base, b, xq, xd, xa)
                    a0 = fmadd_i(a0, l0, s0)
                    e0 += m0
                out[i] = hsum_f(a0) + e0
        return matvec

    q4_1_matvec = make_matvec(q4_1_blk, 20)
    q5_1_matvec = make_matvec(q5_1_blk, 24)

    # Q4_0/Q5_0 matvec: ONE f32 chain per row in block order -- llama.cpp's order
    # (ggml_vec_dot_q5_0_q8_0: acc = fma(f32(lanes), d_w * d_x, acc), hsum_float_8), so results are
    # bit-identical to it; offsets pre-shifted once per call (see make_matmat).  Two rows a step, each
    # with its own chain (one row's single chain held it back); the pair's prefetch walks both rows'
    # bytes (2 * bsz a step).  The AVX-512 path runs a one-zmm form of the pair (make_pair_matvec).
    # The runs: benchmarks/HISTORY.md, "Q4_0 / Q5_0 one-token products, two rows a step".
    def make_offset_matvec(unpack, bsz, shift):
        @numba.njit(inline="always")
        def step(acc, w, o, ns, xq, xd, b):
            return fmadd_i(acc, dot_us(mode, load_i8(ns, b * 8), unpack(w, o), load_b32(xq, b * 32)),
                           f16_lead(w, o) * xd[b])

        @numba.njit(**_NB)
        def matvec(w, xp, out, r0, r1):
            xq, xd, ns, nb, rb, pfd, mid = offset_setup(w, xp, r0, r1, shift)
            for j in range((r1 - r0) // 2):
                i = stream_row(j, r0, mid, 2)
                a0 = f_zero()
                a1 = f_zero()
                base = i * rb
                for b in range(nb):
                    o0 = base + b * bsz
                    prefetch(w, base + b * (2 * bsz) + pfd)
                    a0 = step(a0, w, o0, ns, xq, xd, b)
                    a1 = step(a1, w, o0 + rb, ns, xq, xd, b)
                out[i] = hsum_f(a0)
                out[i + 1] = hsum_f(a1)
            if (r1 - r0) % 2:
                i = r1 - 1
                a0 = f_zero()
                base = i * rb
                for b in range(nb):
                    a0 = step(a0, w, base + b * bsz, ns, xq, xd, b)
                out[i] = hsum_f(a0)
        return matvec

    def make_pair_matvec(bits, bsz, shift):
        """make_offset_matvec's products on AVX-512, the two rows of a pair in one zmm register
        (intrinsics.quant_blocks.pair_q45): the same lanes, the same chains, the same bits, half the vector
        instructions for the unpacking, the dot, the conversion and the multiply-add.  A step takes
        a pair from each of the two streams, two independent chains."""
        @numba.njit(**_NB)
        def matvec(w, xp, out, r0, r1):
            xq, xd, ns, nb, rb, pfd, mid = offset_setup(w, xp, r0, r1, shift)
            for s in range((mid - r0) // 2):
                i = r0 + 2 * s
                k = mid + 2 * s
                bi = i * rb
                bk = k * rb
                a = f_zero16()
                c = f_zero16()
                for b in range(nb):
                    o = b * bsz
                    prefetch(w, bi + b * (2 * bsz) + pfd)
                    prefetch(w, bk + b * (2 * bsz) + pfd)
                    a = pair_q45(bits, a, w, bi + o, bi + rb + o, ns, b * 8, xq, b * 32, xd[b])
                    c = pair_q45(bits, c, w, bk + o, bk + rb + o, ns, b * 8, xq, b * 32, xd[b])
                out[i] = hsum_f(half_f(a, 0))
                out[i + 1] = hsum_f(half_f(a, 1))
                out[k] = hsum_f(half_f(c, 0))
                out[k + 1] = hsum_f(half_f(c, 1))
            for i in range(2 * mid - r0, r1, 2):
                i1 = min(i + 1, r1 - 1)   # an odd last row pairs with itself
                base = i * rb
                base1 = i1 * rb
                a = f_zero16()
                for b in range(nb):
                    o = b * bsz
                    prefetch(w, base + b * (2 * bsz) + pfd)
                    a = pair_q45(bits, a, w, base + o, base1 + o, ns, b * 8, xq, b * 32, xd[b])
                out[i] = hsum_f(half_f(a, 0))
                out[i1] = hsum_f(half_f(a, 1))
        return matvec

    @numba.njit(inline="always")
    def u_q4_0(w, o):
        return load_nib(mode, w, o + 2)

    @numba.njit(inline="always")
    def u_q5_0(w, o):
        # nibble + 16 where the 5th bit is set (= nibble | 16): one masked vpaddb on AVX-512
        return b_add(load_nib(mode, w, o + 6), load_bits16(w, o + 2))


    @numba.njit(inline="always")
    def u_q8_0(w, o):
        return q8_offset(w, o)

    @numba.njit(inline="always")
    def u_q8_0_x2(w, o):
        return q8_offset_x2(w, o)

    @numba.njit(**_NB)
    def q8_0_sign_matmat(w, xp, out, r0, r1):
        """1 row x 4 columns, the sign trick (AVX2: pmaddubsw saturates with quants offset by 128)."""
        xq, xd, _ = xp
        n = xq.shape[0]
        nb = xd.shape[1]
        rb = w.shape[1]
        k = xq.shape[1]
        xf = xq.reshape(-1)
        for i in range(r0, r1):
            base = i * rb
            c = 0
            while c + 4 <= n:
                a0 = f_zero(); a1 = f_zero(); a2 = f_zero(); a3 = f_zero()
                for b in range(nb):
                    o = base + b * 34
                    wv = load_b32(w, o + 2)
                    dw = f16_to_f32(w, o)
                    xo = c * k + b * 32
                    a0 = fmadd_i(a0, dot_ss(mode, i_zero(), wv, load_b32(xf, xo)), dw * xd[c, b])
                    a1 = fmadd_i(a1, dot_ss(mode, i_zero(), wv, load_b32(xf, xo + k)), dw * xd[c + 1, b])
                    a2 = fmadd_i(a2, dot_ss(mode, i_zero(), wv, load_b32(xf, xo + 2 * k)), dw * xd[c + 2, b])
                    a3 = fmadd_i(a3, dot_ss(mode, i_zero(), wv, load_b32(xf, xo + 3 * k)), dw * xd[c + 3, b])
                out[c, i] = hsum_f(a0); out[c + 1, i] = hsum_f(a1)
                out[c + 2, i] = hsum_f(a2); out[c + 3, i] = hsum_f(a3)
                c += 4
            while c < n:
                acc = f_zero()
                for b in range(nb):
                    o = base + b * 34
                    acc = fmadd_i(acc, q8_0_lanes(w, o, xf, c * k + b * 32), f16_to_f32(w, o) * xd[c, b])
                out[c, i] = hsum_f(acc)
                c += 1

    # Q8_0 prompt products on AVX-512: the Q4_0 / Q5_0 tiles over quants offset by 128
    q8_0_matmat = repack.q0_matmat_pairs(u_q8_0, u_q8_0_x2, 34, 7) if mode == VNNI else q8_0_sign_matmat
    q4_0_tiled_matmat = repack.q0_matmat(mode, u_q4_0, 4, 18, 3)
    q5_0_matmat = repack.q0_matmat(mode, u_q5_0, 5, 22, 4)
    pairs = mode == VNNI   # one zmm register for a pair of rows (AVX-512)
    q4_0_vec_matvec = make_pair_matvec(4, 18, 3) if pairs else make_offset_matvec(u_q4_0, 18, 3)
    q4_0_rep_matvec, q4_0_rep_matmat = repack.q4_0_repacked(mode, u_q4_0, 18, 3)

    # Q4_0: llama.cpp repacks a weight whose row count is a multiple of 8 (q4_0_8x8, AVX2 / AVX-512) and
    # then runs the repacked gemv/gemm; other weights take ggml_vec_dot_q4_0_q8_0 / tinyBLAS
    @numba.njit(**_NB)
    def q4_0_matvec(w, xp, out, r0, r1):
        if w.shape[0] % 8 == 0:
            q4_0_rep_matvec(w, xp, out, r0, r1)
        else:
            q4_0_vec_matvec(w, xp, out, r0, r1)

    @numba.njit(**_NB)
    def q4_0_matmat(w, xp, out, r0, r1):
        if w.shape[0] % 8 == 0:
            q4_0_rep_matmat(w, xp, out, r0, r1)
        else:
            q4_0_tiled_matmat(w, xp, out, r0, r1)
    q5_0_matvec = make_pair_matvec(5, 22, 4) if pairs else make_offset_matvec(u_q5_0, 22, 4)

    # Q8_0 matvec: one f32 chain per row in block order, written out (llama.cpp's ggml_vec_dot_q8_0_q8_0
    # order; make_matvec's four accumulators happened to compile to one chain, which is not a guarantee)
    @numba.njit(inline="always")
    def q8_0_step(acc, w, o, xq, xd, b):
        return fmadd_i(acc, q8_0_lanes(w, o, xq, b * 32), f16_lead(w, o) * xd[b])

    @numba.njit(**_NB)
    def q8_0_matvec(w, xp, out, r0, r1):
        xq, xd, _ = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        pfd = prefetch_distance(nb * 32)
        mid = stream_halves(r0, r1, 1, rb)   # two streams: a row from each half in turn
        prime_streams(w, r0, mid, rb, pfd)
        for j in range(r1 - r0):
            i = stream_row(j, r0, mid, 1)
            acc = f_zero()
            base = i * rb
            # two blocks a step, one unconditional prefetch (a test per block was 7 of a Q5_0 block's 26
            # instructions); this range form, not j in range(nb // 2) with b = 2 * j: the j-loop ran
            # Q5_0 at 10 GB/s from memory against 14 on the Intel Xeon host, Q8_0 16.6-17.0 either way.
            # One row at a time: two rows in step ran 16.0 against 16.9 GB/s (1 core, K = 640)
            for b in range(0, nb - 1, 2):
                o = base + b * 34
                prefetch(w, o + pfd)
                acc = q8_0_step(acc, w, o, xq, xd, b)
                acc = q8_0_step(acc, w, o + 34, xq, xd, b + 1)
            if nb % 2:
                acc = q8_0_step(acc, w, base + (nb - 1) * 34, xq, xd, nb - 1)
            out[i] = hsum_f(acc)

    def make_min_matmat(lanes, bsz):
        # Q4_1 / Q5_1 (blocks with a min): one f32x8 accumulator plus the min terms, per column
        @numba.njit(**_NB)
        def matmat(w, xp, out, r0, r1):
            xq, xd, xs = xp
            n = xq.shape[0]
            nb = xd.shape[1]
            rb = w.shape[1]
            k = xq.shape[1]
            xf = xq.reshape(-1)
            for i in range(r0, r1):
                base = i * rb
                for c in range(n):
                    acc = f_zero()
                    accm = f32(0.0)
                    for b in range(nb):
                        o = base + b * bsz
                        acc = fmadd_i(acc, lanes(w, o, xf, c * k + b * 32), f16_to_f32(w, o) * xd[c, b])
                        accm += f16_to_f32(w, o + 2) * xs[c, b]
                    out[c, i] = hsum_f(acc) + accm
        return matmat

    q4_1_matmat = make_min_matmat(q4_1_lanes, 20)
    q5_1_matmat = make_min_matmat(q5_1_lanes, 24)

    # mul_mat_id (one expert's gathered tokens): ggml-cpu runs vec_dot per (row, token), or the repacked
    # gemv per token for Q4_0 (rows % 8 == 0); the prompt products above give every column exactly that
    # order (tinyBLAS's per-column chain is vec_dot's; the q4_0_8x8 gemm's is the gemv's)
    @numba.njit(**_NB)
    def q8_0_id(w, xp, out, r0, r1, rows):
        q8_0_matmat(w, xp, out, r0, r1)

    @numba.njit(**_NB)
    def q5_0_id(w, xp, out, r0, r1, rows):
        q5_0_matmat(w, xp, out, r0, r1)

    @numba.njit(**_NB)
    def q4_0_id(w, xp, out, r0, r1, rows):
        if rows % 8 == 0:
            q4_0_rep_matmat(w, xp, out, r0, r1)
        else:
            q4_0_tiled_matmat(w, xp, out, r0, r1)

    # a 3-D mul_mat weight (kernels.Q4_0_PLAIN), never repacked: vec_dot / tinyBLAS at any row count
    @numba.njit(**_NB)
    def q4_0_plain_id(w, xp, out, r0, r1, rows):
        q4_0_tiled_matmat(w, xp, out, r0, r1)

    return dict(Q8_0=(q8_0_matvec, q8_0_matmat, q8_0_id), Q4_0=(q4_0_matvec, q4_0_matmat, q4_0_id),
                Q4_0_plain=(q4_0_vec_matvec, q4_0_tiled_matmat, q4_0_plain_id),
                Q5_0=(q5_0_matvec, q5_0_matmat, q5_0_id), Q4_1=(q4_1_matvec, q4_1_matmat),
                Q5_1=(q5_1_matvec, q5_1_matmat))

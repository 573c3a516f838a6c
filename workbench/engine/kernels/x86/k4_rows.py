"""Q4_K one-token product (gemv) over 8 rows at a time, from the plain GGUF block layout.

The per-row kernel (``k_quants``' ``q4_K_matvec_rows``, now only for the rows past the last whole
group of 8) reduces each row's integer lanes with a horizontal sum per super-block, unpacks the 6-bit
scales with scalar code, converts the f16 d / dmin and does the two FMAs one row at a time.  Here a
group of 8 consecutive rows goes in two passes:

1. the group's 8 * nb blocks in memory order (one sequential stream: the hardware prefetcher follows
   it; reading the 8 rows side by side, 8 interleaved streams, ran at a third of the memory speed).
   Per block, the integer lanes of sum_j sc_j * dot_j as the per-row kernel (pmaddubsw, then pmaddwd
   / vpdpwssd with the sub-block's scale put in every i16 lane by one vpshufb, ``madd_sb``), the
   scales and mins unpacked with vector shifts (``k4_sv``), the mins' sum_j m_j * bsum_j as one
   pmaddwd against the activations' bsums (``bsum_table``), both folded into one i32x8 (``fold_sm``:
   sums in lanes 0-3, mins in lanes 4-7) and stored to a small scratch array;
2. per super-block, the 8 rows' folded lanes reduced together by a transpose-add tree
   (``reduce8x2``: the exact integer sums S and mins sums M of the 8 rows, no per-row horizontal
   sum), the 8 rows' f16 d and dmin converted by one vcvtph2ps each (``f16x8_pairs``) and the gemv's
   two FMAs done with rows in lanes.

Per row the float operations are those of ggml_gemv_q4_K_8x8_q8_K (and of the per-row kernel): per
super-block acc = fma(f32(S), d * d_x, acc), accm = fma(f32(M), dmin * d_x, accm), out = acc - accm,
with S and M exact integers -- so the results are bit-identical whatever the grouping.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..llvm_ir import BYTE_DTYPES, check_array, declare, literal_mode, ll, load_at_arg, v16s, v32b, v8f, v8i
from ..intrinsics.dots import add_word_products, madd16
from ..intrinsics.lanes import b_and, b_shr, f_lane, f_scale, f_sub, f_zero, fmadd_v, i_add, i_zero
from ..intrinsics.load_store import load_b32, load_i8, store_i32x8
from ..intrinsics.streams import group_steps, prefetch, PREFETCH_MAX_K, PREFETCH_NEAR, prime_streams, step_groups

from ..jitcache import JIT as _NB
_V4I = ir.VectorType(ll.i32, 4)


def _sh(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ll.i32, len(idx)), idx))


# ----------------------------------------------------------------------------- intrinsics
@intrinsic
def k4_sv(typingctx, a, off):
    """The 12 packed scale bytes of a Q4_K block at byte ``off`` -> i16x16: lanes 0-7 the 6-bit scales,
    8-15 the 6-bit mins (get_scale_min_k4; ggml's kmask word trick with vector shifts).  Reads 16
    bytes (the last 4 are quants of the same block)."""
    check_array(a, BYTE_DTYPES)
    sig = v16s(a, off)

    def cg(context, builder, sig, args):
        # 16 bytes from off: dwords u0, u1, u2 (the scale bytes) and 4 bytes of quants (unused)
        u = load_at_arg(context, builder, sig, args, 0, _V4I)
        c = lambda vals: ir.Constant(_V4I, vals)  # noqa: E731
        m6, m4, m2 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303
        # [sl, sh, ml, mh] = [u0 & m6, (u2 & m4) | ((u0 >> 6) & m2) << 4, u1 & m6, ((u2 >> 4) & m4) | ((u1 >> 6) & m2) << 4]
        lo = builder.and_(builder.lshr(_sh(builder, u, u, [0, 2, 1, 2]), c([0, 0, 0, 4])), c([m6, m4, m6, m4]))
        hi = builder.shl(builder.and_(builder.lshr(_sh(builder, u, u, [0, 0, 1, 1]), c([6, 6, 6, 6])),
                                      c([0, m2, 0, m2])), c([4, 4, 4, 4]))
        return builder.zext(builder.bitcast(builder.or_(lo, hi), ll.v16i8), ll.v16i16)

    return sig, cg


@intrinsic
def sv_bytes(typingctx, sv):
    """``k4_sv``'s 16 values back as bytes in both 128-bit halves (i8x32), for ``madd_sb``'s vpshufb."""
    sig = v32b(sv)

    def cg(context, builder, sig, args):
        b16 = builder.trunc(args[0], ll.v16i8)
        return _sh(builder, b16, b16, list(range(16)) * 2)

    return sig, cg


@intrinsic
def madd_sb(typingctx, mode, acc, a, b, svd, j):
    """acc + pmaddwd(pmaddubsw(u8 a, s8 b), byte j of ``svd`` in every i16 lane): one sub-block's
    scaled dot lanes.  The scale comes from ``sv_bytes``' vector by one vpshufb with a constant mask
    (as ggml's get_scale_shuffle_k4; a constant i16 shuffle of the i16x16 scales costs LLVM a shift
    and a broadcast), vpdpwssd on VNNI."""
    m = literal_mode(mode)
    if not isinstance(j, types.IntegerLiteral):
        raise TypingError("madd_sb: the scale lane must be a compile-time int")
    lane = j.literal_value
    sig = v8i(mode, acc, a, b, svd, j)

    def cg(context, builder, sig, args):
        acc, a, b, svd = args[1:5]
        # byte ``lane`` zero-extended into every i16 (a pshufb index with the high bit set gives 0)
        mask = ir.Constant(ll.v32i8, [lane, 0x80] * 16)
        sc = builder.call(declare(builder, "llvm.x86.avx2.pshuf.b", ll.v32i8, [ll.v32i8, ll.v32i8]), [svd, mask])
        sc = builder.bitcast(sc, ll.v16i16)
        p16 = builder.call(declare(builder, "llvm.x86.avx2.pmadd.ub.sw", ll.v16i16, [ll.v32i8, ll.v32i8]), [a, b])
        return add_word_products(builder, m, acc, p16, sc)

    return sig, cg


@intrinsic
def load_i16x16(typingctx, a, off):
    """16 int16 at element ``off`` of an int16 array."""
    check_array(a, (types.int16,))
    sig = v16s(a, off)
    return sig, lambda context, builder, sig, args: load_at_arg(context, builder, sig, args, 0, ll.v16i16)


@numba.njit(inline="always")
def bsum_table(xb, t, at):
    """Into int16 ``t[at:at + nb * 16]``: per super-block, 8 zeros then the 8 bsums of 32-element
    sub-blocks (|bsum| <= 32 * 127, exact): pmaddwd of ``k4_sv`` with it gives the mins' pair sums in
    lanes 4-7."""
    nb = xb.shape[0] // 16
    for b in range(nb):
        for j in range(8):
            t[at + b * 16 + j] = 0
            t[at + b * 16 + 8 + j] = np.int16(xb[b * 16 + 2 * j] + xb[b * 16 + 2 * j + 1])


@intrinsic
def fold_sm(typingctx, s, m):
    """One i32x8 of a row's two lane vectors: lanes 0-3 the sums of s's two halves (same total as s),
    lanes 4-7 those of m's (m's lanes 0-3 are zero: same total as m).  Exact integer adds."""
    sig = v8i(s, m)

    def cg(context, builder, sig, args):
        a, b = args
        return builder.add(_sh(builder, a, b, [0, 1, 2, 3, 12, 13, 14, 15]), _sh(builder, a, b, [4, 5, 6, 7, 8, 9, 10, 11]))

    return sig, cg


@intrinsic
def reduce8x2(typingctx, v0, v1, v2, v3, v4, v5, v6, v7):
    """(S, M): lane r of S is the sum of lanes 0-3 of v_r, of M the sum of lanes 4-7 (transpose-add tree)."""
    sig = types.UniTuple(v8i, 2)(v0, v1, v2, v3, v4, v5, v6, v7)

    def cg(context, builder, sig, args):
        def pair(a, b):   # [a0+a1, b0+b1, a2+a3, b2+b3, a4+a5, b4+b5, a6+a7, b6+b7]
            return builder.add(_sh(builder, a, b, [0, 8, 2, 10, 4, 12, 6, 14]), _sh(builder, a, b, [1, 9, 3, 11, 5, 13, 7, 15]))

        def quad(p, q):   # [S_a, S_b, S_c, S_d, M_a, M_b, M_c, M_d]
            return builder.add(_sh(builder, p, q, [0, 1, 8, 9, 4, 5, 12, 13]), _sh(builder, p, q, [2, 3, 10, 11, 6, 7, 14, 15]))

        lo = quad(pair(args[0], args[1]), pair(args[2], args[3]))
        hi = quad(pair(args[4], args[5]), pair(args[6], args[7]))
        s = _sh(builder, lo, hi, [0, 1, 2, 3, 8, 9, 10, 11])
        m = _sh(builder, lo, hi, [4, 5, 6, 7, 12, 13, 14, 15])
        return context.make_tuple(builder, sig.return_type, [s, m])

    return sig, cg


@intrinsic
def f16x8_pairs(typingctx, a, off, stride):
    """(d, dmin) f32x8 of 8 rows: the two f16 at bytes ``off + r * stride`` (r < 8), each vector
    converted at once (vcvtph2ps; exact)."""
    check_array(a, BYTE_DTYPES)
    sig = types.UniTuple(v8f, 2)(a, off, stride)

    def cg(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        v = ir.Constant(ll.v8i32, None)
        for r in range(8):
            o = builder.add(args[1], builder.mul(args[2], ir.Constant(args[2].type, r)))
            p = builder.bitcast(builder.gep(ary.data, [o]), ll.i32.as_pointer())
            v = builder.insert_element(v, builder.load(p, align=1), ir.Constant(ll.i32, r))
        d = builder.fpext(builder.bitcast(builder.trunc(v, ll.v8i16), ll.v8f16), ll.v8f32)
        dm = builder.fpext(builder.bitcast(builder.trunc(builder.lshr(v, ir.Constant(ll.v8i32, [16] * 8)), ll.v8i16), ll.v8f16), ll.v8f32)
        return context.make_tuple(builder, sig.return_type, [d, dm])

    return sig, cg




# ----------------------------------------------------------------------------- kernel
def q4_K_gemv_rows8(mode: int):
    """The Q4_K gemv of whole groups of 8 rows (rows in lanes after the integer work) for one
    instruction-set mode: ``fn(w, xp, out, r0, r1)`` computes the whole groups of 8 rows from r0
    ((r1 - r0) // 8 of them; callers pass (r1 - r0) % 8 == 0 and do the rest row by row), float order
    of ggml_gemv_q4_K_8x8_q8_K per row."""
    @numba.njit(inline="always")
    def row(wf, o, xq, xo, bsv):
        """The block at byte o: fold_sm of (its scaled dot lanes, its mins lanes)."""
        sv = k4_sv(wf, o + 4)
        sd = sv_bytes(sv)
        # two accumulators (even and odd sub-blocks): half the dependency chain, same exact sum
        raw = load_b32(wf, o + 16)
        acc = madd_sb(mode, i_zero(), b_and(raw, 15), load_b32(xq, xo), sd, 0)
        acc1 = madd_sb(mode, i_zero(), b_shr(raw, 4), load_b32(xq, xo + 32), sd, 1)
        raw = load_b32(wf, o + 48)
        acc = madd_sb(mode, acc, b_and(raw, 15), load_b32(xq, xo + 64), sd, 2)
        acc1 = madd_sb(mode, acc1, b_shr(raw, 4), load_b32(xq, xo + 96), sd, 3)
        raw = load_b32(wf, o + 80)
        acc = madd_sb(mode, acc, b_and(raw, 15), load_b32(xq, xo + 128), sd, 4)
        acc1 = madd_sb(mode, acc1, b_shr(raw, 4), load_b32(xq, xo + 160), sd, 5)
        raw = load_b32(wf, o + 112)
        acc = madd_sb(mode, acc, b_and(raw, 15), load_b32(xq, xo + 192), sd, 6)
        acc1 = madd_sb(mode, acc1, b_shr(raw, 4), load_b32(xq, xo + 224), sd, 7)
        acc = i_add(acc, acc1)
        return fold_sm(acc, madd16(mode, i_zero(), sv, bsv))

    @numba.njit(**_NB)
    def gemv_rows8(w, xp, out, r0, r1):
        xq, xd, xb = xp
        nb = xd.shape[0]
        rb = w.shape[1]
        wf = w.reshape(-1)
        # folded lanes of the group's 8 rows per super-block: the rows are read one after the other
        # (one sequential stream, which the hardware prefetcher follows; 8 interleaved row streams
        # run at a third of the memory speed), then reduced together per super-block
        # one allocation per call (the runtime calls it on pieces of 32 rows): the scratch lanes,
        # then the bsum table
        pf = nb * 256 <= PREFETCH_MAX_K
        # two streams (intrinsics.streams.TWO_STREAMS_MIN): a group of each half, row by row in turn; the
        # lanes of the second group after the bsum table
        lanes = np.empty(nb * 136, np.int32)
        bt = lanes.view(np.int16)
        bsum_table(xb, bt, nb * 128)
        n_pairs, n_steps = group_steps(r0, r1, 8, rb)   # whole groups only (never past r1)
        mid = r0 + 8 * n_pairs
        if pf:
            prime_streams(wf, r0, mid, rb, PREFETCH_NEAR)
        for st in range(n_steps):
            ga, gb, nh = step_groups(st, r0, mid, n_pairs, 8)
            for r in range(8):
                for h in range(nh):
                    o = ((ga if h == 0 else gb) + r) * rb
                    for b in range(nb):
                        if pf:   # every line of the block, as the Q6_K rows (see intrinsics.streams.PREFETCH_NEAR)
                            prefetch(wf, o + b * 144 + PREFETCH_NEAR)
                            prefetch(wf, o + b * 144 + PREFETCH_NEAR + 64)
                            prefetch(wf, o + b * 144 + PREFETCH_NEAR + 128)
                        store_i32x8(lanes, h * nb * 72 + (b * 8 + r) * 8,
                                    row(wf, o + b * 144, xq, b * 256, load_i16x16(bt, nb * 128 + b * 16)))
            for h in range(nh):
                i = ga if h == 0 else gb
                acc = f_zero()
                accm = f_zero()
                for b in range(nb):
                    lo = h * nb * 72 + b * 64
                    s, m = reduce8x2(load_i8(lanes, lo), load_i8(lanes, lo + 8), load_i8(lanes, lo + 16),
                                     load_i8(lanes, lo + 24), load_i8(lanes, lo + 32), load_i8(lanes, lo + 40),
                                     load_i8(lanes, lo + 48), load_i8(lanes, lo + 56))
                    d, dm = f16x8_pairs(wf, i * rb + b * 144, rb)
                    xdb = xd[b]
                    acc = fmadd_v(acc, s, f_scale(d, xdb))
                    accm = fmadd_v(accm, m, f_scale(dm, xdb))
                r = f_sub(acc, accm)
                for q in range(8):
                    out[i + q] = f_lane(r, q)

    return gemv_rows8

"""Rows regrouped into lanes for the repacked prompt products (`x86.repack`): a super-block's
quants as unsigned bytes in natural order, an n x n dword transpose, a row's fields into a
transpose's source row."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..llvm_ir import BYTE_DTYPES, check_array, declare, array_ptr, ll
from .quant_blocks import KVALUES_IQ4NL


@intrinsic
def quants_unsigned(typingctx, w, o, t, to, kind):
    """The 256 quants of the Q3_K (kind 0), Q2_K (1), IQ4_XS (2), Q4_K (3) or Q5_K (4, compile-time)
    super-block at byte o of w as unsigned bytes in their natural order into t[to:to + 256] (Q3_K: q + 4,
    the low bits | the hmask bit << 2; Q2_K: 0..3; IQ4_XS: the grid value + 128; Q4_K: 0..15; Q5_K:
    0..31 with the fifth bit): the rows' side of `repack._repack_k16` / `_repack_q4_K` in 32-byte
    vectors (AVX2 and up) instead of 4 quants at a time."""
    check_array(w, BYTE_DTYPES)
    check_array(t, BYTE_DTYPES)
    if not isinstance(kind, types.IntegerLiteral) or kind.literal_value not in (0, 1, 2, 3, 4):
        raise TypingError("quants_unsigned: kind must be a compile-time 0..4")
    kd = kind.literal_value
    sig = types.void(w, o, t, to, kind)

    def cg(context, builder, sig, args):
        wa, o, ta, to = args[0], args[1], args[2], args[3]
        V4Q = ir.VectorType(ll.i64, 4)

        def ld(off, ty):
            return builder.load(array_ptr(context, builder, sig.args[0], wa, builder.add(o, ir.Constant(o.type, off)), ty),
                                align=1)

        def st(off, v):
            builder.store(v, array_ptr(context, builder, sig.args[2], ta, builder.add(to, ir.Constant(to.type, off)), ll.v32i8),
                          align=1)

        def bits(v, shifts, mask):   # bytes of (v >> shift) & mask, the shift per 128-bit half
            sh = builder.lshr(builder.bitcast(v, V4Q), ir.Constant(V4Q, [shifts[0]] * 2 + [shifts[1]] * 2))
            return builder.and_(builder.bitcast(sh, ll.v32i8), ir.Constant(ll.v32i8, [mask] * 32))

        if kd == 2:
            table = ir.Constant(ll.v32i8, [(x + 128) & 0xFF for x in KVALUES_IQ4NL] * 2)
            pshufb = declare(builder, "llvm.x86.avx2.pshuf.b", ll.v32i8, [ll.v32i8, ll.v32i8])
            for j in range(8):
                raw = ld(8 + 16 * j, ll.v16i8)
                both = builder.shuffle_vector(raw, raw, ir.Constant(ir.VectorType(ll.i32, 32), list(range(16)) * 2))
                st(32 * j, builder.call(pshufb, [table, bits(both, (0, 4), 15)]))
            return context.get_dummy_value()
        if kd >= 3:   # Q4_K / Q5_K: 64 quants per 32 bytes, the low nibbles then the high
            qh = ld(16, ll.v32i8) if kd == 4 else None
            for p in range(4):
                raw = ld((48 if kd == 4 else 16) + 32 * p, ll.v32i8)
                lo, hi = bits(raw, (0, 0), 15), bits(raw, (4, 4), 15)
                if kd == 4:   # the fifth bits (bit 2p of qh: the low nibbles', 2p + 1: the high ones') as + 16
                    four = ir.Constant(ll.v32i8, [4] * 32)
                    lo = builder.or_(lo, builder.shl(bits(qh, (2 * p, 2 * p), 1), four))
                    hi = builder.or_(hi, builder.shl(bits(qh, (2 * p + 1, 2 * p + 1), 1), four))
                st(64 * p, lo)
                st(64 * p + 32, hi)
            return context.get_dummy_value()
        hm = ld(0, ll.v32i8) if kd == 0 else None
        for h in range(2):
            raw = ld((32 if kd == 0 else 16) + 32 * h, ll.v32i8)
            for i in range(4):
                q = bits(raw, (2 * i, 2 * i), 3)
                if kd == 0:
                    hb = bits(hm, (4 * h + i, 4 * h + i), 1)
                    q = builder.or_(q, builder.shl(hb, ir.Constant(ll.v32i8, [2] * 32)))
                st(128 * h + 32 * i, q)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def transpose_words(typingctx, src, so, dst, do, first, count, n):
    """The n x n dwords (n = 8 or 16) at byte so of src (row r: 4n bytes at so + 256 r) transposed:
    rows first .. first + count - 1 of the result (row c: dword c of every source row) to the bytes
    at do of dst, 4n each (all compile-time ints but the offsets): n loads, log2(n) rounds of n
    two-source permutes (round k swaps bit k of the row and column numbers), the stores."""
    check_array(src, BYTE_DTYPES)
    check_array(dst, BYTE_DTYPES)
    for v in (first, count, n):
        if not isinstance(v, types.IntegerLiteral):
            raise TypingError("transpose_words: first, count and n must be compile-time ints")
    c0, nc, nn = first.literal_value, count.literal_value, n.literal_value
    if nn not in (8, 16):
        raise TypingError("transpose_words: n must be 8 or 16")
    sig = types.void(src, so, dst, do, first, count, n)

    def cg(context, builder, sig, args):
        sa, so, da, do = args[:4]
        V = ir.VectorType(ll.i32, nn)
        rows = [builder.load(array_ptr(context, builder, sig.args[0], sa, builder.add(so, ir.Constant(so.type, 256 * r)),
                                  V), align=1) for r in range(nn)]
        for k in range(nn.bit_length() - 1):
            m = 1 << k
            nxt = list(rows)
            for i in range(nn):
                if i & m:
                    continue
                j = i | m
                # new row i: column c from row i (bit k of c clear) or row j's column c - m;
                # new row j: row i's column c + m (bit k clear) or row j's column c (shuffle indices
                # 0..n-1: the first vector, n..2n-1: the second)
                lo = [c if not c & m else nn + c - m for c in range(nn)]
                hi = [c + m if not c & m else nn + c for c in range(nn)]
                nxt[i] = builder.shuffle_vector(rows[i], rows[j], ir.Constant(V, lo))
                nxt[j] = builder.shuffle_vector(rows[i], rows[j], ir.Constant(V, hi))
            rows = nxt
        for c in range(c0, c0 + nc):
            builder.store(rows[c], array_ptr(context, builder, sig.args[2], da,
                                        builder.add(do, ir.Constant(do.type, 4 * nn * (c - c0))), V), align=1)
        return context.get_dummy_value()

    return sig, cg


@intrinsic
def store_fields16(typingctx, t, to, sv, pv):
    """A row's regrouping fields into a transpose's source row: the i16x16 sv sign-extended to 16
    int32 at byte to of t, the i16x16 pv (8 i16 pairs) at to + 64."""
    check_array(t, BYTE_DTYPES)
    sig = types.void(t, to, sv, pv)

    def cg(context, builder, sig, args):
        ta, to, sv, pv = args
        builder.store(builder.sext(sv, ll.v16i32), array_ptr(context, builder, sig.args[0], ta, to, ll.v16i32), align=1)
        builder.store(pv, array_ptr(context, builder, sig.args[0], ta, builder.add(to, ir.Constant(to.type, 64)), ll.v16i16),
                      align=1)
        return context.get_dummy_value()

    return sig, cg

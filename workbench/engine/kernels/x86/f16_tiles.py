"""One F16 matrix against 8 inputs at a time in register tiles of 2 rows x 8 inputs (AVX-512).

A decoded token's attention is this product twice a layer: the key rows against the query heads
that share them (scores), the V^T rows against the heads' probabilities (weighted values). With
MLA every head shares one 576-wide latent row a position, so the work is arithmetic, not bytes.

`floats._heads` runs one row against 4 inputs with ggml_vec_dot_f16's 4 accumulators each: every
FMA takes its input's lanes from memory, 20 loads for 16 FMAs, and the loads, not the FMAs, were
the limit (Intel Xeon family 6 model 106: ~76 GFLOP/s a core from L1 against 170 for FMAs alone).
Here the order of a dot's additions is split the other way. ggml's accumulator q (q = 0..3) sums
the 16-lane blocks at values 64 j + 16 q in order, independently of the other three; so a tile
runs one q at a time over the whole row (or a segment of it), 2 rows x 8 inputs = 16 accumulators,
with the 8 inputs' lanes loaded once for both rows and each row's lanes converted once for the 8
inputs (10 loads for 16 FMAs). The four partial sums of a (row, input) wait in a scratch buffer
and are combined in ggml's order, (0 + 2) + (1 + 3), then the 16-lane tree and the float64
leftovers: every output is `floats.dot16_pf`'s to the bit.

Long rows (the weighted values at depth: a V^T row is as long as the cache) run in segments of
`SEGMENT` values so that the 8 inputs' segment stays in L1 while the tiles go over it; each
tile's partial sums carry from one segment to the next in the scratch buffer, in order.
"""
from __future__ import annotations

import numba

from ..activations import empty_aligned
from ..intrinsics.lanes import f_add, f_zero16, fma_f
from ..intrinsics.load_store import load_f16x16, load_f32x16, store_f32x16
from ..intrinsics.reductions import hsum16
from ..intrinsics.streams import prefetch
from ..jitcache import JIT as _NB

SEGMENT = 512     # values of a row a segment when a row is longer than SEGMENT_MAX (8 inputs: 16 KB)
SEGMENT_MAX = 768   # rows of up to this many values run whole (a key row: 576 with MLA; 8 inputs 24 KB)
TILE_MIN_K = 512  # shorter rows: a tile's partial sums and reductions cost more than its loads save
#                   (the R1-shape file's 192-wide key rows, 8 heads: 42 -> 35 GFLOP/s tiled)
BLOCK_TILES = 16  # tiles (32 rows) a block: every group of 8 inputs goes over a block while it is in L2
TILE = 2 * 8 * 4 * 16  # floats of scratch a tile: 2 rows x 8 inputs x 4 accumulators x 16 lanes


@numba.njit(inline="always")
def _pass(w, o0, o1, x, xo, xs, j, end, carry, sc, so, pf0, pf1):
    """Accumulator q of a 2 x 8 tile: the 16-lane blocks j, j + 64, ... < end of rows at bytes o0,
    o1 of w against the inputs x[xo + h xs], h < 8; started from the partial sums at sc[so] when
    `carry` (an earlier segment's), else from zero; stored back at sc[so] (row fastest, then
    input). Rows at bytes pf0 / pf1 (>= 0) are prefetched in step, two lines a block."""
    if carry:
        a0 = load_f32x16(sc, so); b0 = load_f32x16(sc, so + 16)
        a1 = load_f32x16(sc, so + 32); b1 = load_f32x16(sc, so + 48)
        a2 = load_f32x16(sc, so + 64); b2 = load_f32x16(sc, so + 80)
        a3 = load_f32x16(sc, so + 96); b3 = load_f32x16(sc, so + 112)
        a4 = load_f32x16(sc, so + 128); b4 = load_f32x16(sc, so + 144)
        a5 = load_f32x16(sc, so + 160); b5 = load_f32x16(sc, so + 176)
        a6 = load_f32x16(sc, so + 192); b6 = load_f32x16(sc, so + 208)
        a7 = load_f32x16(sc, so + 224); b7 = load_f32x16(sc, so + 240)
    else:
        a0 = f_zero16(); b0 = f_zero16(); a1 = f_zero16(); b1 = f_zero16()
        a2 = f_zero16(); b2 = f_zero16(); a3 = f_zero16(); b3 = f_zero16()
        a4 = f_zero16(); b4 = f_zero16(); a5 = f_zero16(); b5 = f_zero16()
        a6 = f_zero16(); b6 = f_zero16(); a7 = f_zero16(); b7 = f_zero16()
    while j < end:
        if pf0 >= 0:
            prefetch(w, pf0 + 2 * j)
            prefetch(w, pf0 + 2 * j + 64)
            prefetch(w, pf1 + 2 * j)
            prefetch(w, pf1 + 2 * j + 64)
        wa = load_f16x16(w, o0 + 2 * j)
        wb = load_f16x16(w, o1 + 2 * j)
        v = load_f32x16(x, xo + j)
        a0 = fma_f(a0, wa, v); b0 = fma_f(b0, wb, v)
        v = load_f32x16(x, xo + xs + j)
        a1 = fma_f(a1, wa, v); b1 = fma_f(b1, wb, v)
        v = load_f32x16(x, xo + 2 * xs + j)
        a2 = fma_f(a2, wa, v); b2 = fma_f(b2, wb, v)
        v = load_f32x16(x, xo + 3 * xs + j)
        a3 = fma_f(a3, wa, v); b3 = fma_f(b3, wb, v)
        v = load_f32x16(x, xo + 4 * xs + j)
        a4 = fma_f(a4, wa, v); b4 = fma_f(b4, wb, v)
        v = load_f32x16(x, xo + 5 * xs + j)
        a5 = fma_f(a5, wa, v); b5 = fma_f(b5, wb, v)
        v = load_f32x16(x, xo + 6 * xs + j)
        a6 = fma_f(a6, wa, v); b6 = fma_f(b6, wb, v)
        v = load_f32x16(x, xo + 7 * xs + j)
        a7 = fma_f(a7, wa, v); b7 = fma_f(b7, wb, v)
        j += 64
    store_f32x16(sc, so, a0); store_f32x16(sc, so + 16, b0)
    store_f32x16(sc, so + 32, a1); store_f32x16(sc, so + 48, b1)
    store_f32x16(sc, so + 64, a2); store_f32x16(sc, so + 80, b2)
    store_f32x16(sc, so + 96, a3); store_f32x16(sc, so + 112, b3)
    store_f32x16(sc, so + 128, a4); store_f32x16(sc, so + 144, b4)
    store_f32x16(sc, so + 160, a5); store_f32x16(sc, so + 176, b5)
    store_f32x16(sc, so + 192, a6); store_f32x16(sc, so + 208, b6)
    store_f32x16(sc, so + 224, a7); store_f32x16(sc, so + 240, b7)


def tiled_heads(rest, tail16, prefetch_bytes: int):
    """`kernels.f16_heads` in 2 x 8 tiles for groups of 8 inputs and pairs of rows; `rest` (the
    one-row kernel of the same signature, `floats._heads`) takes a left-over row and inputs;
    `tail16(w, o, x, xo, j, k, v)` adds a dot's leftovers past its blocks of 64 to its vector
    part v; rows `prefetch_bytes` ahead are prefetched as a tile goes (keys read from memory)."""
    @numba.njit(**_NB)
    def heads(w, x, xs, k, nh, out, os, r0, r1):
        n = k // 64 * 64
        g = nh // 8 * 8
        pairs = (r1 - r0) // 2
        if n < TILE_MIN_K or g == 0 or pairs == 0:
            rest(w, x, xs, k, nh, out, os, r0, r1)
            return
        rb = w.shape[1]
        seg = n if n <= SEGMENT_MAX else SEGMENT
        nseg = -(-n // seg)
        groups = g // 8
        sc = empty_aligned(1, BLOCK_TILES * TILE)[0]   # whole-line loads and stores of the partial sums
        ahead = max(2, prefetch_bytes // (2 * k) + 1) // 2 * 2   # rows prefetched ahead (whole tiles)
        last = w.shape[0]
        for b0 in range(0, pairs, BLOCK_TILES):
            b1 = min(b0 + BLOCK_TILES, pairs)
            for u in range(groups):   # the block's rows come from L2 for the later groups
                xo = 8 * u * xs
                for s in range(nseg):
                    j0 = s * seg
                    j1 = min(j0 + seg, n)
                    for t in range(b0, b1):
                        i = r0 + 2 * t
                        o0 = i * rb
                        pf = (i + ahead) * rb if u == 0 and i + ahead + 1 < last else -1
                        base = (t - b0) * TILE
                        _pass(w, o0, o0 + rb, x, xo, xs, j0, j1, s > 0, sc, base, pf, pf + rb)
                        _pass(w, o0, o0 + rb, x, xo, xs, j0 + 16, j1, s > 0, sc, base + 256, -1, -1)
                        _pass(w, o0, o0 + rb, x, xo, xs, j0 + 32, j1, s > 0, sc, base + 512, -1, -1)
                        _pass(w, o0, o0 + rb, x, xo, xs, j0 + 48, j1, s > 0, sc, base + 768, -1, -1)
                for t in range(b0, b1):
                    i = r0 + 2 * t
                    base = (t - b0) * TILE
                    for h in range(8):
                        for r in range(2):
                            p = base + (2 * h + r) * 16
                            acc = f_add(f_add(load_f32x16(sc, p), load_f32x16(sc, p + 512)),
                                        f_add(load_f32x16(sc, p + 256), load_f32x16(sc, p + 768)))
                            out[(8 * u + h) * os + i + r] = tail16(w, (i + r) * rb, x, xo + h * xs, n, k,
                                                                   hsum16(acc))
        if r0 + 2 * pairs < r1:   # a row left over: the tiled inputs one row at a time
            rest(w, x, xs, k, g, out, os, r0 + 2 * pairs, r1)
        if g < nh:
            rest(w, x[g * xs:], xs, k, nh - g, out[g * os:], os, r0, r1)
    return heads

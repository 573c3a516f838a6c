"""F16 matrices against many inputs in register tiles: a decoded token's heads (2 rows x 8 inputs,
AVX-512) and a prompt's products (3 rows x 4 inputs, blocks of rows, segments of long rows).

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


# ---- the prompt's F16 products (`kernels.matmat` of F16 with k % lanes == 0): llamafile's
# tinyBLAS order, one accumulator of `lanes` lanes per output summed in order over the row, then the
# build's horizontal sum. A prompt's attention is this product twice a layer: key rows against a
# piece's query rows (scores), V^T rows against its probabilities (weighted values). The plain tiles
# (floats._tiled_matmat: 3 rows x 4 inputs, each group of 4 inputs over every row) read the whole
# key or V^T matrix again for every 4 inputs: at depth 16384 on V3's MLA widths (18.9 MB of keys,
# 16.8 MB of V^T a layer) that is 16 passes over memory a piece of 64 query rows; the scores ran
# 24-34 GFLOP/s a core (58-84 here), the values 51-58 (58-74), and a 512-token prompt at that depth
# 12-17 -> 19-23 t/s at 1 thread (Intel Xeon family 6 model 106, one process at a time, 19:45 UTC).
# Here a block of row triples is taken by every group of inputs while it is in L2, and rows longer than
# PROMPT_SEGMENT_MAX run in segments whose partial sums carry, in order, in a scratch buffer; each
# output's lanes, their order and its tree stay tinyBLAS's, so the tiling changes no bit.
PROMPT_SEGMENT = 512          # values a segment of a long row (4 inputs' segment: 8 KB, in L1)
PROMPT_SEGMENT_MAX = 1024     # rows up to this long run whole (MLA key rows: 576)
PROMPT_BLOCK_BYTES = 96 << 10   # a block's rows (whole rows): read from memory once for all inputs
PROMPT_STATE_BYTES = 256 << 10  # segmented rows: a block's carried partial sums (every input group)
PROMPT_MIN_BYTES = 1 << 20      # smaller matrices stay in L2 anyway: the plain tiles (R1's 192-wide
#                                 keys at depth 0 ran slower here: 2-thread pp512 118-133 vs 139-151 t/s)


def prompt_tiles(load, es: int, load_x, store_x, zero, hsum, lanes: int, rest):
    """`kernels.matmat` of F16 (k % lanes == 0, tinyBLAS<lanes>) in tiles of 3 rows x 4 inputs (12
    accumulators: the AVX2 build's 16 ymm registers hold them with the 3 rows' and an input's
    lanes; 2 x 8 tiles on zmm registers measured no faster on the MLA shape and slower on a GQA
    one) over blocks of rows and segments of long rows; `rest` (floats' plain tiled matmat, same
    signature and order) takes the left-over rows and inputs and the small products."""
    @numba.njit(inline="always")
    def tile34(w, o0, rb, x, xo, xs, j, end, carry, sc, so):
        """Rows at bytes o0, o0 + rb, o0 + 2 rb against the inputs x[xo + h xs], h < 4, over values
        [j, end): 12 accumulators that start from sc[so:] when `carry` (an earlier segment's partial
        sums), else from zero, and are stored back there (input major, then row)."""
        if carry:
            a0 = load_x(sc, so); b0 = load_x(sc, so + lanes); c0 = load_x(sc, so + 2 * lanes)
            a1 = load_x(sc, so + 3 * lanes); b1 = load_x(sc, so + 4 * lanes); c1 = load_x(sc, so + 5 * lanes)
            a2 = load_x(sc, so + 6 * lanes); b2 = load_x(sc, so + 7 * lanes); c2 = load_x(sc, so + 8 * lanes)
            a3 = load_x(sc, so + 9 * lanes); b3 = load_x(sc, so + 10 * lanes); c3 = load_x(sc, so + 11 * lanes)
        else:
            a0 = zero(); b0 = zero(); c0 = zero(); a1 = zero(); b1 = zero(); c1 = zero()
            a2 = zero(); b2 = zero(); c2 = zero(); a3 = zero(); b3 = zero(); c3 = zero()
        o1 = o0 + rb
        o2 = o1 + rb
        while j < end:
            wa = load(w, o0 + es * j)
            wb = load(w, o1 + es * j)
            wc = load(w, o2 + es * j)
            v = load_x(x, xo + j)
            a0 = fma_f(a0, wa, v); b0 = fma_f(b0, wb, v); c0 = fma_f(c0, wc, v)
            v = load_x(x, xo + xs + j)
            a1 = fma_f(a1, wa, v); b1 = fma_f(b1, wb, v); c1 = fma_f(c1, wc, v)
            v = load_x(x, xo + 2 * xs + j)
            a2 = fma_f(a2, wa, v); b2 = fma_f(b2, wb, v); c2 = fma_f(c2, wc, v)
            v = load_x(x, xo + 3 * xs + j)
            a3 = fma_f(a3, wa, v); b3 = fma_f(b3, wb, v); c3 = fma_f(c3, wc, v)
            j += lanes
        store_x(sc, so, a0); store_x(sc, so + lanes, b0); store_x(sc, so + 2 * lanes, c0)
        store_x(sc, so + 3 * lanes, a1); store_x(sc, so + 4 * lanes, b1); store_x(sc, so + 5 * lanes, c1)
        store_x(sc, so + 6 * lanes, a2); store_x(sc, so + 7 * lanes, b2); store_x(sc, so + 8 * lanes, c2)
        store_x(sc, so + 9 * lanes, a3); store_x(sc, so + 10 * lanes, b3); store_x(sc, so + 11 * lanes, c3)

    tr, tc = 3, 4
    tile_floats = tr * tc * lanes
    tile = tile34
    seg_len = PROMPT_SEGMENT // lanes * lanes

    @numba.njit(**_NB)
    def matmat(w, xp, out, r0, r1):
        x = xp[0]
        n, k = x.shape
        tiles = (r1 - r0) // tr
        groups = n // tc
        if k == 0 or k % lanes or groups == 0 or tiles < 2 or (r1 - r0) * k * es < PROMPT_MIN_BYTES:   # (k == 0: every output 0, from `rest`)
            rest(w, xp, out, r0, r1)
            return
        xf = x.reshape(-1)
        rb = w.shape[1]
        seg = k if k <= PROMPT_SEGMENT_MAX else seg_len
        nseg = -(-k // seg)
        if nseg == 1:   # whole rows: a block's rows stay in L2 while every input group takes them
            bp = max(1, PROMPT_BLOCK_BYTES // (tr * es * k))
        else:           # long rows: a block's partial sums for every input group stay in L2
            bp = max(1, PROMPT_STATE_BYTES // (4 * groups * tile_floats))
        bp = min(bp, tiles)
        sc = empty_aligned(1, bp * groups * tile_floats)[0]
        for p0 in range(0, tiles, bp):
            p1 = min(p0 + bp, tiles)
            for s in range(nseg):
                j0 = s * seg
                j1 = min(j0 + seg, k)
                for u in range(groups):   # the block's rows (segments) from L2 after the first group
                    xo = u * tc * k
                    for t in range(p0, p1):
                        o0 = (r0 + tr * t) * rb
                        tile(w, o0, rb, xf, xo, k, j0, j1, s > 0, sc,
                             ((t - p0) * groups + u) * tile_floats)
            for t in range(p0, p1):
                i = r0 + tr * t
                for u in range(groups):
                    so = ((t - p0) * groups + u) * tile_floats
                    for h in range(tc):
                        for r in range(tr):
                            out[u * tc + h, i + r] = hsum(load_x(sc, so + (tr * h + r) * lanes))
        if r0 + tr * tiles < r1:   # rows left over: every input
            rest(w, xp, out, r0 + tr * tiles, r1)
        if groups * tc < n:       # inputs left over: the tiled rows
            rest(w, (x[groups * tc:],), out[groups * tc:], r0, r0 + tr * tiles)

    return matmat

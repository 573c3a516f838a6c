"""Block-format helpers shared by the x86 kernel families (scale fields, packed 6-bit scales)."""
from __future__ import annotations

import numba
import numpy as np

from ..intrinsics import (f16_to_f32, ld_u32)

from ..jitcache import JIT as _NB
f32 = np.float32


@numba.njit(**_NB)
def _block_scales(w, r0, r1, nb, bsz):
    """float32 [(r1 - r0) * nb]: the f16 scale (first field) of every block of rows r0..r1-1."""
    out = np.empty((r1 - r0) * nb, np.float32)
    rb = w.shape[1]
    for i in range(r0, r1):
        for b in range(nb):
            out[(i - r0) * nb + b] = f16_to_f32(w, i * rb + b * bsz)
    return out


# ============================================================================= K quants
@numba.njit(inline="always")
def _k4_scales(wf, o):
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

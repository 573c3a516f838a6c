"""Explicit-SIMD kernels for the "avx2" (ymm registers) and "avx512-vnni" (ymm and zmm) paths, by
family as in ggml-cpu.

    legacy_quants  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0          (ggml-cpu arch/x86/quants.c)
    k_quants       Q2_K, Q3_K, Q4_K, Q5_K, Q6_K          (arch/x86/quants.c, repack.cpp orders)
    i_quants       IQ4_NL, IQ4_XS                        (arch/x86/quants.c, repack.cpp, llamafile sgemm)
    floats         F32, F16, BF16                        (vec.cpp, llamafile sgemm)
    rows_lowbit    one-token products of Q2_K, Q3_K, Q4_0, IQ4_NL, IQ4_XS with rows in groups
    repack         prompt kernels over regrouped weights or activations (repack.cpp, tinyBLAS)
    k4_rows        Q4_K one-token product over groups of 8 rows (gemv_q4_K_8x8 order, plain layout)
    k4_x8          Q4_K kept in llama.cpp's 8-row interleaved layout (internal type Q4_K_x8)
    q5_pairs       Q5_0 kept in a row-pair layout for the AVX-512 one-token product (Q5_0_x2)
    q8_pairs       Q8_0 kept in a row-pair layout for the AVX-512 one-token product (Q8_0_x2)
    q4_x8          Q4_0 / IQ4_NL kept in 8-row groups on AVX-512 (Q4_0_x8, IQ4_NL_x8)
    f16_tiles      an F16 matrix against 8 inputs in 2-row register tiles (attention's heads, AVX-512)
    blocks         block-format helpers they share

Every family exposes ``kernels(mode) -> {type name: (matvec, matmat[, mul_mat_id])}``: the factory closes over
``mode`` (llvm_ir.AVX2 or llvm_ir.VNNI); Numba treats the closure value as a compile-time
constant and the primitives emit only that instruction set, so one source gives two separately
compiled (and separately cached, see ``jitcache``) implementations.  Building the tables compiles
nothing: a kernel compiles (or loads from the disk cache) on its first call.
"""
from __future__ import annotations

from .. import jitcache  # noqa: F401  (before any kernel is defined)
from ..llvm_ir import AVX2, VNNI
from ..type_ids import TYPE_IDS
from . import floats, i_quants, k4_x8, k_quants, legacy_quants, q4_x8, q5_pairs, q8_pairs, rows_lowbit

MODES = {"avx2": AVX2, "avx512-vnni": VNNI}
#: family module of each type name (the order in which tables() builds them)
FAMILIES = (legacy_quants, k_quants, i_quants, floats, k4_x8, q5_pairs, q8_pairs, q4_x8)
_cache: dict[str, tuple[dict, dict]] = {}


def tables(path: str) -> tuple[dict, dict]:
    """(matvec, matmat) dicts keyed by ggml type id for a SIMD path (functions compile on first call)."""
    if path not in _cache:
        mode = MODES[path]
        fns: dict = {}
        for family in FAMILIES:
            fns.update(family.kernels(mode))
        fns.update(rows_lowbit.kernels(mode, fns))   # grouped-rows matvec of Q2_K, Q3_K, Q4_0, IQ4_NL, IQ4_XS
        mv = {TYPE_IDS[n]: f[0] for n, f in fns.items()}
        mm = {TYPE_IDS[n]: f[1] for n, f in fns.items()}
        ids = {TYPE_IDS[n]: f[2] for n, f in fns.items() if len(f) > 2}
        _cache[path] = (mv, mm, ids)
    return _cache[path][:2]


def id_tables(path: str) -> dict:
    """The types with a mul_mat_id kernel on a SIMD path: ggml type id -> fn(w, xp, out, r0, r1, rows)
    (families list it as an optional third element)."""
    tables(path)
    return _cache[path][2]

"""The type ids every kernel table is keyed by, defined once: ggml's ids for the file types the
engine reads, and the engine's own ids for the layouts it keeps some of them in (not ggml types).

`kernels` re-exports every name here; `x86.tables` keys its families' kernels, which each family
lists by type name, through `TYPE_IDS`. Plain Python (no Numba), so any module can read it.
"""
from __future__ import annotations

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30
Q2_K, Q3_K, IQ4_NL, IQ4_XS = 10, 11, 20, 23
#: not a ggml type: Q4_K bytes kept in llama.cpp's 8-row interleaved layout (`x86.k4_x8`; the same
#: size, rows % 8 == 0). The engine repacks Q4_K weight matrices into it at load (`..packing`).
Q4_K_X8 = 1012
#: not a ggml type: Q5_0 bytes kept in row pairs (`x86.q5_pairs`; the same size, the AVX-512 path)
Q5_0_X2 = 1006
#: not a ggml type: Q8_0 bytes kept in row pairs (`x86.q8_pairs`; the same size, the AVX-512 path)
Q8_0_X2 = 1008
#: not ggml types: Q4_0 / IQ4_NL bytes kept in 8-row groups (`x86.q4_x8`, block_q4_0x8's interleave;
#: the same size, the AVX-512 path)
Q4_0_X8 = 1002
IQ4_NL_X8 = 1020
#: a file's type -> the layout the engine may keep it in on a SIMD path
PACKED_LAYOUTS = {Q4_K: Q4_K_X8, Q5_0: Q5_0_X2, Q8_0: Q8_0_X2, Q4_0: Q4_0_X8, IQ4_NL: IQ4_NL_X8}
#: not ggml types: the file's bytes of a type llama.cpp repacks on x86 (Q4_0, IQ4_NL, Q4_K; Q2_K on
#: AVX-512) held by a 3-D mul_mat weight (MLA's per-head attn_k_b / attn_v_b). ggml's repack buffer
#: takes 2-D matrices and 3-D experts only (repack.cpp supports_op: MUL_MAT needs ggml_n_dims == 2), so
#: such a weight keeps the plain kernels whatever its row count: vec_dot for one token, tinyBLAS or
#: the tiled matmul for more. The SIMD kernels of the file types pick the repacked order by row count
#: alone, hence these ids (`kernels.plain_type`; the engine gives them to those weights, `..packing`)
Q4_0_PLAIN, Q2_K_PLAIN, Q4_K_PLAIN, IQ4_NL_PLAIN = 1102, 1110, 1112, 1120
PLAIN_TYPES = {Q4_0: Q4_0_PLAIN, Q2_K: Q2_K_PLAIN, Q4_K: Q4_K_PLAIN, IQ4_NL: IQ4_NL_PLAIN}

#: the file types the engine reads, by ggml's names
SUPPORTED_TYPES: dict[int, str] = {
    F32: "F32", F16: "F16", BF16: "BF16", Q8_0: "Q8_0", Q4_0: "Q4_0", Q4_1: "Q4_1",
    Q5_0: "Q5_0", Q5_1: "Q5_1", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS", Q3_K: "Q3_K", Q2_K: "Q2_K",
}

#: every type id a kernel takes: the file types and the engine's own layouts
TYPE_NAMES: dict[int, str] = {**SUPPORTED_TYPES, Q4_K_X8: "Q4_K_x8", Q5_0_X2: "Q5_0_x2", Q8_0_X2: "Q8_0_x2",
                              Q4_0_X8: "Q4_0_x8", IQ4_NL_X8: "IQ4_NL_x8",
                              **{p: f"{SUPPORTED_TYPES[t]}_plain" for t, p in PLAIN_TYPES.items()}}
#: a kernel family's type name -> its id
TYPE_IDS: dict[str, int] = {name: t for t, name in TYPE_NAMES.items()}

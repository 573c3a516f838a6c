"""MLA's 3-D attn_k_b / attn_v_b are multiplied the way llama.cpp multiplies them: never repacked.

ggml's repack buffer takes 2-D matrices and 3-D experts only (repack.cpp supports_op: a MUL_MAT's
weight must have two dimensions), so a per-head weight of a type that llama.cpp repacks as a matrix
on x86 (Q4_0, IQ4_NL, Q4_K; Q2_K on AVX-512) runs ggml_vec_dot for one token and tinyBLAS / the
tiled matmul for a prompt, whatever its row count. The SIMD kernels chose the repacked order from
the row count alone, so such a weight whose heads have a multiple of 8 rows took it: a DeepSeek
file quantized to Q2_K by llama-quantize (attn_k_b falls back to Q4_0, [64, 256, H]) differed from
llama.cpp in the last bit of the first head product, and a router later turned that into other
experts and other greedy tokens (issue 46). Checked here per head against emulations of
llama.cpp's plain kernels (`kernel_emulation`), on both SIMD paths, through the one-token call
(mul_mat's vec_dot) and prompts below and from 8 tokens (tinyBLAS, the tiled matmul).
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from kernel_emulation import emulate_k4_tiled, emulate_k4_vec, emulate_legacy
from workbench.engine import Engine, kernels
from workbench.engine.engine import Placement

#: per layer, attn_k_b's and attn_v_b's types: every type whose SIMD kernels have a repacked order
TYPES = ((T.Q4_0, T.Q4_K), (T.IQ4_NL, T.Q2_K))


def plain_spec() -> TinySpec:
    """kv_lora 256 (Q4_K / Q2_K rows of attn_v_b), nope 64 (two Q4_0 / IQ4_NL blocks of attn_k_b);
    every head 256 rows of attn_k_b and 32 of attn_v_b: whole 8-row groups."""
    types = tuple((f"blk.{il}.attn_{kv}_b.weight", t) for il, pair in enumerate(TYPES) for kv, t in zip("kv", pair))
    return TinySpec(arch="deepseek2", qtype=T.Q8_0, n_embd=256, n_head=4, head_dim=96, n_rot=32, head_dim_v_mla=32,
                    kv_lora_rank=256, n_ff=256, n_ff_exp=64, n_layer=2, n_layer_dense_lead=1, n_expert=8,
                    n_expert_used=2, seed=5, types=types)


@pytest.fixture(scope="module")
def plain_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mla_plain") / "ds-plain.gguf"
    write_tiny_model(path, plain_spec(), reference=False)
    return str(path)


def _heads(path: str, name: str) -> np.ndarray:
    """[H, rows, row bytes] of a 3-D tensor as the file holds it."""
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    h = int(t.shape[2])
    return np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8).reshape(h, -1, t.data.shape[-1]))


def _llama_plain(t: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[n, rows]: what llama.cpp computes for one head's un-repacked weight w and inputs x [n, k]."""
    xp = kernels.prepare(t, x)
    n = x.shape[0]
    if t == T.Q4_0:   # ggml_vec_dot_q4_0_q8_0 (tinyBLAS_Q0_AVX's per-column chain is the same)
        return emulate_legacy(T.Q4_0, w, xp[0], xp[1])
    if t == T.Q4_K:   # vec_dot below 8 columns, the tiled matmul from 8
        return emulate_k4_tiled(w, xp[0], xp[1]) if n >= 8 else emulate_k4_vec(w, xp[0], xp[1])
    # IQ4_NL / Q2_K: the file type's kernel on one row at a time (a matrix of one row is never
    # repacked; those orders are checked against llama.cpp's in test_kernels_lowbit)
    out = np.empty((n, w.shape[0]), np.float32)
    for i in range(w.shape[0]):
        kernels.matmat(t, w[i:i + 1], xp, out[:, i:i + 1], 0, 1)
    return out


@pytest.mark.skipif(kernels.kernel_path() == "portable", reason="the portable kernels follow no repacked order")
@pytest.mark.parametrize("threads", [1, 2])
def test_head_products_take_llama_cpps_unrepacked_kernels(plain_file, path, threads):
    """One token (decode) and prompts below and from 8 tokens: every head's product bit for bit."""
    eng = Engine.load(plain_file, placement=Placement(threads=threads))
    try:
        rng = np.random.default_rng(3)
        for il, pair in enumerate(TYPES):
            for kv, t in zip("kv", pair):
                name = f"blk.{il}.attn_{kv}_b.weight"
                assert eng.rt.weights[name].ggml_type == kernels.PLAIN_TYPES[t]
                heads = _heads(plain_file, name)
                for n in (1, 3, 9):
                    x = rng.standard_normal((heads.shape[0], n, eng.rt.weights[name].ne0)).astype(np.float32)
                    got = eng.rt.sub_products(name, x)
                    for h in range(heads.shape[0]):
                        np.testing.assert_array_equal(got[h], _llama_plain(t, heads[h], x[h]),
                                                      err_msg=f"{name} head {h}, {n} token(s), {kernels.kernel_path()}")
    finally:
        eng.close()


def test_matrices_and_experts_keep_the_repacked_orders(plain_file):
    """Only the per-head weights take the plain ids: 2-D matrices and experts stay llama.cpp's
    repacked ones (their file type or the engine's packed layout)."""
    eng = Engine.load(plain_file, placement=Placement(threads=1))
    try:
        plain = set(kernels.PLAIN_TYPES.values())
        for name, w in eng.rt.weights.items():
            per_head = name.endswith(("attn_k_b.weight", "attn_v_b.weight"))
            assert (w.ggml_type in plain) == (per_head and kernels.kernel_path() != "portable"), name
    finally:
        eng.close()

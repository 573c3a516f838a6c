"""GGUF headers without tensor data, for what-if questions about models one has not downloaded.

``gguf.GGUFWriter`` writes tensor infos from shapes alone (``add_tensor_info``); writing the
header, the metadata and the tensor infos and then stopping gives a file of a few hundred KiB that
describes a 700 GB model exactly as its real header would (the advisor never reads tensor data).
The recipes follow llama.cpp's converter: tensor names, shapes (GGUF order, row length first) and
metadata keys; the published hyper-parameters of each model are in its function.
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

Tensor = tuple[str, Sequence[int], Q]


def write_header(path: str | os.PathLike[str], arch: str, metadata: dict[str, object],
                 tensors: Iterable[Tensor]) -> int:
    """Write a header-only GGUF file; returns the size its tensor data would have (bytes)."""
    w = GGUFWriter(os.fspath(path), arch)
    for key, val in metadata.items():
        if isinstance(val, bool):
            w.add_bool(key, val)
        elif isinstance(val, int):
            w.add_uint32(key, val)
        elif isinstance(val, float):
            w.add_float32(key, val)
        elif isinstance(val, str):
            w.add_string(key, val)
        else:
            w.add_array(key, list(val))  # type: ignore[arg-type]
    total = 0
    for name, shape, qtype in tensors:
        block, size = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape))
        nbytes = n // block * size
        # add_tensor_info takes the numpy (row-major) shape: the GGUF order reversed
        dtype = {Q.F32: np.float32, Q.F16: np.float16}.get(qtype, np.uint8)
        w.add_tensor_info(name, list(reversed(shape)) if qtype in (Q.F32, Q.F16) else
                          _byte_shape(shape, qtype), np.dtype(dtype), nbytes,
                          raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return total


def _byte_shape(shape: Sequence[int], qtype: Q) -> list[int]:
    """numpy shape of a quantized tensor's bytes (what GGUFWriter converts back to elements)."""
    block, size = GGML_QUANT_SIZES[qtype]
    return list(reversed(shape[1:])) + [shape[0] // block * size]


def _more_bits(il: int, n: int) -> bool:
    """llama.cpp's Q4_K_M rule for which layers' ffn_down / attn_v get Q6_K."""
    return il < n // 8 or il >= 7 * n // 8 or (il - n // 8) % 3 == 2


def qwq_32b(path: str | os.PathLike[str], qtype: Q = Q.F16) -> int:
    """QwQ-32B (qwen2): 64 layers, 5120 wide, 40 heads (8 KV) of 128, FFN 27648, vocabulary 152064."""
    n, d, nh, nkv, hd, ff, vocab = 64, 5120, 40, 8, 128, 27648, 152064
    md = {"general.name": f"QwQ-32B {qtype.name} (synthetic header)", "qwen2.block_count": n,
          "qwen2.context_length": 131072, "qwen2.embedding_length": d, "qwen2.feed_forward_length": ff,
          "qwen2.attention.head_count": nh, "qwen2.attention.head_count_kv": nkv,
          "qwen2.rope.freq_base": 1000000.0, "qwen2.attention.layer_norm_rms_epsilon": 1e-5}
    ts: list[Tensor] = [("token_embd.weight", (d, vocab), qtype), ("output_norm.weight", (d,), Q.F32),
                        ("output.weight", (d, vocab), qtype)]
    for il in range(n):
        p = f"blk.{il}."
        ts += [(p + "attn_norm.weight", (d,), Q.F32), (p + "attn_q.weight", (d, nh * hd), qtype),
               (p + "attn_q.bias", (nh * hd,), Q.F32), (p + "attn_k.weight", (d, nkv * hd), qtype),
               (p + "attn_k.bias", (nkv * hd,), Q.F32), (p + "attn_v.weight", (d, nkv * hd), qtype),
               (p + "attn_v.bias", (nkv * hd,), Q.F32), (p + "attn_output.weight", (nh * hd, d), qtype),
               (p + "ffn_norm.weight", (d,), Q.F32), (p + "ffn_gate.weight", (d, ff), qtype),
               (p + "ffn_up.weight", (d, ff), qtype), (p + "ffn_down.weight", (ff, d), qtype)]
    return write_header(path, "qwen2", md, ts)


def deepseek_r1(path: str | os.PathLike[str], quant: str = "Q8_0", mla: bool = False) -> int:
    """DeepSeek-R1 671B (deepseek2): 61 layers (3 dense, 58 MoE with 256 routed experts, 8 used,
    1 shared), 7168 wide, 128 heads, q-LoRA 1536, kv-LoRA 512, rope 64, vocabulary 129280.

    ``quant``: ``Q8_0`` (every matrix Q8_0) or ``Q4_K_M`` (llama.cpp's rule: Q6_K for the output
    and for ffn_down / the KV projection of the "more bits" layers, Q4_K elsewhere, Q8_0 where a
    row is not a multiple of 256). ``mla``: the layout since llama.cpp PR #12801 (attn_k_b /
    attn_v_b, one KV head over the 576-wide latent: the small MLA cache); else the older layout
    (attn_kv_b, 128 KV heads of 192 + 128: the full cache those early runs used).
    """
    n, d, nh, vocab = 61, 7168, 128, 129280
    n_dense, ff, n_exp, n_used, ff_exp = 3, 18432, 256, 8, 2048
    q_lora, kv_lora, rope, nope, vdim = 1536, 512, 64, 128, 128
    q4 = quant == "Q4_K_M"
    if quant not in ("Q8_0", "Q4_K_M"):
        raise ValueError(f"quant {quant!r}: Q8_0 or Q4_K_M")

    def qt(il: int, kind: str, ne0: int) -> Q:
        if not q4:
            return Q.Q8_0
        if ne0 % 256:
            return Q.Q8_0
        if kind in ("ffn_down", "attn_kv_b", "attn_v_b") and _more_bits(il, n):
            return Q.Q6_K
        return Q.Q4_K

    md: dict[str, object] = {
        "general.name": f"DeepSeek-R1 {quant} (synthetic header{', MLA' if mla else ''})",
        "deepseek2.block_count": n, "deepseek2.context_length": 163840, "deepseek2.embedding_length": d,
        "deepseek2.feed_forward_length": ff, "deepseek2.attention.head_count": nh,
        "deepseek2.attention.head_count_kv": 1 if mla else nh,
        "deepseek2.attention.key_length": kv_lora + rope if mla else nope + rope,
        "deepseek2.attention.value_length": kv_lora if mla else vdim,
        "deepseek2.rope.dimension_count": rope, "deepseek2.attention.q_lora_rank": q_lora,
        "deepseek2.attention.kv_lora_rank": kv_lora, "deepseek2.leading_dense_block_count": n_dense,
        "deepseek2.expert_count": n_exp, "deepseek2.expert_used_count": n_used,
        "deepseek2.expert_shared_count": 1, "deepseek2.expert_feed_forward_length": ff_exp,
        "deepseek2.rope.freq_base": 10000.0, "deepseek2.attention.layer_norm_rms_epsilon": 1e-6}
    if mla:
        md["deepseek2.attention.key_length_mla"] = nope + rope
        md["deepseek2.attention.value_length_mla"] = vdim
    ts: list[Tensor] = [("token_embd.weight", (d, vocab), Q.Q4_K if q4 else Q.Q8_0),
                        ("output_norm.weight", (d,), Q.F32),
                        ("output.weight", (d, vocab), Q.Q6_K if q4 else Q.Q8_0)]
    for il in range(n):
        p = f"blk.{il}."
        ts += [(p + "attn_norm.weight", (d,), Q.F32),
               (p + "attn_q_a.weight", (d, q_lora), qt(il, "attn_q_a", d)),
               (p + "attn_q_a_norm.weight", (q_lora,), Q.F32),
               (p + "attn_q_b.weight", (q_lora, nh * (nope + rope)), qt(il, "attn_q_b", q_lora)),
               (p + "attn_kv_a_mqa.weight", (d, kv_lora + rope), qt(il, "attn_kv_a_mqa", d)),
               (p + "attn_kv_a_norm.weight", (kv_lora,), Q.F32),
               (p + "attn_output.weight", (nh * vdim, d), qt(il, "attn_output", nh * vdim)),
               (p + "ffn_norm.weight", (d,), Q.F32)]
        if mla:
            ts += [(p + "attn_k_b.weight", (nope, kv_lora, nh), qt(il, "attn_k_b", nope)),
                   (p + "attn_v_b.weight", (kv_lora, vdim, nh), qt(il, "attn_v_b", kv_lora))]
        else:
            ts += [(p + "attn_kv_b.weight", (kv_lora, nh * (nope + vdim)), qt(il, "attn_kv_b", kv_lora))]
        if il < n_dense:
            ts += [(p + "ffn_gate.weight", (d, ff), qt(il, "ffn_gate", d)),
                   (p + "ffn_up.weight", (d, ff), qt(il, "ffn_up", d)),
                   (p + "ffn_down.weight", (ff, d), qt(il, "ffn_down", ff))]
        else:
            ts += [(p + "ffn_gate_inp.weight", (d, n_exp), Q.F32),
                   (p + "exp_probs_b.bias", (n_exp,), Q.F32),
                   (p + "ffn_gate_exps.weight", (d, ff_exp, n_exp), qt(il, "ffn_gate", d)),
                   (p + "ffn_up_exps.weight", (d, ff_exp, n_exp), qt(il, "ffn_up", d)),
                   (p + "ffn_down_exps.weight", (ff_exp, d, n_exp), qt(il, "ffn_down", ff_exp)),
                   (p + "ffn_gate_shexp.weight", (d, ff_exp), qt(il, "ffn_gate", d)),
                   (p + "ffn_up_shexp.weight", (d, ff_exp), qt(il, "ffn_up", d)),
                   (p + "ffn_down_shexp.weight", (ff_exp, d), qt(il, "ffn_down", ff_exp))]
    return write_header(path, "deepseek2", md, ts)

"""Build tiny GGUF models with random weights for tests (gguf.GGUFWriter)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

QUANTIZABLE = {T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1}
# byte offsets of the f16 scale fields inside one block, for types built from random bytes
_F16_FIELDS = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.Q3_K: (108,), T.Q2_K: (80, 82)}


def random_tensor(qtype: T, rows: int, ne0: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    """Valid random data for a [rows, ne0] weight in `qtype` (uint8 blocks or float array)."""
    if qtype in QUANTIZABLE:
        x = (rng.standard_normal((rows, ne0)) * scale).astype(np.float32)
        return gguf.quants.quantize(x, qtype) if qtype != T.F32 else x
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, ne0 // block, size), dtype=np.uint8)
    if qtype == T.Q6_K:  # int8 sub-block scales: keep them small so weights stay ~scale
        raw[:, :, 192:208] = rng.integers(-16, 17, size=(rows, ne0 // block, 16)).astype(np.int8).view(np.uint8)
    if qtype == T.IQ4_XS:  # every sub-block scale ls - 32 = 8 (random ones: test_kernels*), weights stay ~scale
        raw[:, :, 2:4] = 0xAA
        raw[:, :, 4:8] = 0x88
    for off in _F16_FIELDS[qtype]:
        d = (rng.random((rows, ne0 // block)) + 0.5) * scale / 200
        raw[:, :, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(rows, ne0 // block, 2)
    return raw.reshape(rows, -1)


def dequant(data: np.ndarray, qtype: T) -> np.ndarray:
    if qtype == T.F32:
        return data.astype(np.float64)
    return gguf.quants.dequantize(data, qtype).astype(np.float64)


@dataclass
class TinySpec:
    arch: str = "llama"
    qtype: T = T.Q8_0
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 512
    n_layer: int = 2
    n_ctx: int = 256
    sliding_window: int = 8  # gemma3 only; small so that tests cross it
    tied: bool = True
    seed: int = 0


WORDS = ["▁the", "▁a", "▁cat", "▁dog", "▁sat", "▁on", "▁mat", "▁hello", "▁world", "ing", "ed", "er",
         "▁is", "▁was", "s", "t", "e", "a", "o", "▁", "th", "he", "in", "an", "▁to", "▁of", ".", ","]


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"]
    types = [3, 3, 3, 2]
    tokens += [f"<0x{i:02X}>" for i in range(256)]
    types += [6] * 256
    tokens += WORDS + ["<start_of_turn>", "<end_of_turn>"]
    types += [1] * len(WORDS) + [3, 3]
    scores = [0.0] * 260 + [-float(i) for i in range(len(WORDS))] + [0.0, 0.0]
    return tokens, scores, types


def write_tiny_model(path: str | os.PathLike, spec: TinySpec) -> dict[str, np.ndarray]:
    """Write the model; returns the float64 weights (dequantized) for a reference forward pass."""
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = spm_vocab()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(os.fspath(path), spec.arch)
    a = spec.arch
    w.add_name(f"tiny-{a}")
    w.add_uint32(f"{a}.context_length", spec.n_ctx)
    w.add_uint32(f"{a}.embedding_length", spec.n_embd)
    w.add_uint32(f"{a}.block_count", spec.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    w.add_uint32(f"{a}.attention.head_count", spec.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    w.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    if a == "gemma3":
        w.add_uint32(f"{a}.attention.sliding_window", spec.sliding_window)
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", scores)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_uint32("tokenizer.ggml.bos_token_id", 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 3)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_space_prefix", a != "gemma3")

    ref: dict[str, np.ndarray] = {}

    def mat(name: str, rows: int, ne0: int, qtype: T = spec.qtype, scale: float = 0.05) -> None:
        data = random_tensor(qtype, rows, ne0, rng, scale)
        w.add_tensor(name, data, raw_dtype=qtype if qtype not in (T.F32, T.F16) else None)
        ref[name] = dequant(data, qtype).reshape(rows, ne0)

    def vec(name: str, n: int, base: float = 1.0) -> None:
        data = (base + rng.standard_normal(n) * 0.1).astype(np.float32)
        w.add_tensor(name, data)
        ref[name] = data.astype(np.float64)

    d, hd = spec.n_embd, spec.head_dim
    mat("token_embd.weight", n_vocab, d, scale=0.5)
    if not spec.tied:
        mat("output.weight", n_vocab, d)
    vec("output_norm.weight", d)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", spec.n_head * hd, d)
        mat(p + "attn_k.weight", spec.n_head_kv * hd, d)
        mat(p + "attn_v.weight", spec.n_head_kv * hd, d)
        mat(p + "attn_output.weight", d, spec.n_head * hd)
        vec(p + "ffn_norm.weight", d)
        mat(p + "ffn_gate.weight", spec.n_ff, d)
        mat(p + "ffn_up.weight", spec.n_ff, d)
        mat(p + "ffn_down.weight", d, spec.n_ff)
        if a == "qwen2":
            for t, n in (("q", spec.n_head * hd), ("k", spec.n_head_kv * hd), ("v", spec.n_head_kv * hd)):
                vec(p + f"attn_{t}.bias", n, base=0.0)
        if a in ("gemma3", "qwen3"):
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if a == "gemma3":
            vec(p + "post_attention_norm.weight", d)
            vec(p + "post_ffw_norm.weight", d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref

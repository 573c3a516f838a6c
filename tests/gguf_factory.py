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
    rope_base: float = 10000.0  # gemma3: its global layers' (the sliding-window ones keep 10000)
    tied: bool = True
    seed: int = 0
    # mixture of experts (qwen3moe; llama with experts = Mixtral style)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    router_scale: float = 0.25
    fuse_gate_up: bool = False    # one ffn_gate_up_exps (same weights as the separate pair)
    # deepseek2 (multi-head latent attention)
    q_lora_rank: int = 0          # 0: a plain attn_q
    kv_lora_rank: int = 64
    n_rot: int = 32
    head_dim_v_mla: int = 32      # head_dim is the query/key size (nope + n_rot)
    n_layer_dense_lead: int = 1
    n_expert_shared: int = 1
    gating: int = 1               # 1 softmax, 2 sigmoid
    probs_bias: bool = False      # exp_probs_b selection bias
    n_groups: int = 0
    n_group_used: int = 0
    weights_norm: bool = False
    weights_scale: float = 0.0
    yarn: tuple[float, int, float] | None = None  # (factor, original context, mscale_all_dim)
    old_mla: bool = False         # the legacy attn_kv_b layout (refused)
    eos_id: int = 1               # tokenizer.ggml.eos_token_id
    unused_tokens: int = 0        # unused tokens after the vocabulary (296 rows: whole 8-row groups)
    types: tuple = ()             # (tensor name, type) pairs: those tensors in another type (a mixed file)
    chat_template: str | None = None  # tokenizer.chat_template (None: a base model's file, none)


def _deepseek2_layers(spec: TinySpec, mat, vec, experts) -> None:
    """MLA attention in llama.cpp's current layout, leading dense layers, routed + shared experts."""
    d, H, lora, rot = spec.n_embd, spec.n_head, spec.kv_lora_rank, spec.n_rot
    nope, dv = spec.head_dim - rot, spec.head_dim_v_mla
    f16 = T.F16 if spec.qtype in (T.F32, T.F16) else T.Q8_0
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", d)
        if spec.q_lora_rank:
            mat(p + "attn_q_a.weight", spec.q_lora_rank, d)
            vec(p + "attn_q_a_norm.weight", spec.q_lora_rank)
            mat(p + "attn_q_b.weight", H * spec.head_dim, spec.q_lora_rank, scale=0.1)
        else:
            mat(p + "attn_q.weight", H * spec.head_dim, d)
        mat(p + "attn_kv_a_mqa.weight", lora + rot, d)
        vec(p + "attn_kv_a_norm.weight", lora)
        if spec.old_mla:
            mat(p + "attn_kv_b.weight", H * (nope + dv), lora)
        else:
            # per head: k_b [lora, nope] (GGUF [nope, lora, H]), v_b [dv, lora] (GGUF [lora, dv, H])
            experts(p + "attn_k_b.weight", H, lora, nope, f16, scale=0.1)
            experts(p + "attn_v_b.weight", H, dv, lora, f16, scale=0.1)
        mat(p + "attn_output.weight", d, H * dv)
        vec(p + "ffn_norm.weight", d)
        if il < spec.n_layer_dense_lead:
            mat(p + "ffn_gate.weight", spec.n_ff, d)
            mat(p + "ffn_up.weight", spec.n_ff, d)
            mat(p + "ffn_down.weight", d, spec.n_ff)
            continue
        mat(p + "ffn_gate_inp.weight", spec.n_expert, d, T.F32, scale=spec.router_scale)
        if spec.probs_bias:
            vec(p + "exp_probs_b.bias", spec.n_expert, base=0.0)
        experts(p + "ffn_gate_exps.weight", spec.n_expert, spec.n_ff_exp, d)
        experts(p + "ffn_up_exps.weight", spec.n_expert, spec.n_ff_exp, d)
        experts(p + "ffn_down_exps.weight", spec.n_expert, d, spec.n_ff_exp)
        if spec.n_expert_shared:
            n_sh = spec.n_ff_exp * spec.n_expert_shared
            mat(p + "ffn_gate_shexp.weight", n_sh, d)
            mat(p + "ffn_up_shexp.weight", n_sh, d)
            mat(p + "ffn_down_shexp.weight", d, n_sh)


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


def write_tiny_model(path: str | os.PathLike, spec: TinySpec, split_max_tensors: int = 0,
                     reference: bool = True) -> dict[str, np.ndarray]:
    """Write the model; returns the float64 weights (dequantized) for a reference forward pass.

    split_max_tensors > 0: a split model as llama.cpp's gguf-split writes it (gguf-py's shard
    writer), `<stem>-00001-of-0000N.gguf` ... next to `path`, metadata in the first part."""
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = spm_vocab()
    tokens += [f"<unused{i}>" for i in range(spec.unused_tokens)]
    scores += [0.0] * spec.unused_tokens
    types += [5] * spec.unused_tokens
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(os.fspath(path), spec.arch, split_max_tensors=split_max_tensors)
    a = spec.arch
    w.add_name(f"tiny-{a}")
    w.add_uint32(f"{a}.context_length", spec.n_ctx)
    w.add_uint32(f"{a}.embedding_length", spec.n_embd)
    w.add_uint32(f"{a}.block_count", spec.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    w.add_uint32(f"{a}.attention.head_count", spec.n_head)
    if a == "deepseek2":
        # llama.cpp's MLA layout: one KV "head" of latent + rotary key, latent values
        w.add_uint32(f"{a}.attention.head_count_kv", 1)
        w.add_uint32(f"{a}.attention.key_length", spec.kv_lora_rank + spec.n_rot)
        w.add_uint32(f"{a}.attention.value_length", spec.kv_lora_rank)
        if not spec.old_mla:
            w.add_uint32(f"{a}.attention.key_length_mla", spec.head_dim)
            w.add_uint32(f"{a}.attention.value_length_mla", spec.head_dim_v_mla)
        w.add_uint32(f"{a}.attention.kv_lora_rank", spec.kv_lora_rank)
        # 0 = a plain attn_q (llama.cpp reads the key for every non-"lite" layer count)
        w.add_uint32(f"{a}.attention.q_lora_rank", spec.q_lora_rank)
        w.add_uint32(f"{a}.rope.dimension_count", spec.n_rot)
        w.add_uint32(f"{a}.leading_dense_block_count", spec.n_layer_dense_lead)
        w.add_uint32(f"{a}.expert_feed_forward_length", spec.n_ff_exp)
        w.add_uint32(f"{a}.expert_shared_count", spec.n_expert_shared)
        w.add_uint32(f"{a}.expert_gating_func", spec.gating)
        if spec.weights_norm:
            w.add_bool(f"{a}.expert_weights_norm", True)
        if spec.weights_scale:
            w.add_float32(f"{a}.expert_weights_scale", spec.weights_scale)
        if spec.n_groups:
            w.add_uint32(f"{a}.expert_group_count", spec.n_groups)
            w.add_uint32(f"{a}.expert_group_used_count", spec.n_group_used)
        if spec.yarn:
            factor, n_orig, mscale_all = spec.yarn
            w.add_string(f"{a}.rope.scaling.type", "yarn")
            w.add_float32(f"{a}.rope.scaling.factor", factor)
            w.add_uint32(f"{a}.rope.scaling.original_context_length", n_orig)
            w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * mscale_all)
    else:
        w.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
        w.add_uint32(f"{a}.attention.key_length", spec.head_dim)
        w.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", spec.rope_base)
    if a == "gemma3":
        w.add_uint32(f"{a}.attention.sliding_window", spec.sliding_window)
    if spec.n_expert:
        w.add_uint32(f"{a}.expert_count", spec.n_expert)
        w.add_uint32(f"{a}.expert_used_count", spec.n_expert_used)
        if a == "qwen3moe":
            w.add_uint32(f"{a}.expert_feed_forward_length", spec.n_ff_exp)
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", scores)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_uint32("tokenizer.ggml.bos_token_id", 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", spec.eos_id)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 3)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_space_prefix", a != "gemma3")
    if spec.chat_template is not None:
        w.add_string("tokenizer.chat_template", spec.chat_template)

    ref: dict[str, np.ndarray] = {}

    overrides = dict(spec.types)

    def mat(name: str, rows: int, ne0: int, qtype: T = spec.qtype, scale: float = 0.05) -> None:
        qtype = overrides.get(name, qtype)
        data = random_tensor(qtype, rows, ne0, rng, scale)
        w.add_tensor(name, data, raw_dtype=qtype if qtype not in (T.F32, T.F16) else None)
        if reference:
            ref[name] = dequant(data, qtype).reshape(rows, ne0)

    held: dict[str, np.ndarray] = {}

    def experts(name: str, n_exp: int, rows: int, ne0: int, qtype: T = spec.qtype, scale: float = 0.05) -> None:
        """A 3-D expert tensor: GGUF shape [ne0, rows, n_exp] (numpy [n_exp, rows, ne0]). With
        spec.fuse_gate_up, gate is held back and written with up as ffn_gate_up_exps (each
        expert's gate rows, then its up rows), the reference keeping the two apart."""
        qtype = overrides.get(name, qtype)
        data = random_tensor(qtype, n_exp * rows, ne0, rng, scale).reshape(n_exp, rows, -1)
        if reference:  # (benchmark-sized files skip the float64 copy)
            ref[name] = dequant(data.reshape(n_exp * rows, -1), qtype).reshape(n_exp, rows, ne0)
        raw = qtype if qtype not in (T.F32, T.F16) else None
        if spec.fuse_gate_up and name.endswith("ffn_gate_exps.weight"):
            held[name] = data
            return
        if spec.fuse_gate_up and name.endswith("ffn_up_exps.weight"):
            gate = held.pop(name.replace("ffn_up_exps", "ffn_gate_exps"))
            w.add_tensor(name.replace("ffn_up_exps", "ffn_gate_up_exps"), np.concatenate([gate, data], axis=1),
                         raw_dtype=raw)
            return
        w.add_tensor(name, data, raw_dtype=raw)

    def vec(name: str, n: int, base: float = 1.0) -> None:
        data = (base + rng.standard_normal(n) * 0.1).astype(np.float32)
        w.add_tensor(name, data)
        ref[name] = data.astype(np.float64)

    d, hd = spec.n_embd, spec.head_dim
    mat("token_embd.weight", n_vocab, d, scale=0.5)
    if not spec.tied:
        mat("output.weight", n_vocab, d)
    vec("output_norm.weight", d)
    if a == "deepseek2":
        _deepseek2_layers(spec, mat, vec, experts)
    for il in range(spec.n_layer if a != "deepseek2" else 0):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", spec.n_head * hd, d)
        mat(p + "attn_k.weight", spec.n_head_kv * hd, d)
        mat(p + "attn_v.weight", spec.n_head_kv * hd, d)
        mat(p + "attn_output.weight", d, spec.n_head * hd)
        vec(p + "ffn_norm.weight", d)
        if spec.n_expert:
            n_ff = spec.n_ff_exp if a == "qwen3moe" else spec.n_ff
            mat(p + "ffn_gate_inp.weight", spec.n_expert, d, T.F32, scale=spec.router_scale)
            experts(p + "ffn_gate_exps.weight", spec.n_expert, n_ff, d)
            experts(p + "ffn_up_exps.weight", spec.n_expert, n_ff, d)
            experts(p + "ffn_down_exps.weight", spec.n_expert, d, n_ff)
        else:
            mat(p + "ffn_gate.weight", spec.n_ff, d)
            mat(p + "ffn_up.weight", spec.n_ff, d)
            mat(p + "ffn_down.weight", d, spec.n_ff)
        if a == "qwen2":
            for t, n in (("q", spec.n_head * hd), ("k", spec.n_head_kv * hd), ("v", spec.n_head_kv * hd)):
                vec(p + f"attn_{t}.bias", n, base=0.0)
        if a in ("gemma3", "qwen3", "qwen3moe"):
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

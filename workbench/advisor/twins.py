"""Twins: small random models with a target's structure, for measuring what the engine does per block,
per routed expert and per cached position on this machine (``engine_cal.measure_structure``).

A twin keeps what makes the engine's work per token that is *not* proportional to the weight bytes:
the architecture, the attention heads (query and KV heads, or MLA's single latent head), the routing
(expert count, experts used, expert groups, shared experts, the selection bias) and whether blocks
are dense or MoE. Its widths are tiny (64-256 wide, FFN 64, experts of 32: KiBs of weights a block),
so a decoded token's time is the engine's fixed cost: serial steps, crew hand-offs, routing, norms
(the width is the target's up to 256, so what scales with it, norms and activations, is in).
The *attention twin* keeps the target's attention widths as well (latent rank, rotary and head
sizes) over two dense blocks, so its time at two depths gives the cost of one cached position.

Matrices are Q8_0 (rows of 32) with random blocks and small scales, the router and norms F32; the
vocabulary is 300 tokens. Only the header's metadata is read from the target (``cost.Header``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .cost import Header

WIDTH = 64          # the narrowest twin's n_embd
MAX_WIDTH = 256     # the widest
FFN = 64            # a dense block's FFN
EXPERT_FFN = 32     # a routed (and shared) expert's FFN
SMALL_HEAD = 32     # head size of the fixed-cost twins (Q8_0 rows; the attention twin keeps the target's)
TWIN_ARCHS = ("llama", "gemma3", "qwen2", "qwen3", "qwen3moe", "deepseek2")


@dataclass(frozen=True)
class TwinShape:
    """What a twin copies from its target (see the module doc)."""

    arch: str
    n_head: int
    n_head_kv: int
    head_dim: int                 # GQA key/value head size (MLA: nope + rope of the query heads)
    n_expert: int = 0
    n_expert_used: int = 0
    n_expert_shared: int = 0
    n_groups: int = 0
    n_group_used: int = 0
    gating: int = 0
    probs_bias: bool = False
    weights_norm: bool = False
    weights_scale: float = 0.0
    mla: bool = False
    kv_lora: int = 0
    n_rot: int = 0
    head_dim_v: int = 0           # MLA: value head size after attn_v_b
    q_lora: bool = False
    sliding_window: int = 0
    width: int = WIDTH            # the twin's n_embd: the target's, 64 to 256 (per-token work that
                                  # scales with the width, norms and activations, is not in the bytes)

    @property
    def key(self) -> str:
        """A short name of the structure (the calibration cache's key; ``t2``: the twins' version)."""
        parts = ["t2", self.arch, f"w{self.width}", f"h{self.n_head}/{self.n_head_kv}x{self.head_dim}"]
        if self.mla:
            parts.append(f"mla{self.kv_lora}+{self.n_rot}v{self.head_dim_v}{'q' if self.q_lora else ''}")
        if self.n_expert:
            parts.append(f"e{self.n_expert}u{self.n_expert_used}s{self.n_expert_shared}"
                         f"g{self.n_groups}/{self.n_group_used}{'b' if self.probs_bias else ''}")
        return ":".join(parts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_header(cls, h: Header) -> "TwinShape":
        """The target's structure; ValueError (one line) for an architecture twins cannot mimic."""
        arch = h.arch if h.arch in TWIN_ARCHS else "llama"

        def k(name: str, default: int = 0) -> int:
            v = h.key(name, default)
            if isinstance(v, list):
                v = max(v) if v else default
            return int(v or default)
        n_head = k("attention.head_count", 1)
        n_embd = k("embedding_length", 0)
        mla = h.arch == "deepseek2" and any(n.endswith("attn_k_b.weight") for n in h.tensors)
        if h.arch == "deepseek2" and not mla:
            raise ValueError(f"{h.path}: deepseek2 in the old attn_kv_b layout: the engine cannot run it")
        n_exp = k("expert_count")
        used = k("expert_used_count") if n_exp else 0
        width = max(WIDTH, min(MAX_WIDTH, n_embd // 64 * 64 or WIDTH))
        if mla:
            return cls(arch=arch, width=width, n_head=n_head, n_head_kv=1, head_dim=k("attention.key_length_mla", 192),
                       n_expert=n_exp, n_expert_used=used, n_expert_shared=k("expert_shared_count"),
                       n_groups=k("expert_group_count"), n_group_used=k("expert_group_used_count"),
                       gating=k("expert_gating_func"), probs_bias=any("exp_probs_b" in n for n in h.tensors),
                       weights_norm=bool(h.key("expert_weights_norm", False)),
                       weights_scale=float(h.key("expert_weights_scale", 0.0) or 0.0), mla=True,
                       kv_lora=k("attention.kv_lora_rank"), n_rot=k("rope.dimension_count", 64),
                       head_dim_v=k("attention.value_length_mla", 128), q_lora=k("attention.q_lora_rank") > 0)
        return cls(arch=arch, width=width, n_head=n_head, n_head_kv=k("attention.head_count_kv", n_head) or n_head,
                   head_dim=k("attention.key_length", n_embd // max(n_head, 1)), n_expert=n_exp,
                   n_expert_used=used, sliding_window=k("attention.sliding_window"))

    @property
    def moe_arch(self) -> bool:
        return self.n_expert > 0


N_VOCAB = 300


def add_vocab(w: Any) -> list[str]:
    """A 300-token SentencePiece-style vocabulary (control tokens, bytes, 40 words) into GGUF writer
    ``w``; returns the tokens."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)] + \
             [f"\u2581w{i}" for i in range(40)]
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", [0.0] * 260 + [-float(i) for i in range(40)])
    w.add_array("tokenizer.ggml.token_type", [3, 3, 3, 2] + [6] * 256 + [1] * 40)
    w.add_uint32("tokenizer.ggml.bos_token_id", 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 3)
    return tokens


def write_twin(path: str, shape: TwinShape, n_dense: int, n_moe: int, *, used: int | None = None,
               full_attention: bool = False, n_ctx: int = 32768, seed: int = 1, ffn: int = FFN) -> None:
    """Write a twin of ``shape`` with ``n_dense`` leading dense blocks and ``n_moe`` MoE blocks
    (``used`` experts a token instead of the target's); ``full_attention``: the target's attention
    widths (the attention twin), else heads of ``SMALL_HEAD``; ``ffn``: the dense blocks' FFN (the
    attention twin's streams the target's weight bytes a block, so its cache is evicted as the
    target's is between two tokens)."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    rng = np.random.default_rng(seed)
    a, d = shape.arch, shape.width
    if a == "qwen3moe" and not n_moe:
        a = "qwen3"  # the same attention (q/k norms) over dense blocks
    n_layer = n_dense + n_moe
    if n_moe and not shape.moe_arch:
        raise ValueError("MoE blocks asked of a dense structure")
    mla = shape.mla
    if full_attention:
        hd, kv_lora, rot, hdv = shape.head_dim, shape.kv_lora, shape.n_rot, shape.head_dim_v
    else:
        hd, kv_lora, rot, hdv = SMALL_HEAD, 32, 16, SMALL_HEAD
        if mla:
            hd = rot + SMALL_HEAD  # nope 32 (a Q8_0 row of attn_k_b) + rope 16
    w = gguf.GGUFWriter(path, a)
    w.add_string("general.name", f"twin-{a}-{n_dense}d{n_moe}m")
    u32 = lambda key, v: w.add_uint32(f"{a}.{key}", int(v))  # noqa: E731
    u32("context_length", n_ctx)
    u32("embedding_length", d)
    u32("block_count", n_layer)
    u32("feed_forward_length", ffn)
    u32("attention.head_count", shape.n_head)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    if mla:
        u32("attention.head_count_kv", 1)
        u32("attention.key_length", kv_lora + rot)
        u32("attention.value_length", kv_lora)
        u32("attention.key_length_mla", hd)
        u32("attention.value_length_mla", hdv)
        u32("attention.kv_lora_rank", kv_lora)
        u32("attention.q_lora_rank", 32 if shape.q_lora else 0)
        u32("rope.dimension_count", rot)
        u32("leading_dense_block_count", n_dense)
        u32("expert_feed_forward_length", EXPERT_FFN)
        u32("expert_shared_count", shape.n_expert_shared)
        u32("expert_gating_func", shape.gating or 1)
        if shape.weights_norm:
            w.add_bool(f"{a}.expert_weights_norm", True)
        if shape.weights_scale:
            w.add_float32(f"{a}.expert_weights_scale", shape.weights_scale)
        if shape.n_groups:
            u32("expert_group_count", shape.n_groups)
            u32("expert_group_used_count", shape.n_group_used)
    else:
        u32("attention.head_count_kv", shape.n_head_kv)
        u32("attention.key_length", hd)
        u32("attention.value_length", hd)
    if a == "gemma3":  # the attention twin's blocks see every position; the others' window is moot
        u32("attention.sliding_window", max(shape.sliding_window, n_ctx))
    if shape.n_expert:
        u32("expert_count", shape.n_expert)
        u32("expert_used_count", used if used is not None else shape.n_expert_used)
        if a == "qwen3moe":
            u32("expert_feed_forward_length", EXPERT_FFN)
    add_vocab(w)

    def q8(rows: int, cols: int) -> np.ndarray:
        blocks = rng.integers(-64, 64, (rows, cols // 32, 34), dtype=np.int8).view(np.uint8)
        blocks[..., 0:2] = np.array([0.002], np.float16).view(np.uint8)
        return blocks.reshape(rows, -1)

    def mat(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, q8(rows, cols), raw_dtype=Q.Q8_0)

    def stack(name: str, n: int, rows: int, cols: int) -> None:
        w.add_tensor(name, q8(n * rows, cols).reshape(n, rows, -1), raw_dtype=Q.Q8_0)

    def f32(name: str, *shape_: int, base: float = 1.0, scale: float = 0.1) -> None:
        w.add_tensor(name, (base + rng.standard_normal(shape_) * scale).astype(np.float32))

    mat("token_embd.weight", N_VOCAB, d)
    mat("output.weight", N_VOCAB, d)
    f32("output_norm.weight", d)
    H = shape.n_head
    for il in range(n_layer):
        p = f"blk.{il}."
        f32(p + "attn_norm.weight", d)
        if mla:
            if shape.q_lora:
                mat(p + "attn_q_a.weight", 32, d)
                f32(p + "attn_q_a_norm.weight", 32)
                mat(p + "attn_q_b.weight", H * hd, 32)
            else:
                mat(p + "attn_q.weight", H * hd, d)
            mat(p + "attn_kv_a_mqa.weight", kv_lora + rot, d)
            f32(p + "attn_kv_a_norm.weight", kv_lora)
            stack(p + "attn_k_b.weight", H, kv_lora, hd - rot)
            stack(p + "attn_v_b.weight", H, hdv, kv_lora)
            mat(p + "attn_output.weight", d, H * hdv)
        else:
            nkv = shape.n_head_kv
            mat(p + "attn_q.weight", H * hd, d)
            mat(p + "attn_k.weight", nkv * hd, d)
            mat(p + "attn_v.weight", nkv * hd, d)
            mat(p + "attn_output.weight", d, H * hd)
            if a == "qwen2":
                for t, n in (("q", H * hd), ("k", nkv * hd), ("v", nkv * hd)):
                    f32(p + f"attn_{t}.bias", n, base=0.0)
            if a in ("gemma3", "qwen3", "qwen3moe"):
                f32(p + "attn_q_norm.weight", hd)
                f32(p + "attn_k_norm.weight", hd)
            if a == "gemma3":
                f32(p + "post_attention_norm.weight", d)
                f32(p + "post_ffw_norm.weight", d)
        f32(p + "ffn_norm.weight", d)
        if il < n_dense:
            mat(p + "ffn_gate.weight", ffn, d)
            mat(p + "ffn_up.weight", ffn, d)
            mat(p + "ffn_down.weight", d, ffn)
            continue
        E = shape.n_expert
        f32(p + "ffn_gate_inp.weight", E, d, base=0.0, scale=0.02)  # the router: [E, d] rows of d
        if shape.probs_bias:
            f32(p + "exp_probs_b.bias", E, base=0.0)
        stack(p + "ffn_gate_exps.weight", E, EXPERT_FFN, d)
        stack(p + "ffn_up_exps.weight", E, EXPERT_FFN, d)
        stack(p + "ffn_down_exps.weight", E, d, EXPERT_FFN)
        if mla and shape.n_expert_shared:
            n_sh = EXPERT_FFN * shape.n_expert_shared
            mat(p + "ffn_gate_shexp.weight", n_sh, d)
            mat(p + "ffn_up_shexp.weight", n_sh, d)
            mat(p + "ffn_down_shexp.weight", d, n_sh)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

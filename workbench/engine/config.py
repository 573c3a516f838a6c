"""Model hyper-parameters read from GGUF metadata."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .gguf_file import ModelLoadError


@dataclass
class ModelConfig:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    norm_eps: float
    rope_base: float
    rope_dims: int
    rope_neox: bool
    rope_freq_scale: float = 1.0
    rope_ext_factor: float = 0.0  # YaRN
    rope_attn_factor: float = 1.0
    rope_corr: tuple[float, float] = (0.0, 0.0)
    rope_base_swa: float | None = None
    sliding_window: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    attn_scale: float = 0.0
    name: str = ""
    # mixture of experts (0 experts: a dense model)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0               # rows of one routed expert's gate/up
    n_expert_shared: int = 0
    n_layer_dense_lead: int = 0     # leading layers with a dense FFN (DeepSeek)
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0  # 0 or 1: no scaling
    expert_gating: int = 1          # llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid
    n_expert_groups: int = 0
    n_group_used: int = 0
    # multi-head latent attention (DeepSeek 2/3)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    head_dim_k_mla: int = 0         # per-head query/key size after decompression (nope + rope)
    head_dim_v_mla: int = 0         # per-head value size after decompression
    rope_yarn_log_mul: float = 0.0

    def layer_window(self, il: int) -> int:
        return self.sliding_window if self.swa_layers and self.swa_layers[il] else 0

    def layer_rope_base(self, il: int) -> float:
        if self.rope_base_swa is not None and self.layer_window(il):
            return self.rope_base_swa
        return self.rope_base


def _yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float = 32.0,
                    beta_slow: float = 1.0) -> tuple[float, float]:
    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    lo = max(0.0, math.floor(corr_dim(beta_fast)))
    hi = min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))
    return lo, hi


def _per_layer_first(v: Any) -> int:
    if isinstance(v, np.ndarray) or isinstance(v, list):
        vals = {int(x) for x in v}
        if len(vals) != 1:
            raise ModelLoadError(f"per-layer head counts {sorted(vals)} differ between layers (not supported)")
        return vals.pop()
    return int(v)


def config_from_metadata(md: dict[str, Any], n_vocab: int) -> ModelConfig:
    arch = str(md.get("general.architecture", ""))

    def get(key: str, default: Any = None) -> Any:
        full = f"{arch}.{key}"
        if full in md:
            return md[full]
        if default is None:
            raise ModelLoadError(f"model metadata is missing {full!r}")
        return default

    n_embd = int(get("embedding_length"))
    n_head = _per_layer_first(get("attention.head_count"))
    n_head_kv = _per_layer_first(get("attention.head_count_kv", n_head))
    head_dim = int(get("attention.key_length", n_embd // max(n_head, 1)))
    head_dim_v = int(get("attention.value_length", head_dim))
    n_layer = int(get("block_count"))
    for what, v in (("embedding_length", n_embd), ("head_count", n_head), ("block_count", n_layer),
                    ("key_length", head_dim), ("value_length", head_dim_v)):
        if not 0 < v < 1 << 20:
            raise ModelLoadError(f"model metadata {arch}.{what} = {v} is out of range")
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise ModelLoadError(f"{n_head} attention heads cannot be grouped over {n_head_kv} KV heads")
    rope_dims = int(get("rope.dimension_count", head_dim))
    cfg = ModelConfig(
        arch=arch,
        n_vocab=n_vocab,
        n_ctx_train=int(get("context_length", 2048)),
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=int(_per_layer_first(get("feed_forward_length"))),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(get("rope.freq_base", 10000.0)),
        rope_dims=rope_dims,
        rope_neox=arch != "llama",
        name=str(md.get("general.name", arch)),
    )
    cfg.attn_scale = 1.0 / math.sqrt(head_dim)
    cfg.n_expert = int(get("expert_count", 0) or 0)
    cfg.n_expert_used = int(get("expert_used_count", 0) or 0)
    if cfg.n_expert and not 0 < cfg.n_expert_used <= cfg.n_expert:
        raise ModelLoadError(f"{arch}.expert_used_count = {cfg.n_expert_used} is not in 1..{cfg.n_expert} experts")
    cfg.n_ff_exp = int(_per_layer_first(get("expert_feed_forward_length", 0)) or 0)
    cfg.n_expert_shared = int(get("expert_shared_count", 0) or 0)
    cfg.n_layer_dense_lead = int(get("leading_dense_block_count", 0) or 0)
    cfg.expert_weights_norm = bool(get("expert_weights_norm", False))
    cfg.expert_weights_scale = float(get("expert_weights_scale", 0.0) or 0.0)
    cfg.expert_gating = int(get("expert_gating_func", 0) or 0)
    cfg.n_expert_groups = int(get("expert_group_count", 0) or 0)
    cfg.n_group_used = int(get("expert_group_used_count", 0) or 0)
    cfg.q_lora_rank = int(get("attention.q_lora_rank", 0) or 0)
    cfg.kv_lora_rank = int(get("attention.kv_lora_rank", 0) or 0)
    cfg.head_dim_k_mla = int(get("attention.key_length_mla", 0) or 0)
    cfg.head_dim_v_mla = int(get("attention.value_length_mla", 0) or 0)
    cfg.rope_yarn_log_mul = float(get("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    scaling = str(get("rope.scaling.type", "none"))
    factor = float(get("rope.scaling.factor", 0.0) or 0.0)
    if scaling in ("linear", "yarn") and factor > 0:
        cfg.rope_freq_scale = 1.0 / factor
    if scaling == "yarn":
        n_orig = int(get("rope.scaling.original_context_length", cfg.n_ctx_train))
        cfg.rope_ext_factor = 1.0
        cfg.rope_corr = _yarn_corr_dims(rope_dims, n_orig, cfg.rope_base)
    elif scaling not in ("none", "linear"):
        raise ModelLoadError(f"RoPE scaling type {scaling!r} is not supported (none, linear, yarn)")
    return cfg

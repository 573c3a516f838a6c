"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (QK-norm, NEOX RoPE) with
routed experts in every layer: softmax over the router logits, top-k, weights renormalised."""

from __future__ import annotations

from ..config import ModelConfig
from .moe import MoEDecoder
from .qwen3 import Qwen3


class Qwen3MoE(MoEDecoder):
    arch = "qwen3moe"
    qk_norm = Qwen3.qk_norm

    @staticmethod
    def configure(cfg: ModelConfig, md: dict) -> None:
        Qwen3.configure(cfg, md)   # Qwen3's attention
        cfg.expert_gating = 1
        if not cfg.n_ff_exp and cfg.n_expert_used:  # llama.cpp's fallback without the key
            cfg.n_ff_exp = cfg.n_ff // cfg.n_expert_used

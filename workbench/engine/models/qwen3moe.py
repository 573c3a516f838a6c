"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (QK-norm, NEOX RoPE) with
routed experts in every layer: softmax over the router logits, top-k, weights renormalised."""

from __future__ import annotations

from ..config import ModelConfig
from .moe import MoEDecoder


class Qwen3MoE(MoEDecoder):
    arch = "qwen3moe"
    qk_norm = True

    @staticmethod
    def configure(cfg: ModelConfig, md: dict) -> None:
        cfg.rope_neox = True
        cfg.expert_gating = 1
        if not cfg.n_ff_exp and cfg.n_expert_used:  # llama.cpp's fallback without the key
            cfg.n_ff_exp = cfg.n_ff // cfg.n_expert_used

"""Qwen2: Llama-like with biases on the Q, K and V projections and NEOX RoPE."""

from __future__ import annotations

from ..config import ModelConfig
from .common import Decoder


class Qwen2(Decoder):
    arch = "qwen2"

    @staticmethod
    def configure(cfg: ModelConfig, md: dict) -> None:
        cfg.rope_neox = True

"""Qwen3: QK-norm, no projection biases, NEOX RoPE."""

from __future__ import annotations

from ..config import ModelConfig
from .common import Decoder


class Qwen3(Decoder):
    arch = "qwen3"
    qk_norm = True

    @staticmethod
    def configure(cfg: ModelConfig, md: dict) -> None:
        cfg.rope_neox = True

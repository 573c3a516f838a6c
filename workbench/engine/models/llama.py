"""Llama 2/3, Mistral, TinyLlama, SmolLM: GQA, RoPE (interleaved pairs), SwiGLU."""

from __future__ import annotations

from ..config import ModelConfig
from .common import Decoder


class Llama(Decoder):
    arch = "llama"

    @staticmethod
    def configure(cfg: ModelConfig, md: dict) -> None:
        cfg.rope_neox = False
        window = int(md.get("llama.attention.sliding_window", 0) or 0)
        if window:  # Mistral v0.1 style: every layer windowed
            cfg.sliding_window = window
            cfg.swa_layers = [True] * cfg.n_layer

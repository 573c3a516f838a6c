"""Gemma 3: sliding-window and global layers, QK-norm, pre- and post-norms, GELU."""

from __future__ import annotations

import math

from ..config import ModelConfig
from .common import Decoder

SWA_PATTERN = 6  # five sliding-window layers, then one global layer


class Gemma3(Decoder):
    arch = "gemma3"
    activation = "gelu"
    qk_norm = True
    post_norms = True
    embed_scale = True
    prescale_query = True

    @staticmethod
    def configure(cfg: ModelConfig, md: dict) -> None:
        cfg.rope_neox = True
        cfg.swa_layers = [il % SWA_PATTERN < SWA_PATTERN - 1 for il in range(cfg.n_layer)]
        cfg.sliding_window = int(md.get("gemma3.attention.sliding_window", 0) or 0)
        # local layers use a fixed RoPE base; the metadata's base is for the global ones
        cfg.rope_base_swa = float(md.get("gemma3.rope.freq_base_swa", 10000.0))
        # the 27B model scales by the embedding width per head; the others by the head size
        if cfg.n_layer == 62:
            cfg.attn_scale = 1.0 / math.sqrt(cfg.n_embd / cfg.n_head)
        else:
            cfg.attn_scale = 1.0 / math.sqrt(cfg.head_dim)

"""Mixtral-style `llama` files with experts (ffn_gate_inp + ffn_*_exps): Llama's attention
(GQA, interleaved-pair RoPE) and routed experts: softmax top-k with renormalised weights, as
llama.cpp's llama graph does. Chosen over `Llama` by the presence of the router tensors."""

from __future__ import annotations

from ..config import ModelConfig
from .llama import Llama
from .moe import MoEDecoder


class LlamaMoE(MoEDecoder):
    arch = "llama"

    @staticmethod
    def configure(cfg: ModelConfig, md: dict) -> None:
        Llama.configure(cfg, md)
        cfg.expert_gating = 1
        cfg.n_ff_exp = cfg.n_ff  # llama.cpp: the experts are [n_embd, n_ff, n_expert]

"""What a layer's compiled calls take: its attention, MLA and FFN sub-layers by tensor name.

The model modules describe each layer with these (`Decoder.token_attention`, `token_ffn`); the
runtime turns them into compiled one-token calls (`engine.token_calls`) and a decode batch's rows
calls (`engine.batch`). Plain data: no kernels, threads or placement.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gating import Gating


@dataclass(frozen=True)
class AttentionSpec:
    """A layer's attention sub-layer as `Runtime.attention_token` / `layer_token` take it: tensor
    names, (n_head, n_kv, head_dim, head_dim_v), sliding window (0: none), score scale, biases (q, k,
    v, output; size 0: none), q/k norm weights, norm epsilon, NEOX RoPE, queries prescaled."""
    qkv: tuple[str, str, str]
    output: str
    shape: tuple[int, int, int, int]
    window: int
    scale: float
    biases: tuple[np.ndarray, ...]
    q_norm: np.ndarray
    k_norm: np.ndarray
    eps: float
    neox: bool
    prescale: bool


@dataclass(frozen=True)
class MLASpec:
    """A layer's multi-head latent attention (DeepSeek 2/3) as `Runtime.layer_token` / `token_layers`
    take it: `first` the products of the normed input (q_a or q, then kv_a_mqa), `q_a_norm` and
    `q_b` the q-LoRA's ("" without), `kv_norm` the latent's norm, `k_b` / `v_b` the per-head 3-D
    tensors, `output`; n_head, nope (the query's non-rotary width), score scale, norm epsilon, NEOX
    RoPE. No sliding window (`window` 0)."""
    first: tuple[str, str]
    q_a_norm: str
    q_b: str
    kv_norm: str
    k_b: str
    v_b: str
    output: str
    n_head: int
    nope: int
    scale: float
    eps: float
    neox: bool
    window: int = 0


@dataclass(frozen=True)
class RoutedSpec:
    """A layer's routed FFN as `Runtime.routed_token` / `layer_token` take it (gate None: `up` is a
    fused gate_up tensor)."""
    router: str
    gating: Gating
    gate: str | None
    up: str
    down: str
    activation: str = "silu"


@dataclass(frozen=True)
class DenseSpec:
    """A layer's dense gated FFN as `Runtime.layer_token` / `token_layers` take it."""
    gate: str
    up: str
    down: str
    activation: str = "silu"


@dataclass(frozen=True)
class SharedSpec:
    """A layer's FFN in a model with shared experts (DeepSeek): the routed experts (None in a dense
    layer) and then `dense` (the shared experts' gated FFN, or the dense layer's), their outputs
    added. A dense layer's call takes `template`'s routed arguments without running them, so every
    layer of the model has one argument type (one typed list, one compiled token)."""
    routed: RoutedSpec | None
    template: RoutedSpec
    dense: DenseSpec

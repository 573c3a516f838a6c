"""An independent plain-NumPy (float64) forward pass for the tiny test models.

Written from the architectures' published descriptions, sharing no code with
the engine: it checks the engine's model code, kernels and caching together.
"""

from __future__ import annotations

import math

import numpy as np


def rms(x: np.ndarray, w: np.ndarray | None, eps: float = 1e-6) -> np.ndarray:
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """x: [n, heads, hd]."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd, 2) / hd)
    ang = pos[:, None] * inv[None, :]  # [n, hd/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        out[..., : hd // 2] = a * c - b * s
        out[..., hd // 2:] = a * s + b * c
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
    return out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def moe_ffn(W: dict[str, np.ndarray], p: str, h: np.ndarray, k: int, info: dict | None = None) -> np.ndarray:
    """Routed experts (Mixtral / Qwen3-MoE): softmax over the router, the k best, their weights
    renormalised, each expert a SwiGLU FFN. `info["margin"]` keeps the smallest gap between the
    k-th and the next probability (a tiny gap would make the choice fragile)."""
    probs = softmax(h @ W[p + "ffn_gate_inp.weight"].T)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        order = np.argsort(-probs[t])
        chosen = order[:k]
        if info is not None:
            gap = probs[t, order[k - 1]] - probs[t, order[k]] if k < len(order) else 1.0
            info["margin"] = min(info.get("margin", 1.0), gap)
        wts = probs[t, chosen] / probs[t, chosen].sum()
        for e, wt in zip(chosen, wts):
            g = W[p + "ffn_gate_exps.weight"][e] @ h[t]
            u = W[p + "ffn_up_exps.weight"][e] @ h[t]
            out[t] += wt * (W[p + "ffn_down_exps.weight"][e] @ (silu(g) * u))
    return out


def forward(W: dict[str, np.ndarray], arch: str, ids: list[int], n_head: int, n_head_kv: int, head_dim: int,
            n_layer: int, window: int = 0, n_expert_used: int = 0, info: dict | None = None) -> np.ndarray:
    """Logits [n, vocab] for every position of `ids` (positions 0..n-1)."""
    n = len(ids)
    x = W["token_embd.weight"][ids].copy()
    d = x.shape[1]
    if arch == "gemma3":
        x *= math.sqrt(d)
    pos = np.arange(n, dtype=np.float64)
    neox = arch != "llama"
    for il in range(n_layer):
        p = f"blk.{il}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = h @ W[p + "attn_q.weight"].T + W.get(p + "attn_q.bias", 0)
        k = h @ W[p + "attn_k.weight"].T + W.get(p + "attn_k.bias", 0)
        v = h @ W[p + "attn_v.weight"].T + W.get(p + "attn_v.bias", 0)
        q = q.reshape(n, n_head, head_dim)
        k = k.reshape(n, n_head_kv, head_dim)
        v = v.reshape(n, n_head_kv, head_dim)
        if arch in ("gemma3", "qwen3", "qwen3moe"):
            q = rms(q, W[p + "attn_q_norm.weight"])
            k = rms(k, W[p + "attn_k_norm.weight"])
        local = arch == "gemma3" and il % 6 < 5
        base = 10000.0
        q, k = rope(q, pos, base, neox), rope(k, pos, base, neox)
        att = np.zeros((n, n_head, head_dim))
        group = n_head // n_head_kv
        for hh in range(n_head):
            kh = hh // group
            s = q[:, hh, :] @ k[:, kh, :].T / math.sqrt(head_dim)
            i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
            mask = j > i
            if local and window:
                mask |= (i - j) >= window
            s = np.where(mask, -np.inf, s)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            att[:, hh, :] = s @ v[:, kh, :]
        o = att.reshape(n, -1) @ W[p + "attn_output.weight"].T
        if arch == "gemma3":
            o = rms(o, W[p + "post_attention_norm.weight"])
        x = x + o
        h = rms(x, W[p + "ffn_norm.weight"])
        if p + "ffn_gate_inp.weight" in W:
            x = x + moe_ffn(W, p, h, n_expert_used, info)
            continue
        g = h @ W[p + "ffn_gate.weight"].T
        u = h @ W[p + "ffn_up.weight"].T
        a = (gelu_tanh(g) if arch == "gemma3" else silu(g)) * u
        dn = a @ W[p + "ffn_down.weight"].T
        if arch == "gemma3":
            dn = rms(dn, W[p + "post_ffw_norm.weight"])
        x = x + dn
    x = rms(x, W["output_norm.weight"])
    out = W.get("output.weight", W["token_embd.weight"])
    return x @ out.T

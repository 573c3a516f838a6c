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


def yarn_corr_dims(n_dims: int, n_orig: int, base: float, beta_fast: float = 32.0,
                   beta_slow: float = 1.0) -> tuple[float, float]:
    """The YaRN ramp's first and last rotary dimension (the paper's wavelength bounds)."""
    def dim(n_rot: float) -> float:
        return n_dims * math.log(n_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(dim(beta_fast))), min(n_dims - 1.0, math.ceil(dim(beta_slow)))


def rope_pairs_yarn(x: np.ndarray, pos: np.ndarray, base: float, factor: float = 1.0, n_orig: int = 0) -> np.ndarray:
    """Interleaved-pair RoPE of x [n, heads, d]; with factor > 1, YaRN's frequency blend (the
    magnitude correction is left to the score scale, as DeepSeek does)."""
    d = x.shape[-1]
    i = np.arange(d // 2)
    extrap = base ** (-2 * i / d)
    if factor > 1:
        lo, hi = yarn_corr_dims(d, n_orig, base)
        ramp = 1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)
        inv = extrap / factor * (1 - ramp) + extrap * ramp
    else:
        inv = extrap
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    a, b = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def deepseek2_forward(W: dict[str, np.ndarray], spec, ids: list[int], info: dict | None = None) -> np.ndarray:
    """DeepSeek 2/3 written the naive way: every head's key and value decompressed from the latent
    (k_nope = k_b^T latent, v = v_b latent), per-head attention, no absorption; routing with
    softmax or sigmoid, selection bias, groups, normalisation and scale as the model card says."""
    n = len(ids)
    x = W["token_embd.weight"][ids].copy()
    H, lora, rot, dk, dv = spec.n_head, spec.kv_lora_rank, spec.n_rot, spec.head_dim, spec.head_dim_v_mla
    nope = dk - rot
    pos = np.arange(n, dtype=np.float64)
    factor, n_orig, mscale_all = spec.yarn if spec.yarn else (1.0, 0, 0.0)
    mscale = 1 + 0.1 * mscale_all * math.log(factor) if factor > 1 else 1.0
    scale = mscale * mscale / math.sqrt(dk)
    mask = np.triu(np.ones((n, n), dtype=bool), 1)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        h = rms(x, W[p + "attn_norm.weight"])
        if spec.q_lora_rank:
            q = rms(h @ W[p + "attn_q_a.weight"].T, W[p + "attn_q_a_norm.weight"]) @ W[p + "attn_q_b.weight"].T
        else:
            q = h @ W[p + "attn_q.weight"].T
        q = q.reshape(n, H, dk)
        ckv = h @ W[p + "attn_kv_a_mqa.weight"].T
        latent = rms(ckv[:, :lora], W[p + "attn_kv_a_norm.weight"])
        k_pe = rope_pairs_yarn(ckv[:, None, lora:], pos, 10000.0, factor, n_orig)[:, 0]
        q_pe = rope_pairs_yarn(q[:, :, nope:], pos, 10000.0, factor, n_orig)
        att = np.zeros((n, H, dv))
        for hh in range(H):
            k_nope = latent @ W[p + "attn_k_b.weight"][hh]          # [n, nope]
            v = latent @ W[p + "attn_v_b.weight"][hh].T              # [n, dv]
            s = (q[:, hh, :nope] @ k_nope.T + q_pe[:, hh] @ k_pe.T) * scale
            s = np.where(mask, -np.inf, s)
            att[:, hh] = softmax(s) @ v
        x = x + att.reshape(n, -1) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"])
        if p + "ffn_gate_inp.weight" not in W:
            x = x + (silu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
            continue
        logits = h @ W[p + "ffn_gate_inp.weight"].T
        probs = 1 / (1 + np.exp(-logits)) if spec.gating == 2 else softmax(logits)
        out = np.zeros_like(h)
        for t in range(n):
            sel = probs[t] + W.get(p + "exp_probs_b.bias", 0)
            if spec.n_groups > 1:
                g = sel.reshape(spec.n_groups, -1)
                gs = np.sort(g, axis=1)[:, -2:].sum(axis=1)
                keep = np.argsort(-gs)[:spec.n_group_used]
                masked = np.full_like(g, -np.inf)
                masked[keep] = g[keep]
                sel = masked.reshape(-1)
            order = np.argsort(-sel)
            chosen = order[:spec.n_expert_used]
            if info is not None:
                info["margin"] = min(info.get("margin", 1.0), sel[order[spec.n_expert_used - 1]] - sel[order[spec.n_expert_used]])
            wts = probs[t, chosen]
            if spec.weights_norm:
                wts = wts / wts.sum()
            if spec.weights_scale:
                wts = wts * spec.weights_scale
            for e, wt in zip(chosen, wts):
                gg = W[p + "ffn_gate_exps.weight"][e] @ h[t]
                u = W[p + "ffn_up_exps.weight"][e] @ h[t]
                out[t] += wt * (W[p + "ffn_down_exps.weight"][e] @ (silu(gg) * u))
        if spec.n_expert_shared:
            out += (silu(h @ W[p + "ffn_gate_shexp.weight"].T) * (h @ W[p + "ffn_up_shexp.weight"].T)) @ W[p + "ffn_down_shexp.weight"].T
        x = x + out
    x = rms(x, W["output_norm.weight"])
    return x @ W.get("output.weight", W["token_embd.weight"]).T

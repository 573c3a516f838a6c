"""Mixture-of-experts decoders: the router's numerics and the forward pass shared by MoE families.

A MoE layer routes each token to `n_expert_used` of `n_expert` FFN experts (llama.cpp's
build_moe_ffn): router logits (ffn_gate_inp), softmax or sigmoid, an optional selection bias
(DeepSeek V3's exp_probs_b), optional grouped selection (the best `n_group_used` groups by the
sum of their top-2 scores), top-k, weights taken from the unbiased probabilities, optionally
normalised to sum 1 and scaled. The expert products themselves are the Runtime's (`Runtime.moe`):
model code never sees kernels, threads or where the experts live.

The router follows ggml's CPU float order (soft_max: 16-lane exps summed in double, then one
f32 scale; sum_rows in double; f32 div and scale), so the same experts win as in llama.cpp.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .. import ops
from ..config import ModelConfig
from ..gguf_file import ModelLoadError
from ..kv_cache import KVCache
from ..ops import ggml_expf, tree16
from ..runtime import Runtime
from .common import Decoder

SOFTMAX, SIGMOID = 1, 2  # llama.cpp's expert_gating_func values
from ..kernels.jitcache import JIT as _JIT


@nb.njit(**_JIT)
def softmax_rows(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max of each row of float32 x (AVX-512 order: blocks of 16 exps reduced as
    _mm512_reduce_add_ps and summed in double; leftovers with expf; one f32 scale by 1/sum)."""
    n, m = x.shape
    out = np.empty((n, m), dtype=np.float32)
    for r in range(n):
        mx = np.float32(-np.inf)
        for j in range(m):
            if x[r, j] > mx:
                mx = x[r, j]
        s = 0.0
        j = 0
        while j + 15 < m:
            for i in range(16):
                out[r, j + i] = ggml_expf(x[r, j + i] - mx)
            s += np.float64(tree16(out[r], j))
            j += 16
        while j < m:
            v = np.float32(math.exp(np.float32(x[r, j] - mx)))
            out[r, j] = v
            s += np.float64(v)
            j += 1
        inv = np.float32(1.0 / s)
        for j in range(m):
            out[r, j] = out[r, j] * inv
    return out


@nb.njit(**_JIT)
def sigmoid_rows(x: np.ndarray) -> np.ndarray:
    """ggml_sigmoid: 1 / (1 + expf(-x)) in float32."""
    n, m = x.shape
    out = np.empty((n, m), dtype=np.float32)
    for r in range(n):
        for j in range(m):
            out[r, j] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-x[r, j])))
    return out


@nb.njit(**_JIT)
def _best(v: np.ndarray, k: int, out: np.ndarray) -> None:
    """Indices of the k largest of v, largest first (ggml_argsort_top_k; ties: lower index)."""
    taken = np.zeros(v.shape[0], dtype=np.bool_)
    for i in range(k):
        b = -1
        for j in range(v.shape[0]):
            if not taken[j] and (b < 0 or v[j] > v[b]):
                b = j
        taken[b] = True
        out[i] = b


@nb.njit(**_JIT)
def _route(probs: np.ndarray, k: int, bias: np.ndarray, n_groups: int, n_group_used: int, norm: bool,
           scale: float) -> tuple[np.ndarray, np.ndarray]:
    n, n_exp = probs.shape
    ids = np.empty((n, k), dtype=np.int64)
    w = np.empty((n, k), dtype=np.float32)
    sel = np.empty(n_exp, dtype=np.float32)
    per = n_exp // n_groups if n_groups > 1 else n_exp
    two = np.empty(2, dtype=np.int64)
    gsc = np.empty(max(n_groups, 1), dtype=np.float32)
    keep = np.empty(max(n_group_used, 1), dtype=np.int64)
    for t in range(n):
        for j in range(n_exp):
            sel[j] = probs[t, j] + bias[j] if bias.shape[0] == n_exp else probs[t, j]
        if n_groups > 1:
            # each group's score: the sum (in double, as ggml_sum_rows) of its two best
            for g in range(n_groups):
                _best(sel[g * per:(g + 1) * per], 2, two)
                gsc[g] = np.float32(np.float64(sel[g * per + two[0]]) + np.float64(sel[g * per + two[1]]))
            _best(gsc, n_group_used, keep)
            for g in range(n_groups):
                used = False
                for i in range(n_group_used):
                    if keep[i] == g:
                        used = True
                if not used:
                    for j in range(g * per, (g + 1) * per):
                        sel[j] = -np.inf
        _best(sel, k, ids[t])
        for i in range(k):
            w[t, i] = probs[t, ids[t, i]]
        if norm:
            s = 0.0
            for i in range(k):
                s += np.float64(w[t, i])
            sf = max(np.float32(s), np.float32(6.103515625e-5))
            for i in range(k):
                w[t, i] = w[t, i] / sf
        if scale != 0.0 and scale != 1.0:
            for i in range(k):
                w[t, i] = w[t, i] * np.float32(scale)
    return ids, w


def route(probs: np.ndarray, k: int, bias: np.ndarray | None = None, n_groups: int = 0, n_group_used: int = 0,
          norm: bool = False, scale: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Experts [n, k] (best first) and their weights [n, k] float32 from router probabilities
    [n, n_expert], as llama.cpp's build_moe_ffn does after the gating function: selection on
    probs + bias (grouped: only the n_group_used groups with the best top-2 sums), weights from
    the unbiased probabilities, optionally normalised (clamped sum) and scaled, all in f32."""
    probs = np.ascontiguousarray(probs, dtype=np.float32)
    b = np.ascontiguousarray(bias, dtype=np.float32) if bias is not None else np.zeros(0, dtype=np.float32)
    if n_groups > 1 and (probs.shape[1] % n_groups or not 0 < n_group_used <= n_groups):
        raise ValueError(f"{probs.shape[1]} experts cannot be used as {n_group_used} of {n_groups} groups")
    return _route(probs, k, b, n_groups, n_group_used, norm, float(scale))


class MoEDecoder(Decoder):
    """A decoder whose FFN layers are routed experts (dense where a layer has no router).

    The forward pass is this family's own; `attention` is the hook where an architecture with
    another attention (DeepSeek's MLA) plugs in.
    """

    norm_weights = True        # renormalise the top-k weights (Qwen3-MoE, Mixtral)

    def __init__(self, cfg: ModelConfig, rt: Runtime):
        if cfg.n_expert <= 0:
            raise ModelLoadError(f"{cfg.arch} model has no experts ({cfg.arch}.expert_count is missing or 0)")
        if not cfg.n_ff_exp:
            cfg.n_ff_exp = cfg.n_ff
        super().__init__(cfg, rt)

    # -- structure -------------------------------------------------------------------
    def is_moe_layer(self, il: int) -> bool:
        return self.rt.has(f"blk.{il}.ffn_gate_inp.weight")

    def fused_gate_up(self, il: int) -> bool:
        return self.rt.has(f"blk.{il}.ffn_gate_up_exps.weight")

    def attention_tensors(self, il: int) -> list[str]:
        names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output"]
        if self.qk_norm:
            names += ["attn_q_norm", "attn_k_norm"]
        return names

    def layer_tensors(self, il: int) -> list[str]:
        names = self.attention_tensors(il) + ["ffn_norm"]
        if self.is_moe_layer(il):
            names += ["ffn_gate_inp", "ffn_down_exps"]
            # gate and up as two tensors, or fused (convert_hf_to_gguf.py --fuse-gate-up-exps)
            names += ["ffn_gate_up_exps"] if self.fused_gate_up(il) else ["ffn_gate_exps", "ffn_up_exps"]
            if self.cfg.n_expert_shared:
                names += ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]
        else:
            names += ["ffn_gate", "ffn_up", "ffn_down"]
        return [f"blk.{il}.{n}.weight" for n in names]

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        out = {"token_embd.weight": (c.n_embd, c.n_vocab)}
        for il in self.layers:
            if self.is_moe_layer(il):
                p = f"blk.{il}."
                out[p + "ffn_gate_inp.weight"] = (c.n_embd, c.n_expert)
                if self.fused_gate_up(il):
                    out[p + "ffn_gate_up_exps.weight"] = (c.n_embd, 2 * c.n_ff_exp, c.n_expert)
                else:
                    out[p + "ffn_gate_exps.weight"] = (c.n_embd, c.n_ff_exp, c.n_expert)
                    out[p + "ffn_up_exps.weight"] = (c.n_embd, c.n_ff_exp, c.n_expert)
                out[p + "ffn_down_exps.weight"] = (c.n_ff_exp, c.n_embd, c.n_expert)
        return out

    # -- forward ---------------------------------------------------------------------
    def attention(self, il: int, h: np.ndarray, kv: KVCache, pos0: int, positions: np.ndarray,
                  ropes: dict) -> np.ndarray:
        """Grouped-query attention of layer il on normed input h [n, n_embd]; returns [n, n_embd]."""
        c, rt = self.cfg, self.rt
        n = h.shape[0]
        p = f"blk.{il}."
        q, k, v = rt.linear(h, (p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"))
        q = self._bias(q, p + "attn_q.bias").reshape(n, c.n_head, c.head_dim)
        k = self._bias(k, p + "attn_k.bias").reshape(n, c.n_head_kv, c.head_dim)
        v = self._bias(v, p + "attn_v.bias").reshape(n, c.n_head_kv, c.head_dim_v)
        if self.qk_norm:
            ops.rms_norm_heads(q, rt.f32(p + "attn_q_norm.weight"), c.norm_eps)
            ops.rms_norm_heads(k, rt.f32(p + "attn_k_norm.weight"), c.norm_eps)
        base = c.layer_rope_base(il)
        cs = ropes.get(base)
        if cs is None:
            cs = ropes[base] = ops.rope_cache(positions, c.rope_dims, base, c.rope_freq_scale, self.freq_factors,
                                              c.rope_ext_factor, c.rope_attn_factor, c.rope_corr[0], c.rope_corr[1])
        ops.apply_rope(q, cs, c.rope_neox)
        ops.apply_rope(k, cs, c.rope_neox)
        att = rt.attention(q, k, v, kv, il - self.layers.start, pos0, c.layer_window(il), c.attn_scale)
        (o,) = rt.linear(att.reshape(n, -1), (p + "attn_output.weight",))
        return self._bias(o, p + "attn_output.bias")

    def router(self, il: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Layer il's routed experts [n, k] and their weights [n, k] for normed input h."""
        c, rt = self.cfg, self.rt
        p = f"blk.{il}."
        (logits,) = rt.linear(h, (p + "ffn_gate_inp.weight",))
        probs = sigmoid_rows(logits) if c.expert_gating == SIGMOID else softmax_rows(logits)
        bias = rt.f32(p + "exp_probs_b.bias") if rt.has(p + "exp_probs_b.bias") else None
        return route(probs, c.n_expert_used, bias, c.n_expert_groups, c.n_group_used,
                     self.norm_weights, c.expert_weights_scale)

    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        """Layer il's FFN output for normed input h: dense SwiGLU, or routed experts (+ shared)."""
        rt = self.rt
        p = f"blk.{il}."
        if not self.is_moe_layer(il):
            _g, _u, a = rt.gated(h, p + "ffn_gate.weight", p + "ffn_up.weight", self.activation)
            (d,) = rt.linear(a, (p + "ffn_down.weight",))
            return d
        ids, w = self.router(il, h)
        if self.tap:
            self.tap(f"ffn_moe_topk-{il}", ids); self.tap(f"ffn_moe_weights-{il}", w)
        if self.fused_gate_up(il):
            gate, up = None, p + "ffn_gate_up_exps.weight"
        else:
            gate, up = p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"
        out = rt.moe(h, gate, up, p + "ffn_down_exps.weight", ids, w, self.activation)
        if rt.has(p + "ffn_up_shexp.weight"):
            _g, _u, a = rt.gated(h, p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight", self.activation)
            (s,) = rt.linear(a, (p + "ffn_down_shexp.weight",))
            out = out + s
        return out

    def _forward(self, ids: np.ndarray, kv: KVCache, logit_rows: slice | None) -> np.ndarray:
        c = self.cfg
        n = len(ids)
        pos0 = kv.n
        if pos0 + n > kv.n_ctx:
            raise ValueError(f"context full: {pos0 + n} tokens > {kv.n_ctx}")
        x = self._stage_input(ids)
        tap = self.tap
        positions = np.arange(pos0, pos0 + n, dtype=np.int64)
        ropes: dict = {}
        h = self.norm(x, f"blk.{self.layers.start}.attn_norm.weight")
        for il in self.layers:
            p = f"blk.{il}."
            if tap:
                tap(f"attn_norm-{il}", h)
            o = self.attention(il, h, kv, pos0, positions, ropes)
            if tap:
                tap(f"attn_out-{il}", o)
            if il == c.n_layer - 1:
                sel = logit_rows if logit_rows is not None else slice(n - 1, n)
                o = np.ascontiguousarray(o[sel])
                x = np.ascontiguousarray(x[sel])
            h = self.add_norm(x, o, None, p + "ffn_norm.weight")
            if tap:
                tap(f"ffn_inp-{il}", x); tap(f"ffn_norm-{il}", h)
            d = self.ffn(il, h)
            if tap:
                tap(f"ffn_out-{il}", d)
            h = self.add_norm(x, d, None, self._next_norm(il))
            if tap:
                tap(f"l_out-{il}", x)
        kv.n = pos0 + n
        return self._output(x, h)

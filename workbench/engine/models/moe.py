"""Mixture-of-experts decoders: the forward pass shared by MoE families.

A MoE layer routes each token to `n_expert_used` of `n_expert` FFN experts (llama.cpp's
build_moe_ffn): router logits (ffn_gate_inp), then the gating numerics of `..gating` (softmax or
sigmoid, bias, grouped top-k, weights). The expert products themselves are the Runtime's
(`Runtime.moe`, and `Runtime.routed_token` for a decoded token: router, gating and experts in one
compiled call): model code never sees kernels, threads or where the experts live.
"""

from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from ..gating import SIGMOID, SOFTMAX, Gating, gate, route
from ..gguf_file import ModelLoadError
from ..kv_cache import KVCache
from ..runtime import Runtime
from ..specs import DenseSpec, RoutedSpec, SharedSpec
from .common import Decoder


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
        self._gatings: dict[int, Gating] = {}
        self._routed: dict[int, RoutedSpec | None] = {}
        self._shared_template: RoutedSpec | bool | None = None   # token_ffn's, made once
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
    def gating(self, il: int) -> Gating:
        """Layer il's gating parameters (made once per layer)."""
        g = self._gatings.get(il)
        if g is None:
            c, rt = self.cfg, self.rt
            name = f"blk.{il}.exp_probs_b.bias"
            bias = rt.f32(name) if rt.has(name) else np.zeros(0, dtype=np.float32)
            g = self._gatings[il] = Gating(SIGMOID if c.expert_gating == SIGMOID else SOFTMAX, c.n_expert_used,
                                   np.ascontiguousarray(bias, dtype=np.float32), c.n_expert_groups, c.n_group_used,
                                   self.norm_weights, float(c.expert_weights_scale))
        return g

    def router(self, il: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Layer il's routed experts [n, k] and their weights [n, k] for normed input h."""
        g = self.gating(il)
        (logits,) = self.rt.linear(h, (f"blk.{il}.ffn_gate_inp.weight",))
        return route(gate(np.ascontiguousarray(logits, dtype=np.float32), g.kind), g.k, g.bias if g.bias.size else None, g.n_groups,
                     g.n_group_used, g.norm, g.scale)

    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        """Layer il's FFN output for normed input h: dense SwiGLU, or routed experts (+ shared)."""
        rt = self.rt
        p = f"blk.{il}."
        if not self.is_moe_layer(il):
            _g, _u, a = rt.gated(h, p + "ffn_gate.weight", p + "ffn_up.weight", self.activation)
            (d,) = rt.linear(a, (p + "ffn_down.weight",))
            return d
        if self.fused_gate_up(il):
            gate, up = None, p + "ffn_gate_up_exps.weight"
        else:
            gate, up = p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"
        down = p + "ffn_down_exps.weight"
        out = None
        if h.shape[0] == 1 and not self.tap:  # a decoded token: router, gating and experts in one call
            out = rt.routed_token(h, p + "ffn_gate_inp.weight", self.gating(il), gate, up, down, self.activation)
        elif not self.tap:  # a decode batch's rows (engine.batch): the same call over every row
            rows = rt.rows_ffn(self.token_ffn(il), h)
            if rows is not None:
                return rows
        if out is None:
            ids, w = self.router(il, h)
            if self.tap:
                self.tap(f"ffn_moe_topk-{il}", ids); self.tap(f"ffn_moe_weights-{il}", w)
            out = rt.moe(h, gate, up, down, ids, w, self.activation)
        if rt.has(p + "ffn_up_shexp.weight"):
            _g, _u, a = rt.gated(h, p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight", self.activation)
            (s,) = rt.linear(a, (p + "ffn_down_shexp.weight",))
            out = out + s
        return out

    def routed_spec(self, il: int) -> RoutedSpec | None:
        """Layer il's routed FFN as the runtime's one-token calls take it (made once per layer);
        None for a dense layer or one with shared experts."""
        if il not in self._routed:
            p = f"blk.{il}."
            spec = None
            if self.is_moe_layer(il) and not self.rt.has(p + "ffn_up_shexp.weight"):
                spec = self._routed_of(il)
            self._routed[il] = spec
        return self._routed[il]

    def _routed_of(self, il: int) -> RoutedSpec:
        """Layer il's routed experts alone (without its shared experts, if any)."""
        p = f"blk.{il}."
        fused = self.fused_gate_up(il)
        return RoutedSpec(p + "ffn_gate_inp.weight", self.gating(il), None if fused else p + "ffn_gate_exps.weight",
                          p + ("ffn_gate_up_exps.weight" if fused else "ffn_up_exps.weight"),
                          p + "ffn_down_exps.weight", self.activation)

    def token_ffn(self, il: int) -> RoutedSpec | DenseSpec | SharedSpec | None:
        """A routed layer's `routed_spec`, a dense layer's gated FFN; in a model with shared
        experts every layer's `SharedSpec` (routed + shared, or dense), so that all its layers
        take one compiled call."""
        if self._shared_template is None:
            moe = [il_ for il_ in self.layers if self.is_moe_layer(il_)]
            shared = any(self.rt.has(f"blk.{il_}.ffn_up_shexp.weight") for il_ in moe)
            self._shared_template = self._routed_of(moe[0]) if shared else False
        if self._shared_template is False:
            return self.routed_spec(il) if self.is_moe_layer(il) else super().token_ffn(il)
        p = f"blk.{il}."
        if self.is_moe_layer(il):
            if not self.rt.has(p + "ffn_up_shexp.weight"):
                return None
            dense = DenseSpec(p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight", p + "ffn_down_shexp.weight",
                              self.activation)
            return SharedSpec(self._routed_of(il), self._shared_template, dense)
        return SharedSpec(None, self._shared_template, super().token_ffn(il))

    def _layer(self, il: int, x: np.ndarray, h: np.ndarray, kv: KVCache, pos0: int, positions: np.ndarray,
               ropes: dict, logit_rows: slice | None) -> tuple[np.ndarray, np.ndarray]:
        """A MoE layer step by step: attention, then `ffn` (routed experts, shared experts, or a
        dense FFN), no post norms."""
        tap = self.tap
        p = f"blk.{il}."
        x, o = self._attention_step(il, x, h, kv, pos0, positions, ropes, logit_rows)
        h = self.add_norm(x, o, None, p + "ffn_norm.weight")
        if tap:
            tap(f"ffn_inp-{il}", x); tap(f"ffn_norm-{il}", h)
        d = self.ffn(il, h)
        if tap:
            tap(f"ffn_out-{il}", d)
        h = self.add_norm(x, d, None, self._next_norm(il))
        if tap:
            tap(f"l_out-{il}", x)
        return x, h

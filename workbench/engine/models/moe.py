"""Mixture-of-experts decoders: the forward pass shared by MoE families.

A MoE layer routes each token to `n_expert_used` of `n_expert` FFN experts (llama.cpp's
build_moe_ffn): router logits (ffn_gate_inp), then the gating numerics of `..gating` (softmax or
sigmoid, bias, grouped top-k, weights). The expert products themselves are the Runtime's
(`Runtime.moe`, and `Runtime.routed_token` for a decoded token: router, gating and experts in one
compiled call): model code never sees kernels, threads or where the experts live.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig
from ..gating import SIGMOID, SOFTMAX, Gating, gate, route
from ..gguf_file import ModelLoadError
from ..kv_cache import KVCache
from ..runtime import RoutedSpec, Runtime
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
        self._steps: dict[int, tuple | bool] = {}  # per layer: layer_token's fixed arguments, or False
        self._all_steps: list | None = None        # every layer's, when all have one (else [])
        self._prologue: tuple | None = None        # token_program's embedding, first norm and RoPE
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
                fused = self.fused_gate_up(il)
                spec = RoutedSpec(p + "ffn_gate_inp.weight", self.gating(il), None if fused else p + "ffn_gate_exps.weight",
                                  p + ("ffn_gate_up_exps.weight" if fused else "ffn_up_exps.weight"),
                                  p + "ffn_down_exps.weight", self.activation)
            self._routed[il] = spec
        return self._routed[il]

    def _token_layers(self, x: np.ndarray, h: np.ndarray, kv: KVCache, pos0: int, positions: np.ndarray,
                      ropes: dict) -> tuple[np.ndarray, np.ndarray | None] | None:
        """A decoded token's layers in one runtime call when every layer has one (`_layer_token`)
        and they share one RoPE base, with the output product on the last stage: (the last
        layer's normed output, the logits or None); else None."""
        steps = self._token_layers_steps()
        if not steps:
            return None
        return self.rt.token_layers(x, h, steps, kv, pos0, self._rope(self.layers.start, positions, ropes),
                                    self.output_name if self.is_last else None)

    def _token_program(self, tok: int, kv: KVCache, pos0: int) -> np.ndarray | None:
        """A decoded token from its id to its logits in one runtime call (`Runtime.token_program`:
        `_token_layers` with the embedding, the first norm and the RoPE table in the same call), on
        a model held whole by this process; else None."""
        steps = self._token_layers_steps()
        if not steps:
            return None
        c = self.cfg
        pro = self._prologue
        if pro is None:
            il = self.layers.start
            pro = self._prologue = (
                "token_embd.weight", math.sqrt(c.n_embd) if self.embed_scale else 0.0, f"blk.{il}.attn_norm.weight",
                float(c.norm_eps), (int(c.rope_dims), float(c.layer_rope_base(il)), float(c.rope_freq_scale),
                                    self.freq_factors, float(c.rope_ext_factor), float(c.rope_attn_factor),
                                    float(c.rope_corr[0]), float(c.rope_corr[1])))
        return self.rt.token_program(tok, steps, kv, pos0, pro, self.output_name)

    def _token_layers_steps(self) -> list:
        """Every layer's `_layer_token_step` when all have one and share one RoPE base, else []."""
        steps = self._all_steps
        if steps is None:
            for il in self.layers:
                self._layer_token_step(il)
            bases = {self.cfg.layer_rope_base(il) for il in self.layers}
            ok = len(bases) == 1 and all(self._steps[il] is not False for il in self.layers)
            steps = self._all_steps = [self._steps[il] for il in self.layers] if ok else []
        return steps

    def _layer_token_step(self, il: int) -> tuple | bool:
        """layer_token's fixed arguments of layer il (made once), or False: no such call."""
        step = self._steps.get(il)
        if step is None:
            rt = self.rt
            ffn = self.routed_spec(il) if type(self).attention is Decoder.attention else None
            step = self._steps[il] = False if ffn is None else (
                self.attention_spec(il), il - self.layers.start, rt.f32(f"blk.{il}.ffn_norm.weight"), ffn,
                rt.f32(self._next_norm(il)), self.cfg.norm_eps)
        return step

    def _layer_token(self, il: int, x: np.ndarray, h: np.ndarray, kv: KVCache, pos0: int, positions: np.ndarray,
                     ropes: dict) -> np.ndarray | None:
        """A decoded token's layer il in one runtime call (attention, residuals, norms, routed FFN):
        the next layer's normed input, or None (this family's own attention, a dense or shared-expert
        FFN, no compiled call): the caller runs the layer step by step."""
        step = self._layer_token_step(il)
        if step is False:
            return None
        attn, at, ffn_norm, ffn, next_norm, eps = step
        return self.rt.layer_token(x, h, attn, kv, at, pos0, self._rope(il, positions, ropes), ffn_norm, ffn,
                                   next_norm, eps)

    def _forward(self, ids: np.ndarray, kv: KVCache, logit_rows: slice | None) -> np.ndarray:
        c = self.cfg
        n = len(ids)
        pos0 = kv.n
        if pos0 + n > kv.n_ctx:
            raise ValueError(f"context full: {pos0 + n} tokens > {kv.n_ctx}")
        tap = self.tap
        # a decoded token whose logits row is its own: whole layers in one call where there is one
        one = n == 1 and not tap and (logit_rows is None or len(range(*logit_rows.indices(1))) == 1)
        if one and self.is_first and self.is_last:
            logits = self._token_program(int(ids[0]), kv, pos0)
            if logits is not None:
                kv.n = pos0 + n
                return logits
        x = self._stage_input(ids)
        positions = np.arange(pos0, pos0 + n, dtype=np.int64)
        ropes: dict = {}
        h = self.norm(x, f"blk.{self.layers.start}.attn_norm.weight")
        if one:
            done = self._token_layers(x, h, kv, pos0, positions, ropes)
            if done is not None:
                kv.n = pos0 + n
                hn, logits = done
                return logits if logits is not None else self._output(x, hn)
        for il in self.layers:
            if one:
                hn = self._layer_token(il, x, h, kv, pos0, positions, ropes)
                if hn is not None:
                    h = hn
                    continue
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

"""The decoder-only transformer shared by every supported architecture.

An architecture module subclasses `Decoder` and sets the few switches where
the families differ (normalisation placement, QK-norm, activation, embedding
scale). The forward pass only talks to the `Runtime` (products by tensor
name, work over heads) and to `ops`; kernels and threads stay out of sight.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .. import ops
from ..config import ModelConfig
from ..gguf_file import ModelLoadError
from ..kv_cache import KVCache
from ..runtime import AttentionSpec, Runtime

_EMPTY = np.zeros(0, dtype=np.float32)


class Decoder:
    arch = ""
    activation = "silu"          # or "gelu" (tanh approximation)
    qk_norm = False              # RMS norm of each query/key head before RoPE
    post_norms = False           # extra norms after attention and FFN outputs (Gemma)
    embed_scale = False          # multiply embeddings by sqrt(n_embd) (Gemma)
    prescale_query = False       # scale queries before attention instead of the scores

    #: debugging hook: when set, called as tap(name, tensor) with intermediate tensors named as
    #: in llama.cpp's graph ("attn_norm-3", "kqv_out-3", "l_out-3", "result_norm", ...)
    tap: Callable[[str, np.ndarray], None] | None = None

    def __init__(self, cfg: ModelConfig, rt: Runtime):
        self.cfg = cfg
        self.rt = rt
        # a pipeline stage holds layers [lo, hi) only (Runtime.layers); the whole model by default
        lo, hi = getattr(rt, "layers", None) or (0, cfg.n_layer)
        self.layers = range(lo, hi)
        self.output_name = "output.weight" if rt.has("output.weight") else "token_embd.weight"
        self._check_tensors()
        self.freq_factors = rt.f32("rope_freqs.weight") if rt.has("rope_freqs.weight") else _EMPTY
        self._extras: dict[int, tuple] = {}
        self._specs: dict[int, AttentionSpec] = {}

    # -- structure -------------------------------------------------------------
    def layer_tensors(self, il: int) -> list[str]:
        names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down"]
        if self.qk_norm:
            names += ["attn_q_norm", "attn_k_norm"]
        if self.post_norms:
            names += ["post_attention_norm", "post_ffw_norm"]
        return [f"blk.{il}.{n}.weight" for n in names]

    # -- pipeline stages -----------------------------------------------------------
    @property
    def is_first(self) -> bool:
        """This model part embeds tokens (the first stage, or the whole model)."""
        return self.layers.start == 0

    @property
    def is_last(self) -> bool:
        """This model part ends with the output head (the last stage, or the whole model)."""
        return self.layers.stop == self.cfg.n_layer

    def stage_globals(self) -> list[str]:
        """The tensors outside the layers this part needs: the embedding, the output norm and head."""
        out = ["token_embd.weight"] if self.is_first else []
        return out + (["output_norm.weight", self.output_name] if self.is_last else [])

    def held_shapes(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """`shapes` for the tensors this part holds: layer 0's checks are made on its first layer."""
        lo = self.layers.start
        out = {}
        for name, shape in shapes.items():
            if lo and name.startswith("blk.0."):
                name = f"blk.{lo}." + name[len("blk.0."):]
            if name == "token_embd.weight" and not self.rt.has(name):
                continue  # a later stage with its own output matrix
            out.setdefault(name, shape)
        return out

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes the configuration implies for a few tensors (GGUF order), checked at load."""
        c = self.cfg
        return {
            "token_embd.weight": (c.n_embd, c.n_vocab),
            "blk.0.attn_q.weight": (c.n_embd, c.n_head * c.head_dim),
            "blk.0.attn_k.weight": (c.n_embd, c.n_head_kv * c.head_dim),
            "blk.0.attn_v.weight": (c.n_embd, c.n_head_kv * c.head_dim_v),
            "blk.0.ffn_up.weight": (c.n_embd, c.n_ff),
        }

    def _check_tensors(self) -> None:
        """Every tensor this part needs is there, with the shapes the configuration implies."""
        need = self.stage_globals()
        for il in self.layers:
            need += self.layer_tensors(il)
        missing = [n for n in need if not self.rt.has(n)]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ModelLoadError(f"{self.arch} model is missing tensor(s) {', '.join(missing[:3])}{more}")
        for name, shape in self.held_shapes(self.expected_shapes()).items():
            got = tuple(self.rt.shape(name))
            if got != shape:
                what = "vocabulary size does not match the embedding" if name == "token_embd.weight" else "shape mismatch"
                raise ModelLoadError(f"{name} has shape {list(got)}, expected {list(shape)} ({what})")

    # -- forward -----------------------------------------------------------------
    def norm(self, x: np.ndarray, name: str) -> np.ndarray:
        out = np.empty_like(x)
        ops.rms_norm(x, self.rt.f32(name), self.cfg.norm_eps, out)
        return out

    def add_norm(self, x: np.ndarray, y: np.ndarray, post: str | None, name: str) -> np.ndarray:
        """x += y (normalised by the `post` norm first, when given); returns norm `name` of x."""
        out = np.empty_like(x)
        ops.add_rms_norm(x, y, self.rt.f32(post) if post else _EMPTY, post is not None,
                         self.rt.f32(name), self.cfg.norm_eps, out)
        return out

    def forward(self, ids: np.ndarray, kv: KVCache, logit_rows: slice | None = None) -> np.ndarray:
        """Run tokens `ids` at positions kv.n.. and return logits for `logit_rows` (default: last)."""
        rt = self.rt
        state = rt.begin_pass(len(ids))  # `rt.step` without a generator: a token's Python runs cold
        try:
            out = self._forward(ids, kv, logit_rows)
        except BaseException:
            rt.end_pass(state, False)
            raise
        rt.end_pass(state, True)
        return out

    def forward_stage(self, inp: np.ndarray, kv: KVCache, logit_rows: slice | None = None) -> np.ndarray:
        """One pipeline stage (layers `self.layers`): token ids [n] in on the first stage, else the
        previous stage's hidden state [n, n_embd] float32; out the hidden state after this stage's
        last layer, or on the last stage the logits of `logit_rows` (as `forward`). Only the residual
        stream crosses stages: each stage norms it with its first layer's attn_norm, which gives the
        same bits as the fused add + norm of a single-process pass."""
        with self.rt.step(len(inp)):
            return self._forward(inp, kv, logit_rows)

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """The residual stream entering layer 0 for token ids (the embedding, scaled where the family does)."""
        x = self.rt.rows("token_embd.weight", ids)
        if self.embed_scale:
            x *= np.float32(math.sqrt(self.cfg.n_embd))
        return x

    def _stage_input(self, inp: np.ndarray) -> np.ndarray:
        if self.is_first:
            return self.embed(inp)
        return np.array(inp, dtype=np.float32, order="C")  # a copy: the residual is added in place

    def _next_norm(self, il: int) -> str:
        """The norm fused with layer il's last residual add: the next layer's input norm, the output
        norm after the model's last layer, or (at the end of an earlier stage, whose successor norms
        the residual itself) this layer's own input norm, whose result is not used."""
        if il + 1 == self.cfg.n_layer:
            return "output_norm.weight"
        return f"blk.{il + 1}.attn_norm.weight" if il + 1 < self.layers.stop else f"blk.{il}.attn_norm.weight"

    def _output(self, x: np.ndarray, h: np.ndarray) -> np.ndarray:
        """The end of a forward pass: the residual stream x for the next pipeline stage, or the
        logits of the output-normed rows h on the last stage."""
        if not self.is_last:
            return x
        (logits,) = self.rt.linear(h, (self.output_name,))
        if self.tap:
            self.tap("result_norm", h); self.tap("result_output", logits)
        return logits

    def _rope(self, il: int, positions: np.ndarray, ropes: dict) -> np.ndarray:
        """The cos/sin table of layer il's RoPE base at `positions` (made once per base and pass)."""
        c = self.cfg
        base = c.layer_rope_base(il)
        cs = ropes.get(base)
        if cs is None:
            cs = ropes[base] = ops.rope_cache(positions, c.rope_dims, base, c.rope_freq_scale, self.freq_factors,
                                              c.rope_ext_factor, c.rope_attn_factor, c.rope_corr[0], c.rope_corr[1])
        return cs

    def _attn_extras(self, il: int) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
        """Layer il's attention biases (q, k, v, output) and q/k norm weights; empty where absent."""
        got = self._extras.get(il)
        if got is None:
            rt, p = self.rt, f"blk.{il}."
            opt = lambda name: rt.f32(p + name) if rt.has(p + name) else _EMPTY  # noqa: E731
            got = self._extras[il] = (
                tuple(opt(f"attn_{t}.bias") for t in ("q", "k", "v", "output")),
                opt("attn_q_norm.weight") if self.qk_norm else _EMPTY,
                opt("attn_k_norm.weight") if self.qk_norm else _EMPTY)
        return got

    def attention_spec(self, il: int) -> AttentionSpec:
        """Layer il's attention as the runtime's one-token calls take it (made once per layer)."""
        spec = self._specs.get(il)
        if spec is None:
            c, p = self.cfg, f"blk.{il}."
            biases, qn, kn = self._attn_extras(il)
            spec = self._specs[il] = AttentionSpec(
                (p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"), p + "attn_output.weight",
                (c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v), c.layer_window(il), c.attn_scale, biases, qn, kn,
                c.norm_eps, c.rope_neox, self.prescale_query)
        return spec

    def attention(self, il: int, h: np.ndarray, kv: KVCache, pos0: int, positions: np.ndarray,
                  ropes: dict) -> np.ndarray:
        """Self-attention of layer il on normed input h [n, n_embd]; returns [n, n_embd] (before
        the residual add). A decoded token takes the runtime's one compiled call when it has one."""
        c, rt, tap = self.cfg, self.rt, self.tap
        n = h.shape[0]
        p = f"blk.{il}."
        names = (p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight")
        cs = self._rope(il, positions, ropes)
        lo = self.layers.start
        biases, qn, kn = self._attn_extras(il)
        if n == 1 and not tap:
            o = rt.attention_token(h, names, p + "attn_output.weight",
                                   (c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v), kv, il - lo, pos0,
                                   c.layer_window(il), c.attn_scale, biases=biases, q_norm=qn, k_norm=kn,
                                   eps=c.norm_eps, rope=cs, neox=c.rope_neox, prescale=self.prescale_query)
            if o is not None:
                return o
        q, k, v = rt.linear(h, names)
        for y, b in zip((q, k, v), biases):
            if b.size:
                y += b
        q = q.reshape(n, c.n_head, c.head_dim)
        k = k.reshape(n, c.n_head_kv, c.head_dim)
        v = v.reshape(n, c.n_head_kv, c.head_dim_v)
        if qn.size:
            ops.rms_norm_heads(q, qn, c.norm_eps)
            ops.rms_norm_heads(k, kn, c.norm_eps)
        if tap:
            tap(f"Qcur_normed-{il}", q); tap(f"Kcur_normed-{il}", k); tap(f"Vcur-{il}", v)
        ops.apply_rope(q, cs, c.rope_neox)
        ops.apply_rope(k, cs, c.rope_neox)
        scale = c.attn_scale
        if self.prescale_query:
            q *= np.float32(scale)
            scale = 1.0
        if tap:
            tap(f"Qrope-{il}", q); tap(f"Krope-{il}", k)
        att = rt.attention(q, k, v, kv, il - lo, pos0, c.layer_window(il), scale)  # stage KV: its own layers
        (o,) = rt.linear(att.reshape(n, -1), (p + "attn_output.weight",))
        if biases[3].size:
            o += biases[3]
        if tap:
            tap(f"kqv_out-{il}", att.reshape(n, -1))
        return o

    def _forward(self, ids: np.ndarray, kv: KVCache, logit_rows: slice | None) -> np.ndarray:
        c, rt = self.cfg, self.rt
        n = len(ids)
        pos0 = kv.n
        if pos0 + n > kv.n_ctx:
            raise ValueError(f"context full: {pos0 + n} tokens > {kv.n_ctx}")
        x = self._stage_input(ids)
        lo = self.layers.start
        tap = self.tap
        if tap:
            tap("inp_scaled", x)
        # a batch of sequences (engine/batch.py) gives each row its own position
        positions = kv.positions(n) if hasattr(kv, "positions") else np.arange(pos0, pos0 + n, dtype=np.int64)
        ropes: dict[float, np.ndarray] = {}
        h = self.norm(x, f"blk.{lo}.attn_norm.weight")
        for il in self.layers:
            p = f"blk.{il}."
            if tap:
                tap(f"attn_norm-{il}", h)
            o = self.attention(il, h, kv, pos0, positions, ropes)
            if tap:
                tap(f"attn_out-{il}", o)
            if il == c.n_layer - 1:
                # like llama.cpp, finish only the rows whose logits are wanted (which also
                # keeps the last FFN's products at llama.cpp's widths and numerics)
                sel = logit_rows if logit_rows is not None else slice(n - 1, n)
                o = np.ascontiguousarray(o[sel])
                x = np.ascontiguousarray(x[sel])
            h = self.add_norm(x, o, p + "post_attention_norm.weight" if self.post_norms else None,
                              p + "ffn_norm.weight")
            if tap:
                tap(f"sa_out-{il}", x); tap(f"ffn_norm-{il}", h)
            g, u, a = rt.gated(h, p + "ffn_gate.weight", p + "ffn_up.weight", self.activation)
            (d,) = rt.linear(a, (p + "ffn_down.weight",))
            if tap:
                tap(f"ffn_gate-{il}", g); tap(f"ffn_up-{il}", u); tap(f"ffn_geglu-{il}", a)
                tap(f"ffn_out-{il}", d)
            # the next layer's input norm (the output norm after the last layer) with the add
            h = self.add_norm(x, d, p + "post_ffw_norm.weight" if self.post_norms else None, self._next_norm(il))
            if tap:
                tap(f"l_out-{il}", x)
        kv.n = pos0 + n
        return self._output(x, h)

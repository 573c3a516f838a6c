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
from ..runtime import Runtime
from ..specs import AttentionSpec, DenseSpec, MLASpec, RoutedSpec, SharedSpec

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
        self._steps: dict[int, tuple | bool] = {}  # per layer: layer_token's fixed arguments, or False
        self._all_steps: list | None = None        # every layer's, when all have one (else [])
        self._prologue: tuple | None = None        # token_program's embedding, first norm and RoPE
        self._bases: list[float] | None = None     # the layers' RoPE bases (each step names one)

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
        self.add_norm_rows(x, y, post, name, out)(0, x.shape[0])
        return out

    def add_norm_rows(self, x: np.ndarray, y: np.ndarray | None, post: str | None, name: str,
                      out: np.ndarray) -> Callable:
        """`add_norm` of rows [t0, t1) into out, as f(t0, t1) (y given) or f(t0, t1, y) (y the
        rows' own array, e.g. a product's output): each row's steps are its own."""
        pw = self.rt.f32(post) if post else _EMPTY
        nw, eps, flag = self.rt.f32(name), self.cfg.norm_eps, post is not None

        def rows(t0: int, t1: int, y_: np.ndarray | None = None) -> None:
            yy = y if y_ is None else y_
            ops.add_rms_norm(x[t0:t1], yy[t0:t1], pw, flag, nw, eps, out[t0:t1])
        return rows

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
        return self._rope_of(self.cfg.layer_rope_base(il), positions, ropes)

    def _rope_bases(self) -> list[float]:
        """The RoPE bases of this part's layers (Gemma 3: one for its sliding-window layers, one for
        its global ones), in the order of the token calls' table of tables."""
        if self._bases is None:
            self._bases = sorted({self.cfg.layer_rope_base(il) for il in self.layers})
        return self._bases

    def _rope_of(self, base: float, positions: np.ndarray, ropes: dict) -> np.ndarray:
        c = self.cfg
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
        if n > 1 and not tap:  # a decode batch's rows (engine.batch): the one-token call over every row
            o = rt.rows_attention(self.attention_spec(il), h, il - lo, cs)
            if o is not None:
                return o
        if n == 1 and not tap:
            o = rt.attention_token(h, names, p + "attn_output.weight",
                                   (c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v), kv, il - lo, pos0,
                                   c.layer_window(il), c.attn_scale, biases=biases, q_norm=qn, k_norm=kn,
                                   eps=c.norm_eps, rope=cs, neox=c.rope_neox, prescale=self.prescale_query)
            if o is not None:
                return o
        def qk(t0: int, t1: int, outs: list) -> None:
            """Token-wise after the products (biases, QK-norms, RoPE, the query's scale), on the
            rows of the worker that computed them (`Runtime.linear`); taps see each step whole."""
            q, k, v = (y[t0:t1] for y in outs)
            for y, b in zip((q, k, v), biases):
                if b.size:
                    y += b
            m = t1 - t0
            q = q.reshape(m, c.n_head, c.head_dim)
            k = k.reshape(m, c.n_head_kv, c.head_dim)
            if qn.size:
                ops.rms_norm_heads(q, qn, c.norm_eps)
                ops.rms_norm_heads(k, kn, c.norm_eps)
            if tap:
                tap(f"Qcur_normed-{il}", q); tap(f"Kcur_normed-{il}", k)
                tap(f"Vcur-{il}", v.reshape(m, c.n_head_kv, c.head_dim_v))
            ops.apply_rope(q, cs[t0:t1], c.rope_neox)
            ops.apply_rope(k, cs[t0:t1], c.rope_neox)
            if self.prescale_query:
                q *= np.float32(c.attn_scale)
            if tap:
                tap(f"Qrope-{il}", q); tap(f"Krope-{il}", k)
        if tap:  # whole tensors for the taps: the products first, then the steps after them
            q, k, v = rt.linear(h, names)
            qk(0, n, [q, k, v])
        else:
            q, k, v = rt.linear(h, names, after=qk)
        q = q.reshape(n, c.n_head, c.head_dim)
        k = k.reshape(n, c.n_head_kv, c.head_dim)
        v = v.reshape(n, c.n_head_kv, c.head_dim_v)
        scale = 1.0 if self.prescale_query else c.attn_scale
        att = rt.attention(q, k, v, kv, il - lo, pos0, c.layer_window(il), scale)  # stage KV: its own layers
        (o,) = rt.linear(att.reshape(n, -1), (p + "attn_output.weight",))
        if biases[3].size:
            o += biases[3]
        if tap:
            tap(f"kqv_out-{il}", att.reshape(n, -1))
        return o

    #: a family with an attention of its own whose every call the batched decode pass runs row by
    #: row on each sequence's cache (engine.batch: DeepSeek's MLA); the shared attention always is
    rows_attention = False

    # -- a decoded token in one compiled call ----------------------------------------------------
    @classmethod
    def shares_attention(cls) -> bool:
        """Whether the family runs this class's attention (not one of its own, like DeepSeek's MLA
        on its latent cache): the one-token layer calls and batched decoding build on it."""
        return cls.attention is Decoder.attention

    def token_attention(self, il: int) -> AttentionSpec | MLASpec | None:
        """Layer il's attention as the runtime's one-token layer calls take it; None: no such call
        (this class's attention, or a family's own with a spec of its own: DeepSeek's `MLASpec`)."""
        return self.attention_spec(il) if self.shares_attention() else None

    def token_ffn(self, il: int) -> DenseSpec | RoutedSpec | SharedSpec | None:
        """Layer il's FFN as the runtime's one-token layer calls take it; None: no such call."""
        p = f"blk.{il}."
        return DenseSpec(p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight", self.activation)

    def _token_program(self, tok: int, kv: KVCache, pos0: int) -> np.ndarray | None:
        """A decoded token from its id to its logits in one runtime call (`Runtime.token_program`:
        `_token_layers` with the embedding, the first norm and the RoPE tables in the same call), on
        a model held whole by this process; else None."""
        steps = self._token_layers_steps()
        if not steps:
            return None
        return self.rt.token_program(tok, steps, kv, pos0, self._token_prologue(), self.output_name)

    def token_program_compile(self, kv: KVCache) -> Callable[[], None] | None:
        """The compile of the call `_token_program` makes for cache `kv`, to run ahead of the first
        decoded token (`Runtime.token_program_compile`); None when decoding has no such call."""
        if not (self.is_first and self.is_last):
            return None
        steps = self._token_layers_steps()
        if not steps:
            return None
        return self.rt.token_program_compile(steps, kv, self._token_prologue(), self.output_name)

    def _token_prologue(self) -> tuple:
        """token_program's prologue: embedding, its scale, the first norm, eps and RoPE (made once)."""
        pro = self._prologue
        if pro is None:
            c, il = self.cfg, self.layers.start
            pro = self._prologue = (
                "token_embd.weight", math.sqrt(c.n_embd) if self.embed_scale else 0.0, f"blk.{il}.attn_norm.weight",
                float(c.norm_eps), (int(c.rope_dims), np.array(self._rope_bases(), dtype=np.float64),
                                    float(c.rope_freq_scale), self.freq_factors, float(c.rope_ext_factor),
                                    float(c.rope_attn_factor), float(c.rope_corr[0]), float(c.rope_corr[1])))
        return pro

    def _token_layers(self, x: np.ndarray, h: np.ndarray, kv: KVCache, pos0: int, positions: np.ndarray,
                      ropes: dict) -> tuple[np.ndarray, np.ndarray | None] | None:
        """A decoded token's layers in one runtime call when every layer has one (`_layer_token`),
        with the output product on the last stage: (the last layer's normed output, the logits or
        None); else None."""
        steps = self._token_layers_steps()
        if not steps:
            return None
        tables = np.stack([self._rope_of(b, positions, ropes) for b in self._rope_bases()])
        return self.rt.token_layers(x, h, steps, kv, pos0, tables, self.output_name if self.is_last else None)

    def _rows_layers(self, x: np.ndarray, h: np.ndarray, positions: np.ndarray, ropes: dict) -> np.ndarray | None:
        """A decode batch's layers in one runtime call (`Runtime.rows_layers`), each row at its own
        position: the last layer's normed output, or None (the caller goes layer by layer)."""
        steps = self._token_layers_steps()
        if not steps:
            return None
        tables = np.stack([self._rope_of(b, positions, ropes) for b in self._rope_bases()])
        return self.rt.rows_layers(x, h, steps, tables)

    def _token_layers_steps(self) -> list:
        """Every layer's `_layer_token_step` when all have one, else []."""
        steps = self._all_steps
        if steps is None:
            ok = all(self._layer_token_step(il) is not False for il in self.layers)
            steps = self._all_steps = [self._steps[il] for il in self.layers] if ok else []
        return steps

    def _layer_token_step(self, il: int) -> tuple | bool:
        """layer_token's fixed arguments of layer il (made once), or False: no such call (a family's
        own attention, an FFN without one)."""
        step = self._steps.get(il)
        if step is None:
            rt, p = self.rt, f"blk.{il}."
            attn = self.token_attention(il)
            ffn = self.token_ffn(il) if attn is not None else None
            post = (rt.f32(p + "post_attention_norm.weight"), rt.f32(p + "post_ffw_norm.weight")) \
                if self.post_norms else (_EMPTY, _EMPTY)
            step = self._steps[il] = False if ffn is None else (
                attn, il - self.layers.start, rt.f32(p + "ffn_norm.weight"), ffn,
                rt.f32(self._next_norm(il)), self.cfg.norm_eps, *post,
                self._rope_bases().index(self.cfg.layer_rope_base(il)))
        return step

    def _layer_token(self, il: int, x: np.ndarray, h: np.ndarray, kv: KVCache, pos0: int, positions: np.ndarray,
                     ropes: dict) -> np.ndarray | None:
        """A decoded token's layer il in one runtime call (attention, residuals, norms, FFN): the
        next layer's normed input, or None (no such call): the caller runs the layer step by step."""
        step = self._layer_token_step(il)
        if step is False:
            return None
        attn, at, ffn_norm, ffn, next_norm, eps, post_attn, post_ffn, _rope_i = step
        return self.rt.layer_token(x, h, attn, kv, at, pos0, self._rope(il, positions, ropes), ffn_norm, ffn,
                                   next_norm, eps, post_attn, post_ffn)

    # -- the pass ----------------------------------------------------------------------------
    def _forward(self, ids: np.ndarray, kv: KVCache, logit_rows: slice | None) -> np.ndarray:
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
        if tap:
            tap("inp_scaled", x)
        # a batch of sequences (engine/batch.py) gives each row its own position
        positions = kv.positions(n) if hasattr(kv, "positions") else np.arange(pos0, pos0 + n, dtype=np.int64)
        ropes: dict[float, np.ndarray] = {}
        h = self.norm(x, f"blk.{self.layers.start}.attn_norm.weight")
        if n > 1 and not tap and self.rt.batch_rows and logit_rows is not None and \
                range(*logit_rows.indices(n)) == range(n):
            hn = self._rows_layers(x, h, positions, ropes)   # a decode batch's rows (engine.batch)
            if hn is not None:
                kv.n = pos0 + n
                return self._output(x, hn)
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
            x, h = self._layer(il, x, h, kv, pos0, positions, ropes, logit_rows)
        kv.n = pos0 + n
        return self._output(x, h)

    def _attention_step(self, il: int, x: np.ndarray, h: np.ndarray, kv: KVCache, pos0: int,
                        positions: np.ndarray, ropes: dict, logit_rows: slice | None
                        ) -> tuple[np.ndarray, np.ndarray]:
        """Layer il's attention on the normed h: (the residual x, the attention output), both cut
        at the last layer to the rows whose logits are wanted (as llama.cpp, which also keeps the
        last FFN's products at llama.cpp's widths and numerics)."""
        tap = self.tap
        if tap:
            tap(f"attn_norm-{il}", h)
        o = self.attention(il, h, kv, pos0, positions, ropes)
        if tap:
            tap(f"attn_out-{il}", o)
        if il == self.cfg.n_layer - 1:
            sel = logit_rows if logit_rows is not None else slice(x.shape[0] - 1, x.shape[0])
            o = np.ascontiguousarray(o[sel])
            x = np.ascontiguousarray(x[sel])
        return x, o

    def _layer(self, il: int, x: np.ndarray, h: np.ndarray, kv: KVCache, pos0: int, positions: np.ndarray,
               ropes: dict, logit_rows: slice | None) -> tuple[np.ndarray, np.ndarray]:
        """Layer il step by step on the residual x [n, n_embd] and its normed value h: (x, the next
        norm of x); x is updated in place (the last layer keeps only the rows whose logits are
        wanted)."""
        rt, tap = self.rt, self.tap
        p = f"blk.{il}."
        x, o = self._attention_step(il, x, h, kv, pos0, positions, ropes, logit_rows)
        post_a = p + "post_attention_norm.weight" if self.post_norms else None
        post_f = p + "post_ffw_norm.weight" if self.post_norms else None
        # the residual adds and norms token-wise on the rows of the worker that multiplies them
        # (`Runtime.gated`'s before, `linear`'s after): x holds the attention's add once gated
        # returns, the FFN's once down does
        h = np.empty_like(x)
        h_next = np.empty_like(x)   # the next layer's input norm (the output norm after the last)
        g, u, a = rt.gated(h, p + "ffn_gate.weight", p + "ffn_up.weight", self.activation,
                           before=self.add_norm_rows(x, o, post_a, p + "ffn_norm.weight", h))
        if tap:
            tap(f"sa_out-{il}", x); tap(f"ffn_norm-{il}", h)
            tap(f"ffn_gate-{il}", g); tap(f"ffn_up-{il}", u); tap(f"ffn_geglu-{il}", a)
        add_next = self.add_norm_rows(x, None, post_f, self._next_norm(il), h_next)
        (d,) = rt.linear(a, (p + "ffn_down.weight",), after=lambda t0, t1, outs: add_next(t0, t1, outs[0]))
        if tap:
            tap(f"ffn_out-{il}", d); tap(f"l_out-{il}", x)
        return x, h_next

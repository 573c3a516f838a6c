"""A decoded token's compiled calls: each sub-layer, each layer, the whole token.

`TokenCalls` is the part of `runtime.Runtime` that builds them: for each layer's attention
(`token_attention`, or DeepSeek's `mla_token`) and FFN (`expert_token`, `dense_token`) the compiled
call and every argument that does not change from token to token (job tables, outputs, norms,
gating, scratch), made once per layout and cache (`_TokenParts`); then a layer in one call
(`layer_token`), every layer (`token_layers`) and the token from its id to its logits
(`token_program`, `token_layer.token_runner`). The same functions in the same order as the
step-by-step path, so the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numba
import numpy as np

from . import kernels, ops
from .attention import SKIP_SLID_VALUES, one_token_attention, owners_attention, token_window
from .crew import CHUNK_FIELDS, STEALABLE, T_OUT, T_PREP, TASK_FIELDS, Crew, CrewError, link
from .dense_token import dense_runner
from .expert_token import (compose, concat_jobs, fixed_format, routed_runner, shared_fused_runner,
                           shared_runner)
from .gating import Gating
from .kv_cache import KVCache
from .mla_token import mla_block_runner
from .routing import TokenJournal
from .rows_ffn import rows_fused_runner
from .specs import AttentionSpec, DenseSpec, MLASpec, RoutedSpec, SharedSpec
from .token_attention import block_runner
from .token_layer import layer_runner, list_address, one_call_layers, token_runner, typed_layers

_EMPTY = np.zeros(0, dtype=np.float32)
_NO_TASKS = np.zeros((0, TASK_FIELDS), dtype=np.int64)
_NO_CHUNKS = np.zeros((0, CHUNK_FIELDS), dtype=np.int64)
_NO_JOB = (_NO_TASKS, _NO_CHUNKS, 0)
_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_WADDR = np.zeros((0, 0), dtype=np.int64)   # `compose`'s full tables: no compact addresses


@dataclass
class _TokenParts:
    """A compiled one-token sub-layer and its arguments that stay from token to token: `head` (and
    for attention `mid`, `win`, `tail`) around the per-token ones; `o` its output; a routed FFN's
    `routing`: (its ids output, the expert tensors) for `RoutingStats.record`; `first`: the job it
    starts with, which the layer before names to the waiting workers."""
    fn: Callable
    n_in: int
    head: tuple
    mid: tuple
    win: tuple
    tail: tuple
    o: np.ndarray
    routing: tuple = ()
    first: tuple = _NO_JOB   # (tasks, chunks, n_owned) of the first crew job it posts (`crew.ahead`)
    last: tuple = _NO_JOB    # and of the last (`crew.link`: none for routed experts, chosen per token)
    rows: Callable | None = None  # an FFN's same call over a decode batch's rows (`rows_ffn`)


@dataclass
class CachedCall:
    """A built one-token call kept per layer and cache: `ready` (None: the layer has no such call)
    holds while `lead` is still the crew's (a new crew builds it again)."""
    lead: Callable
    ready: _TokenParts | None



class TokenCalls:
    """`Runtime`'s one-token compiled calls (a mixin: it reads the runtime's groups, crew and
    expert tables)."""

    def attention_token(self, h: np.ndarray, qkv: tuple[str, str, str], output: str, shape: tuple[int, int, int, int],
                        kv: KVCache, il: int, pos0: int, window: int, scale: float, *,
                        biases: Sequence[np.ndarray] = (_EMPTY,) * 4, q_norm: np.ndarray = _EMPTY, k_norm: np.ndarray = _EMPTY,
                        eps: float = 0.0, rope: np.ndarray = _EMPTY, neox: bool = False, prescale: bool = False
                        ) -> np.ndarray | None:
        """A decoded token's attention sub-layer in one compiled call (token_attention.py): the
        q/k/v products of `qkv` (+ `biases` q, k, v, output; size 0 to skip), `q_norm`/`k_norm`
        per head, RoPE from `rope` (one token's row of ops.rope_cache), queries scaled first when
        `prescale`, attention over layer il's cache, the `output` product. `shape`: (n_head, n_kv,
        head_dim, head_dim_v). Returns o [1, n_embd], the same bits as the general path; None when
        there is no such call here (several tokens, no crew, float weights, a cache split between
        nodes): the caller takes the general path."""
        if h.shape[0] != 1 or not self.crewing:
            return None
        parts = self._attention_parts(AttentionSpec(qkv, output, shape, window, scale, tuple(biases), q_norm, k_norm,
                                                    eps, neox, prescale), kv, il)
        if parts is None:
            return None
        if h.shape[1] != parts.n_in:
            raise ValueError(f"input width {h.shape[1]} != row length {parts.n_in}")
        crew = self._crew
        start, base = token_window(pos0, window)
        if not parts.fn(crew.ctl, crew.n_workers, np.ascontiguousarray(h[0], dtype=np.float32), *parts.head, rope,
                        *parts.mid, pos0, *parts.win, start, base, *parts.tail):
            crew.stop()
            raise CrewError("a worker failed during attention")
        return parts.o.copy()

    def _attention_parts(self, spec: "AttentionSpec", kv: KVCache, il: int) -> "_TokenParts | None":
        """The compiled attention sub-layer of `spec` on layer il of `kv` with every argument that
        does not change from token to token (job tables, outputs, norms), made once per layout and
        cache; None when that layer has no such call (float weights). A cache split between nodes
        (several owners) takes `attention.owners_attention`: each owner's chunks on its node's
        workers."""
        if isinstance(spec, MLASpec):
            return self._mla_parts(spec, kv, il)
        per_kv = self._tparts.get(kv)
        if per_kv is None:
            per_kv = self._tparts[kv] = {}
        crew = self._crew
        key = (spec.qkv, spec.output, il)
        parts = per_kv.get(key)
        if parts is not None and parts.lead is crew.lead:
            return parts.ready
        g_qkv, g_out = self._group(spec.qkv), self._group((spec.output,))
        run_qkv, run_out = self._token_runner(g_qkv), self._token_runner(g_out)
        ready = None
        if run_qkv is not None and run_out is not None:
            n_head, n_kv, hd, hdv = spec.shape
            keys, values = self._token_jobs(kv, il, n_head // n_kv)
            q = np.empty((n_head, hd), dtype=np.float32)
            k = np.empty((n_kv, hd), dtype=np.float32)
            v = np.empty((n_kv, hdv), dtype=np.float32)
            o = np.empty((1, g_out.rows[0]), dtype=np.float32)
            b = spec.biases
            jq, jo = g_qkv.job, g_out.job
            chain = [(jq.tasks, jq.chunks, jq.n_owned), keys, values, (jo.tasks, jo.chunks, jo.n_owned)]
            for before, after in zip(chain, chain[1:]):
                link(before, after)
            attend, kc, vc = self._cache_args(kv, il)
            ready = _TokenParts(
                block_runner(run_qkv, attend, run_out), g_qkv.ne0,
                ((jq.tasks, jq.chunks, jq.n_owned), q, k, v, b[0], b[1], b[2], spec.q_norm, spec.k_norm, spec.eps),
                (spec.neox, spec.prescale, keys, values, kc, vc),
                (spec.window, spec.scale), (kv.cap, (jo.tasks, jo.chunks, jo.n_owned), o[0], b[3]), o,
                first=chain[0], last=chain[-1])
        per_kv[key] = CachedCall(crew.lead, ready)
        return ready

    def _cache_args(self, kv, il: int) -> tuple[Callable, object, object]:
        """The compiled one-token attention for cache `kv` and its layer il's keys and values as
        it takes them: one owner's arrays, or the owners' tuples (a cache split between nodes)."""
        if kv.n_workers == 1:
            return one_token_attention(self._crew.lead), kv.keys3(il, 0), kv.v[il][0]
        return (owners_attention(self._crew.lead), tuple(kv.keys3(il, o) for o in range(kv.n_workers)),
                tuple(kv.v[il]))

    def routed_token(self, h: np.ndarray, router: str, gating: Gating, gate: str | None, up: str, down: str,
                     activation: str = "silu") -> np.ndarray | None:
        """A decoded token's routed FFN (router product, `gating`, the k experts, their weighted sum)
        in one compiled call with the crew, bit-identical to `linear` on the router, the gating
        functions and `moe`; the experts are recorded in `routing` as `moe` does. None when there
        is no such call here (several tokens, no crew, a router that is not float32, experts
        without a compiled path): the caller routes and calls `moe`."""
        if h.shape[0] != 1 or not self.crewing:
            return None
        parts = self._routed_parts(RoutedSpec(router, gating, gate, up, down, activation))
        if parts is None:
            return None
        crew = self._crew
        if not parts.fn(crew.ctl, crew.n_workers, np.ascontiguousarray(h, dtype=np.float32), *parts.head):
            crew.stop()
            raise CrewError("a worker failed during an expert product")
        self._record_routing(parts)
        return parts.o.copy()

    def _record_routing(self, parts: "_TokenParts") -> None:
        if self.routing is not None and parts.routing:
            ids, names = parts.routing
            self.routing.record(names[-2], ids[None], names)

    def _routed_parts(self, spec: "RoutedSpec") -> "_TokenParts | None":
        """`routed_runner` of `spec` with every argument that does not change from token to token
        (job tables, gating, scratch, outputs), made once per layout; None when there is no such
        call (a router that is not float32, experts without a compiled path)."""
        crew = self._crew
        key = (spec.router, spec.gate, spec.up, spec.down)
        cached = self._rparts.get(key)
        if cached is not None and cached.lead is crew.lead:
            return cached.ready
        ready = None
        rgroup = self._group((spec.router,))
        entry = self._token_experts(spec.gate, spec.up, spec.down) if rgroup.prep_types == [kernels.F32] else None
        if entry is not None:
            if rgroup.job is None:
                rgroup.job = self._crew_job(rgroup)
            _lead, runner, gu, dn, _r, _n, rows = entry
            g_ = spec.gating
            k = g_.k
            g, u, act, d, out, n_ff = self._token_scratch(entry, k, spec.gate is None)
            ids = np.empty(k, dtype=np.int64)
            wts = np.empty(k, dtype=np.float32)
            logits = np.empty(rgroup.rows[0], dtype=np.float32)
            job = rgroup.job
            names = tuple(n for n in (spec.gate, spec.up, spec.down) if n)
            ready = _TokenParts(
                routed_runner(crew.lead, runner), rgroup.ne0,
                (job.tasks, job.chunks, job.n_owned, logits, g_.kind, k, g_.bias, g_.n_groups, g_.n_group_used,
                 g_.norm, g_.scale, ids, wts, *gu, *dn, g, u, act, d, out[0], n_ff,
                 ops.activation_kind(spec.activation), ops.GELU_F16),
                (), (), (), out, (ids, names), first=(job.tasks, job.chunks, job.n_owned), rows=rows)
        self._rparts[key] = CachedCall(crew.lead, ready)
        return ready

    def _dense_parts(self, spec: DenseSpec) -> "_TokenParts | None":
        """`dense_token.dense_runner` of `spec` with its job tables and scratch, made once per layout;
        None when there is no such call (float weights, more than two activation formats)."""
        crew = self._crew
        key = ("dense", spec.gate, spec.up, spec.down)
        cached = self._rparts.get(key)
        if cached is not None and cached.lead is crew.lead:
            return cached.ready
        ready = None
        g_gu, g_d = self._group((spec.gate, spec.up)), self._group((spec.down,))
        run_gu, run_d = self._token_runner(g_gu), self._token_runner(g_d)
        if run_gu is not None and run_d is not None and g_gu.rows[0] == g_gu.rows[1] == g_d.ne0:
            g = np.empty((1, g_gu.rows[0]), dtype=np.float32)
            u, act = np.empty_like(g), np.empty_like(g)
            out = np.empty((1, g_d.rows[0]), dtype=np.float32)
            jg, jd = g_gu.job, g_d.job
            link((jg.tasks, jg.chunks, jg.n_owned), (jd.tasks, jd.chunks, jd.n_owned))
            ready = _TokenParts(
                dense_runner(run_gu, run_d), g_gu.ne0,
                ((jg.tasks, jg.chunks, jg.n_owned), g, u, act, (jd.tasks, jd.chunks, jd.n_owned), out[0],
                 ops.activation_kind(spec.activation), ops.GELU_F16),
                (), (), (), out, first=(jg.tasks, jg.chunks, jg.n_owned), last=(jd.tasks, jd.chunks, jd.n_owned))
        self._rparts[key] = CachedCall(crew.lead, ready)
        return ready

    def _ffn_parts(self, spec: "RoutedSpec | DenseSpec | SharedSpec") -> "_TokenParts | None":
        if isinstance(spec, SharedSpec):
            return self._shared_parts(spec)
        return self._routed_parts(spec) if isinstance(spec, RoutedSpec) else self._dense_parts(spec)

    def _shared_parts(self, spec: SharedSpec) -> "_TokenParts | None":
        """`expert_token.shared_fused_runner` of `spec` where its jobs can be merged, else
        `shared_runner`: the routed FFN's parts (the template's, not run, in a dense layer) and the
        dense FFN's, their outputs added; None when either has no call."""
        fused = self._fused_parts(spec)
        if fused is not None:
            return fused
        r = self._routed_parts(spec.routed or spec.template)
        d = self._dense_parts(spec.dense)
        if r is None or d is None:
            return None
        out = np.empty_like(d.o)
        on = spec.routed is not None
        return _TokenParts(shared_runner(r.fn, d.fn), d.n_in, (on, r.head, d.first, d.head, r.o, d.o, out), (), (), (),
                           out, r.routing if on else (), first=r.first if on else d.first, last=d.last)

    def _fused_parts(self, spec: SharedSpec) -> "_TokenParts | None":
        """`shared_fused_runner`'s arguments for `spec`, made once per layout: the router's job and
        the shared (or dense) gate/up job merged, the down job's tasks reading prepared input 1
        into output 1, the routed experts' compact tables and the scratch. None where the jobs
        cannot share a call: fused gate/up experts, a router that is not float32, or the experts
        and the dense FFN quantizing their inputs apart."""
        crew = self._crew
        t, dn = spec.routed or spec.template, spec.dense
        key = ("fused", t.router, t.gate, t.up, t.down, dn.gate, dn.up, dn.down, spec.routed is not None)
        cached = self._rparts.get(key)
        if cached is not None and cached.lead is crew.lead:
            return cached.ready
        ready = None
        rgroup = self._group((t.router,))
        types_x = [self.weights[n].ggml_type for n in (t.gate, t.up, dn.gate, dn.up) if n]
        types_a = [self.weights[n].ggml_type for n in (t.down, dn.down)]
        entry = None
        if (t.gate is not None and rgroup.prep_types == [kernels.F32]
                and len({kernels.prepare_key(x) for x in types_x}) == 1
                and len({kernels.prepare_key(x) for x in types_a}) == 1
                and None not in (kernels.preparer(types_x[0]), kernels.preparer(types_a[0]))):
            entry = self._token_experts(t.gate, t.up, t.down)
        g_gu, g_d = self._group((dn.gate, dn.up)), self._group((dn.down,))
        if entry is not None and self._token_runner(g_gu) is not None and self._token_runner(g_d) is not None:
            if rgroup.job is None:
                rgroup.job = self._crew_job(rgroup)
            _lead, _runner, gu, dtab, _r, _n, _rows = entry
            rj, gj, dj = rgroup.job, g_gu.job, g_d.job
            tb = gj.tasks.copy()
            tb[:, T_PREP] = 1
            tb[:, T_OUT] += 1
            if spec.routed is not None:
                j1 = concat_jobs(rj.tasks.copy(), rj.chunks, rj.n_owned, tb, gj.chunks, gj.n_owned)
                j1 = (j1[0], j1[1], j1[2] | ((rj.n_owned | gj.n_owned) & STEALABLE))
            else:
                j1 = (tb, gj.chunks.copy(), gj.n_owned)
            td = dj.tasks.copy()
            td[:, T_PREP] = 1
            td[:, T_OUT] = 1
            sd = (td, dj.chunks.copy(), dj.n_owned)
            g_ = t.gating
            k = g_.k
            g, u, act, d, out, n_ff = self._token_scratch(entry, k, False)
            n_sh = g_gu.rows[0]
            ids = np.empty(k, dtype=np.int64)
            on = spec.routed is not None
            fam_x, fam_a = kernels.q8_family(types_x[0]), kernels.q8_family(types_a[0])
            if self.mixed_q8 and min(fam_x, fam_a) >= 0:   # one function for every layer's formats
                prep_x = prep_a = kernels.activations.quantize_q8_0_or_K
            else:
                prep_x, prep_a = fixed_format(kernels.preparer(types_x[0])), fixed_format(kernels.preparer(types_a[0]))
            ready = _TokenParts(
                shared_fused_runner(crew.lead, prep_x, prep_a), g_gu.ne0,
                (on, j1, np.empty(rgroup.rows[0], dtype=np.float32), g_.kind, k, g_.bias, g_.n_groups,
                 g_.n_group_used, g_.norm, g_.scale, ids, np.empty(k, dtype=np.float32), *gu, *dtab, sd, g, u, act,
                 d, np.empty((1, n_sh), dtype=np.float32), np.empty((1, n_sh), dtype=np.float32),
                 np.empty((1, n_sh), dtype=np.float32), np.empty(g_d.rows[0], dtype=np.float32), out, n_ff,
                 ops.activation_kind(t.activation), ops.GELU_F16, fam_x, fam_a),
                (), (), (), out, (ids, tuple(n for n in (t.gate, t.up, t.down) if n)) if on else (),
                first=j1, last=sd, rows=rows_fused_runner(crew.lead, prep_x, prep_a))
        self._rparts[key] = CachedCall(crew.lead, ready)
        return ready

    def _sub_job(self, name: str) -> tuple:
        """One token's per-head products of a 3-D tensor (MLA's attn_k_b / attn_v_b: sub-matrix i
        times input row i into output row i) as a crew job (tasks, chunks, owned), made once per
        layout: `sub_products`' tasks for every head."""
        w = self.weights[name]
        m = self.n_sub(name)
        heads = np.arange(m, dtype=np.int64)
        tasks, chunks = compose(*self._expert_table((name,), [w], [0], [w.rows // m]), heads, heads, _NO_WADDR)
        return tasks, chunks, chunks.shape[0] | STEALABLE

    def _mla_parts(self, spec: MLASpec, kv, il: int) -> "_TokenParts | None":
        """The compiled MLA sub-layer (`mla_token.mla_block_runner`) of `spec` on layer il of the
        latent cache (one owner or several), with its job tables and scratch, made once per layout
        and cache;
        None when a product has no compiled path (float weights)."""
        per_kv = self._tparts.setdefault(kv, {})
        crew = self._crew
        key = ("mla", spec.output, il)
        parts = per_kv.get(key)
        if parts is not None and parts.lead is crew.lead:
            return parts.ready
        ready = None
        g1, g_out = self._group(spec.first), self._group((spec.output,))
        g_qb = self._group((spec.q_b,)) if spec.q_b else None
        run1, run_out = self._token_runner(g1), self._token_runner(g_out)
        run_qb = self._token_runner(g_qb) if g_qb is not None else run1
        preps = [kernels.preparer(self.weights[n].ggml_type, floats=True) for n in (spec.k_b, spec.v_b)]
        if None not in (run1, run_out, run_qb, *preps):
            H, lora = spec.n_head, kv.kv_lora
            j1 = (g1.job.tasks, g1.job.chunks, g1.job.n_owned)
            qa = np.empty(g1.rows[0], dtype=np.float32)
            ckv = np.empty(g1.rows[1], dtype=np.float32)
            if g_qb is not None:
                jqb = (g_qb.job.tasks, g_qb.job.chunks, g_qb.job.n_owned)
                q = np.empty(g_qb.rows[0], dtype=np.float32)
                qa_norm = self.f32(spec.q_a_norm)
            else:
                jqb, q, qa_norm = j1, qa, _EMPTY
            jkb, jvb = self._sub_job(spec.k_b), self._sub_job(spec.v_b)
            keys, values = self._token_jobs(kv, il, H)
            jo = (g_out.job.tasks, g_out.job.chunks, g_out.job.n_owned)
            chain = [j1] + ([jqb] if g_qb is not None else []) + [jkb, keys, values, jvb, jo]
            for before, after in zip(chain, chain[1:]):
                link(before, after)
            width = kv.width
            attend, kc, vc = self._cache_args(kv, il)
            o = np.empty((1, g_out.rows[0]), dtype=np.float32)
            dv = self.weights[spec.v_b].rows // H
            ready = _TokenParts(
                mla_block_runner(run1, run_qb, crew.lead, preps[0], preps[1], attend, run_out),
                g1.ne0,
                (j1, qa, ckv, qa_norm, float(spec.eps), jqb, q, jkb, np.empty((H, spec.nope), dtype=np.float32),
                 np.empty((H, lora), dtype=np.float32)),
                (bool(spec.neox), int(spec.nope), self.f32(spec.kv_norm), keys, values, kc, vc,
                 np.empty((H, width), dtype=np.float32), np.empty((1, width), dtype=np.float32),
                 np.empty((1, lora), dtype=np.float32)),
                (0, float(spec.scale)), (kv.cap, jvb, np.empty((H, dv), dtype=np.float32), jo, o[0]), o,
                first=chain[0], last=chain[-1])
        per_kv[key] = CachedCall(crew.lead, ready)
        return ready

    def layer_token(self, x: np.ndarray, h: np.ndarray, attention: "AttentionSpec", kv: KVCache, il: int,
                    pos0: int, rope: np.ndarray, ffn_norm: np.ndarray, ffn: "RoutedSpec | DenseSpec",
                    next_norm: np.ndarray, eps: float, post_attn: np.ndarray = _EMPTY,
                    post_ffn: np.ndarray = _EMPTY) -> np.ndarray | None:
        """A decoded token's whole layer in one compiled call (`token_layer`): the attention
        sub-layer of `attention` on normed input h, x += its output (normed by `post_attn` first,
        when given), the `ffn_norm` norm, the routed or dense FFN `ffn`, x += its output (normed by
        `post_ffn` first, when given); returns x normed by `next_norm` (the next layer's input
        norm), the same bits as the calls one by one. x is updated in place. None when either half
        has no compiled call here: the caller runs the layer step by step."""
        if h.shape[0] != 1 or not self.crewing:
            return None
        a = self._attention_parts(attention, kv, il)
        f = self._ffn_parts(ffn) if a is not None else None
        if f is None:
            return None
        crew = self._crew
        fn = layer_runner(a.fn, f.fn)
        start, base = token_window(pos0, attention.window)
        hn = np.empty_like(x)
        if not fn(crew.ctl, crew.n_workers, x, np.ascontiguousarray(h, dtype=np.float32), a.head, rope, a.mid, pos0,
                  a.win, start, base, a.tail, a.o, ffn_norm, f.head, f.o, next_norm, eps, hn, post_attn, post_ffn,
                  f.first, _NO_JOB):
            crew.stop()
            raise CrewError("a worker failed during a layer")
        self._record_routing(f)
        return hn

    def token_layers(self, x: np.ndarray, h: np.ndarray, steps: Sequence[tuple], kv: KVCache, pos0: int,
                     ropes: np.ndarray, output: str | None = None) -> tuple[np.ndarray, np.ndarray | None] | None:
        """A decoded token's layers in one compiled call (`token_layer.token_runner`): for each step
        (AttentionSpec, layer in the cache, ffn norm weight, RoutedSpec or DenseSpec, next norm
        weight, eps, post-attention norm weight, post-FFN norm weight (size 0: none), RoPE base
        index) what `layer_token` does, with the RoPE table ropes[index] ([bases, 1, rope dims / 2,
        2]); the layers' fixed arguments kept per cache as a typed list; x is updated in place.
        Returns (the last layer's output normed by its next norm, the logits [1, rows] of
        `output` times it when that product runs in the same call, else None). None when a layer
        has no compiled call or the layers' calls differ (tensor types): the caller goes layer by
        layer."""
        if h.shape[0] != 1 or not self.crewing:
            return None
        crew = self._crew
        ready = self._token_parts(kv, self._steps_key("token", steps, output),
                                  lambda: self._token_layers(steps, kv, output))
        if ready is None:
            return None
        fn, (layers_at, _typed), journal, out_job, h_last = ready  # _typed: alive for the call
        logits = np.empty(out_job[3], dtype=np.float32)
        ok = fn(crew.ctl, crew.n_workers, x, np.ascontiguousarray(h, dtype=np.float32), layers_at, ropes, pos0,
                SKIP_SLID_VALUES, journal.ids, journal.written, out_job, logits)
        self._token_done(ok, journal)
        if out_job[3]:
            return h_last, logits.reshape(1, -1)
        return h_last.copy(), None

    def token_program(self, tok: int, steps: Sequence[tuple], kv: KVCache, pos0: int, prologue: tuple,
                      output: str) -> np.ndarray | None:
        """A decoded token from its id to its logits [1, rows of `output`] in one compiled call:
        `token_layers` with the embedding row, its scale, the first norm and the RoPE table of pos0
        done in the same call (the Python around them ran cold after each token's weights streamed
        through the caches). prologue: (embedding tensor, scale or 0, first norm weight tensor, eps,
        (rope dims, base, freq scale, freq factors, ext factor, attn factor, corr lo, corr hi)).
        None when there is no such call (see `token_layers`; an embedding split between workers
        or kept in an engine layout). The prologue's RoPE base is an array: every base the steps'
        indexes name."""
        if not self.crewing:
            return None
        crew = self._crew
        ready = self._token_parts(kv, self._steps_key("program", steps, output),
                                  lambda: self._token_layers(steps, kv, output, prologue))
        if ready is None:
            return None
        fn, (pro_at, layers_at, *_lists), journal, out_job, _h = ready  # _lists: alive for the call
        logits = np.empty(out_job[3], dtype=np.float32)
        ok = fn(crew.ctl, crew.n_workers, tok, pos0, pro_at, layers_at, SKIP_SLID_VALUES, journal.ids,
                journal.written, out_job, logits)
        self._token_done(ok, journal)
        return logits.reshape(1, -1)

    def token_program_compile(self, steps: Sequence[tuple], kv: KVCache, prologue: tuple,
                              output: str) -> Callable[[], None] | None:
        """`token_program`'s compiled call for these steps and cache, made ready without running a
        token: its parts are built now (typed lists, the routing journal, the crew's product
        runners; milliseconds once compiled), and the returned function compiles the call itself
        for exactly the argument types `token_program` will pass. That compile is the long part
        of a first start (26 s on the AVX2-only EPYC for the default model) and touches no state
        of this runtime, so a caller can run it without the engine's lock while a prompt is
        evaluated. None when there is no such call."""
        if self._crew is None:  # the crew `begin_pass` would start (not started here)
            self._crew = Crew(self.pool, self.n_workers)
        ready = self._token_parts(kv, self._steps_key("program", steps, output),
                                  lambda: self._token_layers(steps, kv, output, prologue))
        if ready is None:
            return None
        fn, (pro_at, layers_at, *_lists), journal, out_job, _h = ready
        crew = self._crew
        args = (crew.ctl, crew.n_workers, 0, 0, pro_at, layers_at, SKIP_SLID_VALUES, journal.ids,
                journal.written, out_job, np.empty(0, dtype=np.float32))
        sig = tuple(numba.typeof(a) for a in args)
        return lambda: fn.compile(sig)

    def _token_done(self, ok: bool, journal: TokenJournal) -> None:
        """After a token's compiled call: raise if a worker failed; count the journal when due."""
        if not ok:
            self._crew.stop()
            raise CrewError("a worker failed during a token's layers")
        if journal.keys and journal.due and self.routing is not None:
            self.routing.read_journals()

    def _steps_key(self, kind: str, steps: Sequence[tuple], output: str | None) -> tuple:
        """(kind, the steps' layers, output), made once per steps object (the memo holds it, so its
        id is not reused)."""
        memo = self._step_keys.get((kind, id(steps), output))
        if memo is None or memo[0] is not steps:
            memo = self._step_keys[(kind, id(steps), output)] = (steps, (kind, tuple(s[1] for s in steps), output))
        return memo[1]

    def _token_parts(self, kv: KVCache, key: tuple, build: Callable[[], tuple | None]) -> tuple | None:
        """The parts of a token's compiled call kept per cache under `key`, made by `build` (again
        when the crew changed); None when there is no such call."""
        per_kv = self._tparts.get(kv)
        if per_kv is None:
            per_kv = self._tparts[kv] = {}
        cached = per_kv.get(key)
        if cached is None or cached.lead is not self._crew.lead:
            cached = per_kv[key] = CachedCall(self._crew.lead, build())
        return cached.ready

    def _token_layers(self, steps: Sequence[tuple], kv: KVCache, output: str | None,
                      prologue: tuple | None = None) -> tuple | None:
        """`token_layers`' compiled call, its typed list of the layers' fixed arguments, the routing
        journal, the output product's job (its row count 0: none) and the last layer's output;
        None when there is no such call. With `prologue` (see `token_program`) the call starts from
        the token id, and its arguments are (the prologue's typed list, the layers')."""
        fns, layers, keys = set(), [], []
        k = 0
        last = first = _NO_JOB
        for attention, il, ffn_norm, ffn, next_norm, eps, post_attn, post_ffn, rope_i in steps:
            a = self._attention_parts(attention, kv, il)
            f = self._ffn_parts(ffn) if a is not None else None
            if f is None:
                return None
            link(last, a.first)   # the token's jobs in the order it posts them
            if first is _NO_JOB:
                first = a.first
            link(a.last, f.first)
            last = f.last
            fns.add((a.fn, f.fn))
            ids = _NO_IDS
            if f.routing:  # routed experts: the journal's row for this layer
                ids, names = f.routing
                keys.append((names[-2], names))
                k = ids.shape[0]
            layers.append((a.head, a.mid, int(attention.window), float(attention.scale), a.tail, a.o, ffn_norm,
                           f.head, f.o, next_norm, float(eps), np.empty_like(f.o), ids, post_attn, post_ffn,
                           int(rope_i), a.first, f.first))
        typed = one_call_layers(layers, fns)
        if typed is None:
            return None
        (attn, ffn), = fns
        run_out = None
        out_job = (_NO_TASKS, _NO_CHUNKS, 0, 0)
        if output is not None:
            g = self._group((output,))
            run_out = self._token_runner(g) if len(g.rows) == 1 else None
            if run_out is not None:
                out_job = (g.job.tasks, g.job.chunks, g.job.n_owned, g.rows[0])
                link(last, out_job)
                link(out_job, first)   # and the next token's first job (while the Python between runs)
        jkey = (tuple(keys), k)
        journal = self._journals.get(jkey)
        if journal is None:  # one per set of layers, kept for the runtime's life
            journal = self._journals[jkey] = TokenJournal(keys, k)
            if self._routing is not None and keys:
                self._routing.attach(journal)
        if prologue is not None:
            name, scale, norm, eps, rope = prologue
            embed = kernels.dequantizer(self.weights[name].ggml_type)
            emb = self.layout.full_array(name)
            if run_out is None or embed is None or emb is None:
                return None
            pro = typed_layers(((emb, float(scale), self.f32(norm), float(eps), *rope),))
            fn = token_runner(attn, ffn, numba.typeof(typed), run_out, embed, numba.typeof(pro))
            # the lists ride along: their addresses are valid while they live
            return fn, (list_address(pro), list_address(typed), pro, typed), journal, out_job, None
        fn = token_runner(attn, ffn, numba.typeof(typed), run_out)
        return fn, (list_address(typed), typed), journal, out_job, layers[-1][11]

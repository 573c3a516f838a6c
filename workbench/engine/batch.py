"""Batched decoding: several sequences, each with its own KV cache, advance one token per pass.

`decode_batch` runs one forward pass for N sequences (one new token each): the crew's workers
take the products as rows jobs (`crew.rows_job`: each weight piece read once for all rows), and
the attention, MLA and mixture-of-experts sub-layers run as one compiled call each over the rows
(`rows_attention`, `rows_mla`, `rows_ffn`). A sequence's numbers must not depend on what else is
in the batch: every product output is the one-token kernel's dot and every row's attention the
one-token attention over its own cache at its own position, so a greedy sequence decoded in any
batch gives `Session.generate`'s tokens, to the bit. Without the crew (NUMAWB_CREW=0), products
are matrix-matrix in pieces small enough to keep the one-column order (`EXACT_COLUMNS`: ggml's
multi-column products take other float orders for some types).

The request scheduler over these passes is `engine.scheduler`.
"""

from __future__ import annotations

import copy
import weakref
from typing import Callable, NamedTuple, Sequence

import numba
import numpy as np

from . import kernels, ops
from .attention import SKIP_SLID_VALUES, combine_row_jobs, one_token_attention, rows_token_attention, token_window
from .crew import CHUNK_FIELDS, TASK_FIELDS, Crew, CrewError, rows_job
from .engine import Engine, Session
from .events import ContextFullError
from .kernels.q8_0_rows import ONES, q8_0_rows_vnni
from .kv_cache import KVCache
from .rows_attention import rows_block_runner
from .rows_layers import rows_pass_runner
from .rows_mla import rows_mla_runner
from .runtime import USE_CREW, After, Before, then_after
from .specs import AttentionSpec, MLASpec, RoutedSpec, SharedSpec
from .token_layer import list_address, one_call_layers, typed_layers


# ----------------------------------------------------------------------------- the batched pass
# Most types' matrix-matrix kernels give each column exactly the one-column (matvec) result;
# these take other float orders from some column count on (ggml's, which ours follow): Q4_K
# (in the file's layout or llama.cpp's repacked one) and Q2_K the gemm for whole tiles of 4 columns, Q6_K,
# Q5_K, Q3_K and IQ4_XS the tiled matmul from 8 columns, F32 tinyBLAS from 2, F16 tinyBLAS from 1.
# A batch is cut into pieces of at most this many rows for them (F16: row by row, which takes the
# one-token path). tests/test_server_batch.py checks the table on every type.
EXACT_COLUMNS = {kernels.Q4_K: 3, kernels.Q4_K_X8: 3, kernels.Q2_K: 3, kernels.Q6_K: 7, kernels.Q5_K: 7,
                 kernels.Q3_K: 7, kernels.IQ4_XS: 7, kernels.F32: 1, kernels.F16: 0}


def _many_row_kernels(types) -> bool:
    """Every product has a kernel that runs several rows per weight load and keeps each row's
    one-row numbers (Q8_0 on AVX-512 VNNI: `q8_0_rows_vnni`; the Q8_0 and Q5_0 row pairs'
    `few_columns`)."""
    vnni = kernels.kernel_path() == "avx512-vnni"
    return all((t == kernels.Q8_0 and vnni) or t in (kernels.Q8_0_X2, kernels.Q5_0_X2) for t in types)


def exact_columns(types) -> int:
    """Rows a product over weights of these types may take at once and stay per-row exact
    (0: one row at a time)."""
    return min([EXACT_COLUMNS.get(int(t), 1 << 30) for t in types])


class _BatchRuntime:
    """The runtime as `Decoder._forward` sees it during a batched pass: products through
    `_Products`, attention per row on that row's own cache; everything else is the runtime's."""

    def __init__(self, rt, caches: list[KVCache]):
        self._rt, self._caches = rt, caches

    def __getattr__(self, name: str):
        return getattr(self._rt, name)

    def linear(self, x: np.ndarray, names: tuple[str, ...], after: After | None = None) -> list[np.ndarray]:
        """A group of products over n rows in one hand-off to the workers (each its own row
        range of each weight, as `Runtime.linear`): Q8_0 by q8_0_rows_vnni on VNNI; other types
        by matmat in pieces of at most `exact_columns` rows (F16: matvec row by row); then
        `after` over all rows (`Runtime.linear`'s token-wise work)."""
        return then_after(after, self._linear(x, names))

    def _linear(self, x: np.ndarray, names: tuple[str, ...]) -> list[np.ndarray]:
        rt = self._rt
        x = np.ascontiguousarray(x)
        n = x.shape[0]
        group = rt._group(names)
        types = [t for t, _, _ in group.jobs]
        if group.small or exact_columns(types) < n or not _many_row_kernels(types):
            # the crew's workers: one job, each weight piece read once and run per row from L1
            outs = rt.rows_products(group, x)
            if outs is not None:
                return outs
        # a large product (the output matrix) whose many-row kernels keep the one-row numbers for
        # all n rows: those (half the instructions a row), at the cost of one crew stop and start
        if x.shape[1] != group.ne0:
            raise ValueError(f"input width {x.shape[1]} != row length {group.ne0}")
        xps = [kernels.prepare(t, x) for t in group.prep_types]
        outs = [np.empty((n, rows), dtype=np.float32) for rows in group.rows]
        if set(types) == {kernels.Q8_0} and kernels.kernel_path() == "avx512-vnni":
            xq, xd, _ = xps[0]
            xu = xq.view(np.uint8) ^ np.uint8(0x80)

            def work(wk: int) -> None:
                for (_, plan, _), out in zip(group.jobs, outs):
                    arr, first, lo, hi = plan[wk]
                    if hi > lo:
                        q8_0_rows_vnni(arr, xu, xd, ONES, out[:, first:first + arr.shape[0]], lo - first,
                                       hi - first)
            rt.each_worker(work)
            return outs
        step = exact_columns(types)
        if n < 8 and set(types) <= {kernels.Q4_0, kernels.Q5_0}:
            step = 0  # their matmat tiles are 8 columns wide: below that, row by row is cheaper
        pieces = [(a, min(a + max(step, 1), n)) for a in range(0, n, max(step, 1))]

        def work(wk: int) -> None:
            for (qtype, plan, p), out in zip(group.jobs, outs):
                arr, first, lo, hi = plan[wk]
                if hi <= lo:
                    continue
                part = out[:, first:first + arr.shape[0]]
                for a, b in pieces:
                    if step == 0:  # one row: the one-token kernel
                        kernels.matvec(qtype, arr, tuple(t[a] for t in xps[p]), part[a], lo - first, hi - first)
                    else:
                        kernels.matmat(qtype, arr, tuple(t[a:b] for t in xps[p]), part[a:b], lo - first,
                                       hi - first)
        rt.each_worker(work)
        return outs

    def rows_ffn(self, spec, h: np.ndarray) -> np.ndarray | None:
        """A mixture-of-experts FFN (`RoutedSpec`, or `SharedSpec` with shared experts) over every
        row in one compiled call (`rows_ffn`: the one-token call's steps per row, experts grouped
        over the rows); None where the one-token call has no compiled form (the caller's steps)."""
        rt = self._rt
        if not rt.crewing or not isinstance(spec, (RoutedSpec, SharedSpec)):
            return None
        fused = isinstance(spec, SharedSpec)
        parts = rt._fused_parts(spec) if fused else rt._routed_parts(spec)
        if parts is None or parts.rows is None:
            return None
        n = h.shape[0]
        key = ("ffn", id(parts), n)
        hit = rt._rows_jobs.get(key)
        if hit is None or hit[0] is not parts:
            hit = rt._rows_jobs[key] = (parts, *_rows_ffn_args(parts.head, n, fused))
        _parts, args, ids, out = hit
        crew = rt.crew
        if not parts.rows(crew.ctl, crew.n_workers, np.ascontiguousarray(h, dtype=np.float32), *args):
            crew.stop()
            raise CrewError("a worker failed during an expert product")
        if rt.routing is not None and parts.routing:
            names = parts.routing[1]
            rt.routing.record(names[-2], ids, names)
        return out

    def gated(self, x: np.ndarray, gate: str, up: str, activation: str, before: Before | None = None):
        if before is not None:
            before(0, x.shape[0])
        g, u = self._linear(x, (gate, up))
        a = np.empty_like(g)
        ops.apply_activation(activation, g, u, a)
        return g, u, a

    def attention(self, q, k, v, kv, il, pos0, window, scale):
        # (pos0 is the batch stand-in; each row attends at its own cache position)
        return np.concatenate([self._one(q[i:i + 1], k[i:i + 1], v[i:i + 1], c, il, window, scale)
                               for i, c in enumerate(self._caches)])

    def mla_attention(self, q, rows, kv, il, pos0, scale):
        """DeepSeek's latent attention, each row on its own cache at its own position (the
        runtime's one-token call: the single-sequence decode's operations in its order)."""
        return np.concatenate([self._rt.mla_attention(q[i:i + 1], rows[i:i + 1], c, il, c.n, scale)
                               for i, c in enumerate(self._caches)])

    def rows_attention(self, spec: AttentionSpec, h: np.ndarray, il: int, rope: np.ndarray) -> np.ndarray | None:
        """The shared attention sub-layer over every row in one compiled call (`rows_attention`),
        each row on layer il of its own one-owner cache at its own position (rope [n, rot / 2, 2]
        or size 0); None where the one-token call has none (the caller's steps)."""
        rt = self._rt
        caches = self._caches
        if not rt.crewing or any(c.n_workers != 1 for c in caches):
            return None
        parts = [rt._attention_parts(spec, c, il) for c in caches]
        if any(p is None for p in parts):
            return None
        fn, args = self._rows_static(("rows-attn", spec.output, il), lambda: self._rows_attention_args(spec, parts))
        rows = self._rows_caches(("rows-attn", il), spec, parts)
        crew = rt.crew
        pos0s = np.array([c.n for c in caches], dtype=np.int64)
        if not fn(crew.ctl, crew.n_workers, np.ascontiguousarray(h, dtype=np.float32), *args[:10], rope, *args[10:12],
                  *rows, pos0s, *args[12:]):
            crew.stop()
            raise CrewError("a worker failed during attention")
        return args[-2]

    batch_rows = True

    def rows_layers(self, x: np.ndarray, h: np.ndarray, steps: Sequence[tuple], ropes: np.ndarray) -> np.ndarray | None:
        """Every layer of the pass in one compiled call (`rows_layers.rows_pass_runner`): `steps`
        as `Runtime.token_layers` takes them (`Decoder._token_layers_steps`), ropes [bases, n,
        rot / 2, 2] each row's RoPE per base; x (the residual) is updated in place. Returns the
        last layer's output normed by its next norm; None when a layer has no rows call or the
        layers' calls differ (the caller goes layer by layer: the same numbers)."""
        rt, caches = self._rt, self._caches
        owners = caches[0].n_workers
        if not rt.crewing or not steps or any(c.n_workers != owners for c in caches):
            return None
        # (a model's steps are one list per layer range; the pass's model is a copy, which may make its own)
        static = self._rows_static(("rows-pass", owners, steps[0][1], len(steps)),
                                   lambda: self._rows_pass_static(steps))
        if static is None:
            return None
        run = self._rows_pass_caches(steps, static)
        if run is None:
            return None
        crew = rt.crew
        pos0s = np.array([c.n for c in caches], dtype=np.int64)
        if not run.fn(crew.ctl, crew.n_workers, x, np.ascontiguousarray(h, dtype=np.float32), static.at, run.items_at,
                      run.jobs_at, ropes, pos0s, static.pass_ids):
            crew.stop()
            raise CrewError("a worker failed during a batch's layers")
        rt.rows_passes += 1
        if rt.routing is not None and static.keys:
            rt.routing.record_pass(static.keys, static.pass_ids)
        return static.h_last

    def _rows_pass_static(self, steps: Sequence[tuple]) -> _PassStatic | None:
        """`rows_layers`' fixed part for this row count and crew: each layer's attention and FFN
        arguments as `rows_mla` / `rows_attention` and `rows_ffn` pass them (built from the first
        row's one-token parts; the rows' caches come apart), as a typed list; None when a layer
        has no rows call or the layers' calls or argument types differ."""
        rt, caches = self._rt, self._caches
        n, c0 = len(caches), caches[0]
        layers, keys, fns = [], [], set()
        k = 1
        for attention, il, ffn_norm, ffn, next_norm, eps, post_a, post_f, rope_i in steps:
            mla = isinstance(attention, MLASpec)
            if not mla and (c0.n_workers != 1 or not isinstance(attention, AttentionSpec)):
                return None
            if not isinstance(ffn, (RoutedSpec, SharedSpec)):
                return None
            ap = rt._mla_parts(attention, c0, il) if mla else rt._attention_parts(attention, c0, il)
            fused = isinstance(ffn, SharedSpec)
            fp = rt._fused_parts(ffn) if fused else rt._routed_parts(ffn)
            if ap is None or fp is None or fp.rows is None:
                return None
            if mla:
                afn, args = self._rows_mla_args(attention, [ap], n)
                a_pre, a_mid, a_post, o = args[:10], args[10:13], args[13:], args[-1]
            else:
                afn, args = self._rows_attention_args(attention, [ap] * n)
                a_pre, a_mid, a_post, o = args[:10], args[10:12], args[12:], args[-2]
            f_args, ids, out = _rows_ffn_args(fp.head, n, fused)
            f_ids = ids[:0]
            if fp.routing:   # a routed layer: its experts go to the pass's journal row
                f_ids, names = ids, fp.routing[1]
                keys.append((names[-2], names))
                k = ids.shape[1]
            fns.add((afn, fp.rows))
            layers.append((a_pre, a_mid, a_post, o, ffn_norm, f_args, out, f_ids, next_norm, float(eps),
                           np.empty_like(out), post_a, post_f, int(rope_i)))
        typed = one_call_layers(layers, fns)
        if typed is None:
            return None
        (attn, ffn_fn), = fns
        return _PassStatic(typed, list_address(typed), np.zeros((len(keys), n, k), dtype=np.int64), keys,
                           layers[-1][10], attn, ffn_fn)

    def _rows_pass_caches(self, steps: Sequence[tuple], static: _PassStatic) -> _PassCaches | None:
        """`rows_layers`' part that changes when a request joins or leaves: every layer's rows'
        cache entries (`_cache_row`), layer after layer, and each layer's combined attention jobs
        (`_combined_jobs`), as typed lists, with the compiled pass for their types. One entry, for
        the last set of sequences (it holds their caches)."""
        rt, caches = self._rt, self._caches
        hit = rt._rows_jobs.get(("rows-pass-caches",))
        if hit is not None and hit.static is static and len(hit.refs) == len(caches) and all(
                r() is c for r, c in zip(hit.refs, caches)):
            return hit
        items, jobs = [], []
        combined = all(c.n_workers == 1 for c in caches)
        for attention, il, *_rest in steps:
            parts_of = rt._mla_parts if isinstance(attention, MLASpec) else rt._attention_parts
            parts = [parts_of(attention, c, il) for c in caches]
            if any(p is None for p in parts):
                return None
            row = [_cache_row(attention, p) for p in parts]
            items.extend(row)
            jobs.append(_combined_jobs(row, combined))
        ti, tj = typed_layers(tuple(items), check=False), typed_layers(tuple(jobs), check=False)
        fn = rows_pass_runner(static.attn, static.ffn, numba.typeof(static.typed), numba.typeof(ti), numba.typeof(tj))
        hit = rt._rows_jobs[("rows-pass-caches",)] = _PassCaches(tuple(weakref.ref(c) for c in caches), static, fn,
                                                                 list_address(ti), list_address(tj), (ti, tj))
        return hit

    def _rows_static(self, key: tuple, build: Callable[[], tuple]) -> tuple:
        """A layer's rows call and its arguments that depend only on the row count and the crew
        (rows jobs, scratch), made once (`Runtime._rows_jobs`, cleared with the layout)."""
        rt = self._rt
        key = key + (len(self._caches),)
        hit = rt._rows_jobs.get(key)
        if hit is None or hit[0] is not rt.crew.lead:
            hit = rt._rows_jobs[key] = (rt.crew.lead, build())
        return hit[1]

    def _rows_caches(self, key: tuple, spec: AttentionSpec | MLASpec, parts: list) -> tuple:
        """The typed list of each row's cache arguments (`_cache_row`) for this batch's sequences,
        and their attention jobs combined (`_combined_jobs`), kept with the first cache's one-token parts until the sequences or their parts
        change (a server's batch changes as requests join and leave: one entry per layer)."""
        caches = self._caches
        per = self._rt._tparts.setdefault(caches[0], {})
        key = key + (len(caches),)
        hit = per.get(key)
        if (hit is None or any(r() is not c for r, c in zip(hit[0], caches))
                or any(a is not b for a, b in zip(hit[1], parts))):
            items = tuple(_cache_row(spec, p) for p in parts)
            keys, values = _combined_jobs(items, all(c.n_workers == 1 for c in caches))
            per[key] = hit = (tuple(weakref.ref(c) for c in caches), list(parts),
                              (typed_layers(items, check=False), keys, values))
        return hit[2]

    def _rows_attention_args(self, spec: AttentionSpec, parts: list) -> tuple[Callable, tuple]:
        rt = self._rt
        n = len(parts)
        g_qkv, g_out = rt._group(spec.qkv), rt._group((spec.output,))
        run_qkv, run_out = rt.product_runner(g_qkv, rows=True), rt.product_runner(g_out, rows=True)
        (jq, q, k, v, bq, bk, bv, q_norm, k_norm, eps) = parts[0].head
        (neox, prescale, *_rest) = parts[0].mid
        (window, scale) = parts[0].win
        (_cap, jo, o, bo) = parts[0].tail
        fn = rows_block_runner(run_qkv, rows_token_attention(rt.crew.lead), run_out, combined=True)
        return fn, (_rows_table(jq, n), np.empty((n,) + q.shape, np.float32), np.empty((n,) + k.shape, np.float32),
                    np.empty((n,) + v.shape, np.float32), bq, bk, bv, q_norm, k_norm, eps, neox, prescale,
                    int(window), bool(SKIP_SLID_VALUES), float(scale), _rows_table(jo, n),
                    np.empty((n, q.shape[0] * v.shape[1]), np.float32), np.empty((n, o.shape[-1]), np.float32), bo)

    def rows_mla(self, spec: MLASpec, h: np.ndarray, il: int, rope: np.ndarray) -> np.ndarray | None:
        """DeepSeek's MLA sub-layer over every row in one compiled call (`rows_mla`), each row on
        layer il of its own latent cache at its own position (rope [n, rot / 2, 2]); None where the
        one-token call has none (the caller's steps)."""
        rt = self._rt
        caches = self._caches
        if not rt.crewing or len({c.n_workers for c in caches}) != 1:
            return None
        parts = [rt._mla_parts(spec, c, il) for c in caches]
        if any(p is None for p in parts):
            return None
        fn, args = self._rows_static(("rows-mla", spec.output, il, caches[0].n_workers),  # (owners: their attention)
                                     lambda: self._rows_mla_args(spec, parts, len(caches)))
        rows = self._rows_caches(("rows-mla", il), spec, parts)
        crew = rt.crew
        pos0s = np.array([c.n for c in caches], dtype=np.int64)
        o = args[-1]
        if not fn(crew.ctl, crew.n_workers, np.ascontiguousarray(h, dtype=np.float32), *args[:10], rope, *args[10:13],
                  *rows, pos0s, *args[13:]):
            crew.stop()
            raise CrewError("a worker failed during attention")
        return o

    def _rows_mla_args(self, spec: MLASpec, parts: list, n: int) -> tuple[Callable, tuple]:
        """`rows_mla_runner` and its arguments but the input, RoPE, the rows' caches and positions:
        the one-token parts' jobs as rows jobs, scratch for n rows."""
        rt = self._rt
        (j1, _qa, _ckv, qa_norm, eps, jqb, _q, jkb, qn, q_abs) = parts[0].head
        (neox, nope, kv_norm, _k, _v, _kc, _vc, _qcat, _krow, _lat) = parts[0].mid
        (cap, jvb, vb_out, jo, o) = parts[0].tail
        g1, g_out = rt._group(spec.first), rt._group((spec.output,))
        g_qb = rt._group((spec.q_b,)) if spec.q_b else None
        run1, run_out = rt.product_runner(g1, rows=True), rt.product_runner(g_out, rows=True)
        run_qb = rt.product_runner(g_qb, rows=True) if g_qb is not None else run1
        preps = [kernels.preparer(rt.weights[nm].ggml_type, floats=True) for nm in (spec.k_b, spec.v_b)]
        combined = self._caches[0].n_workers == 1
        attend = rows_token_attention(rt.crew.lead) if combined else rt._cache_args(self._caches[0], 0)[0]
        H = q_abs.shape[0]

        def job(j, stride: int = 1) -> tuple:
            return _rows_table(j, n, stride)
        qa = np.empty((n, g1.rows[0]), np.float32)
        q = np.empty((n, g_qb.rows[0]), np.float32) if g_qb is not None else qa
        fn = rows_mla_runner(run1, run_qb, rt.crew.lead, preps[0], preps[1], attend, run_out, combined)
        return fn, (job(j1), qa, np.empty((n, g1.rows[1]), np.float32), qa_norm, eps,
                    job(jqb) if g_qb is not None else job(j1), q, job(jkb, H), np.empty((n * H, qn.shape[1]), np.float32),
                    np.empty((n, q_abs.size), np.float32), neox, nope, kv_norm, float(spec.scale), job(jvb, H),
                    np.empty((n * H, q_abs.shape[1]), np.float32), np.empty((n, vb_out.size), np.float32), job(jo),
                    np.empty((n, o.shape[-1]), np.float32))

    def sub_products(self, name: str, x: np.ndarray) -> np.ndarray:
        """x [m, n, ne0] through sub-matrix i of 3-D `name` for x[i] (MLA's attn_k_b / attn_v_b
        per head): one matvec per (head, row) as one token's, all in one job (`Runtime.moe`'s
        expert products), never the prompt's matmat."""
        rt = self._rt
        m, n, k = x.shape
        if n == 1:
            return rt.sub_products(name, x)
        heads = np.arange(m * n, dtype=np.int64).reshape(m, n)
        (out,) = rt._expert_products((name,), x.reshape(m * n, k), [(i, heads[i], heads[i]) for i in range(m)], m * n)
        return out.reshape(m, n, -1)

    def _one(self, q, k, v, kv: KVCache, il: int, window: int, scale: float) -> np.ndarray:
        """One row's attention over its own cache at its own position: the one-token attention in
        one compiled call (with the crew's workers when they run the pass, else on this thread
        for a cache on one node), else the runtime's general path for one token; all are the
        single-sequence decode's operations in its order."""
        rt = self._rt
        pos0 = kv.n
        if rt.crewing or kv.n_workers != 1 or not USE_CREW:
            return rt.attention(q, k, v, kv, il, pos0, window, scale)
        keys, values = rt._token_jobs(kv, il, q.shape[1] // kv.cfg.n_head_kv)
        start, base = token_window(pos0, window)
        crew = _solo_crew(rt.pool)
        out, ok = one_token_attention(crew.lead)(crew.ctl, 1, keys, values, q[0], k[0], v[0], kv.k[il][0],
                                                 kv.v[il][0], pos0, window, scale, start, base, kv.cap)
        if not ok:
            raise RuntimeError("attention failed")
        return out.reshape(1, q.shape[1], -1)


_NO_ROWS_JOB = (np.zeros((0, TASK_FIELDS), np.int64), np.zeros((0, CHUNK_FIELDS), np.int64), 0)


def _cache_row(spec: AttentionSpec | MLASpec, p) -> tuple:
    """A row's cache arguments for the rows attention calls, from its one-token parts `p`: (keys
    job, values job, keys, values, capacity)."""
    mid = p.mid[3:7] if isinstance(spec, MLASpec) else p.mid[2:6]
    return (*mid, p.tail[0])


def _combined_jobs(items: list | tuple, combined: bool) -> tuple:
    """The rows' keys and values jobs combined into one job each (`attention.combine_row_jobs`)
    for one-owner caches; else empty tables (each row runs its own)."""
    if not combined:
        return _NO_ROWS_JOB, _NO_ROWS_JOB
    return tuple(combine_row_jobs([it[i] for it in items]) for i in (0, 1))


class _PassStatic(NamedTuple):
    """`rows_layers`' part fixed for a row count and crew."""
    typed: object            # the layers' typed list (alive for `at`)
    at: int                  # its `list_address`
    pass_ids: np.ndarray     # [routed layers, n, k]: the pass's routed experts
    keys: list               # each routed layer's (tensor, expert tensors) for `RoutingStats`
    h_last: np.ndarray       # the last layer's normed output
    attn: Callable           # the layers' one attention call
    ffn: Callable            # and FFN call


class _PassCaches(NamedTuple):
    """`rows_layers`' part for one set of sequences (rebuilt when a request joins or leaves)."""
    refs: tuple              # weakrefs of the sequences' caches
    static: _PassStatic      # the fixed part it was made for
    fn: Callable             # the compiled pass for these lists' types
    items_at: int            # `list_address` of every layer's rows' cache entries
    jobs_at: int             # and of each layer's combined attention jobs
    lists: tuple             # the two typed lists (alive for the addresses)


def _rows_table(job: tuple, n: int, x_stride: int = 1) -> tuple:
    """A one-token job (tasks, chunks, n_owned) over n rows as the compiled calls take it."""
    t = rows_job(job, n, x_stride)
    return t.tasks, t.chunks, t.n_owned


def _rows_ffn_args(head: tuple, n: int, fused: bool) -> tuple[tuple, np.ndarray, np.ndarray]:
    """The arguments of `rows_ffn`'s runners for n rows, from the one-token call's (`head` of
    `Runtime._fused_parts` / `_routed_parts`): its jobs as rows jobs, its expert tables, scratch
    n times as big; and of those, the routed ids [n, k] and the output [n, n_embd]."""
    def flat(size: int) -> np.ndarray:
        return np.empty((1, size), dtype=np.float32)
    if fused:
        (on, j1, logits, kind, k, bias, n_groups, n_group_used, norm, scale, _ids, _wts, *tables) = head[:20]
        (sd, _g, _u, _act, _d, gs, _us, _acts, ds, out1, n_ff, act_kind, gelu, fam_x, fam_a) = head[20:]
    else:
        (rt_, rc_, ro_, logits, kind, k, bias, n_groups, n_group_used, norm, scale, _ids, _wts, *rest) = head
        tables = rest[:8]
        g, u, d, out1, n_ff, act_kind, gelu = rest[8], rest[9], *rest[11:]   # (rest[10]: the one-token act)
    pairs = n * k
    ids = np.empty((n, k), np.int64)
    routing = (np.empty((n, logits.shape[0]), np.float32), kind, bias, n_groups, n_group_used, norm, scale, ids,
               np.empty((n, k), np.float32), *tables)
    if fused:
        sh, n_embd = gs.shape[1], ds.shape[0]
        out = np.empty((n, out1.shape[1]), np.float32)
        return (on, _rows_table(j1, n), *routing, _rows_table(sd, n), flat(pairs * n_ff), flat(pairs * n_ff),
                np.empty((pairs, n_ff), np.float32), flat(pairs * n_embd), np.empty((n, sh), np.float32),
                np.empty((n, sh), np.float32), np.empty((n, sh), np.float32), np.empty((n, n_embd), np.float32), out,
                n_ff, act_kind, gelu, fam_x, fam_a), ids, out
    out = np.empty((n, out1.shape[0]), np.float32)
    return (_rows_table((rt_, rc_, ro_), n), *routing, flat(pairs * (g.shape[0] // k)),
            flat(1 if u.shape[0] == 1 else pairs * n_ff), np.empty((pairs, n_ff), np.float32),
            flat(pairs * (d.shape[0] // k)), out, n_ff, act_kind, gelu), ids, out


_SOLO: dict[int, Crew] = {}


def _solo_crew(pool) -> Crew:
    """A one-worker crew: its compiled jobs run on the calling thread (no workers launched)."""
    crew = _SOLO.get(id(pool))
    if crew is None or crew.pool is not pool:
        crew = _SOLO[id(pool)] = Crew(pool, 1)
        crew.start()
    return crew


class _BatchKV:
    """Stands in for the cache in `Decoder._forward`: row i is at its own cache's position;
    the forward's final `kv.n = pos0 + n` advances every cache by its one token."""

    n_ctx = 1 << 62

    def __init__(self, caches: list[KVCache]):
        self.caches = caches

    def positions(self, n: int) -> np.ndarray:
        return np.array([c.n for c in self.caches], dtype=np.int64)

    @property
    def n(self) -> int:
        return 0

    @n.setter
    def n(self, value: int) -> None:
        assert value == len(self.caches)
        for c in self.caches:
            c.n += 1


def batchable(model) -> bool:
    """Whether one forward pass can carry several sequences: the shared attention runs each row on
    its own cache (`_BatchRuntime.attention`), DeepSeek's MLA each row on its latent cache
    (`_BatchRuntime.mla_attention`); another attention of its own decodes its rows one after
    another instead (the same bits)."""
    return model.shares_attention() or model.rows_attention


def decode_batch(engine: Engine, sessions: list[Session], tokens: list[int]) -> np.ndarray:
    """Append one token to each session's cache in one forward pass; logits [n, n_vocab].

    Row i's logits are those `sessions[i].eval([tokens[i]])` gives, to the bit, whatever the
    other rows. The caller holds `engine.lock` (one pass at a time).
    """
    if not _one_pass(engine, sessions, len(tokens), "one token per session, at least one session"):
        return np.stack([s.eval([int(t)]) for s, t in zip(sessions, tokens)])
    logits = _rows_forward(engine, sessions, np.asarray(tokens, dtype=np.int64))
    for s, t in zip(sessions, tokens):
        s.tokens.append(int(t))
    return logits


def stage_batch(engine: Engine, sessions: list[Session], inp: np.ndarray) -> np.ndarray:
    """`decode_batch` for a pipeline stage (`Engine.load(layers=...)`): one new position per
    session, `inp` token ids on the first stage, else the previous stage's hidden rows
    [n, n_embd]; returns this stage's hidden rows, or on the last stage the logits [n, n_vocab].
    Row i's numbers are those of `sessions[i].forward_stage` for its row alone. The caller holds
    `engine.lock`."""
    if not _one_pass(engine, sessions, len(inp), "one input row per session, at least one session"):
        return np.concatenate([s.forward_stage(inp[i:i + 1], s.kv.n) for i, s in enumerate(sessions)])
    return _rows_forward(engine, sessions, inp)


def _one_pass(engine: Engine, sessions: list[Session], n: int, shape_error: str) -> bool:
    """Check a batch of one new position per session (ValueError: `shape_error`; ContextFullError:
    a full cache); whether it runs as one pass (more than one row, a batchable model)."""
    if len(sessions) != n or not sessions:
        raise ValueError(shape_error)
    for s in sessions:
        if s.kv.n + 1 > s.kv.n_ctx:
            raise ContextFullError(f"context full: {s.kv.n} + 1 tokens exceed n_ctx {s.kv.n_ctx}")
    return len(sessions) > 1 and batchable(engine.model)


def _rows_forward(engine: Engine, sessions: list[Session], inp: np.ndarray) -> np.ndarray:
    """The model's forward over one row per session, each row on its own cache."""
    caches = [s.kv for s in sessions]
    view = copy.copy(engine.model)
    view.rt = _BatchRuntime(engine.rt, caches)
    with engine.rt.step(len(inp), rows=True):
        return view._forward(inp, _BatchKV(caches), slice(0, len(inp)))

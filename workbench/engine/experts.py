"""The runtime's routed experts: 3-D weights whose sub-matrix e is rows [e*n, (e+1)*n) as 2-D.

`ExpertPaths` is the part of `runtime.Runtime` that multiplies by them: a layer's routed experts
for many tokens (`moe`: tokens grouped by expert so each routed expert's rows are read once, as
ggml's mul_mat_id), one token's in one compiled call with the crew (`expert_token`), the per-head
products of MLA's 3-D attn_k_b / attn_v_b (`sub_products`), and the per-expert crew tables those
calls compose their jobs from; a short prompt's routed experts and per-head products as crew jobs
(`prompt_jobs`, the tokens sorted by expert). Every output row is one vec_dot per (row, token)
whatever the grouping and thread count.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numba
import numpy as np

from . import kernels, ops, prompt_jobs
from .crew import (C_OWNER, C_SPAN, C_TASK, STEALABLE, T_NCOL, T_OUT, T_OUTOFF, T_OUTROW, T_TYPE, T_W, T_XROW,
                   TASK_FIELDS, CrewError, Job, Table)
from .expert_token import expert_runner, fixed_format
from .handoff import product_seconds
from .kernels.jitcache import JIT
from .prompt_jobs import EXPERT_ROWS
from .rows_ffn import rows_routed_runner

# one token: a worker's rows of an expert in pinned pieces of this many rows (a multiple of the
# kernels' 8-row groups): the pieces a worker of the same node may take over at the end
STEAL_ROWS = 64

_EXPERT_LOOPS: dict = {}


def _expert_loop(qtype: int) -> Callable:
    """A compiled (GIL-free) loop over one expert's rows [lo, hi) in pieces of `step` rows, each
    piece multiplied by every listed input row (`ins`, rows of the prepared 2-D inputs) into row
    `outrows[j]` of `out` from column `off`: the weights stay in cache while the tokens pass.
    Every output is what ggml's mul_mat_id computes for that many tokens: with a type's
    `mul_mat_id_kernel` (several tokens per unpacked weight block; `rows` is the expert's full row
    count, which decides llama.cpp's repacking), else the type's matvec per row and token."""
    key = (kernels.kernel_path(), qtype)
    fn = _EXPERT_LOOPS.get(key)
    if fn is None:
        mv = kernels.matvec_kernels()[qtype]
        idk = kernels.mul_mat_id_kernel(qtype)
        if kernels.preparer(qtype) is None:  # float weights: one prepared array
            @numba.njit(**JIT)
            def fn(w, xp, ins, out, outrows, off, lo, hi, step, rows):
                xa = xp[0]
                for c0 in range(lo, hi, step):
                    c1 = min(c0 + step, hi)
                    for j in range(ins.shape[0]):
                        mv(w, (xa[ins[j]],), out[outrows[j]][off:], c0, c1)
        elif idk is None:
            @numba.njit(**JIT)
            def fn(w, xp, ins, out, outrows, off, lo, hi, step, rows):
                xa, xb, xc = xp
                for c0 in range(lo, hi, step):
                    c1 = min(c0 + step, hi)
                    for j in range(ins.shape[0]):
                        r = ins[j]
                        mv(w, (xa[r], xb[r], xc[r]), out[outrows[j]][off:], c0, c1)
        else:
            @numba.njit(**JIT)
            def fn(w, xp, ins, out, outrows, off, lo, hi, step, rows):
                xa, xb, xc = xp
                n = ins.shape[0]
                if n == 1:  # one token: the matvec, no gathering
                    r = ins[0]
                    mv(w, (xa[r], xb[r], xc[r]), out[outrows[0]][off:], lo, hi)
                    return
                ga = np.empty((n, xa.shape[1]), xa.dtype)
                gb = np.empty((n, xb.shape[1]), xb.dtype)
                gc = np.empty((n, xc.shape[1]), xc.dtype)
                for j in range(n):
                    ga[j] = xa[ins[j]]
                    gb[j] = xb[ins[j]]
                    gc[j] = xc[ins[j]]
                og = np.empty((n, hi), np.float32)
                for c0 in range(lo, hi, step):
                    idk(w, (ga, gb, gc), og, c0, min(c0 + step, hi), rows)
                for j in range(n):
                    out[outrows[j]][off + lo:off + hi] = og[j, lo:hi]
        _EXPERT_LOOPS[key] = fn
    return fn


def warm_expert_loops(types: Iterable[int]) -> None:
    """Compile (or load from the disk cache) `_expert_loop` for these expert tensor types with the
    argument types a prompt passes: the engine does it while a mixture-of-experts model loads, so
    its first prompt does not stop for seconds to compile the experts' products."""
    for t in types:
        k = 256
        w = np.zeros((8, kernels.row_bytes(t, k)), np.uint8)
        xp = kernels.prepare(t, np.zeros((2, k), np.float32))
        _expert_loop(t)(w, xp, np.arange(2, dtype=np.int64), np.zeros((2, 8), np.float32),
                        np.arange(2, dtype=np.int64), 0, 0, 8, EXPERT_ROWS, 8)


class ExpertPaths:
    """`Runtime`'s expert products (a mixin: it reads the runtime's weights, plans and crew)."""

    def n_sub(self, name: str) -> int:
        """Sub-matrices of a 3-D tensor (experts, or heads of MLA's attn_k_b/attn_v_b); 1 for 2-D."""
        shape = self.weights[name].info.shape
        return int(shape[2]) if len(shape) >= 3 else 1

    def _expert_plan(self, name: str, e: int) -> list[tuple[np.ndarray, int, int, int]]:
        """Per worker: (rows of sub-matrix e it reads, index in e of their first, lo, hi): worker w
        computes rows row_split(n, n_workers)[w] of every sub-matrix, read through the layout's
        `expert_rows` (so a placement that gives each node its rows of every expert is local)."""
        key = (name, e)
        plan = self._eplans.get(key)
        if plan is None:
            w = self.weights[name]
            per = w.rows // self.n_sub(name)
            # a layout may choose who computes which rows of an expert (e.g. only the workers of
            # the node that owns it): expert_split(name, e) -> [(lo, hi)] per worker
            split = getattr(self.layout, "expert_split", None)
            ranges = split(name, e) if split is not None else self._row_split(per, self.n_workers)
            plan = []
            for wk, (lo, hi) in enumerate(ranges):
                if hi <= lo:  # this worker computes none of the expert: nothing to read
                    plan.append((np.zeros((0, w.info.row_bytes), dtype=np.uint8), 0, 0, 0))
                    continue
                arr, first = self.layout.expert_rows(name, wk, e)
                arr = arr.reshape(arr.shape[0], -1) if arr.ndim != 2 else arr
                if hi > lo and not (first <= lo and hi <= first + arr.shape[0]):
                    raise ValueError(f"{name}: worker {wk}'s copy of expert {e} holds rows "
                                     f"[{first}, {first + arr.shape[0]}), it computes [{lo}, {hi})")
                plan.append((arr, first, lo, hi))
            self._eplans[key] = plan
        return plan

    def moe(self, x: np.ndarray, gate: str | None, up: str, down: str, experts: np.ndarray, weights: np.ndarray,
            activation: str = "silu") -> np.ndarray:
        """The routed experts' gated FFN: x [n, n_embd] float32, experts [n, k] (ids, in slot order),
        weights [n, k] float32 -> [n, n_embd] = sum over slots i (in order) of
        weights[:, i] * down_e(act(gate_e x) * up_e x), e = experts[:, i]. gate None: `up` is a
        fused ffn_gate_up_exps (each expert's gate rows, then its up rows).

        As ggml's mul_mat_id: tokens are grouped by expert so each routed expert's rows are read once
        per call (only the routed experts are read); every output is one vec_dot per (row, token)
        whatever the grouping and thread count; each worker computes its `row_split` range of every
        expert it is given (see `_expert_plan`). The weighting and the sum over slots are f32, in
        slot order, as llama.cpp's ggml_mul and chain of ggml_add.
        """
        n, k = experts.shape
        ids = np.asarray(experts, dtype=np.int64)
        n_exp = self.n_sub(up)
        if ids.size and (ids.min() < 0 or ids.max() >= n_exp):
            raise ValueError(f"expert ids outside [0, {n_exp})")
        if self.routing is not None:
            self.routing.record(up, ids, tuple(n for n in (gate, up, down) if n))
        if n == 1 and self.crewing:
            out = self._moe_token(x, gate, up, down, ids[0], weights[0], activation)
            if out is not None:
                return out
        if self.crewing and self._prompt_pass:   # a short prompt: each product group one crew job
            out = self._moe_prompt(x, gate, up, down, ids, weights, activation)
            if out is not None:
                return out
        # (expert, input rows, output rows): gate/up read token t, write row t*k + i
        rows: dict[int, list[int]] = {}
        for r, e in enumerate(ids.reshape(-1).tolist()):
            rows.setdefault(e, []).append(r)
        groups = [(e, np.array(rs, dtype=np.int64) // k, np.array(rs, dtype=np.int64)) for e, rs in rows.items()]
        if gate is None:
            (gu,) = self._expert_products((up,), x, groups, n * k)
            half = gu.shape[1] // 2
            g, u = np.ascontiguousarray(gu[:, :half]), np.ascontiguousarray(gu[:, half:])
        else:
            g, u = self._expert_products((gate, up), x, groups, n * k)
        a = np.empty_like(g)

        def act(t0: int, t1: int) -> None:   # rows are (token, slot) pairs: token t's at t * k
            r0, r1 = t0 * k, t1 * k
            ops.apply_activation(activation, g[r0:r1], u[r0:r1], a[r0:r1])
        self.token_rows(n, act)
        # down reads the activation row of each (token, slot)
        (d,) = self._expert_products((down,), a, [(e, rows, rows) for e, _, rows in groups], n * k)
        d = d.reshape(n, k, -1)
        w = np.ascontiguousarray(weights, dtype=np.float32)
        out = np.empty((n, d.shape[2]), dtype=np.float32)
        self.token_rows(n, lambda t0, t1: ops.weighted_slots(d[t0:t1], w[t0:t1], out[t0:t1]))
        return out

    def _token_experts(self, gate: str | None, up: str, down: str) -> tuple | None:
        """The compiled one-token expert FFN of these tensors with the crew (`expert_token`) and its
        tables, made once per layout; None when their types have no compiled path there (float
        experts, gate and up with different activation formats)."""
        crew = self._crew
        key = (gate, up, down)
        entry = self._etoken.get(key)
        if entry is None or entry[0] is not crew.lead:
            names_gu = (up,) if gate is None else (gate, up)
            ws_gu = [self.weights[nm] for nm in names_gu]
            wd = self.weights[down]
            preps = {kernels.prepare_key(w.ggml_type) for w in ws_gu}
            prep_gu, prep_d = kernels.preparer(ws_gu[0].ggml_type), kernels.preparer(wd.ggml_type)
            fams = [kernels.q8_family(w.ggml_type) for w in ws_gu + [wd]]
            mixed = self.mixed_q8 and min(fams) >= 0   # formats picked per call, per tensor
            if not mixed and (len(preps) != 1 or prep_gu is None or prep_d is None):
                entry = (crew.lead, None)
            else:
                n_sub = self.n_sub(up)
                pidx = [0] * len(names_gu) if len(set(fams[:-1])) == 1 else [0, 1]   # (a gate and an up apart)
                gu = self._token_table(names_gu, ws_gu, pidx, [w.rows // n_sub for w in ws_gu])
                dn = self._token_table((down,), [wd], [0], [wd.rows // n_sub])
                if mixed:
                    prep_gu = prep_d = kernels.activations.quantize_q8_0_or_K
                else:
                    prep_gu, prep_d = fixed_format(prep_gu), fixed_format(prep_d)
                runner = expert_runner(crew.lead, prep_gu, prep_d, len(names_gu))
                entry = (crew.lead, runner, gu, dn, ws_gu[0].rows // n_sub, wd.rows // n_sub,
                         rows_routed_runner(crew.lead, prep_gu, prep_d, len(names_gu)))
            self._etoken[key] = entry
        return entry if entry[1] is not None else None

    @staticmethod
    def _token_scratch(entry: tuple, k: int, fused: bool) -> tuple:
        """Fresh (g, u, act, d, out [1, n_out]) of one token's expert FFN, and n_ff."""
        gu_rows, n_out = entry[4], entry[5]
        n_ff = gu_rows // 2 if fused else gu_rows
        return (np.empty(k * gu_rows, dtype=np.float32), np.empty(1 if fused else k * n_ff, dtype=np.float32),
                np.empty(k * n_ff, dtype=np.float32), np.empty(k * n_out, dtype=np.float32),
                np.empty((1, n_out), dtype=np.float32), n_ff)

    def _moe_token(self, x: np.ndarray, gate: str | None, up: str, down: str, ids: np.ndarray,
                   weights: np.ndarray, activation: str) -> np.ndarray | None:
        """One token's routed experts in one compiled call with the crew (`expert_token`); None
        when the tensors' types have no compiled path there: the caller takes the general path."""
        entry = self._token_experts(gate, up, down)
        if entry is None:
            return None
        crew = self._crew
        _lead, runner, gu, dn, _r, _n, _rows = entry
        g, u, act, d, out, n_ff = self._token_scratch(entry, ids.shape[0], gate is None)
        if not runner(crew.ctl, crew.n_workers, np.ascontiguousarray(x, dtype=np.float32),
                      np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(weights, dtype=np.float32),
                      *gu, *dn, g, u, act, d, out[0], n_ff,
                      ops.activation_kind(activation), ops.GELU_F16):
            crew.stop()
            raise CrewError("a worker failed during an expert product")
        return out

    def _expert_products(self, names: tuple[str, ...], x: np.ndarray, groups: list, m_out: int
                         ) -> list[np.ndarray]:
        """outs[j][out_rows] = x[in_rows] times sub-matrix e of names[j]^T, per (e, in_rows, out_rows)
        of `groups`: x is prepared once per vec_dot type (ggml quantizes src1 once), each product
        row is a matvec (one vec_dot per row and token, mul_mat_id's order)."""
        ws = [self.weights[nm] for nm in names]
        ne0 = ws[0].ne0
        if x.shape[1] != ne0:
            raise ValueError(f"input width {x.shape[1]} != row length {ne0}")
        prep_types, pidx, per = self._formats(names, ws)
        outs = [np.empty((m_out, r), dtype=np.float32) for r in per]
        x = np.ascontiguousarray(x, dtype=np.float32)
        xps = [kernels.prepare(t, x) for t in prep_types]
        if self.crewing:  # one token's pass: the crew's workers wait in compiled code
            self._expert_crew(names, ws, pidx, per, xps, groups, outs)
            return outs
        loops = [_expert_loop(w.ggml_type) for w in ws]
        groups = [(e, np.ascontiguousarray(ins, dtype=np.int64), np.ascontiguousarray(outr, dtype=np.int64))
                  for e, ins, outr in groups]

        def work(wk: int) -> None:
            for e, ins, outr in groups:
                for j, nm in enumerate(names):
                    arr, first, lo, hi = self._expert_plan(nm, e)[wk]
                    if hi > lo:
                        loops[j](arr, xps[pidx[j]], ins, outs[j], outr, first, lo - first, hi - first, EXPERT_ROWS,
                                 per[j])

        def at_once() -> None:   # on the calling thread: each expert's rows in one call where it can
            for e, ins, outr in groups:
                for j, nm in enumerate(names):
                    whole = self._whole_expert(nm, e, per[j])
                    for arr, first, lo, hi in (self._expert_plan(nm, e) if whole is None else (whole,)):
                        if hi > lo:
                            loops[j](arr, xps[pidx[j]], ins, outs[j], outr, first, lo - first, hi - first,
                                     EXPERT_ROWS, per[j])
        sub_bytes = sum(w.info.nbytes // self.n_sub(nm) for w, nm in zip(ws, names))
        self.each_worker(work, sum(product_seconds(sub_bytes, len(ins)) for _e, ins, _o in groups), at_once)
        return outs

    def _moe_prompt(self, x: np.ndarray, gate: str | None, up: str, down: str, ids: np.ndarray,
                    weights: np.ndarray, activation: str) -> np.ndarray | None:
        """`moe` for a short prompt with the crew (`prompt_jobs`): the (token, slot) pairs sorted by
        expert (stable: an expert's pairs in token, then slot order, as `moe`'s groups), gate/up
        and down each one job over every routed expert (its pairs as consecutive input rows, in
        the expert order of `_expert_loop`), the activation on the sorted rows, the down rows put
        back in pair order for the weighted sum. None when a product group needs more than two
        input formats (the general path runs)."""
        n, k = ids.shape
        names_gu = (up,) if gate is None else (gate, up)
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")
        es, counts = np.unique(flat[order], return_counts=True)
        starts = np.cumsum(counts) - counts
        x = np.ascontiguousarray(x, dtype=np.float32)
        gu = self._prompt_group(names_gu, x[order // k], es, starts, counts, prompt_jobs.MUL_MAT_ID)
        if gu is None:
            return None
        if gate is None:
            half = gu[0].shape[1] // 2
            g, u = np.ascontiguousarray(gu[0][:, :half]), np.ascontiguousarray(gu[0][:, half:])
        else:
            g, u = gu
        a = np.empty_like(g)
        ops.apply_activation(activation, g, u, a)
        dn = self._prompt_group((down,), a, es, starts, counts, prompt_jobs.MUL_MAT_ID)   # (one format)
        d = np.empty_like(dn[0])
        d[order] = dn[0]
        out = np.empty((n, d.shape[1]), dtype=np.float32)
        ops.weighted_slots(d.reshape(n, k, -1), np.ascontiguousarray(weights, dtype=np.float32), out)
        return out

    def _formats(self, names: tuple[str, ...], ws: list) -> tuple[list[int], list[int], list[int]]:
        """The products' prepared inputs (one weight type per vec_dot format, as ggml quantizes src1
        once per format), each product's index among them, and its rows per sub-matrix."""
        keys = [kernels.prepare_key(w.ggml_type) for w in ws]
        prep = list(dict.fromkeys(keys))
        prep_types = [next(w.ggml_type for w, kk in zip(ws, keys) if kk == key) for key in prep]
        return prep_types, [prep.index(kk) for kk in keys], [w.rows // self.n_sub(nm) for w, nm in zip(ws, names)]

    def _prompt_table(self, names: tuple[str, ...], mode: int) -> tuple | None:
        """`_expert_table` of `names` with the prompt fields set (`prompt_jobs.set_products`), the
        input formats' weight types and each product's rows per sub-matrix; None when the
        products take more than two input formats. Made once per layout."""
        key = ("prompt", mode) + tuple(names)
        if key in self._eblocks:
            return self._eblocks[key]
        ws = [self.weights[nm] for nm in names]
        prep_types, pidx, per = self._formats(names, ws)
        entry = None
        if len(prep_types) <= 2:
            t3, c3, width = self._expert_table(tuple(names), ws, pidx, per)
            t3 = t3.copy()
            flat = t3.reshape(-1, t3.shape[2])
            real = flat[:, T_W] != 0   # (an expert with fewer tasks than another is padded)
            sub = flat[real]
            w = width.reshape(-1)[real]
            prompt_jobs.set_products(sub, sub[:, T_TYPE], mode, 0, w * 4, w)
            flat[real] = sub
            entry = (t3, c3, prep_types, per)
        self._eblocks[key] = entry
        return entry

    def _prompt_group(self, names: tuple[str, ...], xs: np.ndarray, es: np.ndarray, starts: np.ndarray,
                      counts: np.ndarray, mode: int, outs: list[np.ndarray] | None = None) -> list[np.ndarray] | None:
        """Sub-matrix es[i] of each of `names` times input rows starts[i] .. + counts[i] of xs (the
        rows grouped by sub-matrix already), in one crew job: outputs [rows of xs, sub-matrix rows]
        (into `outs` when given). None when the products take more than two input formats."""
        entry = self._prompt_table(names, mode)
        if entry is None:
            return None
        t3, c3, prep_types, per = entry
        xps = [kernels.prepare(t, xs) for t in prep_types]
        if outs is None:
            outs = [np.empty((xs.shape[0], r), dtype=np.float32) for r in per]
        n_g, n_t = es.shape[0], t3.shape[1]
        tasks = t3[es]
        tasks[:, :, T_XROW] = starts[:, None]
        tasks[:, :, T_OUTROW] = starts[:, None]
        tasks[:, :, T_NCOL] = counts[:, None]
        chunks = c3[es]
        chunks[:, :, C_TASK] += (np.arange(n_g, dtype=np.int64) * n_t)[:, None]
        table = Table(tasks.reshape(n_g * n_t, -1), chunks.reshape(-1, chunks.shape[2]))
        table.n_owned |= STEALABLE
        self._crew.run_with(prompt_jobs.chunk_address(), table, xps[0], xps[-1], outs)
        return outs

    def _whole_expert(self, name: str, e: int, per: int) -> tuple[np.ndarray, int, int, int] | None:
        """Worker 0's plan entry for sub-matrix e of `name` widened to all `per` rows when its copy
        holds them all (what one worker computes), else None."""
        arr, first, _lo, _hi = self._expert_plan(name, e)[0]
        return (arr, 0, 0, per) if first == 0 and arr.shape[0] >= per else None

    def _expert_table(self, names: tuple[str, ...], ws: list, pidx: list[int], per: list[int]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Crew task and chunk rows of every sub-matrix of `names` (each worker its own row range
        of its own copy; task j of a sub-matrix writes output j with prepared input pidx[j]),
        stacked [n_sub, tasks, fields] / [n_sub, chunks, fields] so one token's job is a few array
        operations whatever k; and each task's output row width. Built once per layout."""
        key = names
        table = self._eblocks.get(key)
        if table is None:
            tasks_all, chunks_all = [], []
            for e in range(self.n_sub(names[0])):
                tasks, owned = [], []
                for j, nm in enumerate(names):
                    for wk, (arr, first, lo, hi) in enumerate(self._expert_plan(nm, e)):
                        if hi > lo:
                            # in pieces, in order: the owner streams them one after another, a
                            # worker of its node that is done first takes the last ones (STEALABLE)
                            step = STEAL_ROWS if self.n_workers > 1 else hi - lo
                            owned += [(len(tasks), a - first, min(a + step, hi) - first, wk)
                                      for a in range(lo, hi, step)]
                            tasks.append((ws[j].ggml_type, np.ascontiguousarray(arr), pidx[j], j, first))
                job = Job(tasks, owned, [])
                tasks_all.append(job.tasks)
                chunks_all.append(job.chunks)
            # experts split over different workers may have different task counts: pad with tasks
            # no chunk runs and with empty chunks owned by nobody
            n_t = max(len(t) for t in tasks_all)
            n_c = max(len(c) for c in chunks_all)
            t3 = np.zeros((len(tasks_all), n_t, TASK_FIELDS), dtype=np.int64)
            c3 = np.zeros((len(chunks_all), n_c, chunks_all[0].shape[1]), dtype=np.int64)
            c3[:, :, C_OWNER] = -1
            c3[:, :, C_SPAN] = 1
            for e, (t, c) in enumerate(zip(tasks_all, chunks_all)):
                t3[e, :len(t)] = t
                c3[e, :len(c)] = c
            width = np.array(per, dtype=np.int64)[t3[:, :, T_OUT]]
            table = self._eblocks[key] = (t3, c3, width)
        return table

    def _token_table(self, names: tuple[str, ...], ws: list, pidx: list[int], per: list[int]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`_expert_table` as one token's `expert_token.compose` reads it: when the sub-matrices'
        task and chunk rows differ only in the weight address (each worker the same rows of every
        expert), compact -- one sub-matrix's rows and every sub-matrix's addresses [n_sub, tasks]
        -- else the full tables and no addresses (a placement that gives experts to nodes)."""
        key = ("token",) + tuple(names)
        table = self._eblocks.get(key)
        if table is None:
            t3, c3, width = self._expert_table(names, ws, pidx, per)
            rest = np.delete(t3, T_W, axis=2)
            if (rest == rest[:1]).all() and (c3 == c3[:1]).all() and (width == width[:1]).all():
                table = (np.ascontiguousarray(t3[:1]), np.ascontiguousarray(c3[:1]), np.ascontiguousarray(width[:1]),
                         np.ascontiguousarray(t3[:, :, T_W]))
            else:
                table = (t3, c3, width, np.zeros((0, t3.shape[1]), dtype=np.int64))
            self._eblocks[key] = table
        return table

    def _expert_crew(self, names, ws, pidx, per, xps, groups, outs) -> None:
        """A few input rows with the crew: one job holding every routed expert's products (each
        task reads its own row of the prepared 2-D inputs and writes its own output row)."""
        tasks3, chunks3, width = self._expert_table(tuple(names), ws, pidx, per)
        es, ri, ro = [], [], []
        for e, ins, outr in groups:
            es += [e] * len(ins)
            ri += list(ins)
            ro += list(outr)
        es_a = np.array(es, dtype=np.int64)
        m, n_t = len(es), tasks3.shape[1]
        tasks = tasks3[es_a].reshape(m * n_t, -1)
        tasks[:, T_OUTOFF] += (np.array(ro, dtype=np.int64)[:, None] * width[es_a]).reshape(-1)
        tasks[:, T_XROW] = np.repeat(np.array(ri, dtype=np.int64), n_t)
        chunks = chunks3[es_a]
        chunks[:, :, C_TASK] += (np.arange(m, dtype=np.int64) * n_t)[:, None]
        table = Table(tasks, chunks.reshape(-1, chunks.shape[2]))
        table.n_owned |= STEALABLE
        self._crew.run(table, xps[0], xps[-1], [o.reshape(-1) for o in outs])

    def sub_products(self, name: str, x: np.ndarray) -> np.ndarray:
        """x [m, n, ne0] -> [m, n, rows] with sub-matrix i of 3-D tensor `name` applied to x[i]
        (ggml_mul_mat of a 3-D weight: MLA's per-head attn_k_b / attn_v_b); one token is a
        matvec per row (vec_dot), more are a matmat (ggml's mul_mat for >= 2 columns)."""
        w = self.weights[name]
        m, n, k = x.shape
        if m != self.n_sub(name) or k != w.ne0:
            raise ValueError(f"{name}: input {list(x.shape)} does not fit shape {list(w.info.shape)}")
        rows = w.rows // m
        if n == 1:  # one token: a matvec per head, through the expert machinery (crew jobs in decode)
            heads = np.arange(m, dtype=np.int64)
            (out1,) = self._expert_products((name,), x[:, 0, :], [(i, heads[i:i + 1], heads[i:i + 1]) for i in range(m)], m)
            return out1.reshape(m, 1, rows)
        out = np.empty((m, n, rows), dtype=np.float32)
        if self.crewing and self._prompt_pass:   # a short prompt's crew job: head i's rows i * n ..
            heads = np.arange(m, dtype=np.int64)
            self._prompt_group((name,), np.ascontiguousarray(x, dtype=np.float32).reshape(m * n, k), heads,
                               heads * n, np.full(m, n, dtype=np.int64), prompt_jobs.MATMAT, [out.reshape(m * n, rows)])
            return out
        xps = [kernels.prepare(w.ggml_type, np.ascontiguousarray(x[i] if n > 1 else x[i, 0])) for i in range(m)]

        def work(wk: int, at_once: bool = False) -> None:
            for i in range(m):
                plan = self._expert_plan(name, i)
                entries = (plan[wk],)
                if at_once:   # every worker's rows here: in one piece where worker 0's copy holds them
                    whole = self._whole_expert(name, i, rows)
                    entries = plan if whole is None else (whole,)
                for arr, first, lo, hi in entries:
                    if hi <= lo:
                        continue
                    if n == 1:
                        kernels.matvec(w.ggml_type, arr, xps[i], out[i, 0, first:first + arr.shape[0]],
                                       lo - first, hi - first)
                    else:
                        kernels.matmat(w.ggml_type, arr, xps[i], out[i, :, first:first + arr.shape[0]],
                                       lo - first, hi - first)
        self.each_worker(work, product_seconds(w.info.nbytes, n), lambda: work(0, at_once=True))
        return out

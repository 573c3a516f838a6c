"""A decode batch's mixture-of-experts FFN in one compiled call a layer.

A server pass carries n sequences, one new token each (engine.batch). Step by step from Python, a
layer's routed FFN cost ~1 ms of table building, grouping and NumPy between the crew's jobs
at n = 8 (R1's 58 routed layers: more than the pass's products). These calls are the one-token
runners of `expert_token` over n rows: the router (and a model's shared experts' gate/up) as one
rows job (`crew.rows_job`), each row's gating by the functions the one-token call runs, the routed
(row, slot) pairs grouped by expert (`compose_rows`: each expert's weight pieces read once for
all rows routed to it, as ggml's mul_mat_id), the activation, the down products (with the shared
experts' down), then each row's weighted sum over its slots in slot order. Every output row is
the one-token call's kernel on the same input and the sums are its f32 steps, so a row's numbers
are those of its sequence decoded alone (tests/services/test_server_batch.py).
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from . import ops
from .crew import C_SPAN, C_TASK, NO_LIMIT, STEALABLE, T_OUTOFF, T_TYPE, T_W, T_XROW, prep_families
from .expert_token import concat_jobs, route_token
from .kernels import F16, q8_families
from .kernels.jitcache import JIT as _NB


@numba.njit(**_NB)
def compose_rows(t3: np.ndarray, c3: np.ndarray, width: np.ndarray, waddr: np.ndarray, ids: np.ndarray,
                 down: bool) -> tuple[np.ndarray, np.ndarray]:
    """One job's (tasks, chunks) for the (row r, slot i) pairs p = r * k + i of ids [n, k]: expert
    ids[r, i]'s tasks reading prepared input row r (gate/up) or p (down, the pair's activation
    row) and writing at offset p * the task's width of output row 0. The pairs of one expert are
    consecutive copies of each of its tasks, and each of its chunks spans them: a worker runs a
    piece of the expert's rows over all of its pairs (`run_chunk`'s tiles) -- F16 tasks keep a
    chunk per pair (`rows_job`). Tables as `expert_token.compose` reads them (compact: waddr
    [n_sub, tasks] the weight addresses, t3 / c3 / width one sub-matrix's rows)."""
    n, k = ids.shape
    n_pairs = n * k
    compact = waddr.shape[0] > 0
    n_sub = waddr.shape[0] if compact else t3.shape[0]
    count = np.zeros(n_sub + 1, dtype=np.int64)
    for p in range(n_pairs):
        count[ids[p // k, p % k] + 1] += 1
    for e in range(n_sub):
        count[e + 1] += count[e]
    order = np.empty(n_pairs, dtype=np.int64)
    fill = count[:n_sub].copy()
    for p in range(n_pairs):   # stable: an expert's pairs in row, then slot order
        e = ids[p // k, p % k]
        order[fill[e]] = p
        fill[e] += 1
    n_t, n_c = t3.shape[1], c3.shape[1]
    n_chunks = 0
    for e in range(n_sub):
        m = count[e + 1] - count[e]
        if m:
            te = 0 if compact else e
            for c in range(n_c):
                n_chunks += m if t3[te, c3[te, c, C_TASK], T_TYPE] == F16 else 1
    tasks = np.empty((n_pairs * n_t, t3.shape[2]), dtype=np.int64)
    chunks = np.empty((n_chunks, c3.shape[2]), dtype=np.int64)
    rt = 0
    rc = 0
    for e in range(n_sub):
        m = count[e + 1] - count[e]
        if m == 0:
            continue
        te = 0 if compact else e
        for t in range(n_t):
            for j in range(m):
                p = order[count[e] + j]
                r = rt + t * m + j
                for f in range(t3.shape[2]):
                    tasks[r, f] = t3[te, t, f]
                if compact:
                    tasks[r, T_W] = waddr[e, t]
                tasks[r, T_OUTOFF] += p * width[te, t]
                tasks[r, T_XROW] = p if down else p // k
        for c in range(n_c):
            t = c3[te, c, C_TASK]
            per = m if t3[te, t, T_TYPE] == F16 else 1
            for j in range(per):
                for f in range(c3.shape[2]):
                    chunks[rc, f] = c3[te, c, f]
                chunks[rc, C_TASK] = rt + t * m + j
                chunks[rc, C_SPAN] = 1 if per > 1 else m
                rc += 1
        rt += n_t * m
    return tasks, chunks


@numba.njit(inline="always")
def _weighted_rows(d, wts, out, n_out):
    """out[r] = sum over slots i (in order, f32) of wts[r, i] * the pair (r, i)'s down row."""
    n, k = wts.shape
    for r in range(n):
        for j in range(n_out):
            out[r, j] = d[r * k * n_out + j] * wts[r, 0]
        for i in range(1, k):
            b = (r * k + i) * n_out
            for j in range(n_out):
                out[r, j] = out[r, j] + d[b + j] * wts[r, i]


@numba.njit(inline="always")
def _route_rows(logits, kind, bias, n_groups, n_group_used, norm, scale, ids, wts):
    for r in range(ids.shape[0]):
        route_token(logits[r], kind, ids.shape[1], bias, n_groups, n_group_used, norm, scale, ids[r], wts[r])


_ROUTED: dict = {}


def rows_routed_runner(lead: Callable, prep_gu: Callable, prep_down: Callable, n_gu: int) -> Callable:
    """`expert_token.routed_runner` (with its `expert_runner`) over a decode batch's n rows.

    prep_gu, prep_down: (x, family) -> prepared, as `expert_runner`'s; n_gu: 2 for separate gate
    and up tensors, 1 for a fused gate_up tensor."""
    key = (lead, prep_gu, prep_down, n_gu)
    fn = _ROUTED.get(key)
    if fn is not None:
        return fn
    fam = q8_families()

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, r_job, logits, kind, bias, n_groups, n_group_used, norm, scale, ids, wts, gu_t3,
           gu_c3, gu_w, gu_wa, d_t3, d_c3, d_w, d_wa, g, u, act, d, out, n_ff, act_kind, gelu_table):
        """h [n, n_embd] -> out [n, n_embd]; ids, wts [n, k]: the rows' experts and weights; g, u
        [1, n * k * width], act [n * k, n_ff], d [1, n * k * n_embd]: scratch (u unused with a
        fused gate_up). False if a worker failed."""
        t, c, o = r_job
        xr = (h,)
        if not lead(ctl, n_workers, t, c, o, xr, xr, (logits,), 0, NO_LIMIT, 0):
            return False
        _route_rows(logits, kind, bias, n_groups, n_group_used, norm, scale, ids, wts)
        ka, kb = prep_families(gu_t3[0], fam)
        kd, _kd = prep_families(d_t3[0], fam)
        xa = prep_gu(h, ka)
        xb = prep_gu(h, kb) if kb >= 0 else xa
        tasks, chunks = compose_rows(gu_t3, gu_c3, gu_w, gu_wa, ids, False)
        pairs = act.shape[0]
        if n_gu == 2:
            if not lead(ctl, n_workers, tasks, chunks, chunks.shape[0] | STEALABLE, xa, xb, (g, u), 0, NO_LIMIT, 0):
                return False
            g2, u2 = g.reshape(pairs, n_ff), u.reshape(pairs, n_ff)
        else:
            if not lead(ctl, n_workers, tasks, chunks, chunks.shape[0] | STEALABLE, xa, xb, (g,), 0, NO_LIMIT, 0):
                return False
            gu = g.reshape(pairs, 2 * n_ff)
            g2, u2 = gu[:, :n_ff], gu[:, n_ff:]
        ops.gate_mul(g2, u2, act, act_kind, gelu_table)
        xd = prep_down(act, kd)
        tasks, chunks = compose_rows(d_t3, d_c3, d_w, d_wa, ids, True)
        if not lead(ctl, n_workers, tasks, chunks, chunks.shape[0] | STEALABLE, xd, xd, (d,), 0, NO_LIMIT, 0):
            return False
        _weighted_rows(d[0], wts, out, out.shape[1])
        return True

    _ROUTED[key] = fn
    return fn


_FUSED: dict = {}


def rows_fused_runner(lead: Callable, prep_x: Callable, prep_act: Callable) -> Callable:
    """`expert_token.shared_fused_runner` over a decode batch's n rows: (1) the router and the
    shared experts' (or a dense layer's) gate/up, (2) the routed experts' gate/up, (3) their down
    with the shared experts' down; the sums in the one-token call's order."""
    key = (lead, prep_x, prep_act)
    fn = _FUSED.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, routed_on, j1, logits, kind, bias, n_groups, n_group_used, norm, scale, ids, wts,
           gu_t3, gu_c3, gu_w, gu_wa, d_t3, d_c3, d_w, d_wa, sd, g, u, act, d, gs, us, acts, ds, out, n_ff,
           act_kind, gelu_table, fam_x, fam_a):
        """h [n, n_embd] -> out [n, n_embd]; j1, sd: rows jobs (`crew.rows_job`) of the one-token
        call's first and shared-down jobs; gs, us, acts [n, shared FFN]; ds [n, n_embd]; the rest as
        `rows_routed_runner`'s. False if a worker failed."""
        xq = prep_x(h, fam_x)
        xr = (h,)
        t1, c1, o1 = j1
        if not lead(ctl, n_workers, t1, c1, o1, xr, xq, (logits, gs, us), 0, NO_LIMIT, 0):
            return False
        ops.gate_mul(gs, us, acts, act_kind, gelu_table)
        xs = prep_act(acts, fam_a)
        td, cd, od = sd
        n, n_embd = out.shape
        if not routed_on:
            if not lead(ctl, n_workers, td, cd, od, xs, xs, (ds, ds), 0, NO_LIMIT, 0):
                return False
            for r in range(n):
                for j in range(n_embd):
                    out[r, j] = ds[r, j]
            return True
        _route_rows(logits, kind, bias, n_groups, n_group_used, norm, scale, ids, wts)
        tasks, chunks = compose_rows(gu_t3, gu_c3, gu_w, gu_wa, ids, False)
        if not lead(ctl, n_workers, tasks, chunks, chunks.shape[0] | STEALABLE, xq, xq, (g, u), 0, NO_LIMIT, 0):
            return False
        pairs = act.shape[0]
        g2, u2 = g.reshape(pairs, n_ff), u.reshape(pairs, n_ff)
        ops.gate_mul(g2, u2, act, act_kind, gelu_table)
        xd = prep_act(act, fam_a)
        tasks, chunks = compose_rows(d_t3, d_c3, d_w, d_wa, ids, True)
        tasks, chunks, n_own = concat_jobs(tasks, chunks, chunks.shape[0], td, cd, od)
        if not lead(ctl, n_workers, tasks, chunks, n_own | STEALABLE, xd, xs, (d, ds), 0, NO_LIMIT, 0):
            return False
        _weighted_rows(d[0], wts, out, n_embd)
        for r in range(n):
            for j in range(n_embd):
                out[r, j] = out[r, j] + ds[r, j]
        return True

    _FUSED[key] = fn
    return fn

"""A token's routed experts in one compiled call: decode's mixture-of-experts FFN without Python.

Decoding one token through a MoE layer takes two crew jobs (gate/up of the k routed experts, then
their down products) with an activation between them and a weighted sum after. Composed in Python
(task tables by fancy indexing, a dict of rows per expert, NumPy temporaries) that costs ~0.4 ms per
layer: as much as the products themselves on a small expert. `expert_runner` builds, per set of
activation formats, one compiled function that prepares the input, composes both jobs' tables from
the per-expert tables `Runtime._expert_table` made once per layout, posts them to the crew (`lead`),
applies the activation and sums the slots. The arithmetic is the general path's, operation for
operation: each output row is the same kernel call's dot product, the activation is `ops.silu_mul`
or `ops.gelu_mul`, and the weighting and the sum over slots are f32 in slot order, so results are
the same to the bit (tests/engine/test_moe_runtime.py compares both paths).
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from . import kernels, ops
from .crew import C_TASK, NO_LIMIT, STEALABLE, T_OUTOFF, T_W, T_XROW, ahead, prep_families
from .gating import gate, route_core

from .kernels.jitcache import JIT as _NB


@numba.njit(**_NB)
def compose(t3: np.ndarray, c3: np.ndarray, width: np.ndarray, ids: np.ndarray, rows: np.ndarray,
            waddr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One job's (tasks, chunks) for slots i = 0..k-1: expert ids[i]'s tasks reading prepared input
    row rows[i] and writing output row i (offset i * the task's output width).

    Compact tables (`Runtime._token_table`; waddr [n_sub, tasks] not empty): t3, c3 and width hold
    one sub-matrix's rows, the same for all but the weight address, which comes from waddr: a
    token reads a few lines per routed expert, where the full tables (29 fields a task) were cold
    lines a task -- R1's 256 experts a layer x 58 layers, evicted by each token's weights."""
    k = ids.shape[0]
    n_t, n_c = t3.shape[1], c3.shape[1]
    compact = waddr.shape[0] > 0
    tasks = np.empty((k * n_t, t3.shape[2]), dtype=np.int64)
    chunks = np.empty((k * n_c, c3.shape[2]), dtype=np.int64)
    for i in range(k):
        e = ids[i]
        te = 0 if compact else e
        for t in range(n_t):
            r = i * n_t + t
            for f in range(t3.shape[2]):
                tasks[r, f] = t3[te, t, f]
            if compact:
                tasks[r, T_W] = waddr[e, t]
            tasks[r, T_OUTOFF] += i * width[te, t]
            tasks[r, T_XROW] = rows[i]
        for c in range(n_c):
            r = i * n_c + c
            for f in range(c3.shape[2]):
                chunks[r, f] = c3[te, c, f]
            chunks[r, C_TASK] += i * n_t
    return tasks, chunks


_RUNNERS: dict = {}


_FIXED: dict = {}


def fixed_format(prep: Callable) -> Callable:
    """`prep` (x -> prepared) as the (x, family) -> prepared that `expert_runner` calls: one
    activation format whatever the family."""
    fn = _FIXED.get(prep)
    if fn is None:
        @numba.njit(inline="always")
        def fn(x, k):
            return prep(x)
        _FIXED[prep] = fn
    return fn


def expert_runner(lead: Callable, prep_gu: Callable, prep_down: Callable, n_gu: int) -> Callable:
    """The compiled one-token expert FFN over the crew's `lead` for these activation formats.

    prep_gu, prep_down: (x, family) -> prepared, the family each call's tasks name (the gate's,
    the up's, the down's: `crew.prep_families`): `activations.quantize_q8_0_or_K` for a file mixing
    Q8_0 and Q8_K formats (every layer one function, a gate and an up of either), else a fixed
    format (`fixed_format`). n_gu: 2 for separate gate and up tensors (outputs gate, up), 1 for a
    fused gate_up tensor (one output holding each expert's gate rows, then its up rows).
    """
    key = (lead, prep_gu, prep_down, n_gu)
    fn = _RUNNERS.get(key)
    if fn is not None:
        return fn
    fam = kernels.q8_families()

    if n_gu == 2:
        @numba.njit(**_NB)
        def gate_up(ctl, n_workers, tasks, chunks, xa, xb, g, u, n_ff):
            ok = lead(ctl, n_workers, tasks, chunks, chunks.shape[0] | STEALABLE, xa, xb, (g, u), 0, NO_LIMIT, 0)
            k = g.shape[0] // n_ff
            return ok, g.reshape(k, n_ff), u.reshape(k, n_ff)
    else:
        @numba.njit(**_NB)
        def gate_up(ctl, n_workers, tasks, chunks, xa, xb, g, u, n_ff):
            ok = lead(ctl, n_workers, tasks, chunks, chunks.shape[0] | STEALABLE, xa, xb, (g,), 0, NO_LIMIT, 0)
            gu = g.reshape(-1, 2 * n_ff)
            return ok, gu[:, :n_ff], gu[:, n_ff:]

    @numba.njit(**_NB)
    def fn(ctl, n_workers, x, ids, wts, gu_t3, gu_c3, gu_w, gu_wa, d_t3, d_c3, d_w, d_wa, g, u, act, d, out, n_ff,
           kind, gelu_table):
        """x [1, n_embd] -> out [n_embd]; g, u, act, d: scratch of k * (width) floats; False if a
        worker failed."""
        k = ids.shape[0]
        ka, kb = prep_families(gu_t3[0], fam)
        kd, _kd = prep_families(d_t3[0], fam)
        xa = prep_gu(x, ka)
        xb = prep_gu(x, kb) if kb >= 0 else xa
        zeros = np.zeros(k, dtype=np.int64)
        tasks, chunks = compose(gu_t3, gu_c3, gu_w, ids, zeros, gu_wa)
        ok, g2, u2 = gate_up(ctl, n_workers, tasks, chunks, xa, xb, g, u, n_ff)
        if not ok:
            return False
        a2 = act.reshape(k, n_ff)
        ops.gate_mul(g2, u2, a2, kind, gelu_table)
        xd = prep_down(a2, kd)
        tasks, chunks = compose(d_t3, d_c3, d_w, ids, np.arange(k), d_wa)
        if not lead(ctl, n_workers, tasks, chunks, chunks.shape[0] | STEALABLE, xd, xd, (d,), 0, NO_LIMIT, 0):
            return False
        n_embd = out.shape[0]
        for j in range(n_embd):
            out[j] = d[j] * wts[0]
        for i in range(1, k):
            for j in range(n_embd):
                out[j] = out[j] + d[i * n_embd + j] * wts[i]
        return True

    _RUNNERS[key] = fn
    return fn


@numba.njit(inline="always")
def route_token(logits, kind, k, bias, n_groups, n_group_used, norm, scale, ids, wts) -> None:
    """One token's router logits -> its k experts and weights (into ids, wts), by the gating
    functions the prompt path calls."""
    probs = gate(logits.reshape(1, -1), kind)
    id2, w2 = route_core(probs, k, bias, n_groups, n_group_used, norm, scale)
    for i in range(k):
        ids[i] = id2[0, i]
        wts[i] = w2[0, i]


_ROUTED: dict = {}


def routed_runner(lead: Callable, experts: Callable) -> Callable:
    """A decoded token's whole routed FFN in one compiled call: the router product (float32 router
    weights, as a crew job), the gating (`..gating`: the same functions the prompt path calls) and
    `experts`, an `expert_runner`. The router's job and kernel are those `Runtime.linear` runs for
    it, so experts and weights are the same to the bit as the model's own router + `Runtime.moe`."""
    key = (lead, experts)
    fn = _ROUTED.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, r_tasks, r_chunks, r_owned, logits, kind, k, bias, n_groups, n_group_used, norm,
           scale, ids, wts, gu_t3, gu_c3, gu_w, gu_wa, d_t3, d_c3, d_w, d_wa, g, u, act, d, out, n_ff, act_kind,
           gelu_table):
        """h [1, n_embd] -> out [n_embd]; the routed experts and their weights into ids, wts [k]."""
        xr = (h[0],)
        if not lead(ctl, n_workers, r_tasks, r_chunks, r_owned, xr, xr, (logits,), 0, NO_LIMIT, 0):
            return False
        route_token(logits, kind, k, bias, n_groups, n_group_used, norm, scale, ids, wts)
        return experts(ctl, n_workers, h, ids, wts, gu_t3, gu_c3, gu_w, gu_wa, d_t3, d_c3, d_w, d_wa, g, u, act, d,
                       out, n_ff, act_kind, gelu_table)

    _ROUTED[key] = fn
    return fn



_SHARED: dict = {}


def shared_runner(routed: Callable, dense: Callable) -> Callable:
    """A decoded token's FFN with shared experts (DeepSeek's ffn_*_shexp) in one compiled call: the
    routed FFN (`routed_runner`), then the shared experts' gated FFN (`dense_token.dense_runner`),
    their outputs added in f32 (llama.cpp's ggml_add(moe_out, ffn_shexp), the Python path's
    `out + s`). In a dense layer (routed_on False) only `dense` runs, on the layer's own FFN: the
    same function for every layer of the model, so its token compiles into one call."""
    key = (routed, dense)
    fn = _SHARED.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, routed_on, r_head, d_first, d_head, r_out, d_out, out):
        """h [1, n_embd] -> out [1, n_embd]; False if a worker failed."""
        if routed_on:
            if not routed(ctl, n_workers, h, *r_head):
                return False
            ahead(ctl, d_first)
        if not dense(ctl, n_workers, h, *d_head):
            return False
        n = out.shape[1]
        if routed_on:
            for j in range(n):
                out[0, j] = r_out[0, j] + d_out[0, j]
        else:
            for j in range(n):
                out[0, j] = d_out[0, j]
        return True

    _SHARED[key] = fn
    return fn


@numba.njit(**_NB)
def concat_jobs(t_a, c_a, n_a, t_b, c_b, n_b):
    """Tasks and chunks of job a then job b as one job: every owned chunk first (a's, then b's,
    each worker's pieces still in order), then the shared ones; b's chunks renumbered past a's
    tasks. n_a, n_b: owned counts (their STEALABLE bits ignored)."""
    ta, tb = t_a.shape[0], t_b.shape[0]
    oa, ob = n_a & (STEALABLE - 1), n_b & (STEALABLE - 1)
    tasks = np.empty((ta + tb, t_a.shape[1]), dtype=np.int64)
    tasks[:ta] = t_a
    tasks[ta:] = t_b
    chunks = np.empty((c_a.shape[0] + c_b.shape[0], c_a.shape[1]), dtype=np.int64)
    r = 0
    for src, lo, hi, shift in ((c_a, 0, oa, 0), (c_b, 0, ob, ta), (c_a, oa, c_a.shape[0], 0),
                               (c_b, ob, c_b.shape[0], ta)):
        for c in range(lo, hi):
            for f in range(src.shape[1]):
                chunks[r, f] = src[c, f]
            chunks[r, C_TASK] += shift
            r += 1
    return tasks, chunks, oa + ob


_FUSED: dict = {}


def shared_fused_runner(lead: Callable, prep_x: Callable, prep_act: Callable) -> Callable:
    """`shared_runner`'s FFN in three crew jobs instead of five: (1) the router and the shared
    experts' gate/up together (both read the normed input: the router its floats, gate/up its
    `prep_x` quantization), (2) the routed experts' gate/up, (3) the routed experts' down and the
    shared experts' down together (each on its own activation's `prep_act` quantization). Every
    output row is the same kernel call on the same input as in the separate jobs, and the sums are
    the same f32 steps in the same order (the weighted slots, then + the shared experts), so the
    bits are `shared_runner`'s; a token hands off to the workers two times fewer per layer. A
    dense layer (routed_on False) runs its gate/up as job (1) and its down as job (3). prep_x,
    prep_act: (x, family) -> prepared, as `expert_runner`'s (`fixed_format`, or the per-family
    quantizer of a file mixing Q8_0 and Q8_K activations).

    Tables (`Runtime._fused_parts`): j1 the router's tasks (prepared input 0: the floats; output
    0) then gate/up's (input 1; outputs 1, 2); sd the down tasks (input 1; output 1)."""
    key = (lead, prep_x, prep_act)
    fn = _FUSED.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, routed_on, j1, logits, kind, k, bias, n_groups, n_group_used, norm, scale, ids, wts,
           gu_t3, gu_c3, gu_w, gu_wa, d_t3, d_c3, d_w, d_wa, sd, g, u, act, d, gs, us, acts, ds, out, n_ff,
           act_kind, gelu_table, fam_x, fam_a):
        """h [1, n_embd] -> out [1, n_embd]; the routed experts and their weights into ids, wts [k].
        g, u, act: [k * n_ff]; d [k * n_embd]; gs, us, acts [1, shared FFN]; ds [n_embd]; fam_x,
        fam_a: the activation formats (`kernels.q8_family`) of the gate/up and down products."""
        xq = prep_x(h, fam_x)
        xr = (h[0],)
        t1, c1, o1 = j1
        if not lead(ctl, n_workers, t1, c1, o1, xr, xq, (logits, gs[0], us[0]), 0, NO_LIMIT, 0):
            return False
        td, cd, od = sd
        if not routed_on:
            ahead(ctl, sd)
        ops.gate_mul(gs, us, acts, act_kind, gelu_table)
        xs = prep_act(acts, fam_a)
        n_embd = out.shape[1]
        if not routed_on:
            if not lead(ctl, n_workers, td, cd, od, xs, xs, (d, ds), 0, NO_LIMIT, 0):
                return False
            for j in range(n_embd):
                out[0, j] = ds[j]
            return True
        route_token(logits, kind, k, bias, n_groups, n_group_used, norm, scale, ids, wts)
        zeros = np.zeros(k, dtype=np.int64)
        tasks, chunks = compose(gu_t3, gu_c3, gu_w, ids, zeros, gu_wa)
        if not lead(ctl, n_workers, tasks, chunks, chunks.shape[0] | STEALABLE, xq, xq, (g, u), 0, NO_LIMIT, 0):
            return False
        g2, u2, a2 = g.reshape(k, n_ff), u.reshape(k, n_ff), act.reshape(k, n_ff)
        ops.gate_mul(g2, u2, a2, act_kind, gelu_table)
        xd = prep_act(a2, fam_a)
        tasks, chunks = compose(d_t3, d_c3, d_w, ids, np.arange(k), d_wa)
        tasks, chunks, n_own = concat_jobs(tasks, chunks, chunks.shape[0], td, cd, od)
        if not lead(ctl, n_workers, tasks, chunks, n_own | STEALABLE, xd, xs, (d, ds), 0, NO_LIMIT, 0):
            return False
        for j in range(n_embd):
            out[0, j] = d[j] * wts[0]
        for i in range(1, k):
            for j in range(n_embd):
                out[0, j] = out[0, j] + d[i * n_embd + j] * wts[i]
        for j in range(n_embd):
            out[0, j] = out[0, j] + ds[j]
        return True

    _FUSED[key] = fn
    return fn

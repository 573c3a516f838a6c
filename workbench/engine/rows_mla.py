"""A decode batch's multi-head latent attention sub-layer (DeepSeek 2/3) in one compiled call.

`mla_token.mla_block_runner` over n sequences, one new token each (engine.batch): the products
as rows jobs (`crew.rows_job`: each weight piece read once for all rows, every output the
one-token kernel's dot), the norms and RoPE over the rows (each at its own position), the
per-head attn_k_b / attn_v_b products for every (row, head) in one job each, and each row's
attention over its own latent cache by the one-token attention (`attention.one_token_attention`,
the cache's argument tuples per row in a typed list). The same functions in the same order as the
one-token call for every row, so a row's numbers are those of its sequence decoded alone
(tests/services/test_server_batch.py). From Python the sub-layer was ~25 calls a layer plus one
attention call per row: at R1's 61 blocks and 8 rows, most of a pass.
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from . import ops
from .crew import NO_LIMIT
from .kernels.jitcache import JIT as _NB

_BLOCKS: dict = {}


def rows_mla_runner(first: Callable, q_b: Callable, lead: Callable, prep_kb: Callable, prep_vb: Callable,
                    attend: Callable, out: Callable, combined: bool = False) -> Callable:
    """The compiled MLA sub-layer over a decode batch's rows: `first`, `q_b`, `out` the crew's rows
    product runners (`crew.product_runner(..., rows=True)`) of (q_a or q, kv_a_mqa), attn_q_b and
    attn_output; `lead`, `prep_kb`, `prep_vb` as `mla_block_runner`'s; `attend` the one-token
    attention run row by row, or with `combined` every row's in two jobs
    (`attention.rows_token_attention` over the jobs `attention.combine_row_jobs` made)."""
    key = (first, q_b, lead, prep_kb, prep_vb, attend, out, combined)
    fn = _BLOCKS.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, a_job, qa, ckv, qa_norm, eps, qb_job, q, kb_job, qn, q_abs, rope, neox, nope,
           kv_norm, caches, keys_all, values_all, pos0s, scale, vb_job, att_all, vb_out, out_job, o):
        """h [n, n_embd] (normed) -> o [n, n_embd]. qa, ckv: the first products' outputs [n, ...]
        (qa is q itself without q-LoRA: qa_norm of size 0); q [n, n_head * (nope + rot)]; qn [n *
        n_head, nope], q_abs [n, n_head * kv_lora], att_all [n * n_head, kv_lora], vb_out [n,
        n_head * v_head]: scratch; rope [n, rot / 2, 2]: each row's position; caches: per row
        (keys job, values job, keys, values, capacity) of its latent cache's layer; pos0s: each
        row's position; keys_all, values_all: the rows' attention jobs combined (`combined`).
        False when a worker failed."""
        n = h.shape[0]
        t, c, m = a_job
        if not first(ctl, n_workers, t, c, m, h, (qa, ckv)):
            return False
        if qa_norm.shape[0]:
            qan = np.empty_like(qa)
            ops.rms_norm(qa, qa_norm, eps, qan)
            t, c, m = qb_job
            if not q_b(ctl, n_workers, t, c, m, qan, (q,)):
                return False
        n_head = qn.shape[0] // n
        lora = kv_norm.shape[0]
        dk = q.shape[1] // n_head
        rot = dk - nope
        q_pe = np.empty((n, n_head, rot), dtype=np.float32)
        for r in range(n):
            for i in range(n_head):
                for j in range(rot):
                    q_pe[r, i, j] = q[r, i * dk + nope + j]
                for j in range(nope):
                    qn[r * n_head + i, j] = q[r, i * dk + j]
        ops.apply_rope(q_pe, rope, neox)
        k_pe = np.empty((n, 1, rot), dtype=np.float32)
        lat_in = np.empty((n, lora), dtype=np.float32)
        for r in range(n):
            for j in range(rot):
                k_pe[r, 0, j] = ckv[r, lora + j]
            for j in range(lora):
                lat_in[r, j] = ckv[r, j]
        ops.apply_rope(k_pe, rope, neox)
        lat = np.empty((n, lora), dtype=np.float32)
        ops.rms_norm(lat_in, kv_norm, eps, lat)
        # each (row, head)'s non-rotary query into the latent space: one matvec each
        xk = prep_kb(qn)
        t, c, m = kb_job
        if not lead(ctl, n_workers, t, c, m, xk, xk, (q_abs,), 0, NO_LIMIT, 0):
            return False
        width = lora + rot
        qcat = np.empty((n, n_head, width), dtype=np.float32)
        krow = np.empty((n, 1, width), dtype=np.float32)
        lat_r = np.empty((n, 1, lora), dtype=np.float32)
        for r in range(n):
            for i in range(n_head):
                for j in range(lora):
                    qcat[r, i, j] = q_abs[r, i * lora + j]
                for j in range(rot):
                    qcat[r, i, lora + j] = q_pe[r, i, j]
            for j in range(lora):
                krow[r, 0, j] = lat[r, j]
                lat_r[r, 0, j] = lat[r, j]
            for j in range(rot):
                krow[r, 0, lora + j] = k_pe[r, 0, j]
        if combined:
            att, ok = attend(ctl, n_workers, keys_all, values_all, qcat, krow, lat_r, caches, pos0s, 0, False, scale)
            if not ok:
                return False
            for i in range(n * n_head):
                for j in range(lora):
                    att_all[i, j] = att[i, j]
        else:
            for r in range(n):
                keys_job, values_job, kc, vc, cap = caches[r]
                att, ok = attend(ctl, n_workers, keys_job, values_job, qcat[r], krow[r], lat_r[r], kc, vc, pos0s[r],
                                 0, scale, 0, 0, cap)
                if not ok:
                    return False
                for i in range(n_head):
                    for j in range(lora):
                        att_all[r * n_head + i, j] = att[i, j]
        # each (row, head)'s output out of the latent space
        xv = prep_vb(att_all)
        t, c, m = vb_job
        if not lead(ctl, n_workers, t, c, m, xv, xv, (vb_out,), 0, NO_LIMIT, 0):
            return False
        t, c, m = out_job
        return out(ctl, n_workers, t, c, m, vb_out, (o,))

    _BLOCKS[key] = fn
    return fn

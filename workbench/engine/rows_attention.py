"""A decode batch's attention sub-layer (the families' shared attention) in one compiled call.

`token_attention.block_runner` over n sequences, one new token each (engine.batch): the q/k/v
and output products as rows jobs (`crew.rows_job`: each weight piece read once for all rows,
every output the one-token kernel's dot), biases, q/k norms and RoPE over the rows (each at its
own position), and each row's attention over its own cache by the one-token attention, the
cache's arguments per row in a typed list. The same functions in the same order as the
one-token call for every row, so a row's numbers are those of its sequence decoded alone
(tests/services/test_server_batch.py).
"""
from __future__ import annotations

from typing import Callable

import numba

from . import ops
from .kernels.jitcache import JIT as _NB

_BLOCKS: dict = {}


def rows_block_runner(qkv: Callable, attend: Callable, out: Callable, combined: bool = False) -> Callable:
    """The compiled attention sub-layer over a decode batch's rows: `qkv`, `out` the crew's rows
    product runners (`crew.product_runner(..., rows=True)`), `attend` the one-token attention of a
    cache run row by row, or with `combined` every row's in two jobs
    (`attention.rows_token_attention` over the jobs `attention.combine_row_jobs` made)."""
    key = (qkv, attend, out, combined)
    fn = _BLOCKS.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, qkv_job, q, k, v, bq, bk, bv, q_norm, k_norm, eps, cs, neox, prescale, caches, keys_all,
           values_all, pos0s, window, skip_slid, scale, out_job, att_all, o, bo):
        """h [n, n_embd] (normed) -> o [n, n_embd]; q, k, v: the products' outputs [n, n_head, hd],
        [n, n_kv, hd], [n, n_kv, hdv]; cs [n, rot / 2, 2] each row's RoPE (size 0: none); caches:
        per row (keys job, values job, keys, values, capacity) of its cache's layer; pos0s: each
        row's position; keys_all, values_all: the rows' attention jobs combined (`combined`);
        att_all [n, n_head * hdv] scratch. False when a worker failed."""
        n = h.shape[0]
        t, c, m = qkv_job
        if not qkv(ctl, n_workers, t, c, m, h, (q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1))):
            return False
        scale = ops.qkv_steps(q, k, v, bq, bk, bv, q_norm, k_norm, eps, cs, neox, prescale, scale)
        if combined:
            att, ok = attend(ctl, n_workers, keys_all, values_all, q, k, v, caches, pos0s, window, skip_slid, scale)
            if not ok:
                return False
            a = att.reshape(n, -1)
            for r in range(n):
                for j in range(a.shape[1]):
                    att_all[r, j] = a[r, j]
        else:
            for r in range(n):
                pos0 = pos0s[r]
                start = max(pos0 - window + 1, 0) if window else 0
                base = start // 64 * 64 if skip_slid else 0
                keys_job, values_job, kc, vc, cap = caches[r]
                att, ok = attend(ctl, n_workers, keys_job, values_job, q[r], k[r], v[r], kc, vc, pos0, window, scale,
                                 start, base, cap)
                if not ok:
                    return False
                a = att.reshape(-1)
                for j in range(a.shape[0]):
                    att_all[r, j] = a[j]
        t, c, m = out_job
        if not out(ctl, n_workers, t, c, m, att_all, (o,)):
            return False
        if bo.size:
            for r in range(n):
                o[r] += bo
        return True

    _BLOCKS[key] = fn
    return fn

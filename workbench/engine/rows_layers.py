"""A decode batch's every layer in one compiled call.

A server pass over n sequences ran each layer's attention (`rows_attention`, `rows_mla`) and
mixture-of-experts FFN (`rows_ffn`) as one compiled call each, with the residual adds, norms and
argument lists between them in Python. On R1's 61 blocks that Python was ~14 ms of a pass at 2,
4 or 8 rows (crew_timeline-style trace, Intel Xeon family 6 model 106, 2 threads: serial gaps
16.5 ms of a 28.9 ms pass at 2 rows) while the crew's workers spun. `rows_pass_runner` loops over
the layers in compiled code, as `token_layer.token_runner` does for one token: the same sub-layer
calls with the same arguments, the residual adds and norms by `ops.add_rms_norm` (the function
`Decoder.add_norm` calls), so every row's numbers are those of the calls one by one, which are
those of its sequence decoded alone (tests/services/test_server_batch.py).

The layers' fixed arguments come as one typed list (`token_layer.typed_layers`, by address); the
rows' caches as a second list, layer after layer of n row entries, with each layer's rows'
attention jobs combined (`attention.combine_row_jobs`) in a third: those change when a request
joins or leaves, the first only with the row count.
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np
from numba.core import types

from . import ops
from .kernels.jitcache import JIT as _NB
from .token_layer import borrowed, unowned_item

_PASSES: dict = {}


def rows_pass_runner(attn: Callable, ffn: Callable, layers_type: types.Type, items_type: types.Type,
                     jobs_type: types.Type) -> Callable:
    """The compiled pass over a batch's layers around `attn` (a `rows_mla.rows_mla_runner` or
    `rows_attention.rows_block_runner` function) and `ffn` (a `rows_ffn` runner); the three lists'
    types as numba.typeof gives them."""
    key = (attn, ffn, layers_type, items_type, jobs_type)
    fn = _PASSES.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, x, h, layers_at, items_at, jobs_at, ropes, pos0s, pass_ids):
        """x [n, n_embd] (the residual, updated in place), h its normed value entering the first
        layer; ropes [bases, n, rot / 2, 2] each row's RoPE per base; pos0s each row's position;
        pass_ids [routed layers, n, k] receives each routed layer's experts. Each layer's h_next
        gets its output normed by the next norm (the last: the output norm). False if a worker
        failed."""
        layers = borrowed(layers_at, layers_type)
        items = borrowed(items_at, items_type)
        jobs = borrowed(jobs_at, jobs_type)
        n = x.shape[0]
        routed = 0
        for i in range(len(layers)):
            (a_pre, a_mid, a_post, o, ffn_norm, f_args, f_out, f_ids, next_norm, eps, h_next, post_a, post_f,
             rope_i) = unowned_item(layers, i)
            caches = items[i * n:(i + 1) * n]
            keys_all, values_all = jobs[i]
            if not attn(ctl, n_workers, h, *a_pre, ropes[rope_i], *a_mid, caches, keys_all, values_all, pos0s,
                        *a_post):
                return False
            h2 = np.empty_like(x)
            ops.add_rms_norm(x, o, post_a, post_a.shape[0] != 0, ffn_norm, eps, h2)
            if not ffn(ctl, n_workers, h2, *f_args):
                return False
            if f_ids.shape[0]:
                for r in range(n):
                    for j in range(f_ids.shape[1]):
                        pass_ids[routed, r, j] = f_ids[r, j]
                routed += 1
            ops.add_rms_norm(x, f_out, post_f, post_f.shape[0] != 0, next_norm, eps, h_next)
            h = h_next
        return True

    _PASSES[key] = fn
    return fn

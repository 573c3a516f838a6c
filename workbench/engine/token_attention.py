"""A decoded token's whole attention sub-layer in one compiled call.

Decoding one token through an attention block is a dozen short steps: the q/k/v products, their
biases, the q/k norms, RoPE on q and k, the attention over the cache, the output product. Each
is fast compiled code, but each is a separate call from Python (argument unboxing, a dict lookup,
fresh outputs): measured ~30-50 us a layer, as much as a small model's products. `block_runner`
builds, per set of compiled pieces, one function that runs them in the general path's order with
the same functions (`ops.qkv_steps`: the biases, `ops.rms_norm_heads`, `ops.apply_rope`;
`attention.one_token_attention`, the crew's product runner), so the result is the same to the bit (tests/engine/test_token_attention.py).
"""
from __future__ import annotations

from typing import Callable

import numba

from . import ops
from .crew import ahead, write_ahead
from .kv_cache import token_slot_lines
from .kernels.jitcache import JIT as _NB

_BLOCKS: dict = {}


def block_runner(qkv: Callable, attend: Callable, out: Callable) -> Callable:
    """The compiled attention sub-layer around `qkv` and `out` (crew.product_runner functions for
    the q/k/v group and the output matrix) and `attend` (attention.one_token_attention, or
    attention.owners_attention for a cache split between nodes: kc, vc the owners' tuples)."""
    key = (qkv, attend, out)
    fn = _BLOCKS.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, qkv_job, q, k, v, bq, bk, bv, q_norm, k_norm, eps, cs, neox, prescale,
           keys_job, values_job, kc, vc, pos0, window, scale, lo, base, cap, out_job, o, bo):
        """h [n_embd] (normed) -> o [n_embd]; q, k, v: the products' outputs [n_head, hd],
        [n_kv, hd], [n_kv, hdv]; a bias, a norm weight or `cs` of size 0 is skipped. False when a
        worker failed."""
        t, c, n = qkv_job
        at, rows, stride, per = token_slot_lines(vc, pos0, base)
        write_ahead(t, at, rows, stride, per)   # the values' store and job below touch these lines
        if not qkv(ctl, n_workers, t, c, n, h, (q.reshape(-1), k.reshape(-1), v.reshape(-1))):
            return False
        ahead(ctl, keys_job)   # the workers read their keys while the norms and RoPE run here
        scale = ops.qkv_steps(q.reshape(1, q.shape[0], q.shape[1]), k.reshape(1, k.shape[0], k.shape[1]),
                              v.reshape(1, v.shape[0], v.shape[1]), bq, bk, bv, q_norm, k_norm, eps, cs, neox,
                              prescale, scale)
        att, ok = attend(ctl, n_workers, keys_job, values_job, q, k, v, kc, vc, pos0, window, scale, lo, base,
                         cap)
        if not ok:
            return False
        ahead(ctl, out_job)
        t, c, n = out_job
        if not out(ctl, n_workers, t, c, n, att.reshape(-1), (o,)):
            return False
        if bo.size:
            o += bo
        return True

    _BLOCKS[key] = fn
    return fn

"""A decoded token's dense gated FFN in one compiled call: gate/up products, activation, down.

A dense model's token took its FFN in three calls from Python (the gate/up group, the activation,
the down product), and the layer around it in a dozen more: `crew_timeline.py` measured serial gaps
of ~85 us a layer between the crew's jobs on the EPYC host for Gemma 3 270M (1.5 ms of a 12.6 ms
token at 1 thread, while the workers spin at 2). `dense_runner` composes the FFN from the product
runners `Runtime.gated` and `Runtime.linear` call for one token (`crew.product_runner`) and the
same activation functions, so that `token_layer` can run a dense layer, and a dense model's whole
token, in one call; the results are the same to the bit (tests/engine/test_token_attention.py).
"""
from __future__ import annotations

from typing import Callable

import numba

from . import ops
from .crew import ahead
from .kernels.jitcache import JIT as _NB

_RUNNERS: dict = {}


def dense_runner(gate_up: Callable, down: Callable) -> Callable:
    """The compiled one-token gated FFN over `gate_up` (the product runner of the gate and up
    group) and `down` (that of the down matrix)."""
    key = (gate_up, down)
    fn = _RUNNERS.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, gu_job, g, u, act, d_job, out, kind, gelu_table):
        """h [1, n_embd] (normed) -> out [n_embd]; g, u, act: scratch [1, n_ff]; gu_job, d_job:
        the products' (tasks, chunks, owned count). False if a worker failed."""
        t, c, n = gu_job
        if not gate_up(ctl, n_workers, t, c, n, h[0], (g[0], u[0])):
            return False
        ahead(ctl, d_job)
        ops.gate_mul(g, u, act, kind, gelu_table)
        t, c, n = d_job
        return down(ctl, n_workers, t, c, n, act[0], (out,))

    _RUNNERS[key] = fn
    return fn

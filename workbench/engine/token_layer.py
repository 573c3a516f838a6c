"""A decoded token's whole mixture-of-experts layer in one compiled call.

With the attention sub-layer (`token_attention`) and the routed FFN (`expert_token`) each one
compiled call, what remained between them was Python: the residual adds, the norms, argument
lists. `crew_timeline.py` measured it as serial gaps of 55-110 us before each layer's q/k/v
products and 24-58 us before its router on the EPYC host (2 threads), while the crew's workers
spin: a quarter of a synthetic Qwen3-MoE token. `layer_runner` composes both calls with the residual
adds and norms (`ops.add_rms_norm`, the function the step-by-step path calls) in one function, so
the result is the same to the bit; `Runtime.layer_token` keeps the arguments that do not change
from token to token (tests/engine/test_token_attention.py compares both paths).
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from . import ops
from .kernels.jitcache import JIT as _NB

_LAYERS: dict = {}
_NONE = np.zeros(0, dtype=np.float32)


def layer_runner(attn: Callable, ffn: Callable) -> Callable:
    """The compiled layer around `attn` (a `token_attention.block_runner` function) and `ffn` (an
    `expert_token.routed_runner` function)."""
    key = (attn, ffn)
    fn = _LAYERS.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, x, h, a_head, rope, a_mid, pos0, a_win, start, base, a_tail, o, ffn_norm, f_args,
           f_out, next_norm, eps, h_next):
        """x [1, n_embd] (the residual, updated in place), h its normed value -> h_next, x normed
        by `next_norm`; o, f_out: the sub-layers' outputs [1, n_embd]. False if a worker failed."""
        if not attn(ctl, n_workers, h[0], *a_head, rope, *a_mid, pos0, *a_win, start, base, *a_tail):
            return False
        h2 = np.empty_like(x)
        ops.add_rms_norm(x, o, _NONE, False, ffn_norm, eps, h2)
        if not ffn(ctl, n_workers, h2, *f_args):
            return False
        ops.add_rms_norm(x, f_out, _NONE, False, next_norm, eps, h_next)
        return True

    _LAYERS[key] = fn
    return fn

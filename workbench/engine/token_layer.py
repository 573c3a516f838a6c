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


_TOKENS: dict = {}


@numba.njit(**_NB)
def typed_layers(layers):
    """A typed list of the layers' argument tuples (all of one type), made in compiled code: made
    from Python, each append compiles numba's list methods for the item type in every process
    (1.9 s before a model's first decoded token); here they come from the disk cache."""
    out = numba.typed.List()
    for i in range(len(layers)):
        out.append(layers[i])
    return out


def token_runner(attn: Callable, ffn: Callable) -> Callable:
    """A decoded token's every layer in one compiled call: `layer_runner`'s steps in a loop over a
    typed list of the layers' fixed arguments (unboxed once per token, not once per layer: a
    layer's ~50 arrays cost ~20 us to pass from Python), the attention window computed here."""
    key = (attn, ffn)
    fn = _TOKENS.get(key)
    if fn is not None:
        return fn
    layer = layer_runner(attn, ffn)

    @numba.njit(**_NB)
    def fn(ctl, n_workers, x, h, layers, rope, pos0, skip_slid):
        """x [1, n_embd] (the residual, updated in place), h its normed value entering the first
        layer; each layer's h_next receives its output normed by the next norm. False if a
        worker failed."""
        for i in range(len(layers)):
            a_head, a_mid, window, scale, a_tail, o, ffn_norm, f_args, f_out, next_norm, eps, h_next = layers[i]
            start = max(pos0 - window + 1, 0) if window else 0
            base = start // 64 * 64 if skip_slid else 0
            if not layer(ctl, n_workers, x, h, a_head, rope, a_mid, pos0, (window, scale), start, base, a_tail, o,
                         ffn_norm, f_args, f_out, next_norm, eps, h_next):
                return False
            h = h_next
        return True

    _TOKENS[key] = fn
    return fn

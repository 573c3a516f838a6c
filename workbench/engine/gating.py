"""A mixture-of-experts router's numerics: which experts a token goes to, with what weights.

llama.cpp's build_moe_ffn after the router product: softmax or sigmoid of the router logits, an
optional selection bias (DeepSeek V3's exp_probs_b), optional grouped selection (the best
`n_group_used` groups by the sum of their top-2 scores), top-k, weights taken from the unbiased
probabilities, optionally normalised to sum 1 and scaled, all in f32. Shared by the model code
(prompts) and the runtime's compiled one-token path (`expert_token`), so both route alike.

The softmax follows ggml's CPU float order (16-lane exps summed in double, then one f32 scale;
sum_rows in double; f32 div and scale), so the same experts win as in llama.cpp.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np

from .kernels.jitcache import JIT as _JIT
from .ops import ggml_expf, softmax_group_sum
from .kernels.llama_build import SOFTMAX_LANES

SOFTMAX, SIGMOID = 1, 2  # llama.cpp's expert_gating_func values


@nb.njit(**_JIT)
def softmax_rows(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max of each row of float32 x (blocks of 16 exps reduced as _mm512_reduce_add_ps, on
    the AVX2 build of 8 by its 256-bit tree, summed in double; leftovers with expf; one f32 scale by
    1/sum)."""
    n, m = x.shape
    out = np.empty((n, m), dtype=np.float32)
    for r in range(n):
        mx = np.float32(-np.inf)
        for j in range(m):
            if x[r, j] > mx:
                mx = x[r, j]
        s = 0.0
        j = 0
        while j + SOFTMAX_LANES - 1 < m:
            for i in range(SOFTMAX_LANES):
                out[r, j + i] = ggml_expf(x[r, j + i] - mx)
            s += np.float64(softmax_group_sum(out[r], j))
            j += SOFTMAX_LANES
        while j < m:
            v = np.float32(math.exp(np.float32(x[r, j] - mx)))
            out[r, j] = v
            s += np.float64(v)
            j += 1
        inv = np.float32(1.0 / s)
        for j in range(m):
            out[r, j] = out[r, j] * inv
    return out


@nb.njit(**_JIT)
def sigmoid_rows(x: np.ndarray) -> np.ndarray:
    """ggml_sigmoid: 1 / (1 + expf(-x)) in float32."""
    n, m = x.shape
    out = np.empty((n, m), dtype=np.float32)
    for r in range(n):
        for j in range(m):
            out[r, j] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-x[r, j])))
    return out


@nb.njit(**_JIT)
def _best(v: np.ndarray, k: int, out: np.ndarray) -> None:
    """Indices of the k largest of v, largest first (ggml_argsort_top_k; ties: lower index).

    One pass keeping the best k in order (value down, index up): an element displaces the last
    only when strictly larger, and goes in after every one it does not beat, so ties keep the lower
    index ahead. k passes over 256 experts (R1's router) took ~2 us a layer of a decoded token."""
    n = 0
    for j in range(v.shape[0]):
        x = v[j]
        if n == k:
            if not x > v[out[k - 1]]:
                continue
            p = k - 1
        else:
            p = n
            n += 1
        while p > 0 and x > v[out[p - 1]]:
            out[p] = out[p - 1]
            p -= 1
        out[p] = j


@nb.njit(**_JIT)
def route_core(probs: np.ndarray, k: int, bias: np.ndarray, n_groups: int, n_group_used: int, norm: bool,
           scale: float) -> tuple[np.ndarray, np.ndarray]:
    """`route`'s selection, compiled, on arguments it has checked (a compiled caller, such as a
    token's experts call, `expert_token`, passes them checked already)."""
    n, n_exp = probs.shape
    ids = np.empty((n, k), dtype=np.int64)
    w = np.empty((n, k), dtype=np.float32)
    sel = np.empty(n_exp, dtype=np.float32)
    per = n_exp // n_groups if n_groups > 1 else n_exp
    two = np.empty(2, dtype=np.int64)
    gsc = np.empty(max(n_groups, 1), dtype=np.float32)
    keep = np.empty(max(n_group_used, 1), dtype=np.int64)
    for t in range(n):
        for j in range(n_exp):
            sel[j] = probs[t, j] + bias[j] if bias.shape[0] == n_exp else probs[t, j]
        if n_groups > 1:
            # each group's score: the sum (in double, as ggml_sum_rows) of its two best
            for g in range(n_groups):
                _best(sel[g * per:(g + 1) * per], 2, two)
                gsc[g] = np.float32(np.float64(sel[g * per + two[0]]) + np.float64(sel[g * per + two[1]]))
            _best(gsc, n_group_used, keep)
            for g in range(n_groups):
                used = False
                for i in range(n_group_used):
                    if keep[i] == g:
                        used = True
                if not used:
                    for j in range(g * per, (g + 1) * per):
                        sel[j] = -np.inf
        _best(sel, k, ids[t])
        for i in range(k):
            w[t, i] = probs[t, ids[t, i]]
        if norm:
            s = 0.0
            for i in range(k):
                s += np.float64(w[t, i])
            sf = max(np.float32(s), np.float32(6.103515625e-5))
            for i in range(k):
                w[t, i] = w[t, i] / sf
        if scale != 0.0 and scale != 1.0:
            for i in range(k):
                w[t, i] = w[t, i] * np.float32(scale)
    return ids, w


def route(probs: np.ndarray, k: int, bias: np.ndarray | None = None, n_groups: int = 0, n_group_used: int = 0,
          norm: bool = False, scale: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Experts [n, k] (best first) and their weights [n, k] float32 from router probabilities
    [n, n_expert], as llama.cpp's build_moe_ffn does after the gating function: selection on
    probs + bias (grouped: only the n_group_used groups with the best top-2 sums), weights from
    the unbiased probabilities, optionally normalised (clamped sum) and scaled, all in f32."""
    probs = np.ascontiguousarray(probs, dtype=np.float32)
    b = np.ascontiguousarray(bias, dtype=np.float32) if bias is not None else np.zeros(0, dtype=np.float32)
    if n_groups > 1 and (probs.shape[1] % n_groups or not 0 < n_group_used <= n_groups):
        raise ValueError(f"{probs.shape[1]} experts cannot be used as {n_group_used} of {n_groups} groups")
    return route_core(probs, k, b, n_groups, n_group_used, norm, float(scale))


class Gating(NamedTuple):
    """How a layer's router logits become experts and weights (llama.cpp's hparams)."""
    kind: int                  # SOFTMAX or SIGMOID
    k: int                     # experts per token
    bias: np.ndarray           # selection bias [n_expert] float32, or empty
    n_groups: int              # expert groups (0 or 1: none)
    n_group_used: int
    norm: bool                 # renormalise the k weights
    scale: float               # weight scale (0 or 1: none)


@nb.njit(**_JIT)
def gate(logits: np.ndarray, kind: int) -> np.ndarray:
    """The gating function's probabilities of router logits [n, n_expert] (float32)."""
    return sigmoid_rows(logits) if kind == SIGMOID else softmax_rows(logits)

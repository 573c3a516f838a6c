"""Attention over a KV cache that is split by position blocks between workers.

Each worker owns every W-th block of `BLOCK` positions (round robin), stored in
memory that the worker itself touched first, so its attention reads stay on
its own node whatever the context length. Attention runs in two passes so the
result equals llama.cpp's non-flash path (scores, softmax, then probabilities
rounded to f16 times the f16 values) whatever the number of workers:

1. each worker: scores over its positions, its max and its sum of exps;
2. the global max M and sum L are merged; each worker adds
   f16(exp(s - M) / L) * v over its positions; the partial outputs are summed.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .kernels.simd import bits_to_f32, round_f16

BLOCK = 32
_JIT = dict(nogil=True, cache=True)


@nb.njit(**_JIT)
def _slot_position(j: int, w: int, n_workers: int) -> int:
    return ((j // BLOCK) * n_workers + w) * BLOCK + j % BLOCK


@nb.njit(**_JIT)
def scores_pass(q: np.ndarray, kc: np.ndarray, w: int, n_workers: int, n_slots: int, pos0: int,
                window: int, scale: float, scores: np.ndarray, mx: np.ndarray, sm: np.ndarray) -> None:
    """q [n, H, hd] f32 (already rounded to f16 values); kc [cap, n_kv, hd] f16 bits of worker w.

    Fills scores [n, H, n_slots] (-inf where masked) and this worker's max mx [n, H] and
    sum of exp(score - max) sm [n, H] (float64).
    """
    n, n_head, hd = q.shape
    group = n_head // kc.shape[1]
    for t in range(n):
        p = pos0 + t
        for h in range(n_head):
            kvh = h // group
            m = np.float32(-np.inf)
            for j in range(n_slots):
                g = _slot_position(j, w, n_workers)
                if g > p or (window > 0 and p - g >= window):
                    scores[t, h, j] = -np.inf
                    continue
                d = np.float32(0.0)
                for i in range(hd):
                    d += q[t, h, i] * bits_to_f32(kc[j, kvh, i])
                d = d * np.float32(scale)
                scores[t, h, j] = d
                if d > m:
                    m = d
            s = 0.0
            if m > -np.inf:
                for j in range(n_slots):
                    v = scores[t, h, j]
                    if v > -np.inf:
                        s += np.float32(math.exp(v - m))
            mx[t, h] = m
            sm[t, h] = s


@nb.njit(**_JIT)
def merge_stats(mxs: np.ndarray, sms: np.ndarray, big_m: np.ndarray, inv_l: np.ndarray) -> None:
    """mxs/sms [W, n, H] per worker -> global max and 1/sum per query and head."""
    n_w, n, n_head = mxs.shape
    for t in range(n):
        for h in range(n_head):
            m = np.float32(-np.inf)
            for w in range(n_w):
                if mxs[w, t, h] > m:
                    m = mxs[w, t, h]
            s = 0.0
            for w in range(n_w):
                if mxs[w, t, h] > -np.inf:
                    # re-add each worker's exps against the global max (exact for one worker)
                    s += sms[w, t, h] * math.exp(np.float64(mxs[w, t, h]) - np.float64(m)) \
                        if mxs[w, t, h] != m else sms[w, t, h]
            big_m[t, h] = m
            inv_l[t, h] = np.float32(1.0 / s)


@nb.njit(**_JIT)
def values_pass(scores: np.ndarray, vc: np.ndarray, n_slots: int, big_m: np.ndarray, inv_l: np.ndarray,
                out: np.ndarray) -> None:
    """out [n, H, hdv] = sum over this worker's slots of f16(exp(s - M) / L) * v."""
    n, n_head, hdv = out.shape
    group = n_head // vc.shape[1]
    for t in range(n):
        for h in range(n_head):
            kvh = h // group
            for i in range(hdv):
                out[t, h, i] = 0.0
            m = big_m[t, h]
            il = inv_l[t, h]
            for j in range(n_slots):
                s = scores[t, h, j]
                if s == -np.inf:
                    continue
                wgt = round_f16(np.float32(math.exp(s - m)) * il)
                for i in range(hdv):
                    out[t, h, i] += wgt * bits_to_f32(vc[j, kvh, i])


@nb.njit(**_JIT)
def round_f16_array(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    flat_in = x.reshape(-1)
    flat_out = out.reshape(-1)
    for i in range(flat_in.shape[0]):
        flat_out[i] = round_f16(flat_in[i])
    return out

"""A decoded token's multi-head latent attention sub-layer (DeepSeek 2/3) in one compiled call.

`models/deepseek2.py` runs MLA step by step: the q-LoRA and latent products, a norm, the q_b
product, RoPE on the query's and key's rotary parts, the latent's norm, each head's query mapped
into the latent space (attn_k_b), the attention over the latent cache, each head's output
decompressed (attn_v_b), the output product. From Python that is some twenty calls a layer: at
R1's 61 blocks, most of a token's time went to the gaps between the crew's jobs
(`benchmarks/crew_timeline.py`). `mla_block_runner` runs the same functions in the same order in
one call (`ops.rms_norm`, `ops.apply_rope`, the crew's product runners, the per-head products as
one crew job each, `attention.one_token_attention` over the cache's one KV head), so the result is
the same to the bit (tests/engine/test_mla_token.py), and it takes the argument layout of
`token_attention.block_runner`'s functions, so `token_layer` composes it into a layer and a
token's every layer.
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from . import ops
from .crew import NO_LIMIT, ahead, write_ahead
from .kv_cache import token_slot_lines
from .kernels.jitcache import JIT as _NB

_BLOCKS: dict = {}


def mla_block_runner(first: Callable, q_b: Callable, lead: Callable, prep_kb: Callable, prep_vb: Callable,
                     attend: Callable, out: Callable) -> Callable:
    """The compiled MLA sub-layer around the crew's product runners `first` (q_a or q, with
    kv_a_mqa), `q_b` (the q-LoRA's second product; unused without q-LoRA), `out` (attn_output),
    the crew's `lead` for the per-head products of attn_k_b / attn_v_b (their inputs prepared by
    `prep_kb` / `prep_vb`), and `attend` (attention.one_token_attention)."""
    key = (first, q_b, lead, prep_kb, prep_vb, attend, out)
    fn = _BLOCKS.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB)
    def fn(ctl, n_workers, h, a_job, qa, ckv, qa_norm, eps, qb_job, q, kb_job, qn, q_abs, rope, neox, nope,
           kv_norm, keys_job, values_job, kc, vc, qcat, krow, lat, pos0, window, scale, lo, base, cap, vb_job,
           vb_out, out_job, o):
        """h [n_embd] (normed) -> o [n_embd]. qa, ckv: the first products' outputs (qa is q itself
        without q-LoRA: qa_norm of size 0); q [n_head * (nope + rot)]; qn [n_head, nope], q_abs
        [n_head, kv_lora], qcat [n_head, kv_lora + rot], krow [1, kv_lora + rot], lat [1, kv_lora],
        vb_out [n_head, v_head]: scratch. False when a worker failed."""
        t, c, n = a_job
        # the latent goes down a column of the transposed part: a cold line per latent dimension,
        # asked for (prefetchw) while the first products stream, as `block_runner` does its values'
        at, rows, stride, per = token_slot_lines(vc, pos0, base)
        write_ahead(t, at, rows, stride, per)
        if not first(ctl, n_workers, t, c, n, h, (qa, ckv)):
            return False
        if qa_norm.shape[0]:
            ahead(ctl, qb_job)
            qan = np.empty((1, qa.shape[0]), dtype=np.float32)
            ops.rms_norm(qa.reshape(1, -1), qa_norm, eps, qan)
            t, c, n = qb_job
            if not q_b(ctl, n_workers, t, c, n, qan[0], (q,)):
                return False
        ahead(ctl, kb_job)
        n_head, lora = q_abs.shape
        dk = q.shape[0] // n_head
        rot = dk - nope
        q2 = q.reshape(n_head, dk)
        q_pe = np.empty((1, n_head, rot), dtype=np.float32)
        for i in range(n_head):
            for j in range(rot):
                q_pe[0, i, j] = q2[i, nope + j]
            for j in range(nope):
                qn[i, j] = q2[i, j]
        ops.apply_rope(q_pe, rope, neox)
        k_pe = np.empty((1, 1, rot), dtype=np.float32)
        for j in range(rot):
            k_pe[0, 0, j] = ckv[lora + j]
        ops.apply_rope(k_pe, rope, neox)
        lat_in = np.empty((1, lora), dtype=np.float32)
        for j in range(lora):
            lat_in[0, j] = ckv[j]
        ops.rms_norm(lat_in, kv_norm, eps, lat)
        # each head's non-rotary query into the latent space: one matvec per head (mul_mat of a 3-D weight)
        xk = prep_kb(qn)
        t, c, n = kb_job
        if not lead(ctl, n_workers, t, c, n, xk, xk, (q_abs.reshape(-1),), 0, NO_LIMIT, 0):
            return False
        ahead(ctl, keys_job)
        for i in range(n_head):
            for j in range(lora):
                qcat[i, j] = q_abs[i, j]
            for j in range(rot):
                qcat[i, lora + j] = q_pe[0, i, j]
        for j in range(lora):
            krow[0, j] = lat[0, j]
        for j in range(rot):
            krow[0, lora + j] = k_pe[0, 0, j]
        att, ok = attend(ctl, n_workers, keys_job, values_job, qcat, krow, lat, kc, vc, pos0, window, scale, lo,
                         base, cap)
        if not ok:
            return False
        ahead(ctl, vb_job)
        # each head's output out of the latent space
        xv = prep_vb(att)
        t, c, n = vb_job
        if not lead(ctl, n_workers, t, c, n, xv, xv, (vb_out.reshape(-1),), 0, NO_LIMIT, 0):
            return False
        ahead(ctl, out_job)
        t, c, n = out_job
        return out(ctl, n_workers, t, c, n, vb_out.reshape(-1), (o,))

    _BLOCKS[key] = fn
    return fn

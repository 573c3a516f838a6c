"""Perplexity with llama-perplexity's method.

The text is tokenized once (with BOS), cut into chunks of n_ctx tokens; each
chunk starts a fresh cache with its first token replaced by BOS, and only the
second half of each chunk is scored (each token predicted from the logits of
the position before it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .engine import Engine


@dataclass
class PerplexityResult:
    ppl: float
    chunks: int
    n_ctx: int
    scored_tokens: int
    chunk_ppl: list[float]


def perplexity(engine: Engine, text: str, n_ctx: int = 512,
               progress: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    tok = engine.tokenizer
    ids = tok.encode(text, add_bos=None)
    n_chunks = len(ids) // n_ctx
    if n_chunks < 1:
        raise ValueError(f"text has {len(ids)} tokens; perplexity needs at least n_ctx = {n_ctx}")
    first = n_ctx // 2
    nll_total, count = 0.0, 0
    chunk_ppl = []
    session = engine.new_session(n_ctx)
    for c in range(n_chunks):
        chunk = list(ids[c * n_ctx:(c + 1) * n_ctx])
        if tok.add_bos and tok.bos_id is not None:
            chunk[0] = tok.bos_id
        session.reset()
        logits = session.eval(chunk, logit_rows=slice(first, n_ctx - 1))
        targets = np.asarray(chunk[first + 1:n_ctx], dtype=np.int64)
        lg = logits.astype(np.float64)
        m = lg.max(axis=1, keepdims=True)
        lse = np.log(np.exp(lg - m).sum(axis=1)) + m[:, 0]
        nll = lse - lg[np.arange(len(targets)), targets]
        nll_total += float(nll.sum())
        count += len(targets)
        chunk_ppl.append(float(np.exp(nll.mean())))
        if progress:
            progress(c + 1, n_chunks, float(np.exp(nll_total / count)))
    return PerplexityResult(float(np.exp(nll_total / count)), n_chunks, n_ctx, count, chunk_ppl)

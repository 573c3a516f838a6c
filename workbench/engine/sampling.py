"""Token sampling: greedy, repetition penalty, top-k, top-p, min-p, temperature, seed.

The order follows llama.cpp's default chain (penalties, top-k, top-p, min-p,
temperature, then a draw), so the same settings mean the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def validate(self) -> None:
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0 (got {self.temperature})"),
            (self.top_k >= 0, f"top-k must be >= 0 (got {self.top_k})"),
            (0 < self.top_p <= 1, f"top-p must be in (0, 1] (got {self.top_p})"),
            (0 <= self.min_p < 1, f"min-p must be in [0, 1) (got {self.min_p})"),
            (self.repeat_penalty > 0, f"repeat penalty must be > 0 (got {self.repeat_penalty})"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


@dataclass
class Sampler:
    params: SamplingParams
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.params.validate()
        self.rng = np.random.default_rng(self.params.seed)

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if p.repeat_penalty != 1.0 and history:
            logits = logits.copy()
            recent = np.unique(np.asarray(history[-p.repeat_last_n:], dtype=np.int64))
            vals = logits[recent]
            logits[recent] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        if p.temperature <= 0:
            return int(np.argmax(logits))
        # candidates sorted by logit, best first
        k = p.top_k if 0 < p.top_k < len(logits) else len(logits)
        if k < len(logits):
            idx = np.argpartition(-logits, k - 1)[:k]
        else:
            idx = np.arange(len(logits))
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        vals = logits[idx].astype(np.float64)
        if p.top_p < 1.0:
            probs = np.exp(vals - vals[0])
            probs /= probs.sum()
            cut = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            idx, vals = idx[:cut], vals[:cut]
        if p.min_p > 0:
            keep = vals >= vals[0] + np.log(p.min_p)
            idx, vals = idx[keep], vals[keep]
        vals = vals / p.temperature
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        return int(idx[self.rng.choice(len(idx), p=probs)])

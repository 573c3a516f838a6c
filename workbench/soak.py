"""A long chat session driven headless: memory, threads and outputs must stay stable.

Every turn is greedy; the context is small so old turns slide out again and
again. At checkpoints the last reply is recomputed from scratch in a fresh
session over the same conversation: it must be identical to what the long
session produced with its reused, shifted cache.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import psutil

from .engine import Chat, DoneEvent, Engine, SamplingParams

PROMPTS = ["Tell me about the sea.", "What is a cat?", "Count to five.", "Name a colour.",
           "Why is the sky blue?", "Say something short.", "What is 2 + 2?", "Describe a tree."]


@dataclass
class SoakResult:
    turns: int
    rss_mb: list[float] = field(default_factory=list)      # after each turn
    threads: list[int] = field(default_factory=list)
    mismatches: list[int] = field(default_factory=list)    # turns whose reply differed from a fresh run
    slides: int = 0

    def rss_growth(self, warmup: int) -> float:
        """Relative growth of resident memory after the warm-up turns."""
        base = self.rss_mb[min(warmup, len(self.rss_mb) - 1)]
        return max(self.rss_mb[warmup:] or [base]) / base - 1.0


def soak(engine: Engine, turns: int, n_ctx: int = 256, n_predict: int = 24, check_every: int = 10,
         progress: Callable[[int, SoakResult], None] | None = None) -> SoakResult:
    proc = psutil.Process()
    chat = Chat(engine, n_ctx=n_ctx, slide=True)
    greedy = SamplingParams(temperature=0)
    res = SoakResult(turns)
    for i in range(turns):
        before = len(chat.messages)
        done = [e for e in chat.send(PROMPTS[i % len(PROMPTS)], greedy, n_predict) if isinstance(e, DoneEvent)][0]
        if len(chat.messages) < before + 2:
            res.slides += 1
        if check_every and (i + 1) % check_every == 0:
            # recompute the last reply from scratch over the same conversation
            last = chat.messages.pop()
            ids = chat.prompt_tokens()
            chat.messages.append(last)
            fresh = engine.new_session(n_ctx)
            ref = [e for e in fresh.generate(ids, greedy, min(n_predict, n_ctx - len(ids) - 1))
                   if isinstance(e, DoneEvent)][0]
            fresh.close()
            if ref.tokens != done.tokens:
                res.mismatches.append(i + 1)
        res.rss_mb.append(proc.memory_info().rss / 2**20)
        res.threads.append(threading.active_count())
        if progress:
            progress(i + 1, res)
    return res

"""One sequence's token loop, the same wherever the forward passes run.

`Session.generate` (one process), `Scheduler` (continuous batching, engine/batch.py) and a
model pipelined over Ray hosts (workbench/cluster) all turn sampled tokens into a stream the
same way: end-of-generation ids, stop strings (text that may begin one is held back), the
token budget, the context limit, cancellation, streamed text pieces and the final stats.
`Generation` is that bookkeeping; the caller only runs the passes and picks tokens.

`Picker` chooses the next token from logits (the sampler over the sequence's history, with
OpenAI's frequency and presence penalties). It is picklable, so when the logits live on
another host (a pipeline's last stage) the picker travels there and only token ids come back.

`reusable_prefix` is how much of a sequence's cache a new prompt may keep, for every cache that
keeps its tokens (a `Session`, a pipeline's stream, a scheduler's slot).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Iterator

import numpy as np

from .events import DoneEvent, Stats, TokenEvent
from .sampling import Sampler, SamplingParams
from .tokenizer import StreamDecoder, Tokenizer


def common_prefix(a: Iterable[int], b: Iterable[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reusable_prefix(cached: Iterable[int], prompt: list[int]) -> int:
    """Cached positions a prompt may keep: the prefix it shares with the cached tokens, short of
    its last token (that one is fed again, for its logits)."""
    return min(common_prefix(cached, prompt), len(prompt) - 1)


class Picker:
    """The next token from a row of logits; the sequence's history (prompt and tokens picked so
    far) feeds the repetition, frequency and presence penalties."""

    def __init__(self, params: SamplingParams | None = None, history: Iterable[int] = (),
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0):
        self.params = params or SamplingParams()
        self.sampler = Sampler(self.params)
        self.history = list(history)
        self.frequency_penalty = frequency_penalty
        self.presence_penalty = presence_penalty

    def pick(self, logits: np.ndarray) -> int:
        """Sample a token from `logits` and append it to the history."""
        if self.frequency_penalty or self.presence_penalty:
            logits = np.array(logits, dtype=np.float32)
            n = self.params.repeat_last_n
            recent = self.history[-n:] if n > 0 else []
            if recent:
                ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
                logits[ids] -= (counts * self.frequency_penalty + self.presence_penalty).astype(np.float32)
        tok = int(self.sampler.sample(logits, self.history))
        self.history.append(tok)
        return tok


class Generation:
    """The bookkeeping of one sequence's generation (see module doc).

    Feed it each picked token with `accept` (it returns the text events to give out and sets
    `reason` when the sequence is over), then `finish` for the tail and the DoneEvent. `stream`
    is the whole loop for a caller that runs one sequence synchronously."""

    def __init__(self, tokenizer: Tokenizer, prompt: list[int], params: SamplingParams | None = None,
                 n_predict: int = 128, n_ctx: int = 1 << 62, stop: Iterable[str] = (),
                 stop_ids: set[int] | None = None, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, t0: float | None = None, stats: Stats | None = None):
        """`n_predict` < 0: until the context is full; `t0`: when the request began (time to
        first token counts from it); `stats`: the object to fill (a new one by default)."""
        self.picker = Picker(params, prompt, frequency_penalty, presence_penalty)
        self.stop = [s for s in stop if s]
        self.stop_ids = set(tokenizer.eot_ids) if stop_ids is None else set(stop_ids)
        self.n_predict = n_predict if n_predict >= 0 else 1 << 62
        self.n_ctx = n_ctx
        self.stats = stats if stats is not None else Stats()
        self.t0 = time.perf_counter() if t0 is None else t0
        self.t_first = 0.0
        self.t_decode = 0.0
        self.decoder = StreamDecoder(tokenizer)
        self.out: list[int] = []
        self.sent = ""      # text given out
        self.held = ""      # text held back: it may begin a stop string
        self.reason = "length" if self.n_predict == 0 else ""

    @property
    def done(self) -> bool:
        return bool(self.reason)

    def begin_decode(self) -> None:
        """The prompt is in the cache: decode time counts from now."""
        self.t_decode = time.perf_counter()

    def accept(self, token: int, cached: int) -> list[TokenEvent]:
        """Take the token picked next; `cached` is the number of positions in the cache before it
        (it needs one more to be fed). Returns the text to give out; sets `reason` when over."""
        now = time.perf_counter()
        if not self.out and not self.t_first:
            self.t_first = now
            self.stats.ttft = now - self.t0
        if token in self.stop_ids:
            self.reason = "eos"
            return []
        self.out.append(int(token))
        events, hit = self._emit(self.decoder.feed(int(token)), now)
        if hit:
            self.reason = "stop"
        elif cached >= self.n_ctx:
            self.reason = "context"
        elif len(self.out) >= self.n_predict:
            self.reason = "length"
        return events

    def cancel(self) -> None:
        self.reason = "cancelled"

    def _emit(self, piece: str, now: float) -> tuple[list[TokenEvent], bool]:
        """New text to give out, holding back what may begin a stop string; True when one was hit."""
        if not piece:
            return [], False
        tok = self.out[-1] if self.out else -1
        if not self.stop:
            self.sent += piece
            return [TokenEvent(tok, piece, now)], False
        text = self.held + piece
        start = max(0, len(self.sent) - max(len(s) for s in self.stop))
        full = self.sent + text
        hits = [i for i in (full.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            out = full[len(self.sent):min(hits)]
            self.held = ""
            self.sent += out
            return ([TokenEvent(tok, out, now)] if out else []), True
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(full)), 0, -1):
                if full.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        hold = min(hold, len(text))
        out, self.held = text[:len(text) - hold], text[len(text) - hold:]
        self.sent += out
        return ([TokenEvent(tok, out, now)] if out else []), False

    def finish(self, reason: str | None = None) -> list[TokenEvent | DoneEvent]:
        """End the sequence (`reason` overrides the one found): the last text (the decoder's tail
        and held-back text, unless a stop string ended it), then the DoneEvent."""
        if reason:
            self.reason = reason
        reason = self.reason or "length"
        events: list[TokenEvent | DoneEvent] = []
        if reason != "stop":
            tail = self.held + self.decoder.flush()
            self.held = ""
            if tail:
                self.sent += tail
                events.append(TokenEvent(-1, tail, time.perf_counter()))
        st = self.stats
        st.stop_reason = reason
        st.decode_tokens = max(len(self.out) - 1, 0)
        st.decode_seconds = time.perf_counter() - self.t_decode if st.decode_tokens and self.t_decode else 0.0
        events.append(DoneEvent(st, list(self.out), self.sent))
        return events

    def stream(self, first: Callable[[], int], step: Callable[[int], int], cached: Callable[[], int],
               cancel: threading.Event | None = None) -> Iterator[TokenEvent | DoneEvent]:
        """The loop for one sequence: `first()` processes the prompt and returns the first token
        picked (the caller sets stats.prompt_*), `step(token)` feeds a token and returns the next,
        `cached()` counts the positions in the cache. Yields TokenEvents, then one DoneEvent."""
        tok = first()
        self.begin_decode()
        while not self.done:
            if cancel is not None and cancel.is_set():
                self.cancel()
                break
            yield from self.accept(tok, cached())
            if self.done:
                break
            tok = step(tok)
        yield from self.finish()


__all__ = ["Generation", "Picker", "common_prefix", "reusable_prefix"]

"""What a generation gives out, wherever it runs: `TokenEvent`s (streamed text pieces), one
`DoneEvent` with the `Stats`, and the two ways a request ends early (`ContextFullError`,
`Cancelled`).

`Session.generate` (engine.py), the token loop `Generation` (generation.py), the batching
scheduler (batch.py) and a model pipelined over Ray hosts (workbench/cluster) all speak these
types; they import nothing else of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    ttft: float = 0.0  # request to first generated token, seconds
    stop_reason: str = ""

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "prompt_tps": self.prompt_tps,
                "decode_tokens": self.decode_tokens, "decode_tps": self.decode_tps,
                "ttft": self.ttft, "stop_reason": self.stop_reason}


@dataclass
class TokenEvent:
    token: int
    text: str
    t: float


@dataclass
class DoneEvent:
    stats: Stats
    tokens: list[int] = field(default_factory=list)
    text: str = ""


class ContextFullError(ValueError):
    pass


class Cancelled(Exception):
    """Prompt processing was cancelled; the cache holds the batches done so far."""


__all__ = ["Cancelled", "ContextFullError", "DoneEvent", "Stats", "TokenEvent"]

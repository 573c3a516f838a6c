"""The values `numawb serve` runs with (`ServeOptions`), checked before a model is loaded.

Light to import (no uvicorn, no engine): the command line builds its parser from this package.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import UserError


def slot_context(total: int, n_parallel: int) -> int:
    """Tokens per slot: llama-server's split of -c among -np slots (0: DEFAULT_CTX per slot)."""
    from ..engine.engine import DEFAULT_CTX
    return DEFAULT_CTX if total <= 0 else total // n_parallel


@dataclass
class ServeOptions:
    """Where and how to serve: the flags of ``numawb serve`` beside the model's (see
    `workbench.server.add_arguments`)."""

    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 4            # slots: sequences decoded together
    ctx_size: int = 0            # total context shared by the slots (0: DEFAULT_CTX per slot)
    max_queue: int = 64          # requests that may wait for a slot
    api_key: str | None = None
    alias: str | None = None     # the model's name in /v1/models (default: the file name)
    shutdown_timeout: float = 10.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ServeOptions":
        return cls(host=args.host, port=args.port, parallel=args.parallel, ctx_size=args.ctx_size,
                   max_queue=args.max_queue, api_key=args.api_key, alias=args.alias,
                   shutdown_timeout=args.shutdown_timeout)

    @property
    def slot_ctx(self) -> int:
        return slot_context(self.ctx_size, self.parallel)

    def check(self) -> "ServeOptions":
        """Raise UserError (one line) on a value the server cannot run with; returns itself."""
        if self.parallel < 1:
            raise UserError(f"-np must be >= 1 (got {self.parallel})")
        if not 0 < self.port < 65536:
            raise UserError(f"--port must be in 1..65535 (got {self.port})")
        n_ctx = self.slot_ctx
        if n_ctx < 16:
            raise UserError(f"-c {self.ctx_size} leaves {n_ctx} tokens per slot for {self.parallel} slots")
        if self.max_queue < 0:
            raise UserError(f"--max-queue must be >= 0 (got {self.max_queue})")
        return self


__all__ = ["ServeOptions", "slot_context"]

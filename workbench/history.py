"""Chat history that survives crashes: an append-only JSON-lines file in the XDG state directory.

Each finished turn is one line written with a single `write` and `fsync`, so a
crash can lose at most the reply being generated; a torn last line (power cut
mid-write) is ignored when reading. `--new-chat` moves the old file aside.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .engine.chat import Message


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "numawb"


@dataclass
class ChatHistory:
    path: Path

    @classmethod
    def default(cls) -> "ChatHistory":
        return cls(state_dir() / "chat.jsonl")

    def load(self) -> list[Message]:
        """Messages of the saved conversation (unreadable or torn lines are skipped)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        out: list[Message] = []
        for line in raw.split(b"\n"):
            try:
                rec = json.loads(line)
                if rec.get("op") == "drop_last_turn":
                    if out and out[-1].role == "assistant":
                        out.pop()
                    if out and out[-1].role == "user":
                        out.pop()
                    continue
                out.append(Message(str(rec["role"]), str(rec["content"])))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        return out

    def append(self, *messages: Message) -> None:
        """Append messages as one atomic write (a user turn and its reply together)."""
        now = time.time()
        self._write([{"role": m.role, "content": m.content, "t": now} for m in messages])

    def drop_last_turn(self) -> None:
        """Record that the last turn was taken back (regenerate); the file stays append-only."""
        self._write([{"op": "drop_last_turn", "t": time.time()}])

    def _write(self, records: list[dict]) -> None:
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def start_new(self) -> None:
        """Keep the previous conversation as chat-<time>.jsonl and start an empty one."""
        if self.path.exists():
            self.path.rename(self.path.with_name(f"chat-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))

    def clear(self) -> None:
        self.start_new()

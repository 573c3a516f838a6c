"""Replay of a recording (``numawb --replay DIR/events.jsonl``): the dashboard's third source.

A recording (``workbench.record``) is one JSON object per line: ``{"t", "dt", "kind", "data"}``.
``ReplaySource`` plays it back at the dashboard's refresh rate: each tick hands over the
events up to and including the next telemetry ``snapshot`` (chat turns, switches, loads go to
``on_event``, the snapshot to ``on_snapshot``, marked ``source="replay"``), and says
``replay.finished`` at the end. Pause and refresh work as for live telemetry. Imports nothing
from Textual.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable

from .errors import UserError
from .telemetry import Snapshot, Ticker

#: kinds a replay hands to ``on_event`` (the rest of a recording is progress detail)
SHOWN_KINDS = ("chat.user", "reply.done", "reply.error", "switch.done", "switch.refused", "load.done",
               "load.error")
FINISHED = "replay.finished"


@dataclass(frozen=True)
class Recording:
    """The events of one recording, in order."""

    path: str
    events: tuple[dict[str, Any], ...]

    @classmethod
    def load(cls, path: str) -> "Recording":
        """Read ``events.jsonl``; a missing or malformed file is the user's error (one line)."""
        try:
            with open(path, encoding="utf-8") as f:
                lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
        except FileNotFoundError:
            raise UserError(f"{path}: no such recording") from None
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: cannot read it ({e})") from None
        events = []
        for n, line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                raise UserError(f"{path}:{n}: not a JSON line of a numawb recording") from None
            if not isinstance(ev, dict) or "kind" not in ev:
                raise UserError(f"{path}:{n}: not an event of a numawb recording (no 'kind')")
            events.append(ev)
        return cls(path, tuple(events))

    @property
    def snapshots(self) -> int:
        return sum(1 for e in self.events if e.get("kind") == "snapshot")


def replayed(data: dict[str, Any]) -> Snapshot:
    """A recorded snapshot as the dashboard shows it: marked ``replay`` (simulated ones keep
    their ``simulated:<fixture>`` source, which the dashboard marks more loudly)."""
    snap = Snapshot.from_json(data)
    return snap if snap.simulated else dataclasses.replace(snap, source="replay")


class ReplaySource(Ticker):
    """Plays a `Recording` back, one telemetry snapshot per tick (see the module doc)."""

    kind = "replay"
    name = "numawb-replay"

    def __init__(self, recording: Recording, on_snapshot: Callable[[Snapshot], None],
                 on_event: Callable[[str, dict[str, Any]], None], interval: float = 1.0) -> None:
        super().__init__(interval)
        self.recording = recording
        self.on_snapshot = on_snapshot
        self.on_event = on_event
        self.position = 0
        self._current: Snapshot | None = None

    @property
    def current(self) -> Snapshot | None:
        return self._current

    @property
    def finished(self) -> bool:
        return self.position >= len(self.recording.events)

    def status(self) -> str:
        return "REPLAY · " + super().status()

    def sample_now(self) -> Snapshot | None:
        """The snapshot shown now (a replay does not measure anything)."""
        return self._current

    def step(self) -> Snapshot | None:
        """Hand over the events up to and including the next snapshot; None at the end."""
        events = self.recording.events
        while self.position < len(events):
            ev = events[self.position]
            self.position += 1
            kind, data = ev.get("kind"), ev.get("data") or {}
            if kind == "snapshot":
                try:
                    snap = replayed(data)
                except (TypeError, ValueError, KeyError):
                    continue  # a snapshot from an incompatible version: skip it
                self._current = snap
                self.on_snapshot(snap)
                return snap
            if kind in SHOWN_KINDS:
                self.on_event(str(kind), data)
        self.on_event(FINISHED, {"path": self.recording.path})
        return None

    def tick(self) -> bool:
        return self.step() is not None

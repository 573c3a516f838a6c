"""The messages the workbench app's worker threads post to it (load, switch, sampler, replay,
reply, advice), and `from_worker`, which every handler of one is wrapped in.

The app (``workbench.app``) runs model loads, placement switches, generation, advice and the
telemetry sampler in thread workers; each reports back with one of these. They carry plain
values (the engine, a snapshot, an error line); the handlers are the app's.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from textual.app import App, ScreenStackError
from textual.css.query import NoMatches
from textual.message import Message

from .engine import Chat
from .engine.engine import SwitchReport
from .numa.layout import ProgressEvent
from .screens.dashboard import AdviceView
from .telemetry import Snapshot


class WorkerMessage(Message):
    """A message a worker thread (load, switch, sampler, replay, reply, advice) posts to the app.

    One can be posted just before the app exits and be dispatched while Textual takes the screens
    down, when the widgets its handler updates are gone: every handler is wrapped by
    `from_worker` (a test checks each subclass's handler is)."""


_UI_GONE = (NoMatches, ScreenStackError, IndexError)


def from_worker(handler: Callable) -> Callable:
    """Wrap the app's handler of a `WorkerMessage`: the handler runs in full (a finished reply is
    still saved to the history), but a widget it updates that is already gone because the app is
    exiting ends it quietly. While the app runs, the same error is a bug and raises."""

    @functools.wraps(handler)
    async def run(self: App, msg: Message) -> None:
        try:
            result = handler(self, msg)
            if inspect.isawaitable(result):
                await result
        except _UI_GONE:
            if self.is_running:
                raise

    run.from_worker = True  # type: ignore[attr-defined]
    return run


class LoadProgress(WorkerMessage):
    def __init__(self, event: ProgressEvent, what: str) -> None:
        super().__init__()
        self.event, self.what = event, what


class Loaded(WorkerMessage):
    def __init__(self, engine: Any, chat: Chat, seconds: float) -> None:
        super().__init__()
        self.engine, self.chat, self.seconds = engine, chat, seconds


class PreparingDecode(WorkerMessage):
    """The decoded tokens' call is compiling (on) or done (off): a first start."""

    def __init__(self, on: bool) -> None:
        super().__init__()
        self.on = on


class LoadFailed(WorkerMessage):
    def __init__(self, path: str, error: str) -> None:
        super().__init__()
        self.path, self.error = path, error


class Switched(WorkerMessage):
    def __init__(self, reports: list[SwitchReport], seconds: float) -> None:
        super().__init__()
        self.reports, self.seconds = reports, seconds


class SwitchRefused(WorkerMessage):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class SnapshotReady(WorkerMessage):
    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class ReplayEvent(WorkerMessage):
    """A recorded chat turn, switch or load, played back (see ``workbench.replay``)."""

    def __init__(self, kind: str, data: dict) -> None:
        super().__init__()
        self.kind, self.data = kind, data


class AdviceProgress(WorkerMessage):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class AdviceReady(WorkerMessage):
    """Advice for the loaded model (``what_if``: for another file's header, shown beside it)."""

    def __init__(self, view: AdviceView | None, what_if: str = "", error: str = "") -> None:
        super().__init__()
        self.view, self.what_if, self.error = view, what_if, error


class ReplyDone(WorkerMessage):
    """A reply finished; ``depth``: the mean KV-cache position its tokens were decoded at."""

    def __init__(self, stats: Any, placement: str, depth: int = 0) -> None:
        super().__init__()
        self.stats, self.placement, self.depth = stats, placement, depth


class AdviceAtDepth(WorkerMessage):
    """The mode in force (``current``) predicted again at the depth the last reply decoded at."""

    def __init__(self, current: tuple, tps: float, depth: int) -> None:
        super().__init__()
        self.current, self.tps, self.depth = current, tps, depth


class ReplyFailed(WorkerMessage):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


__all__ = ["AdviceAtDepth", "AdviceProgress", "AdviceReady", "LoadFailed", "LoadProgress", "Loaded", "PreparingDecode", "ReplayEvent",
           "ReplyDone", "ReplyFailed", "SnapshotReady", "SwitchRefused", "Switched", "WorkerMessage", "from_worker"]

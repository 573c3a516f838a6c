"""The main screen: dashboard and chat side by side when wide, one at a time when narrow."""
from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header

from .chat import ChatPane
from .dashboard import Dashboard

WIDE = 150  # columns from which chat and dashboard are shown together


class MainScreen(Screen):
    """``view``: 'both' | 'dashboard' | 'chat'; narrow terminals never show 'both'."""

    class Ready(Message):
        """The panes are mounted: the app can fill them."""

    view: reactive[str] = reactive("both")
    narrow: reactive[bool] = reactive(False)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="◈")
        with Horizontal(id="panes"):
            yield Dashboard(id="dashboard")
            yield ChatPane(id="chat")
        yield Footer()

    def on_mount(self) -> None:
        self.narrow = self.app.size.width < WIDE
        self._apply()
        self.post_message(self.Ready())

    def on_resize(self, event: events.Resize) -> None:
        self.narrow = event.size.width < WIDE

    def watch_narrow(self, narrow: bool) -> None:
        if not narrow:
            self.view = "both"  # room for both again
        self._apply()

    def watch_view(self) -> None:
        self._apply()

    @property
    def shown(self) -> str:
        """What is actually on screen."""
        return "chat" if self.narrow and self.view == "both" else self.view

    def cycle_view(self) -> str:
        order = ["chat", "dashboard"] if self.narrow else ["both", "dashboard", "chat"]
        cur = self.shown
        self.view = order[(order.index(cur) + 1) % len(order)] if cur in order else order[0]
        return self.shown

    def _apply(self) -> None:
        shown = self.shown
        try:
            self.query_one(Dashboard).display = shown in ("both", "dashboard")
            self.query_one(ChatPane).display = shown in ("both", "chat")
        except NoMatches:  # not composed yet
            return
        self.set_class(shown == "both", "-both")

"""The chat pane: conversation with streamed replies (Markdown once finished) and a stats line under each."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Markdown, Static

from .inplace import rows


class UserMessage(Static):
    """What the user sent."""


class PlainText(Static):
    """Text shown as is (no markup) that is cheap to replace as it grows.

    A new text repaints this widget alone while it fits the rows the widget has; only when it needs
    more does the screen get laid out again, and then with ``RESERVE`` rows to spare. A layout
    re-arranges every widget of the screen, dashboard included: 10-50 ms of the UI thread on a
    2-CPU machine, which ``Static.update`` spends at every update and a reply growing a line at a
    time would spend at every line."""

    #: blank rows kept below the text while it grows: one layout per RESERVE + 1 new lines
    RESERVE = 4

    def __init__(self, text: str = "", **kw) -> None:
        super().__init__(text, markup=False, **kw)
        self.styles.min_height = 1 + self.RESERVE

    def show(self, text: str) -> None:
        """Replace the text; lay the screen out only when it needs more rows than it has."""
        self.update(text, layout=False)
        fit = rows(self)
        if fit is None:  # not laid out yet
            self.refresh(layout=True)
        elif fit[0] > fit[1]:
            self.styles.min_height = fit[0] + self.RESERVE + self.styles.gutter.height  # a style change lays out


class Reply(Vertical):
    """One assistant reply: its text and a stats line under it.

    A streaming reply (``streaming=True``) shows its text plain (`PlainText`) while tokens arrive
    and renders it as Markdown once, at `finish`. Appending to a Markdown widget re-parses its last
    block and lays the whole screen out at every flush: during a reply the UI thread took 35-49% of
    a CPU, and on 2 CPUs the app decoded at about a third of ``numawb bench``'s rate. A reply given
    its whole text (restored from history or a replay) is Markdown from the start.
    """

    def __init__(self, text: str = "", stats: str = "", streaming: bool = False, **kw) -> None:
        super().__init__(**kw)
        self._text, self._stats = text, stats
        self._streaming = streaming

    def compose(self) -> ComposeResult:
        if self._streaming:
            yield PlainText(self._text, classes="reply-body reply-plain")
        body = Markdown("" if self._streaming else self._text, classes="reply-body")
        body.display = not self._streaming
        yield body
        yield Static(self._stats, classes="reply-stats")

    @property
    def body(self) -> Markdown:
        """The Markdown rendering (empty and hidden while the reply streams)."""
        return self.query_one(Markdown)

    @property
    def text(self) -> str:
        """The reply so far (all of it once finished)."""
        return self._text

    @property
    def streaming(self) -> bool:
        """Whether the text is still shown plain, waiting for `finish`."""
        return self._streaming

    async def append(self, fragment: str) -> None:
        """Add streamed text: shown plain while streaming (a repaint of the text so far, no Markdown
        parsing), appended to the Markdown otherwise."""
        self._text += fragment
        if not self.is_attached:
            return
        if self._streaming:
            self.query_one(PlainText).show(self._text)
        else:
            await self.body.append(fragment)

    async def finish(self) -> None:
        """The reply ended (done, failed or stopped): render its text as Markdown, once, in place
        of the plain text. Does nothing for a reply that is not streaming."""
        if not self._streaming:
            return
        self._streaming = False
        if not self.is_attached:  # removed (chat cleared, model reloaded) while it streamed
            return
        body = self.body
        await body.update(self._text)
        body.display = True
        await self.query_one(PlainText).remove()

    def set_stats(self, text: str, error: bool = False) -> None:
        stats = self.query_one(".reply-stats", Static)
        stats.update(text)
        stats.set_class(error, "-error")


CHAT_PLACEHOLDER = "Message (Enter sends · Esc stops · ctrl+r regenerates)"
COMPLETION_PLACEHOLDER = "Text for the model to continue (Enter sends · Esc stops · ctrl+r regenerates)"


class ChatPane(Vertical):
    """Conversation log (follows new text only while scrolled to the bottom) and prompt input.

    In completion mode (a model without a chat template) the title and the prompt say so: what is
    sent is text the model continues, not a turn it answers."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="chat-log")
        yield Static("", id="chat-note", markup=False)
        yield Static("", id="chat-status")
        yield Input(placeholder=CHAT_PLACEHOLDER, id="prompt")

    def on_mount(self) -> None:
        self.border_title = "chat"
        self.log_view.anchor()  # stays at the bottom until the user scrolls up

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#chat-log", VerticalScroll)

    @property
    def prompt(self) -> Input:
        return self.query_one("#prompt", Input)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        event.stop()
        text = event.value.strip()
        if text:
            self.post_message(self.Submitted(text))

    async def add_user(self, text: str) -> None:
        await self.log_view.mount(UserMessage(text, classes="user", markup=False))

    async def start_reply(self, text: str = "", stats: str = "", streaming: bool = False) -> Reply:
        """Add a reply: a finished one (``text``, shown as Markdown) or one about to stream."""
        reply = Reply(text, stats, streaming, classes="reply")
        await self.log_view.mount(reply)
        return reply

    def last_reply(self) -> Reply | None:
        replies = self.query(Reply)
        return replies.last() if replies else None

    async def drop_last_exchange(self) -> None:
        """Remove the last user message and the reply after it (for regenerate)."""
        kids = list(self.log_view.children)
        while kids and isinstance(kids[-1], Reply):
            await kids.pop().remove()
        if kids and isinstance(kids[-1], UserMessage):
            await kids.pop().remove()

    async def clear(self) -> None:
        await self.log_view.remove_children()

    def set_status(self, text: str) -> None:
        self.query_one("#chat-status", Static).update(text)

    @property
    def completion(self) -> bool:
        """Whether the pane is in completion mode (set by `set_mode`)."""
        return self.border_title == "completion"

    def set_mode(self, chat: bool, note: str = "") -> None:
        """Chat (the model answers turns) or completion mode (it continues the text), and a
        one-line note about the model in use (hidden when empty)."""
        self.border_title = "chat" if chat else "completion"
        self.prompt.placeholder = CHAT_PLACEHOLDER if chat else COMPLETION_PLACEHOLDER
        line = self.query_one("#chat-note", Static)
        line.update(note)
        line.set_class(bool(note), "-shown")

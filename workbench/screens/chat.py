"""The chat pane: conversation with streaming Markdown replies and a stats line under each."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Markdown, Static


class UserMessage(Static):
    """What the user sent."""


class Reply(Vertical):
    """One assistant reply: Markdown body (appended in batches) and a stats line."""

    def __init__(self, text: str = "", stats: str = "", **kw) -> None:
        super().__init__(**kw)
        self._initial, self._stats = text, stats

    def compose(self) -> ComposeResult:
        yield Markdown(self._initial, classes="reply-body")
        yield Static(self._stats, classes="reply-stats")

    @property
    def body(self) -> Markdown:
        return self.query_one(Markdown)

    @property
    def text(self) -> str:
        return self.body.source

    async def append(self, fragment: str) -> None:
        await self.body.append(fragment)

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

    async def start_reply(self, text: str = "", stats: str = "") -> Reply:
        reply = Reply(text, stats, classes="reply")
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

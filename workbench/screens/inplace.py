"""Updating a widget in place: a repaint of that widget alone, and a layout only when its height changes.

A layout (``refresh(layout=True)``, and so ``Static.update`` by default) re-arranges every widget of
the screen: the dashboard, the chat log and each reply's Markdown. On a 2-CPU machine that is 10-70
ms of the UI thread, taken from the engine's two threads while a reply streams; the dashboard
requested one at every telemetry snapshot (1 Hz) although its panels rarely change height.
"""
from __future__ import annotations

from typing import Callable

from rich.console import RenderableType
from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static


def rows(widget: Widget) -> tuple[int, int] | None:
    """The rows ``widget``'s content needs at its current width and the rows it has (content box,
    without padding and border); None before its first layout."""
    box, gutter = widget.outer_size, widget.styles.gutter
    width, height = box.width - gutter.width, box.height - gutter.height
    if width <= 0:
        return None
    return widget.get_content_height(box, box, width), height


def repaint(widget: Widget) -> None:
    """Repaint ``widget`` after its content changed; lay the screen out only when the content needs
    another number of rows than the widget has (or the widget has not been laid out yet)."""
    fit = rows(widget)
    widget.refresh(layout=fit is None or fit[0] != fit[1])


class Readout(Static):
    """A Static whose content is replaced often (a dashboard figure): `show` repaints it, skips a
    content equal to the one shown, and lays out only when the height changes."""

    def __init__(self, content: RenderableType = "", **kw) -> None:
        super().__init__(content, **kw)
        self._key: object = None

    def show(self, content: RenderableType | Callable[[], RenderableType], key: object = None) -> None:
        """Show ``content`` (or what it returns, a callable being called only when ``key`` changed).
        ``key`` stands for the content where it cannot be compared (a Table, a Group): equal keys mean
        an equal picture. Without a key, an equal str or rich Text is skipped."""
        if key is None and isinstance(content, (str, Text)):
            key = content
        if key is not None and key == self._key:
            return
        self._key = key
        if callable(content):
            content = content()
        self.update(content, layout=False)
        repaint(self)

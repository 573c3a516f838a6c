"""Modal screens: help, open a model, sampling settings, and error reports."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Button, DirectoryTree, Input, Label, Markdown, Static

from ..settings import SamplingSettings

HELP_TEXT = """\
**numawb** runs a GGUF model on this machine's CPUs and shows where its memory and threads are.

- **Memory per node**: this process's weights (█), KV cache (▓) and other memory (▒), the rest of
  the system's use (░) and free memory, with the share of pages *proven* (by `move_pages`) to sit on
  the node the placement intends.
- **Weights modes**: `none` (OS default), `mirror` (one copy per node), `interleave` (pages spread
  over nodes), `slice` (each node holds the rows its workers compute), `auto` (mirror what fits,
  slice the rest). **KV modes**: `first-touch` (each worker's part on its node), `interleave`, `node:N`.
  Switches happen live, without reading the model again; a mode that does not fit is refused and
  the previous one stays.
- **Rates**: current / average / peak per reply; bandwidth is weight bytes per token × decode t/s.
- With `--simulate-topology` the memory and worker figures are computed for a fixture box and
  marked **SIMULATED**; token rates are always measured here.
"""


class HelpScreen(ModalScreen[None]):
    """F1: key bindings and what the dashboard shows."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="help-close")]

    def __init__(self, bindings: Iterable[tuple[str, str, str]]) -> None:
        super().__init__()
        self.rows = list(bindings)

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=True, header_style="bold", padding=(0, 2))
        table.add_column("key", min_width=10, no_wrap=True)
        table.add_column("", width=1)
        table.add_column("action")
        table.add_column("id", style="dim")
        for key, desc, bid in self.rows:
            table.add_row(Text(key, style="bold"), "", desc, bid)
        with VerticalScroll(id="help-box"):
            yield Static(table, id="help-keys")
            yield Markdown(HELP_TEXT, id="help-text")
            yield Static("Ctrl+P opens the command palette · Esc closes this help", id="help-foot")

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "numawb help"

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class PathSuggester(Suggester):
    """Completes file system paths (directories and .gguf files)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not value:
            return None
        path = Path(os.path.expanduser(value))
        parent, stem = (path, "") if value.endswith("/") else (path.parent, path.name)
        try:
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in parent.iterdir()
                           if p.name.startswith(stem) and not p.name.startswith(".")
                           and (p.is_dir() or p.suffix == ".gguf"))
        except OSError:
            return None
        if not names:
            return None
        return value + names[0][len(stem):]


class GGUFTree(DirectoryTree):
    """Directories and .gguf files only."""

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        return [p for p in paths if not p.name.startswith(".") and (p.is_dir() or p.suffix == ".gguf")]


class OpenModelScreen(ModalScreen[str | None]):
    """F4: type a path (Tab/→ completes) or pick a .gguf file in the tree. ``what_if`` (F10):
    the same dialog for the advice panel's what-if, which reads the file's header only."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="open-cancel")]

    def __init__(self, start: str | None = None, what_if: bool = False) -> None:
        super().__init__()
        self.start = start or os.getcwd()
        self.what_if = what_if

    def compose(self) -> ComposeResult:
        root = self.start if os.path.isdir(self.start) else os.path.dirname(self.start) or "."
        with Vertical(id="open-box"):
            yield Label("GGUF file for a what-if: only its header is read, nothing is loaded" if self.what_if else
                        "GGUF file to load (the current model keeps running until it has loaded):")
            yield Input(value=self.start if os.path.isfile(self.start) else "", id="open-path",
                        placeholder="/path/to/model.gguf", suggester=PathSuggester())
            yield GGUFTree(root, id="open-tree")
            with Horizontal(classes="buttons"):
                yield Button("Predict" if self.what_if else "Load", id="open-load", variant="primary")
                yield Button("Cancel", id="open-cancel-btn")

    def on_mount(self) -> None:
        self.query_one("#open-box").border_title = "what-if (header only)" if self.what_if else "open model"
        self.query_one("#open-path", Input).focus()

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        self.query_one("#open-path", Input).value = str(event.path)
        self.query_one("#open-path", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._done(event.value)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "open-load":
            self._done(self.query_one("#open-path", Input).value)
        else:
            self.dismiss(None)

    def _done(self, value: str) -> None:
        value = os.path.expanduser(value.strip())
        if not value:
            self.notify("type a path or pick a file", severity="warning")
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)


_SAMPLING_FIELDS = (("temperature", "temperature (0 = greedy)"), ("top_k", "top-k (0 = off)"),
                    ("top_p", "top-p"), ("min_p", "min-p"), ("repeat_penalty", "repeat penalty"),
                    ("seed", "seed (empty = random)"), ("n_predict", "max tokens per reply"))


class SamplingScreen(ModalScreen[SamplingSettings | None]):
    """F6: edit the sampling settings; validated before they are used."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="sampling-cancel")]

    def __init__(self, current: SamplingSettings) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="sampling-box"):
            with Grid(id="sampling-grid"):
                for name, label in _SAMPLING_FIELDS:
                    v = getattr(self.current, name)
                    yield Label(label)
                    yield Input("" if v is None else str(v), id=f"s-{name}")
            yield Static("", id="sampling-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", id="sampling-save", variant="primary")
                yield Button("Cancel", id="sampling-cancel-btn")

    def on_mount(self) -> None:
        self.query_one("#sampling-box").border_title = "sampling"

    def parse(self) -> SamplingSettings:
        """The settings typed in; ValueError with a readable message when one is wrong."""
        from ..engine import SamplingParams
        vals: dict[str, object] = {}
        for name, label in _SAMPLING_FIELDS:
            raw = self.query_one(f"#s-{name}", Input).value.strip()
            kind = type(getattr(SamplingSettings(), name)) if name != "seed" else int
            if name == "seed" and not raw:
                vals[name] = None
                continue
            try:
                vals[name] = kind(raw)
            except ValueError:
                raise ValueError(f"{label}: {raw!r} is not a {'number' if kind is float else 'whole number'}") from None
        s = SamplingSettings(**vals)  # type: ignore[arg-type]
        if s.n_predict < 1:
            raise ValueError("max tokens per reply must be >= 1")
        SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                       repeat_penalty=s.repeat_penalty, seed=s.seed).validate()
        return s

    def _save(self) -> None:
        try:
            s = self.parse()
        except ValueError as e:
            self.query_one("#sampling-error", Static).update(Text(str(e), style="bold red"))
            return
        self.dismiss(s)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "sampling-save":
            self._save()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ErrorScreen(ModalScreen[None]):
    """A modal error report (e.g. a model that failed to load); the app keeps running."""

    BINDINGS = [Binding("escape,enter", "close", "Close", id="error-close")]

    def __init__(self, title: str, message: str) -> None:
        super().__init__()
        self.title_text, self.message = title, message

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box"):
            yield Static(Text(self.message), id="error-message")
            with Horizontal(classes="buttons"):
                yield Button("OK", id="error-ok", variant="error")

    def on_mount(self) -> None:
        self.query_one("#error-box").border_title = self.title_text
        self.query_one("#error-ok").focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)

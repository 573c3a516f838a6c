"""Chat prompt formatting: the file's Jinja2 template; without one, completion mode (no invented turns)."""

from __future__ import annotations

from dataclasses import dataclass

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


@dataclass
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str


class ChatTemplateError(ValueError):
    pass


def _raise(msg: str) -> None:
    raise ChatTemplateError(f"chat template error: {msg}")


def completion_text(messages: list[Message]) -> str:
    """A conversation as the text a model without a chat template continues: the messages in
    order, a space between two that would otherwise run together (the reply that follows is the
    model's continuation)."""
    out = ""
    for m in messages:
        c = m.content
        if not c:
            continue
        if out and not out[-1].isspace() and not c[0].isspace():
            out += " "
        out += c
    return out


class ChatFormatter:
    """The file's chat template (``tokenizer.chat_template``), rendered as llama.cpp's Jinja does.

    A file without one is a model not trained to follow turns (a base model): no turn format is
    invented for it (``can_chat`` False, ``source`` "none"); `render` gives the conversation as
    plain text to continue (completion mode) and the server refuses chat requests."""

    def __init__(self, template: str | None, arch: str, vocab: set[str], bos: str, eos: str):
        self.source = "file" if template else "none"
        self.bos, self.eos = bos, eos
        self._tpl = None
        if not template:
            return
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self._tpl = env.from_string(template)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template does not parse: {e}") from None

    @property
    def can_chat(self) -> bool:
        """Whether the file has a chat template (else completion mode)."""
        return self._tpl is not None

    def render(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        """The prompt text: the template applied, or without one the text to continue."""
        if self._tpl is None:
            return completion_text(messages)
        try:
            return self._tpl.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt, bos_token=self.bos, eos_token=self.eos)
        except ChatTemplateError:
            raise
        except Exception as e:  # a template is user data: any failure is reported, not raised through
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None

"""Chat prompt formatting: the file's Jinja2 template, or the architecture's turn format."""

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


# Standard turn formats for files without `tokenizer.chat_template`.
_BUILTIN = {
    "gemma": (
        "{{ bos_token }}{% for m in messages %}"
        "{% if m.role == 'system' %}{% set sys = m.content %}{% endif %}{% endfor %}"
        "{% for m in messages if m.role != 'system' %}"
        "<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
        "{% if loop.first and sys is defined %}{{ sys }}\n\n{% endif %}"
        "{{ m.content | trim }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
        "{{ m.content | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "llama2": (
        "{% for m in messages %}{% if m.role == 'user' %}{{ bos_token }}[INST] {{ m.content | trim }} [/INST]"
        "{% elif m.role == 'assistant' %} {{ m.content | trim }} {{ eos_token }}"
        "{% else %}{{ bos_token }}[INST] <<SYS>>\n{{ m.content }}\n<</SYS>>\n\n[/INST]{% endif %}{% endfor %}"
    ),
}


def builtin_format(arch: str, vocab: set[str]) -> str:
    if arch.startswith("gemma"):
        return "gemma"
    if "<|im_start|>" in vocab:
        return "chatml"
    if "<|start_header_id|>" in vocab:
        return "llama3"
    return "llama2"


class ChatFormatter:
    def __init__(self, template: str | None, arch: str, vocab: set[str], bos: str, eos: str):
        self.source = "file" if template else builtin_format(arch, vocab)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self._tpl = env.from_string(template or _BUILTIN[self.source])
        except TemplateError as e:
            raise ChatTemplateError(f"chat template does not parse: {e}") from None
        self.bos, self.eos = bos, eos

    def render(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        try:
            return self._tpl.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt, bos_token=self.bos, eos_token=self.eos)
        except ChatTemplateError:
            raise
        except Exception as e:  # a template is user data: any failure is reported, not raised through
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None

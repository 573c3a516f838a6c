"""Which model the app runs when none is named, and what the chat pane says about it: the pulled
instruct model if there is one, else the base default model, labelled; a model without a chat
template in completion mode."""
from __future__ import annotations

import asyncio
import functools
import shutil
import time

import pytest
from textual.widgets import Static

from workbench import models_store as ms
from workbench.app import WorkbenchApp
from workbench.settings import Settings

SIZE = (160, 48)


def aio(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


@pytest.fixture(autouse=True)
def xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def make_app(model: str | None, **kw) -> WorkbenchApp:
    settings = Settings()
    settings.sampling.n_predict = 6
    settings.sampling.seed = 1
    settings.sampling.temperature = 0.0
    settings.n_ctx = 512
    return WorkbenchApp(model, settings=settings, auto_advice=False, persist=False, **kw)


async def until(pilot, cond, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        await pilot.pause(0.05)


def note(app: WorkbenchApp) -> str:
    w = app.chat_pane.query_one("#chat-note", Static)
    return str(w.render()) if w.has_class("-shown") else ""


@aio
async def test_no_model_named_takes_the_pulled_instruct_model(tiny_model, warm_kernels, tmp_path):
    pulled = ms.models_dir() / ms.entry().filename
    pulled.parent.mkdir(parents=True)
    shutil.copy(tiny_model, pulled)  # stands in for `numawb pull`'s file
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.engine is not None and not app.loading)
        assert app.engine.path == str(pulled)
        assert note(app).startswith(f"instruct model: {ms.entry().title} (pulled, ")


@aio
async def test_no_model_named_and_none_pulled_runs_the_base_model_labelled(tiny_model, warm_kernels, monkeypatch):
    from workbench.engine import Engine
    seen: list = []
    load = Engine.load

    def fake_load(path=None, **kw):  # the base default model, played by the tiny one
        seen.append(path)
        return load(tiny_model, **kw)
    monkeypatch.setattr(Engine, "load", staticmethod(fake_load))
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.engine is not None and not app.loading)
        assert seen == [None]  # Engine.load's own default: nothing fetched, nothing looked up online
        assert note(app) == ms.BASE_MODEL_NOTE
        assert "does not chat" in note(app) and "`numawb pull`" in note(app)


TURNS = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}"
         "\n{{ m.content | trim }}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@aio
async def test_a_model_without_chat_template_runs_in_completion_mode(tiny_model, warm_kernels):
    from workbench.app import COMPLETION_NOTE
    from workbench.screens.chat import COMPLETION_PLACEHOLDER
    app = make_app(tiny_model)  # the shared tiny model's file has no chat template
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.engine is not None and not app.loading)
        pane = app.chat_pane
        assert pane.completion and pane.border_title == "completion"
        assert pane.prompt.placeholder == COMPLETION_PLACEHOLDER and note(app) == COMPLETION_NOTE
        assert await app.send_message("the cat sat")
        await until(pilot, lambda: not app.generating and len(app.chat.messages) == 2)
        reply = app.chat.messages[1].content
        assert reply and pane.last_reply().text == reply
        # the prompt was the text itself, no turn markers: the reply continues it
        tok = app.engine.tokenizer
        app.chat.messages.append(ms_message("user", "on the mat"))
        ids = app.chat.prompt_tokens()
        assert tok.token_id("<start_of_turn>") not in ids
        assert tok.decode(ids) == "the cat sat" + ("" if reply[:1].isspace() else " ") + reply + \
            ("" if reply[-1:].isspace() else " ") + "on the mat"


@aio
async def test_a_model_with_a_chat_template_chats(tmp_path, warm_kernels):
    from gguf_factory import TinySpec, write_tiny_model
    from workbench.screens.chat import CHAT_PLACEHOLDER
    path = tmp_path / "tiny-instruct.gguf"
    write_tiny_model(path, TinySpec(n_ctx=512, chat_template=TURNS))
    app = make_app(str(path))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.engine is not None and not app.loading)
        pane = app.chat_pane
        assert not pane.completion and pane.border_title == "chat"
        assert pane.prompt.placeholder == CHAT_PLACEHOLDER and note(app) == ""


def ms_message(role: str, content: str):
    from workbench.engine.chat import Message
    return Message(role, content)

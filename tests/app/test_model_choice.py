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

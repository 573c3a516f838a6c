"""Pilot tests of the numawb app on tiny GGUF models: every control, and the error paths."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import threading
import time
from pathlib import Path

import pytest

from gguf_factory import TinySpec, write_tiny_model
from workbench.app import WorkbenchApp
from workbench.engine.engine import Placement
from workbench.screens.chat import PlainText, Reply, UserMessage
from workbench.screens.dashboard import Controls, LoadPanel
from workbench.screens.dialogs import ErrorScreen, HelpScreen, OpenModelScreen, SamplingScreen
from workbench.screens.main import MainScreen
from workbench.settings import Settings, load_settings

SIZE = (160, 48)


def aio(fn):
    """Run an async test with asyncio.run (no pytest-asyncio needed); fixtures pass through."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


@pytest.fixture(scope="module")
def tiny(tiny_model, warm_kernels) -> str:
    return tiny_model


@pytest.fixture(scope="module")
def tiny2(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "tiny-other.gguf"
    write_tiny_model(path, TinySpec(n_ctx=512, n_layer=1, seed=3))
    return str(path)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "tiny-qwen3moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256,
                                    n_ctx=512))
    return str(path)


@pytest.fixture(autouse=True)
def xdg(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "numawb" / "settings.json"


def make_app(model: str | None, **kw) -> WorkbenchApp:
    settings = Settings()
    settings.sampling.n_predict = 8
    settings.sampling.seed = 1
    settings.n_ctx = 512
    kw.setdefault("settings", settings)
    kw.setdefault("auto_advice", False)  # the advice tests turn it on
    return WorkbenchApp(model, **kw)


async def until(pilot, cond, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        await pilot.pause(0.05)


async def loaded(app, pilot, timeout: float = 60.0) -> None:
    await until(pilot, lambda: app.engine is not None and not app.loading, timeout)


async def chat_once(app, pilot, text: str = "the cat sat") -> Reply:
    assert await app.send_message(text)
    await until(pilot, lambda: not app.generating)
    reply = app.chat_pane.last_reply()
    assert reply is not None
    return reply


def hold_after(app, n: int) -> tuple[threading.Event, threading.Event]:
    """Hold generation after ``n`` tokens: the first event is set then, and it goes on (at most
    10 s later) when the test sets the second."""
    seen, go = threading.Event(), threading.Event()
    real_token = app.telemetry.rates.token
    count = [0]

    def gated(t: float) -> None:
        real_token(t)
        count[0] += 1
        if count[0] == n:
            seen.set()
            go.wait(10)
    app.telemetry.rates.token = gated
    return seen, go


def stats_text(reply: Reply) -> str:
    return str(reply.query_one(".reply-stats").render())


# ---- start, load, dashboard -------------------------------------------------

@aio
async def test_mounts_at_once_then_loads_with_progress(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        assert app.loading or app.engine is not None  # the UI is up before the model
        await loaded(app, pilot)
        assert not app.query_one(LoadPanel).display
        await until(pilot, lambda: app.dashboard.snapshot.workers)
        snap = app.dashboard.snapshot
        assert snap.model == "tiny-llama.gguf" and snap.source == "live"
        assert sum(n.weights for n in snap.nodes) > 0
        assert len(snap.workers) == app.engine.pool.n_threads
        assert "tiny-llama.gguf" in app.sub_title


@aio
async def test_decode_call_is_compiled_after_the_load_before_the_first_reply(tiny):
    """A first start's long compile of the decoded tokens' call runs while the user types: the
    app records it done, and the reply then decodes with that very call (no other specialisation)."""
    from workbench.engine import token_layer
    events: list[tuple[str, dict]] = []
    app = make_app(tiny, recorder=lambda kind, data: events.append((kind, data)))
    token_layer._TOKENS.clear()  # a new dispatcher: its specialisations are this test's
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await until(pilot, lambda: any(k == "decode.prepared" for k, _ in events), 120)
        assert not app.preparing and "compiling the decode call" not in app.sub_title
        (fn,) = token_layer._TOKENS.values()
        assert len(fn.overloads) == 1
        reply = await chat_once(app, pilot)
        assert reply.text and len(fn.overloads) == 1


@aio
async def test_load_progress_panel_shows_bytes_and_phase(tiny):
    from workbench.numa.layout import ProgressEvent
    from workbench.messages import LoadProgress
    app = make_app(tiny, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(LoadPanel)
        panel.display = True
        app.post_message(LoadProgress(ProgressEvent("load", 3 << 20, 8 << 20, 100 << 20, ""), "load"))
        await pilot.pause()
        text = str(panel.query_one("#load-text").render())
        assert "load: 3.0 MiB / 8.0 MiB" in text and "100.0 MiB/s" in text


# ---- chat ---------------------------------------------------------------------

@aio
async def test_chat_streams_reply_with_stats_line(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await pilot.click("#prompt")
        await pilot.press(*"the cat", "enter")
        await until(pilot, lambda: app.chat is not None and len(app.chat.messages) == 2 and not app.generating)
        reply = app.chat_pane.last_reply()
        assert reply.text == app.chat.messages[-1].content and reply.text
        line = stats_text(reply)
        assert "tokens" in line and "decode" in line and "weights none" in line
        assert app.dashboard.snapshot.rates.decode_tps or app.telemetry.rates.rates().decode_tps


@aio
async def test_worker_table_shows_the_thread_that_runs_worker_zero(tiny):
    """Worker 0's share runs on the app's generating thread, not on the pool's thread 0."""
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await chat_once(app, pilot)
        app.sample_now()
        await until(pilot, lambda: app.dashboard.snapshot.workers and
                    app.dashboard.snapshot.workers[0].actual_cpu is not None)
        w0 = app.dashboard.snapshot.workers[0]
        assert w0.thread == "caller" and w0.actual_cpu in os.sched_getaffinity(0)
        assert all(w.thread == "pool" for w in app.dashboard.snapshot.workers[1:])
        table = app.dashboard.query_one("#workers")
        assert str(table.get_row_at(0)[1]) == "caller" and str(table.get_row_at(0)[2]) == str(w0.actual_cpu)


@aio
async def test_escape_stops_and_keeps_partial_reply(tiny):
    app = make_app(tiny)
    app.settings.sampling.n_predict = 200
    app.settings.sampling.temperature = 1.5
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        seen, go = hold_after(app, 3)  # until Esc was pressed
        await app.send_message("the dog")
        await until(pilot, seen.is_set)
        await pilot.press("escape")
        go.set()
        await until(pilot, lambda: not app.generating)
        assert app.chat.messages[-1].role == "assistant"
        partial = app.chat.messages[-1].content
        assert partial and app.chat_pane.last_reply().text == partial
        assert "cancelled" in stats_text(app.chat_pane.last_reply())


def rendered(app, widget) -> list[list]:
    """The segments (text and style) the screen shows in ``widget``'s region."""
    r = widget.region
    assert r.width and r.height, "not on screen"
    return [list(strip.crop(r.x, r.right)) for strip in app.screen._compositor.render_strips()[r.y:r.bottom]]


MARKDOWN_REPLY = "A **NUMA node** is\n\n- local memory: fast\n- remote: slower\n\n```sh\nnumactl -H\n```\n"


@aio
async def test_streaming_reply_is_plain_then_markdown_once_it_ends(tiny):
    """While a reply streams the flushes go to a plain Static, not to the Markdown (which re-parsed at
    every flush and slowed decoding ~3x on 2 CPUs); the reply's end renders the Markdown once."""
    app = make_app(tiny)
    app.settings.sampling.n_predict = 12
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        seen, go = hold_after(app, 3)  # until the flushes were looked at
        await app.send_message("the cat")
        await until(pilot, seen.is_set)
        reply = app.chat_pane.last_reply()
        await until(pilot, lambda: not app._pending and reply.text)  # flushed
        plain = reply.query_one(".reply-plain")
        assert reply.streaming and str(plain.render()) == reply.text
        assert reply.body.source == "" and not reply.body.display
        go.set()
        await until(pilot, lambda: not app.generating)
        await pilot.pause()
        assert not reply.streaming and not reply.query(".reply-plain") and reply.body.display
        assert reply.text == reply.body.source == app.chat.messages[-1].content
        assert "tokens" in stats_text(reply)


@aio
async def test_streamed_text_is_shown_less_often_when_no_cpu_is_spare(tiny, monkeypatch):
    """Each streamed update's UI work is taken from a decoding thread when the engine's threads use
    every CPU: the streaming timer then shows the text at STREAM_HZ_BUSY, else at every tick."""
    from workbench import app as app_mod
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        shown = []
        monkeypatch.setattr(app, "_flush_stream", lambda: _note(shown))
        n = app.engine.pool.n_threads
        for cpus, expect in ((set(range(n)), 1), (set(range(n + 1)), 3)):
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid, c=cpus: c)
            shown.clear()
            app._flushed = 0.0
            for _ in range(3):  # three ticks well within 1 / STREAM_HZ_BUSY
                await app._tick_stream()
                app._flushed = time.monotonic() if shown else 0.0
            assert len(shown) == expect, (cpus, shown)
        assert app_mod.STREAM_HZ_BUSY < app_mod.STREAM_HZ


@aio
async def test_telemetry_samples_less_often_while_a_reply_streams_on_busy_cpus(tiny, monkeypatch):
    """A snapshot is UI work taken from a decoding thread when no CPU is spare: while a reply streams
    the sampler waits BUSY_REFRESH between samples, and at its end goes back to the settings' rate."""
    from workbench import app as app_mod
    app = make_app(tiny)
    app.settings.sampling.n_predict = 12
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(app.engine.pool.n_threads)))
        normal = app.source.interval
        seen, go = hold_after(app, 3)
        await app.send_message("the cat")
        await until(pilot, seen.is_set)
        assert app.source.interval == max(normal, app_mod.BUSY_REFRESH)
        go.set()
        await until(pilot, lambda: not app.generating)
        assert app.source.interval == normal
        # with a CPU to spare, the rate stays
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(app.engine.pool.n_threads + 1)))
        await chat_once(app, pilot)
        assert app.source.interval == normal


def test_ticker_waits_out_an_interval_made_longer_while_it_waits():
    from workbench.telemetry import Ticker

    class Count(Ticker):
        def __init__(self):
            super().__init__(0.25)
            self.times = []

        def tick(self):
            self.times.append(time.monotonic())
    t = Count()
    t.start()
    try:
        time.sleep(0.1)
        t.interval = 1.0  # no wake-up: the wait in progress is stretched to the new interval
        time.sleep(1.5)
    finally:
        t.stop()
    gaps = [b - a for a, b in zip(t.times, t.times[1:])]
    assert gaps and all(g >= 0.95 for g in gaps), gaps


async def _note(shown: list) -> None:
    shown.append(time.monotonic())


@aio
async def test_finished_reply_renders_as_a_restored_one():
    """A streamed reply's Markdown, once finished, is the same on screen as a reply given its whole
    text (restored from the history), Markdown syntax included."""
    app = make_app(None, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.chat_pane
        streamed = await pane.start_reply(streaming=True)
        for i in range(0, len(MARKDOWN_REPLY), 5):
            await streamed.append(MARKDOWN_REPLY[i:i + 5])
        await pilot.pause()
        assert str(streamed.query_one(".reply-plain").render()) == MARKDOWN_REPLY
        assert streamed.body.source == ""
        await streamed.finish()
        restored = await pane.start_reply(MARKDOWN_REPLY)
        await pilot.pause()
        assert streamed.text == streamed.body.source == restored.text == MARKDOWN_REPLY
        assert rendered(app, streamed.body) == rendered(app, restored.body)
        assert "NUMA node" in "".join(seg.text for line in rendered(app, streamed.body) for seg in line)
        await streamed.finish()  # a second end changes nothing
        assert streamed.body.source == MARKDOWN_REPLY


@aio
async def test_streamed_text_lays_the_screen_out_only_when_it_needs_more_rows(monkeypatch):
    """A layout re-arranges the whole screen: text that fits the rows the plain widget has is only
    repainted, and when it needs more the widget takes RESERVE rows to spare."""
    app = make_app(None, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        reply = await app.chat_pane.start_reply(streaming=True)
        await reply.append("x")
        await pilot.pause()
        plain = reply.query_one(PlainText)
        assert plain.outer_size.height == 1 + PlainText.RESERVE
        layouts = []  # the widget's own requests (the screen may lay out for other reasons)
        real = plain.refresh
        monkeypatch.setattr(plain, "refresh", lambda *a, **kw: (layouts.append(kw.get("layout", False)), real(*a, **kw))[1])
        for _ in range(20):
            await reply.append("y")
            await pilot.pause()
        assert layouts and not any(layouts) and str(plain.render()) == "x" + "y" * 20
        await reply.append("\nz" * (PlainText.RESERVE + 1))  # one row more than it has
        await pilot.pause()
        assert any(layouts) and plain.outer_size.height == PlainText.RESERVE + 2 + PlainText.RESERVE


def streaming_snapshots(n: int) -> list:
    """Live-like snapshots of a reply streaming on the simulated 2-socket machine: each with a new
    decode rate, worker load and memory figures, as the sampler takes them once a second."""
    from workbench.telemetry import Rates, Telemetry, WorkerRow
    base = Telemetry(None, simulate="epyc-2socket").sample(now=0.0)
    out = []
    for i in range(n):
        rates = Rates(prompt_tps=(400.0,), decode_tps=(120.0,), ttft=(0.05,), live_decode_tps=90.0 + 7.3 * i,
                      generating=True)
        nodes = tuple(dataclasses.replace(nd, kv=nd.kv + (i + 1) * 4096, free=nd.free - (i + 1) * 4096)
                      for nd in base.nodes)
        workers = tuple(WorkerRow(w, w, w // 2, w, w // 2, f"replica {w // 2}", (0.3 + 0.07 * i + 0.01 * w) % 1, False,
                                  "caller" if w == 0 else "pool") for w in range(4))
        out.append(dataclasses.replace(base, seq=i + 1, t=float(i), model="tiny.gguf", rates=rates, nodes=nodes,
                                       workers=workers))
    return out


def count_layouts(monkeypatch, within) -> tuple[list, list]:
    """Spies: the screen's layouts (each re-arranges every widget) asked for by ``within`` or a
    widget in it, and which widgets asked (the Footer lays out on its own after the app starts)."""
    from textual.screen import Screen
    from textual.widget import Widget
    layouts, requests = [], []
    real_layout, real_refresh = Screen._refresh_layout, Widget.refresh

    def ours(widget) -> bool:
        return widget is within or within in widget.ancestors

    def layout(self, *a, **kw):
        asked = {w for ws in self._layout_widgets.values() for w in ws}
        if any(ours(w) for w in asked):
            layouts.append(self)
        return real_layout(self, *a, **kw)

    def refresh(self, *a, **kw):
        if kw.get("layout") and ours(self):
            requests.append(f"{type(self).__name__}#{self.id}")
        return real_refresh(self, *a, **kw)

    monkeypatch.setattr(Screen, "_refresh_layout", layout)
    monkeypatch.setattr(Widget, "refresh", refresh)
    return layouts, requests


@aio
async def test_a_telemetry_snapshot_repaints_the_dashboard_without_a_layout(monkeypatch):
    """A snapshot changes figures, not heights: the dashboard repaints its panels and the screen is
    not laid out again (a layout costs the UI thread 10-70 ms, taken from the decode on 2 CPUs).
    Every figure still shows the new sample."""
    from textual.widgets import DataTable
    snaps = streaming_snapshots(6)
    app = make_app(None, autoload=False, frozen=snaps[0])
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboard
        dash.snapshot = snaps[1]
        await pilot.pause(0.1)
        layouts, requests = count_layouts(monkeypatch, dash)
        for s in snaps[2:]:
            dash.snapshot = s
            await pilot.pause(0.05)
            rates = "".join(seg.text for line in rendered(app, dash.query_one("#rates-text")) for seg in line)
            assert f"{s.rates.live_decode_tps:,.1f} t/s" in rates
            table = dash.query_one("#workers", DataTable)
            assert table.get_row_at(1)[5] == f"{100 * s.workers[1].busy:5.1f}%"
        assert layouts == [] and requests == []


@aio
async def test_a_snapshot_that_needs_more_rows_still_lays_out(monkeypatch):
    """A panel whose content grows (a note under the banner) gets its rows: a layout, then the
    dashboard's next snapshots are repaints again."""
    snaps = streaming_snapshots(4)
    app = make_app(None, autoload=False, frozen=snaps[0])
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboard
        banner = dash.query_one("#banner")
        await pilot.pause(0.1)
        rows = banner.size.height
        layouts, requests = count_layouts(monkeypatch, dash)
        dash.snapshot = dataclasses.replace(snaps[1], notes=("numa_balancing is on",))
        await pilot.pause(0.1)
        assert set(requests) == {"Readout#banner"} and layouts and banner.size.height == rows + 1
        layouts.clear(), requests.clear()
        dash.snapshot = dataclasses.replace(snaps[2], notes=("numa_balancing is on",))
        await pilot.pause(0.1)
        assert layouts == [] and requests == []


@aio
async def test_an_unchanged_panel_is_not_rendered_again(monkeypatch):
    """The topology (and any text equal to the one shown) is skipped, not re-rendered."""
    from workbench.screens import dashboard
    calls = []
    real = dashboard.topology_view
    monkeypatch.setattr(dashboard, "topology_view", lambda *a: (calls.append(a), real(*a))[1])
    snaps = streaming_snapshots(4)
    app = make_app(None, autoload=False, frozen=snaps[0])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        shown = len(calls)
        for s in snaps[1:]:
            app.dashboard.snapshot = s
            await pilot.pause(0.05)
        assert shown >= 1 and len(calls) == shown
        app.action_next_theme()  # a new palette: node colours change, the topology is drawn again
        await pilot.pause(0.1)
        assert len(calls) == shown + 1


@aio
async def test_regenerate_replaces_last_reply(tiny):
    app = make_app(tiny)
    app.settings.sampling.seed = None
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await chat_once(app, pilot, "hello world")
        await pilot.press("ctrl+r")
        await pilot.pause(0.1)
        await until(pilot, lambda: not app.generating)
        assert [m.role for m in app.chat.messages] == ["user", "assistant"]
        assert app.chat.messages[0].content == "hello world"
        assert len(app.chat_pane.query(Reply)) == 1 and len(app.chat_pane.query(UserMessage)) == 1


@aio
async def test_clear_chat(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await chat_once(app, pilot)
        await pilot.press("ctrl+l")
        await pilot.pause(0.1)
        assert app.chat.messages == [] and app.chat.session.tokens == []
        assert not app.chat_pane.query(Reply)


@aio
async def test_multi_turn_reuses_kv_cache(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await chat_once(app, pilot, "the cat")
        first_prompt = app.telemetry.rates.rates()
        await chat_once(app, pilot, "the dog")
        # second turn evaluates only the new tokens: fewer prompt tokens than the whole conversation
        line = stats_text(app.chat_pane.last_reply())
        n_prompt = int(line.split("prompt ")[1].split(" tok")[0])
        assert n_prompt < len(app.chat.prompt_tokens())
        assert len(first_prompt.decode_tps) == 1


# ---- placement controls ---------------------------------------------------------

@aio
async def test_controls_switch_weights_and_kv_live(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await chat_once(app, pilot)
        eng = app.engine
        c = app.query_one(Controls)
        c.query_one("#weights").value = "interleave"
        c.query_one("#kv").value = "interleave"
        await pilot.click("#apply")
        await pilot.pause(0.1)
        await until(pilot, lambda: not app.switching)
        assert (eng.placement.weights, eng.placement.kv) == ("interleave", "interleave")
        status = str(c.query_one("#switch-status").render())
        assert "weights none -> interleave in" in status and "ms" in status
        assert "kv first-touch -> interleave" in status
        reply = await chat_once(app, pilot)  # the conversation survives the switch
        assert "weights interleave · KV interleave" in stats_text(reply)
        await until(pilot, lambda: app.dashboard.snapshot.placement.get("weights") == "interleave")


@aio
async def test_controls_switch_thread_count_and_policy(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        c = app.query_one(Controls)
        c.query_one("#threads").value = "1"
        c.query_one("#policy").value = "isolate"
        c.request()
        await pilot.pause(0.1)
        await until(pilot, lambda: not app.switching)
        assert app.engine.pool.n_threads == 1 and app.engine.placement.policy == "isolate"
        await until(pilot, lambda: len(app.dashboard.snapshot.workers) == 1)
        await chat_once(app, pilot)


@aio
async def test_switch_that_does_not_fit_is_refused_and_previous_mode_kept(tiny):
    app = make_app(tiny, placement=Placement(budget=64 << 20))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        assert app.request_switch(kv="node:7")  # no memory there: the budget check refuses
        await until(pilot, lambda: not app.switching)
        assert app.engine.placement.kv == "first-touch"
        assert "does not fit" in app.last_error and "node 7" in app.last_error
        status = str(app.query_one(Controls).query_one("#switch-status").render())
        assert "refused" in status and "kept: weights none · KV first-touch" in status
        assert app.query_one(Controls).query_one("#kv").value == "first-touch"
        await chat_once(app, pilot)  # still works


@aio
async def test_load_with_too_small_budget_shows_modal_and_keeps_running(tiny):
    app = make_app(tiny, placement=Placement(budget=4096))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ErrorScreen))
        assert app.engine is None and "does not fit" in app.screen.message
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


# ---- loading other models and errors ---------------------------------------------

@aio
async def test_missing_model_file_is_reported_in_a_modal(tmp_path, tiny):
    app = make_app(str(tmp_path / "nope.gguf"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ErrorScreen))
        assert "nope.gguf" in app.screen.message
        await pilot.click("#error-ok")
        assert app.engine is None and app.is_running
        app.load_model(tiny)  # and a good model still loads afterwards
        await loaded(app, pilot)


@aio
async def test_corrupt_model_via_open_dialog_keeps_previous_model(tmp_path, tiny):
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        before = app.engine
        await pilot.press("f4")
        assert isinstance(app.screen, OpenModelScreen)
        app.screen.query_one("#open-path").value = str(bad)
        await pilot.click("#open-load")
        await until(pilot, lambda: isinstance(app.screen, ErrorScreen))
        assert "corrupt.gguf" in app.screen.message and "Still using tiny-llama.gguf" in app.screen.message
        await pilot.press("enter")
        assert app.engine is before
        await chat_once(app, pilot)


@aio
async def test_open_dialog_loads_another_model_and_closes_the_old_one(tiny, tiny2):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        old = app.engine
        await pilot.press("f4")
        inp = app.screen.query_one("#open-path")
        inp.value = ""
        await pilot.click("#open-path")
        await pilot.press(*tiny2[:-6])  # the suggester completes the rest of the name
        await pilot.pause(0.2)
        await pilot.press("right")
        assert inp.value == tiny2
        await pilot.press("enter")
        await until(pilot, lambda: app.engine is not old and app.engine is not None)
        assert app.engine.path == tiny2 and app.engine.cfg.n_layer == 1
        await until(pilot, lambda: old.pool._closed)
        await chat_once(app, pilot)


@aio
async def test_reload_replaces_the_engine(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        old = app.engine
        await pilot.press("f5")
        await until(pilot, lambda: app.engine is not old and not app.loading)
        assert app.engine.path == old.path


@aio
async def test_engine_error_mid_reply_is_notified_and_model_still_works(tiny):
    app = make_app(tiny)
    app.settings.sampling.n_predict = 20
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        model = app.engine.model
        real = model.forward
        calls = [0]

        def broken(*a, **kw):
            calls[0] += 1
            if calls[0] == 4:
                raise RuntimeError("simulated kernel fault")
            return real(*a, **kw)
        model.forward = broken
        await app.send_message("the cat")
        await until(pilot, lambda: not app.generating)
        assert "simulated kernel fault" in app.last_error
        assert any(n.severity == "error" and "simulated kernel fault" in n.message
                   for n in app._notifications)
        assert "✗ RuntimeError" in stats_text(app.chat_pane.last_reply())
        model.forward = real
        reply = await chat_once(app, pilot, "the dog")
        assert "tokens" in stats_text(reply)


# ---- other controls ----------------------------------------------------------------

@aio
async def test_sampling_dialog_validates_and_persists(tiny, xdg):
    app = make_app(tiny, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f6")
        assert isinstance(app.screen, SamplingScreen)
        app.screen.query_one("#s-temperature").value = "abc"
        await pilot.click("#sampling-save")
        assert isinstance(app.screen, SamplingScreen)
        assert "temperature" in str(app.screen.query_one("#sampling-error").render())
        app.screen.query_one("#s-temperature").value = "0"
        app.screen.query_one("#s-top_k").value = "5"
        await pilot.pause(0.3)
        await pilot.click("#sampling-save")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, SamplingScreen)
        assert app.settings.sampling.temperature == 0.0 and app.settings.sampling.top_k == 5
    assert load_settings(xdg).sampling.top_k == 5


@aio
async def test_theme_cycles_and_is_restored_next_start(xdg):
    app = make_app(None, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        first = app.theme
        await pilot.press("f7")
        assert app.theme != first
        chosen = app.theme
    assert json.loads(xdg.read_text())["theme"] == chosen
    app2 = WorkbenchApp(None, autoload=False)
    async with app2.run_test(size=SIZE):
        assert app2.theme == chosen


@aio
async def test_ansi_theme_and_stable_node_colours():
    app = make_app(None, autoload=False, theme="numawb-ansi")
    async with app.run_test(size=SIZE):
        assert app.theme == "numawb-ansi"
        pal = app.palette
        assert pal.node(1) == pal.node(1 + len(pal.nodes)) and pal.node(0) != pal.node(1)
        assert not any(c.startswith("#") for c in pal.nodes)


@aio
async def test_pause_and_refresh_rate(xdg):
    app = make_app(None, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        app.dashboard.focus()
        await pilot.press("p")
        assert app.source.kind == "live"
        assert app.source.paused and "paused" in app.sub_title
        seq = app.dashboard.snapshot.seq
        await pilot.pause(1.3)
        assert app.dashboard.snapshot.seq == seq
        await pilot.press("f8")
        assert not app.source.paused
        await pilot.press("plus")
        assert app.source.interval == 0.5
        await pilot.press("minus", "minus")
        assert app.source.interval == 2.0 and "refresh 2 s" in app.sub_title
    assert load_settings(xdg).refresh == 2.0


@aio
async def test_narrow_terminal_switches_between_chat_and_dashboard():
    app = make_app(None, autoload=False)
    async with app.run_test(size=(100, 40)) as pilot:
        main = app.screen
        assert main.shown == "chat"
        assert not app.dashboard.display and app.chat_pane.display
        await pilot.press("f2")
        assert main.shown == "dashboard" and app.dashboard.display and not app.chat_pane.display
        await pilot.press("f2")
        assert main.shown == "chat"
        await pilot.resize_terminal(170, 40)
        await pilot.pause()
        assert app.dashboard.display and app.chat_pane.display


@aio
async def test_f3_focuses_placement_controls_on_narrow_screen():
    app = make_app(None, autoload=False)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("f3")
        assert app.screen.shown == "dashboard"
        assert app.focused is app.query_one("#weights")


@aio
async def test_help_lists_every_binding_with_its_id():
    app = make_app(None, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        ids = {bid for _, _, bid in app.screen.rows}
        assert {b.id for b in app.BINDINGS} <= ids
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@aio
async def test_every_binding_has_an_id_and_a_palette_entry():
    app = make_app(None, autoload=False)
    async with app.run_test(size=SIZE):
        assert all(b.id for b in app.BINDINGS)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for b in app.BINDINGS:
            if b.action != "quit":
                assert any(t.startswith(b.description) for t in titles), b.description
        for mode in ("Weights: mirror", "Weights: slice", "KV cache: interleave", "Theme: numawb-ansi"):
            assert mode in titles
        assert not {"ctrl+s", "ctrl+b", "ctrl+j", "ctrl+h"} & {k for b in app.BINDINGS for k in b.key.split(",")}


@aio
async def test_palette_command_switches_weights(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        cmd = next(c for c in app.get_system_commands(app.screen) if c.title == "Weights: mirror")
        cmd.callback()
        await pilot.pause(0.1)
        await until(pilot, lambda: not app.switching)
        assert app.engine.placement.weights == "mirror"


@aio
async def test_simulated_topology_is_marked(tiny):
    app = make_app(tiny, simulate="xeon-8node-smt")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await until(pilot, lambda: app.dashboard.snapshot.model)
        snap = app.dashboard.snapshot
        assert snap.simulated and len(snap.nodes) == 8
        assert "SIMULATED" in str(app.dashboard.query_one("#banner").render())
        assert "SIMULATED" in app.sub_title


@aio
async def test_no_model_yet_send_is_refused_politely():
    app = make_app(None, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        assert not await app.send_message("hi")
        await pilot.pause()
        assert any("no model loaded" in n.message for n in app._notifications)


# ---- recording and replay -----------------------------------------------------------

def test_record_script_and_replay(tmp_path, tiny):
    from workbench.record import run_record
    script = tmp_path / "s.txt"
    script.write_text("set n_predict=4 seed=1\nload\nchat the cat\nswitch weights=interleave\n"
                      "switch kv=interleave\nchat the dog\n")
    out = tmp_path / "rec"
    assert run_record(str(out), script=str(script), model=tiny, size=(120, 40)) == 0
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    kinds = {e["kind"] for e in events}
    assert {"load.done", "chat.user", "token", "reply.done", "switch.done", "snapshot", "screenshot"} <= kinds
    assert all("t" in e and "dt" in e for e in events)
    shots = sorted(p.name for p in out.glob("*.svg"))
    assert shots == ["01-set.svg", "02-load.svg", "03-chat.svg", "04-switch.svg", "05-switch.svg", "06-chat.svg"]
    assert "tiny-llama.gguf" in (out / "06-chat.svg").read_text()

    async def replay() -> None:
        app = make_app(None, replay=str(out / "events.jsonl"), autoload=False)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.dashboard.snapshot.source == "replay", 10)
            await until(pilot, lambda: app.dashboard.snapshot.model == "tiny-llama.gguf", 20)
            await until(pilot, lambda: len(app.chat_pane.query(UserMessage)) >= 1, 20)
            assert app.engine is None and app.source.kind == "replay" and "REPLAY" in app.sub_title
            await pilot.press("f8")  # pause works on a replay as on live telemetry
            assert app.source.paused and "paused" in app.sub_title
            pos = app.source.position
            await pilot.pause(1.3)
            assert app.source.position == pos
            await pilot.press("f8")
            app.source.set_interval(0.25)
            await until(pilot, lambda: app.source.finished, 60)
            await until(pilot, lambda: "replay finished" in str(app.chat_pane.query_one("#chat-status").render()), 10)
            assert len(app.chat_pane.query(UserMessage)) == 2  # both recorded turns were played
    asyncio.run(replay())


def test_replay_refuses_a_bad_recording_in_one_line(tmp_path):
    from workbench.errors import UserError
    from workbench.replay import Recording
    bad = tmp_path / "events.jsonl"
    bad.write_text('{"kind": "snapshot", "data": {}}\nnot json\n')
    with pytest.raises(UserError, match="events.jsonl:2: not a JSON line"):
        Recording.load(str(bad))
    with pytest.raises(UserError, match="no such recording"):
        Recording.load(str(tmp_path / "missing.jsonl"))


@aio
async def test_a_frozen_snapshot_never_changes():
    from workbench.telemetry import Telemetry
    frozen = Telemetry(None, simulate="epyc-2socket").sample(now=0.0)
    app = make_app(None, autoload=False, frozen=frozen)
    async with app.run_test(size=SIZE) as pilot:
        assert app.source.kind == "frozen" and app.dashboard.snapshot == frozen
        app.sample_now()
        await pilot.press("f8")
        await pilot.pause(1.2)
        assert app.dashboard.snapshot == frozen and app.engine is None


def test_record_reports_a_failed_step(tmp_path):
    from workbench.record import run_record
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"op": "load", "arg": str(tmp_path / "missing.gguf")}]))
    assert run_record(str(tmp_path / "rec"), script=str(script), size=(100, 30)) == 1
    events = (tmp_path / "rec" / "events.jsonl").read_text()
    assert '"load.error"' in events and '"step.failed"' in events


def test_script_parser_rejects_unknown_steps():
    from workbench.record import DEFAULT_SCRIPT, parse_script
    ops = [s.op for s in parse_script(DEFAULT_SCRIPT)]
    assert ops.count("chat") == 3 and ops.count("switch") == 2 and "load" in ops
    with pytest.raises(ValueError, match="unknown script step"):
        parse_script("dance now")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_script("switch mirror")


@aio
async def test_conversation_is_saved_and_restored_and_survives_reload(tiny, tmp_path):
    from workbench.history import ChatHistory
    history = ChatHistory(tmp_path / "state" / "chat.jsonl")
    app = make_app(tiny, history=history)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await chat_once(app, pilot, "the cat sat")
        first = [(m.role, m.content) for m in app.chat.messages]
        app.action_reload()
        await until(pilot, lambda: app.loading)
        await loaded(app, pilot)
        assert [(m.role, m.content) for m in app.chat.messages] == first  # kept across the reload
    assert [(m.role, m.content) for m in history.load()] == first
    again = make_app(tiny, history=history)  # a new start restores the conversation
    async with again.run_test(size=SIZE) as pilot:
        await loaded(again, pilot)
        assert [(m.role, m.content) for m in again.chat.messages] == first
        assert len(again.query(UserMessage)) == 1 and len(again.query(Reply)) == 1
        await again.action_clear_chat()
    assert history.load() == []


# ---- mixture-of-experts routing ---------------------------------------------------

@aio
async def test_routing_panel_shows_expert_hits_node_shares_and_imbalance(tiny_moe):
    app = make_app(tiny_moe)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot, timeout=600)
        await chat_once(app, pilot)
        snap = app.source.sample_now()  # after the reply: the engine's window no longer moves
        await until(pilot, lambda: app.dashboard.snapshot.seq >= snap.seq)
        r = app.dashboard.snapshot.routing
        assert r is not None and r.window > 0
        eng_r = app.engine.routing()
        assert r.n_expert == 8 and r.layers == tuple(eng_r.layers) == (0, 1)
        # every token routes to n_expert_used = 2 experts, all of them counted (the last layer of a
        # prompt pass computes only the rows whose logits are wanted, as llama.cpp does)
        assert sum(r.hits[0]) == 2 * r.window and all(0 < sum(h) <= 2 * r.window and sum(h) % 2 == 0
                                                       for h in r.hits)
        assert r.hits == tuple(tuple(int(v) for v in eng_r.hits[il]) for il in r.layers)
        assert r.node_bytes and abs(sum(r.node_shares.values()) - 1) < 1e-9 and r.imbalance >= 1.0
        panel = app.dashboard.query_one("#routing-panel")
        assert panel.display
        text = app.dashboard.query_one("#routing").render().plain
        assert "2 MoE layers × 8 experts" in text and "imbalance" in text and "node 0" in text
        assert text.count("\n     L") == 2  # one row per layer
        # a mixture of experts offers the `experts` weights mode in the controls
        opts = [v for _, v in app.controls.query_one("#weights")._options]
        assert "experts" in opts


@aio
async def test_routing_panel_is_hidden_for_a_dense_model(tiny):
    app = make_app(tiny)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        app.sample_now()
        await until(pilot, lambda: app.dashboard.snapshot.model == "tiny-llama.gguf")
        assert app.dashboard.snapshot.routing is None
        assert not app.dashboard.query_one("#routing-panel").display
        assert not app.dashboard.query_one("#serving-panel").display


def test_record_writes_routing_samples_and_replay_shows_them(tmp_path, tiny_moe):
    from workbench.record import run_record
    from workbench.replay import Recording, replayed
    script = tmp_path / "s.txt"
    script.write_text("set n_predict=4 seed=1\nload\nchat the cat\n")
    out = tmp_path / "rec"
    assert run_record(str(out), script=str(script), model=tiny_moe, size=(120, 40), timeout=600) == 0
    rec = Recording.load(str(out / "events.jsonl"))
    routed = [replayed(e["data"]).routing for e in rec.events if e["kind"] == "snapshot"
              and e["data"].get("routing")]
    assert routed and routed[-1].window > 0 and routed[-1].layers == (0, 1)
    assert sum(routed[-1].hits[0]) == 2 * routed[-1].window and routed[-1].n_expert == 8

    async def replay() -> None:
        app = make_app(None, replay=str(out / "events.jsonl"), autoload=False)
        async with app.run_test(size=SIZE) as pilot:
            app.source.set_interval(0.25)
            await until(pilot, lambda: app.dashboard.snapshot.routing is not None
                        and app.dashboard.snapshot.routing.window > 0, 60)
            assert app.dashboard.query_one("#routing-panel").display
    asyncio.run(replay())


# ---- advice ------------------------------------------------------------------------

@aio
async def test_advice_panel_predicts_current_and_best_mode_and_a_what_if(tiny, tiny2, tmp_path):
    """On a fixture machine advice needs no probe: it runs after the load, in a worker."""
    app = make_app(tiny, simulate="epyc-2socket", auto_advice=True)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await until(pilot, lambda: app.advice is not None and not app.advising, 120)
        v = app.advice_view
        best = app.advice.best
        assert v.machine == "SIMULATED epyc-2socket" and v.best.startswith(f"weights {best.weights} / KV {best.kv}")
        from workbench.advisor.advise import advise
        n = app.engine.pool.n_threads
        alone = advise(tiny, "epyc-2socket", app.settings.n_ctx, threads=[n], weights=["none"], kvs=["first-touch"],
                       measure=False)
        cur = next(c for c in alone.candidates if c.policy == "distribute")
        assert cur is not None and v.current_tps == cur.predicted_decode_tps
        assert (app.advice_current.weights, app.advice_current.threads) == ("none", n)
        assert v.reason == app.advice.reason and v.reason
        await chat_once(app, pilot)
        app.sample_now()
        measured = app.telemetry.rates.rates().current_decode
        await until(pilot, lambda: app.dashboard.snapshot.rates.current_decode == measured)
        await until(pilot, lambda: app.advice_view.current_depth > 0)  # predicted at the reply's depth
        v = app.advice_view
        text = app.dashboard.query_one("#advice-text").render().plain
        assert f"predicted {v.current_tps:,.1f} t/s at depth {v.current_depth:,} · measured {measured:,.1f} t/s" in text
        assert "best mode: weights" in text
        # the fixture machine has automatic NUMA balancing on: a warning with its fix
        assert [w for w in v.warnings if w[0] == "warn" and "NUMA balancing is on" in w[1]]
        assert "warning: automatic NUMA balancing is on" in text and "fix: echo 0 > /proc/sys/kernel" in text
        # a switch: "this mode" follows the placement in force
        assert app.request_switch(weights="interleave")
        await until(pilot, lambda: not app.switching, 120)
        await until(pilot, lambda: app.advice_view.current.startswith("weights interleave /") and not app.advising, 120)
        inter = advise(tiny, "epyc-2socket", app.settings.n_ctx, threads=[n], weights=["interleave"],
                       kvs=["first-touch"], measure=False)
        assert app.advice_view.current_tps == next(c for c in inter.candidates
                                                   if c.policy == "distribute").predicted_decode_tps
        # what-if: F10 opens a file's header only; the loaded model stays
        engine = app.engine
        await pilot.press("f10")
        assert isinstance(app.screen, OpenModelScreen) and app.screen.what_if
        app.screen.query_one("#open-path").value = tiny2
        await pilot.click("#open-load")
        await until(pilot, lambda: "tiny-other.gguf" in app.advice_view.whatif and not app.advising, 120)
        assert app.engine is engine and "t/s" in app.advice_view.whatif
        assert "what-if: tiny-other.gguf" in app.dashboard.query_one("#advice-text").render().plain
        # a file that is not a GGUF: one line in the panel, the app keeps running
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"not a gguf at all")
        assert app.request_advice(what_if=str(bad))
        await until(pilot, lambda: not app.advising, 60)
        assert app.advice_view.status.startswith("✗ what-if bad.gguf:") and "\n" not in app.advice_view.status
        assert app.advice_view.best == v.best


@aio
async def test_advice_follows_the_depth_of_the_last_reply(tiny):
    """After a reply the mode in force is predicted again at the cache depth that reply decoded at,
    so the panel sets the measured rate against a prediction for the same cache."""
    from workbench.advisor.advise import advise
    from workbench.app import current_candidate
    app = make_app(tiny, simulate="epyc-2socket", auto_advice=True)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await until(pilot, lambda: app.advice is not None and not app.advising, 120)
        at0 = app.advice_view.current_tps
        assert app.advice_view.current_depth == 0 and at0
        await chat_once(app, pilot, "the cat sat on the mat and then the dog")
        await until(pilot, lambda: app.advice_view.current_depth > 0, 60)
        d, n = app.advice_view.current_depth, app.chat.session.kv.n
        assert n - 8 <= d < n  # the mean position of this reply's (at most 8) tokens
        p, eng = app.engine.placement, app.engine
        current = (p.weights, p.kv, eng.pool.n_threads, p.policy)
        again = current_candidate(advise(eng.path, app.advice.topology, app.advice.n_ctx, depth=d,
                                         threads=[current[2]], weights=[p.weights], kvs=[p.kv],
                                         profile=app.advice.profile, measure=False, checks=False), *current)
        assert app.advice_view.current_tps == pytest.approx(again.predicted_decode_tps)
        assert app.advice_view.current_tps < at0  # a token reads the cache too
        await pilot.pause(0.1)
        assert f"at depth {d:,}" in app.dashboard.query_one("#advice-text").render().plain


@aio
async def test_engine_constants_are_measured_with_the_engine_to_themselves(tiny, monkeypatch):
    """On this machine the advice worker may measure the engine's constants (twins with workers of
    their own, up to ~45 s): it holds the engine's lock meanwhile, so a reply never runs beside the
    measurement (both were slowed, and the constants came out low). A prediction from the cache
    alone (no measuring) takes no lock."""
    import importlib
    advise_mod = importlib.import_module("workbench.advisor.advise")   # (the package exports the function)
    real = advise_mod.advise
    seen: list[tuple[bool, bool]] = []
    app = make_app(tiny)

    def lock_held_elsewhere() -> bool:
        got: list[bool] = []

        def probe() -> None:
            ok = app.engine.lock.acquire(blocking=False)
            got.append(ok)
            if ok:
                app.engine.lock.release()
        t = threading.Thread(target=probe)
        t.start()
        t.join()
        return not got[0]

    def fake(path, topology, ctx, **kw):
        seen.append((bool(kw.get("measure")), lock_held_elsewhere()))
        return real(path, "epyc-2socket", ctx, **dict(kw, measure=False))
    monkeypatch.setattr(advise_mod, "advise", fake)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        assert app.request_advice(probe=True)
        await until(pilot, lambda: app.advice is not None and not app.advising, 120)
        assert seen[0] == (True, True) and not any(m for m, _ in seen[1:])   # then the cost model alone
        seen.clear()
        app.simulate = "epyc-2socket"   # a simulated machine: nothing is measured, no lock
        assert app.request_advice(probe=True)
        await until(pilot, lambda: seen and not app.advising, 120)
        assert seen[0] == (False, False)


@aio
async def test_advice_without_a_cached_probe_waits_for_f9(tiny, tmp_path, monkeypatch):
    """On this machine, with no probe cached, the app does not probe on its own: it says F9 does."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    app = make_app(tiny, auto_advice=True)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await until(pilot, lambda: "F9 probes it" in app.advice_view.status)
        assert app.advice is None and not app.advising
        assert "F9 probes it" in app.dashboard.query_one("#advice-text").render().plain


# ---- serving -------------------------------------------------------------------------

def _complete(url: str, prompt: str, max_tokens: int) -> dict:
    import urllib.request
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


@aio
async def test_serve_from_the_app_shows_active_requests(tiny):
    app = make_app(tiny, serve=0, serve_slots=2)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await until(pilot, lambda: app.server is not None)
        srv = app.server
        assert srv.port > 0 and f"serving {srv.url}" in app.sub_title
        results: list[dict] = []
        threads = [threading.Thread(target=lambda: results.append(_complete(srv.url, "the cat", 200)))
                   for _ in range(2)]
        engine = app.engine
        for t in threads:
            t.start()
        # look between passes (holding the engine's lock stops the scheduler) until both decode
        end = time.monotonic() + 120
        while True:
            engine.lock.acquire()
            if sum(1 for a in srv.active() if a.state == "decode" and a.tokens > 0) == 2:
                break
            engine.lock.release()
            assert time.monotonic() < end and any(t.is_alive() for t in threads)
            await pilot.pause(0.01)
        try:
            snap = app.source.sample_now()
            await until(pilot, lambda: app.dashboard.snapshot.seq >= snap.seq)
            rows = app.dashboard.snapshot.requests
            assert app.dashboard.snapshot.serving == srv.label
            assert len(rows) == 2 and {q.slot for q in rows} == {0, 1} and {q.state for q in rows} == {"decode"}
            assert all(q.kv_nodes and q.tokens > 0 and q.prompt_tokens > 0 for q in rows)
            assert app.dashboard.query_one("#serving-panel").display
            table = app.dashboard.query_one("#requests")
            assert table.row_count == 2 and {str(table.get_row_at(i)[0]) for i in range(2)} == {q.id for q in rows}
        finally:
            engine.lock.release()
        # the app's own chat goes on beside the server (the engine's lock interleaves them)
        await chat_once(app, pilot)
        await until(pilot, lambda: all(not t.is_alive() for t in threads), 300)
        assert len(results) == 2 and all(r["usage"]["completion_tokens"] > 0 for r in results)
        # greedy and batched: both got the same tokens
        assert results[0]["choices"][0]["text"] == results[1]["choices"][0]["text"]
    assert app.server is None and srv.scheduler._stop


@aio
async def test_serve_on_a_port_in_use_is_one_line(tiny):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        app = make_app(tiny, serve=port)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            await until(pilot, lambda: app.last_error)
            assert app.server is None and app.last_error == (f"could not listen on 127.0.0.1:{port} "
                                                             "(in use, or not an address here)")
            await chat_once(app, pilot)  # the model is still usable


def test_record_script_requests_shows_a_serving_dashboard(tmp_path, tiny):
    from workbench.record import run_record
    script = tmp_path / "s.txt"
    script.write_text("set n_predict=256 seed=1\nview dashboard\nload\nrequests 2 the cat sat\nwait 0.5\n")
    out = tmp_path / "rec"
    assert run_record(str(out), script=str(script), model=tiny, size=(120, 60)) == 0
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert "serve.start" in kinds and kinds.count("request.done") == 2 and "request.error" not in kinds
    serving = [e["data"] for e in events if e["kind"] == "snapshot" and e["data"].get("requests")]
    rows = [q for snap in serving for q in snap["requests"]]
    assert any(q["state"] == "decode" and q["tokens"] > 0 for q in rows)
    assert all(q["kv_nodes"] for q in rows if q["slot"] >= 0)  # a queued request has no slot yet
    import html
    svg = html.unescape((out / "04-requests.svg").read_text()).replace("\xa0", " ")
    assert "serving tiny-llama.gguf on http://127.0.0.1:" in svg and "KV node" in svg


def test_serve_flag_on_the_command_line(tmp_path):
    from workbench.cli import parse_args
    assert parse_args(["--serve"]).serve == 8080
    assert parse_args(["--serve", "9000", "-m", "x.gguf"]).serve == 9000
    assert parse_args([]).serve is None
    with pytest.raises(SystemExit):
        parse_args(["generate", "-p", "x", "--serve"])
    from workbench.cli import cmd_app
    from workbench.errors import UserError
    with pytest.raises(UserError, match="--serve: the port must be in 0..65535"):
        cmd_app(parse_args(["--serve", "70000"]))


def test_routing_heat_map_bins_many_layers_and_experts_into_the_width():
    """A DeepSeek-sized routing (58 MoE layers x 256 experts) fits 24 rows and the panel's width;
    each cell sums the hits of the experts and layers it stands for."""
    from workbench.screens.dashboard import SHADES, routing_view
    from workbench.screens.themes import Palette
    from workbench.telemetry import RoutingInfo
    layers = tuple(range(3, 61))
    hits = tuple(tuple(8 if e == (il * 7) % 256 else 0 for e in range(256)) for il in layers)
    r = RoutingInfo(64, 256, layers, hits, ((0, 3.0e8), (1, 1.0e8)))
    text = routing_view(r, Palette(), width=76).plain
    rows = [line for line in text.splitlines() if line.lstrip().startswith("L")]
    assert len(rows) == 24 and rows[0].split()[0] == "L3-4" and rows[-1].split()[0].endswith("-60")
    cells = [line[8:] for line in rows]
    assert all(len(c) == 64 for c in cells)  # 256 experts, 4 per column
    assert all(set(c) <= set(SHADES) for c in cells) and all(c.strip() for c in cells)
    assert "(4 per column)" in text and "imbalance 1.50×" in text and " 75.0%" in text


def test_every_worker_message_has_a_handler_that_outlives_the_widgets():
    """A worker thread's message can be dispatched while the app exits: each has a wrapped handler."""
    from workbench import messages as app_mod
    kinds = app_mod.WorkerMessage.__subclasses__()
    assert len(kinds) >= 12
    for kind in kinds:
        handler = getattr(WorkbenchApp, kind.handler_name, None)
        assert handler is not None and getattr(handler, "from_worker", False), kind.__name__


@aio
async def test_worker_messages_dispatched_while_the_app_exits_end_quietly_and_keep_the_turn(tmp_path):
    """CI saw 'replay finished' reach the chat pane after its status line was gone: the app had
    begun to exit (not running, main screen still on the stack, its widgets pruned). Every
    worker message handled in that state ends quietly, and a finished reply is still saved."""
    from types import SimpleNamespace
    from workbench import messages as app_mod
    from workbench.engine.chat import Message as Turn
    from workbench.engine.engine import Stats
    from workbench.history import ChatHistory
    from workbench.numa.layout import ProgressEvent
    from workbench.replay import FINISHED
    from workbench.screens.chat import ChatPane
    from workbench.telemetry import Snapshot

    made = {
        app_mod.LoadProgress: lambda: app_mod.LoadProgress(ProgressEvent("load", 1, 2), "load"),
        app_mod.PreparingDecode: lambda: app_mod.PreparingDecode(True),
        app_mod.Switched: lambda: app_mod.Switched([], 0.01),
        app_mod.SwitchRefused: lambda: app_mod.SwitchRefused("refused"),
        app_mod.SnapshotReady: lambda: app_mod.SnapshotReady(Snapshot(seq=1, t=0.0, source="live", simulated=False)),
        app_mod.AdviceProgress: lambda: app_mod.AdviceProgress("probing"),
        app_mod.AdviceReady: lambda: app_mod.AdviceReady(None, "", "failed"),
        app_mod.AdviceAtDepth: lambda: app_mod.AdviceAtDepth(("none", "first-touch", 2, "distribute"), 10.0, 5),
        app_mod.ReplyFailed: lambda: app_mod.ReplyFailed("boom"),
        app_mod.ReplyDone: lambda: app_mod.ReplyDone(Stats(decode_tokens=2, decode_seconds=0.1, stop_reason="length"), "p"),
    }
    replayed = [("chat.user", {"text": "hi"}), ("reply.done", {"text": "hello"}), (FINISHED, {"path": "x"}),
                ("switch.done", {"reports": []})]
    # a load's messages need a real engine (Loaded) or open a dialog (LoadFailed): the other test covers their wrapper
    assert set(made) | {app_mod.Loaded, app_mod.LoadFailed, app_mod.ReplayEvent} == set(app_mod.WorkerMessage.__subclasses__())
    history = ChatHistory(tmp_path / "chat.jsonl")
    app = make_app(None, autoload=False, history=history)
    seen: dict[str, object] = {}

    async def during_exit(pane: ChatPane) -> None:  # the state CI hit: pruned widgets, stack not yet cleared
        seen["state"] = (app.is_running, len(app.screen_stack), len(pane.query("#chat-status")))
        errors = []
        messages = [make() for make in made.values()] + [app_mod.ReplayEvent(k, d) for k, d in replayed]
        for msg in messages:
            turn = [Turn("user", "hi"), Turn("assistant", "hello")]
            app.chat = SimpleNamespace(messages=turn) if isinstance(msg, app_mod.ReplyDone) else None
            try:
                await getattr(app, msg.handler_name)(msg)
            except Exception as e:  # noqa: BLE001 - collected to name every failing handler
                errors.append(f"{type(msg).__name__}: {e!r}")
        seen["errors"] = errors

    original = ChatPane.on_unmount if hasattr(ChatPane, "on_unmount") else None
    ChatPane.on_unmount = during_exit
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
    finally:
        if original is None:
            del ChatPane.on_unmount
        else:
            ChatPane.on_unmount = original
    assert seen["state"] == (False, 1, 0)
    assert seen["errors"] == []
    assert [(m.role, m.content) for m in history.load()] == [("user", "hi"), ("assistant", "hello")]

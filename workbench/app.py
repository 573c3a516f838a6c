"""The numawb Textual app: drives the engine from thread workers and shows live NUMA telemetry.

The UI never blocks: model loads, placement switches and generation run in thread workers
that report back with messages. The dashboard is fed by one snapshot source: live telemetry
(its own sampler thread), a frozen snapshot (screenshots) or a replayed recording
(``workbench.replay``). Widgets live in ``workbench/screens/``; this module is the only UI code
that talks to the engine. It receives a ready ``Placement`` and never reads the command line
(``workbench.cli`` is the front door).

Beside the chat it can serve the loaded model (``serve=PORT``, ``numawb --serve``: a
``workbench.server.http.AppServer`` serves it on its own thread, the telemetry lists its requests)
and predict placements with ``workbench.advisor`` in a worker (F9; F10: another file's header).
The messages its workers post are in ``workbench.messages``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from rich.text import Text
from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Input

from .engine import Chat, DoneEvent, SamplingParams, TokenEvent
from .history import ChatHistory
from .engine.engine import Placement, SwitchReport
from .numa.budget import fmt_bytes
from .numa.layout import ProgressEvent
from .settings import SamplingSettings, Settings, load_settings, save_settings
from .replay import FINISHED, Recording, ReplaySource
from .telemetry import FrozenSource, Sampler, Snapshot, SnapshotSource, Telemetry
from .screens.chat import ChatPane, Reply
from .numa.modes import EXPERT_MODES, WEIGHT_MODES, kv_choices
from .screens.dashboard import AdviceView, Controls, Dashboard, LoadPanel
from .screens.dialogs import ErrorScreen, HelpScreen, OpenModelScreen, SamplingScreen
from .screens.main import MainScreen
from .screens.themes import Palette, load_themes
from .messages import (AdviceAtDepth, AdviceProgress, AdviceReady, LoadFailed, Loaded, LoadProgress, PreparingDecode,
                       ReplayEvent, ReplyDone, ReplyFailed, SnapshotReady, Switched, SwitchRefused, from_worker)

if TYPE_CHECKING:
    from .server.http import AppServer

Recorder = Callable[[str, dict], None]
#: UI updates per second while a reply streams. Each repaints the reply's plain text (a few ms of the
#: UI thread, which on 2 CPUs is taken from the decode's two threads): in alternating recordings 10
#: kept the UI thread at 15-19% of a CPU during a reply where 25 took 16-27%
STREAM_HZ = 10
#: ... and while the engine's threads take every CPU this process may use: each update's UI work is
#: then taken from a decoding thread (SmolLM2-135M, 2 threads on 2 CPUs, 400-token replies in
#: alternating recordings: 10 Hz 139-171 / 109-136 t/s, 5 Hz 177-184 / 137-145, 4 Hz 165-173 / 123-142)
STREAM_HZ_BUSY = 4
#: ... and the dashboard's telemetry samples at most this often (s) while such a reply streams: a
#: snapshot is 10-15 ms of sampling and 35-50 ms of the UI thread, a tenth of a 0.4 s reply (the
#: README's session, SmolLM2 at 2 threads on 2 CPUs, three alternating recordings each: sampling every
#: second 203 / 177 t/s mean, every 3 s 226 / 215)
BUSY_REFRESH = 3.0
COMPLETION_NOTE = "completion mode: this model has no chat template; it continues your text"


def stats_line(stats: Any, placement: str) -> str:
    """The line under a reply: tokens, prompt and decode t/s, ttft, and the mode in force."""
    n = stats.decode_tokens + (1 if stats.ttft else 0)
    return (f"{n} tokens · prompt {stats.prompt_tokens} tok @ {stats.prompt_tps:,.1f} t/s · "
            f"decode {stats.decode_tps:,.1f} t/s · ttft {1000 * stats.ttft:,.0f} ms · "
            f"{stats.stop_reason} · {placement}")


def mode_label(weights: str, kv: str, threads: int, policy: str = "distribute") -> str:
    """A placement in the advice panel's words."""
    pol = "" if policy in ("", "distribute") else f" ({policy})"
    return f"weights {weights} / KV {kv} / {threads} thread{'s' if threads != 1 else ''}{pol}"


def current_candidate(advice: Any, weights: str, kv: str, threads: int, policy: str) -> Any:
    """The advisor's candidate for the placement in force: same modes (or merged into an
    identical one), same thread count and policy (``isolate:N`` included); None when absent."""
    for c in advice.candidates:
        if c.threads != threads or c.policy != (policy or "distribute"):
            continue
        if (c.weights, c.kv) == (weights, kv) or f"{weights}/{kv}" in c.same_as:
            return c
    return None


def placement_text(eng: Any) -> str:
    p = eng.placement
    return f"weights {p.weights} · KV {p.kv} · {eng.pool.n_threads} threads ({p.policy})"


class WorkbenchApp(App[int]):
    """numawb: chat with a GGUF model while watching its memory, threads and token rates."""

    CSS_PATH = "screens/app.tcss"
    TITLE = "numawb"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("f1", "help", "Help", id="help"),
        Binding("f2", "toggle_view", "View", id="toggle-view"),
        Binding("f3", "placement", "Placement", id="placement"),
        Binding("f4", "open_model", "Open", id="open-model"),
        Binding("f5", "reload", "Reload", id="reload"),
        Binding("f6", "sampling", "Sampling", id="sampling"),
        Binding("f7", "next_theme", "Theme", id="theme"),
        Binding("f8,p", "pause", "Pause", id="pause"),
        Binding("f9", "advise", "Advice", id="advise"),
        Binding("f10", "what_if", "What-if", id="what-if"),
        Binding("plus,equals_sign", "faster", "Faster", id="faster", key_display="+"),
        Binding("minus", "slower", "Slower", id="slower", key_display="-"),
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+r", "regenerate", "Regen", id="regenerate"),
        Binding("ctrl+l", "clear_chat", "Clear", id="clear-chat"),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True),
    ]

    generating: reactive[bool] = reactive(False)

    def __init__(self, model: str | None = None, *, placement: Placement | None = None,
                 simulate: str | None = None, autoload: bool = True, settings: Settings | None = None,
                 settings_file: Path | None = None, persist: bool = True, frozen: Snapshot | None = None,
                 replay: Recording | str | None = None, recorder: Recorder | None = None, theme: str | None = None,
                 sample_on_start: bool = True, history: ChatHistory | None = None,
                 serve: int | None = None, serve_slots: int = 4, auto_advice: bool = True,
                 ray: str | None = None, ray_timeout: float | None = None) -> None:
        """``placement``: the placement the first load uses (built and checked by the caller).
        The dashboard's source: ``frozen`` (a fixed snapshot), ``replay`` (a recording or its
        path), else live telemetry of the loaded engine (``simulate``: a fixture topology).
        ``serve``: serve the loaded model on 127.0.0.1:PORT (0: any free port) with
        ``serve_slots`` batched slots. ``auto_advice``: predict after each load when that needs
        no probe (the memory probe is cached, or the topology is a fixture). ``ray``: load the
        model as a pipeline over the nodes of the Ray cluster at this address (workbench.cluster):
        the chat, the server and the dashboard (grouped by host, then node) run over it."""
        super().__init__()
        self.ray_address = ray
        self.ray_timeout = ray_timeout  # seconds one pipeline step may take (None: the pipeline's default)
        self.serve_port, self.serve_slots = serve, serve_slots
        self.server: AppServer | None = None
        self.auto_advice = auto_advice and not ray  # the advisor predicts one machine
        self.advice: Any = None           # the last workbench.advisor Advice for the loaded model
        self.advice_current: Any = None   # its Candidate for the placement in force (None: not predicted)
        self.advice_view = AdviceView()
        self.advising = False
        self.scripted_clients: Any = None  # the ``requests`` step's clients (workbench.record)
        self.history = history  # saved conversation (interactive runs only)
        self.settings_file = settings_file
        self.settings = settings or load_settings(settings_file)
        self.persist = persist
        self.model_path = model
        self.model_note = ""  # which model "no -m" chose (or why it cannot chat), over the chat
        self.placement_req = placement or Placement()
        self.simulate, self.autoload = simulate, autoload
        self.recorder = recorder
        self.engine: Any = None
        self.chat: Chat | None = None
        self.loading = False
        self.preparing = False  # compiling the decode call after a load (`_prepare_decoding`)
        self.switching = False
        self.last_switch: list[SwitchReport] = []
        self.last_error: str = ""
        self.telemetry = Telemetry(None, simulate)
        self.source: SnapshotSource = self._make_source(frozen, replay)
        self.sample_on_start = sample_on_start
        self._cancel = threading.Event()
        self._stream_lock = threading.Lock()
        self._pending: list[str] = []
        self._flushed = 0.0  # when the streamed text was last shown (time.monotonic)
        self._reply: Reply | None = None
        self._last_progress = 0.0
        self._t0 = time.time()
        self._themes = load_themes()
        for th, _ in self._themes.values():
            self.register_theme(th)
        wanted = theme or self.settings.theme
        self.theme = wanted if wanted in self._themes else "numawb"

    # ---- plumbing -------------------------------------------------------
    def _make_source(self, frozen: Snapshot | None, replay: Recording | str | None) -> SnapshotSource:
        """The one place that decides what feeds the dashboard."""
        if frozen is not None:
            return FrozenSource(frozen)
        if replay is not None:
            rec = replay if isinstance(replay, Recording) else Recording.load(replay)
            return ReplaySource(rec, self._on_sample, self._replayed_event, self.settings.refresh)
        return Sampler(self.telemetry, self._on_sample, self.settings.refresh)

    @property
    def live(self) -> bool:
        """Whether the dashboard shows this process (the chat and controls drive a model)."""
        return self.source.kind == "live"

    def get_default_screen(self) -> Screen:
        return MainScreen(id="main")

    @property
    def palette(self) -> Palette:
        entry = self._themes.get(self.theme)
        return entry[1] if entry else Palette()

    @property
    def dashboard(self) -> Dashboard:
        return self.screen_stack[0].query_one(Dashboard)

    @property
    def chat_pane(self) -> ChatPane:
        return self.screen_stack[0].query_one(ChatPane)

    @property
    def controls(self) -> Controls:
        return self.screen_stack[0].query_one(Controls)

    def record(self, kind: str, **data: Any) -> None:
        """Send one event to the recorder (any thread); no-op without one."""
        if self.recorder is not None:
            self.recorder(kind, data)

    def save(self) -> None:
        if self.persist:
            save_settings(self.settings, self.settings_file)

    def on_main_screen_ready(self, _: MainScreen.Ready) -> None:
        self.dashboard.set_palette(self.palette)
        self.set_interval(1 / STREAM_HZ, self._tick_stream)
        from .numa.topology import load_topology
        self.controls.set_nodes(load_topology().node_ids)
        self.controls.set_values(self.placement_req.weights, self.placement_req.kv, self.placement_req.policy,
                                 self.placement_req.threads)
        self.query_one(LoadPanel).display = False
        self.dashboard.query_one("#advice-panel").display = self.live
        if self.source.current is not None:  # a frozen snapshot is shown at once
            self.dashboard.snapshot = self.source.current
        self.source.start()
        if isinstance(self.source, ReplaySource):
            rec = self.source.recording
            self.chat_pane.set_status(f"replaying {rec.path}: {len(rec.events)} events")
        if self.live and self.autoload:
            self.load_model(self.model_path)
        self._update_subtitle()
        self.chat_pane.prompt.focus()
        if self.source.kind == "frozen":  # deterministic screenshots: no blinking cursor
            for inp in self.screen_stack[0].query(Input):
                inp.cursor_blink = False

    def on_unmount(self) -> None:
        self._cancel.set()
        self.source.stop()
        self.stop_serving()
        eng, self.engine = self.engine, None
        if eng is not None:
            with eng.lock:
                eng.close()

    def _on_sample(self, snap: Snapshot) -> None:  # sampler thread
        self.record("snapshot", **snap.to_json())
        self.post_message(SnapshotReady(snap))

    @from_worker
    def on_snapshot_ready(self, msg: SnapshotReady) -> None:
        self.dashboard.snapshot = msg.snapshot

    def sample_now(self) -> None:
        """Take a telemetry sample at once (after a load or a switch)."""
        if self.live:
            self.run_worker(self.source.sample_now, thread=True, group="sample", exit_on_error=False)

    def _update_subtitle(self) -> None:
        parts = []
        if self.engine is not None:
            parts.append(os.path.basename(self.engine.path))
        elif self.loading:
            parts.append("loading…")
        if self.simulate:
            parts.append(f"SIMULATED {self.simulate}")
        if self.server is not None:
            parts.append(f"serving {self.server.url}")
        if self.preparing:
            parts.append("compiling the decode call (first start)…")
        status = self.source.status()
        if status:
            parts.append(status)
        self.sub_title = " · ".join(parts)

    # ---- loading --------------------------------------------------------
    def load_model(self, path: str | None) -> bool:
        """Load ``path`` (None: the default model) in a worker; the current model keeps working."""
        if self.loading:
            self.notify("a model is already loading", severity="warning")
            return False
        self.model_note = ""
        if path is None and not self.ray_address:  # no -m: the pulled instruct model, else the base model
            from .models_store import default_model
            chosen = default_model()  # looks in the models folder; never fetches
            path, self.model_note = chosen.path, chosen.note
        self.loading = True
        panel = self.query_one(LoadPanel)
        panel.display = True
        panel.show("starting", 0, 0, 0.0, path or "default model")
        self._update_subtitle()
        placement = dataclasses.replace(self.engine.placement) if self.engine is not None else \
            dataclasses.replace(self.placement_req)
        self.record("load.start", path=path, placement=dataclasses.asdict(placement))
        self._load_worker(path, placement)
        return True

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load_worker(self, path: str | None, placement: Placement) -> None:
        from .engine import Engine
        t0 = time.perf_counter()

        def progress(ev: ProgressEvent) -> None:
            self.record("load.progress", **dataclasses.asdict(ev))
            now = time.perf_counter()
            if now - self._last_progress >= 0.05 or ev.done == ev.total:
                self._last_progress = now
                self.post_message(LoadProgress(ev, "load"))
        try:
            if self.ray_address:
                eng = self._load_pipeline(path, placement)
            else:
                eng = Engine.load(path, placement=placement, progress=progress)
            try:
                chat = Chat(eng, n_ctx=self.settings.n_ctx)
            except BaseException:
                eng.close()
                raise
        except Exception as e:  # noqa: BLE001 - every load failure is shown, the app keeps running
            msg = str(e) or type(e).__name__
            self.record("load.error", path=path, error=msg)
            self.post_message(LoadFailed(path or "default model", msg))
            return
        seconds = time.perf_counter() - t0
        self.record("load.done", path=eng.path, seconds=seconds, weight_bytes=eng.weight_bytes,
                    arch=eng.cfg.arch, placement=dataclasses.asdict(eng.placement))
        self.post_message(Loaded(eng, chat, seconds))

    def _load_pipeline(self, path: str | None, placement: Placement) -> Any:
        """The model split over the Ray cluster's nodes (each host places its own part)."""
        from .cluster.pipeline import RayPipeline
        self.post_message(LoadProgress(ProgressEvent("cluster", message=f"loading over the Ray cluster at "
                                                                          f"{self.ray_address}"), "load"))
        slots = self.serve_slots if self.serve_port is not None else 0
        kw = {"step_timeout": self.ray_timeout} if self.ray_timeout else {}
        pipe = RayPipeline(self.ray_address, path, placement, n_ctx=self.settings.n_ctx + slots * 2048, **kw)
        pipe.load()
        return pipe

    @from_worker
    def on_load_progress(self, msg: LoadProgress) -> None:
        ev = msg.event
        if msg.what == "load":
            self.query_one(LoadPanel).show(ev.stage, ev.done, ev.total, ev.bytes_per_s, ev.message[:80])
        else:
            self.controls.set_status(f"{ev.stage}: {fmt_bytes(ev.done)} / {fmt_bytes(ev.total)}"
                                     + (f" · {fmt_bytes(ev.bytes_per_s)}/s" if ev.bytes_per_s else ""))

    @from_worker
    async def on_loaded(self, msg: Loaded) -> None:
        old = self.engine
        self._cancel.set()
        # the conversation survives a reload: the previous chat's turns, else the saved history
        carry = list(self.chat.messages) if self.chat is not None else (
            self.history.load() if self.history is not None else [])
        self.engine, self.chat = msg.engine, msg.chat
        self.chat.messages = carry
        self.telemetry.engine = msg.engine
        self.query_one(LoadPanel).display = False
        eng = msg.engine
        self.controls.set_weight_modes(moe=bool(eng.cfg.n_expert))
        self.controls.set_values(eng.placement.weights, eng.placement.kv, eng.placement.policy, eng.pool.n_threads)
        await self.chat_pane.clear()
        for m in carry:
            if m.role == "user":
                await self.chat_pane.add_user(m.content)
            elif m.role == "assistant":
                await self.chat_pane.start_reply(m.content, "restored")
        self.chat_pane.set_status(f"{os.path.basename(eng.path)} · {eng.cfg.arch} · {eng.n_params / 1e6:,.0f}M params "
                                  f"· {fmt_bytes(eng.weight_bytes)} · loaded in {msg.seconds:.2f} s")
        can_chat = getattr(eng.chat_format, "can_chat", True)  # False: no chat template, completion mode
        self.chat_pane.set_mode(can_chat, self.model_note or ("" if can_chat else COMPLETION_NOTE))
        self.notify(f"loaded {os.path.basename(eng.path)} in {msg.seconds:.2f} s", title="model")
        if self.model_path and os.path.abspath(self.model_path) == os.path.abspath(eng.path):
            self.settings.last_model = eng.path
            self.save()
        self._update_subtitle()
        restart = self.server is not None or self.serve_port is not None
        if old is not None:
            self.stop_serving()  # the server follows the model: it restarts on the new engine
            self._close_engine(old)
        self.loading = False  # only now is the new model fully shown
        if restart:
            self.start_serving(self.serve_port or 0)
        self.advice = self.advice_current = None
        if self.auto_advice and not self.advising:
            self.request_advice(probe=False)
        self.sample_now()
        self._prepare_decoding(msg.chat)

    @work(thread=True, group="prepare", exit_on_error=False)
    def _prepare_decoding(self, chat: Chat) -> None:
        """Compile the decoded tokens' call while the user types (a first start's long compile,
        `Session.prepare_decoding`); the subtitle says so when it takes more than a moment."""
        session = getattr(chat, "session", None)
        if not hasattr(session, "decoding_compile"):  # a cluster pipeline's session
            return
        t0 = time.perf_counter()
        lock, state = threading.Lock(), {"shown": False, "done": False}

        def show(on: bool) -> None:
            self.post_message(PreparingDecode(on))

        def slow() -> None:
            with lock:
                if not state["done"]:
                    state["shown"] = True
                    show(True)

        timer = threading.Timer(0.5, slow)
        timer.daemon = True
        try:
            compile_ = session.decoding_compile()
            if compile_ is None:
                return
            timer.start()
            compile_()
            self.record("decode.prepared", seconds=time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - decoding compiles on first use instead
            self.record("decode.prepare_error", error=str(e) or type(e).__name__)
        finally:
            timer.cancel()
            with lock:
                state["done"] = True
                if state["shown"]:
                    show(False)

    @from_worker
    def on_preparing_decode(self, msg: PreparingDecode) -> None:
        self.preparing = msg.on
        self._update_subtitle()

    @work(thread=True, group="close", exit_on_error=False)
    def _close_engine(self, eng: Any) -> None:
        with eng.lock:  # waits for a reply on the old model to stop
            eng.close()

    @from_worker
    def on_load_failed(self, msg: LoadFailed) -> None:
        self.loading = False
        self.query_one(LoadPanel).display = False
        self.last_error = msg.error
        still = f"\n\nStill using {os.path.basename(self.engine.path)}." if self.engine is not None else ""
        self.push_screen(ErrorScreen("model failed to load", f"{msg.path}:\n{msg.error}{still}"))
        self._update_subtitle()

    # ---- placement switches -------------------------------------------
    def request_switch(self, weights: str | None = None, kv: str | None = None,
                       threads: int | None = None, policy: str | None = None) -> bool:
        eng = self.engine
        if eng is None:
            self.notify("no model loaded yet", severity="warning")
            return False
        if self.switching:
            self.notify("a switch is already running", severity="warning")
            return False
        if self.ray_address:
            self.notify("each Ray host keeps the placement it loaded with: reload (F5) with other flags "
                        "to change it", severity="warning")
            return False
        p = eng.placement
        kw: dict[str, Any] = {}
        if weights and weights != p.weights:
            kw["weights"] = weights
        if kv and kv != p.kv:
            kw["kv"] = kv
        if threads and threads != eng.pool.n_threads:
            kw["threads"] = threads
        if policy and policy != p.policy:
            kw["policy"] = policy
        if not kw:
            self.notify("that placement is already in force")
            return False
        self.switching = True
        what = ", ".join(f"{k} → {v}" for k, v in kw.items())
        self.controls.set_status(f"switching {what}" + (" (after the current reply)" if self.generating else "") + "…")
        self.record("switch.start", **kw)
        self._switch_worker(eng, kw)
        return True

    @work(thread=True, exclusive=True, group="switch", exit_on_error=False)
    def _switch_worker(self, eng: Any, kw: dict[str, Any]) -> None:
        def progress(ev: ProgressEvent) -> None:
            self.record("switch.progress", **dataclasses.asdict(ev))
            self.post_message(LoadProgress(ev, "switch"))
        t0 = time.perf_counter()
        try:
            reports = eng.switch(progress=progress, **kw)
        except Exception as e:  # noqa: BLE001 - BudgetError, ValueError...: refused, previous mode stays
            self.record("switch.refused", request=kw, error=str(e))
            self.post_message(SwitchRefused(str(e) or type(e).__name__))
            return
        seconds = time.perf_counter() - t0
        self.record("switch.done", request=kw, seconds=seconds,
                    reports=[dataclasses.asdict(r) for r in reports], placement=dataclasses.asdict(eng.placement))
        self.post_message(Switched(reports, seconds))

    @from_worker
    def on_switched(self, msg: Switched) -> None:
        self.switching = False
        self.last_switch = msg.reports
        eng = self.engine
        parts = [f"{r.what} in {1000 * r.seconds:,.1f} ms" + (f" ({r.method})" if r.method else "")
                 for r in msg.reports]
        text = Text("✓ " + "; ".join(parts or ["nothing to move"]) + f" · total {1000 * msg.seconds:,.1f} ms",
                    style="green")
        self.controls.set_status(text)
        if eng is not None:
            self.controls.set_values(eng.placement.weights, eng.placement.kv, eng.placement.policy, eng.pool.n_threads)
        self.notify("; ".join(parts) or "placement unchanged", title="switched")
        self._advice_follows_placement()
        self.sample_now()

    @from_worker
    def on_switch_refused(self, msg: SwitchRefused) -> None:
        self.switching = False
        self.last_error = msg.error
        eng = self.engine
        kept = placement_text(eng) if eng is not None else ""
        self.controls.set_status(Text(f"✗ refused: {msg.error}\nkept: {kept}", style="bold red"))
        if eng is not None:
            self.controls.set_values(eng.placement.weights, eng.placement.kv, eng.placement.policy, eng.pool.n_threads)
        self.notify(f"{msg.error}\n\nkept {kept}", title="switch refused", severity="warning", timeout=10)

    @on(Controls.Apply)
    def _apply_controls(self, msg: Controls.Apply) -> None:
        self.request_switch(msg.weights, msg.kv, msg.threads, msg.policy)

    # ---- chat -----------------------------------------------------------
    def sampling_params(self) -> SamplingParams:
        return self.settings.sampling.params()

    @on(ChatPane.Submitted)
    async def _submitted(self, msg: ChatPane.Submitted) -> None:
        await self.send_message(msg.text)

    async def send_message(self, text: str) -> bool:
        if self.engine is None or self.chat is None:
            self.notify("no model loaded yet" + (" (loading…)" if self.loading else ""), severity="warning")
            return False
        if self.generating:
            self.notify("a reply is still streaming (Esc stops it)", severity="warning")
            return False
        pane = self.chat_pane
        pane.prompt.value = ""
        await pane.add_user(text)
        self._reply = await pane.start_reply(streaming=True)
        self._cancel = threading.Event()
        self.generating = True
        pane.set_status("generating… (Esc stops)")
        self.telemetry.rates.start()
        self._telemetry_while_streaming(True)
        self.record("chat.user", text=text)
        self._generate(self.chat, text, self.sampling_params(), self.settings.sampling.n_predict, self._cancel)
        return True

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, chat: Chat, text: str, params: SamplingParams, n_predict: int,
                  cancel: threading.Event) -> None:
        eng = chat.engine
        self.telemetry.note_caller()  # this thread runs worker 0's share of every pass
        try:
            for ev in chat.send(text, params, n_predict, cancel):
                if isinstance(ev, TokenEvent):
                    with self._stream_lock:
                        self._pending.append(ev.text)
                    self.telemetry.rates.token(ev.t)
                    self.record("token", token=ev.token, text=ev.text, t=ev.t)
                elif isinstance(ev, DoneEvent):
                    self.telemetry.rates.done(ev.stats)
                    where = placement_text(eng)
                    # the mean cache position its tokens were decoded at (the session holds the
                    # conversation up to the last token fed; a Ray pipeline's session too)
                    depth = max(0, len(chat.session.tokens) - (ev.stats.decode_tokens + 1) // 2)
                    self.record("reply.done", text=ev.text, n_tokens=len(ev.tokens), placement=where,
                                depth=depth, **ev.stats.as_dict())
                    self.post_message(ReplyDone(ev.stats, where, depth))
        except Exception as e:  # noqa: BLE001 - shown in the chat; the model stays usable
            self.telemetry.rates.failed()
            msg = f"{type(e).__name__}: {e}"
            self.record("reply.error", error=msg)
            self.post_message(ReplyFailed(msg))

    def _no_spare_cpu(self) -> bool:
        """Whether the engine's threads take every CPU this process may use (the UI's work is then
        taken from a decoding thread)."""
        eng = self.engine
        return eng is not None and eng.pool.n_threads >= len(os.sched_getaffinity(0))

    async def _tick_stream(self) -> None:
        """The streaming timer: flush at STREAM_HZ, or STREAM_HZ_BUSY when no CPU is spare."""
        if self._no_spare_cpu() and time.monotonic() - self._flushed < 1 / STREAM_HZ_BUSY:
            return
        await self._flush_stream()

    def _telemetry_while_streaming(self, streaming: bool) -> None:
        """Sample at most every BUSY_REFRESH s while a reply streams on a machine with no spare CPU;
        at the reply's end the settings' interval again, with a sample at once (its final rates)."""
        if not self.live:
            return
        if streaming:
            if self._no_spare_cpu():  # no wake-up: the sample in progress keeps its time
                self.source.interval = max(self.source.interval, BUSY_REFRESH)
        elif self.source.interval != Sampler.clamp(self.settings.refresh):
            self.source.set_interval(self.settings.refresh)

    async def _flush_stream(self) -> None:
        self._flushed = time.monotonic()
        with self._stream_lock:
            text, self._pending = "".join(self._pending), []
        if text and self._reply is not None:
            await self._reply.append(text)

    def _save_turn(self) -> None:
        if self.history is not None and self.chat is not None and len(self.chat.messages) >= 2:
            self.history.append(*self.chat.messages[-2:])

    @from_worker
    async def on_reply_done(self, msg: ReplyDone) -> None:
        self._save_turn()
        await self._flush_stream()
        if self._reply is not None:
            await self._reply.finish()
            self._reply.set_stats(stats_line(msg.stats, msg.placement))
        self.generating = False
        self._telemetry_while_streaming(False)
        self.chat_pane.set_status("stopped; partial reply kept" if msg.stats.stop_reason == "cancelled" else "")
        self._advice_follows_depth(msg.depth)

    @from_worker
    async def on_reply_failed(self, msg: ReplyFailed) -> None:
        self._save_turn()
        await self._flush_stream()
        if self._reply is not None:
            await self._reply.finish()
            self._reply.set_stats(f"✗ {msg.error} (partial reply kept)", error=True)
        self.generating = False
        self._telemetry_while_streaming(False)
        self.last_error = msg.error
        self.chat_pane.set_status("the reply failed; the model is still loaded")
        self.notify(msg.error, title="generation failed", severity="error", timeout=10)

    # ---- actions ----------------------------------------------------------
    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        self.push_screen(HelpScreen(self.binding_rows()))

    def binding_rows(self) -> list[tuple[str, str, str]]:
        rows = []
        for b in self.BINDINGS:
            assert isinstance(b, Binding)
            rows.append((b.key_display or b.key.replace(",", " / "), b.description, b.id or ""))
        rows.append(("ctrl+p", "Command palette", "command-palette"))
        return rows

    def action_toggle_view(self) -> None:
        main = self.screen_stack[0]
        assert isinstance(main, MainScreen)
        shown = main.cycle_view()
        if shown == "dashboard":
            self.dashboard.focus()
        else:
            self.chat_pane.prompt.focus()

    def action_placement(self) -> None:
        main = self.screen_stack[0]
        assert isinstance(main, MainScreen)
        if main.shown == "chat":
            main.cycle_view() if main.narrow else setattr(main, "view", "both")
        self.controls.query_one("#weights").focus()

    def action_open_model(self) -> None:
        start = self.engine.path if self.engine is not None else os.getcwd()

        def done(path: str | None) -> None:
            if path:
                self.model_path = path
                self.load_model(path)
        self.push_screen(OpenModelScreen(start), done)

    def action_reload(self) -> None:
        self.load_model(self.engine.path if self.engine is not None else self.model_path)

    def action_sampling(self) -> None:
        def done(s: SamplingSettings | None) -> None:
            if s is not None:
                self.settings.sampling = s
                self.save()
                self.notify(f"sampling: temp {s.temperature}, top-k {s.top_k}, top-p {s.top_p}, "
                            f"min-p {s.min_p}, max {s.n_predict} tokens")
        self.push_screen(SamplingScreen(dataclasses.replace(self.settings.sampling)), done)

    def action_next_theme(self) -> None:
        names = list(self._themes)
        if not names:
            return
        i = names.index(self.theme) if self.theme in names else -1
        self.set_theme(names[(i + 1) % len(names)])

    def set_theme(self, name: str) -> None:
        self.theme = name
        self.settings.theme = name
        self.save()
        self.dashboard.set_palette(self.palette)
        self.notify(f"theme {name}")

    def action_pause(self) -> None:
        src = self.source
        src.pause(not src.paused)
        if src.kind != "frozen":
            self.notify("telemetry paused" if src.paused else "telemetry resumed")
        self._update_subtitle()

    def action_advise(self) -> None:
        self.request_advice(probe=True)

    def action_what_if(self) -> None:
        start = self.engine.path if self.engine is not None else os.getcwd()

        def done(path: str | None) -> None:
            if path:
                self.request_advice(what_if=path)
        self.push_screen(OpenModelScreen(start, what_if=True), done)

    def _set_refresh(self, interval: float) -> None:
        self.settings.refresh = Sampler.clamp(interval)
        self.source.set_interval(self.settings.refresh)
        self.save()
        self._update_subtitle()

    def action_faster(self) -> None:
        self._set_refresh(self.settings.refresh / 2)

    def action_slower(self) -> None:
        self._set_refresh(self.settings.refresh * 2)

    def action_stop(self) -> None:
        if self.generating:
            self._cancel.set()
            self.chat_pane.set_status("stopping…")

    async def action_regenerate(self) -> None:
        chat = self.chat
        if chat is None or self.generating:
            self.notify("nothing to regenerate" if chat is None else "a reply is still streaming",
                        severity="warning")
            return
        msgs = chat.messages
        if msgs and msgs[-1].role == "assistant":
            msgs.pop()
        if not msgs or msgs[-1].role != "user":
            self.notify("nothing to regenerate", severity="warning")
            return
        text = msgs.pop().content
        if self.history is not None:
            self.history.drop_last_turn()
        await self.chat_pane.drop_last_exchange()
        await self.send_message(text)

    async def action_clear_chat(self) -> None:
        if self.generating:
            self.notify("stop the reply first (Esc)", severity="warning")
            return
        if self.chat is not None:
            self.chat.clear()
        if self.history is not None:
            self.history.start_new()
        await self.chat_pane.clear()
        self.chat_pane.set_status("chat cleared")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key, desc, bid in self.binding_rows():
            b = next((b for b in self.BINDINGS if isinstance(b, Binding) and b.id == bid), None)
            if b is None or b.action in ("quit",):
                continue
            yield SystemCommand(f"{desc} ({key})", f"action {bid}",
                                (lambda a=b.action: self.run_action(a)))
        moe = self.engine is not None and bool(self.engine.cfg.n_expert)
        for m in WEIGHT_MODES + (EXPERT_MODES if moe else ()):
            yield SystemCommand(f"Weights: {m}", f"switch the weights to '{m}' live",
                                (lambda m=m: self.request_switch(weights=m)))
        from .numa.topology import load_topology
        for m in kv_choices(load_topology().node_ids):
            yield SystemCommand(f"KV cache: {m}", f"switch the KV cache to '{m}' live",
                                (lambda m=m: self.request_switch(kv=m)))
        for name in self._themes:
            yield SystemCommand(f"Theme: {name}", "use this theme (saved)", (lambda n=name: self.set_theme(n)))

    # ---- replay ---------------------------------------------------------
    def _replayed_event(self, kind: str, data: dict) -> None:  # replay thread
        self.post_message(ReplayEvent(kind, data))

    @from_worker
    async def on_replay_event(self, msg: ReplayEvent) -> None:
        kind, data = msg.kind, msg.data
        if kind == "chat.user":
            await self.chat_pane.add_user(data.get("text", ""))
        elif kind == "reply.done":
            await self.chat_pane.start_reply(data.get("text", ""), f"{data.get('decode_tokens', 0)} tokens · "
                                             f"decode {data.get('decode_tps', 0):,.1f} t/s · {data.get('placement', '')}")
        elif kind == FINISHED:
            self.chat_pane.set_status("replay finished")
        else:
            self.controls.set_status(f"{kind}: {data.get('reports') or data.get('error') or data.get('path', '')}")

    # ---- advice (workbench.advisor) ---------------------------------------
    def request_advice(self, probe: bool = True, what_if: str | None = None) -> bool:
        """Predict every placement of the loaded model (or, ``what_if``, of another file: its
        header only) on this machine or the simulated one, in a worker. On this machine the
        memory profile comes from the probe cache; with ``probe`` a missing one is measured
        (seconds, with progress) and so are missing engine constants."""
        if self.engine is None and what_if is None:
            self.notify("no model loaded yet", severity="warning")
            return False
        if self.advising:
            self.notify("advice is already being worked out", severity="warning")
            return False
        if self.ray_address and what_if is None:
            self.notify("the advisor predicts one machine: run numawb advise on each host", severity="warning")
            return False
        topology: Any = self.simulate
        if not topology and not probe:
            from .advisor.probe import cached_profile
            from .numa.topology import load_topology
            if cached_profile(load_topology()) is None:
                self._show_advice(dataclasses.replace(
                    self.advice_view, status="this machine has no memory probe yet: F9 probes it (a few seconds)"))
                return False
        self.advising = True
        self._show_advice(dataclasses.replace(self.advice_view, status="predicting…"))
        eng = self.engine
        current = None
        if eng is not None:
            p = eng.placement
            current = (p.weights, p.kv, eng.pool.n_threads, p.policy)
        self.record("advice.start", path=what_if or (eng.path if eng is not None else None), probe=probe)
        self._advice_worker(what_if or eng.path, current, topology, self.settings.n_ctx, probe, what_if is not None)
        return True

    @work(thread=True, exclusive=True, group="advice", exit_on_error=False)
    def _advice_worker(self, path: str, current: tuple[str, str, int, str] | None, topology: Any, ctx: int,
                       probe: bool, what_if: bool) -> None:
        from .advisor.advise import advise

        def progress(text: str) -> None:
            self.post_message(AdviceProgress(text))
        measure = probe and not topology
        # the engine's constants are measured (once per model and engine revision: 30 s for Gemma
        # 3 270M, 47 s for the R1 shape, both thread counts, on the Zen 4 host)
        # with the engine's lock held: a reply then waits for them instead of running beside the
        # twins' own workers, which slowed both (a first reply at 159.5 t/s where the next ones
        # made 205-243, and the constants it left predicted 2 threads about 20 % low)
        eng = self.engine
        held = eng.lock if (measure and eng is not None) else contextlib.nullcontext()
        try:
            with held:
                adv = advise(path, topology, ctx, measure=measure, progress=progress)
        except Exception as e:  # noqa: BLE001 - a bad file or machine is one line in the panel
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.record("advice.error", path=path, error=msg)
            self.post_message(AdviceReady(None, os.path.basename(path) if what_if else "", msg))
            return
        best = adv.best
        if what_if:
            line = (f"{os.path.basename(path)} ({adv.cost.arch}, {fmt_bytes(adv.cost.weight_bytes)}): " +
                    (f"best {mode_label(best.weights, best.kv, best.threads, best.policy)} · "
                     f"{best.predicted_decode_tps:,.1f} t/s · {'fits' if best.fits else 'does NOT fit'}"
                     if best is not None else adv.reason))
            self.record("advice.done", path=path, what_if=True, recommended=best.to_json() if best else None,
                        reason=adv.reason)
            self.post_message(AdviceReady(None, line))
            return
        cur = None
        if current is not None:
            cur = current_candidate(adv, *current)
            if cur is None:  # the mode in force is not among the default candidates: predict it alone
                w, kv, threads, _ = current
                try:
                    cur = current_candidate(advise(path, topology, ctx, threads=[threads], weights=[w], kvs=[kv],
                                                   profile=adv.profile, measure=False), *current)
                except Exception:  # noqa: BLE001 - shown as "not among the candidates"
                    cur = None
        p = adv.profile
        machine = (f"SIMULATED {os.path.basename(adv.topology.root)}" if adv.simulated else
                   f"this machine (memory {p.source}{' ' + p.date if p.date else ''})")
        view = AdviceView(
            machine=machine,
            current=mode_label(*current) if current is not None and cur is not None else "",
            current_tps=cur.predicted_decode_tps if cur is not None else None,
            current_fits=cur.fits if cur is not None else True,
            best=mode_label(best.weights, best.kv, best.threads, best.policy) if best is not None else "",
            best_tps=best.predicted_decode_tps if best is not None else None, reason=adv.reason,
            whatif=self.advice_view.whatif, status="; ".join(adv.notes[:1]),
            warnings=tuple((w.level, w.message, w.fix) for w in adv.warnings))
        self.record("advice.done", path=path, what_if=False, current=cur.to_json() if cur else None,
                    recommended=best.to_json() if best else None, reason=adv.reason)
        self.advice, self.advice_current = adv, cur
        self.post_message(AdviceReady(view))

    def _advice_follows_placement(self) -> None:
        """After a switch: the advice panel's "this mode" line is the new mode's prediction (from
        the advice at hand, else predicted again, which needs no probe)."""
        eng, adv = self.engine, self.advice
        if eng is None or adv is None:
            return
        p = eng.placement
        current = (p.weights, p.kv, eng.pool.n_threads, p.policy)
        cur = current_candidate(adv, *current)
        if cur is None:
            self.request_advice(probe=False)
            return
        self.advice_current = cur
        self._show_advice(dataclasses.replace(self.advice_view, current=mode_label(*current),
                                              current_tps=cur.predicted_decode_tps, current_fits=cur.fits,
                                              current_depth=0))

    def _advice_follows_depth(self, depth: int) -> None:
        """After a reply: the mode in force predicted at the depth that reply decoded at, so the
        panel sets the measured rate against a prediction for the same cache (a chat's later
        turns decode past the earlier ones: the README session's second reply, at depth 176, is
        predicted 281.4 t/s against 290.6 at depth 0). Only the cost model runs (no measurement)."""
        eng, adv = self.engine, self.advice
        if eng is None or adv is None or self.advice_current is None:
            return
        if depth == self.advice_view.current_depth or depth >= adv.n_ctx:
            return
        p = eng.placement
        self._advice_at_depth(adv, (p.weights, p.kv, eng.pool.n_threads, p.policy), depth)

    @work(thread=True, exclusive=True, group="advice-depth", exit_on_error=False)
    def _advice_at_depth(self, adv: Any, current: tuple[str, str, int, str], depth: int) -> None:
        w, kv, threads, _ = current
        try:
            cur = current_candidate(adv.at_depth(depth, threads=[threads], weights=[w], kvs=[kv]), *current)
        except Exception:  # noqa: BLE001 - the depth-0 prediction stays shown
            return
        if cur is not None:
            self.record("advice.depth", depth=depth, predicted_decode_tps=cur.predicted_decode_tps)
            self.post_message(AdviceAtDepth(current, cur.predicted_decode_tps, depth))

    @from_worker
    def on_advice_at_depth(self, msg: AdviceAtDepth) -> None:
        eng = self.engine
        if eng is None or self.advice_current is None:
            return
        p = eng.placement
        if msg.current != (p.weights, p.kv, eng.pool.n_threads, p.policy):  # switched since
            return
        self._show_advice(dataclasses.replace(self.advice_view, current_tps=msg.tps, current_depth=msg.depth))

    @from_worker
    def on_advice_progress(self, msg: AdviceProgress) -> None:
        self._show_advice(dataclasses.replace(self.advice_view, status=msg.text))

    @from_worker
    def on_advice_ready(self, msg: AdviceReady) -> None:
        self.advising = False
        if msg.error:
            what = f"what-if {msg.what_if}: " if msg.what_if else ""
            self._show_advice(dataclasses.replace(self.advice_view, status=f"✗ {what}{msg.error}"))
            self.last_error = msg.error
            return
        if msg.view is None:
            self._show_advice(dataclasses.replace(self.advice_view, whatif=msg.what_if, status=""))
        else:
            self._show_advice(msg.view)

    def _show_advice(self, view: AdviceView) -> None:
        self.advice_view = view
        if self.screen_stack:
            self.dashboard.query_one("#advice-panel").display = True
            self.dashboard.show_advice(view)

    # ---- serving (numawb --serve) ---------------------------------------
    def start_serving(self, port: int = 0) -> bool:
        """Serve the loaded model on 127.0.0.1:``port`` (0: any free port) from this process."""
        if self.engine is None:
            self.notify("no model loaded yet", severity="warning")
            return False
        if self.server is not None:
            return True
        from .server.http import AppServer
        try:
            srv = AppServer(self.engine, port, n_parallel=self.serve_slots, n_ctx=self.settings.n_ctx)
            srv.start()
        except (OSError, MemoryError, ValueError) as e:
            self.last_error = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.record("serve.error", port=port, error=self.last_error)
            self.notify(self.last_error, title="cannot serve", severity="error", timeout=10)
            return False
        self.server = srv
        self.serve_port = port
        self.telemetry.server = srv
        self.record("serve.start", url=srv.url, slots=srv.scheduler.n_parallel, n_ctx=srv.scheduler.n_ctx)
        self.notify(f"{srv.url}/v1/chat/completions", title="serving")
        self._update_subtitle()
        self.sample_now()
        return True

    def stop_serving(self) -> None:
        srv, self.server = self.server, None
        if srv is None:
            return
        self.telemetry.server = None
        srv.stop()
        self.record("serve.stop", url=srv.url)

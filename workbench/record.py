"""Headless recording: ``numawb --record DIR [--script FILE]``.

Runs the app without a terminal (Textual's headless driver), plays a script, and writes

- ``DIR/events.jsonl``: one JSON object per line, ``{"t": unix time, "dt": seconds since start,
  "kind": ..., "data": {...}}`` for every engine event (``load.start|progress|done|error``,
  ``chat.user``, ``token``, ``reply.done|error``, ``switch.start|progress|done|refused``), every
  telemetry ``snapshot`` (a ``workbench.telemetry.Snapshot`` as JSON), and the script's own
  ``step`` / ``screenshot`` / ``step.failed`` markers;
- ``DIR/NN-<op>.svg``: a screenshot of the app after each step, its window title naming the host it
  was taken on (``host_description``: host name, CPU, CPUs, NUMA nodes, virtual machine or not) and
  the date, so a picture's rates can be read for what they are.

``numawb --replay DIR/events.jsonl`` plays the snapshots back in the dashboard.

Script format: one step per line (``#`` starts a comment), or a JSON list of
``{"op": ..., "arg": ...}`` objects with the same ops:

    load [PATH]                   load PATH (default: -m, else the default model)
    set KEY=VALUE ...             sampling: temperature top_k top_p min_p repeat_penalty seed n_predict
    chat TEXT                     send TEXT and wait for the reply
    switch KEY=VALUE ...          weights=MODE kv=MODE threads=N policy=distribute|isolate
    view both|chat|dashboard      which pane(s) to show
    press KEY ...                 key presses, e.g. "press f1" (help) or "press escape"
    wait SECONDS                  let telemetry run
    clear                         clear the chat
    serve [PORT]                  serve the loaded model from the app (127.0.0.1; default: any free port)
    requests N [TEXT]             send N completions to the app's server at once (starting it if needed)
                                  and wait until each is decoding or done; they go on in the background
                                  (``request.done`` / ``request.error`` events), so the next screenshot
                                  shows a serving dashboard. Tokens: the sampling's n_predict.

After the script, the chat replies are checked for repetition loops (a broken sampler or chat
template makes a model repeat itself): ``chat_quality`` takes each reply's distinct 4-gram ratio
over its token ids; the run prints it on one line (``numawb: chat replies: ...``, with a warning
below ``LOOP_RATIO``) and records it as a ``chat.quality`` event.

Telemetry ``snapshot`` events carry, for a mixture-of-experts model, the ``routing`` window
(expert hits per layer, expert bytes read per node per token: ``workbench.telemetry.RoutingInfo``)
and, while serving, the server's ``requests``. Advice adds ``advice.start|done|error`` events.

Exit status: 0 when every step succeeded, 1 otherwise (the recording is written either way).
"""
from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO

from .errors import UserError

DEFAULT_SCRIPT = """\
# numawb --record default session
set n_predict=48 temperature=0.7 seed=42
load
chat Hello! In one sentence, what is a NUMA node?
chat Why does it matter where a model's weights live in memory?
switch weights=interleave
switch kv=interleave
chat Say that again in five words.
"""

#: n of the n-grams ``chat_quality`` counts
NGRAM = 4
#: a reply whose distinct 4-gram ratio is below this is a repetition loop: the looping replies of the
#: README's old picture (issue 45) score 0.46-0.64 on Gemma's tokens, a sentence repeated over 48
#: tokens 0.2-0.3, SmolLM2's greedy replies in tests/data/smollm2_golden.json 0.93-1.0
LOOP_RATIO = 0.7

OPS = ("load", "set", "chat", "switch", "view", "press", "wait", "clear", "serve", "requests")


@dataclass(frozen=True)
class Step:
    op: str
    arg: str = ""

    def pairs(self) -> dict[str, str]:
        out = {}
        for part in self.arg.split():
            if "=" not in part:
                raise ValueError(f"{self.op}: expected KEY=VALUE, got {part!r}")
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
        return out


def parse_script(text: str) -> list[Step]:
    """Lines or a JSON list; raises ValueError naming the bad line."""
    stripped = text.strip()
    if stripped.startswith("["):
        items = json.loads(stripped)
        steps = [Step(str(i["op"]), str(i.get("arg", ""))) for i in items]
    else:
        steps = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            op, _, arg = line.partition(" ")
            steps.append(Step(op.lower(), arg.strip()))
    for s in steps:
        if s.op not in OPS:
            raise ValueError(f"unknown script step {s.op!r} (one of {', '.join(OPS)})")
        if s.op in ("set", "switch"):
            s.pairs()
        if s.op == "serve" and s.arg and not s.arg.isdigit():
            raise ValueError(f"serve: expected a port number, got {s.arg!r}")
        if s.op == "requests":
            n = s.arg.split(maxsplit=1)[0] if s.arg else ""
            if not n.isdigit() or int(n) < 1:
                raise ValueError(f"requests: expected a count >= 1 first, got {s.arg!r}")
    return steps


def distinct_ngram_ratio(items: Sequence[Any], n: int = NGRAM) -> float:
    """Distinct n-grams over all n-grams of ``items`` (token ids, words): 1.0 when no n-gram
    repeats, about period/length for a loop; 1.0 for a sequence too short to hold an n-gram."""
    grams = [tuple(items[i:i + n]) for i in range(len(items) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def reply_tokens(events: Iterable[dict[str, Any]]) -> list[list[int]]:
    """The token ids of each chat reply in a recording's events: the ``token`` events after a
    ``chat.user``, up to its ``reply.done`` or ``reply.error``."""
    replies: list[list[int]] = []
    cur: list[int] | None = None
    for e in events:
        kind = e.get("kind")
        if kind == "chat.user":
            cur = []
        elif kind == "token" and cur is not None:
            cur.append(int(e["data"]["token"]))
        elif kind in ("reply.done", "reply.error") and cur is not None:
            replies.append(cur)
            cur = None
    return replies


@dataclass(frozen=True)
class ChatQuality:
    """Each recorded reply's distinct n-gram ratio, and which are loops."""

    ratios: tuple[float, ...]
    lengths: tuple[int, ...]
    n: int = NGRAM
    threshold: float = LOOP_RATIO

    @property
    def loops(self) -> list[int]:
        """Indices of the replies below the threshold."""
        return [i for i, r in enumerate(self.ratios) if r < self.threshold]

    @property
    def min_ratio(self) -> float | None:
        return min(self.ratios) if self.ratios else None

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "threshold": self.threshold, "ratios": [round(r, 3) for r in self.ratios],
                "tokens": list(self.lengths), "loops": self.loops}

    def line(self) -> str:
        if not self.ratios:
            return "chat replies: none recorded"
        each = ", ".join(f"{r:.2f}" for r in self.ratios)
        text = (f"chat replies: distinct {self.n}-gram ratio {each} "
                f"({len(self.ratios)} repl{'y' if len(self.ratios) == 1 else 'ies'}, loop below {self.threshold})")
        if self.loops:
            which = ", ".join(str(i + 1) for i in self.loops)
            text += (f"; replies {which} look like repetition loops" if len(self.loops) > 1
                     else f"; reply {which} looks like a repetition loop")
        return text


def chat_quality(events: Iterable[dict[str, Any]], n: int = NGRAM, threshold: float = LOOP_RATIO) -> ChatQuality:
    """The distinct ``n``-gram ratio of every chat reply of a recording (its events, as
    ``events.jsonl`` holds them): a broken sampler or template shows as a ratio below ``threshold``."""
    replies = reply_tokens(events)
    return ChatQuality(tuple(distinct_ngram_ratio(r, n) for r in replies), tuple(len(r) for r in replies),
                       n, threshold)


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of an ``events.jsonl`` (lines that are not JSON objects are skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict):
            out.append(e)
    return out


def host_description() -> str:
    """One line naming this machine for a screenshot: host name, CPU model, CPUs usable, NUMA nodes
    and, when /proc/cpuinfo lists the ``hypervisor`` flag, that it is a virtual machine -- an
    emulated one, whose rates mean nothing, when the CPU is QEMU's software emulation (TCG)."""
    cpu, vm = "", False
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not cpu and line.startswith("model name"):
                    cpu = " ".join(line.partition(":")[2].split())
                elif line.startswith("flags") and " hypervisor" in line:
                    vm = True
                if cpu and line.startswith("flags"):
                    break
    except OSError:
        pass
    try:
        nodes = sum(1 for n in os.listdir("/sys/devices/system/node") if n.startswith("node") and n[4:].isdigit())
    except OSError:
        nodes = 0
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    parts = [platform.node() or "unknown host", cpu or platform.machine(), f"{cpus} CPU{'s' * (cpus != 1)}"]
    if nodes:
        parts.append(f"{nodes} NUMA node{'s' * (nodes != 1)}")
    if "QEMU TCG" in cpu:
        parts.append("emulated machine (QEMU TCG): rates mean nothing")
    elif vm:
        parts.append("virtual machine")
    return " · ".join(parts)


class ScriptedClients:
    """HTTP clients of the app's own server (the ``requests`` step): each a thread posting one
    ``/v1/completions`` and recording how it ended."""

    def __init__(self, rec: "Recorder") -> None:
        self.rec = rec
        self.threads: list[threading.Thread] = []
        self.sent = 0
        self.finished = 0
        self._lock = threading.Lock()

    def send(self, url: str, n: int, prompt: str, body: dict[str, Any]) -> None:
        for _ in range(n):
            self.sent += 1
            t = threading.Thread(target=self._one, args=(url, {**body, "prompt": prompt}), daemon=True,
                                 name=f"numawb-client-{self.sent}")
            t.start()
            self.threads.append(t)

    def _one(self, url: str, body: dict[str, Any]) -> None:
        import urllib.error
        import urllib.request
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                out = json.loads(r.read())
            self.rec("request.done", {"id": out.get("id"), "usage": out.get("usage"),
                                      "finish_reason": (out.get("choices") or [{}])[0].get("finish_reason")})
        except (OSError, ValueError) as e:
            detail = e.read().decode(errors="replace")[:200] if isinstance(e, urllib.error.HTTPError) else str(e)
            self.rec("request.error", {"error": detail})
        finally:
            with self._lock:
                self.finished += 1

    def join(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        return all(not t.is_alive() for t in self.threads)


class Recorder:
    """Thread-safe JSON-lines writer; call it as ``recorder(kind, data)``."""

    def __init__(self, path: Path):
        self.path = path
        self._f: TextIO = open(path, "w", encoding="utf-8")
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self.count = 0

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        line = json.dumps({"t": time.time(), "dt": round(time.monotonic() - self._t0, 6), "kind": kind,
                           "data": data}, ensure_ascii=False, default=str)
        with self._lock:
            if not self._f.closed:
                self._f.write(line + "\n")
                self._f.flush()
                self.count += 1

    def close(self) -> None:
        with self._lock:
            self._f.close()


async def _wait(pilot: Any, busy: Any, timeout: float, poll: float = 0.1) -> bool:
    """Poll ``busy()`` until it is false (True) or ``timeout`` passes (False). A plain sleep, not
    ``pilot.pause``: a pause first waits for every widget on the screen to take a callback, then
    updates the screen; 10 times a second that is UI work the interactive app does not do, taking
    CPU from the decode being recorded. The step's screenshot pauses after it."""
    end = time.monotonic() + timeout
    while busy():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(poll)
    return True


async def run_step(app: Any, pilot: Any, step: Step, model: str | None, timeout: float) -> str | None:
    """Do one step; returns an error text or None."""
    from .screens.main import MainScreen
    from .settings import SamplingSettings
    if step.op == "load":
        app.last_error = ""
        app.load_model(step.arg or model)
        await pilot.pause(0.1)
        if not await _wait(pilot, lambda: app.loading, timeout):
            return "load timed out"
        return app.last_error or None
    if step.op == "set":
        s = app.settings.sampling
        for k, v in step.pairs().items():
            if k not in SamplingSettings.__dataclass_fields__:
                return f"set: unknown key {k!r}"
            cur = getattr(SamplingSettings(), k)
            setattr(s, k, None if v.lower() == "none" else (type(cur)(v) if cur is not None else int(v)))
        return None
    if step.op == "chat":
        app.last_error = ""
        if not await app.send_message(step.arg):
            return "chat: could not send (no model?)"
        await pilot.pause(0.1)
        if not await _wait(pilot, lambda: app.generating, timeout):
            app.action_stop()
            return "chat timed out (stopped)"
        return app.last_error or None
    if step.op == "switch":
        kw: dict[str, Any] = step.pairs()
        if "threads" in kw:
            kw["threads"] = int(kw["threads"])
        app.last_error = ""
        if not app.request_switch(**kw):
            return None  # already in force (noted in the app)
        await pilot.pause(0.1)
        if not await _wait(pilot, lambda: app.switching, timeout):
            return "switch timed out"
        return app.last_error or None
    if step.op == "view":
        main = app.screen_stack[0]
        assert isinstance(main, MainScreen)
        main.view = step.arg or "both"
        return None
    if step.op == "press":
        await pilot.press(*step.arg.split())
        return None
    if step.op == "wait":
        await pilot.pause(float(step.arg or 1))
        return None
    if step.op == "clear":
        await app.action_clear_chat()
        return None
    if step.op == "serve":
        app.last_error = ""
        return None if app.start_serving(int(step.arg or 0)) else (app.last_error or "serve: no model loaded")
    if step.op == "requests":
        if app.server is None and not app.start_serving(app.serve_port or 0):
            return app.last_error or "requests: no model loaded to serve"
        n_text, _, prompt = step.arg.partition(" ")
        n = int(n_text)
        sp = app.settings.sampling
        body: dict[str, Any] = {"max_tokens": sp.n_predict, "temperature": sp.temperature}
        if sp.seed is not None:
            body["seed"] = sp.seed
        clients = app.scripted_clients
        before = clients.finished
        sched = app.server.scheduler
        clients.send(app.server.url, n, prompt or "Once upon a time", body)

        want = min(n, sched.n_parallel)

        def waiting() -> bool:
            """Until every new request decodes (or has already ended). Once the scheduler shows a
            request decoding, a telemetry sample is taken at once, and the wait ends on what that
            recorded sample shows: the step's snapshot holds the requests in flight, however
            soon they finish (a short reply on a tiny model can end between two timed samples)."""
            decoding = sum(1 for a in sched.active() if a.state == "decode" and a.tokens > 0)
            if decoding and app.live:
                snap = app.source.sample_now()
                decoding = sum(1 for r in snap.requests if r.state == "decode" and r.tokens > 0)
            return decoding + clients.finished - before < want
        if not await _wait(pilot, waiting, timeout, poll=0.02):
            return "requests timed out"
        return None
    return f"unknown step {step.op}"


async def _drive(app: Any, steps: list[Step], out: Path, rec: Recorder, model: str | None,
                 size: tuple[int, int], timeout: float) -> list[str]:
    from .screens.dialogs import ErrorScreen
    failures: list[str] = []
    host = f"recorded {time.strftime('%Y-%m-%d')} on {host_description()}"
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.2)
        for i, step in enumerate(steps, 1):
            rec("step", {"index": i, "op": step.op, "arg": step.arg})
            print(f"[{i}/{len(steps)}] {step.op} {step.arg}", file=sys.stderr, flush=True)
            err = await run_step(app, pilot, step, model, timeout)
            if err:
                failures.append(f"step {i} ({step.op} {step.arg}): {err}")
                rec("step.failed", {"index": i, "error": err})
                print(f"  failed: {err}", file=sys.stderr)
            if app.live:
                app.source.sample_now()
            await pilot.pause(0.5)
            name = f"{i:02d}-{step.op}.svg"
            (out / name).write_text(app.export_screenshot(title=f"{app.title} — {host}"), encoding="utf-8")
            rec("screenshot", {"index": i, "file": name})
            if isinstance(app.screen, ErrorScreen):
                app.pop_screen()
                await pilot.pause(0.1)
        clients = getattr(app, "scripted_clients", None)
        if clients is not None and clients.threads and not clients.join(timeout):
            failures.append("requests: some did not finish")
    return failures


def run_record(out_dir: str, script: str | None = None, model: str | None = None, placement: Any = None,
               simulate: str | None = None, size: tuple[int, int] = (160, 48), timeout: float = 900.0,
               serve: int | None = None) -> int:
    """Play ``script`` (default: ``DEFAULT_SCRIPT``) headless into ``out_dir``; ``serve``: serve
    each loaded model from the app as ``numawb --serve PORT`` does. Returns the exit status."""
    from .app import WorkbenchApp
    from .settings import Settings
    try:
        text = Path(script).read_text(encoding="utf-8") if script else DEFAULT_SCRIPT
        steps = parse_script(text)
    except (OSError, ValueError) as e:
        raise UserError(f"{script}: {e}") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(out / "events.jsonl")
    app = WorkbenchApp(model, placement=placement, simulate=simulate, autoload=False, persist=False,
                       settings=Settings(), recorder=rec, serve=serve)
    app.scripted_clients = ScriptedClients(rec)
    quality = None
    try:
        failures = asyncio.run(_drive(app, steps, out, rec, model, size, timeout))
        quality = chat_quality(read_events(rec.path))
        rec("chat.quality", quality.as_dict())
    finally:
        rec.close()
    shots = len(list(out.glob("*.svg")))
    print(f"numawb: recorded {rec.count} events to {rec.path} and {shots} screenshots in {out}", file=sys.stderr)
    if quality is not None and quality.ratios:
        print(f"numawb: {quality.line()}", file=sys.stderr)
    for f in failures:
        print(f"numawb: {f}", file=sys.stderr)
    return 1 if failures else 0

"""`numawb serve` with real clients: the official `openai` package and raw HTTP against a server
started on 127.0.0.1 and a free port, on the default model (Gemma 3 270M)."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")

from workbench.engine import Chat, Engine, SamplingParams, TokenEvent, default_model_path  # noqa: E402
from workbench.engine.scheduler import Scheduler  # noqa: E402
from workbench.engine.engine import Placement  # noqa: E402
from workbench.engine.chat import ChatFormatter  # noqa: E402
from workbench.server.app import ServerState  # noqa: E402
from workbench.server.http import HttpServer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLOT_CTX = 1024


# Gemma's turns, as Gemma 3 270M *instruct*'s template writes them: the default model is the base
# one, whose file has no chat template, so the chat endpoint is exercised with these (a model
# without any template is refused: test_chat_without_a_chat_template_is_a_clear_400)
GEMMA_TURNS = (
    "{{ bos_token }}{% for m in messages %}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
    "{{ m.content | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@pytest.fixture(scope="module")
def eng():
    e = Engine.load(default_model_path(), placement=Placement(threads=2))
    assert not e.chat_format.can_chat  # the base model's file: no chat template
    e.chat_format = ChatFormatter(GEMMA_TURNS, e.cfg.arch, set(), e.chat_format.bos, e.chat_format.eos)
    yield e
    e.close()


def _serve(eng, n_parallel=4, n_ctx=SLOT_CTX, max_queue=64, api_key=None) -> HttpServer:
    sch = Scheduler(eng, n_parallel, n_ctx, max_queue)
    return HttpServer(ServerState(eng, sch, api_key=api_key)).start()


@pytest.fixture(scope="module")
def srv(eng):
    s = _serve(eng)
    yield s
    s.stop()
    s.state.scheduler.close(timeout=0)


def _client(srv, key="none") -> "openai.OpenAI":
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=300)


def _until(cond, limit: float = 120.0) -> None:
    """Wait for a condition; the limit only guards against a hang."""
    ev = threading.Event()
    for _ in range(int(limit / 0.01)):
        if cond():
            return
        ev.wait(0.01)
    raise AssertionError("condition not reached")


def _post(srv, path: str, body, headers: dict | None = None, raw: bytes | None = None) -> tuple[int, dict, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    return _open(req)


def _get(srv, path: str, headers: dict | None = None) -> tuple[int, dict | str, dict]:
    return _open(urllib.request.Request(srv.url + path, headers=headers or {}))


def _open(req) -> tuple[int, dict | str, dict]:
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status, body, hdrs = r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        status, body, hdrs = e.code, e.read(), e.headers
    try:
        return status, json.loads(body), hdrs
    except ValueError:
        return status, body.decode(), hdrs


# ----------------------------------------------------------------------------- the openai package
def test_models_and_health(srv):
    c = _client(srv)
    ids = [m.id for m in c.models.list()]
    assert ids == [srv.state.model_id] == ["gemma-3-270m-q4_k_m.gguf"]
    status, body, _ = _get(srv, "/health")
    assert status == 200 and body["status"] == "ok"


def test_chat_non_streaming_and_streaming_match_the_engine_chat(srv, eng):
    c = _client(srv)
    msgs = [{"role": "user", "content": "Name three colours."}]
    r = c.chat.completions.create(model=srv.state.model_id, messages=msgs, max_tokens=16, temperature=0)
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length") and text
    assert 0 < r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # the engine's own Chat (template, tokens, greedy decode) says the same
    chat = Chat(eng, SLOT_CTX)
    ref = "".join(ev.text for ev in chat.send("Name three colours.", SamplingParams(temperature=0), 16)
                  if isinstance(ev, TokenEvent))
    chat.session.close()
    assert text == ref
    stream = c.chat.completions.create(model=srv.state.model_id, messages=msgs, max_tokens=16, temperature=0,
                                       stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_completions_non_streaming_and_streaming(srv):
    c = _client(srv)
    r = c.completions.create(model=srv.state.model_id, prompt="The capital of France is", max_tokens=10,
                             temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length"
    parts = list(c.completions.create(model=srv.state.model_id, prompt="The capital of France is", max_tokens=10,
                                      temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts) == r.choices[0].text
    assert parts[-1].usage.completion_tokens == 10
    # a seeded sampled request is reproducible
    a, b = (c.completions.create(model=srv.state.model_id, prompt="Once upon a time", max_tokens=12,
                                 temperature=1.0, seed=42).choices[0].text for _ in range(2))
    assert a == b


def test_stop_strings_and_second_turn_reuses_the_cache(srv):
    c = _client(srv)
    r = c.completions.create(model=srv.state.model_id, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    full = r.choices[0].text
    stop = full[4:7]
    s = c.completions.create(model=srv.state.model_id, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                             stop=[stop])
    assert s.choices[0].finish_reason == "stop" and s.choices[0].text == full[:full.find(stop)]
    msgs = [{"role": "user", "content": "Tell me about the sea."}]
    first = c.chat.completions.create(model=srv.state.model_id, messages=msgs, max_tokens=12, temperature=0)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And the sky?"}]
    status, body, _ = _post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0})
    assert status == 200
    assert body["timings"]["cache_n"] >= first.usage.prompt_tokens  # the first turn's prompt came from the cache
    assert body["timings"]["prompt_n"] < body["usage"]["prompt_tokens"] - first.usage.prompt_tokens + 8


# ----------------------------------------------------------------------------- greedy equality
def _generate_cli(prompt: str, n: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "workbench", "generate", "-p", prompt, "-n", str(n), "--temp", "0",
                          "--json", "-t", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _background_stream(srv, prompt: str, started: threading.Event, stop: threading.Event, seed: int) -> int:
    """A sampled stream that runs until `stop`; returns the chunks it received."""
    c = _client(srv)
    n = 0
    stream = c.completions.create(model=srv.state.model_id, prompt=prompt, max_tokens=900, temperature=1.0,
                                  seed=seed, stream=True, extra_body={"ignore_eos": True})
    for _ in stream:
        n += 1
        started.set()
        if stop.is_set():
            stream.close()
            break
    return n


@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):"])
def test_greedy_tokens_equal_numawb_generate_whatever_the_batch(srv, prompt):
    ref = _generate_cli(prompt, 24)
    sch = srv.state.scheduler
    stop = threading.Event()
    starts = [threading.Event() for _ in range(3)]
    with ThreadPoolExecutor(3) as ex:
        futs = [ex.submit(_background_stream, srv, p, s, stop, i)
                for i, (p, s) in enumerate(zip(["Write a poem", "Hello", "List of animals:"], starts))]
        for s in starts:
            _until(s.is_set)
        rows0, passes0 = sch.pass_rows, sch.passes
        status, body, _ = _post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                                         "return_tokens": True})
        # every pass of the greedy request had the three sampled streams beside it
        assert sch.pass_rows - rows0 >= 4 * 23 and sch.passes - passes0 >= 23
        stop.set()
        assert all(f.result(timeout=300) > 0 for f in futs)
    assert status == 200
    assert body["tokens"] == ref["tokens"]
    assert body["choices"][0]["text"] == ref["text"]


# ----------------------------------------------------------------------------- raw HTTP mistakes
def _err(status_body, status: int, param: str | None = None, code: str | None = None) -> None:
    st, body, _ = status_body
    assert st == status, body
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"]["type"]
    if param:
        assert body["error"]["param"] == param
    if code:
        assert body["error"]["code"] == code


def test_client_mistakes_get_openai_errors(srv):
    chat = "/v1/chat/completions"
    ok = [{"role": "user", "content": "hi"}]
    _err(_post(srv, chat, None, raw=b'{"messages": [{"role": "user", "content": "hi"}'), 400)
    _err(_post(srv, chat, None, raw=b"\xff\xfe"), 400)
    _err(_post(srv, chat, [1, 2]), 400)
    _err(_post(srv, chat, {}), 400, "messages")
    _err(_post(srv, chat, {"messages": "hi"}), 400, "messages")
    _err(_post(srv, chat, {"messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages[0].role")
    _err(_post(srv, chat, {"messages": [{"role": "user", "content": 5}]}), 400, "messages[0].content")
    _err(_post(srv, chat, {"messages": ok, "temperature": "hot"}), 400, "temperature")
    _err(_post(srv, chat, {"messages": ok, "temperature": -1}), 400, "temperature")
    _err(_post(srv, chat, {"messages": ok, "max_tokens": -5}), 400, "max_tokens")
    _err(_post(srv, chat, {"messages": ok, "max_tokens": 2.5}), 400, "max_tokens")
    _err(_post(srv, chat, {"messages": ok, "top_p": 0}), 400, "top_p")
    _err(_post(srv, chat, {"messages": ok, "stream": "yes"}), 400, "stream")
    _err(_post(srv, chat, {"messages": ok, "stop": 3}), 400, "stop")
    _err(_post(srv, chat, {"messages": ok, "n": 2}), 400, "n")
    _err(_post(srv, chat, {"messages": ok, "model": "gpt-4o"}), 404, "model", "model_not_found")
    _err(_post(srv, "/v1/completions", {"prompt": 7}), 400, "prompt")
    _err(_post(srv, "/v1/completions", {"prompt": [1, 10 ** 9]}), 400, "prompt")
    # a prompt longer than a slot's context
    _err(_post(srv, "/v1/completions", {"prompt": "hello " * (SLOT_CTX + 50)}), 400, code="context_length_exceeded")
    _err(_post(srv, chat, {"messages": [{"role": "user", "content": "word " * (SLOT_CTX + 50)}]}), 400,
         code="context_length_exceeded")
    _err(_get(srv, "/v1/nothing"), 404)
    _err(_get(srv, chat), 405)
    # the openai package raises its typed errors from these
    c = _client(srv)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=ok)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=srv.state.model_id, prompt="x", temperature=-3)
    _until(lambda: srv.state.scheduler.running == 0 and srv.state.scheduler.queued == 0)


def test_chat_without_a_chat_template_is_a_clear_400(eng):
    """The base model as its file is (no chat template): /v1/chat/completions answers 400 with a
    clear OpenAI-style error and invents no turns; /v1/completions serves it."""
    s = _serve(eng, n_parallel=1, n_ctx=256)
    turns = eng.chat_format
    eng.chat_format = ChatFormatter(None, eng.cfg.arch, set(), turns.bos, turns.eos)
    try:
        msgs = [{"role": "user", "content": "Name three colours."}]
        res = _post(s, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4})
        _err(res, 400, "messages", "no_chat_template")
        message = res[1]["error"]["message"]
        assert "no chat template" in message and "/v1/completions" in message
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            _client(s).chat.completions.create(model=s.state.model_id, messages=msgs, max_tokens=4, stream=True)
        r = _client(s).completions.create(model=s.state.model_id, prompt="Name three colours.", max_tokens=4,
                                          temperature=0)
        assert 0 < r.usage.completion_tokens <= 4
        assert s.state.scheduler.running == 0
    finally:
        eng.chat_format = turns
        s.stop()
        s.state.scheduler.close(timeout=0)


def test_api_key_on_every_request(eng):
    s = _serve(eng, n_parallel=1, n_ctx=256, api_key="sekret")
    try:
        for path in ("/health", "/v1/models", "/metrics"):
            _err(_get(s, path), 401, code="invalid_api_key")
            _err(_get(s, path, {"Authorization": "Bearer wrong"}), 401)
            assert _get(s, path, {"Authorization": "Bearer sekret"})[0] == 200
        _err(_post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2}), 401)
        with pytest.raises(openai.AuthenticationError):
            _client(s, "wrong").models.list()
        r = _client(s, "sekret").completions.create(model=s.state.model_id, prompt="Hi", max_tokens=3)
        assert r.usage.completion_tokens <= 3
    finally:
        s.stop()
        s.state.scheduler.close(timeout=0)


# ----------------------------------------------------------------------------- concurrency and faults
def test_sixteen_concurrent_streams_all_complete(srv):
    sch = srv.state.scheduler

    def one(i: int) -> tuple[str, str | None, int]:
        c = _client(srv)
        text, finish, usage = "", None, 0
        for ch in c.chat.completions.create(
                model=srv.state.model_id, messages=[{"role": "user", "content": f"Count to {i + 3}."}],
                max_tokens=8 + i, temperature=0.7, seed=i, stream=True):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
            if ch.usage:
                usage = ch.usage.completion_tokens
        return text, finish, usage
    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, range(16), timeout=900))
    assert len(results) == 16
    for i, (text, finish, usage) in enumerate(results):
        assert finish in ("stop", "length") and 0 < usage <= 8 + i
    assert sch.running == 0 and sch.queued == 0


def test_full_queue_answers_503_with_retry_after(eng):
    s = _serve(eng, n_parallel=1, n_ctx=512, max_queue=0)
    try:
        sch = s.state.scheduler
        started, stop = threading.Event(), threading.Event()
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(_background_stream, s, "Tell a story", started, stop, 1)
            _until(started.is_set)
            st, body, hdrs = _post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            stop.set()
            fut.result(timeout=300)
        assert st == 503 and body["error"]["code"] == "queue_full"
        assert int(hdrs["Retry-After"]) >= 1
        _until(lambda: sch.running == 0)
        assert sch.requests_cancelled >= 1
    finally:
        s.stop()
        s.state.scheduler.close(timeout=0)


def test_disconnected_stream_is_cancelled_and_its_slot_freed(srv):
    sch = srv.state.scheduler
    before = sch.requests_cancelled
    started, stop = threading.Event(), threading.Event()
    stop.set()  # close after the first chunk
    assert _background_stream(srv, "Describe a forest", started, stop, 3) == 1
    _until(lambda: sch.requests_cancelled > before and sch.running == 0)


def test_metrics_prometheus_text(srv):
    _client(srv).completions.create(model=srv.state.model_id, prompt="Hello", max_tokens=3)
    st, text, hdrs = _get(srv, "/metrics")
    assert st == 200 and hdrs["Content-Type"].startswith("text/plain")
    from prometheus_client.parser import text_string_to_metric_families
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("numawb_http_requests", "numawb_requests", "numawb_requests_processing", "numawb_requests_deferred",
                 "numawb_tokens_predicted", "numawb_predicted_tokens_seconds", "numawb_node_weights_bytes",
                 "numawb_node_kv_bytes", "numawb_node_pages_in_place_ratio", "numawb_worker_busy_ratio"):
        assert name in fams, name
    weights = sum(s.value for s in fams["numawb_node_weights_bytes"].samples)
    kv = sum(s.value for s in fams["numawb_node_kv_bytes"].samples)
    assert weights > 0.5 * srv.state.engine.weight_bytes
    assert kv > 0
    assert len(fams["numawb_worker_busy_ratio"].samples) == 2
    assert all(0 <= s.value <= 1 for s in fams["numawb_node_pages_in_place_ratio"].samples)
    done = [s for s in fams["numawb_requests"].samples if s.labels.get("outcome") == "completed"]
    assert done and done[0].value >= 1


def test_metrics_count_the_passes_run_without_the_crew(srv):
    """numawb_crew_solo_passes counts the passes the starvation backoff ran on the calling thread
    alone (forced here: the runtime's backoff set to 2 passes of the 5 decoded tokens)."""
    from prometheus_client.parser import text_string_to_metric_families

    def solo() -> float:
        fams = {f.name: f for f in text_string_to_metric_families(_get(srv, "/metrics")[1])}
        return fams["numawb_crew_solo_passes"].samples[0].value
    rt = srv.state.engine.rt
    before = solo()
    assert before == rt.solo_passes
    with srv.state.engine.lock:
        rt.crew_backoff = 2
    _client(srv).completions.create(model=srv.state.model_id, prompt="Hello", max_tokens=6)
    # (a busy machine may starve the crew again: more solo passes, never fewer)
    assert solo() == rt.solo_passes >= before + 2


def test_metrics_kv_bytes_per_slot_and_node(srv):
    """A busy slot's KV cache appears per node in /metrics, in bytes measured from its pages: the
    slot that streams has some, at most its buffers' size."""
    sch = srv.state.scheduler
    started, stop = threading.Event(), threading.Event()
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(_background_stream, srv, "Tell me about rivers", started, stop, 7)
        try:
            _until(started.is_set)
            busy = {s.index: s.session for s in sch.slots if s.request is not None}
            st, text, _h = _get(srv, "/metrics")
        finally:
            stop.set()
        fut.result(timeout=300)
    assert st == 200 and busy
    from prometheus_client.parser import text_string_to_metric_families
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    per_slot: dict[int, float] = {}
    for smp in fams["numawb_slot_kv_bytes"].samples:
        slot = int(smp.labels["slot"])
        per_slot[slot] = per_slot.get(slot, 0) + smp.value
        assert int(smp.labels["node"]) >= 0
    assert set(per_slot) <= set(busy) and per_slot
    for slot, total in per_slot.items():
        size = sum(b.nbytes for b in busy[slot].kv_layout.buffers())
        assert 0 < total <= size


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def test_load_with_cancels_completes_and_memory_returns(srv):
    """40 requests of random lengths, 8 at a time, a quarter closed midway: each completes or is
    cancelled by its client, nothing hangs, slots are freed and memory is back to its level."""
    sch = srv.state.scheduler
    rng = random.Random(5)
    plan = [(rng.randint(1, 40), i % 4 == 0, rng.randint(1, 5)) for i in range(40)]

    def one(i: int) -> str:
        n, cancel, after = plan[i]
        c = _client(srv)
        stream = c.completions.create(model=srv.state.model_id, prompt=f"Item {i}:" + " word" * rng.randint(1, 60),
                                      max_tokens=n, temperature=0.8, seed=i, stream=True,
                                      extra_body={"ignore_eos": cancel})
        got, finish = 0, None
        for ch in stream:
            got += 1
            finish = ch.choices[0].finish_reason if ch.choices else finish
            if cancel and got >= after and finish is None:
                stream.close()
                return "cancelled"
        assert finish in ("stop", "length")
        return finish
    with ThreadPoolExecutor(8) as ex:  # a warm-up round, then the measured one
        list(ex.map(one, range(8), timeout=600))
    _until(lambda: sch.running == 0)
    base = _rss()
    with ThreadPoolExecutor(8) as ex:
        outcomes = list(ex.map(one, range(40), timeout=900))
    assert len(outcomes) == 40 and outcomes.count("cancelled") >= 1
    _until(lambda: sch.running == 0 and sch.queued == 0)
    assert sch.active() == []
    assert _rss() - base < 64 << 20


# ----------------------------------------------------------------------------- SIGTERM
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_finishes_or_cancels_and_exits_0():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "serve", "--port", str(port), "-np", "2",
                             "-c", "2048", "--shutdown-timeout", "3", "-t", "2"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        class S:
            url = f"http://127.0.0.1:{port}"
        _until(lambda: _health(S.url) or proc.poll() is not None, 300)
        assert proc.poll() is None, proc.stderr.read()
        c = openai.OpenAI(base_url=S.url + "/v1", api_key="x", max_retries=0, timeout=120)
        first = threading.Event()
        result: dict = {}

        def endless() -> None:
            try:
                for ch in c.completions.create(model="gemma-3-270m-q4_k_m.gguf",
                                               prompt="Once", max_tokens=5000, stream=True,
                                               extra_body={"ignore_eos": True}):
                    first.set()
                result["endless"] = "completed"
            except Exception as e:  # noqa: BLE001 - the server cut it at the timeout
                result["endless"] = type(e).__name__
            first.set()
        t = threading.Thread(target=endless)
        t.start()
        _until(first.is_set)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        t.join(timeout=60)
        assert rc == 0, proc.stderr.read()
        assert "endless" in result  # it ended: finished, or cut at the shutdown timeout
        assert not _health(S.url)  # no longer accepting
        assert "numawb: stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False

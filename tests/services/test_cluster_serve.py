"""`numawb serve --ray`: the OpenAI-compatible server over a model pipelined on a local 2-node
Ray cluster (started here on 127.0.0.1), spoken to with the official `openai` package: greedy
text equals `numawb generate --temp 0`, several sequences share a pass on every host and keep
their own tokens, streaming and usage, a full queue answers 503 with Retry-After, a client that
goes away is cancelled, and a host that dies ends its request with one line naming it while
the server stays up (the next request reloads the pipeline on the hosts alive)."""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
openai = pytest.importorskip("openai")
from gguf.constants import GGMLQuantizationType as T  # noqa: E402

from gguf_factory import TinySpec, write_tiny_model  # noqa: E402
from workbench.cli import main  # noqa: E402
from workbench.cluster.pipeline import RayPipeline  # noqa: E402
from workbench.engine import SamplingParams  # noqa: E402
from workbench.engine.scheduler import Scheduler  # noqa: E402
from workbench.engine.engine import DoneEvent, Engine, Placement  # noqa: E402
from workbench.engine.generation import Picker  # noqa: E402
from workbench.server.app import ServerState  # noqa: E402
from workbench.server.http import HttpServer  # noqa: E402




ONE = Placement(threads=1)
SLOT_CTX = 1024
GREEDY = SamplingParams(temperature=0)




@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("serve") / "tiny-llama.gguf"
    write_tiny_model(path, TinySpec(arch="llama", qtype=T.Q8_0, n_layer=4, n_ctx=4096))
    return str(path)


@pytest.fixture(scope="module")
def pipe(cluster, tiny):
    p = RayPipeline(cluster.address, tiny, ONE, n_ctx=2 * SLOT_CTX, step_timeout=120)
    p.load()
    yield p
    p.close()


def _serve(pipe, n_parallel: int, max_queue: int = 8) -> HttpServer:
    return HttpServer(ServerState(pipe, Scheduler(pipe, n_parallel, SLOT_CTX, max_queue))).start()


@pytest.fixture(scope="module")
def srv(pipe):
    s = _serve(pipe, 2)
    yield s
    s.stop()
    s.state.scheduler.close(timeout=0)


def _client(srv) -> "openai.OpenAI":
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)


def _until(cond, limit: float = 120.0) -> None:
    """Wait for a condition; the limit only guards against a hang."""
    ev = threading.Event()
    for _ in range(int(limit / 0.01)):
        if cond():
            return
        ev.wait(0.01)
    raise AssertionError("condition not reached")


def _generate_cli(tiny: str, prompt: str, n: int, capsys) -> dict:
    assert main(["generate", "-m", tiny, "-p", prompt, "--temp", "0", "-n", str(n), "-t", "1", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


PROMPTS = ["a b c d e", "the quick brown fox", "1 2 3 4 5 6 7"]


def test_greedy_completions_equal_numawb_generate(srv, tiny, capsys):
    refs = [_generate_cli(tiny, p, 16, capsys) for p in PROMPTS]
    c = _client(srv)
    model = c.models.list().data[0].id
    assert model == "tiny-llama.gguf"
    for p, ref in zip(PROMPTS, refs):
        r = c.completions.create(model=model, prompt=p, max_tokens=16, temperature=0,
                                 extra_body={"return_tokens": True, "ignore_eos": True})
        assert r.model_extra["tokens"] == ref["tokens"]
        assert r.choices[0].text == ref["text"]
        assert r.usage.prompt_tokens == len(ref["prompt_tokens"]) and r.usage.completion_tokens == 16
    # streaming: the pieces join to the same text, usage in the last chunk
    parts, usage = [], None
    for ch in c.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True,
                                   extra_body={"ignore_eos": True}):
        parts.append(ch.choices[0].text if ch.choices else "")
        usage = ch.usage or usage
    assert "".join(parts) == refs[0]["text"] and usage.completion_tokens == 16
    # /metrics: the per-node series of every host, labelled with it
    import urllib.request
    with urllib.request.urlopen(srv.url + "/metrics", timeout=120) as r:
        text = r.read().decode()
    pipe = srv.state.engine
    for h in pipe.hosts:
        assert f'numawb_node_weights_bytes{{host="{h.label}",node="0"}}' in text
    assert "numawb_tokens_predicted_total" in text


def test_concurrent_requests_each_get_their_own_tokens(srv, tiny, capsys):
    refs = [_generate_cli(tiny, p, 24, capsys) for p in PROMPTS]
    c = _client(srv)

    def one(p: str) -> list[int]:
        r = c.completions.create(model="tiny-llama.gguf", prompt=p, max_tokens=24, temperature=0,
                                 extra_body={"return_tokens": True, "ignore_eos": True})
        return r.model_extra["tokens"]
    with ThreadPoolExecutor(3) as ex:  # 3 requests on 2 slots: one waits in the queue
        got = list(ex.map(one, PROMPTS))
    assert got == [r["tokens"] for r in refs]
    sch = srv.state.scheduler
    assert sch.running == 0 and sch.queued == 0 and sch.requests_failed == 0


def test_one_pass_carries_several_sequences(pipe, tiny):
    """Two streams decoded together (a batched pass on each host) give each its single-process tokens."""
    prompts = [[1, 40, 41, 42, 43], [1, 77, 5, 300, 12, 9, 9]]
    eng = Engine.load(tiny, placement=ONE)
    try:
        want = [[e for e in eng.new_session(256).generate(p, GREEDY, 10, stop_ids=set())
                 if isinstance(e, DoneEvent)][0].tokens for p in prompts]
    finally:
        eng.close()
    seqs = [pipe.open(256) for _ in prompts]
    try:
        toks = [pipe.prefill(s, p, Picker(GREEDY, p), True, True) for s, p in zip(seqs, prompts)]
        got = [[t] for t in toks]
        for _ in range(9):
            toks = pipe.decode(seqs, toks)
            for g, t in zip(got, toks):
                g.append(t)
        assert got == want
    finally:
        pipe.close(seqs)


def test_full_queue_answers_503_and_a_gone_client_is_cancelled(pipe):
    s = _serve(pipe, 1, max_queue=0)
    sch = s.state.scheduler
    c = _client(s)
    try:
        stream = c.completions.create(model="tiny-llama.gguf", prompt="tell", max_tokens=SLOT_CTX, temperature=1.0,
                                      seed=1, stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))  # the one slot is busy now
        with pytest.raises(openai.APIStatusError) as e:
            c.completions.create(model="tiny-llama.gguf", prompt="hi", max_tokens=2)
        assert e.value.status_code == 503 and int(e.value.response.headers["Retry-After"]) >= 1
        stream.close()  # the client goes away: its request is cancelled, the slot freed
        _until(lambda: sch.requests_cancelled == 1 and sch.running == 0)
    finally:
        s.stop()
        sch.close(timeout=0)


def test_the_app_over_ray_chats_serves_and_groups_the_dashboard_by_host(cluster, tiny, tmp_path, monkeypatch,
                                                                         capsys):
    """`numawb --ray ADDRESS --serve`: the app loads the pipeline, its chat and its server run over
    it, and the dashboard's memory, proof and workers are grouped by host, then node."""
    import asyncio
    import time

    from workbench.app import WorkbenchApp
    from workbench.screens.dashboard import MemoryBars
    from workbench.settings import Settings
    from textual.widgets import DataTable

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    ref = _generate_cli(tiny, PROMPTS[2], 8, capsys)
    settings = Settings()
    settings.n_ctx = 512
    settings.sampling.n_predict = 6

    async def until(pilot, cond, timeout: float = 300.0) -> None:
        end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < end, "timed out"
            await pilot.pause(0.05)

    async def run() -> None:
        app = WorkbenchApp(tiny, placement=ONE, ray=cluster.address, settings=settings, persist=False, serve=0,
                           serve_slots=2)
        async with app.run_test(size=(160, 60)) as pilot:
            await until(pilot, lambda: app.engine is not None and not app.loading and app.server is not None)
            pipe = app.engine
            assert len(pipe.hosts) == 2
            # the chat runs over the pipeline
            assert await app.send_message("hello there")
            await until(pilot, lambda: not app.generating and len(app.chat.messages) == 2)
            assert app.chat.messages[-1].role == "assistant" and app.last_error == ""
            # the server too: greedy output as `numawb generate --temp 0`
            c = openai.OpenAI(base_url=app.server.url + "/v1", api_key="none", max_retries=0, timeout=300)
            r = await asyncio.to_thread(c.completions.create, model="tiny-llama.gguf", prompt=PROMPTS[2],
                                        max_tokens=8, temperature=0,
                                        extra_body={"return_tokens": True, "ignore_eos": True})
            assert r.model_extra["tokens"] == ref["tokens"]
            # the dashboard: every host's proof, grouped by host then node
            app.screen_stack[0].view = "dashboard"
            app.sample_now()
            await until(pilot, lambda: len(app.dashboard.snapshot.hosts) == 2)
            snap = app.dashboard.snapshot
            labels = [h.label for h in pipe.hosts]
            assert [h.split(" ", 2)[1] for h in snap.hosts] == labels
            assert {n.host for n in snap.nodes} == set(labels) and {w.host for w in snap.workers} == set(labels)
            await pilot.pause()
            text = str(app.dashboard.query_one(MemoryBars).render())
            assert text.index(snap.hosts[0]) < text.index(snap.hosts[1])
            table = app.dashboard.query_one("#workers", DataTable)
            first = [str(c) for c in table.get_row_at(0)]
            assert first[0] == f"host {labels[0]}"
            # a placement switch is refused (each host keeps its own), the pipeline stays
            assert not app.request_switch(weights="interleave")
    asyncio.run(run())


def test_numawb_serve_ray_command(cluster, tiny, capsys):
    """`numawb serve --ray ADDRESS` as a user runs it: it listens, answers like `generate --temp 0`
    and SIGTERM stops it with status 0 (the Ray actors go with it)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request
    ref = _generate_cli(tiny, PROMPTS[0], 6, capsys)
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "serve", "--ray", cluster.address, "-m", tiny,
                             "--port", str(port), "-np", "2", "-c", "1024", "-t", "1"], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False
    try:
        _until(lambda: up() or proc.poll() is not None, 300)
        assert proc.poll() is None, proc.stderr.read()
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        r = c.completions.create(model="tiny-llama.gguf", prompt=PROMPTS[0], max_tokens=6, temperature=0,
                                 extra_body={"return_tokens": True, "ignore_eos": True})
        assert r.model_extra["tokens"] == ref["tokens"]
        assert c.models.list().data[0].meta["n_parallel"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        err = proc.stderr.read()
        assert "over 2 Ray hosts" in err and "numawb: stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# last in the module: the host it kills is not needed by a later test
def test_a_dead_host_ends_the_request_by_name_and_the_server_goes_on(srv, pipe, tiny, capsys):
    ref = _generate_cli(tiny, PROMPTS[1], 8, capsys)
    c = _client(srv)
    victim = pipe.hosts[1]
    stream = c.completions.create(model="tiny-llama.gguf", prompt="x", max_tokens=SLOT_CTX // 2, temperature=0,
                                  stream=True, extra_body={"ignore_eos": True})
    with pytest.raises(openai.APIError) as e:
        for i, _ in enumerate(stream):
            if i == 2:
                ray.kill(victim.actor, no_restart=True)
    msg = str(e.value.message if hasattr(e.value, "message") else e.value)
    assert f"host {victim.label} stopped during token" in msg and "\n" not in msg
    # the server is still up; the next request reloads the pipeline and is right again
    try:
        r = c.completions.create(model="tiny-llama.gguf", prompt=PROMPTS[1], max_tokens=8, temperature=0,
                                 extra_body={"return_tokens": True, "ignore_eos": True})
    except openai.APIError:
        if sum(1 for n in ray.nodes() if n.get("Alive")) < 2:
            # killing one actor must not take a node down; on a loaded machine Ray's raylet on the
            # other node sometimes aborts in its compiled-graph channels (experimental_mutable_object_
            # provider.cc: "Check failed: WriteAcquire ... Channel closed"), leaving no second host
            pytest.skip("Ray lost a whole node when one actor was killed (its raylet aborted)")
        raise
    assert r.model_extra["tokens"] == ref["tokens"]
    assert pipe.broken is None and len(pipe.hosts) == 2

"""Telemetry snapshots (live and simulated), rate tracking, the sampler thread, and settings."""
from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import pytest

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Chat, SamplingParams
from workbench.engine.engine import Engine, Placement, Stats
from workbench.numa.proof import BufferProof
from workbench.settings import Settings, load_settings, save_settings
from workbench.telemetry import (Rates, RateTracker, Sampler, Snapshot, Telemetry, node_in_place,
                                 worker_uses)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("tm") / "tiny.gguf"
    write_tiny_model(path, TinySpec(n_ctx=256))
    eng = Engine.load(str(path))
    chat = Chat(eng, n_ctx=256)
    for _ in chat.send("the cat", SamplingParams(seed=1), n_predict=4):
        pass
    yield eng, chat
    eng.close()


def roundtrip(s: Snapshot) -> Snapshot:
    return Snapshot.from_json(json.loads(json.dumps(s.to_json())))


def test_live_snapshot_measures_weights_kv_and_workers(engine):
    eng, _ = engine
    s = Telemetry(eng).sample()
    assert s.source == "live" and not s.simulated
    assert s.model == "tiny.gguf" and s.weight_bytes == eng.weight_bytes
    assert sum(n.weights for n in s.nodes) == pytest.approx(eng.weight_bytes, rel=0.02)
    kv = sum(b.nbytes for b in eng.buffers() if b.kind == "kv")
    assert 0 < sum(n.kv for n in s.nodes) <= kv
    assert [w.index for w in s.workers] == list(range(eng.pool.n_threads))
    for n in s.nodes:
        assert n.free <= n.total and n.system >= 0
    assert {b.kind for b in s.buffers} == {"weights", "kv"}
    assert s.topo.node_ids and s.topo.kernel_path


def test_snapshot_json_roundtrip(engine):
    eng, _ = engine
    tel = Telemetry(eng)
    tel.rates.done(Stats(prompt_tokens=5, prompt_seconds=0.5, decode_tokens=9, decode_seconds=0.3, ttft=0.6))
    s = tel.sample()
    assert roundtrip(s) == s
    sim = Telemetry(eng, simulate="xeon-8node-smt").sample()
    assert roundtrip(sim) == sim


def test_simulated_figures_are_deterministic_and_marked(engine):
    eng, _ = engine
    a = Telemetry(eng, simulate="xeon-8node-smt").sample(now=0)
    b = Telemetry(eng, simulate="xeon-8node-smt").sample(now=0)
    strip = lambda s: dataclasses.replace(s, sample_seconds=0.0, workers=tuple(  # noqa: E731
        dataclasses.replace(w, busy=0.0) for w in s.workers))
    assert strip(a) == strip(b)
    assert a.simulated and a.source == "simulated:xeon-8node-smt"
    assert any("SIMULATED" in n for n in a.notes)
    assert len(a.nodes) == 8 and len(a.workers) == 32  # one worker per physical core of the fixture
    assert {w.node for w in a.workers} == set(range(8))
    assert a.nodes[0].weights == eng.weight_bytes and sum(n.weights for n in a.nodes[1:]) == 0  # mode none


def test_simulated_modes_follow_the_planner(engine):
    eng, _ = engine
    tel = Telemetry(eng, simulate="epyc-2socket")
    eng.switch(weights="mirror")
    try:
        mirror = tel.sample()
        assert [n.weights for n in mirror.nodes] == [eng.weight_bytes] * len(mirror.nodes)
        assert all("replica" in w.uses or "mirror" in w.uses for w in mirror.workers)
        eng.switch(weights="interleave")
        inter = tel.sample()
        assert sum(n.weights for n in inter.nodes) >= eng.weight_bytes
        assert max(n.weights for n in inter.nodes) < eng.weight_bytes
    finally:
        eng.switch(weights="none")


def test_rate_tracker_current_average_peak():
    rt = RateTracker()
    for tps in (10.0, 30.0, 20.0):
        rt.done(Stats(prompt_tokens=4, prompt_seconds=0.1, decode_tokens=int(tps), decode_seconds=1.0, ttft=0.2))
    r = rt.rates()
    assert r.decode_tps == (10.0, 30.0, 20.0)
    assert Rates.cur_avg_peak(r.decode_tps) == (20.0, 20.0, 30.0)
    assert r.prompt_tps == (40.0, 40.0, 40.0) and r.current_decode == 20.0
    rt.start()
    t = time.perf_counter()
    for i in range(11):
        rt.token(t + i * 0.05)
    live = rt.rates()
    assert live.generating and live.live_decode_tps == pytest.approx(20.0)
    assert live.current_decode == pytest.approx(20.0)
    rt.failed()
    assert not rt.rates().generating and rt.rates().live_decode_tps is None


def test_bandwidth_is_weight_bytes_times_decode_rate(engine):
    eng, _ = engine
    tel = Telemetry(eng)
    tel.rates.done(Stats(prompt_tokens=1, prompt_seconds=1, decode_tokens=50, decode_seconds=2.0))
    assert tel.sample().bandwidth == pytest.approx(eng.weight_bytes * 25.0)
    assert Telemetry(None).sample().bandwidth is None


def test_sampler_runs_pauses_and_clamps():
    got: list[Snapshot] = []
    ev = threading.Event()

    def on(s: Snapshot) -> None:
        got.append(s)
        ev.set()
    sm = Sampler(Telemetry(None), on, interval=0.25)
    sm.start()
    try:
        assert ev.wait(5)
        sm.pause()
        time.sleep(0.3)
        n = len(got)
        time.sleep(0.6)
        assert len(got) == n and sm.paused
        sm.pause(False)
        end = time.monotonic() + 5
        while len(got) == n and time.monotonic() < end:
            time.sleep(0.05)
        assert len(got) > n
        assert sm.set_interval(0.01) == Sampler.MIN_INTERVAL
        assert sm.set_interval(1e6) == Sampler.MAX_INTERVAL
        assert [s.seq for s in got] == sorted(s.seq for s in got)
    finally:
        sm.stop()
    assert not sm._thread.is_alive()


def test_worker_uses_and_node_in_place():
    bufs = [("weights mirror replica 0 (node 0)", (0,)), ("weights mirror replica 1 (node 1)", (1,))]
    assert worker_uses(1, bufs) == "mirror replica 1 (node 1)"
    assert worker_uses(0, [("weights interleave (nodes 0,1)", (0, 1))]) == "interleave (nodes 0,1)"
    proofs = [BufferProof("a", "weights", (0,), 100, 10, {0: 9, 1: 1}),
              BufferProof("b", "kv", (0, 1), 100, 10, {0: 5, 1: 5})]
    assert node_in_place(proofs, 0) == pytest.approx((9 + 5) / (10 + 5))
    assert node_in_place(proofs, 1) == pytest.approx(1.0)
    assert node_in_place(proofs, 2) is None


def test_settings_roundtrip_and_bad_files(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    s = Settings(theme="numawb-ansi", refresh=2.0)
    s.sampling.top_k = 7
    s.sampling.seed = 3
    path = save_settings(s)
    assert path == tmp_path / "numawb" / "settings.json"
    assert load_settings() == s
    path.write_text("{not json")
    assert load_settings() == Settings()
    path.write_text(json.dumps({"theme": 5, "refresh": "fast", "sampling": {"top_k": "x", "temperature": 0}}))
    loaded = load_settings()
    assert loaded.theme == "numawb" and loaded.refresh == 1.0
    assert loaded.sampling.top_k == 40 and loaded.sampling.temperature == 0.0


# ---- worker 0 runs on the calling thread (issue 10, bug 5) -----------------------------------

def test_thread_cpu_reads_where_a_thread_runs():
    from workbench.telemetry import thread_cpu
    cpus = sorted(os.sched_getaffinity(0))
    seen: dict[int, int | None] = {}
    ready, leave = threading.Event(), threading.Event()

    def pinned(cpu: int) -> None:
        os.sched_setaffinity(0, {cpu})
        sum(range(100_000))  # run a little there
        seen["tid"] = threading.get_native_id()
        ready.set()
        leave.wait(10)
    t = threading.Thread(target=pinned, args=(cpus[-1],))
    t.start()
    try:
        assert ready.wait(10)
        assert thread_cpu(seen["tid"]) == cpus[-1]
    finally:
        leave.set()
        t.join()
    end = time.monotonic() + 10  # join returns a moment before the kernel task is gone
    while thread_cpu(seen["tid"]) is not None and time.monotonic() < end:
        time.sleep(0.01)
    assert thread_cpu(seen["tid"]) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_worker_zero_shows_the_thread_that_ran_its_share(tmp_path):
    """One worker pinned to the first CPU; the engine is driven from a thread on the last CPU.
    Worker 0's share runs on that calling thread, so its row must say the last CPU (the pool's
    own thread 0, which the old row showed, never ran a pass)."""
    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    path = tmp_path / "tiny.gguf"
    write_tiny_model(path, TinySpec(n_ctx=128))
    eng = Engine.load(str(path), placement=Placement(threads=1, cpus=[first]))
    tel = Telemetry(eng)
    before = tel.sample().workers[0]  # no thread has run a pass for it yet: unknown, not the pool's
    assert (before.thread, before.actual_cpu, before.actual_node, before.misplaced) == ("caller", None, None, False)
    done, leave = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            os.sched_setaffinity(0, {last})
            tel.note_caller()
            for _ in Chat(eng, n_ctx=128).send("the cat", SamplingParams(seed=1), n_predict=3):
                pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        done.set()
        leave.wait(30)
    t = threading.Thread(target=drive)
    t.start()
    try:
        assert done.wait(600) and not errors, errors
        assert eng.pool.workers[0].actual_cpu == first  # the pool's thread 0 sits on the first CPU
        w0 = tel.sample().workers[0]
        assert (w0.thread, w0.actual_cpu) == ("caller", last)
        assert w0.actual_node == eng.pool.topology.node_of(last) and w0.cpu == first
        assert roundtrip(tel.sample()).workers[0] == tel.sample().workers[0]
    finally:
        leave.set()
        t.join()
        w0_after = tel.sample().workers[0]
        eng.close()
    assert (w0_after.thread, w0_after.actual_cpu) == ("caller", last)  # kept: where it last ran


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_worker_zero_shows_where_its_share_ran_not_where_the_caller_idles(tmp_path):
    """With a crew, each pass pins the calling thread to worker 0's node (`WorkerPool.lead`) and
    frees it after: worker 0's row says where the share ran at the end of the last pass, not where
    the thread idles between passes (an idle chat thread on the other node read "misplaced" in the
    emulated 2-node guest's recorded picture)."""
    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    path = tmp_path / "tiny.gguf"
    write_tiny_model(path, TinySpec(n_ctx=128))
    eng = Engine.load(str(path), placement=Placement(threads=1, cpus=[first]))
    tel = Telemetry(eng)
    seen: list = []

    def drive() -> None:
        os.sched_setaffinity(0, {last})
        tel.note_caller()
        with eng.pool.lead():   # a pass's pinning: worker 0's node's CPUs the pool uses (the first)
            seen.append((threading.get_native_id(), os.sched_getaffinity(0)))
        seen.append(os.sched_getaffinity(0))   # freed again: back on the last CPU
    t = threading.Thread(target=drive)
    t.start()
    t.join(60)
    try:
        (tid, inside), after = seen
        assert inside == {first} and after == {last}
        assert eng.pool.lead_seen == (tid, first)
        w0 = tel.sample().workers[0]
        assert (w0.thread, w0.actual_cpu, w0.misplaced) == ("caller", first, False)
        assert w0.actual_node == eng.pool.topology.node_of(first)
    finally:
        eng.close()


def test_dense_model_has_no_routing(engine):
    eng, _ = engine
    snap = Telemetry(eng).sample()
    assert snap.routing is None and snap.requests == () and snap.serving == ""
    assert roundtrip(snap) == snap


def test_moe_routing_is_carried_in_snapshots_and_survives_json(tmp_path):
    """The snapshot's routing is the engine's window (hits per MoE layer, expert bytes per node),
    and it comes back unchanged from a recording's JSON."""
    from workbench.telemetry import RoutingInfo
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256))
    eng = Engine.load(str(path))
    try:
        tel = Telemetry(eng)
        assert tel.sample().routing == RoutingInfo(0, 8, (), (), ())  # nothing routed yet
        s = eng.new_session(64)
        for _ in s.generate([2, 270, 271, 272, 273, 274], SamplingParams(temperature=0.0), 3):
            pass
        snap = tel.sample()
        r, want = snap.routing, eng.routing()
        assert r.layers == tuple(want.layers) and r.window == want.window > 0
        assert r.hits == tuple(tuple(int(v) for v in want.hits[il]) for il in want.layers)
        assert dict(r.node_bytes) == pytest.approx(want.node_bytes) and r.imbalance == pytest.approx(want.imbalance)
        assert r.node_shares == pytest.approx(want.node_shares)
        assert sum(r.hits[0]) == 2 * r.window  # 2 experts per token, every token of layer 0
        back = roundtrip(snap)
        assert back.routing == r and back == snap
    finally:
        eng.close()


def test_routing_info_of_a_counted_window():
    """Shares and imbalance as the engine's RoutingSnapshot defines them, from its own counter."""
    import numpy as np
    from workbench.engine.routing import RoutingStats
    from workbench.telemetry import RoutingInfo
    st = RoutingStats(2, 4, window=3, bytes_by_node=lambda name, e: {0 if e < 2 else 1: 100.0})
    for ids in ([0, 1], [0, 2], [0, 1], [3, 0]):  # four tokens: the first leaves the 3-token window
        st.record("blk.1.ffn_gate_exps.weight", np.array([ids]), ("t",))
    r = RoutingInfo.from_routing(st.snapshot())
    assert r.layers == (1,) and r.window == 3 and r.hits == ((3, 1, 1, 1),)
    want = st.snapshot()
    assert r.imbalance == pytest.approx(want.imbalance) and r.node_shares == pytest.approx(want.node_shares)

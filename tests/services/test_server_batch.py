"""Batched decoding (engine/batch.py): a row's numbers do not depend on the batch; the scheduler's
continuous batching (join/leave, cancel, queue limit, stop strings, prefix reuse)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, random_tensor, write_tiny_model
from workbench.engine import ContextFullError, DoneEvent, Engine, SamplingParams, TokenEvent
from workbench.engine import kernels as K
from workbench.engine.batch import EXACT_COLUMNS, decode_batch, exact_columns
from workbench.engine.scheduler import ErrorEvent, QueueFullError, Request, Scheduler, ShuttingDownError
from workbench.engine.engine import Placement

ALL_TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.Q3_K,
             T.IQ4_NL, T.IQ4_XS]
N_MAX = 12


def _weights(t: T, rows: int = 40, k: int = 512) -> np.ndarray:
    data = random_tensor(t, rows, k, np.random.default_rng(int(t)))
    if t in (T.F32, T.F16, T.BF16) or data.dtype != np.uint8:
        if t == T.BF16:
            f = np.random.default_rng(3).standard_normal((rows, k)).astype(np.float32)
            return np.ascontiguousarray((f.view(np.uint32) >> 16).astype(np.uint16)).view(np.uint8).reshape(rows, -1)
        return np.ascontiguousarray(np.asarray(data, dtype=np.float16 if t == T.F16 else np.float32)
                                    ).view(np.uint8).reshape(rows, -1)
    return np.ascontiguousarray(data).reshape(rows, -1)


PACKED = {p: f for f, p in K.PACKED_LAYOUTS.items() if K.packed_type(f) is not None}   # layout -> file type


@pytest.mark.parametrize("t", ALL_TYPES + sorted(PACKED),
                         ids=lambda t: T(t).name if t in set(T) else K.TYPE_NAMES[t])
def test_exact_columns_table(t):
    """matmat of up to exact_columns() rows gives each row matvec's bits; the table's limits are
    needed (one more row changes the numbers), so a batch cut by it keeps one-token numbers.
    The engine's layouts too: Q4_K_x8 (a dense weight's prompt tiles are llama.cpp's gemm), the
    Q5_0 and Q8_0 row pairs (a server batch's few rows through Q8_0_x2's `few_columns`)."""
    if t in PACKED:
        from workbench.engine import packing
        w = _weights(T(PACKED[t]))
        packing.movers(t)[0](w, 0, w.shape[0])
    else:
        w = _weights(t)
    rows = w.shape[0]
    X = np.random.default_rng(7).standard_normal((N_MAX, 512)).astype(np.float32)
    ref = np.empty((N_MAX, rows), np.float32)
    for c in range(N_MAX):
        K.matvec(int(t), w, K.prepare(int(t), X[c]), ref[c], 0, rows)
    limit = exact_columns([int(t)])
    same = []
    for n in range(1, N_MAX + 1):
        out = np.empty((n, rows), np.float32)
        K.matmat(int(t), w, K.prepare(int(t), X[:n]), out, 0, rows)
        same.append(np.array_equal(out, ref[:n]))
    name = K.TYPE_NAMES[int(t)]
    assert all(same[:min(limit, N_MAX)]), f"{name}: matmat differs from matvec within the limit {limit}"
    if int(t) in EXACT_COLUMNS and K.kernel_path() != "portable":  # the limits are the SIMD tiles'
        assert not same[limit], f"{name}: the limit {limit} is not needed"


@pytest.mark.parametrize("path", K.available_paths())
def test_q8_0_batch_kernel_equals_matvec(path):
    """The many-row Q8_0 product (u8-offset activations on VNNI) gives matvec's bits, extremes included."""
    from workbench.engine.kernels.q8_0_rows import q8_0_batch
    prev = K.kernel_path()
    K.set_kernel_path(path)
    try:
        w = _weights(T.Q8_0, rows=37, k=640)
        w.reshape(37, 20, 34)[0, :, 2:] = np.uint8(0x81)  # quants of -127
        w.reshape(37, 20, 34)[1, :, 2:] = np.uint8(127)
        X = np.random.default_rng(2).standard_normal((N_MAX, 640)).astype(np.float32)
        X[1] = 50.0
        X[2, ::2] = -50.0
        ref = np.empty((N_MAX, 37), np.float32)
        for c in range(N_MAX):
            K.matvec(int(T.Q8_0), w, K.prepare(int(T.Q8_0), X[c]), ref[c], 0, 37)
        for n in (1, 3, 4, 5, 8, 9, 12):
            out = np.full((n, 37), np.nan, np.float32)
            q8_0_batch(w, X[:n], out, 0, 20)
            q8_0_batch(w, X[:n], out, 20, 37)
            np.testing.assert_array_equal(out, ref[:n])
    finally:
        K.set_kernel_path(prev)


# ----------------------------------------------------------------------------- decode_batch
SPECS = {
    "gemma3-q4k": TinySpec(arch="gemma3", qtype=T.Q4_K, n_layer=2, n_ctx=512),
    "llama-q6k": TinySpec(arch="llama", qtype=T.Q6_K, n_layer=2, n_ctx=512),
    "qwen2-f16": TinySpec(arch="qwen2", qtype=T.F16, n_layer=2, n_ctx=512),
    "qwen3-q5_0": TinySpec(arch="qwen3", qtype=T.Q5_0, n_layer=2, n_ctx=512),
    "llama-q8_0": TinySpec(arch="llama", qtype=T.Q8_0, n_layer=2, n_ctx=512, tied=False),
    # a mixture of experts: each row's RoPE at its own cache's position, as for the dense families
    "qwen3moe-q8_0": TinySpec(arch="qwen3moe", qtype=T.Q8_0, n_layer=2, n_ctx=512, n_expert=8, n_expert_used=2,
                              n_ff=256, n_ff_exp=256),
    # multi-head latent attention: each row on its own latent cache (`_BatchRuntime.mla_attention`)
    "deepseek2-q8_0": TinySpec(arch="deepseek2", qtype=T.Q8_0, n_layer=2, n_ctx=512, n_expert=8, n_expert_used=2,
                               n_ff=256, n_ff_exp=128),
    # the seeds' kinds in K-quants: Q4_K experts (repacked for the one-token kernels), and a V3/R1-style
    # DeepSeek (q-LoRA, sigmoid gating with exp_probs_b over expert groups)
    "qwen3moe-q4k": TinySpec(arch="qwen3moe", qtype=T.Q4_K, n_layer=2, n_ctx=512, n_expert=16, n_expert_used=4,
                             n_ff=256, n_ff_exp=256),
    "deepseek2-v3-q4k": TinySpec(arch="deepseek2", qtype=T.Q4_K, n_layer=3, n_ctx=512, n_expert=16, n_expert_used=4,
                                 n_ff=256, n_ff_exp=256, q_lora_rank=256, head_dim_v_mla=64, gating=2, probs_bias=True, n_groups=4,
                                 n_group_used=2, weights_norm=True, weights_scale=2.5),
}


# families whose batched pass runs every layer in one compiled call (`rows_layers`); the others go
# layer by layer
SPECS_PASS = {"qwen3moe", "deepseek2"}


@pytest.fixture(scope="module", params=list(SPECS))
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("batch") / f"{request.param}.gguf"
    write_tiny_model(path, SPECS[request.param])
    eng = Engine.load(str(path), placement=Placement(threads=2))
    yield eng
    eng.close()


PROMPTS = [[2, 270, 262, 280, 265, 285], [2, 266, 271], [2, 275, 262, 263, 264, 265, 266, 267, 268, 270, 281],
           [2, 280], [2, 262, 262, 262, 262, 270], [2, 283, 284, 285, 286], [2, 264, 270, 271, 272, 273, 274],
           [2, 287, 263], [2, 268, 269]]


def _single_logits(eng, prompt, tokens):
    """Logits after each fed token, one session alone (the one-token path)."""
    s = eng.new_session(128)
    out = [s.prefill(prompt)]
    for t in tokens:
        out.append(s.eval([t]))
    s.close()
    return out


def test_batch_rows_equal_single_sequences(tiny):
    """Sequences join and leave a batch (sizes 1..9 over the steps); every row's logits equal the
    one-sequence logits to the bit."""
    rng = np.random.default_rng(0)
    feeds = [list(rng.integers(4, 290, size=8)) for _ in PROMPTS]
    ref = [_single_logits(tiny, p, [int(t) for t in f]) for p, f in zip(PROMPTS, feeds)]
    sessions = [tiny.new_session(128) for _ in PROMPTS]
    got = [[s.prefill(p)] for s, p in zip(sessions, PROMPTS)]
    fed = [0] * len(PROMPTS)
    # step k: sequence i is in the batch when it joined (i // 2 <= k) and has tokens left
    for k in range(20):
        rows = [i for i in range(len(PROMPTS)) if i // 2 <= k and fed[i] < len(feeds[i]) and (k + i) % 5]
        if not rows:
            continue
        with tiny.lock:
            lg = decode_batch(tiny, [sessions[i] for i in rows], [int(feeds[i][fed[i]]) for i in rows])
        for r, i in enumerate(rows):
            got[i].append(lg[r])
            fed[i] += 1
    if tiny.model.cfg.arch in SPECS_PASS:  # the mixtures of experts' passes ran every layer in one call
        assert tiny.rt.rows_passes > 0
    for i in range(len(PROMPTS)):
        assert sessions[i].kv.n == len(PROMPTS[i]) + fed[i] == len(sessions[i].tokens)
        for a, b in zip(got[i], ref[i]):
            np.testing.assert_array_equal(a, b)
    for s in sessions:
        s.close()


def test_decode_batch_checks_context(tiny):
    a, b = tiny.new_session(16), tiny.new_session(16)
    a.prefill([2] + [270] * 15)
    b.prefill([2, 270])
    with pytest.raises(ContextFullError):
        decode_batch(tiny, [a, b], [270, 270])
    assert b.kv.n == 2  # nothing was run
    a.close(); b.close()


# ----------------------------------------------------------------------------- scheduler
@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    path = tmp_path_factory.mktemp("sched") / "tiny-gemma.gguf"
    write_tiny_model(path, TinySpec(arch="gemma3", qtype=T.Q4_K, n_layer=2, n_ctx=512))
    e = Engine.load(str(path), placement=Placement(threads=2))
    yield e
    e.close()


class Collector:
    """Events of one request, and a flag when it is done."""

    def __init__(self):
        self.events: list = []
        self.done = threading.Event()

    def __call__(self, ev) -> None:
        self.events.append(ev)
        if isinstance(ev, (DoneEvent, ErrorEvent)):
            self.done.set()

    @property
    def last(self):
        return self.events[-1]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TokenEvent))


def _req(prompt, n=8, **kw) -> tuple[Request, Collector]:
    c = Collector()
    params = kw.pop("params", SamplingParams(temperature=0))
    return Request(prompt=list(prompt), params=params, n_predict=n, on_event=c, **kw), c


def test_scheduler_greedy_equals_generate(eng):
    """Greedy requests decoded together (with sampled ones beside them) give Session.generate's tokens."""
    sch = Scheduler(eng, n_parallel=3, n_ctx=128)
    try:
        jobs = []
        for i, p in enumerate(PROMPTS[:6]):
            params = SamplingParams(temperature=0) if i % 2 == 0 else SamplingParams(temperature=1.5, seed=i)
            r, c = _req(p, 10, params=params, stop_ids=set())
            jobs.append((p, params, r, c))
            sch.submit(r)
        for p, params, r, c in jobs:
            assert c.done.wait(120)
            assert isinstance(c.last, DoneEvent)
            assert c.last.stats.stop_reason == "length" and len(c.last.tokens) == 10
            s = eng.new_session(128)
            ref = list(s.generate(p, params, 10, stop_ids=set()))[-1]
            s.close()
            assert c.last.tokens == ref.tokens, f"prompt {p}"
            assert c.text == c.last.text == ref.text
        assert sch.passes > 0 and sch.pass_rows > sch.passes  # rows were batched
    finally:
        sch.close()


def _until(cond, limit: float = 60.0) -> None:
    """Wait for a condition (the limit only guards against a hang)."""
    ev = threading.Event()
    for _ in range(int(limit / 0.005)):
        if cond():
            return
        ev.wait(0.005)
    raise AssertionError("condition not reached")


def test_scheduler_cancel_queue_full_and_shutdown(eng):
    sch = Scheduler(eng, n_parallel=1, n_ctx=256, max_queue=1)
    try:
        long, lc = _req(PROMPTS[0], 200, stop_ids=set())
        sch.submit(long)
        _until(lambda: long.state != "queued")
        waiting, wc = _req(PROMPTS[1], 4, stop_ids=set())
        sch.submit(waiting)
        with pytest.raises(QueueFullError):
            sch.submit(_req(PROMPTS[2], 4)[0])
        sch.cancel(long)
        assert lc.done.wait(60) and lc.last.stats.stop_reason == "cancelled"
        assert wc.done.wait(60) and wc.last.stats.stop_reason == "length"
        assert sch.requests_cancelled == 1 and sch.running == 0 and sch.queued == 0
        with pytest.raises(ContextFullError):
            sch.submit(_req([2] + [270] * 300)[0])
        sch.stop_accepting()
        with pytest.raises(ShuttingDownError):
            sch.submit(_req(PROMPTS[0])[0])
    finally:
        sch.close()


def test_scheduler_close_cancels_running(eng):
    sch = Scheduler(eng, n_parallel=2, n_ctx=256)
    reqs = [_req(p, 240, stop_ids=set()) for p in PROMPTS[:3]]
    for r, _ in reqs:
        sch.submit(r)
    sch.close(timeout=0)
    for r, c in reqs:
        assert c.done.is_set()
        assert isinstance(c.last, DoneEvent) and c.last.stats.stop_reason in ("cancelled", "length")
    assert not sch._thread.is_alive()


def test_zero_tokens_processes_the_prompt_only(eng):
    sch = Scheduler(eng, n_parallel=1, n_ctx=128)
    try:
        r, c = _req(PROMPTS[0], 0)
        sch.submit(r)
        assert c.done.wait(60)
        assert c.last.tokens == [] and c.last.stats.stop_reason == "length"
        assert c.last.stats.prompt_tokens == len(PROMPTS[0])
    finally:
        sch.close()


def test_stop_strings_are_cut_and_never_sent(eng):
    free, fc = _req(PROMPTS[0], 24, stop_ids=set())
    sch = Scheduler(eng, n_parallel=2, n_ctx=128)
    try:
        sch.submit(free)
        assert fc.done.wait(60)
        text = fc.last.text
        assert len(text) > 6
        stop = text[3:6]  # a piece of what the model says greedily
        r, c = _req(PROMPTS[0], 24, stop_ids=set(), stop=[stop, "\x00never"])
        sch.submit(r)
        assert c.done.wait(60)
        assert c.last.stats.stop_reason == "stop"
        assert c.text == c.last.text == text[:text.find(stop)]
    finally:
        sch.close()


def test_prefix_reuse_only_for_a_continuation(eng):
    sch = Scheduler(eng, n_parallel=1, n_ctx=128)
    try:
        first, c1 = _req(PROMPTS[2], 6, stop_ids=set())
        sch.submit(first)
        assert c1.done.wait(60)
        assert first.reused == 0
        # the next turn: the whole previous prompt, the reply, more text
        cont = PROMPTS[2] + c1.last.tokens + [270, 271]
        second, c2 = _req(cont, 4, stop_ids=set())
        sch.submit(second)
        assert c2.done.wait(60)
        assert second.reused == len(PROMPTS[2]) + len(c1.last.tokens) - 1  # the last reply token was never fed
        assert c2.last.stats.prompt_tokens == len(cont) - second.reused
        # a different conversation sharing only the first tokens is processed in full
        other, c3 = _req(PROMPTS[2][:3] + [290, 291], 4, stop_ids=set())
        sch.submit(other)
        assert c3.done.wait(60)
        assert other.reused == 0
        # and so is the same prompt again (its numbers stay those of a fresh session)
        again, c4 = _req(PROMPTS[2][:3] + [290, 291], 4, stop_ids=set())
        sch.submit(again)
        assert c4.done.wait(60)
        assert again.reused == 0 and c4.last.tokens == c3.last.tokens
    finally:
        sch.close()


def test_active_snapshot_from_another_thread(eng):
    sch = Scheduler(eng, n_parallel=2, n_ctx=256)
    try:
        reqs = [_req(p, 200, stop_ids=set()) for p in PROMPTS[:3]]
        for r, _ in reqs:
            sch.submit(r)
        seen = []
        while not reqs[0][1].done.is_set() and len(seen) < 200:
            snap = sch.active()
            seen.extend(snap)
            if any(a.tokens > 2 for a in snap):
                break
            reqs[0][1].done.wait(0.01)
        assert {a.id for a in seen} <= {r.id for r, _ in reqs}
        busy = [a for a in seen if a.tokens > 2]
        assert busy and all(a.slot in (0, 1) and a.kv_nodes for a in busy)
        # each busy slot's KV bytes per node, measured from its pages: some, never more than its buffers
        sizes = {s.index: sum(b.nbytes for b in s.session.kv_layout.buffers()) for s in sch.slots}
        assert all(a.kv_bytes and 0 < sum(b for _, b in a.kv_bytes) <= sizes[a.slot] for a in busy)
        for r, _ in reqs:
            sch.cancel(r)
        for _, c in reqs:
            assert c.done.wait(60)
        assert sch.active() == []
    finally:
        sch.close()


class _Recorded:
    """The scheduler's model (a real `LocalModel` over the engine), with each call recorded; the
    first prompt waits at `hold` until the test lets it go (requests arriving meanwhile queue)."""

    def __init__(self, eng):
        from workbench.engine.scheduler import LocalModel
        self._m = LocalModel(eng)
        self.calls: list[tuple] = []
        self.hold = threading.Event()

    def __getattr__(self, name):
        return getattr(self._m, name)

    def prefill(self, seq, piece, picker, first, last):
        if not self.calls:
            self.hold.wait(60)
        self.calls.append(("prefill", len(piece)))
        return self._m.prefill(seq, piece, picker, first, last)

    def decode(self, seqs, tokens, pickers):
        self.calls.append(("decode", len(seqs)))
        return self._m.decode(seqs, tokens, pickers)


def test_prompts_that_wait_together_start_decoding_together(eng):
    """Requests that queue while a prompt is processed have their prompts processed in one
    iteration, then decode in one pass (not one joining per pass); a prompt whose piece would take
    the iteration past PREFILL_BATCH tokens waits for the next. Tokens as generate's."""
    from workbench.engine.scheduler import PREFILL_BATCH
    model = _Recorded(eng)
    sch = Scheduler(model, n_parallel=4, n_ctx=512)
    try:
        jobs = [_req(p, 5, stop_ids=set()) for p in PROMPTS[:4]]
        sch.submit(jobs[0][0])
        _until(lambda: jobs[0][0].state == "prompt")
        for r, _ in jobs[1:]:
            sch.submit(r)
        model.hold.set()
        for _, c in jobs:
            assert c.done.wait(120)
        first = model.calls.index(("decode", 4))
        assert model.calls[:2] == [("prefill", len(PROMPTS[0])), ("decode", 1)]
        assert sorted(model.calls[2:first]) == sorted(("prefill", len(p)) for p in PROMPTS[1:4])
        for p, (r, c) in zip(PROMPTS, jobs):
            s = eng.new_session(128)
            ref = list(s.generate(p, SamplingParams(temperature=0), 5, stop_ids=set()))[-1]
            s.close()
            assert c.last.tokens == ref.tokens
        # two prompts of more than half a piece: one per iteration, a decode pass between them
        model.calls.clear()
        model.hold.set()
        big = PREFILL_BATCH // 2 + 10
        longs = [_req([2] + [(7 * i + j) % 250 + 10 for j in range(big)], 2, stop_ids=set()) for i in range(3)]
        sch.submit(longs[0][0])
        _until(lambda: model.calls)
        for r, _ in longs[1:]:
            sch.submit(r)
        for _, c in longs:
            assert c.done.wait(120)
        prefills = [i for i, c in enumerate(model.calls) if c[0] == "prefill"]
        assert len(prefills) == 3 and all(b - a > 1 for a, b in zip(prefills, prefills[1:]))
    finally:
        sch.close()

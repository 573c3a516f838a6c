"""The engine's public API on a tiny model: streaming, sampling, chat with KV reuse, cancel, placement."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import (Chat, ContextFullError, DoneEvent, Engine, SamplingParams, TokenEvent)
from workbench.engine.engine import Placement
from workbench.engine.sampling import Sampler

PROMPT = [2, 270, 262, 280, 265, 285]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("api") / "tiny-gemma.gguf"
    write_tiny_model(path, TinySpec(arch="gemma3", qtype=T.Q4_0, n_layer=2, n_ctx=512))
    return str(path)


@pytest.fixture(scope="module")
def eng(model_path):
    e = Engine.load(model_path, placement=Placement(threads=2))
    yield e
    e.close()


def _run(session, prompt, params, n):
    events = list(session.generate(prompt, params, n))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    return done


def test_greedy_is_reproducible_and_streams_text(eng):
    a = _run(eng.new_session(128), PROMPT, SamplingParams(temperature=0), 12)
    b = _run(eng.new_session(128), PROMPT, SamplingParams(temperature=0), 12)
    assert a.tokens == b.tokens and len(a.tokens) >= 1
    assert a.text == eng.tokenizer.decode(a.tokens)
    assert a.stats.prompt_tokens == len(PROMPT) and a.stats.decode_tps >= 0


def test_same_seed_same_output_other_seed_differs(eng):
    p = dict(temperature=20.0, top_k=0, top_p=1.0, min_p=0.0)  # the tiny model is very peaked
    a = _run(eng.new_session(128), PROMPT, SamplingParams(seed=7, **p), 24)
    b = _run(eng.new_session(128), PROMPT, SamplingParams(seed=7, **p), 24)
    c = _run(eng.new_session(128), PROMPT, SamplingParams(seed=8, **p), 24)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


def test_sampler_filters():
    logits = np.array([5.0, 4.0, 3.0, -10.0, 1.0], dtype=np.float32)
    top1 = Sampler(SamplingParams(temperature=1.0, top_k=1, seed=0))
    assert {top1.sample(logits, []) for _ in range(20)} == {0}
    top2 = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=0))
    assert {top2.sample(logits, []) for _ in range(200)} == {0, 1}
    minp = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3, seed=0))
    assert {minp.sample(logits, []) for _ in range(200)} <= {0, 1}  # e^-1 = 0.37 >= 0.3; e^-2 < 0.3
    pen = Sampler(SamplingParams(temperature=0, repeat_penalty=10.0))
    assert pen.sample(logits, [0]) == 1
    for bad in (dict(temperature=-1), dict(top_p=0), dict(min_p=1.0), dict(top_k=-2)):
        with pytest.raises(ValueError):
            SamplingParams(**bad).validate()


def test_cancel_stops_within_one_token_and_cache_stays_consistent(eng):
    cancel = threading.Event()
    s = eng.new_session(256)
    got = []
    for ev in s.generate(PROMPT, SamplingParams(temperature=0), 50, cancel=cancel):
        if isinstance(ev, TokenEvent):
            got.append(ev.token)
            if len(got) == 3:
                cancel.set()
        else:
            done = ev
    assert done.stats.stop_reason == "cancelled" and len(done.tokens) == 3
    # the cache holds prompt + generated tokens: continuing equals a fresh run over the same text
    cont = _run(s, PROMPT + done.tokens, SamplingParams(temperature=0), 5)
    fresh = _run(eng.new_session(256), PROMPT + done.tokens, SamplingParams(temperature=0), 5)
    assert cont.tokens == fresh.tokens
    assert cont.stats.prompt_tokens <= 2  # only what was not cached yet


def test_chat_reuses_the_cache_and_keeps_history(eng):
    chat = Chat(eng, n_ctx=512)
    d1 = [e for e in chat.send("hello", SamplingParams(temperature=0), 8)][-1]
    d2 = [e for e in chat.send("the cat", SamplingParams(temperature=0), 8)][-1]
    assert [m.role for m in chat.messages] == ["user", "assistant", "user", "assistant"]
    # the second turn only prefilled the new part of the conversation
    full = len(chat.prompt_tokens())
    assert d2.stats.prompt_tokens < full - d1.stats.prompt_tokens
    chat.clear()
    assert chat.messages == [] and chat.session.kv.n == 0


def test_context_full_is_a_clear_error_and_sliding_keeps_going(eng):
    s = eng.new_session(16)
    with pytest.raises(ContextFullError):
        list(s.generate(list(range(2, 40)), SamplingParams(temperature=0), 4))
    chat = Chat(eng, n_ctx=64, slide=True)
    for i in range(6):
        list(chat.send("the cat sat", SamplingParams(temperature=0), 6))
    assert len(chat.prompt_tokens()) < 64
    strict = Chat(eng, n_ctx=48, slide=False)
    list(strict.send("the cat sat", SamplingParams(temperature=0), 4))
    with pytest.raises(ContextFullError):
        for _ in range(10):
            list(strict.send("the cat sat on the mat the dog", SamplingParams(temperature=0), 4))
    assert strict.messages[-1].role == "assistant"  # the refused turn was not kept half-done


@pytest.mark.parametrize("weights", ["mirror", "interleave", "slice", "auto"])
def test_generation_identical_in_every_mode_and_after_live_switch(model_path, eng, weights):
    ref = _run(eng.new_session(128), PROMPT, SamplingParams(temperature=0), 10).tokens
    e = Engine.load(model_path, placement=Placement(threads=2, weights=weights, kv="interleave"))
    try:
        assert _run(e.new_session(128), PROMPT, SamplingParams(temperature=0), 10).tokens == ref
        s = e.new_session(128)
        first = _run(s, PROMPT, SamplingParams(temperature=0), 4).tokens
        reports = e.switch(weights="none", kv="first-touch")
        assert reports and all(r.seconds >= 0 for r in reports)
        # the conversation survives the switch: continuing gives the same tokens as the reference
        cont = _run(s, PROMPT + first, SamplingParams(temperature=0), 6).tokens
        assert first + cont == ref
    finally:
        e.close()


def test_thread_count_does_not_change_logits(model_path, eng):
    """On one node every output is one worker's dot in llama.cpp's order: bit-identical."""
    one = Engine.load(model_path, placement=Placement(threads=1))
    try:
        ids = list(range(2, 120))  # longer than several KV position blocks
        a = one.new_session(256).eval(ids, logit_rows=slice(0, len(ids)))
        b = eng.new_session(256).eval(ids, logit_rows=slice(0, len(ids)))
        np.testing.assert_array_equal(a, b)
        # long enough that attention is spread over the workers, in prefill and in decode
        long = [2 + (i * 7) % 280 for i in range(500)]
        s1, s2 = one.new_session(512), eng.new_session(512)
        np.testing.assert_array_equal(s1.eval(long), s2.eval(long))
        for t in (5, 9, 11):
            np.testing.assert_array_equal(s1.eval([t]), s2.eval([t]))
    finally:
        one.close()


def test_cancel_during_prompt_processing(eng):
    cancel = threading.Event()
    cancel.set()
    s = eng.new_session(512)
    events = list(s.generate(list(range(2, 200)), SamplingParams(temperature=0), 5, cancel=cancel))
    assert len(events) == 1 and events[0].stats.stop_reason == "cancelled"
    # the session still works afterwards and gives the same answer as a fresh one
    a = _run(s, PROMPT, SamplingParams(temperature=0), 4).tokens
    assert a == _run(eng.new_session(512), PROMPT, SamplingParams(temperature=0), 4).tokens


@pytest.mark.parametrize("text", ["", "\x00\x01\x1b[31m\x7f", "\udcff\udcfe broken utf-8", "<start_of_turn>user",
                                  "x" * 100_000])
def test_bad_prompts_are_handled(eng, text):
    tok = eng.tokenizer
    ids = tok.encode(text)
    assert all(0 <= i < tok.n_vocab for i in ids)
    if "<start_of_turn>" in text:  # looks special, but is plain text unless asked
        assert tok.token_id("<start_of_turn>") not in ids
        assert tok.token_id("<start_of_turn>") in tok.encode(text, parse_special=True)
    chat = Chat(eng, n_ctx=256, slide=True)
    try:
        for _ in chat.send(text, SamplingParams(temperature=0), 3):
            pass
    except ContextFullError as e:
        assert len(text) == 100_000 and "does not fit" in str(e) or "no longer fits" in str(e)
    # whatever happened, the engine still answers
    assert _run(eng.new_session(64), PROMPT, SamplingParams(temperature=0), 2).tokens


def test_a_chat_template_that_raises_is_reported(eng):
    from workbench.engine.chat import ChatFormatter, ChatTemplateError, Message
    bad = ChatFormatter("{{ raise_exception('no system role') }}", "llama", set(), "<s>", "</s>")
    with pytest.raises(ChatTemplateError, match="no system role"):
        bad.render([Message("user", "hi")])
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatFormatter("{% for %}", "llama", set(), "<s>", "</s>")
    loop = ChatFormatter("{{ messages[0].content.__class__.__mro__ }}", "llama", set(), "<s>", "</s>")
    with pytest.raises(ChatTemplateError):  # the sandbox refuses attribute access like this
        loop.render([Message("user", "hi")])


def test_switch_during_generation_is_serialised(model_path):
    e = Engine.load(model_path, placement=Placement(threads=2))
    try:
        ref = _run(e.new_session(128), PROMPT, SamplingParams(temperature=0), 30).tokens
        s = e.new_session(128)
        out, switched = [], threading.Event()

        def switch():
            e.switch(weights="interleave", kv="interleave")
            switched.set()
        t = None
        for ev in s.generate(PROMPT, SamplingParams(temperature=0), 30):
            if isinstance(ev, TokenEvent):
                out.append(ev.token)
                if len(out) == 2:
                    t = threading.Thread(target=switch)
                    t.start()
                    assert not switched.wait(0.2)  # it waits for the generation to finish
        t.join(30)
        assert switched.is_set() and out == ref
        assert e.placement.weights == "interleave" and e.placement.kv == "interleave"
        assert _run(e.new_session(128), PROMPT, SamplingParams(temperature=0), 30).tokens == ref
    finally:
        e.close()


def test_refused_switch_keeps_the_previous_placement(model_path):
    from workbench.numa.budget import BudgetError
    e = Engine.load(model_path, placement=Placement(threads=2, weights="none"))
    try:
        s = e.new_session(128)
        first = _run(s, PROMPT, SamplingParams(temperature=0), 4).tokens
        e.placement.budget = 1 << 16  # 64 KiB per node: a new KV cache cannot fit
        with pytest.raises(BudgetError, match="need"):
            e.switch(kv="interleave")
        e.placement.budget = None
        assert e.placement.kv == "first-touch"
        cont = _run(s, PROMPT + first, SamplingParams(temperature=0), 4).tokens
        ref = _run(e.new_session(128), PROMPT, SamplingParams(temperature=0), 8).tokens
        assert first + cont == ref
    finally:
        e.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_skipping_slid_out_values_changes_no_bit(model_path, eng, monkeypatch, threads):
    """Decode on sliding-window layers skips the softmax, probabilities and values of keys that
    left the window (bit-exact), on the calling thread alone and through the crew."""
    from workbench.engine import attention
    e = eng if threads == 2 else Engine.load(model_path, placement=Placement(threads=1))
    try:
        long = [2 + (i * 11) % 280 for i in range(300)]  # window 8: most keys slid out
        fast = e.new_session(512)
        fast.eval(long)
        got = [fast.eval([t]) for t in (5, 9, 11)]
        monkeypatch.setattr(attention, "SKIP_SLID_VALUES", False)
        full = e.new_session(512)
        full.eval(long)
        for t, g in zip((5, 9, 11), got):
            np.testing.assert_array_equal(full.eval([t]), g)
    finally:
        if e is not eng:
            e.close()


@pytest.mark.parametrize("threads,owners", [(1, 1), (2, 1), (2, 2)])
def test_prompt_skips_slid_out_keys_without_changing_a_bit(tmp_path_factory, monkeypatch, threads, owners):
    """A prompt at depth on sliding-window layers computes no dots and no value products for
    keys that slid out of each piece's window (the full cache before: Gemma 3 at depth 16384
    scored every global-sized row on its 512-wide windows); the logits keep every bit, with
    one owner or the cache split between two, at 1 and 2 threads."""
    from workbench.engine import attention, kernels
    from workbench.engine.engine import Engine as E
    path = tmp_path_factory.mktemp("swa") / "tiny-gemma-w100.gguf"
    # a window of 100: each output sums ~100 terms, so a term moved to another lane shows
    write_tiny_model(path, TinySpec(arch="gemma3", qtype=T.Q4_0, n_layer=2, n_ctx=512, sliding_window=100))
    if owners == 2:
        monkeypatch.setattr(E, "_owners", lambda self: [[0], [1]])
    e = Engine.load(str(path), placement=Placement(threads=threads))
    try:
        assert e.new_session(16).kv.n_workers == owners
        prompt = [2 + (i * 7) % 280 for i in range(400)]
        matmat, skipped = kernels.matmat, []

        def spy(qtype, w, x, out, lo, hi):
            if qtype == attention.F16 and lo > 0:
                skipped.append(lo)
            return matmat(qtype, w, x, out, lo, hi)
        monkeypatch.setattr(kernels, "matmat", spy)
        fast = e.new_session(512)
        got = fast.eval(prompt, logit_rows=slice(0, 400), batch=128)
        assert skipped and max(skipped) >= 192 // owners  # later pieces start past their slid keys (slots per owner)
        monkeypatch.setattr(attention, "SKIP_SLID_PROMPT", False)
        full = e.new_session(512)
        np.testing.assert_array_equal(full.eval(prompt, logit_rows=slice(0, 400), batch=128), got)
    finally:
        e.close()


def _decoders():
    from workbench.engine import attention
    return attention._DECODERS


def test_two_kv_owners_decode_through_the_crew(model_path, eng, monkeypatch):
    """Two KV owners (as on two nodes): one-token attention runs as crew chunks pinned to each
    owner's workers; bit-identical to the general path (Python hand-offs), and equal to one
    owner up to summation order."""
    from workbench.engine import runtime
    from workbench.engine.engine import Engine as E
    monkeypatch.setattr(E, "_owners", lambda self: [[0], [1]])
    two = Engine.load(model_path, placement=Placement(threads=2))
    try:
        long = [2 + (i * 13) % 280 for i in range(200)]
        ref, crewed, plain = eng.new_session(512), two.new_session(512), two.new_session(512)
        assert crewed.kv.n_workers == 2
        np.testing.assert_allclose(ref.eval(long), crewed.eval(long), rtol=1e-3, atol=1e-3)
        plain.eval(long)
        for t in (5, 9, 11, 40, 7, 3):
            a = crewed.eval([t])
            np.testing.assert_allclose(ref.eval([t]), a, rtol=1e-3, atol=1e-3)
            monkeypatch.setattr(runtime, "USE_CREW", False)
            np.testing.assert_array_equal(plain.eval([t]), a)
            monkeypatch.setattr(runtime, "USE_CREW", True)
        assert two.rt.crew is not None
        two.rt.release_crew()  # it stays launched between decoded tokens (runtime.LINGER)
        assert not two.rt.crew.active
        assert two.rt.crew.lead in {key[1] for key in _decoders() if isinstance(key, tuple)}  # owners' path ran
    finally:
        two.close()


def test_starved_crew_backs_off_to_solo_passes(eng, monkeypatch):
    """When the caller mostly waits for the crew (another process holds a worker's CPU), the
    next tokens run solo: the caller computes every chunk (those pinned to the parked workers
    too) and waits for nobody; outputs do not change."""
    from workbench.engine import crew as crew_mod
    from workbench.engine import runtime
    assert eng.rt.n_workers > 1
    # (the prompts' passes without the crew: this counts the decoded tokens' passes)
    monkeypatch.setattr(runtime, "PROMPT_CREW", False)
    starts: list[bool] = []
    orig_start = crew_mod.Crew.start
    monkeypatch.setattr(crew_mod.Crew, "start", lambda self, solo=False: starts.append(solo) or orig_start(self, solo))
    # waits are reported as none (healthy) or 10 s a pass (starved), whatever this machine's load:
    # the runtime reads the crew's wait counter at the start and the end of each pass
    calls = itertools.count()
    healthy = lambda self: 0.0  # noqa: E731
    starved = lambda self: 10.0 * next(calls)  # noqa: E731
    monkeypatch.setattr(crew_mod.Crew, "waited", healthy)
    eng.rt.crew_backoff, eng.rt._starved, eng.rt._backoff_next = 0, 0, runtime.CREW_BACKOFF
    ref = eng.new_session(256)
    ref_logits = [ref.eval(PROMPT)] + [ref.eval([t]) for t in (5, 6, 7, 8, 9)]
    assert eng.rt.crew_backoff == 0
    monkeypatch.setattr(crew_mod.Crew, "waited", starved)  # as if each pass waited 10 s
    s = eng.new_session(512)
    got = [s.eval(PROMPT)]
    for i, t in enumerate((5, 6, 7, 8, 9)):
        got.append(s.eval([t]))
        if i < runtime.CREW_STARVED - 1:
            assert eng.rt.crew_backoff == 0
    assert eng.rt.crew_backoff == runtime.CREW_BACKOFF - 2  # backed off after 3, then 2 tokens solo
    assert starts[-2:] == [True, True] and not any(starts[:-2])
    assert not eng.rt.crew.active and eng.rt.crew.ctl[crew_mod.SEQ] == 0  # no job was posted solo
    for a, b in zip(ref_logits, got):
        np.testing.assert_array_equal(a, b)
    # the retry starves again: twice as long a back-off
    for t in range(runtime.CREW_BACKOFF - 2 + runtime.CREW_STARVED):
        s.eval([10 + t % 50])
    assert eng.rt.crew_backoff == 2 * runtime.CREW_BACKOFF
    # a healthy pass after the back-off resets it
    monkeypatch.setattr(crew_mod.Crew, "waited", healthy)
    for t in range(2 * runtime.CREW_BACKOFF + 1):
        s.eval([10 + t % 50])
    assert eng.rt.crew_backoff == 0 and eng.rt._backoff_next == runtime.CREW_BACKOFF


def test_the_crew_stays_launched_between_tokens_and_yields_to_the_pool(eng, monkeypatch):
    """After a decoded token the crew's workers stay in their compiled loop (no thread hand-off
    before the next token); any other use of the pool -- another thread asking where the workers
    run, a prompt -- releases them first, and so does the watchdog once no token came for
    LINGER_IDLE. Logits do not change whichever way the crew was started."""
    import time as _time
    from workbench.engine import runtime
    rt = eng.rt
    assert rt.n_workers > 1
    ref = eng.new_session(256)
    ref.eval(PROMPT)
    monkeypatch.setattr(runtime, "LINGER", False)
    want = [ref.eval([t]).copy() for t in (5, 6, 7, 8)]
    assert not rt.crew.active  # released after every pass
    monkeypatch.setattr(runtime, "LINGER", True)
    monkeypatch.setattr(runtime, "LINGER_IDLE", 3600.0)  # the watchdog stays out of the first part
    # on a busy machine a token may take longer than LINGER_MAX, or its waits count as a starved
    # crew (which runs the next tokens solo, not lingering): neither is what this test is about
    monkeypatch.setattr(runtime, "LINGER_MAX", 3600.0)
    monkeypatch.setattr(runtime, "CREW_STARVED", 1 << 30)
    rt.crew_backoff = 0
    s = eng.new_session(256)
    s.eval(PROMPT)
    got = [s.eval([5]).copy()]
    crew = rt.crew
    assert crew.active and rt._lingering
    seen = []
    t = threading.Thread(target=lambda: seen.append(eng.pool.check()))
    t.start()
    t.join(timeout=30)
    assert not t.is_alive() and len(seen[0]) == rt.n_workers  # the other thread got the workers
    assert not crew.active and not rt._lingering
    got.append(s.eval([6]).copy())
    assert crew.active
    s2 = eng.new_session(256)
    long = (PROMPT * 100)[:runtime.TOKEN_SPLIT_MIN * rt.n_workers]
    s2.eval(long)  # a long prompt's pass uses the pool its own way: the crew leaves first
    assert not crew.active
    got.append(s.eval([7]).copy())
    monkeypatch.setattr(runtime, "LINGER_IDLE", 0.05)
    got.append(s.eval([8]).copy())
    deadline = _time.monotonic() + 20
    while crew.active and _time.monotonic() < deadline:
        _time.sleep(0.01)
    assert not crew.active and not rt._lingering  # the watchdog released it
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_top_k_ids_rank_by_logit_then_id():
    """The compiled top-k (one pass, a k-entry heap) keeps the k largest logits best first, and
    equal logits by the lower id, on ties at the cut too."""
    from workbench.engine.sampling import top_k_ids
    rng = np.random.default_rng(3)
    # small vocabularies (one heap pass) and large ones (the blocks' floor first; a short last block)
    for n, k in ((10, 3), (1000, 40), (50, 50), (7, 1), (300, 17), (49152, 40), (20000 + 37, 1),
                 (262144 + 5, 40), (6000, 200)):
        for trial in range(6):
            lg = (rng.integers(-3, 3, n) if trial % 2 else rng.standard_normal(n)).astype(np.float32)
            if trial == 4:   # one high logit late, the rest flat: ties at the floor everywhere
                lg = np.zeros(n, np.float32)
                lg[n - 2] = 1.0
            want = np.lexsort((np.arange(n), -lg))[:k]
            np.testing.assert_array_equal(top_k_ids(lg, k), want)
    # a broken model's NaN logits: k distinct ids in range, no crash (the compiled code does not
    # check bounds)
    lg = rng.standard_normal(49152).astype(np.float32)
    lg[::7] = np.nan
    ids = top_k_ids(lg, 40)
    assert len(set(ids.tolist())) == 40 and ids.min() >= 0 and ids.max() < 49152


def test_compiled_sampler_draws_what_the_numpy_steps_drew():
    """The chain after the penalties (top-k, top-p, min-p, temperature, the draw) runs compiled
    in one call; with the same seed it picks the token that the same steps written with NumPy
    calls pick (its pairwise sum, `Generator.choice`'s cumulative draw), on vocabularies small and
    large, ties included."""
    from workbench.engine.sampling import Sampler, SamplingParams, pairwise_sum, top_k_ids

    def numpy_steps(p, rng, logits):
        idx = top_k_ids(logits, p.top_k) if 0 < p.top_k < len(logits) else np.argsort(-logits, kind="stable")
        vals = logits[idx].astype(np.float64)
        if p.top_p < 1.0:
            probs = np.exp(vals - vals[0])
            probs /= probs.sum()
            cut = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            idx, vals = idx[:cut], vals[:cut]
        if p.min_p > 0:
            keep = vals >= vals[0] + np.log(p.min_p)
            idx, vals = idx[keep], vals[keep]
        vals = vals / p.temperature
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        return int(idx[rng.choice(len(idx), p=probs)])

    rng0 = np.random.default_rng(11)
    for case in range(300):
        n = int(rng0.choice([50, 300, 49152]))
        logits = (rng0.standard_normal(n) * float(rng0.choice([0.5, 2.0, 5.0]))).astype(np.float32)
        if case % 5 == 0:
            logits = np.round(logits, 1)
        p = SamplingParams(temperature=float(rng0.choice([0.2, 0.8, 1.5])), top_k=int(rng0.choice([0, 5, 40, 1000])),
                           top_p=float(rng0.choice([1.0, 0.95, 0.5])), min_p=float(rng0.choice([0.0, 0.05, 0.2])),
                           seed=case)
        s, ref = Sampler(p), np.random.default_rng(case)
        assert [s.sample(logits, []) for _ in range(3)] == [numpy_steps(p, ref, logits) for _ in range(3)]
    for m in (1, 7, 8, 9, 100, 128, 129, 1000, 49152):   # NumPy's own sum, to the bit
        x = np.random.default_rng(m).random(m)
        assert pairwise_sum(x, 0, m) == x.sum()

"""Decode's compiled attention sub-layer (`token_attention`) against the general path, bit for bit.

A decoded token's attention (q/k/v products, biases, q/k norms, RoPE, attention over the cache,
output product) takes one compiled call with the crew; the step-by-step path must give the same
logits to the bit, for every family switch the block takes (biases, QK-norm, NEOX or normal RoPE,
query prescaling, a sliding window crossed) and at 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine
from workbench.engine.engine import Placement

PROMPT = [5, 17, 29, 3, 41]


def _decode(path: str, threads: int, compiled: bool, n: int = 14, layers: bool = True, by: dict | None = None,
            tokens: bool = True, program: bool = True) -> tuple[list[np.ndarray], int]:
    """Logits of a prompt and n decoded tokens, and how many layers took a compiled call (the
    attention sub-layer's, or a MoE layer's whole; `layers` False: not the latter; `tokens` False:
    not a token's every layer at once; `program` False: not from the token id to the logits);
    `by` gets the count per call."""
    eng = Engine.load(path, placement=Placement(threads=threads))
    by = {} if by is None else by
    try:
        rt = eng.rt
        taken = [0]

        def spy_on(name: str, on: bool) -> None:
            real = getattr(rt, name)

            def spy(*a, **k):
                if not on:
                    return None
                o = real(*a, **k)
                taken[0] += o is not None
                by[name] = by.get(name, 0) + (o is not None)
                return o
            setattr(rt, name, spy)
        spy_on("attention_token", compiled)
        spy_on("layer_token", compiled and layers)
        spy_on("token_layers", compiled and layers and tokens)
        spy_on("token_program", compiled and layers and tokens and program)
        s = eng.new_session(64)
        out = [s.eval(PROMPT).copy()]
        for i in range(n):
            out.append(s.eval([int(np.argmax(out[-1])) if i % 2 else 7 + i]).copy())
        return out, taken[0]
    finally:
        eng.close()


def _every_path(path: str, threads: int) -> tuple:
    """Decoded logits by the token program, by `token_layers`, by `layer_token`, by the sub-layers'
    calls and by the general path, and (the calls taken by each of the first three, the sub-layer
    calls taken, the compiled calls the general path took)."""
    calls, layer_calls, per_layer = {}, {}, {}
    program, _ = _decode(path, threads, True, by=calls)
    token, _ = _decode(path, threads, True, by=layer_calls, program=False)
    whole, _ = _decode(path, threads, True, by=per_layer, tokens=False)
    parts, taken_parts = _decode(path, threads, True, layers=False)
    general, none = _decode(path, threads, False)
    return program, token, whole, parts, general, (calls, layer_calls, per_layer, taken_parts, none)


def _all_equal(*runs: list[np.ndarray]) -> None:
    for step in zip(*runs):
        assert all(np.array_equal(step[0], other) for other in step[1:])


@pytest.mark.parametrize("arch,qtype", [("gemma3", T.Q8_0), ("qwen3", T.Q4_K), ("qwen2", T.Q8_0),
                                        ("llama", T.Q6_K), ("qwen3moe", T.Q4_K)])
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_attention_equals_general_path(tmp_path, arch, qtype, threads):
    path = tmp_path / f"{arch}.gguf"
    extra = dict(n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256) if arch == "qwen3moe" else {}
    write_tiny_model(path, TinySpec(arch=arch, qtype=qtype, n_layer=2, seed=11, **extra))
    fast, taken = _decode(str(path), threads, True)
    slow, none = _decode(str(path), threads, False)
    # every decoded token took one call for all its layers (from its id to its logits)
    assert none == 0 and taken == 14
    for a, b in zip(fast, slow):
        assert a.dtype == np.float32 and np.array_equal(a, b)


@pytest.mark.parametrize("fused,qtype", [(False, T.Q4_K), (True, T.Q8_0)])
@pytest.mark.parametrize("threads", [1, 2])
def test_whole_moe_layer_in_one_call_equals_its_sub_layers(tmp_path, fused, qtype, threads):
    """`Runtime.token_program` (a token from its id to its logits in one compiled call),
    `token_layers` (a token's every layer in one compiled call) and `layer_token`
    (attention, residual adds, norms and the routed FFN of one layer) give the same logits to the bit
    as the sub-layers' own calls and as the general path, with separate and fused gate/up experts;
    every decoded token takes the one call."""
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=qtype, n_layer=3, seed=4, n_expert=8, n_expert_used=2,
                                    n_ff=256, n_ff_exp=256, fuse_gate_up=fused))
    program, token, whole, parts, general, (calls, layer_calls, per_layer, taken_parts, none) = \
        _every_path(str(path), threads)
    assert calls == {"token_program": 14}  # (one call a token: the others were not called)
    assert layer_calls == {"token_layers": 14}
    assert per_layer == {"layer_token": 14 * 3}
    assert taken_parts == 14 * 3 and none == 0
    _all_equal(program, token, whole, parts, general)


@pytest.mark.parametrize("arch,qtype", [("gemma3", T.Q8_0), ("llama", T.Q4_K)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_dense_token_in_one_call_equals_its_layers(tmp_path, arch, qtype, threads):
    """A dense model's decoded token: `token_program`, `token_layers` and `layer_token` (with the
    gated FFN in one call, `dense_token`) give the same logits to the bit as the sub-layers' calls
    and the general path. Gemma 3 takes every switch: post-attention and post-FFN norms, five
    sliding-window layers and a global one with RoPE bases of their own (10000 and 1e6), GELU, the
    embedding scale; the Llama file SiLU and a K-quant."""
    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(path, TinySpec(arch=arch, qtype=qtype, n_layer=6 if arch == "gemma3" else 2, seed=5,
                                    rope_base=1e6 if arch == "gemma3" else 10000.0))
    n_layer = 6 if arch == "gemma3" else 2
    program, token, whole, parts, general, (calls, layer_calls, per_layer, taken_parts, none) = \
        _every_path(str(path), threads)
    assert calls == {"token_program": 14} and layer_calls == {"token_layers": 14}
    assert per_layer == {"layer_token": 14 * n_layer}
    assert taken_parts == 14 * n_layer and none == 0
    _all_equal(program, token, whole, parts, general)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_token_call_journals_its_routing_and_ends_with_the_output_product(tmp_path, threads):
    """The one-call token path writes each layer's routed experts to a journal that RoutingStats
    reads in bulk (half full, at a snapshot): over 300 tokens -- the journal wraps -- the hits, the
    bytes per node and the step imbalance equal those of the layer-by-layer path, which records
    every layer from Python, also across a prompt recorded between tokens. The output product runs
    inside the same call (no one-row `linear` call of the output matrix)."""
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=T.Q8_0, n_layer=2, seed=8, n_expert=8, n_expert_used=2,
                                    n_ff=256, n_ff_exp=256))
    snaps: dict[bool, list] = {True: [], False: []}
    linear_calls: dict[bool, int] = {}
    logits: dict[bool, list] = {True: [], False: []}
    for tokens in (True, False):
        eng = Engine.load(str(path), placement=Placement(threads=threads))
        try:
            rt = eng.rt
            if not tokens:
                rt.token_layers = rt.token_program = lambda *a, **k: None
            real_linear, n_linear = rt.linear, [0]

            def linear(x, names, *a, **k):
                n_linear[0] += x.shape[0] == 1 and eng.model.output_name in names  # a decoded token's logits
                return real_linear(x, names, *a, **k)
            s = eng.new_session(256)
            s.eval(PROMPT)
            rt.linear = linear
            for i in range(300):
                if s.kv.n == 200:  # a prompt between tokens: recorded from Python, after the journal's rows
                    s.reset()
                    s.eval(PROMPT)
                out = s.eval([3 + (i * 7) % 200])
                if i in (20, 150, 299):
                    snaps[tokens].append(eng.routing())
                    logits[tokens].append(out.copy())
            linear_calls[tokens] = n_linear[0]
        finally:
            eng.close()
    assert linear_calls[True] == 1 and linear_calls[False] == 301  # 1: the second prompt's last row
    for a, b in zip(logits[True], logits[False]):
        assert np.array_equal(a, b)
    for a, b in zip(snaps[True], snaps[False]):
        assert a.window == b.window and np.array_equal(a.hits, b.hits)
        assert a.node_bytes == pytest.approx(b.node_bytes) and a.step_imbalance == pytest.approx(b.step_imbalance)
    assert snaps[True][-1].window == 256 and snaps[True][-1].hits.sum() == 256 * 2 * 2


def test_the_token_program_scales_the_embedding_as_the_python_path(tmp_path, monkeypatch):
    """A family that scales its embeddings (Gemma's sqrt(n_embd)): the token program's prologue
    gives the same logits to the bit as the Python embedding + `token_layers`."""
    from workbench.engine.models.qwen3moe import Qwen3MoE
    monkeypatch.setattr(Qwen3MoE, "embed_scale", True)
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=T.Q8_0, n_layer=2, seed=9, n_expert=8, n_expert_used=2,
                                    n_ff=256, n_ff_exp=256))
    calls: dict = {}
    program, _ = _decode(str(path), 2, True, n=6, by=calls)
    layers, _ = _decode(str(path), 2, True, n=6, program=False)
    assert calls == {"token_program": 6}
    for a, b in zip(program, layers):
        assert np.array_equal(a, b)


def test_typed_layers_keeps_the_layers_and_refuses_mixed_types():
    """The layers' typed list (built one layer per compiled call, so its compile does not grow
    with the layer count) holds the layers in order, the same arrays; layers of different types
    raise numba's TypingError (the runtime then goes layer by layer)."""
    import numba
    from workbench.engine.token_layer import typed_layers
    a = [np.arange(4, dtype=np.float32) + i for i in range(5)]
    layers = tuple((a[i], np.int64(i), (a[i][:2], 0.5 * i)) for i in range(5))
    out = typed_layers(layers)
    assert len(out) == 5
    for i, (arr, n, (view, f)) in enumerate(out):
        assert n == i and f == 0.5 * i
        assert np.shares_memory(arr, a[i]) and np.array_equal(view, a[i][:2])
    with pytest.raises(numba.core.errors.TypingError):
        typed_layers((layers[0], (np.zeros((2, 2), dtype=np.float32), np.int64(1), (a[0][:2], 1.0))))


def test_the_token_program_compiles_its_layers_into_itself(tmp_path):
    """The layer loop and the layer function are compiled into the token program (numba's
    inline="always"), not on their own and then once more inside it: a fresh install's first
    decoded token of a mixture-of-experts model spent ~13 s of its ~70 s optimizing those copies.
    The layer-by-layer path's own layer function is a separate one that Python calls."""
    from workbench.engine import token_layer
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=T.Q8_0, n_layer=2, seed=8, n_expert=8, n_expert_used=2,
                                    n_ff=256, n_ff_exp=256))
    eng = Engine.load(str(path), placement=Placement(threads=1))
    try:
        s = eng.new_session(64)
        s.eval(PROMPT)
        s.eval([5])
        s.eval([6])
        programs = list(token_layer._TOKENS.values())
        assert any(p.signatures for p in programs)  # the token program ran
        # the token program's layer function was never compiled on its own (a caller that does not
        # inline it compiles it first); the layer-by-layer path has its own, which Python calls
        inlined = [fn for (_a, _f, inline), fn in token_layer._LAYERS.items() if inline]
        assert inlined and all(not fn.signatures for fn in inlined)
    finally:
        eng.close()


def test_a_token_links_its_jobs_in_the_order_it_posts_them(tmp_path):
    """Each crew job of a decoded token names the next one (`crew.link`), so whoever runs out of
    a job's chunks first reads its rows of the next: q/k/v -> keys -> values -> attention output
    -> gate/up -> down -> the next layer's q/k/v, the last layer's down -> the output product -> the
    next token's first q/k/v (a worker waiting through the Python between two tokens reads ahead
    along the links, `READ_AHEAD_BYTES` in all)."""
    import ctypes

    from workbench.engine.crew import T_NEXT_C, T_NEXT_NC, T_NEXT_T
    path = tmp_path / "llama.gguf"
    write_tiny_model(path, TinySpec(arch="llama", n_layer=2))
    eng = Engine.load(str(path), placement=Placement(threads=2))
    try:
        s = eng.new_session(64)
        s.eval(PROMPT)
        s.eval([9])
        jobs = {names: g.job for names, g in eng.rt._groups.items() if g.job is not None}

        def job(suffix: str) -> np.ndarray:
            return next(j.tasks for names, j in jobs.items() if names[0].endswith(suffix))

        def after(tasks: np.ndarray, hops: int = 1) -> int:
            addr = tasks.ctypes.data
            for _ in range(hops):
                row = np.ctypeslib.as_array((ctypes.c_int64 * tasks.shape[1]).from_address(addr))
                assert row[T_NEXT_T] != 0 and row[T_NEXT_C] != 0 and row[T_NEXT_NC] > 0
                addr = int(row[T_NEXT_T])
            return addr

        for il in range(2):
            assert after(job(f"blk.{il}.attn_q.weight"), 3) == job(f"blk.{il}.attn_output.weight").ctypes.data
            assert after(job(f"blk.{il}.attn_output.weight")) == job(f"blk.{il}.ffn_gate.weight").ctypes.data
            assert after(job(f"blk.{il}.ffn_gate.weight")) == job(f"blk.{il}.ffn_down.weight").ctypes.data
        assert after(job("blk.0.ffn_down.weight")) == job("blk.1.attn_q.weight").ctypes.data
        assert after(job("blk.1.ffn_down.weight")) == job("token_embd.weight").ctypes.data
        assert after(job("token_embd.weight")) == job("blk.0.attn_q.weight").ctypes.data   # the next token
    finally:
        eng.close()


MIXED = {   # layers whose products take different activation formats (Q8_0's and Q8_K's), as the
    # per-tensor mixes of llama.cpp's Q4_K_M rules and of hand-tuned quantizations give
    "llama": (("blk.0.attn_v.weight", T.Q8_0), ("blk.1.ffn_down.weight", T.Q8_0), ("blk.2.attn_q.weight", T.Q5_0),
              ("blk.2.ffn_gate.weight", T.Q8_0)),
    "qwen3moe": (("blk.0.attn_v.weight", T.Q8_0), ("blk.1.ffn_down_exps.weight", T.Q8_0),
                 ("blk.2.ffn_gate_exps.weight", T.Q8_0)),
}


@pytest.mark.parametrize("arch", sorted(MIXED))
@pytest.mark.parametrize("threads", [1, 2])
def test_a_file_mixing_activation_formats_decodes_each_token_in_one_call(tmp_path, arch, threads):
    """Q8_0-family and K-quant tensors side by side in a layer, and differently from layer to layer
    (a gate in Q8_0 beside its up in Q4_K included): every decoded token still takes the one call
    from its id to its logits, with the general path's logits to the bit."""
    path = tmp_path / f"{arch}-mixed.gguf"
    extra = dict(n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256) if arch == "qwen3moe" else {}
    write_tiny_model(path, TinySpec(arch=arch, qtype=T.Q4_K, n_layer=3, seed=9, types=MIXED[arch], **extra))
    calls = {}
    program, _ = _decode(str(path), threads, True, by=calls)
    general, none = _decode(str(path), threads, False)
    assert calls == {"token_program": 14} and none == 0
    _all_equal(program, general)


@pytest.mark.parametrize("n_kv, rows, n_slots, width, pos0, window", [
    (1, 16, 4096, 4096, 4095, 0),      # MLA: one kv head, 16 query rows, the whole cache visible
    (2, 4, 130, 192, 129, 0),          # a partly filled last block (zeros to the width)
    (1, 8, 300, 320, 299, 100),        # a sliding window: slots before it masked
    (1, 3, 70, 70, 69, 0),             # a capacity no multiple of the lanes (the rows copied out)
])
def test_one_owner_probabilities_in_one_pass_equal_the_four_steps(n_kv, rows, n_slots, width, pos0, window):
    """`one_owner_probs` (a decoded token's softmax, each exp computed once) gives the f16
    probabilities of softmax_stats, merge_stats, probabilities and round_to_f16 to the bit, on a
    64-byte line."""
    from workbench.engine.attention import merge_stats, one_owner_probs, probabilities, softmax_stats
    from workbench.engine.kernels.activations import round_to_f16
    rng = np.random.default_rng(n_slots)
    raw = (rng.standard_normal((n_kv, rows, n_slots)) * 4).astype(np.float32)
    scale = 0.0883
    a = raw.copy()
    mxs = np.full((1, n_kv, rows), -np.inf, np.float32)
    sms = np.zeros((1, n_kv, rows), np.float64)
    softmax_stats(a, 0, 1, n_slots, pos0, rows, window, scale, mxs[0], sms[0], 0)
    big_m = np.empty((n_kv, rows), np.float32)
    inv_l = np.empty((n_kv, rows), np.float32)
    merge_stats(mxs, sms, big_m, inv_l)
    want = round_to_f16(probabilities(a, n_slots, width, big_m, inv_l).reshape(n_kv * rows, width))
    got = one_owner_probs(raw.copy(), n_slots, width, pos0, window, scale)
    assert got.shape == want.shape and got.flags.c_contiguous
    assert got.ctypes.data % 64 == 0
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_long_softmax_on_the_crew_keeps_the_callers_bits(tmp_path):
    """From `attention.PROBS_JOB_MIN` scores on, a decoded token's softmax over a one-owner cache
    goes to the crew (each query row whole on one worker): 16 query heads over one kv head past
    2048 positions. The logits at 2 threads equal those at 1 thread (the caller's path) to the bit,
    and each layer of such a token posts one job more than below the threshold."""
    from workbench.engine.attention import PROBS_JOB_MIN
    from workbench.engine.crew import TRACE_LEAD_N
    path = tmp_path / "heads.gguf"
    write_tiny_model(path, TinySpec(arch="llama", qtype=T.Q8_0, n_embd=256, n_head=16, n_head_kv=1, head_dim=64,
                                    n_layer=2, n_ctx=2304, seed=5))
    depth = PROBS_JOB_MIN // 16 + 40
    prompt = [int(t) for t in np.random.default_rng(3).integers(4, 200, depth)]
    logits, jobs = {}, {}
    for threads in (1, 2):
        eng = Engine.load(str(path), placement=Placement(threads=threads))
        try:
            s = eng.new_session(depth + 64)
            out = [s.eval(prompt[:64]).copy()]
            counts = []
            for i in range(2):   # below the threshold
                out.append(s.eval([9 + i]).copy())
            out.append(s.eval(prompt[64:]).copy())
            crew = None
            for i in range(4):   # past it
                if i == 2:
                    crew = eng.rt.crew
                    crew.trace()
                    n0 = 0
                out.append(s.eval([int(np.argmax(out[-1]))]).copy())
                if crew is not None:
                    counts.append(int(crew.ctl[TRACE_LEAD_N]) // 4 - n0)
                    n0 = int(crew.ctl[TRACE_LEAD_N]) // 4
            crew.stop_trace()
            s2 = eng.new_session(128)   # a short cache: jobs a token below the threshold
            s2.eval(prompt[:64])
            s2.eval([9])
            crew = eng.rt.crew
            crew.trace()
            s2.eval([10])
            below = int(crew.ctl[TRACE_LEAD_N]) // 4
            crew.stop_trace()
            logits[threads], jobs[threads] = out, (counts, below)
        finally:
            eng.close()
    _all_equal(logits[1], logits[2])
    past, below = jobs[2]
    assert past == [below + 2, below + 2]      # one softmax job a layer, 2 layers
    assert jobs[1][0] == [jobs[1][1]] * 2      # one thread: the caller's softmax, no job

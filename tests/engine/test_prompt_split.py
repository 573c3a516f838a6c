"""How a prompt's work is cut: products with the tokens shared out between workers
(runtime.TOKEN_SPLIT_MIN), and one worker's attention in pieces of rows (attention.SOLO_PIECE_BYTES).

Each worker prepares its own tokens' inputs and multiplies them by every row; the result must be
the bits one worker gives over all the tokens, whatever the token count (the repacked kernels take
columns in groups, and the last ones alone), and the split must really run: each worker prepares
a share of the tokens, none all of them.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine, kernels, runtime
from workbench.engine.engine import Placement

QKV = ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight")
GATE_UP = ("blk.1.ffn_gate.weight", "blk.1.ffn_up.weight")
N_EMBD = TinySpec().n_embd
GROUP = TinySpec().n_head // TinySpec().n_head_kv   # query rows a token per kv head


@pytest.fixture(scope="module", params=[T.Q4_0, T.Q4_K, T.Q5_0, T.Q6_K])
def engines(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("split") / f"tiny-{request.param.name}.gguf"
    write_tiny_model(path, TinySpec(arch="gemma3", qtype=request.param, n_layer=2, n_ctx=512))
    one = Engine.load(str(path), placement=Placement(threads=1))
    two = Engine.load(str(path), placement=Placement(threads=2))
    yield one, two
    one.close()
    two.close()


def _spy_prepare(monkeypatch) -> list[tuple[str, int]]:
    """(thread name, tokens) of every 2-D input preparation from now on."""
    seen: list[tuple[str, int]] = []
    real = kernels.prepare

    def prepare(t, x):
        if x.ndim == 2:
            seen.append((threading.current_thread().name, x.shape[0]))
        return real(t, x)
    monkeypatch.setattr(kernels, "prepare", prepare)
    return seen


@pytest.mark.parametrize("n", [64, 77, 130, 511])
def test_token_split_gives_one_workers_bits(engines, n, monkeypatch):
    one, two = engines
    x = np.random.default_rng(n).standard_normal((n, N_EMBD), dtype=np.float32)
    seen = _spy_prepare(monkeypatch)
    got = two.rt.linear(x, QKV)
    g2, u2, a2 = two.rt.gated(x, GATE_UP[0], GATE_UP[1], "gelu")
    # both workers prepared a share, at a multiple of TOKEN_ALIGN from the first token
    assert len({name for name, _ in seen}) == 2
    shares = sorted({m for _, m in seen})
    first = n // 2 // runtime.TOKEN_ALIGN * runtime.TOKEN_ALIGN
    assert shares == sorted({first, n - first}) and max(shares) < n
    monkeypatch.undo()
    want = one.rt.linear(x, QKV)
    g1, u1, a1 = one.rt.gated(x, GATE_UP[0], GATE_UP[1], "gelu")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    for a, b in ((g2, g1), (u2, u1), (a2, a1)):
        np.testing.assert_array_equal(a, b)


def test_few_tokens_split_the_rows(engines, monkeypatch):
    """Below TOKEN_SPLIT_MIN tokens a worker, the caller prepares the whole input once (a row
    split: each worker would otherwise read every weight for a few tokens); same bits."""
    one, two = engines
    n = runtime.TOKEN_SPLIT_MIN * 2 - 1
    x = np.random.default_rng(1).standard_normal((n, N_EMBD), dtype=np.float32)
    seen = _spy_prepare(monkeypatch)
    got = two.rt.linear(x, QKV)
    assert seen and all(m == n for _, m in seen)
    monkeypatch.undo()
    for a, b in zip(got, one.rt.linear(x, QKV)):
        np.testing.assert_array_equal(a, b)


def _spy_piece_rows(monkeypatch) -> list[int]:
    """Query rows of every one-pass prompt piece's softmax from now on."""
    from workbench.engine import attention
    calls: list[int] = []
    real = attention.prompt_rows_probs

    def probs(scores, out, n_slots, rows, *args):
        calls.append(rows)
        return real(scores, out, n_slots, rows, *args)
    monkeypatch.setattr(attention, "prompt_rows_probs", probs)
    return calls


def test_a_prompt_at_depth_in_one_pass_keeps_the_two_pass_bits(engines, monkeypatch):
    """A prompt over a one-owner cache runs each piece's scores, softmax and values in one pass
    (attention.ONE_PASS_PROMPT: the whole prompt's scores went to memory and back); the logits
    are those of the two passes (every row's softmax and values from all its scores), at 1 and 2
    threads, in pieces and whole, across the sliding window and at depth."""
    from workbench.engine import attention
    first = [2 + (i * 11) % 250 for i in range(150)]
    then = [3 + (i * 17) % 250 for i in range(230)]

    def run(eng):
        s = eng.new_session(512)
        return s.eval(first), s.eval(then)
    calls = _spy_piece_rows(monkeypatch)
    for eng in engines:
        for piece_bytes in (1, 1 << 40):
            monkeypatch.setattr(attention, "SOLO_PIECE_BYTES", piece_bytes)
            calls.clear()
            got = run(eng)
            assert sum(calls) == (len(first) + len(then)) * GROUP * 2   # every query row of both layers
            monkeypatch.setattr(attention, "ONE_PASS_PROMPT", False)
            calls.clear()
            want = run(eng)
            assert not calls
            monkeypatch.setattr(attention, "ONE_PASS_PROMPT", True)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)


def test_one_worker_attends_in_pieces_with_the_same_bits(engines, monkeypatch):
    """One worker takes a long prompt's attention in pieces of rows (attention.SOLO_PIECE_BYTES:
    the whole prompt's scores ran from memory); the logits are those of one piece."""
    from workbench.engine import attention
    one, _ = engines
    prompt = [2 + (i * 13) % 250 for i in range(200)]
    calls = _spy_piece_rows(monkeypatch)
    monkeypatch.setattr(attention, "SOLO_PIECE_BYTES", 1)   # CAUSAL_ROWS rows a piece
    pieces = one.new_session(512).eval(prompt)
    assert calls and max(calls) == attention.CAUSAL_ROWS
    calls.clear()
    monkeypatch.setattr(attention, "SOLO_PIECE_BYTES", 1 << 40)   # the whole prompt at once
    whole = one.new_session(512).eval(prompt)
    assert max(calls) > attention.CAUSAL_ROWS
    np.testing.assert_array_equal(pieces, whole)


def test_a_long_prompt_gives_one_workers_logits(engines):
    """A whole forward pass with the tokens shared out (the residual adds and norms around the
    FFN, QK-norm and RoPE after the q/k/v products run token-wise on each worker's rows): on one
    node the logits are one worker's to the bit, and a taps run's (every step whole) too."""
    one, two = engines
    prompt = [2 + (i * 7) % 250 for i in range(150)]
    want = one.new_session(512).eval(prompt)
    np.testing.assert_array_equal(two.new_session(512).eval(prompt), want)
    seen: list[str] = []
    two.model.tap = lambda name, value: seen.append(name)
    try:
        np.testing.assert_array_equal(two.new_session(512).eval(prompt), want)
    finally:
        two.model.tap = None
    assert "Qrope-0" in seen and "ffn_norm-1" in seen


def test_a_mixture_of_experts_prompt_gives_one_workers_logits(tmp_path, monkeypatch):
    """The experts' activation and the weighted sum over the routed slots run on the workers'
    token shares (`Runtime.token_rows`): the logits of a long prompt are one worker's to the bit."""
    path = tmp_path / "tiny-moe.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3moe", qtype=T.Q8_0, n_expert=8, n_expert_used=3, n_ff=256,
                                    n_ff_exp=128, n_ctx=512))
    one = Engine.load(str(path), placement=Placement(threads=1))
    two = Engine.load(str(path), placement=Placement(threads=2))
    try:
        shares: list[tuple[int, int]] = []   # the token ranges the work ran on
        real = two.rt.token_rows

        def token_rows(n, fn):
            def spy(t0, t1):
                shares.append((t0, t1))
                fn(t0, t1)
            return real(n, spy)
        monkeypatch.setattr(two.rt, "token_rows", token_rows)
        prompt = [2 + (i * 11) % 250 for i in range(150)]
        np.testing.assert_array_equal(two.new_session(512).eval(prompt), one.new_session(512).eval(prompt))
        first = 150 // 2 // runtime.TOKEN_ALIGN * runtime.TOKEN_ALIGN
        assert (0, first) in shares and (first, 150) in shares   # shared out, not all on one worker
    finally:
        one.close()
        two.close()

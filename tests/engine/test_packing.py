"""Weights kept in faster layouts (`engine.packing`): llama.cpp's repacked Q4_K (`kernels.x86.k4_x8`),
Q5_0 and Q8_0 row pairs (`kernels.x86.q5_pairs`, `q8_pairs`), Q4_0 and IQ4_NL in 8-row groups
(`kernels.x86.q4_x8`).

The engine repacks a model's Q4_K weight matrices (a MoE model's experts, and the dense matrices of
any model; not the token embeddings) in place after loading; prompt and decode must give the same
logits to the bit as with the file's layout, in every weights mode, across live switches of mode
and thread count, and a placement that could cut an 8-row group keeps the file's layout."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from kernel_emulation import packed, random_activations, weights
from workbench.engine import Engine, kernels
from workbench.engine import packing
from workbench.engine.engine import Placement
from workbench.engine.gguf_file import TensorInfo

pytestmark = pytest.mark.skipif(kernels.packed_type(kernels.Q4_K) is None,
                                reason="the active kernel path keeps Q4_K in the file's layout")
PROMPT = [5, 17, 29, 3, 41, 8, 2, 11, 19]


@pytest.fixture(autouse=True)
def _packing_on(monkeypatch):
    """Pack on any path with the x8 kernels (by default only where it measured faster)."""
    monkeypatch.setattr(packing, "REPACK", "1")


def _model(factory, name: str, spec: TinySpec) -> str:
    path = factory.mktemp("packing") / name
    write_tiny_model(path, spec)
    return str(path)


@pytest.fixture(scope="module")
def q4k_moe(tmp_path_factory):
    return _model(tmp_path_factory, "moe-q4k.gguf", TinySpec(arch="qwen3moe", qtype=T.Q4_K, n_expert=8,
                                                              n_expert_used=2, n_ff=256, n_ff_exp=256, n_layer=2, seed=3))


@pytest.fixture(scope="module")
def q4k_dense(tmp_path_factory):
    """A dense model of Q4_K matrices (all rows in whole 8-row groups) and Q4_K token embeddings."""
    return _model(tmp_path_factory, "dense-q4k.gguf", TinySpec(arch="llama", qtype=T.Q4_K, n_embd=256, n_ff=512,
                                                                n_layer=2, tied=False, seed=5))


@pytest.fixture(scope="module")
def q5_dense(tmp_path_factory):
    """A dense model of Q5_0 matrices (Gemma 3 270M's q, k, gate and up are Q5_0)."""
    return _model(tmp_path_factory, "dense-q5_0.gguf", TinySpec(arch="llama", qtype=T.Q5_0, n_embd=256, n_ff=512,
                                                                 n_layer=2, tied=False, seed=6))


@pytest.fixture(scope="module")
def q8_tied(tmp_path_factory):
    """A dense model of Q8_0 matrices whose output product multiplies its token embeddings (296
    rows: whole 8-row groups), as Gemma 3 270M's: the embeddings are kept in row pairs too and
    looked up there."""
    return _model(tmp_path_factory, "tied-q8_0.gguf", TinySpec(arch="gemma3", qtype=T.Q8_0, n_embd=256, n_ff=512,
                                                               n_layer=2, tied=True, unused_tokens=6, seed=8))


@pytest.fixture(scope="module")
def q4_0_tied(tmp_path_factory):
    """Q4_0 matrices and a tied Q4_0 token embedding, as Google's QAT Gemma 3 files: the embedding
    is kept in 8-row groups and looked up there."""
    return _model(tmp_path_factory, "tied-q4_0.gguf", TinySpec(arch="gemma3", qtype=T.Q4_0, n_embd=256, n_ff=512,
                                                               n_layer=2, tied=True, unused_tokens=6, seed=9))


@pytest.fixture(scope="module")
def iq4_nl_moe(tmp_path_factory):
    return _model(tmp_path_factory, "moe-iq4_nl.gguf", TinySpec(arch="qwen3moe", qtype=T.IQ4_NL, n_expert=8,
                                                                 n_expert_used=2, n_ff=256, n_ff_exp=256, n_layer=2,
                                                                 seed=10))


@pytest.fixture(params=["q4k_moe", "q4k_dense", "q5_dense", "q8_tied", "q4_0_tied", "iq4_nl_moe"])
def model(request):
    qtype = {"q5_dense": int(T.Q5_0), "q8_tied": int(T.Q8_0), "q4_0_tied": int(T.Q4_0),
             "iq4_nl_moe": int(T.IQ4_NL)}.get(request.param)
    if qtype is not None and qtype not in LAYOUTS:
        pytest.skip(f"the active kernel path keeps {T(qtype).name} in the file's layout")
    return request.getfixturevalue(request.param)


def _logits(eng: Engine, n: int = 8) -> list[np.ndarray]:
    """Every prompt position's logits (the experts' prompt product), then n decoded tokens'."""
    s = eng.new_session(64)
    out = [s.eval(PROMPT, logit_rows=slice(0, len(PROMPT))).copy()]
    for i in range(n):
        out.append(s.eval([int(np.argmax(out[-1][-1])) if i % 2 else 7 + i]).copy())
    s.close()
    return out


def _reference(path: str, monkeypatch) -> list[np.ndarray]:
    with monkeypatch.context() as m:
        m.setattr(packing, "REPACK", "0")
        eng = Engine.load(path, placement=Placement(threads=1))
        try:
            assert eng.rt.packed == {}
            return _logits(eng)
        finally:
            eng.close()


LAYOUTS = {t: kernels.packed_type(t) for t in (int(T.Q4_K), int(T.Q5_0), int(T.Q8_0), int(T.Q4_0), int(T.IQ4_NL))
           if kernels.packed_type(t) is not None}


def _matrices(eng: Engine) -> dict[str, int]:
    """The tensors the engine packs, with their layouts: Q4_K, Q5_0, Q8_0, Q4_0 and IQ4_NL experts
    and 2-D weights in whole 8-row groups, not the token embeddings unless tied ones in a layout
    whose rows a token's call can look up (Q8_0, Q4_0, IQ4_NL; the other dense models' output
    matrix, 290 rows, stays in the file's layout)."""
    tied = "output.weight" not in eng.gguf.tensors
    return {n: LAYOUTS[t.ggml_type] for n, t in eng.gguf.tensors.items() if t.ggml_type in LAYOUTS
            and ("embd" not in n or tied and kernels.dequantizer(LAYOUTS[t.ggml_type]) is not None)
            and (len(t.shape) == 2 or n.endswith("_exps.weight")) and t.shape[1] % 8 == 0}



def _file_bytes(eng: Engine, name: str) -> np.ndarray:
    t = eng.gguf.tensors[name]
    with open(t.path or eng.path, "rb") as f:
        f.seek(t.offset)
        return np.frombuffer(f.read(t.nbytes), np.uint8).reshape(t.rows, -1)


def _assert_packed(eng: Engine) -> None:
    """Every Q4_K and Q5_0 weight matrix (experts included) is packed, and every copy in memory
    holds the file's bytes repacked."""
    assert eng.rt.packed == _matrices(eng) and eng.rt.packed
    for name, layout in _matrices(eng).items():
        assert eng.rt.weights[name].ggml_type == layout
        shape = eng.gguf.tensors[name].shape
        per = eng.gguf.tensors[name].rows // (shape[2] if len(shape) == 3 else 1)
        want = _file_bytes(eng, name).reshape(-1, per, eng.gguf.tensors[name].row_bytes)
        for view, first, g0, _node in eng.layout.copies(name):
            for e in range(view.shape[0]):
                e0 = g0 + e
                got = view[e].copy()
                assert not np.array_equal(got, want[e0, first:first + got.shape[0]])
                packing.movers(layout)[1](got, 0, got.shape[0])
                assert np.array_equal(got, want[e0, first:first + got.shape[0]]), (name, e0)


@pytest.mark.parametrize("threads", [1, 2])
def test_packed_weights_give_the_same_logits(model, threads, monkeypatch):
    ref = _reference(model, monkeypatch)
    eng = Engine.load(model, placement=Placement(threads=threads))
    try:
        _assert_packed(eng)
        assert ("token_embd.weight" in eng.rt.packed) == ("tied-" in model)
        got = _logits(eng)
    finally:
        eng.close()
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert np.array_equal(a, b)


def test_packed_weights_in_every_mode_and_across_live_switches(model, monkeypatch):
    ref = _reference(model, monkeypatch)
    moe = "moe-" in model   # (the "experts" mode needs routed experts)
    for mode in ("slice", "experts", "mirror", "interleave") if moe else ("slice", "mirror", "interleave"):
        eng = Engine.load(model, placement=Placement(weights=mode, threads=2))
        try:
            _assert_packed(eng)
            assert all(np.array_equal(a, b) for a, b in zip(_logits(eng, 4), ref)), mode
        finally:
            eng.close()
    eng = Engine.load(model, placement=Placement(threads=2))
    try:
        for step in (dict(weights="experts" if moe else "interleave"), dict(threads=1),
                     dict(weights="slice", threads=2), dict(weights="mirror"), dict(weights="none", threads=1)):
            eng.switch(**step)
            _assert_packed(eng)
            assert all(np.array_equal(a, b) for a, b in zip(_logits(eng, 4), ref)), step
    finally:
        eng.close()


def test_a_switch_that_could_cut_groups_unpacks_first(q4k_moe, monkeypatch):
    """With more workers than 8-row groups allow, the experts go back to the file's layout during
    the switch and are packed again when the thread count allows it."""
    ref = _reference(q4k_moe, monkeypatch)
    eng = Engine.load(q4k_moe, placement=Placement(threads=2))
    try:
        _assert_packed(eng)
        real = packing.packable
        monkeypatch.setattr(packing, "packable", lambda name, info, n, *tied: None if n == 1 else real(name, info, n, *tied))
        eng.switch(threads=1)
        assert eng.rt.packed == {} and all(w.ggml_type != kernels.Q4_K_X8 for w in eng.rt.weights.values())
        for name in _matrices(eng):
            assert np.array_equal(eng.layout.full_array(name), _file_bytes(eng, name))
        assert all(np.array_equal(a, b) for a, b in zip(_logits(eng, 4), ref))
        eng.switch(threads=2)
        _assert_packed(eng)
        assert all(np.array_equal(a, b) for a, b in zip(_logits(eng, 4), ref))
    finally:
        eng.close()


def _info(name: str, qtype: int, per: int, n_exp: int = 4, k: int = 256) -> TensorInfo:
    """A tensor of n_exp experts of `per` rows (n_exp 0: a 2-D weight of `per` rows)."""
    rb = kernels.row_bytes(qtype, k)
    shape = (k, per, n_exp) if n_exp else (k, per)
    return TensorInfo(name=name, shape=shape, ggml_type=qtype, offset=0, nbytes=rb * per * max(n_exp, 1))


def test_which_tensors_are_packed(monkeypatch):
    q4k = int(T.Q4_K)
    up = "blk.0.ffn_up_exps.weight"
    assert packing.packable(up, _info(up, q4k, 256), 32) == kernels.Q4_K_X8
    assert packing.packable(up, _info(up, q4k, 256), 33) is None      # fewer than 8 rows a worker
    assert packing.packable(up, _info(up, q4k, 260), 1) is None       # rows not in whole groups
    assert packing.packable(up, _info(up, int(T.Q6_K), 256), 1) is None     # no packed layout
    k_b = "blk.0.attn_k_b.weight"   # per-head weights: never repacked by llama.cpp, their type's plain id
    with monkeypatch.context() as m:  # (whatever types an earlier test compiled)
        m.setattr(kernels, "active_types", lambda: None)
        assert packing.packable(k_b, _info(k_b, q4k, 256), 33) == kernels.plain_type(q4k)  # no bytes move: any split
        assert packing.packable(k_b, _info(k_b, int(T.Q6_K), 256), 1) is None   # its kernels have no repacked order
    dense = "blk.0.attn_output.weight"   # 2-D weights: the same rules on their rows
    assert packing.packable(dense, _info(dense, q4k, 256, n_exp=0), 32) == kernels.Q4_K_X8
    assert packing.packable(dense, _info(dense, q4k, 256, n_exp=0), 33) is None
    assert packing.packable(dense, _info(dense, q4k, 260, n_exp=0), 1) is None
    emb = "token_embd.weight"   # looked up; multiplied too when tied, where a token's call can read the pairs
    assert packing.packable(emb, _info(emb, q4k, 256, n_exp=0), 1) is None
    assert packing.packable(emb, _info(emb, q4k, 256, n_exp=0), 1, tied=True) is None   # x8: no compiled lookup
    q8 = int(T.Q8_0)
    assert packing.packable(emb, _info(emb, q8, 256, n_exp=0), 1) is None
    assert packing.packable(emb, _info(emb, q8, 256, n_exp=0), 1, tied=True) == LAYOUTS.get(q8)
    tensors = {emb: _info(emb, q8, 256, n_exp=0)}
    assert packing.lookup_types(tensors, 1) == {LAYOUTS.get(q8, q8)}          # looked up where it is kept
    assert packing.lookup_types(tensors, 64) == ({LAYOUTS[q8], q8} if q8 in LAYOUTS else {q8})  # 4 rows a worker
    assert packing.lookup_types({**tensors, "output.weight": _info("output.weight", q8, 256, n_exp=0)}, 1) == {q8}
    assert packing.lookup_types({}, 1) == set()
    assert packing.wanted(tensors, 1) == ({emb: LAYOUTS[q8]} if q8 in LAYOUTS else {})
    assert packing.wanted({**tensors, "output.weight": _info("output.weight", q8, 256, n_exp=0)}, 1) == (
        {"output.weight": LAYOUTS[q8]} if q8 in LAYOUTS else {})
    assert packing.packable("output.weight", _info("output.weight", q4k, 256, n_exp=0), 1) == kernels.Q4_K_X8
    q5 = "blk.0.ffn_up.weight"   # Q5_0: row pairs where the path has their kernels (AVX-512 VNNI)
    assert packing.packable(q5, _info(q5, int(T.Q5_0), 256, n_exp=0), 1) == LAYOUTS.get(int(T.Q5_0))
    monkeypatch.setattr(packing, "REPACK", "0")
    assert packing.packable(up, _info(up, q4k, 256), 1) is None
    monkeypatch.setattr(kernels, "active_types", lambda: None)
    assert packing.packable(k_b, _info(k_b, q4k, 256), 1) == kernels.plain_type(q4k)   # exactness, not speed


def test_packs_by_default_only_where_faster(monkeypatch):
    """Unset NUMAWB_REPACK: the AVX-512 VNNI path packs, the AVX2 path keeps the file's layout
    (its packed gemv streamed slower from memory); "1" packs on either."""
    up = "blk.0.ffn_up_exps.weight"
    info = _info(up, int(T.Q4_K), 256)
    monkeypatch.setattr(packing, "REPACK", "")
    for path, want in (("avx512-vnni", kernels.Q4_K_X8), ("avx2", None)):
        monkeypatch.setattr(kernels, "kernel_path", lambda p=path: p)
        assert packing.packable(up, info, 1) == want, path
    monkeypatch.setattr(packing, "REPACK", "1")
    assert packing.packable(up, info, 1) == kernels.Q4_K_X8


SWITCH_PROBE = r"""
import json

import numpy as np
from workbench.engine import Engine, kernels, packing
from workbench.engine.engine import Placement
eng = Engine.load(placement=Placement(threads=2))
before = sorted(kernels.active_types())
lookups = {kernels.TYPE_NAMES[t]: len(kernels._DEQUANT[t].signatures) for t in (kernels.Q8_0, kernels.Q8_0_X2)}
s = eng.new_session(64)
ref = s.eval([2, 105, 1234, 4, 9, 77, 5000, 3, 12], logit_rows=slice(0, 9)).copy()
s.close()
real = packing.packable
packing.packable = lambda name, info, n, *tied: None if n == 1 else real(name, info, n, *tied)
eng.switch(threads=1)                      # every matrix back to the file's layout
unpacked = {kernels.TYPE_NAMES[t]: len(kernels._DEQUANT[t].signatures) for t in (kernels.Q8_0, kernels.Q8_0_X2)}
s = eng.new_session(64)
got = s.eval([2, 105, 1234, 4, 9, 77, 5000, 3, 12], logit_rows=slice(0, 9)).copy()
print(json.dumps({"before": before, "after": sorted(kernels.active_types()), "packed": len(eng.rt.packed),
                  "same": bool(np.array_equal(ref, got)), "lookups": lookups, "unpacked": unpacked}))
"""


def test_a_model_whose_matrices_are_all_packed_compiles_the_file_kernels_when_a_switch_needs_them():
    """A fresh process: the default model's Q4_K, Q5_0 and Q8_0 matrices (its tied embedding too)
    are all packed (up to 32 workers), so their file-layout kernels are not compiled at load, and
    the embedding's rows are looked up in its packed layout (only that one's lookup compiled); a
    switch that unpacks them compiles them first (the embedding's lookup too), and the logits stay
    the same to the bit."""
    import subprocess
    import sys
    if kernels.packed_type(int(T.Q5_0)) is None:
        pytest.skip("the active kernel path keeps Q5_0 in the file's layout")
    r = subprocess.run([sys.executable, "-c", SWITCH_PROBE], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    file_types = {int(T.Q4_K), int(T.Q5_0)} | ({int(T.Q8_0)} if int(T.Q8_0) in LAYOUTS else set())
    if os.cpu_count() <= 32:
        assert not file_types & set(out["before"]), out
        if int(T.Q8_0) in LAYOUTS:
            assert out["lookups"] == {"Q8_0": 0, "Q8_0_x2": 1}, out
            assert out["unpacked"]["Q8_0"] == 1, out   # compiled by the switch, before a lookup
    assert file_types <= set(out["after"]) and out["packed"] == 0 and out["same"], out


PAIR_LAYOUTS = [t for t in (kernels.Q5_0_X2, kernels.Q8_0_X2) if t in LAYOUTS.values()]


@pytest.mark.parametrize("layout", PAIR_LAYOUTS, ids=lambda t: kernels.TYPE_NAMES[t])
@pytest.mark.parametrize("k", [256, 640, 2048])
def test_row_pair_repack_round_trip_keeps_each_pair(layout, k):
    """The row-pair layouts (Q5_0_x2, Q8_0_x2) rewrite whole pairs in place, each pair keeping its
    own bytes, and back; a range that cuts a pair is refused."""
    file_type = next(f for f, t in LAYOUTS.items() if t == layout)
    repack, unpack = packing.movers(layout)
    w = weights(T(file_type), 12, k, seed=k)
    w2 = w.copy()
    repack(w2, 4, 12)                                   # rows 0-3 stay as they were
    assert np.array_equal(w2[:4], w[:4]) and not np.array_equal(w2[4:], w[4:])
    for p in range(2, 6):                               # each pair keeps its own bytes
        assert sorted(w2[2 * p:2 * p + 2].ravel()) == sorted(w[2 * p:2 * p + 2].ravel())
    unpack(w2, 4, 12)
    assert np.array_equal(w2, w)
    with pytest.raises(ValueError, match="whole pairs"):
        repack(w2, 3, 12)


@pytest.mark.parametrize("layout", PAIR_LAYOUTS, ids=lambda t: kernels.TYPE_NAMES[t])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 21])
def test_row_pair_prompt_and_batch_products_equal_the_file_layout(layout, n):
    """Whole tiles of 8 columns in the prompt tiles reading each row's blocks from its pair (ranges
    with odd ends: a tile's two rows from two pairs), the rest in `few_columns` (each pair read once
    for all of them); every column the file layout's prompt product and the one-token product give
    it; mul_mat_id is the prompt product."""
    file_type = next(f for f, t in LAYOUTS.items() if t == layout)
    rows, k = 38, 640
    w = weights(T(file_type), rows, k, seed=n)
    w2 = packed(layout, w)
    xp = kernels.prepare(file_type, random_activations(n, k, 10 + n, extreme=n == 9))
    for r0, r1 in [(0, rows), (1, 37), (3, 6), (10, 12), (13, 30)]:
        want = np.full((n, rows), np.nan, np.float32)
        got = want.copy()
        kernels.matmat(file_type, w, xp, want, r0, r1)
        kernels.matmat(layout, w2, xp, got, r0, r1)
        np.testing.assert_array_equal(got, want, err_msg=f"rows {r0}..{r1}")
    one = np.empty(rows, np.float32)
    kernels.matvec(file_type, w, tuple(a[n - 1] for a in xp), one, 0, rows)
    kernels.matmat(layout, w2, xp, got, 0, rows)
    np.testing.assert_array_equal(got[n - 1], one)
    ids = np.zeros((n, rows), np.float32)
    kernels.mul_mat_id_kernel(layout)(w2, xp, ids, 0, rows, rows)
    np.testing.assert_array_equal(ids, got)

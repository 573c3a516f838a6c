"""Every architecture x every tensor type: engine logits vs an independent NumPy forward pass."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from reference_forward import forward as ref_forward
from workbench.engine import Engine

TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.Q3_K, T.Q2_K]
ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
IDS = [2, 270, 262, 280, 265, 285, 271, 268, 288, 262, 275, 281]  # 12 tokens: crosses the 8-token window


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Relative RMS error of the logits."""
    return float(np.sqrt(np.mean((a - b) ** 2) / (np.mean(b ** 2) + 1e-12)))


def _tolerance(qtype: T) -> float:
    # The engine rounds activations as ggml does: to 8 bits per block for quantized
    # weights (~0.5 % relative error per product, compounded over 2 layers), to f16/bf16
    # for F16/BF16 weights, and keeps K/V in f16. A wrong RoPE, mask, norm or head
    # mapping gives errors of 20-100 %, far above these bounds.
    # K-quants pair with Q8_K activations: one scale per 256 values instead of per 32,
    # so their rounding error is 2-3x that of Q8_0.
    return {T.F32: 1e-3, T.F16: 2e-3, T.BF16: 1e-2, T.Q4_K: 4e-2, T.Q5_K: 4e-2, T.Q6_K: 4e-2,
            T.IQ4_XS: 4e-2, T.Q3_K: 4e-2, T.Q2_K: 4e-2}.get(qtype, 2e-2)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_logits_match_numpy_reference(tmp_path, arch, qtype):
    spec = TinySpec(arch=arch, qtype=qtype, seed=zlib.crc32(f"{arch}{qtype.name}".encode()) % 1000)
    path = tmp_path / f"{arch}-{qtype.name}.gguf"
    W = write_tiny_model(path, spec)
    eng = Engine.load(str(path))
    ref = ref_forward(W, arch, IDS, spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_layer, spec.sliding_window)

    # whole prompt at once (matrix x matrix), all positions' logits
    s = eng.new_session(64)
    got = s.eval(IDS, logit_rows=slice(0, len(IDS)))
    assert got.shape == ref.shape
    assert _rel_err(got, ref) < _tolerance(qtype)

    # token by token (matrix x vector) through the KV cache: same last logits
    s2 = eng.new_session(64)
    for t in IDS:
        last = s2.eval([t])
    assert _rel_err(last, ref[-1]) < _tolerance(qtype)
    assert int(np.argmax(last)) == int(np.argmax(got[-1])) or _rel_err(last, got[-1]) < 1e-3


def test_untied_output_and_greedy_is_deterministic(tmp_path):
    spec = TinySpec(arch="llama", qtype=T.Q4_0, tied=False)
    path = tmp_path / "untied.gguf"
    W = write_tiny_model(path, spec)
    eng = Engine.load(str(path))
    assert eng.model.output_name == "output.weight"
    ref = ref_forward(W, "llama", IDS, spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_layer)
    got = eng.new_session(64).eval(IDS)
    assert _rel_err(got, ref[-1]) < _tolerance(T.Q4_0)

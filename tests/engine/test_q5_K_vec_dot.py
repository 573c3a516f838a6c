"""A Q5_K weight's products below 8 columns take ggml_vec_dot_q5_K_q8_K's float order, mins included.

llama.cpp never repacks Q5_K on x86; below 8 columns (every decoded token, the last 4 tokens of a
prompt llama-server evaluates apart for an SWA model's context checkpoints) mul_mat runs the type's
vec_dot per row and column. Its mins term is `summs += dmin * M` (dmin = -d_x * dmin_w, M the
block's exact sum of mins times activation sums), which GCC contracts to one FMA in the build's
-std=gnu11 (-ffp-contract=fast): the product is not rounded on its own. numawb rounded it, then
added: the default model requantized to Q5_K_M (attn_output and half the ffn_down in Q5_K) had 876 of
2560 outputs of blk.0.attn_output one ulp off for a 4-token batch, and took another greedy token
(issue 46, item 3 (c)). Checked here through the engine's products on a tiny file whose ffn_down
has 8 super-blocks a row (the FMA's rounding shows from the second), against `kernel_emulation`'s
emulation of llama.cpp's kernels: vec_dot below 8 columns, the tiled matmul from 8.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from kernel_emulation import emulate_k4_tiled, emulate_k4_vec
from workbench.engine import Engine, kernels
from workbench.engine.engine import Placement

#: Q5_K weights of the file: ffn_down (K = n_ff = 2048, 8 super-blocks) and attn_output (K = 256)
Q5_K_NAMES = tuple(f"blk.{il}.{n}.weight" for il in range(2) for n in ("ffn_down", "attn_output"))


@pytest.fixture(scope="module")
def q5_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("q5_K_vec") / "q5k.gguf"
    spec = TinySpec(arch="llama", qtype=T.Q8_0, n_ff=2048, n_layer=2, seed=11,
                    types=tuple((name, T.Q5_K) for name in Q5_K_NAMES))
    write_tiny_model(path, spec, reference=False)
    return str(path)


def _weight(path: str, name: str) -> np.ndarray:
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    return np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8).reshape(int(t.shape[1]), -1))


@pytest.mark.skipif(kernels.kernel_path() == "portable", reason="the portable kernels follow no llama.cpp order")
@pytest.mark.parametrize("threads", [1, 2])
def test_q5_K_products_take_llama_cpps_vec_dot_and_tiled_orders(q5_file, threads):
    """One token (the crew's one-token product), 3 and 7 tokens (vec_dot per column) and 9 (the
    tiled matmul): every output bit for bit."""
    eng = Engine.load(q5_file, placement=Placement(threads=threads))
    try:
        rng = np.random.default_rng(5)
        for name in Q5_K_NAMES:
            assert eng.rt.weights[name].ggml_type == int(T.Q5_K)
            w = _weight(q5_file, name)
            for n in (1, 3, 7, 9):
                x = rng.standard_normal((n, eng.rt.weights[name].ne0)).astype(np.float32)
                got = eng.rt.linear(x, (name,))[0]
                xq, xd, _ = kernels.prepare(int(T.Q5_K), x)
                want = emulate_k4_tiled(w, xq, xd, q5=True) if n >= 8 else emulate_k4_vec(w, xq, xd, q5=True)
                np.testing.assert_array_equal(got.reshape(n, -1), want, err_msg=f"{name}, {n} token(s)")
    finally:
        eng.close()

"""The float orders that differ between llama.cpp's AVX-512 and AVX2 builds (kernels/llama_build.py):
ggml_v_expf, the F16 / F32 dot products and the softmax's sums follow the build of this host, and the
other build's when NUMAWB_LLAMA_SIMD asks for it (checked in a child process, so both forms are
tested on every host)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kernel_emulation import SIMD_PATHS, ggml_v_expf, tinyblas_float, vec_dot_float

HERE = Path(__file__).parent


def expf_inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(-110, 90, 20000), rng.uniform(-2, 2, 4000),
                        np.linspace(-140, 140, 4001),  # |n| past 126 and 192 on both sides
                        [0.0, -0.0, 1e-30, -1e-30, -87.3, -87.4, 88.7, 88.8, -103.9, -104.0, -1e30, 1e30,
                         -np.inf]]).astype(np.float32)
    return x


def check_expf(wide: bool) -> None:
    from workbench.engine import ops

    @numba.njit
    def run(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = ops.ggml_expf(x[i])
        return out

    x = expf_inputs()
    got, want = run(x), ggml_v_expf(x, wide)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"ggml_expf differs from ggml_v_expf ({'512' if wide else '256'}) at x={x[bad[:5]]}"
    # the other form does differ: the choice is not a no-op (a few last-bit differences)
    assert np.count_nonzero(got.view(np.uint32) != ggml_v_expf(x, not wide).view(np.uint32)) > 0


def check_silu(wide: bool) -> None:
    from workbench.engine import ops
    x = expf_inputs()[:4000].reshape(4, 1000)  # 1000 = 62 x 16 + 8: an 8-value block past the 16s
    u = np.ones_like(x)
    out = np.empty_like(x)
    ops.silu_mul(x, u, out)
    d16 = 992 if wide else 1000  # the AVX2 build computes the last 8 with ggml_v_expf too
    with np.errstate(over="ignore"):
        want = (x[:, :d16] / (np.float32(1.0) + ggml_v_expf(-x[:, :d16], wide))).astype(np.float32)
    assert np.array_equal(out[:, :d16].view(np.uint32), want.view(np.uint32))


def check_float_products(wide: bool) -> None:
    from workbench.engine import kernels as K
    rng = np.random.default_rng(3)
    for k in (256, 40, 72):  # steps of 64 / 32, leftovers, k % 16 != 0 with k % 8 == 0
        w16 = rng.standard_normal((12, k)).astype(np.float16)
        X = rng.standard_normal((5, k)).astype(np.float32)
        wb = w16.view(np.uint8).reshape(12, -1)
        xp = K.prepare(int(T.F16), X)
        xs = xp[0]
        out = np.full(12, np.nan, np.float32)
        K.matvec(int(T.F16), wb, K.prepare(int(T.F16), X[0]), out, 0, 12)
        assert np.array_equal(out, vec_dot_float(w16.astype(np.float32), xs[0], wide, f16=True)), k
        out2 = np.full((5, 12), np.nan, np.float32)
        K.matmat(int(T.F16), wb, xp, out2, 0, 12)
        lanes = 16 if wide else 8
        want = tinyblas_float(w16.astype(np.float32), xs, wide) if k % lanes == 0 else \
            np.stack([vec_dot_float(w16.astype(np.float32), x, wide, f16=True) for x in xs])
        assert np.array_equal(out2, want), k
        w32 = rng.standard_normal((12, k)).astype(np.float32)
        out3 = np.full(12, np.nan, np.float32)
        K.matvec(int(T.F32), w32.view(np.uint8), K.prepare(int(T.F32), X[0]), out3, 0, 12)
        assert np.array_equal(out3, vec_dot_float(w32, X[0], wide, f16=False)), k
        out4 = np.full((5, 12), np.nan, np.float32)   # tinyBLAS's register tiles (rows % 4 == 0)
        K.matmat(int(T.F32), w32.view(np.uint8), K.prepare(int(T.F32), X), out4, 0, 12)
        want = tinyblas_float(w32, X, wide) if k % lanes == 0 else \
            np.stack([vec_dot_float(w32, x, wide, f16=False) for x in X])
        assert np.array_equal(out4, want), k


def check_f16_heads(wide: bool) -> None:
    """One F16 matrix against several inputs (grouped-query attention's heads): each output is
    ggml_vec_dot_f16 of that input, whether the row's vectors are shared by groups of 4 inputs
    (k a multiple of the dot's step, up to HEADS_MAX_K), by tiles of 2 rows x 8 inputs (whole
    rows, or segments of long rows carried across in order) or the inputs run one at a time."""
    from workbench.engine import kernels as K
    rng = np.random.default_rng(11)
    for rows, k, nh in ((40, 256, 4), (33, 1024, 8), (21, 128, 6), (17, 96, 4), (9, 40, 4), (12, 2048, 4),
                        (7, 1088, 5), (10, 64, 1), (13, 160, 8), (11, 576, 6), (5, 200, 9),
                        (24, 576, 16), (9, 1600, 8), (6, 4160, 17), (15, 3000, 11), (8, 192, 8)):
        w16 = rng.standard_normal((rows, k)).astype(np.float16)
        xs, os_ = k + 24, rows + 3   # inputs and outputs apart by more than their length
        x = rng.standard_normal(nh * xs).astype(np.float16).astype(np.float32)
        out = np.full(nh * os_, np.nan, np.float32)
        K.f16_heads(w16.view(np.uint8).reshape(rows, -1), x, xs, k, nh, out, os_, 2, rows - 1)
        got = out.reshape(nh, os_)
        for h in range(nh):
            want = vec_dot_float(w16.astype(np.float32), x[h * xs:h * xs + k], wide, f16=True)
            assert np.array_equal(got[h, 2:rows - 1], want[2:rows - 1]), (rows, k, nh, h)
        assert np.isnan(got[:, :2]).all() and np.isnan(got[:, rows - 1:]).all(), (rows, k, nh)


def check_f16_prompt_tiles(wide: bool) -> None:
    """A prompt's F16 products (kernels/x86/f16_tiles.prompt_tiles: 3-row tiles over blocks of
    rows, long rows in segments whose partial sums carry) give tinyBLAS's outputs to the bit:
    several blocks of whole rows, several blocks of segmented rows with a short last segment,
    left-over rows and left-over inputs, a row range that starts inside the matrix, and empty
    rows (a piece of a prompt that sees no key of an owner: every output 0)."""
    from workbench.engine import kernels as K
    from workbench.engine.kernels.x86 import f16_tiles
    rng = np.random.default_rng(5)
    lanes = 16 if wide else 8
    many = f16_tiles.PROMPT_MIN_BYTES // (2 * 256) + 7   # > 2 blocks of 256-wide rows, past the size the tiles take
    long_k = f16_tiles.PROMPT_SEGMENT_MAX + 80   # 3 segments, the last one short
    tall = f16_tiles.PROMPT_MIN_BYTES // (2 * long_k) + 40
    for rows, k, n, r0, r1 in ((many, 256, 17, 0, many), (13, 1600, 19, 1, 12), (tall, long_k, 19, 3, tall),
                               (9, 576, 64, 0, 9), (6, 64, 8, 2, 6), (12, 0, 8, 0, 12)):   # k 0: no visible key
        assert k % lanes == 0
        w16 = rng.standard_normal((rows, k)).astype(np.float16)
        X = rng.standard_normal((n, k)).astype(np.float32)
        xp = K.prepare(int(T.F16), X)
        out = np.full((n, rows), np.nan, np.float32)
        K.matmat(int(T.F16), w16.view(np.uint8).reshape(rows, -1), xp, out, r0, r1)
        want = tinyblas_float(w16.astype(np.float32)[r0:r1], xp[0], wide)
        assert np.array_equal(out[:, r0:r1].view(np.uint32), want.view(np.uint32)), (rows, k, n)
        assert np.isnan(out[:, :r0]).all() and np.isnan(out[:, r1:]).all(), (rows, k, n)


CHECKS = (check_expf, check_silu)
SIMD_CHECKS = (check_float_products, check_f16_heads, check_f16_prompt_tiles)


def _this_build() -> bool:
    from workbench.engine.kernels.llama_build import WIDE
    return WIDE


@pytest.mark.parametrize("check", CHECKS + (SIMD_CHECKS if SIMD_PATHS else ()), ids=lambda f: f.__name__)
def test_this_hosts_build(check):
    check(_this_build())


def test_the_other_build_when_asked_for():
    """NUMAWB_LLAMA_SIMD gives the other build's forms (a child process: the choice is read at import)."""
    other = not _this_build()
    names = [c.__name__ for c in CHECKS + (SIMD_CHECKS if SIMD_PATHS else ())]
    code = (f"import sys; sys.path[:0] = [{str(HERE)!r}]\n"
            "import test_llama_build as t\n"
            "from workbench.engine.kernels.llama_build import WIDE\n"
            f"assert WIDE is {other}\n"
            + "".join(f"t.{n}({other})\n" for n in names) + "print('ok')\n")
    env = dict(os.environ, NUMAWB_LLAMA_SIMD="512" if other else "256")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]

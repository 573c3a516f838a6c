"""A bounded soak: many sliding chat turns with stable memory, threads and outputs (full run: benchmarks/soak.py)."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine
from workbench.engine.engine import Placement
from workbench.soak import soak


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    path = tmp_path_factory.mktemp("soak") / "tiny.gguf"
    write_tiny_model(path, TinySpec(arch="llama", qtype=T.Q4_K, n_layer=1, n_ctx=512))
    e = Engine.load(str(path), placement=Placement(threads=2))
    yield e
    e.close()


def test_bounded_soak(eng):
    res = soak(eng, turns=60, n_ctx=96, n_predict=8, check_every=5)
    assert res.slides > 5                      # the context really slid, many times
    assert res.mismatches == []                # replies equal a fresh run over the same conversation
    assert len(set(res.threads)) == 1          # no thread leaks
    assert res.rss_growth(warmup=20) < 0.05    # resident memory stable within 5 % after warm-up

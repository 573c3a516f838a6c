"""Shared fixtures: tiny models written with gguf.GGUFWriter, and compiled kernels.

CI starts from a fresh clone, so the first test that runs a model also compiles its
kernels (a minute or more on a slow host). Tests that wait on the app with a timeout
ask for ``warm_kernels`` first: the compile then happens here, untimed, and no test
depends on a cache warmed by an earlier run.
"""
from __future__ import annotations

import pytest

from gguf_factory import TinySpec, write_tiny_model


@pytest.fixture(autouse=True)
def _no_pulled_models(tmp_path_factory, monkeypatch) -> None:
    """No test sees a model the host fetched with `numawb pull` (the app and the server would take
    it when no model is named): $XDG_DATA_HOME points at an empty folder."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.getbasetemp() / "xdg-data"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A 2-layer Q8_0 llama-architecture model (512-token context)."""
    path = tmp_path_factory.mktemp("shared-models") / "tiny-llama.gguf"
    write_tiny_model(path, TinySpec(n_ctx=512))
    return str(path)


@pytest.fixture(scope="session")
def warm_kernels(tiny_model) -> None:
    """Compile (or load from the cache) every kernel a tiny model's chat uses: prompt and
    one-token products, attention, sampling, at 1 and 2 threads."""
    from workbench.engine.engine import Engine, Placement
    from workbench.engine.sampling import SamplingParams
    for threads in (1, 2):
        eng = Engine.load(tiny_model, placement=Placement(threads=threads))
        try:
            s = eng.new_session(256)
            for _ in s.generate([2, 270, 271, 272, 273] * 4, SamplingParams(temperature=0.8, seed=1), 4):
                pass
        finally:
            eng.close()

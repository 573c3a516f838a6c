"""Split GGUF models (`name-00001-of-00003.gguf`): the first part is passed, the others are found
next to it, checked, and each tensor is read from its own part."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine
from workbench.engine.gguf_file import ModelLoadError, read_gguf

IDS = [2, 270, 262, 280, 265, 285]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    spec = TinySpec(arch="qwen3moe", qtype=T.Q8_0, n_expert=4, n_expert_used=2, n_ff_exp=256, n_ff=256, seed=3)
    write_tiny_model(d / "whole.gguf", spec)
    n = len(read_gguf(d / "whole.gguf").tensors)
    write_tiny_model(d / "tiny.gguf", spec, split_max_tensors=-(-n // 3))
    parts = [str(d / f"tiny-{i:05d}-of-00003.gguf") for i in (1, 2, 3)]
    assert all(os.path.exists(p) for p in parts)
    return str(d / "whole.gguf"), parts


def test_split_model_reads_every_part_and_matches_the_whole_file(models):
    whole, parts = models
    g = read_gguf(parts[0])
    assert g.parts == tuple(parts)
    assert {t.path for t in g.tensors.values()} == set(parts)  # tensors in all three parts
    assert len(g.tensors) == len(read_gguf(whole).tensors)
    a = Engine.load(whole)
    b = Engine.load(parts[0])
    try:
        assert b.files == tuple(parts)
        for name in a.gguf.tensors:
            assert np.array_equal(a.layout.full_array(name), b.layout.full_array(name)), name
        la = a.new_session(64).eval(IDS)
        lb = b.new_session(64).eval(IDS)
        assert np.array_equal(la, lb)
    finally:
        a.close()
        b.close()


def test_split_errors_are_one_line(models, tmp_path):
    _whole, parts = models
    with pytest.raises(ModelLoadError, match="pass the first part") as e:
        read_gguf(parts[1])
    assert "\n" not in str(e.value)
    # a missing part
    for p in parts[:2]:
        os.link(p, tmp_path / os.path.basename(p))
    with pytest.raises(ModelLoadError, match=r"part 3 of 3 is missing") as e:
        read_gguf(tmp_path / os.path.basename(parts[0]))
    assert "\n" not in str(e.value)
    # parts out of order: part 2 and 3 swapped
    os.unlink(tmp_path / os.path.basename(parts[1]))
    os.link(parts[2], tmp_path / os.path.basename(parts[1]))
    os.link(parts[1], tmp_path / os.path.basename(parts[2]))
    with pytest.raises(ModelLoadError, match="out of order"):
        read_gguf(tmp_path / os.path.basename(parts[0]))


def test_cli_generates_from_a_split_moe_model_and_refuses_a_later_part(models):
    import subprocess
    import sys

    _whole, parts = models
    run = lambda *a: subprocess.run([sys.executable, "-m", "workbench", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=600)
    r = run("generate", "-m", parts[0], "-p", "the cat", "-n", "4", "--temp", "0", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert "decode:" in r.stdout
    r = run("generate", "-m", parts[2], "-p", "the cat", "-n", "4")
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "pass the first part" in err[0] and "Traceback" not in r.stderr

"""The GGUF reader: every kind of bad file gives one clear ModelLoadError, before any big allocation."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from workbench.numa.budget import BudgetError
from gguf import GGMLQuantizationType as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Engine, ModelLoadError
from workbench.engine.gguf_file import read_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_model(path, TinySpec(arch="llama", qtype=T.Q8_0, n_layer=1))
    return path.read_bytes()


def _write(tmp_path, data: bytes, name: str = "m.gguf") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _error(path: str) -> str:
    with pytest.raises(ModelLoadError) as ei:
        Engine.load(path)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_reads_a_valid_file(tmp_path, tiny):
    g = read_gguf(_write(tmp_path, tiny))
    assert g.architecture == "llama"
    assert g.tensors["token_embd.weight"].shape == (256, 290)
    assert g.metadata["tokenizer.ggml.bos_token_id"] == 2


@pytest.mark.parametrize("data, expect", [
    (b"", "not a GGUF file"),
    (b"PK\x03\x04" + b"\0" * 60, "bad magic"),
    (b"GGUF" + struct.pack("<I", 99) + b"\0" * 16, "unsupported GGUF version 99"),
    (b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0), "absurd header counts"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 50), "header cut short"),
])
def test_bad_headers(tmp_path, data, expect):
    assert expect in _error(_write(tmp_path, data))


def test_missing_directory_and_unreadable(tmp_path, tiny):
    assert "no such file" in _error(str(tmp_path / "nope.gguf"))
    assert "is a directory" in _error(str(tmp_path))
    p = _write(tmp_path, tiny)
    os.chmod(p, 0)
    try:
        if os.access(p, os.R_OK):  # root reads anything
            pytest.skip("running as root: permission bits are not enforced")
        assert "permission denied" in _error(p)
    finally:
        os.chmod(p, 0o644)


def test_truncated_file(tmp_path, tiny):
    assert "past the end of the file" in _error(_write(tmp_path, tiny[: len(tiny) - 1000]))
    assert "cut short" in _error(_write(tmp_path, tiny[:200]))


def _patch_tensor_info(data: bytes, name: str, field: str, value: int) -> bytes:
    """Rewrite one field (a dim, the type or the offset) of a tensor's header entry."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    n_dims = struct.unpack_from("<I", data, at)[0]
    dims_at = at + 4
    type_at = dims_at + 8 * n_dims
    off_at = type_at + 4
    where = {"dim0": (dims_at, "<Q"), "dim1": (dims_at + 8, "<Q"), "type": (type_at, "<I"), "offset": (off_at, "<Q")}
    pos, fmt = where[field]
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def test_absurd_dimensions_are_refused_before_allocation(tmp_path, tiny):
    bad = _patch_tensor_info(tiny, "token_embd.weight", "dim1", 1 << 42)
    msg = _error(_write(tmp_path, bad))
    assert "token_embd.weight" in msg and ("absurd" in msg or "past the end" in msg)


def test_misaligned_and_overlapping_offsets(tmp_path, tiny):
    g = read_gguf(_write(tmp_path, tiny))
    first = min(g.tensors.values(), key=lambda t: t.offset)
    second = sorted(g.tensors.values(), key=lambda t: t.offset)[1]
    rel = first.offset - g.data_offset
    assert "not aligned" in _error(_write(tmp_path, _patch_tensor_info(tiny, second.name, "offset", rel + 1)))
    assert "overlap" in _error(_write(tmp_path, _patch_tensor_info(tiny, second.name, "offset", rel)))


def test_unknown_and_unsupported_tensor_types(tmp_path, tiny):
    assert "unknown type id 77" in _error(_write(tmp_path, _patch_tensor_info(tiny, "output_norm.weight", "type", 77)))
    # IQ2_XXS (16) is a real GGML type that the engine does not run; same byte size is irrelevant:
    # the loader must refuse it by name before reading data
    msg = _error(_write(tmp_path, _patch_tensor_info(tiny, "output_norm.weight", "type", int(T.IQ2_XXS))))
    assert "IQ2_XXS" in msg or "not supported" in msg or "past the end" in msg


def test_unsupported_architecture_names_the_supported_ones(tmp_path, tiny):
    bad = tiny.replace(b"llama", b"mamba", 1)
    msg = _error(_write(tmp_path, bad))
    assert "'mamba'" in msg and "gemma3" in msg and "qwen3" in msg


def test_missing_tensor_and_vocab_mismatch(tmp_path):
    from gguf_factory import spm_vocab
    path = tmp_path / "m.gguf"
    write_tiny_model(path, TinySpec(arch="llama", qtype=T.Q8_0, n_layer=1))
    data = path.read_bytes()
    # rename a required tensor: the model then lacks it
    renamed = data.replace(b"blk.0.ffn_up.weight", b"blk.0.ffn_xx.weight")
    assert "missing tensor" in _error(_write(tmp_path, renamed, "r.gguf"))
    # a vocabulary that does not match the embedding rows
    toks = spm_vocab()[0]
    longer = data.replace(struct.pack("<Q", len(toks)), struct.pack("<Q", len(toks) - 1), 1)
    msg = _error(_write(tmp_path, longer, "v.gguf"))
    assert msg  # one line, whatever the first inconsistency found is


def test_a_loaded_model_keeps_working_after_a_failed_load(tmp_path, tiny):
    eng = Engine.load(_write(tmp_path, tiny))
    before = eng.new_session(32).eval([2, 270, 262])
    with pytest.raises(ModelLoadError):
        Engine.load(_write(tmp_path, b"GGUF\x63\0\0\0" + b"\0" * 16, "bad.gguf"))
    after = eng.new_session(32).eval([2, 270, 262])
    np.testing.assert_array_equal(before, after)


def test_a_key_name_with_a_newline_still_gives_a_one_line_error(tmp_path, tiny):
    """Found by the fuzz test below: a byte edit turned a key's first letter into a newline and the
    string after it into an absurd length; the message quoted the key as it was."""
    key = b"tokenizer.ggml.tokens"
    at = tiny.index(key)
    blob = tiny[:at] + b"\n" + tiny[at + 1:]
    n_at = at + len(key) + 4 + 4 + 8  # the key, its value type, the array's item type and count
    blob = blob[:n_at] + struct.pack("<Q", 1 << 50) + blob[n_at + 8:]  # the first string's length
    with pytest.raises(ModelLoadError) as e:
        read_gguf(_write(tmp_path, blob, "newline-key.gguf"))
    assert "\n" not in str(e.value) and "\\nokenizer.ggml.tokens" in str(e.value)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_headers_fail_cleanly(tmp_path, tiny, data):
    """Random byte edits in the header/metadata: only ModelLoadError (or success), never a crash."""
    b = bytearray(tiny[:4096])
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(4, len(b) - 1))
        b[pos] = data.draw(st.integers(0, 255))
    blob = bytes(b) + tiny[4096:]
    path = _write(tmp_path, blob, "fuzz.gguf")
    try:
        Engine.load(path).close()
    except ModelLoadError as e:
        assert "\n" not in str(e)
    except BudgetError as e:  # a header edit can ask for more memory than this box has: refused cleanly
        assert "nothing was allocated" in str(e)

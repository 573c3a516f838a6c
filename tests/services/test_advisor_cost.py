"""The advisor's cost model: bytes per token, KV traffic, FLOPs, read from GGUF headers alone
(whole files, files cut short after the header, split files with and without their other parts)."""
from __future__ import annotations

import os
import shutil

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from gguf_factory import TinySpec, write_tiny_model
from workbench.advisor.cost import HeaderError, model_cost, read_header
from workbench.advisor.synthetic import deepseek_r1, qwq_32b, write_header
from workbench.engine.gguf_file import ModelLoadError, read_gguf


def nbytes(shape, qtype) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


@pytest.fixture(scope="module")
def tiny_untied(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("cost") / "tiny.gguf"
    write_tiny_model(p, TinySpec(arch="llama", qtype=T.Q8_0, n_layer=3, tied=False))
    return str(p)


def test_dense_bytes_per_token_counts_every_matrix_and_one_embedding_row(tiny_untied):
    g = read_gguf(tiny_untied)  # the engine's own reader, for an independent sum
    c = model_cost(tiny_untied)
    emb = g.tensors["token_embd.weight"]
    expect = sum(t.nbytes for t in g.tensors.values()) - emb.nbytes + emb.row_bytes
    assert c.weight_bytes == sum(t.nbytes for t in g.tensors.values())
    assert c.weight_bytes_per_token == pytest.approx(expect)
    # KV: n_layer * n_head_kv * (head_dim_k + head_dim_v) * 2 bytes per position (f16)
    s = TinySpec()
    assert c.kv_bytes_per_position == 3 * s.n_head_kv * (2 * s.head_dim) * 2
    assert c.kv_read_bytes(100) == 100 * c.kv_bytes_per_position
    assert c.bytes_per_token(100) == pytest.approx(expect + 100 * c.kv_bytes_per_position)


def test_tied_output_reads_the_whole_embedding(tmp_path):
    p = tmp_path / "tied.gguf"
    write_tiny_model(p, TinySpec(arch="llama", qtype=T.Q8_0, n_layer=1, tied=True))
    c = model_cost(p)
    g = read_gguf(p)
    assert c.weight_bytes_per_token == pytest.approx(sum(t.nbytes for t in g.tensors.values()))


def test_file_cut_short_after_header_gives_the_same_cost(tiny_untied, tmp_path):
    whole = model_cost(tiny_untied)
    cut = tmp_path / "partial.gguf"
    with open(tiny_untied, "rb") as f:
        cut.write_bytes(f.read(whole.header_bytes))
    assert os.path.getsize(cut) < os.path.getsize(tiny_untied) / 4  # no tensor data at all
    with pytest.raises(ModelLoadError):  # the loader rightly refuses it ...
        read_gguf(cut)
    part = model_cost(cut)  # ... the advisor does not need the data
    assert part.weight_bytes == whole.weight_bytes
    assert part.weight_bytes_per_token == whole.weight_bytes_per_token
    assert part.kv_bytes_per_position == whole.kv_bytes_per_position


def test_file_cut_inside_header_is_one_clear_line(tiny_untied, tmp_path):
    whole = model_cost(tiny_untied)
    cut = tmp_path / "cut.gguf"
    with open(tiny_untied, "rb") as f:
        cut.write_bytes(f.read(whole.header_bytes - 10))
    with pytest.raises(HeaderError, match="header cut short") as e:
        model_cost(cut)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("content, match", [(b"", "not a GGUF file"), (b"GGML" + bytes(40), "bad magic")])
def test_not_gguf(tmp_path, content, match):
    p = tmp_path / "x.gguf"
    p.write_bytes(content)
    with pytest.raises(HeaderError, match=match):
        model_cost(p)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(HeaderError, match="no such file"):
        model_cost(tmp_path / "nope.gguf")
    with pytest.raises(HeaderError, match="is a directory"):
        model_cost(tmp_path)


def moe_header(path, n_layer=4, n_exp=8, n_used=2, d=256, ff=512, ff_exp=256) -> dict[str, int]:
    """A small MoE header (qwen3moe-like plus a shared expert); returns bytes by kind."""
    md = {"general.name": "tiny moe", "qwen3moe.block_count": n_layer, "qwen3moe.embedding_length": d,
          "qwen3moe.attention.head_count": 4, "qwen3moe.attention.head_count_kv": 2,
          "qwen3moe.attention.key_length": 64, "qwen3moe.attention.value_length": 64,
          "qwen3moe.expert_count": n_exp, "qwen3moe.expert_used_count": n_used, "qwen3moe.context_length": 1024}
    ts = [("token_embd.weight", (d, 1000), T.Q8_0), ("output.weight", (d, 1000), T.Q8_0),
          ("output_norm.weight", (d,), T.F32)]
    for il in range(n_layer):
        p = f"blk.{il}."
        ts += [(p + "attn_q.weight", (d, 256), T.Q8_0), (p + "attn_k.weight", (d, 128), T.Q8_0),
               (p + "attn_v.weight", (d, 128), T.Q8_0), (p + "attn_output.weight", (256, d), T.Q8_0),
               (p + "attn_norm.weight", (d,), T.F32), (p + "ffn_gate_inp.weight", (d, n_exp), T.F32),
               (p + "ffn_gate_exps.weight", (d, ff_exp, n_exp), T.Q4_K),
               (p + "ffn_up_exps.weight", (d, ff_exp, n_exp), T.Q4_K),
               (p + "ffn_down_exps.weight", (ff_exp, d, n_exp), T.Q6_K),
               (p + "ffn_gate_shexp.weight", (d, ff), T.Q8_0), (p + "ffn_up_shexp.weight", (d, ff), T.Q8_0),
               (p + "ffn_down_shexp.weight", (ff, d), T.Q8_0)]
    write_header(path, "qwen3moe", md, ts)
    kinds = {"exps": 0, "embd": 0, "other": 0}
    for name, shape, q in ts:
        k = "exps" if "_exps" in name else "embd" if name == "token_embd.weight" else "other"
        kinds[k] += nbytes(shape, q)
    return kinds


def test_moe_reads_only_the_used_share_of_routed_experts(tmp_path):
    p = tmp_path / "moe.gguf"
    kinds = moe_header(p, n_exp=8, n_used=2)
    c = model_cost(p)
    assert c.expert_count == 8 and c.expert_used_count == 2
    assert c.weight_bytes == sum(kinds.values())
    row = nbytes((256,), T.Q8_0)
    assert c.weight_bytes_per_token == pytest.approx(kinds["other"] + kinds["exps"] * 2 / 8 + row)
    # the shared experts (and everything else) fully, the routed ones at 2/8
    frac = c.read_fraction
    assert frac["blk.0.ffn_up_shexp.weight"] == 1.0 and frac["blk.0.ffn_up_exps.weight"] == 0.25


def test_header_only_file_describes_a_huge_model(tmp_path):
    p = tmp_path / "r1.gguf"
    deepseek_r1(p, "Q8_0")
    assert os.path.getsize(p) < 200_000
    c = model_cost(p)
    # DeepSeek-R1: 671 B parameters, 713 GB at Q8_0 (the published file size)
    assert c.n_params == pytest.approx(671.0e9, rel=0.001)
    assert c.weight_bytes == pytest.approx(713.3e9, rel=0.001)
    # per token: everything but the routed experts, plus 8/256 of them
    exps = sum(t.nbytes for t in c.tensors if "_exps" in t.name)
    other = sum(t.nbytes for t in c.tensors if "_exps" not in t.name and t.name != "token_embd.weight")
    row = 7168 // 32 * 34
    assert c.weight_bytes_per_token == pytest.approx(other + exps * 8 / 256 + row)
    # older layout (attn_kv_b): full keys and values of 128 heads, 192 + 128 wide
    assert not c.mla
    assert c.kv_bytes_per_position == 61 * 128 * (192 + 128) * 2


def test_mla_cache_is_latent_plus_rope(tmp_path):
    p = tmp_path / "r1mla.gguf"
    deepseek_r1(p, "Q4_K_M", mla=True)
    c = model_cost(p)
    assert c.mla
    # numawb's cache: the latent and rotary key rows, and the latent transposed for the values
    assert c.kv_bytes_per_position == 61 * (512 + 64 + 512) * 2
    # llama.cpp's, as the seed-004 run's log gives it: c^KV + K^R for 64000 positions = 4289.06 MiB
    assert c.llama_kv_bytes_per_position * 64000 / 2**20 == pytest.approx(4289.06, abs=0.01)


def test_qwq_header_matches_the_published_size(tmp_path):
    p = tmp_path / "qwq.gguf"
    qwq_32b(p)
    c = model_cost(p)
    assert c.n_params == pytest.approx(32.76e9, rel=0.001)
    assert c.kv_bytes_per_position == 64 * 8 * 256 * 2


def split_model(tmp_path, n_layer=6):
    """The same tiny model written whole and in 3 parts (gguf's split writer)."""
    rng = np.random.default_rng(0)
    tensors = [("token_embd.weight", rng.standard_normal((300, 64)).astype(np.float32))]
    for il in range(n_layer):
        for name, shape in (("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)),
                            ("attn_output", (64, 64)), ("ffn_up", (128, 64)), ("ffn_down", (64, 128))):
            tensors.append((f"blk.{il}.{name}.weight", rng.standard_normal(shape).astype(np.float32)))
    tensors.append(("output.weight", rng.standard_normal((300, 64)).astype(np.float32)))

    def write(path, **kw):
        w = gguf.GGUFWriter(str(path), "llama", **kw)
        for key, v in (("block_count", n_layer), ("embedding_length", 64), ("attention.head_count", 4),
                       ("attention.head_count_kv", 2), ("context_length", 512)):
            w.add_uint32(f"llama.{key}", v)
        for name, a in tensors:
            w.add_tensor(name, a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    whole = tmp_path / "whole" / "m.gguf"
    whole.parent.mkdir()
    write(whole)
    split_dir = tmp_path / "split"
    split_dir.mkdir()
    write(split_dir / "m.gguf", split_max_tensors=15)
    parts = sorted(split_dir.glob("*.gguf"))
    return whole, parts


def test_split_file_with_all_parts(tmp_path):
    whole, parts = split_model(tmp_path)
    assert len(parts) == 3 and parts[0].name.endswith("-00001-of-00003.gguf")
    a, b = model_cost(whole), model_cost(parts[0])
    assert b.weight_bytes == a.weight_bytes
    assert b.weight_bytes_per_token == a.weight_bytes_per_token
    assert read_header(parts[0]).parts_found == 3


def test_split_first_part_alone_estimates_the_missing_layers(tmp_path):
    whole, parts = split_model(tmp_path)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(parts[0], alone / parts[0].name)
    h = read_header(alone / parts[0].name)
    assert h.parts_found == 1 and h.parts_total == 3
    assert len(h.tensors) == 1 + 6 * 6 + 1  # every tensor known or estimated (split.tensors.count)
    c = model_cost(h)
    ref = model_cost(whole)
    # identical layers: the estimate is exact here; the note says it is an estimate
    assert c.weight_bytes == ref.weight_bytes
    assert any("estimated" in n for n in c.notes)


def test_flops(tiny_untied):
    c = model_cost(tiny_untied)
    g = read_gguf(tiny_untied)
    mats = [t for n, t in g.tensors.items() if len(t.shape) == 2 and n != "token_embd.weight"]
    assert c.matmul_flops_per_token() == pytest.approx(sum(2 * int(np.prod(t.shape)) for t in mats))
    s = TinySpec()
    # attention: per cached position, per layer, 2 * n_head * (head_dim_k + head_dim_v)
    assert c.attn_flops(10) == 10 * 3 * 2 * s.n_head * 2 * s.head_dim
    out = g.tensors["output.weight"]
    once = 2 * int(np.prod(out.shape)) * (1 - 1 / 64)  # logits only for the batch's last token
    assert c.prompt_flops_per_token(64, 0) == pytest.approx(c.matmul_flops_per_token() - once + c.attn_flops(32))

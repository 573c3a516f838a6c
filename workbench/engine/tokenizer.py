"""Tokenizers built from GGUF vocabulary metadata, matching llama.cpp exactly.

Two tokenizer models are supported (``tokenizer.ggml.model``):

* ``llama`` - SentencePiece-style BPE over UTF-8 characters: spaces become
  U+2581 ("▁"), adjacent symbol pairs are merged greedily by the *score* of
  the merged piece (highest first, leftmost on ties), and characters that do
  not end up inside a vocabulary piece fall back to ``<0xXX>`` byte tokens.
* ``gpt2``  - byte-level BPE: the text is first split by a pre-tokenizer
  (``tokenizer.ggml.pre``), every word is mapped byte -> printable unicode
  char (the GPT-2 table) and merged by the ranks of ``tokenizer.ggml.merges``.

Behaviour follows llama.cpp's ``src/llama-vocab.cpp`` / ``src/unicode.cpp``:

* special-token partition first: the vocabulary's CONTROL, USER_DEFINED and
  UNKNOWN tokens are searched in the text longest-first; USER_DEFINED tokens
  are always split out, CONTROL/UNKNOWN ones only with ``parse_special``;
* token attributes are adjusted the way llama.cpp does at load time
  (end-of-generation / FIM-looking tokens become CONTROL, ...);
* the pre-tokenizer splits are hand-written scanners equivalent to llama.cpp's
  custom implementations of the GPT-2, Llama-3 and Qwen2 regexes (Unicode
  classes come from :mod:`unicodedata`; llama.cpp's own tables may be of a
  newer Unicode version, which only matters for recently assigned chars).

Decoding renders a token like llama.cpp's ``token_to_piece`` (CONTROL and
UNKNOWN tokens are empty unless ``special=True``); :class:`StreamDecoder`
turns a token stream into text without splitting multi-byte characters.
"""

from __future__ import annotations

import heapq
import re
import unicodedata
from array import array
from typing import Any, Iterable, Sequence

import numpy as np

from .vocab import build_vocab

__all__ = ["Tokenizer", "StreamDecoder", "SUPPORTED_MODELS", "SUPPORTED_PRE"]

# GGUF token types (tokenizer.ggml.token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6

# token attributes (bit flags, as in llama.h's llama_token_attr)
A_UNDEFINED = 0
A_UNKNOWN = 1 << 0
A_UNUSED = 1 << 1
A_NORMAL = 1 << 2
A_CONTROL = 1 << 3
A_USER_DEFINED = 1 << 4
A_BYTE = 1 << 5
A_LSTRIP = 1 << 7
A_RSTRIP = 1 << 8

_TYPE_TO_ATTR = np.zeros(8, dtype=np.int32)  # 0 (undefined) and 7+ -> A_UNDEFINED
_TYPE_TO_ATTR[TT_NORMAL] = A_NORMAL
_TYPE_TO_ATTR[TT_UNKNOWN] = A_UNKNOWN
_TYPE_TO_ATTR[TT_CONTROL] = A_CONTROL
_TYPE_TO_ATTR[TT_USER_DEFINED] = A_USER_DEFINED
_TYPE_TO_ATTR[TT_UNUSED] = A_UNUSED
_TYPE_TO_ATTR[TT_BYTE] = A_BYTE

SPACE_ESC = "\u2581"  # "▁"
_C_ISSPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale

SUPPORTED_MODELS = ("llama", "gpt2")

# pre-tokenizer name -> (split kind, flags); the names, kinds and flags are llama-vocab.cpp load()'s
# (a pre-tokenizer whose regex numawb has is listed; the others are refused with the list).
# Flags: ignore_merges, add_bos (model defaults), clean_spaces=False (detokenizing keeps " ." etc.)
_PRE_TABLE: dict[str, tuple[str, dict[str, Any]]] = {}
for _n in ("default",):
    _PRE_TABLE[_n] = ("default", {})
for _n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
           "jina-v5-nano"):
    _PRE_TABLE[_n] = ("llama3", {"ignore_merges": True, "add_bos": True})
for _n in ("dbrx", "smaug-bpe"):
    _PRE_TABLE[_n] = ("llama3", {})
for _n in ("glm4", "chatglm-bpe"):  # the Llama-3 regex, no default BOS
    _PRE_TABLE[_n] = ("llama3", {"no_bos": True})
for _n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"):
    _PRE_TABLE[_n] = ("qwen2", {"clean_spaces": False})
for _n in ("megrez", "stablelm2"):  # the Qwen2 regex, llama.cpp keeps clean_spaces for these
    _PRE_TABLE[_n] = ("qwen2", {})
for _n in ("gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
           "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4", "jina-v1-en",
           "jina-v2-code", "roberta-bpe"):
    _PRE_TABLE[_n] = ("gpt2", {})
for _n in ("trillion", "granite-docling"):
    _PRE_TABLE[_n] = ("gpt2", {"clean_spaces": False})
# StarCoder's: every digit alone, then the GPT-2 regex (SmolLM / SmolLM2 among them)
for _n in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
    _PRE_TABLE[_n] = ("starcoder", {})
for _n in ("smollm", "command-r"):
    _PRE_TABLE[_n] = ("starcoder", {"clean_spaces": False})
SUPPORTED_PRE = tuple(sorted(_PRE_TABLE))

# token texts that llama.cpp treats as end-of-generation (llama-vocab.cpp load())
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
# auto-detected special ids when the GGUF does not name them
_AUTO_IDS: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id",
    "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id",
    "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}
_ID_KEYS_DEPRECATED = {
    "fim_pre": "tokenizer.ggml.prefix_token_id",
    "fim_suf": "tokenizer.ggml.suffix_token_id",
    "fim_mid": "tokenizer.ggml.middle_token_id",
}


# --------------------------------------------------------------------------
# unicode helpers
# --------------------------------------------------------------------------

# character classes used by the pre-tokenizers
F_LETTER, F_NUMBER, F_WS, F_PUNCT, F_SYMBOL, F_MARK = 1, 2, 4, 8, 16, 32
# llama.cpp's whitespace set (unicode_set_whitespace); differs from str.isspace
_WHITESPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680]
    + list(range(0x2000, 0x200B)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)
_flag_cache: dict[str, int] = {}


def _char_flags(ch: str) -> int:
    f = _flag_cache.get(ch)
    if f is None:
        cat = unicodedata.category(ch)
        c0 = cat[0]
        f = 0
        if c0 == "L":
            f = F_LETTER
        elif c0 == "N":
            f = F_NUMBER
        elif c0 == "P":
            f = F_PUNCT
        elif c0 == "S":
            f = F_SYMBOL
        elif c0 == "M":
            f = F_MARK
        if ord(ch) in _WHITESPACE:
            f |= F_WS
        _flag_cache[ch] = f
    return f


for _i in range(128):
    _char_flags(chr(_i))


def _flags_of(text: str) -> list[int]:
    cache = _flag_cache
    get = cache.get
    out = [get(c) for c in text]
    if None in out:
        out = [cache[c] if c in cache else _char_flags(c) for c in text]
    return out


def _gpt2_byte_table() -> list[str]:
    """byte value -> printable unicode char (GPT-2's bytes_to_unicode)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


_BYTE_TO_CHAR = _gpt2_byte_table()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_CHAR)}
_BYTE_ENCODE_TRANS = {b: _BYTE_TO_CHAR[b] for b in range(256)}


def _byte_encode(word: str) -> str:
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_ENCODE_TRANS)


# --------------------------------------------------------------------------
# pre-tokenizer scanners (return lists of words; concatenation == input)
# --------------------------------------------------------------------------

def _contraction(text: str, pos: int, fold: bool) -> int:
    """The length of the contraction 's|'t|'re|'ve|'m|'ll|'d at `text[pos]` (an apostrophe with a
    character after it), 0 for none; `fold`: any case, as Llama-3's (?i:...)."""
    c1 = text[pos + 1]
    c2 = text[pos + 2] if pos + 2 < len(text) else ""
    if fold:
        c1, c2 = c1.lower(), c2.lower()
    if c1 in ("s", "t", "m", "d"):
        return 2
    return 3 if c2 and c1 + c2 in ("re", "ve", "ll") else 0


def split_gpt2(text: str) -> list[str]:
    """GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    n = len(text)
    fl = _flags_of(text)
    out: list[str] = []
    pos = 0
    while pos < n:
        c = text[pos]
        start = pos
        if c == "'" and pos + 1 < n:
            k = _contraction(text, pos, False)
            if k:
                out.append(text[pos:pos + k])
                pos += k
                continue
        if c == " ":
            f2 = fl[pos + 1] if pos + 1 < n else -1
            p = pos + 1
        else:
            f2 = fl[pos]
            p = pos
        if f2 >= 0:
            if f2 & F_LETTER:
                while p < n and fl[p] & F_LETTER:
                    p += 1
                out.append(text[start:p])
                pos = p
                continue
            if f2 & F_NUMBER:
                while p < n and fl[p] & F_NUMBER:
                    p += 1
                out.append(text[start:p])
                pos = p
                continue
            if not f2 & (F_WS | F_LETTER | F_NUMBER):
                while p < n and not fl[p] & (F_WS | F_LETTER | F_NUMBER):
                    p += 1
                out.append(text[start:p])
                pos = p
                continue
        nws = 0
        while pos + nws < n and fl[pos + nws] & F_WS:
            nws += 1
        if nws > 1 and pos + nws < n:  # \s+(?!\S): leave the last space for the next word
            pos += nws - 1
        elif nws > 0:
            pos += nws
        else:
            pos += 1
        out.append(text[start:pos])
    return out


def _split_llama3_like(text: str, max_digits: int) -> list[str]:
    """Llama-3 (max_digits=3) / Qwen2 (max_digits=1) pre-tokenizer:
    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|
     ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+
    """
    n = len(text)
    fl = _flags_of(text)
    out: list[str] = []
    pos = 0
    while pos < n:
        c = text[pos]
        f = fl[pos]
        start = pos
        # (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == "'" and pos + 1 < n:
            k = _contraction(text, pos, True)
            if k:
                out.append(text[pos:pos + k])
                pos += k
                continue
        # [^\r\n\p{L}\p{N}]?\p{L}+
        if not (c == "\r" or c == "\n" or f & F_NUMBER):
            if f & F_LETTER or (pos + 1 < n and fl[pos + 1] & F_LETTER):
                pos += 1
                while pos < n and fl[pos] & F_LETTER:
                    pos += 1
                out.append(text[start:pos])
                continue
        # \p{N}{1,3}
        if f & F_NUMBER:
            while pos < n and fl[pos] & F_NUMBER:
                p = pos
                while p < n and p - pos < max_digits and fl[p] & F_NUMBER:
                    p += 1
                out.append(text[pos:p])
                pos = p
            continue
        # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        if c == " ":
            f2 = fl[pos + 1] if pos + 1 < n else -1
        else:
            f2 = f
        if f2 < 0 or not f2 & (F_WS | F_LETTER | F_NUMBER):
            if c == " ":
                pos += 1
            while pos < n and not fl[pos] & (F_WS | F_LETTER | F_NUMBER):
                pos += 1
            while pos < n and text[pos] in "\r\n":
                pos += 1
            out.append(text[start:pos])
            continue
        # whitespace rules
        nws = 0
        last_rn = -1
        while pos + nws < n and fl[pos + nws] & F_WS:
            if text[pos + nws] in "\r\n":
                last_rn = pos + nws + 1
            nws += 1
        if last_rn > 0:  # \s*[\r\n]+
            pos = last_rn
        elif nws > 1 and pos + nws < n:  # \s+(?!\S)
            pos += nws - 1
        elif nws > 0:  # \s+
            pos += nws
        else:
            pos += 1
        out.append(text[start:pos])
    return out


def split_llama3(text: str) -> list[str]:
    return _split_llama3_like(text, 3)


def split_qwen2(text: str) -> list[str]:
    return _split_llama3_like(text, 1)


# llama.cpp's "default" BPE pre-tokenizer is a chain of four regexes applied
# one after the other, each splitting the pieces produced by the previous one
# into matches and gaps:
#   [\p{P}\$\+<=>\^~\|]+   |  the GPT-2 regex  |  \p{N}+  |  [0-9][0-9][0-9]
# llama.cpp runs the \p{..} ones with std::regex over a "collapsed" text where
# ASCII stays ASCII (so \p{P} means the fixed ASCII set below for ASCII chars).
_ASCII_P = set("!\"#%&'()*,-./:;?@[\\]_{}")
_DEFAULT_PUNCT_ASCII = frozenset(_ASCII_P | set("$+<=>^~|"))


def _is_default_punct(ch: str) -> bool:
    if ord(ch) < 128:
        return ch in _DEFAULT_PUNCT_ASCII
    f = _char_flags(ch)
    return not f & F_WS and f & F_PUNCT != 0


def _is_default_number(ch: str) -> bool:
    if ord(ch) < 128:
        return "0" <= ch <= "9"
    f = _char_flags(ch)
    return not f & F_WS and f & F_NUMBER != 0


def _split_runs(words: list[str], pred) -> list[str]:
    out: list[str] = []
    for w in words:
        i, n = 0, len(w)
        while i < n:
            j = i
            m = pred(w[i])
            while j < n and pred(w[j]) == m:
                j += 1
            out.append(w[i:j])
            i = j
    return out


_ASCII_DIGITS3 = re.compile(r"[0-9]{3}", re.ASCII)


def split_default(text: str) -> list[str]:
    words = _split_runs([text], _is_default_punct)
    words = [p for w in words for p in split_gpt2(w)]
    words = _split_runs(words, _is_default_number)
    out: list[str] = []
    for w in words:
        last = 0
        for m in _ASCII_DIGITS3.finditer(w):
            if m.start() > last:
                out.append(w[last:m.start()])
            out.append(m.group())
            last = m.end()
        if last < len(w):
            out.append(w[last:])
    return out


def split_starcoder(text: str) -> list[str]:
    """StarCoder / SmolLM: ``\\p{N}`` (each digit its own word), then the GPT-2 regex on the rest."""
    out: list[str] = []
    for w in _split_runs([text], _is_default_number):
        if _is_default_number(w[0]):
            out.extend(w)
        else:
            out.extend(split_gpt2(w))
    return out


_SPLITTERS = {"default": split_default, "gpt2": split_gpt2, "llama3": split_llama3, "qwen2": split_qwen2,
              "starcoder": split_starcoder}


# --------------------------------------------------------------------------
# the tokenizer
# --------------------------------------------------------------------------

def _to_str_list(seq) -> list[str]:
    out = list(seq)
    if out and not isinstance(out[0], str):
        out = [t.decode("utf-8", "surrogateescape") if isinstance(t, (bytes, bytearray)) else str(t) for t in out]
    return out


def _as_int(v, default=None):
    if v is None:
        return default
    if isinstance(v, (list, tuple, np.ndarray)):
        v = v[0] if len(v) else default
    return int(v)


def _as_bool(v, default: bool) -> bool:
    if v is None:
        return default
    if isinstance(v, (list, tuple, np.ndarray)):
        v = v[0] if len(v) else default
    return bool(v)


def _merge_symbols(n: int, rank) -> tuple[list[int], list[int]]:
    """llama.cpp's merge loop, shared by its SentencePiece and byte-level BPE tokenizers: `n`
    one-character symbols in a linked list; the adjacent pair of the lowest rank merges first (the
    leftmost of equal ranks), and the merged symbol is ranked again with both neighbours.
    `rank(i, li, j, lj)` ranks the symbol at `i` (`li` characters) followed by the one at `j`, None
    where they do not merge. Returns each symbol's length (0: merged into the one before) and the
    index of the symbol after it (-1 at the end), the first symbol at 0."""
    length = [1] * n
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    if n:
        nxt[-1] = -1
    heap: list = []
    for i in range(n - 1):
        r = rank(i, 1, i + 1, 1)
        if r is not None:
            heap.append((r, i, i + 1, 2))
    heapq.heapify(heap)
    push = heapq.heappush
    pop = heapq.heappop
    while heap:
        _, left, right, size = pop(heap)
        ln = length[left]
        rn = length[right]
        # a stale pair: either side merged since (lengths only grow, so equal sizes mean equal text)
        if ln == 0 or rn == 0 or ln + rn != size:
            continue
        length[left] = size
        length[right] = 0
        r_next = nxt[right]
        nxt[left] = r_next
        if r_next >= 0:
            prev[r_next] = left
        p = prev[left]
        if p >= 0:
            r = rank(p, length[p], left, size)
            if r is not None:
                push(heap, (r, p, left, length[p] + size))
        if r_next >= 0:
            r = rank(left, size, r_next, length[r_next])
            if r is not None:
                push(heap, (r, left, r_next, size + length[r_next]))
    return length, nxt


class Tokenizer:
    """A llama.cpp-compatible tokenizer (see module docstring)."""

    def __init__(self, *, model: str, tokens: list[str], scores: Sequence[float] | None,
                 token_types: Sequence[int] | None, merges: Sequence[str] | None = None,
                 pre: str | None = None, special_ids: dict[str, int] | None = None,
                 add_bos: bool | None = None, add_eos: bool | None = None,
                 add_space_prefix: bool | None = None, model_name: str = "") -> None:
        if model not in SUPPORTED_MODELS:
            raise ValueError(
                f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); supported: "
                + ", ".join(SUPPORTED_MODELS))
        self.model = model
        n = len(tokens)
        if n == 0:
            raise ValueError("tokenizer vocabulary (tokenizer.ggml.tokens) is empty")
        tokens = list(tokens)
        # empty texts renamed, as llama.cpp
        if "" in tokens:
            for i, t in enumerate(tokens):
                if t == "":
                    tokens[i] = f"[EMPTY_{i}]"
        # id -> text and text -> id (a later duplicate wins, as in llama.cpp), kept compact: one UTF-8
        # blob and a hash table (~9 MiB for a 262k vocabulary) rather than a list of str and a dict
        # (~35 MiB); see vocab.py. ``tokens`` (a list) and its strings are dropped after __init__.
        self.tokens, t2i = build_vocab(tokens)
        self._t2i = t2i

        # scores as float32 (like llama.cpp), read back as Python floats: 4 bytes a token instead of a
        # list of float objects (~32 bytes a token, 8 MB for a 262k vocabulary)
        if scores is None:
            self._scores = array("f", bytes(4 * n))
        else:
            sc = np.asarray(scores)
            if len(sc) < n:
                raise ValueError(f"tokenizer.ggml.scores has {len(sc)} entries for {n} tokens")
            self._scores = array("f", sc[:n].astype(np.float32).tobytes())
        if token_types is None:
            attr = np.full(n, A_NORMAL, dtype=np.int32)
        else:
            tt = np.asarray(token_types, dtype=np.int64)
            if len(tt) < n:
                raise ValueError(f"tokenizer.ggml.token_type has {len(tt)} entries for {n} tokens")
            tt = tt[:n]
            attr = np.where((tt >= 0) & (tt < 8), _TYPE_TO_ATTR[np.clip(tt, 0, 7)], A_UNDEFINED).astype(np.int32)

        # ---- model-level defaults (llama-vocab.cpp load())
        clean_spaces = False
        self._ignore_merges = False
        if model == "llama":
            ids = {"bos": 1, "eos": 2, "unk": 0}
            d_add_bos, d_add_eos, d_space = True, False, True
            self._split = None
            self.pre = "default"
            self._bpe_ranks: dict[tuple[str, str], int] = {}
        else:  # gpt2
            ids = {"bos": 11, "eos": 11}
            d_add_bos, d_add_eos, d_space = False, False, False
            clean_spaces = True
            pre = pre or "default"
            if pre not in _PRE_TABLE:
                raise ValueError(
                    f"unsupported pre-tokenizer {pre!r} (tokenizer.ggml.pre) for gpt2 tokenizer; supported: "
                    + ", ".join(SUPPORTED_PRE))
            kind, flags = _PRE_TABLE[pre]
            self.pre = pre
            self._split = _SPLITTERS[kind]
            self._ignore_merges = bool(flags.get("ignore_merges", False))
            if flags.get("add_bos"):
                d_add_bos = True
            if flags.get("no_bos"):
                ids["bos"] = None
            if flags.get("clean_spaces") is False:
                clean_spaces = False
            if merges is None:
                raise ValueError("gpt2 tokenizer needs tokenizer.ggml.merges, which is missing")
            ranks: dict[tuple[str, str], int] = {}
            for r, m in enumerate(_to_str_list(merges)):
                p = m.find(" ", 1)
                key = (m[:p], m[p + 1:]) if p >= 0 else ("", "")
                if key not in ranks:
                    ranks[key] = r
            self._bpe_ranks = ranks
        self.clean_spaces = clean_spaces
        for k in list(ids):
            if ids[k] is not None and ids[k] >= n:
                ids[k] = None
        for k, v in (special_ids or {}).items():
            if v is None:
                continue
            if 0 <= int(v) < n:
                ids[k] = int(v)
        self._ids = ids
        self._add_bos = d_add_bos if add_bos is None else bool(add_bos)
        self._add_eos = d_add_eos if add_eos is None else bool(add_eos)
        self.add_space_prefix = d_space if add_space_prefix is None else bool(add_space_prefix)

        # ---- auto-detected specials and attribute fix-ups (as llama.cpp)
        def mark_control(tid: int) -> None:
            attr[tid] |= A_CONTROL

        for kind_name, names in _AUTO_IDS.items():
            if ids.get(kind_name) is None:
                found = [t2i[s] for s in names if s in t2i]
                if found:
                    ids[kind_name] = min(found)
                    mark_control(ids[kind_name])
        ctrl = np.nonzero(attr & A_CONTROL)[0]
        for tid in ctrl.tolist():
            if "unused" in tokens[tid]:
                attr[tid] |= A_UNUSED
        eog: set[int] = set()
        for k in ("fim_pad", "fim_rep", "fim_sep"):
            if ids.get(k) is not None:
                eog.add(ids[k])
        for s in _EOG_TEXTS:
            tid = t2i.get(s)
            if tid is not None:
                eog.add(tid)
                mark_control(tid)
        for s in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            tid = t2i.get(s)
            if tid is not None:
                attr[tid] = A_USER_DEFINED
        for k in ("eos", "eot", "eom"):
            if ids.get(k) is not None:
                eog.add(ids[k])
        texts = {tokens[t]: t for t in eog}
        if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                                   or ("<|flush|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))):
            e = texts["<|end|>"]
            eog.discard(e)
            attr[e] = A_USER_DEFINED
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            e = texts["</s>"]
            eog.discard(e)
            attr[e] = A_NORMAL
        self._eog = frozenset(eog)

        # special tokens for the partition, longest text first
        special = np.nonzero(attr & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN))[0].tolist()
        special.sort(key=lambda t: -len(tokens[t].encode("utf-8", "surrogateescape")))
        name = (model_name or "").lower()
        if "phi-3" in name or "phi3" in name:
            for t in special:
                attr[t] |= A_RSTRIP
            for s, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                t = t2i.get(s)
                if t is not None:
                    attr[t] = (attr[t] | A_RSTRIP) if on else (attr[t] & ~A_RSTRIP)
        self._attr = array("i", attr.astype(np.int32).tobytes())  # read back as ints; 4 bytes a token
        self._special = special
        self._special_all = [(t, tokens[t], self._attr[t]) for t in special]

        # byte fallback ids
        if model == "llama":
            self._byte_ids = [t2i.get(f"<0x{b:02X}>", t2i.get(chr(b)) if b < 128 else None) for b in range(256)]
        else:
            self._byte_ids = [t2i.get(_BYTE_TO_CHAR[b]) for b in range(256)]
        self._piece_cache: dict[int, bytes] = {}
        self._word_cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------
    @classmethod
    def from_metadata(cls, md: dict) -> "Tokenizer":
        """Build from GGUF metadata (keys -> python values)."""
        model = md.get("tokenizer.ggml.model")
        if model is None:
            raise ValueError("GGUF metadata has no tokenizer (tokenizer.ggml.model is missing)")
        if isinstance(model, (bytes, bytearray)):
            model = model.decode("utf-8")
        model = str(model)
        if model not in SUPPORTED_MODELS:
            raise ValueError(
                f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); supported: "
                + ", ".join(SUPPORTED_MODELS))
        toks = md.get("tokenizer.ggml.tokens")
        if toks is None:
            raise ValueError("GGUF metadata has no vocabulary (tokenizer.ggml.tokens is missing)")
        pre = md.get("tokenizer.ggml.pre")
        if isinstance(pre, (bytes, bytearray)):
            pre = pre.decode("utf-8")
        special_ids: dict[str, int] = {}
        for k, key in _ID_KEYS_DEPRECATED.items():
            if md.get(key) is not None:
                special_ids[k] = _as_int(md[key])
        for k, key in _ID_KEYS.items():
            if md.get(key) is not None:
                special_ids[k] = _as_int(md[key])
        return cls(
            model=model,
            tokens=_to_str_list(toks),
            scores=md.get("tokenizer.ggml.scores"),
            token_types=md.get("tokenizer.ggml.token_type"),
            merges=md.get("tokenizer.ggml.merges"),
            pre=str(pre) if pre else None,
            special_ids=special_ids,
            add_bos=_as_bool(md.get("tokenizer.ggml.add_bos_token"), None) if md.get("tokenizer.ggml.add_bos_token") is not None else None,
            add_eos=_as_bool(md.get("tokenizer.ggml.add_eos_token"), None) if md.get("tokenizer.ggml.add_eos_token") is not None else None,
            add_space_prefix=(_as_bool(md.get("tokenizer.ggml.add_space_prefix"), True)
                              if md.get("tokenizer.ggml.add_space_prefix") is not None else None),
            model_name=str(md.get("general.name") or ""),
        )

    # ------------------------------------------------------------------ properties
    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def bos_id(self) -> int | None:
        return self._ids.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self._ids.get("eos")

    @property
    def unk_id(self) -> int | None:
        return self._ids.get("unk")

    @property
    def eot_ids(self) -> frozenset[int]:
        """All end-of-generation ids (llama.cpp's special_eog_ids)."""
        return self._eog

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    @property
    def add_eos(self) -> bool:
        return self._add_eos

    @property
    def vocab(self):
        """Every token text, as a set-like view of the token -> id table (no copy)."""
        return self._t2i.keys()

    def token_text(self, tid: int) -> str:
        return self.tokens[tid]

    def token_id(self, text: str) -> int | None:
        """Id of the vocabulary entry whose text is exactly ``text``."""
        return self._t2i.get(text)

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = False,
               add_eos: bool | None = None) -> list[int]:
        """Token ids for ``text`` exactly as llama.cpp's ``llama_tokenize``.

        ``add_bos=None`` follows the model (``tokenizer.ggml.add_bos_token``),
        which is what llama.cpp's ``add_special=True`` does; ``add_bos=True``
        always prepends BOS and ``False`` never does. ``add_eos`` likewise
        (``None``: the model's ``add_eos_token`` flag, only when BOS handling
        is also left to the model or forced on). ``parse_special`` turns
        CONTROL token texts (e.g. ``<start_of_turn>``) into their ids;
        USER_DEFINED tokens are always matched.
        """
        if add_eos is None:
            add_eos = self._add_eos and add_bos is not False
        if add_bos is None:
            add_bos = self._add_bos
        out: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos requested but the vocabulary has no BOS token")
            out.append(self.bos_id)
        frags = self._partition(text, parse_special) if text else []
        if self.model == "llama":
            prev_special = True
            for fr in frags:
                if isinstance(fr, int):
                    out.append(fr)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    fr = " " + fr
                self._spm(fr.replace(" ", SPACE_ESC), out)
                prev_special = False
        else:
            for fr in frags:
                if isinstance(fr, int):
                    out.append(fr)
                else:
                    self._bpe(fr, out)
        if add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """Split ``text`` into raw-text fragments and special token ids
        (llama.cpp tokenizer_st_partition)."""
        frags: list = [text]
        for tid, tt, at in self._special_all:
            if not parse_special and at & (A_CONTROL | A_UNKNOWN):
                continue
            if not any(isinstance(f, str) and tt in f for f in frags):
                continue
            new: list = []
            lstrip = at & A_LSTRIP
            rstrip = at & A_RSTRIP
            L = len(tt)
            for f in frags:
                if isinstance(f, int) or tt not in f:
                    new.append(f)
                    continue
                base, n = 0, len(f)
                while True:
                    m = f.find(tt, base)
                    if m < 0:
                        break
                    if m > base:
                        left = f[base:m]
                        if lstrip:
                            left = left.rstrip(_C_ISSPACE)
                        if left:
                            new.append(left)
                    new.append(tid)
                    base = m + L
                    if rstrip:
                        while base < n and f[base] in _C_ISSPACE:
                            base += 1
                    if base >= n:
                        break
                if base < n:
                    new.append(f[base:])
            frags = new
        return frags

    # -- SentencePiece BPE over characters (llm_tokenizer_spm)
    def _spm(self, text: str, out: list[int]) -> None:
        if not text:
            return
        get = self._t2i.get
        scores = self._scores

        def rank(i: int, li: int, j: int, lj: int):
            # the merged piece's score, highest first
            tid = get(text[i:i + li + lj])
            return None if tid is None else -scores[tid]

        length, nxt = _merge_symbols(len(text), rank)
        i = 0
        while i != -1:
            self._spm_emit(text[i:i + length[i]], out)
            i = nxt[i]

    def _spm_emit(self, piece: str, out: list[int]) -> None:
        tid = self._t2i.get(piece)
        if tid is not None:
            out.append(tid)
            return
        # a symbol that is not a vocabulary piece is always a single character
        # here (merged symbols are pieces by construction): emit its bytes
        for b in piece.encode("utf-8", "surrogatepass"):
            bid = self._byte_ids[b]
            if bid is None:
                bid = self.unk_id
                if bid is None:
                    raise ValueError(f"no byte-fallback token for byte 0x{b:02X} and no <unk> token")
            out.append(bid)

    # -- byte-level BPE (llm_tokenizer_bpe)
    def _bpe(self, text: str, out: list[int]) -> None:
        cache = self._word_cache
        for word in self._split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(_byte_encode(word))
                if len(cache) > 50000:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, w: str) -> list[int]:
        get = self._t2i.get
        if self._ignore_merges:
            tid = get(w)
            if tid is not None:
                return [tid]
        ranks = self._bpe_ranks

        def rank(i: int, li: int, j: int, lj: int):
            # the pair's merge rank, lowest first
            return ranks.get((w[i:i + li], w[j:j + lj]))

        n = len(w)
        length, nxt = _merge_symbols(n, rank)
        out: list[int] = []
        i = 0 if n else -1
        while i != -1:
            piece = w[i:i + length[i]]
            tid = get(piece)
            if tid is not None:
                out.append(tid)
            else:
                # llama.cpp looks up every UTF-8 byte of the encoded piece as a
                # one-byte token; only ASCII bytes can match
                for b in piece.encode("utf-8"):
                    if b < 0x80:
                        bt = get(chr(b))
                        if bt is not None:
                            out.append(bt)
            i = nxt[i]
        return out

    # ------------------------------------------------------------------ decoding
    def token_to_bytes(self, tid: int, special: bool = False) -> bytes:
        """The piece of one token as raw bytes (llama.cpp token_to_piece)."""
        at = self._attr[tid]
        if not special and at & (A_UNKNOWN | A_CONTROL):
            return b""
        if special:
            return self._piece(tid)
        c = self._piece_cache.get(tid)
        if c is None:
            c = self._piece(tid)
            self._piece_cache[tid] = c
        return c

    def _piece(self, tid: int) -> bytes:
        at = self._attr[tid]
        text = self.tokens[tid]
        if at & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if at & A_NORMAL:
            if self.model == "llama":
                return text.replace(SPACE_ESC, " ").encode("utf-8", "surrogateescape")
            out = bytearray()
            for ch in text:
                b = _CHAR_TO_BYTE.get(ch)
                if b is None:
                    out += b"[UNK_BYTE_0x" + ch.encode("utf-8", "surrogateescape").hex().encode() \
                        + text.encode("utf-8", "surrogateescape") + b"]"
                else:
                    out.append(b)
            return bytes(out)
        if at & A_BYTE:
            if self.model == "llama" or text.startswith("<0x"):
                return bytes([int(text[3:5], 16)])
            b = _CHAR_TO_BYTE.get(text)
            return bytes([b]) if b is not None else b""
        return b""

    def decode_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
        parts = [self.token_to_bytes(int(t), special) for t in ids]
        if self.add_space_prefix:
            for i, p in enumerate(parts):
                if p:
                    if p[:1] == b" ":
                        parts[i] = p[1:]
                    break
        return b"".join(parts)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of a token sequence. Control tokens are dropped unless
        ``special``; with ``add_space_prefix`` the first text piece loses one
        leading space (the one encode() adds). Invalid UTF-8 -> U+FFFD."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, add_bos={self.add_bos})")


def _complete_prefix_len(buf: bytes | bytearray) -> int:
    """Length of the prefix of ``buf`` that does not end inside an incomplete
    (but so far valid-looking) UTF-8 sequence."""
    n = len(buf)
    i = n - 1
    k = 0
    while i >= 0 and k < 3 and (buf[i] & 0xC0) == 0x80:
        i -= 1
        k += 1
    if i < 0:
        return n
    b = buf[i]
    if b >= 0xF0 and b <= 0xF4:
        need = 4
    elif b >= 0xE0 and b < 0xF0:
        need = 3
    elif b >= 0xC2 and b < 0xE0:
        need = 2
    else:
        return n
    return i if n - i < need else n


class StreamDecoder:
    """Incremental detokenizer: ``feed(id)`` returns the newly completed text,
    holding back bytes of a UTF-8 character split across tokens; ``flush()``
    returns whatever is left (invalid bytes become U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False, strip_leading_space: bool = False) -> None:
        self.tok = tokenizer
        self.special = special
        self._buf = bytearray()
        self._strip = strip_leading_space
        self._started = False

    def feed(self, tid: int) -> str:
        piece = self.tok.token_to_bytes(int(tid), self.special)
        if not piece:
            return ""
        if self._strip and not self._started and piece[:1] == b" ":
            piece = piece[1:]
        self._started = True
        self._buf += piece
        cut = _complete_prefix_len(self._buf)
        if cut == 0:
            return ""
        text = bytes(self._buf[:cut]).decode("utf-8", errors="replace")
        del self._buf[:cut]
        return text

    def flush(self) -> str:
        text = bytes(self._buf).decode("utf-8", errors="replace")
        self._buf.clear()
        return text

    def reset(self) -> None:
        self._buf.clear()
        self._started = False

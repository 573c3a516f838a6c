"""A compact token vocabulary: every token text in one UTF-8 blob.

A 262k-entry vocabulary kept as a ``list[str]`` plus a ``dict[str, int]``
costs ~35 MiB of Python objects (a str object per token, the dict's table and
an int object per id above 256). :func:`build_vocab` keeps the same
information in a few flat buffers (~9 MiB for Gemma 3's vocabulary):

* the texts, UTF-8 encoded (``surrogatepass``: any Python str round-trips)
  and concatenated into one ``bytes`` blob, with an offsets array;
* an open-addressing hash table (linear probing, a power-of-two size of at
  least twice the number of distinct texts) of ids, with the upper 32 bits of
  each text's ``hash()`` as a tag; a lookup walks from ``hash(text) & mask``
  to an empty slot, and a slot whose tag matches is confirmed by comparing the
  stored text, so lookups are exact (the table is built in-process, so
  Python's per-process string hash is fine).

Two facades keep the tokenizer's code unchanged: :class:`TokenTexts`, a
sequence id -> text (``tokens[i]``, ``len``, iteration), and
:class:`TokenIds`, a mapping text -> id (``get``, ``[]``, ``in``, ``keys()``,
``len``). A later duplicate text wins for text -> id, as in llama.cpp.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

_ENC = "utf-8"
_ERRORS = "surrogatepass"  # a bijection between Python str and bytes, lone surrogates included


def _offsets_array(lengths: np.ndarray) -> array:
    ends = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ends[1:])
    if ends[-1] < 2**31:
        return array("i", ends.astype(np.int32).tobytes())
    return array("q", ends.tobytes())


class TokenTexts(Sequence):
    """Token id -> text, read from one UTF-8 blob (a read-only sequence of str)."""

    __slots__ = ("_blob", "_off", "_n")

    def __init__(self, blob: bytes, offsets: array) -> None:
        self._blob = blob
        self._off = offsets
        self._n = len(offsets) - 1

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("token id out of range")
        off = self._off
        return self._blob[off[i]:off[i + 1]].decode(_ENC, _ERRORS)

    def __iter__(self) -> Iterator[str]:
        blob, off = self._blob, self._off
        a = off[0]
        for i in range(1, self._n + 1):
            b = off[i]
            yield blob[a:b].decode(_ENC, _ERRORS)
            a = b

    def byte_len(self, i: int) -> int:
        """Length in UTF-8 bytes of token ``i``'s text (no decoding)."""
        return self._off[i + 1] - self._off[i]

    @property
    def nbytes(self) -> int:
        return len(self._blob) + self._off.itemsize * len(self._off)

    def __reduce__(self):
        return (TokenTexts, (self._blob, self._off))

    def __repr__(self) -> str:
        return f"TokenTexts({self._n} tokens, {self.nbytes} bytes)"


class TokenIds(Mapping):
    """Token text -> id: an open-addressing hash table over a :class:`TokenTexts`."""

    __slots__ = ("texts", "_blob", "_off", "_mask", "_ids", "_tags", "_count")

    def __init__(self, texts: TokenTexts, slot_ids: array, slot_tags: array, count: int) -> None:
        self.texts = texts
        self._blob = texts._blob
        self._off = texts._off
        self._mask = len(slot_ids) - 1
        self._ids = slot_ids
        self._tags = slot_tags
        self._count = count

    def get(self, text, default=None):
        h = hash(text)
        mask = self._mask
        i = h & mask
        tag = h >> 32
        ids = self._ids
        tags = self._tags
        while True:
            tid = ids[i]
            if tid < 0:
                return default
            if tags[i] == tag:
                off = self._off
                if self._blob[off[tid]:off[tid + 1]].decode(_ENC, _ERRORS) == text:
                    return tid
            i = (i + 1) & mask

    def __getitem__(self, text) -> int:
        tid = self.get(text)
        if tid is None:
            raise KeyError(text)
        return tid

    def __contains__(self, text) -> bool:
        try:
            return self.get(text) is not None
        except TypeError:  # unhashable
            return False

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        """The distinct texts, in id order of the id each maps to."""
        ids = np.frombuffer(self._ids, dtype=np.int32)
        texts = self.texts
        for tid in np.sort(ids[ids >= 0]).tolist():
            yield texts[tid]

    @property
    def nbytes(self) -> int:
        return self._ids.itemsize * len(self._ids) + self._tags.itemsize * len(self._tags)

    def __reduce__(self):
        return (_rebuild_ids, (self.texts,))

    def __repr__(self) -> str:
        return f"TokenIds({self._count} texts, {len(self._ids)} slots)"


def _rebuild_ids(texts: TokenTexts) -> TokenIds:
    return build_vocab(list(texts))[1]


def _hash_table(hashes: np.ndarray, keep: np.ndarray, size: int) -> tuple[array, array]:
    """Insert ids ``keep`` (with 64-bit ``hashes`` indexed by id) into a linear-probing table of
    ``size`` slots (a power of two). Vectorised in rounds: every pending id tries its current slot;
    among the ids aiming at the same empty slot the lowest-numbered wins and the rest move one slot
    on. A slot never empties again, so every slot between an id's home slot and the slot it ends in
    is occupied: a lookup that walks from the home slot to the first empty one finds it."""
    mask = size - 1
    slot_ids = np.full(size, -1, dtype=np.int32)
    pend = keep.astype(np.int64)
    pos = hashes[pend] & mask
    while len(pend):
        free = slot_ids[pos] < 0
        cand_pos, cand_ids = pos[free], pend[free]
        # first of each slot among the candidates (pend stays in ascending id order)
        won_pos, first = np.unique(cand_pos, return_index=True)
        slot_ids[won_pos] = cand_ids[first]
        placed = np.zeros(len(pend), dtype=bool)
        placed_idx = np.nonzero(free)[0][first]
        placed[placed_idx] = True
        pend, pos = pend[~placed], (pos[~placed] + 1) & mask
    tags = np.zeros(size, dtype=np.int32)
    used = slot_ids >= 0
    tags[used] = (hashes[slot_ids[used]] >> 32).astype(np.int32)
    return array("i", slot_ids.tobytes()), array("i", tags.tobytes())


def build_vocab(texts: Iterable[str], *, table_size: int | None = None) -> tuple[TokenTexts, TokenIds]:
    """The compact id -> text sequence and text -> id mapping of ``texts``.

    A later duplicate text wins for text -> id. ``table_size`` (a power of two larger than the
    number of distinct texts) overrides the default of at least twice that; tests use a tiny one
    to force collisions.
    """
    texts = texts if isinstance(texts, list) else list(texts)
    n = len(texts)
    parts = [t.encode(_ENC, _ERRORS) for t in texts]
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=n)
    seq = TokenTexts(b"".join(parts), _offsets_array(lengths))
    del parts
    hashes = np.fromiter(map(hash, texts), dtype=np.int64, count=n)
    # the last id of each distinct text (later duplicates win)
    last = dict(zip(texts, range(n)))
    keep = np.fromiter(last.values(), dtype=np.int64, count=len(last))
    count = len(last)
    del last
    keep.sort()
    if table_size is None:
        table_size = 8
        while table_size < 2 * count:
            table_size *= 2
    elif table_size & (table_size - 1) or table_size <= count:
        raise ValueError(f"table_size must be a power of two larger than {count}")
    slot_ids, slot_tags = _hash_table(hashes, keep, table_size)
    return seq, TokenIds(seq, slot_ids, slot_tags, count)

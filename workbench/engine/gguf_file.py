"""A fast, validating GGUF header reader.

`gguf.GGUFReader` parses every array element into its own NumPy view, which
takes ~20 s on the default model's 262,144-entry vocabulary, and it trusts the
header (a corrupt count can make it allocate terabytes). This reader uses the
`gguf` package's type tables but parses the header itself, checking every
count and size against the file before anything is allocated. Tensor data is
never read here: the loader reads it into placed buffers.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_COUNT = 1 << 24  # tensors or metadata keys; real files have a few thousand

# GGUF metadata value types -> (struct code, size); STRING = 8, ARRAY = 9.
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NP_SCALARS = {
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
    6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64,
}
_STRING, _ARRAY = 8, 9


class ModelLoadError(ValueError):
    """A model file that cannot be used; the message is one line naming the problem.

    Messages quote names read from the file (keys, tensor names), which may hold any character:
    control characters such as a newline are shown escaped, so the message stays one line."""

    def __init__(self, message: str = "") -> None:
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message)))


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: shape[0] is the row length (ne0)
    ggml_type: int
    offset: int  # absolute file offset of the data
    nbytes: int
    path: str = ""  # the file holding the data (a split model's part); "" = the model's file

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type#{self.ggml_type}"

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        return self.nbytes // max(self.rows, 1)

    @property
    def is_expert(self) -> bool:
        """A routed experts' tensor (3-D, one slice per expert: ``blk.N.ffn_*_exps``)."""
        return "_exps" in self.name


@dataclass
class GGUFFile:
    path: str
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data_offset: int
    file_size: int
    parts: tuple[str, ...] = ()  # a split model's files, first part first (else empty)
    header_bytes: int = 0        # where the tensor table ends (before the data's alignment padding)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, size: int, path: str):
        self.buf, self.size, self.pos, self.path = buf, size, 0, path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelLoadError(
                f"{self.path}: header cut short while reading {what} "
                f"(needs {n} bytes at offset {self.pos}, file has {self.size})")

    def scalar(self, code: str, size: int, what: str) -> Any:
        self.need(size, what)
        (v,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return self.scalar("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", 8, what)

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(*_SCALARS[vtype], key)
        if vtype == _STRING:
            return self.string(key)
        if vtype == _ARRAY:
            etype = self.u32(key)
            count = self.u64(key)
            if etype in _NP_SCALARS:
                size = _SCALARS[etype][1]
                self.need(count * size, f"array {key!r} of {count} items")
                arr = np.frombuffer(self.buf, dtype=_NP_SCALARS[etype], count=count, offset=self.pos).copy()
                self.pos += count * size
                return arr
            if etype == _STRING:
                # each string needs at least its 8-byte length: reject absurd counts up front
                self.need(count * 8, f"array {key!r} of {count} strings")
                return [self.string(key) for _ in range(count)]
            raise ModelLoadError(f"{self.path}: metadata {key!r} is an array of unsupported type {etype}")
        raise ModelLoadError(f"{self.path}: metadata {key!r} has unknown value type {vtype}")


def _check_path(path: str) -> int:
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a directory, not a GGUF file")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"{path}: permission denied (file is not readable)")
    return os.path.getsize(path)


SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_part_path(first: str, no: int, count: int) -> str:
    """llama.cpp's name of part `no` (1-based) of `count`, next to the first part."""
    m = SPLIT_NAME.match(first)
    prefix = m.group("prefix") if m else first[:-5] if first.endswith(".gguf") else first
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse and validate a GGUF file's header and tensor table; a split model (split.count > 1)
    is read from its first part, the others found next to it and checked (count, order, missing
    part), each tensor remembering the part that holds it."""
    g = _read_one(os.fspath(path))
    count = int(g.metadata.get("split.count", 1) or 1)
    if count <= 1:
        return g
    no = int(g.metadata.get("split.no", 0))
    if no != 0:
        raise ModelLoadError(f"{g.path} is part {no + 1} of a {count}-part split model: "
                             f"pass the first part ({os.path.basename(split_part_path(g.path, 1, count))})")
    tensors = dict(g.tensors)
    parts = [g.path]
    size = g.file_size
    for i in range(1, count):
        part = split_part_path(g.path, i + 1, count)
        if not os.path.exists(part):
            raise ModelLoadError(f"split model part {i + 1} of {count} is missing: {part}")
        pg = _read_one(part)
        pc, pn = int(pg.metadata.get("split.count", 1) or 1), int(pg.metadata.get("split.no", -1))
        if pc != count:
            raise ModelLoadError(f"{part} belongs to a {pc}-part split, not to this {count}-part one")
        if pn != i:
            raise ModelLoadError(f"{part} says it is part {pn + 1}, expected part {i + 1} (parts out of order)")
        for name, t in pg.tensors.items():
            if name in tensors:
                raise ModelLoadError(f"{part}: tensor {name!r} is also in an earlier part")
            tensors[name] = t
        parts.append(part)
        size += pg.file_size
    want = g.metadata.get("split.tensors.count")
    if want is not None and int(want) != len(tensors):
        raise ModelLoadError(f"split model has {len(tensors)} tensors in its {count} parts, "
                             f"its first part says {int(want)}")
    return GGUFFile(g.path, g.version, g.metadata, tensors, g.data_offset, size, tuple(parts), g.header_bytes)


def read_gguf_header(path: str | os.PathLike) -> GGUFFile:
    """One file's header and tensor table, without checking that the tensor data is there: what
    the advisor reads of a 700 GB file, a split file's first part or a partial download."""
    return _read_one(os.fspath(path), check_data=False)


def _read_one(path: str, check_data: bool = True) -> GGUFFile:
    size = _check_path(path)
    if size < 24:
        raise ModelLoadError(f"{path}: not a GGUF file (only {size} bytes)")
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read file ({e.strerror or e})") from None
    try:
        return _parse(buf, size, path, check_data)
    finally:
        buf.close()


def _parse(buf: mmap.mmap, size: int, path: str, check_data: bool = True) -> GGUFFile:
    cur = _Cursor(buf, size, path)
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (bad magic {bytes(buf[:4])!r})")
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise ModelLoadError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    if n_tensors > MAX_COUNT or n_kv > MAX_COUNT:
        raise ModelLoadError(f"{path}: absurd header counts ({n_tensors} tensors, {n_kv} metadata keys)")

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        vtype = cur.u32(f"type of {key!r}")
        metadata[key] = cur.value(vtype, key)

    raw_tensors = []
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        n_dims = cur.u32(f"dimensions of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelLoadError(f"{path}: tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(cur.u64(f"shape of {name!r}") for _ in range(n_dims))
        ggml_type = cur.u32(f"type of {name!r}")
        offset = cur.u64(f"offset of {name!r}")
        raw_tensors.append((name, shape, ggml_type, offset))

    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise ModelLoadError(f"{path}: general.alignment {alignment} is not a power of two")
    header_end = cur.pos
    data_offset = (cur.pos + alignment - 1) // alignment * alignment

    tensors: dict[str, TensorInfo] = {}
    for name, shape, ggml_type, offset in raw_tensors:
        if name in tensors:
            raise ModelLoadError(f"{path}: tensor {name!r} appears twice")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise ModelLoadError(f"{path}: tensor {name!r} has unknown type id {ggml_type}") from None
        if any(d == 0 for d in shape) or any(d > 1 << 40 for d in shape):
            raise ModelLoadError(f"{path}: tensor {name!r} has absurd shape {list(shape)}")
        if shape[0] % block:
            raise ModelLoadError(f"{path}: tensor {name!r} row length {shape[0]} is not a multiple of its block size {block}")
        n = 1
        for d in shape:
            n *= d
        nbytes = n // block * type_size
        if offset % alignment:
            raise ModelLoadError(f"{path}: tensor {name!r} offset {offset} is not aligned to {alignment}")
        start = data_offset + offset
        if check_data and start + nbytes > size:
            raise ModelLoadError(
                f"{path}: tensor {name!r} data ends at byte {start + nbytes} past the end of the file "
                f"({size} bytes; file truncated?)")
        tensors[name] = TensorInfo(name, shape, ggml_type, start, nbytes, path)

    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values()) if check_data else []
    for (a0, a1, an), (b0, _b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ModelLoadError(f"{path}: tensors {an!r} and {bn!r} overlap in the file")
    return GGUFFile(path, version, metadata, tensors, data_offset, size, header_bytes=header_end)


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """Only the metadata key/value pairs (what the tokenizer needs)."""
    return read_gguf(path).metadata

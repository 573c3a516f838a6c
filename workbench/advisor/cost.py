"""What one token costs a model, from its GGUF header alone.

Only the header (metadata and tensor infos) is parsed; no tensor byte is read, so this works on a
700 GB file, on the first part of a split file, and on a partial download cut short after its
header. Counts and sizes are checked as they are read, so a corrupt header gives one clear line.

Per decoded token the engine reads every weight matrix once (a row split over the workers), except:

* ``token_embd``: one row is looked up, unless it is also the output matrix (no ``output.weight``);
* routed experts (``blk.N.ffn_*_exps``, one slice per expert): ``expert_used_count / expert_count``
  of their bytes (the average over tokens); shared experts (``*_shexp``) are read fully;
* the KV cache: every cached position of every layer (f16 keys and values, like llama.cpp's default
  cache type): ``n_head_kv * (key_length + value_length) * 2`` bytes per position per layer, or for
  MLA (``deepseek2`` with ``attention.kv_lora_rank``) the compressed latent plus the rope part and
  the latent transposed (numawb's `MLACache`), ``(2 * kv_lora_rank + rope dims) * 2`` (files in
  the older layout with ``attn_kv_b`` cache full heads and count as dense); sliding-window layers
  (Gemma 3) read at most their window.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # the engine's reader is imported where a header is read (`_parse`)
    from ..engine.gguf_file import TensorInfo

_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


class HeaderError(ValueError):
    """A file whose header cannot be used; the message is one line."""


@dataclass
class Header:
    """Metadata and tensor infos of one GGUF file (or of all parts of a split file found)."""

    path: str
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    file_size: int
    header_bytes: int
    parts_found: int = 1
    parts_total: int = 1
    notes: list[str] = field(default_factory=list)
    #: tensors whose info is copied from a sibling layer (a missing split part): no data behind them
    estimated: set[str] = field(default_factory=set)

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def key(self, name: str, default: Any = None) -> Any:
        """``{arch}.{name}`` from the metadata."""
        return self.metadata.get(f"{self.arch}.{name}", default)


def _parse(path: str) -> Header:
    """One file's header through the engine's GGUF reader (tensor data not required)."""
    from ..engine.gguf_file import ModelLoadError, read_gguf_header
    try:
        g = read_gguf_header(path)
    except ModelLoadError as e:
        raise HeaderError(str(e)) from None
    md = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in g.metadata.items()}
    return Header(path, md, dict(g.tensors), g.file_size, g.header_bytes)


def _split_parts(path: str, md: dict[str, Any]) -> tuple[list[str], int]:
    """Paths of the sibling parts of a split file (``-00001-of-00005.gguf``) and their count."""
    from ..engine.gguf_file import SPLIT_NAME, split_part_path
    m = SPLIT_NAME.match(os.path.basename(path))
    count = int(md.get("split.count", 0) or 0)
    if not m:
        return [], count or 1
    count = count or int(m.group("count"))
    return [split_part_path(path, k, int(m.group("count"))) for k in range(1, count + 1)], count


def read_header(path: str | os.PathLike[str]) -> Header:
    """The header of ``path``; for a split file, the tensor infos of every part present beside it,
    and for the missing parts, layers estimated from the nearest complete layer of the same kind."""
    path = os.fspath(path)
    h = _parse(path)
    parts, count = _split_parts(path, h.metadata)
    h.parts_total = count
    if count > 1:
        found = 1
        for p in parts:
            if os.path.abspath(p) == os.path.abspath(path) or not os.path.exists(p):
                continue
            try:
                other = _parse(p)
            except HeaderError as e:
                h.notes.append(f"part {os.path.basename(p)} skipped: {e}")
                continue
            h.tensors.update(other.tensors)
            found += 1
        h.parts_found = found
        total = int(h.metadata.get("split.tensors.count", 0) or 0)
        if total and len(h.tensors) < total:
            _estimate_missing(h, total)
    return h


def _layer_kind(h: Header, il: int) -> str:
    n_dense = int(h.key("leading_dense_block_count", 0) or 0)
    return "dense" if il < n_dense else "moe" if h.key("expert_count") else "dense"


def _estimate(template: TensorInfo, name: str) -> TensorInfo:
    """A tensor of a missing split part, shaped as a seen one: its name, no data behind it."""
    return dataclasses.replace(template, name=name, offset=-1, path="")


def _estimate_missing(h: Header, total: int) -> None:
    """Fill layers the missing split parts hold with copies of a seen layer of the same kind."""
    n_layer = int(h.key("block_count", 0) or 0)
    layers: dict[int, dict[str, TensorInfo]] = {}
    for t in h.tensors.values():
        m = _LAYER_RE.match(t.name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = t
    # a template per kind: the seen layer of that kind with the most tensors
    templates: dict[str, dict[str, TensorInfo]] = {}
    for il, ts in sorted(layers.items()):
        k = _layer_kind(h, il)
        if len(ts) >= len(templates.get(k, {})):
            templates[k] = ts
    added = 0
    for il in range(n_layer):
        tpl = templates.get(_layer_kind(h, il)) or next(iter(templates.values()), {})
        for suffix, t in tpl.items():
            name = f"blk.{il}.{suffix}"
            if name not in h.tensors:
                h.tensors[name] = _estimate(t, name)
                h.estimated.add(name)
                added += 1
    if "output.weight" not in h.tensors and "token_embd.weight" in h.tensors \
            and len(h.tensors) < total:
        t = h.tensors["token_embd.weight"]
        h.tensors["output.weight"] = _estimate(t, "output.weight")
        h.estimated.add("output.weight")
        added += 1
    h.notes.append(f"{h.parts_total - h.parts_found} of {h.parts_total} split parts missing: "
                   f"{added} tensor infos estimated from layers seen ({len(h.tensors)} of {total} tensors)")


# ---------------------------------------------------------------------------------------------- cost


@dataclass
class ModelCost:
    """Bytes and FLOPs per token of one model, and the shapes the planner needs."""

    path: str
    arch: str
    name: str
    tensors: list[TensorInfo]
    read_fraction: dict[str, float]     # tensor -> share of its bytes read per decoded token
    n_layer: int
    n_ctx_train: int
    kv_bytes_per_position: int           # all layers, f16
    kv_window: list[int]                 # per layer: 0 = every position, else sliding window
    kv_bytes_per_layer_position: list[int]
    attn_flops_per_key: int              # per token, per cached position, all layers
    llama_kv_bytes_per_position: int = 0  # what llama.cpp's f16 cache holds (MLA: no transposed latent)
    expert_count: int = 0
    expert_used_count: int = 0
    mla: bool = False
    notes: list[str] = field(default_factory=list)
    header_bytes: int = 0
    file_size: int = 0

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def weight_bytes_per_token(self) -> float:
        return sum(t.nbytes * self.read_fraction[t.name] for t in self.tensors)

    def kv_read_bytes(self, depth: int) -> float:
        """KV cache bytes one decoded token reads with ``depth`` positions cached."""
        return float(sum(b * (min(depth, w) if w else depth)
                         for b, w in zip(self.kv_bytes_per_layer_position, self.kv_window)))

    def bytes_per_token(self, depth: int = 0) -> float:
        return self.weight_bytes_per_token + self.kv_read_bytes(depth)

    def matmul_flops_per_token(self) -> float:
        """2 x the weights a token multiplies with (routed experts at their used share)."""
        out = 0.0
        for t in self.tensors:
            f = self.read_fraction[t.name]
            if t.name == "token_embd.weight" and f < 1.0:
                continue  # a lookup, not a product
            if len(t.shape) == 1:
                continue  # norms and biases
            out += 2.0 * t.n_elements * f
        return out

    def attn_flops(self, depth: int) -> float:
        """Attention FLOPs of one token with ``depth`` earlier positions (scores + weighted sum)."""
        if not self.n_layer:
            return 0.0
        per_layer = self.attn_flops_per_key / self.n_layer
        return float(sum(per_layer * (min(depth, w) if w else depth) for w in self.kv_window))

    @property
    def output_name(self) -> str:
        """The output (logits) matrix: ``output.weight``, or the embedding when they are tied."""
        names = {t.name for t in self.tensors}
        return "output.weight" if "output.weight" in names else "token_embd.weight"

    def prompt_share(self, name: str, n_prompt: int) -> float:
        """Share of a tensor's per-token product a prompt token pays: the output matrix is
        multiplied for the batch's last token only (logits of the other positions are not needed)."""
        return 1.0 / max(n_prompt, 1) if name == self.output_name else 1.0

    def prompt_flops_per_token(self, n_prompt: int, depth: int = 0) -> float:
        """Average FLOPs per prompt token of an ``n_prompt`` batch after ``depth`` cached positions."""
        out = next((t for t in self.tensors if t.name == self.output_name), None)
        skip = 2.0 * out.n_elements * (1 - self.prompt_share(out.name, n_prompt)) if out is not None else 0.0
        return self.matmul_flops_per_token() - skip + self.attn_flops(depth + n_prompt // 2)

def _int(v: Any, default: int = 0) -> int:
    if isinstance(v, list):  # per-layer arrays: the largest
        return int(max(v)) if v else default
    return int(v) if v is not None else default


def _per_layer(v: Any, n: int, default: int) -> list[int]:
    if isinstance(v, list) and v:
        return [int(x) for x in v][:n] + [int(v[-1])] * max(0, n - len(v))
    return [int(v) if v is not None else default] * n


def model_cost(path_or_header: str | os.PathLike[str] | Header) -> ModelCost:
    """Bytes per token, KV traffic and FLOPs from the header of a GGUF file (see the module doc)."""
    h = path_or_header if isinstance(path_or_header, Header) else read_header(path_or_header)
    if not h.tensors:
        raise HeaderError(f"{h.path}: the header lists no tensors")
    arch = h.arch
    n_layer = _int(h.key("block_count"))
    if n_layer <= 0:
        raise HeaderError(f"{h.path}: no {arch or '?'}.block_count in the header")
    n_embd = _int(h.key("embedding_length"))
    n_head = _per_layer(h.key("attention.head_count"), n_layer, 0)
    n_head_kv = _per_layer(h.key("attention.head_count_kv"), n_layer, n_head[0])
    n_head_kv = [kv if kv else hd for kv, hd in zip(n_head_kv, n_head)]
    head_dim = _int(h.key("attention.key_length"), n_embd // max(n_head[0], 1))
    head_dim_v = _int(h.key("attention.value_length"), head_dim)
    kv_lora = _int(h.key("attention.kv_lora_rank"))
    n_rot = _int(h.key("rope.dimension_count"))
    # MLA cache (llama.cpp since PR #12801): the file stores attn_k_b / attn_v_b and one KV head
    # over the latent. Older deepseek2 files (attn_kv_b, head_count_kv = head_count) cache full
    # keys and values per head, which the dense formula below counts.
    mla = arch in ("deepseek2", "deepseek3", "kimi_k2") and kv_lora > 0 and (
        any(name.endswith("attn_k_b.weight") for name in h.tensors) or max(n_head_kv) == 1)
    if mla:
        # llama.cpp caches the latent c^KV and the rope part k^R per position per layer; numawb
        # keeps the latent once more, transposed, for the values' product (kv_cache.MLACache)
        per_layer_pos = [(2 * kv_lora + n_rot) * 2] * n_layer
        # absorbed MLA attention: multi-query over the latent, key kv_lora+rope, value kv_lora
        attn_per_key = sum(2 * hd * ((kv_lora + n_rot) + kv_lora) for hd in n_head)
    else:
        per_layer_pos = [kv * (head_dim + head_dim_v) * 2 for kv in n_head_kv]
        attn_per_key = sum(2 * hd * (head_dim + head_dim_v) for hd in n_head)
    window = _int(h.key("attention.sliding_window"))
    if arch.startswith("gemma3") and window:
        kv_window = [window if il % 6 < 5 else 0 for il in range(n_layer)]
    else:
        kv_window = [0] * n_layer
    n_exp, n_used = _int(h.key("expert_count")), _int(h.key("expert_used_count"))
    notes = list(h.notes)
    if n_exp and not n_used:
        notes.append("expert_count without expert_used_count: every expert counted as read")
    tensors = sorted(h.tensors.values(), key=lambda t: t.name)
    names = {t.name for t in tensors}
    tied = "output.weight" not in names
    frac: dict[str, float] = {}
    for t in tensors:
        if t.name == "token_embd.weight":
            frac[t.name] = 1.0 if tied else 1.0 / max(t.rows, 1)
        elif t.is_expert and n_exp and n_used:
            frac[t.name] = n_used / n_exp
        else:
            frac[t.name] = 1.0
    if h.estimated:
        notes.append("some tensor infos are estimated (split parts missing)")
    name = str(h.metadata.get("general.name", "") or os.path.basename(h.path))
    return ModelCost(
        path=h.path, arch=arch, name=name, tensors=tensors, read_fraction=frac, n_layer=n_layer,
        n_ctx_train=_int(h.key("context_length"), 4096), kv_bytes_per_position=sum(per_layer_pos),
        kv_window=kv_window, kv_bytes_per_layer_position=per_layer_pos, attn_flops_per_key=attn_per_key,
        llama_kv_bytes_per_position=sum(per_layer_pos) - (n_layer * kv_lora * 2 if mla else 0), expert_count=n_exp, expert_used_count=n_used, mla=mla, notes=notes,
        header_bytes=h.header_bytes, file_size=h.file_size)


def tensor_specs(cost: ModelCost) -> list[tuple[str, int, int]]:
    """(name, rows, row_bytes) of every tensor, as the NUMA layer's TensorSpec wants them."""
    return [(t.name, t.rows, t.row_bytes) for t in cost.tensors]


def by_type(tensors: Iterable[TensorInfo], fractions: dict[str, float]) -> dict[int, float]:
    """Bytes read per token grouped by GGML type."""
    out: dict[int, float] = {}
    for t in tensors:
        out[t.ggml_type] = out.get(t.ggml_type, 0.0) + t.nbytes * fractions[t.name]
    return out

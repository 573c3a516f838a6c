"""Weights kept in a faster byte layout than the file's, decided per tensor and placement.

llama.cpp's CPU backend repacks Q4_K weights on x86 into 8-row interleaved blocks
(block_q4_Kx8) and runs its own gemv and gemm over them. The engine keeps Q4_K weight matrices
in that layout too (`kernels.x86.k4_x8`): the routed experts (`*_exps.weight`, the gemv per token
as llama.cpp's repacked mul_mat_id) and the dense matrices (the gemm's tiles of 4 columns for a
prompt, as its repacked mul_mat). The same bytes per 8-row group, so a placement that moves whole
groups moves it unchanged, and the decode kernel has no shuffles or horizontal sums (26 -> 41 GB/s
in cache, 20-24 -> 23-28 GB/s from memory on the EPYC host, `benchmarks/q4k_repack_probe.py`; on
the AMD EPYC Zen 5 host, 640-row matrices read cold, `kernels_bench.py --cold-rows 640`: 34.6 ->
38.1 GB/s at K = 1024, 35.5 -> 45.1 at K = 2048). Outputs are the same to the bit as on the file's
layout. Token embeddings stay in the file's layout (their rows are looked up, not multiplied),
unless the model ties its output to them and the packed layout's rows can be looked up in a
token's compiled call (Q8_0 row pairs).

Q5_0 and Q8_0 weight matrices are kept in row pairs (`kernels.x86.q5_pairs`, `q8_pairs`, the
AVX-512 VNNI path only): the one-token product takes both rows of a pair in one register without
rearranging their bytes first; the prompt tiles read each row's blocks where the pair keeps them.
Q4_0 and IQ4_NL weight matrices are kept in 8-row groups (`kernels.x86.q4_x8`, block_q4_0x8's
interleave): llama.cpp runs its repacked gemv on them, whose order the file layout's kernel kept at
a third of the memory's speed (a synthetic dense Q4_0 model, `decode_profile.py --ab`, AMD EPYC Zen
5: 70.8 -> 240.0 t/s at 1 thread, 132.8 -> 273.7 at 2). A tied Q4_0 output matrix (Google's QAT
Gemma files) is kept in groups too: its rows are looked up there in a token's compiled call.

A tensor is packed only when no piece or compute range of any plan with this many workers cuts
an 8-row group: its rows (per expert) are a multiple of 8 and at least 8 per worker, so
`numa.plan.row_split` aligns every boundary to 8 rows.

Where it pays depends on the kernel path: on an AVX2-only host the x8 gemv read memory slower than
`k4_rows` and a packed MoE model decoded slower (benchmarks/HISTORY.md, "Repacking on AVX2"). So by
default only the AVX-512 VNNI path packs;
`NUMAWB_REPACK=1` packs on any x86 path, `NUMAWB_REPACK=0` never.

The other way round, a 3-D weight that is not a stack of experts (MLA's per-head attn_k_b /
attn_v_b, multiplied by ggml_mul_mat) is never repacked by llama.cpp (its repack buffer takes 2-D
matrices and 3-D experts only), while the SIMD kernels of Q4_0, IQ4_NL, Q4_K and Q2_K pick the
repacked order by row count alone: such a weight keeps the file's bytes under its type's plain id
(`kernels.PLAIN_TYPES`: vec_dot, tinyBLAS or the tiled matmul at any row count), on every SIMD path
and whatever `NUMAWB_REPACK` says. A DeepSeek file quantized to Q2_K by llama-quantize has its
attn_k_b in Q4_0 (64-wide rows): in the repacked order its products differed from llama.cpp's in
the last bit, a router turned that into other experts, and greedy tokens parted from
llama.cpp's (4 of 64 prompts of such a V3-style file within 32 tokens, issue 46).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Mapping

import numpy as np

from ..numa.layout import ProgressEvent
from ..numa.plan import ROW_ALIGN
from . import kernels
from .gguf_file import TensorInfo

REPACK = os.environ.get("NUMAWB_REPACK", "")  # "1": always, "0": never, else where it measured faster
FASTER_ON = frozenset({"avx512-vnni"})  # kernel paths whose packed gemv beat the file's layout
EXPERT_SUFFIX = "_exps.weight"
TIED = "token_embd.weight"  # the output matrix too when a model has no output.weight
Progress = Callable[[ProgressEvent], None]


def enabled() -> bool:
    """Whether expert tensors are packed at all on the active kernel path (see `REPACK`)."""
    if REPACK in ("0", "1"):
        return REPACK == "1"
    return kernels.kernel_path() in FASTER_ON


def _candidate(name: str, info: TensorInfo, tied: bool = False) -> int | None:
    """Experts (3-D `*_exps`) and weight matrices (2-D); not other 3-D tensors (MLA's per-head
    k_b / v_b are multiplied per head) nor embeddings (looked up row by row), except a tied
    output matrix (`tied`: the model has no output.weight) whose layout a token's compiled call
    can look rows up in (`kernels.dequantizer`): Gemma's Q8_0 embedding is 72 % of its token.
    A 3-D weight that is not a stack of experts: its type's plain id (see the module's doc)."""
    if len(info.shape) == 3 and not name.endswith(EXPERT_SUFFIX):
        return kernels.plain_type(info.ggml_type)
    if not enabled():
        return None
    if "embd" in name:
        t = kernels.packed_type(info.ggml_type) if tied and name == TIED else None
        return t if t is not None and kernels.dequantizer(t) is not None else None
    if len(info.shape) != 2 and len(info.shape) != 3:
        return None
    return kernels.packed_type(info.ggml_type)


def _moves_bytes(t: int) -> bool:
    """Whether layout t rearranges the file's bytes (in 8-row groups or pairs); a plain id does not."""
    return t not in _PLAIN


_PLAIN = frozenset(kernels.PLAIN_TYPES.values())


def _tied(tensors: Mapping[str, TensorInfo]) -> bool:
    """Whether the model's output product multiplies its token embedding (no output.weight)."""
    return "output.weight" not in tensors


def packed_types(tensors: Mapping[str, TensorInfo]) -> set[int]:
    """The layouts a model's tensors may be kept in (their kernels compile with the model's own)."""
    tied = _tied(tensors)
    return {t for name, info in tensors.items() if (t := _candidate(name, info, tied)) is not None}


def _whole_groups(info: TensorInfo, n_workers: int) -> bool:
    """No piece or range of a plan with this many workers cuts its 8-row groups (of each expert)."""
    per = info.rows // (int(info.shape[2]) if len(info.shape) == 3 else 1)
    return per % ROW_ALIGN == 0 and per >= ROW_ALIGN * n_workers


def packable(name: str, info: TensorInfo, n_workers: int, tied: bool = False) -> int | None:
    """The layout `name` may be kept in with `n_workers` workers, or None (the file's layout);
    `tied`: the model's output product multiplies its token embedding."""
    t = _candidate(name, info, tied)
    active = kernels.active_types()
    if t is None or (active is not None and t not in active) or (_moves_bytes(t) and not _whole_groups(info, n_workers)):
        return None
    return t


def file_layout_types(tensors: Mapping[str, TensorInfo], n_workers: int) -> set[int]:
    """The file types whose products run on the file's layout for some matrix with up to
    `n_workers` workers: only their kernels need compiling beside the packed layouts' (a first
    start then loads no kernel nothing calls: Gemma 3 270M's file-layout Q4_K and Q5_0 kernels
    were 3-4 MiB of its peak memory)."""
    tied = _tied(tensors)
    return {info.ggml_type for name, info in tensors.items() if len(info.shape) >= 2
            and ((t := _candidate(name, info, tied)) is None or (_moves_bytes(t) and not _whole_groups(info, n_workers)))}


def lookup_types(tensors: Mapping[str, TensorInfo], n_workers: int) -> set[int]:
    """The types the token embedding's rows may be looked up in with up to `n_workers` workers:
    its packed layout where it is packed (a tied Q8_0 output matrix), its file type where some
    plan keeps the file's layout (their row dequantization compiles with the model's kernels)."""
    info = tensors.get(TIED)
    if info is None:
        return set()
    t = _candidate(TIED, info, _tied(tensors))
    if t is None:
        return {info.ggml_type}
    return {t} if _whole_groups(info, n_workers) else {t, info.ggml_type}


def movers(t: int) -> tuple[Callable, Callable]:
    """(repack_rows, unpack_rows) of a layout: fn(w, r0, r1) rewrites rows [r0, r1) in place."""
    if t == kernels.Q5_0_X2:
        from .kernels.x86 import q5_pairs as mod
    elif t == kernels.Q8_0_X2:
        from .kernels.x86 import q8_pairs as mod
    elif t in (kernels.Q4_0_X8, kernels.IQ4_NL_X8):
        from .kernels.x86 import q4_x8 as mod
    else:
        from .kernels.x86 import k4_x8 as mod
    return mod.repack_rows, mod.unpack_rows


def _units(layout, names: list[tuple[str, bool, int]]) -> list[tuple[np.ndarray, Callable, int | None]]:
    """(one expert's rows of one copy, the function that rewrites them, node) for every copy of
    the tensors."""
    out = []
    for name, to_packed, t in names:
        move = movers(t)[0 if to_packed else 1]
        for view, first, _g0, node in layout.copies(name):
            if first % ROW_ALIGN or view.shape[1] % ROW_ALIGN:
                raise ValueError(f"{name}: a piece starting at row {first} cuts an 8-row group")
            out += [(view[e], move, node) for e in range(view.shape[0])]
    return out


def _repack(layout, pool, names: list[tuple[str, bool, int]], progress: Progress | None) -> None:
    """The tensors' copies permuted in place by the pool's workers, each a share of the copies on
    its own node (interleaved copies: everyone's), with progress in bytes. names: (name, to the
    packed layout?, the layout)."""
    units = _units(layout, [n for n in names if _moves_bytes(n[2])])
    if not units:
        return
    total = sum(u[0].nbytes for u in units)
    workers = list(pool.workers)
    shares: list[list[int]] = [[] for _ in workers]
    for i, (_v, _p, node) in enumerate(units):
        mine = [w.index for w in workers if w.node == node] or [w.index for w in workers]
        shares[mine[i % len(mine)]].append(i)
    lock = threading.Lock()
    done, told = [0], [0]
    t0 = time.perf_counter()

    def work(wk: int) -> None:
        for i in shares[wk]:
            view, move, _node = units[i]
            move(view, 0, view.shape[0])
            if progress:
                with lock:  # about a hundred reports, whatever the number of experts
                    done[0] += view.nbytes
                    if done[0] - told[0] < total // 100 and done[0] < total:
                        continue
                    told[0] = done[0]
                    dt = time.perf_counter() - t0
                    progress(ProgressEvent("repack", done[0], total, done[0] / dt if dt > 0 else 0.0,
                                           "weights into their kernels' layouts"))
    pool.run(work)


def wanted(tensors: Mapping[str, TensorInfo], n_workers: int) -> dict[str, int]:
    """name -> layout of every tensor `packable` with `n_workers` workers."""
    tied = _tied(tensors)
    return {name: t for name, info in tensors.items() if (t := packable(name, info, n_workers, tied)) is not None}


def apply(layout, pool, current: Mapping[str, int], want: Mapping[str, int],
          progress: Progress | None = None) -> dict[str, int]:
    """Bring the layout's tensors from `current` to `want` (name -> layout; absent: the file's),
    in place on the pool's workers: unpacks first, then packs. Returns `want` as a new dict."""
    _repack(layout, pool, [(n, False, current[n]) for n in current if want.get(n) != current[n]], progress)
    _repack(layout, pool, [(n, True, want[n]) for n in want if current.get(n) != want[n]], progress)
    return dict(want)

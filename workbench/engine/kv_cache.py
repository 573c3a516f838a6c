"""The KV cache: f16 keys and values (as uint16 bits, which Numba handles), per layer and worker.

Positions are dealt to workers in blocks of `BLOCK`, round robin:
worker w owns blocks w, w+W, w+2W, ... and keeps them contiguously in its own
region (which the NUMA layer can place on the worker's node by first touch).
"""

from __future__ import annotations

from typing import Callable

import numba as nb
import numpy as np

from .kernels.jitcache import JIT
from .config import ModelConfig
from .ops import f16_bits

BLOCK = 32  # positions per block dealt round robin to the cache's owners


@nb.njit(**JIT)
def slot_position(j: int, w: int, n_workers: int) -> int:
    """Global position held in slot j of worker w."""
    return ((j // BLOCK) * n_workers + w) * BLOCK + j % BLOCK

# (layer, worker, nbytes) -> uint8 buffer for that worker's part of that layer
KVRegionFn = Callable[[int, int, int], np.ndarray]


@nb.njit(**JIT)
def store_f16(kc: np.ndarray, vc: np.ndarray, k: np.ndarray, v: np.ndarray, slot0: int) -> None:
    """k, v [n, kv_head, dim] float32 -> f16 bits in keys kc [kv_head, slot, dim] and values
    vc [kv_head, dim, slot] at slots slot0.. (one pass, where numpy needs eight calls)."""
    n, n_kv, d = k.shape
    dv = v.shape[2]
    for t in range(n):
        for h in range(n_kv):
            for j in range(d):
                kc[h, slot0 + t, j] = f16_bits(k[t, h, j])
    # the values go down the transposed cache's columns: a row's slots in turn (one token's value
    # a row is one store a line; a prompt's, written token by token, was a store a line per value:
    # 512 tokens x 256 values: 0.79 -> 0.11 ms a layer on the AMD EPYC host, the same bits)
    for h in range(n_kv):
        for j in range(dv):
            for t in range(n):
                vc[h, j, slot0 + t] = f16_bits(v[t, h, j])


#: a decoded token's values job reads each value row's positions [base, kp) (`one_token_attention`):
#: up to this many lines of each row are asked for with the store's line (short contexts, where the
#: 256 rows' few lines each are scattered, cold misses); longer rows stream on their own
VALUES_AHEAD_LINES = 4


@nb.njit(**JIT, inline="always")
def values_slot_lines(vc: np.ndarray, slot: int, base: int) -> tuple[int, int, int, int]:
    """(address, rows, stride, lines per row) of the lines `store_f16` writes in the values vc
    [kv_head, dim, slot] at `slot` -- one line per row: the token's values go down a column of the
    transposed cache, each cold after the token's weights streamed through the caches (Gemma 3's
    256 values a layer) -- widened to each row's lines from position `base` to the values job's end
    (the slot's 64-slot boundary) when those are at most VALUES_AHEAD_LINES; rows 0 past the cache's
    end. `crew.write_ahead` asks for them during the q/k/v job."""
    cap = vc.shape[2]
    at = np.int64(vc.ctypes.data)
    if slot >= cap:
        return at, 0, 0, 0
    rows, stride = vc.shape[0] * vc.shape[1], 2 * cap
    kp = min(-(-(slot + 1) // 64) * 64, cap)
    first = (at + 2 * base) // 64 * 64
    per = (at + 2 * kp + 63) // 64 - first // 64
    if 0 <= base <= slot and per <= VALUES_AHEAD_LINES:
        return first, rows, stride, per
    return at + 2 * slot, rows, stride, 1


def token_slot_lines(vc, pos0: int, base: int):
    """`values_slot_lines` for a decoded token at pos0 of a one-owner cache (vc an array) or of a
    cache split between owners (vc a tuple of the owners' arrays: the owner holding pos0, from
    its slot on)."""
    raise NotImplementedError("compiled callers only")


@nb.extending.overload(token_slot_lines)
def _token_slot_lines(vc, pos0, base):
    if isinstance(vc, nb.types.BaseTuple):
        def impl(vc, pos0, base):
            no = len(vc)
            blk = pos0 // BLOCK
            slot = (blk // no) * BLOCK + pos0 % BLOCK
            return values_slot_lines(vc[blk % no], slot, slot)
        return impl

    def impl(vc, pos0, base):
        return values_slot_lines(vc, pos0, base)
    return impl


def slots_per_worker(n_ctx: int, n_workers: int) -> int:
    blocks = -(-n_ctx // BLOCK)
    return -(-blocks // n_workers) * BLOCK


def kv_bytes_per_layer_per_worker(cfg: ModelConfig, n_ctx: int, n_workers: int) -> int:
    if cfg.kv_lora_rank:  # MLA: one latent + rotary key row per position, and the latent transposed
        return slots_per_worker(n_ctx, n_workers) * (2 * cfg.kv_lora_rank + cfg.rope_dims) * 2
    return slots_per_worker(n_ctx, n_workers) * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 2


def kv_bytes(cfg: ModelConfig, n_ctx: int, n_workers: int = 1) -> int:
    return cfg.n_layer * n_workers * kv_bytes_per_layer_per_worker(cfg, n_ctx, n_workers)


def owner_slots(positions: np.ndarray, n_workers: int) -> tuple[np.ndarray, np.ndarray]:
    block = positions // BLOCK
    return block % n_workers, (block // n_workers) * BLOCK + positions % BLOCK


@nb.njit(**JIT)
def filled_slots(n_positions: int, w: int, n_workers: int) -> int:
    """How many of worker w's slots hold positions < n_positions."""
    full, rem = divmod(n_positions, BLOCK)
    count = (full - w + n_workers - 1) // n_workers * BLOCK if full > w else 0
    if rem and full % n_workers == w:
        count += rem
    return count


class _Filled:
    """What both caches share: ``n``, the positions filled, and forgetting them from the end."""

    n: int

    def clear(self) -> None:
        self.n = 0

    def truncate(self, n: int) -> None:
        """Forget positions >= n (later turns are recomputed from there)."""
        self.n = min(self.n, max(n, 0))


class KVCache(_Filled):
    def __init__(self, cfg: ModelConfig, n_ctx: int, n_workers: int = 1, region: KVRegionFn | None = None,
                 owner_workers: list[list[int]] | None = None):
        """`n_workers` owners of position blocks (one per node in use); `owner_workers[o]` lists the
        workers that compute owner o's part (the node's workers)."""
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_workers = n_workers
        self.owner_workers = owner_workers or [[o] for o in range(n_workers)]
        self.n = 0  # positions filled
        cap = slots_per_worker(n_ctx, n_workers)
        kb = cap * cfg.n_head_kv * cfg.head_dim * 2
        vb = cap * cfg.n_head_kv * cfg.head_dim_v * 2
        self.cap = cap
        # keys [kv_head, slot, dim]; values transposed [kv_head, dim, slot] (as llama.cpp's v_trans)
        self.k: list[list[np.ndarray]] = []
        self.v: list[list[np.ndarray]] = []
        for il in range(cfg.n_layer):
            ks, vs = [], []
            for w in range(n_workers):
                raw = region(il, w, kb + vb) if region else np.zeros(kb + vb, dtype=np.uint8)
                ks.append(raw[:kb].view(np.uint16).reshape(cfg.n_head_kv, cap, cfg.head_dim))
                vs.append(raw[kb:kb + vb].view(np.uint16).reshape(cfg.n_head_kv, cfg.head_dim_v, cap))
            self.k.append(ks)
            self.v.append(vs)
        # [layer][worker][kv_head]: the byte matrices the F16 kernels read
        self.k_bytes = [[[a.view(np.uint8) for a in k] for k in layer] for layer in self.k]
        self.v_bytes = [[[a.view(np.uint8) for a in v] for v in layer] for layer in self.v]
        self.jobs: dict = {}  # the runtime's per-layer crew jobs over these arrays

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for layer in self.k + self.v for a in layer)

    def keys3(self, il: int, owner: int) -> np.ndarray:
        """Owner's keys of layer il [kv_head, slot, head_dim] (as `MLACache.keys3`)."""
        return self.k[il][owner]

    def store(self, il: int, k: np.ndarray, v: np.ndarray, pos0: int) -> None:
        """Write [n, kv_heads, head_dim] float32 K/V at positions pos0.. (rounded to f16)."""
        if self.n_workers == 1:
            store_f16(self.k[il][0], self.v[il][0], k, v, pos0)
            return
        n = k.shape[0]
        k16 = k.astype(np.float16).view(np.uint16).transpose(1, 0, 2)  # [kv_head, n, dim]
        v16 = v.astype(np.float16).view(np.uint16).transpose(1, 2, 0)  # [kv_head, dim, n]
        owners, slots = owner_slots(np.arange(pos0, pos0 + n), self.n_workers)
        for w in range(self.n_workers):
            sel = owners == w
            if sel.any():
                self.k[il][w][:, slots[sel]] = k16[:, sel]
                self.v[il][w][:, :, slots[sel]] = v16[:, :, sel]

    def copy_from(self, other: "KVCache") -> None:
        """Take over another cache's contents (after a change of KV placement or workers)."""
        n = min(other.n, self.n_ctx)
        pos = np.arange(n)
        so, ss = owner_slots(pos, other.n_workers)
        do, ds = owner_slots(pos, self.n_workers)
        for il in range(self.cfg.n_layer):
            # the slot axis is 1 for keys and 2 for values
            for src, dst, axis in ((other.k[il], self.k[il], 1), (other.v[il], self.v[il], 2)):
                shape = list(src[0].shape)
                shape[axis] = n
                full = np.empty(shape, dtype=np.uint16)
                for w in range(other.n_workers):
                    sel = np.flatnonzero(so == w)
                    idx = [slice(None)] * 3
                    idx[axis] = sel
                    sidx = [slice(None)] * 3
                    sidx[axis] = ss[sel]
                    full[tuple(idx)] = src[w][tuple(sidx)]
                for w in range(self.n_workers):
                    sel = np.flatnonzero(do == w)
                    idx = [slice(None)] * 3
                    idx[axis] = sel
                    didx = [slice(None)] * 3
                    didx[axis] = ds[sel]
                    dst[w][tuple(didx)] = full[tuple(idx)]
        self.n = n


class _HeadsView:
    """The few cache fields the runtime's general attention reads (see MLACache.attention_view)."""

    def __init__(self, n_head_kv: int, head_dim_v: int):
        self.n_head_kv, self.head_dim_v = n_head_kv, head_dim_v


class MLAView:
    """One layer of an MLA cache seen as a one-head (MQA) K/V cache: keys are the stored rows
    (latent + rotary key), values the transposed latent the cache keeps beside them (llama.cpp
    makes that copy at every step: ggml_cont(ggml_transpose(view of K))). Nothing is stored
    through it: `store` is a no-op (the caller stored the rows already)."""

    def __init__(self, cache: "MLACache", il: int, n_positions: int):
        self.cfg = _HeadsView(1, cache.kv_lora)
        self.n_workers, self.owner_workers, self.cap = cache.n_workers, cache.owner_workers, cache.cap
        self.k_bytes = {il: cache.k_bytes[il]}
        self.v_bytes = {il: cache.v_bytes[il]}

    def store(self, il: int, k: np.ndarray, v: np.ndarray, pos0: int) -> None:
        pass


class MLACache(_Filled):
    """Multi-head latent attention cache (DeepSeek 2/3): per position what llama.cpp stores, the
    normalised latent (kv_lora_rank) followed by the roped key part (n_rot), f16 -- not per-head
    keys and values -- and the latent once more, transposed ([latent dim, slot], as `KVCache`'s
    values), which the attention's weighted sum reads row by row. llama.cpp's non-flash attention
    makes that transposed copy of the whole latent at every step of every layer; kept here it costs
    kv_lora x 2 bytes per position more memory and no copy. Positions are dealt to owners in
    blocks like `KVCache` (first touch per node), both parts of an owner's slots in its region.

    `k[il][o]` [slot, latent + rotary] and `v[il][o]` [1, latent, slot] (uint16 f16 bits);
    `k_bytes` / `v_bytes` [layer][owner][kv head]: the byte matrices the F16 kernels read, as
    `KVCache` has them, so a decoded token's attention is `KVCache`'s one-KV-head attention.
    """

    def __init__(self, cfg: ModelConfig, n_ctx: int, n_workers: int = 1, region: KVRegionFn | None = None,
                 owner_workers: list[list[int]] | None = None):
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_workers = n_workers
        self.owner_workers = owner_workers or [[o] for o in range(n_workers)]
        self.n = 0
        self.kv_lora = lora = cfg.kv_lora_rank
        self.width = cfg.kv_lora_rank + cfg.rope_dims
        self.cap = cap = slots_per_worker(n_ctx, n_workers)
        kb, vb = cap * self.width * 2, cap * lora * 2
        self.k: list[list[np.ndarray]] = []
        self.v: list[list[np.ndarray]] = []
        for il in range(cfg.n_layer):
            ks, vs = [], []
            for w in range(n_workers):
                raw = (region(il, w, kb + vb) if region else np.zeros(kb + vb, dtype=np.uint8))[:kb + vb]
                ks.append(raw[:kb].view(np.uint16).reshape(cap, self.width))
                vs.append(raw[kb:].view(np.uint16).reshape(1, lora, cap))
            self.k.append(ks)
            self.v.append(vs)
        self.k_bytes = [[[k.view(np.uint8).reshape(1, cap, -1)[0]] for k in layer] for layer in self.k]
        self.v_bytes = [[[v[0].view(np.uint8)] for v in layer] for layer in self.v]
        self.jobs: dict = {}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for layer in self.k + self.v for a in layer)

    def keys3(self, il: int, owner: int) -> np.ndarray:
        """Owner's rows of layer il as one-KV-head keys [1, slot, latent + rotary]."""
        return self.k[il][owner].reshape(1, self.cap, self.width)

    def store(self, il: int, rows: np.ndarray, pos0: int) -> None:
        """Write [n, kv_lora_rank + n_rot] float32 rows at positions pos0.. (rounded to f16), the
        latent also down the transposed part's columns."""
        n = rows.shape[0]
        r16 = np.ascontiguousarray(rows, dtype=np.float32).astype(np.float16).view(np.uint16)
        if self.n_workers == 1:
            self.k[il][0][pos0:pos0 + n] = r16
            self.v[il][0][0, :, pos0:pos0 + n] = r16[:, :self.kv_lora].T
            return
        owners, slots = owner_slots(np.arange(pos0, pos0 + n), self.n_workers)
        for w in range(self.n_workers):
            sel = owners == w
            if sel.any():
                self.k[il][w][slots[sel]] = r16[sel]
                self.v[il][w][0][:, slots[sel]] = r16[sel, :self.kv_lora].T

    def attention_view(self, il: int, n_positions: int) -> MLAView:
        return MLAView(self, il, n_positions)

    def copy_from(self, other: "MLACache") -> None:
        n = min(other.n, self.n_ctx)
        pos = np.arange(n)
        so, ss = owner_slots(pos, other.n_workers)
        do, ds = owner_slots(pos, self.n_workers)
        for il in range(self.cfg.n_layer):
            full = np.empty((n, self.width), dtype=np.uint16)
            for w in range(other.n_workers):
                sel = so == w
                full[sel] = other.k[il][w][ss[sel]]
            for w in range(self.n_workers):
                sel = do == w
                self.k[il][w][ds[sel]] = full[sel]
                self.v[il][w][0][:, ds[sel]] = full[sel, :self.kv_lora].T
        self.n = n


def make_cache(cfg: ModelConfig, n_ctx: int, n_workers: int = 1, region: KVRegionFn | None = None,
               owner_workers: list[list[int]] | None = None) -> "KVCache | MLACache":
    """The cache a model needs: the latent cache for MLA models, else per-head keys and values."""
    cls = MLACache if cfg.kv_lora_rank else KVCache
    return cls(cfg, n_ctx, n_workers, region, owner_workers)

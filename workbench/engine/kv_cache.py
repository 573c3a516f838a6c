"""The KV cache: f16 keys and values per layer (as uint16 bits, which Numba handles), as llama.cpp keeps them."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .config import ModelConfig

# (label, nbytes) -> uint8 buffer; the NUMA layer supplies placed buffers here.
KVAllocator = Callable[[str, int], np.ndarray]


def kv_bytes(cfg: ModelConfig, n_ctx: int) -> int:
    return cfg.n_layer * n_ctx * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 2


class KVCache:
    def __init__(self, cfg: ModelConfig, n_ctx: int, alloc: KVAllocator | None = None):
        self.n_ctx = n_ctx
        self.n = 0  # positions filled
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.buffers: list[np.ndarray] = []
        for il in range(cfg.n_layer):
            for store, hd, tag in ((self.k, cfg.head_dim, "k"), (self.v, cfg.head_dim_v, "v")):
                nbytes = n_ctx * cfg.n_head_kv * hd * 2
                raw = alloc(f"kv.{il}.{tag}", nbytes) if alloc else np.zeros(nbytes, dtype=np.uint8)
                self.buffers.append(raw)
                store.append(raw[:nbytes].view(np.uint16).reshape(n_ctx, cfg.n_head_kv, hd))

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def clear(self) -> None:
        self.n = 0

    def truncate(self, n: int) -> None:
        """Forget positions >= n (later turns are recomputed from there)."""
        self.n = min(self.n, max(n, 0))

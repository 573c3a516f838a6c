"""The KV cache's one-token store and the write prefetch that comes before it."""
from __future__ import annotations

import numpy as np

from workbench.engine.kv_cache import prefetch_values_slot, store_f16


def test_values_prefetch_changes_nothing_and_the_store_fills_one_column() -> None:
    rng = np.random.default_rng(5)
    n_kv, hd, cap = 2, 64, 96
    kc = rng.integers(0, 1 << 16, (n_kv, cap, hd), dtype=np.uint16)
    vc = rng.integers(0, 1 << 16, (n_kv, hd, cap), dtype=np.uint16)
    before_k, before_v = kc.copy(), vc.copy()
    for slot in (0, 31, cap - 1, cap, cap + 1000):  # past the end: nothing asked for, no fault
        prefetch_values_slot(vc, slot)
    assert np.array_equal(vc, before_v) and np.array_equal(kc, before_k)
    k = rng.standard_normal((1, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((1, n_kv, hd)).astype(np.float32)
    prefetch_values_slot(vc, 40)
    store_f16(kc, vc, k, v, 40)
    assert np.array_equal(vc[:, :, 40], v[0].astype(np.float16).view(np.uint16))
    assert np.array_equal(kc[:, 40], k[0].astype(np.float16).view(np.uint16))
    others = np.ones(cap, bool)
    others[40] = False
    assert np.array_equal(vc[:, :, others], before_v[:, :, others])
    assert np.array_equal(kc[:, others], before_k[:, others])

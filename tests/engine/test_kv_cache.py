"""The KV cache's one-token store and the lines it writes (which the q/k/v job asks for ahead)."""
from __future__ import annotations

import numpy as np

from workbench.engine.kv_cache import store_f16, values_slot_lines


def test_values_slot_lines_are_the_lines_the_store_writes() -> None:
    rng = np.random.default_rng(5)
    n_kv, hd, cap = 2, 64, 320
    kc = rng.integers(0, 1 << 16, (n_kv, cap, hd), dtype=np.uint16)
    vc = rng.integers(0, 1 << 16, (n_kv, hd, cap), dtype=np.uint16)
    before_k, before_v = kc.copy(), vc.copy()
    k = rng.standard_normal((1, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((1, n_kv, hd)).astype(np.float32)
    store_f16(kc, vc, k, v, 40)
    assert np.array_equal(vc[:, :, 40], v[0].astype(np.float16).view(np.uint16))
    assert np.array_equal(kc[:, 40], k[0].astype(np.float16).view(np.uint16))
    others = np.ones(cap, bool)
    others[40] = False
    assert np.array_equal(vc[:, :, others], before_v[:, :, others])
    assert np.array_equal(kc[:, others], before_k[:, others])
    # every value the store wrote lies on one of the lines named, one line per value
    def lines(at, n, stride, per):
        return {(at + r * stride) // 64 + j for r in range(n) for j in range(per)}

    def line_of(h, j, slot):
        return (vc.ctypes.data + (h * hd * cap + j * cap + slot) * 2) // 64

    written = {line_of(h, j, 40) for h in range(n_kv) for j in range(hd)}
    assert written <= lines(*values_slot_lines(vc, 40, 0))
    # a short row, from its 64-slot base to the values job's end (the slot's 64-slot boundary): all
    # of its lines, the store's among them
    span = {line_of(h, j, p) for h in range(n_kv) for j in range(hd) for p in range(64, 128)}
    assert lines(*values_slot_lines(vc, 70, 64)) == span
    assert lines(*values_slot_lines(vc, 40, 0)) == {line_of(h, j, p) for h in range(n_kv) for j in range(hd)
                                                     for p in range(64)}
    # a long one (more than VALUES_AHEAD_LINES lines from base): the store's lines alone
    assert lines(*values_slot_lines(vc, 200, 0)) == {line_of(h, j, 200) for h in range(n_kv) for j in range(hd)}
    for slot in (cap, cap + 1000):  # past the end: nothing to ask for
        assert values_slot_lines(vc, slot, 0)[1] == 0


def test_a_prompt_store_writes_each_token_at_its_slot_and_nothing_else() -> None:
    """store_f16 of several tokens (a prompt: values written row by row down the transposed cache)
    puts numpy's f16 rounding of every key and value at its slot and leaves the other slots."""
    rng = np.random.default_rng(7)
    n_kv, hd, hdv, cap, n, at = 2, 64, 48, 320, 37, 100
    kc = rng.integers(0, 1 << 16, (n_kv, cap, hd), dtype=np.uint16)
    vc = rng.integers(0, 1 << 16, (n_kv, hdv, cap), dtype=np.uint16)
    before_k, before_v = kc.copy(), vc.copy()
    k = (rng.standard_normal((n, n_kv, hd)) * 100).astype(np.float32)
    v = (rng.standard_normal((n, n_kv, hdv)) * 100).astype(np.float32)
    store_f16(kc, vc, k, v, at)
    assert np.array_equal(kc[:, at:at + n], k.astype(np.float16).view(np.uint16).transpose(1, 0, 2))
    assert np.array_equal(vc[:, :, at:at + n], v.astype(np.float16).view(np.uint16).transpose(1, 2, 0))
    others = np.ones(cap, bool)
    others[at:at + n] = False
    assert np.array_equal(kc[:, others], before_k[:, others])
    assert np.array_equal(vc[:, :, others], before_v[:, :, others])

"""The runtime: weights in placed buffers, products split over worker threads.

Model code asks for products by tensor name (`linear`) and for per-head work
(`over_heads`); it never sees kernels, threads or NUMA placement. A product
is split into consecutive row ranges, one per worker, by the NUMA layer's
`row_split`, so `slice` placement and the compute split always agree. Each
worker reads the copy of a weight that its node holds (`layout.array_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from . import kernels
from . import ops
from .attention import merge_stats, probabilities, softmax_stats
from .gguf_file import GGUFFile, ModelLoadError, TensorInfo
from .kv_cache import KVCache, filled_slots

F32, F16, BF16 = 0, 1, 30
SPREAD_ATTENTION = 2048  # key slots x query rows above which attention is spread over the workers

class Layout(Protocol):
    mode: str

    def array_for(self, name: str, worker: int) -> tuple[np.ndarray, int]: ...

    def full_array(self, name: str) -> np.ndarray | None: ...


class Pool(Protocol):
    workers: Sequence

    def run(self, fn: Callable[[int], None]) -> None: ...


@dataclass
class Weight:
    info: TensorInfo

    @property
    def ggml_type(self) -> int:
        return self.info.ggml_type

    @property
    def rows(self) -> int:
        return self.info.rows

    @property
    def ne0(self) -> int:
        return self.info.shape[0]


class Runtime:
    """Owns the weights, the worker pool and the split of every product."""

    def __init__(self, gguf: GGUFFile, layout: Layout, pool: Pool,
                 row_split: Callable[[int, int], list[tuple[int, int]]]):
        self.gguf = gguf
        self.layout = layout
        self.pool = pool
        self.n_workers = len(pool.workers)
        self._row_split = row_split
        self._small: dict[str, np.ndarray] = {}
        self._plans: dict[str, list[tuple[np.ndarray, int, int, int]]] = {}
        self.weights = {name: Weight(info) for name, info in gguf.tensors.items()}

    # -- weights -----------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.weights

    def shape(self, name: str) -> tuple[int, ...]:
        return self.weights[name].info.shape

    def f32(self, name: str) -> np.ndarray:
        """A small float tensor (norm weights, biases) as float32, cached."""
        arr = self._small.get(name)
        if arr is None:
            w = self.weights[name]
            raw = self._any_full(name)
            arr = kernels.dequantize_rows(w.ggml_type, raw.reshape(w.rows, -1), 0, w.rows).reshape(-1)
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            self._small[name] = arr
        return arr

    def _any_full(self, name: str) -> np.ndarray:
        full = self.layout.full_array(name)
        if full is not None:
            return full
        raise ModelLoadError(f"tensor {name!r} has no complete copy in this placement")

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Dequantized rows of a matrix (embedding lookup)."""
        w = self.weights[name]
        out = np.empty((len(ids), w.ne0), dtype=np.float32)
        for k, i in enumerate(ids):
            arr, first = self._part_holding(name, int(i))
            out[k] = kernels.dequantize_rows(w.ggml_type, arr, int(i) - first, int(i) - first + 1)[0]
        return out

    def _part_holding(self, name: str, row: int) -> tuple[np.ndarray, int]:
        full = self.layout.full_array(name)
        if full is not None:
            return full, 0
        for wk in range(self.n_workers):
            arr, first = self.layout.array_for(name, wk)
            if first <= row < first + arr.shape[0]:
                return arr, first
        raise IndexError(f"row {row} of {name!r} is held by no worker")

    def set_layout(self, layout: Layout, pool: Pool) -> None:
        self.layout = layout
        self.pool = pool
        self.n_workers = len(pool.workers)
        self._plans.clear()
        self._small.clear()

    # -- products ----------------------------------------------------------------
    def _plan(self, name: str) -> list[tuple[np.ndarray, int, int, int]]:
        """Per worker: (array it reads, first row that array holds, lo, hi)."""
        plan = self._plans.get(name)
        if plan is None:
            w = self.weights[name]
            plan = []
            for wk, (lo, hi) in enumerate(self._row_split(w.rows, self.n_workers)):
                arr, first = self.layout.array_for(name, wk)
                arr = arr.reshape(arr.shape[0], -1) if arr.ndim != 2 else arr
                plan.append((arr, first, lo, hi))
            self._plans[name] = plan
        return plan

    def linear(self, x: np.ndarray, names: Sequence[str], dispatch: bool = True) -> list[np.ndarray]:
        """x [n, k] times each named weight; all products run in one dispatch over the workers."""
        n = x.shape[0]
        jobs = []
        for name in names:
            w = self.weights[name]
            if w.ne0 != x.shape[1]:
                raise ValueError(f"{name}: input width {x.shape[1]} != row length {w.ne0}")
            xp = kernels.prepare(w.ggml_type, x[0] if n == 1 else x)
            out = np.empty((n, w.rows), dtype=np.float32)
            jobs.append((w.ggml_type, self._plan(name), xp, out))
        if dispatch:
            self._dispatch(jobs, n == 1)
        else:
            self._pending = jobs
        return [j[3] for j in jobs]

    def gated(self, x: np.ndarray, gate: str, up: str, activation: str
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """act(x W_gate) * (x W_up), the activation applied by each worker to the rows it computed."""
        g, u = self.linear(x, [gate, up], dispatch=False)
        a = np.empty_like(g)
        act = ops.gelu_mul if activation == "gelu" else ops.silu_mul
        split = self._row_split(self.weights[gate].rows, self.n_workers)

        def finish(wk: int) -> None:
            lo, hi = split[wk]
            if hi > lo:
                act(g[:, lo:hi], u[:, lo:hi], a[:, lo:hi])
        self._dispatch(self._pending, x.shape[0] == 1, finish)
        return g, u, a

    def _dispatch(self, jobs, single: bool, then: Callable[[int], None] | None = None) -> None:
        def work(wk: int) -> None:
            for qtype, plan, xp, out in jobs:
                arr, first, lo, hi = plan[wk]
                if hi <= lo:
                    continue
                if single:
                    kernels.matvec(qtype, arr, xp, out[0, first:first + arr.shape[0]], lo - first, hi - first)
                else:
                    kernels.matmat(qtype, arr, xp, out[:, first:first + arr.shape[0]], lo - first, hi - first)
            if then is not None:
                then(wk)

        self.each_worker(work)

    def each_inline(self, fn: Callable[[int], None]) -> None:
        for w in range(self.n_workers):
            fn(w)

    def each_worker(self, fn: Callable[[int], None]) -> None:
        """fn(w) on every worker; a single worker runs inline (no hand-off cost)."""
        if self.n_workers == 1:
            fn(0)
        else:
            self.pool.run(fn)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, kv: KVCache, il: int, pos0: int,
                  window: int, scale: float) -> np.ndarray:
        """Store K/V at pos0.. and attend; each node's workers read only their node's part of the cache.

        The cache is split between owners (one per node); within an owner, the query rows are
        split between the node's workers, so each output is one worker's dot over the owner's
        positions in order. On one node that is exactly llama.cpp's order, whatever the threads.
        """
        kv.store(il, k, v, pos0)
        n, n_head, hd = q.shape
        n_kv = kv.cfg.n_head_kv
        group = n_head // n_kv
        rows = n * group
        no = kv.n_workers
        n_slots = [filled_slots(pos0 + n, o, no) for o in range(no)]
        # queries grouped by their kv head: [n_kv, n * group, hd]
        qg = np.ascontiguousarray(q.reshape(n, n_kv, group, hd).transpose(1, 0, 2, 3)).reshape(n_kv, rows, hd)
        xps = [kernels.prepare(F16, qg[h]) for h in range(n_kv)]
        scores = [np.empty((n_kv, rows, max(ns, 1)), dtype=np.float32) for ns in n_slots]
        mxs = np.full((no, n_kv, rows), -np.inf, dtype=np.float32)
        sms = np.zeros((no, n_kv, rows), dtype=np.float64)
        kl, vl = kv.k[il], kv.v[il]
        hdv = vl[0].shape[1]
        # ggml takes llamafile's tinyBLAS for products with >= 2 columns (tokens) and
        # ggml_vec_dot_f16 for one: our F16 matmat / matvec follow those two summation orders
        decode = n == 1

        def scores_rows(o: int, r0: int, r1: int) -> None:
            ns = n_slots[o]
            if not ns or r1 <= r0:
                return
            for h in range(n_kv):
                if decode:
                    for r in range(r0, r1):
                        kernels.matvec(F16, kl[o][h].view(np.uint8), (xps[h][0][r],), scores[o][h][r], 0, ns)
                else:
                    kernels.matmat(F16, kl[o][h].view(np.uint8), (xps[h][0][r0:r1],), scores[o][h, r0:r1], 0, ns)
            softmax_stats(scores[o][:, r0:r1], o, no, ns, pos0, group, window, scale,
                          mxs[o][:, r0:r1], sms[o][:, r0:r1], r0)

        big_m = np.empty((n_kv, rows), dtype=np.float32)
        inv_l = np.empty((n_kv, rows), dtype=np.float32)
        outs = np.zeros((no, n_kv, rows, hdv), dtype=np.float32)

        def values_rows(o: int, r0: int, r1: int) -> None:
            ns = n_slots[o]
            if not ns or r1 <= r0:
                return
            probs = probabilities(scores[o][:, r0:r1], ns, big_m[:, r0:r1], inv_l[:, r0:r1])
            # llama.cpp sums over its whole (256-padded) cache row, masked positions with
            # probability 0: pad with zeros to whole 16-lane (64 for one token) steps
            step = 64 if decode else 16
            kp = min(-(-ns // step) * step, vl[o][0].shape[1])
            if kp > ns:
                probs = np.concatenate([probs, np.zeros((n_kv, r1 - r0, kp - ns), np.float32)], axis=2)
            for h in range(n_kv):
                xp = kernels.prepare(F16, probs[h])
                if decode:
                    for r in range(r1 - r0):
                        kernels.matvec(F16, vl[o][h].view(np.uint8), (xp[0][r],), outs[o][h][r0 + r], 0, hdv)
                else:
                    kernels.matmat(F16, vl[o][h].view(np.uint8), xp, outs[o][h, r0:r1], 0, hdv)

        self._attention_pass(kv, rows, sum(n_slots) * rows > SPREAD_ATTENTION, scores_rows)
        merge_stats(mxs, sms, big_m, inv_l)
        self._attention_pass(kv, rows, sum(n_slots) * rows > SPREAD_ATTENTION, values_rows)
        out = outs[0] if no == 1 else outs.sum(axis=0)
        return np.ascontiguousarray(out.reshape(n_kv, n, group, hdv).transpose(1, 0, 2, 3)).reshape(n, n_head, hdv)

    def _attention_pass(self, kv: KVCache, rows: int, spread: bool, fn: Callable[[int, int, int], None]) -> None:
        """fn(owner, r0, r1) for every owner; spread: each worker takes its share of its node's rows."""
        if not spread or self.n_workers == 1:
            for o in range(kv.n_workers):
                fn(o, 0, rows)
            return
        shares: dict[int, tuple[int, int, int]] = {}
        for o, ws in enumerate(kv.owner_workers):
            for i, (r0, r1) in enumerate(self._row_split(rows, len(ws)) if rows >= len(ws) else
                                         [(0, rows)] + [(rows, rows)] * (len(ws) - 1)):
                shares[ws[i]] = (o, r0, r1)

        def work(w: int) -> None:
            share = shares.get(w)
            if share is not None:
                fn(*share)
        self.each_worker(work)

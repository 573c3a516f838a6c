"""Where a mixture-of-experts model's tokens go: expert hits per layer over a sliding window, and
which node's memory the routed experts' bytes were read from.

The runtime records every routed token as it computes it; the dashboard, ``--record`` and
``numawb bench`` read ``snapshot()``. Figures are counted, not estimated: the node of each
expert read is the placement plan's (the owner node for ``experts``, every node's own rows for
``slice``, the replica of the reading worker's node for ``mirror``).
"""
from __future__ import annotations

import re
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class RoutingSnapshot:
    window: int                      # tokens counted (per layer, at most the window size)
    hits: np.ndarray                 # [n_layer, n_expert] routed hits in the window
    node_bytes: dict[int, float]     # expert bytes read from each node, per token (window mean)
    layers: tuple[int, ...] = field(default=())  # the MoE layers
    step_imbalance: float = 1.0      # mean over layer steps of busiest node / mean node (see below)

    @property
    def node_shares(self) -> dict[int, float]:
        total = sum(self.node_bytes.values())
        return {n: v / total for n, v in self.node_bytes.items()} if total else {}

    @property
    def imbalance(self) -> float:
        """Busiest node's expert bytes over the mean across nodes, summed over the window (1.0:
        even). ``step_imbalance`` is the same ratio per layer step, averaged: what a layer waits
        for when each node computes only its own experts (weights mode ``experts``)."""
        vals = list(self.node_bytes.values())
        mean = sum(vals) / len(vals) if vals else 0.0
        return max(vals) / mean if mean else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"window": self.window, "layers": list(self.layers),
                "hits": {str(il): [int(v) for v in self.hits[il]] for il in self.layers},
                "node_bytes_per_token": {str(n): v for n, v in sorted(self.node_bytes.items())},
                "node_shares": {str(n): v for n, v in sorted(self.node_shares.items())},
                "imbalance": self.imbalance, "step_imbalance": self.step_imbalance}


class TokenJournal:
    """Routed experts that compiled code writes for each decoded token, every layer at once
    (`token_layer.token_runner`): row ``written % size`` of ``ids`` [size, layers, k], then
    ``written[0] += 1``. `RoutingStats` reads the new rows in bulk (at a snapshot, before other
    records, and from the decoding thread once half the journal is new), so a token costs no
    Python per layer. ``keys``: each layer's (tensor, expert tensors), as `RoutingStats.record`
    takes them."""

    def __init__(self, keys: list[tuple[str, tuple[str, ...]]], k: int, size: int = 256):
        self.keys = list(keys)
        self.ids = np.zeros((size, len(self.keys), k), dtype=np.int64)
        self.written = np.zeros(1, dtype=np.int64)
        self.read = 0

    @property
    def due(self) -> bool:
        """Half the journal holds rows not yet read (read them before the writer laps them)."""
        return int(self.written[0]) - self.read >= self.ids.shape[0] // 2


#: decode batches' passes kept before they are counted (`RoutingStats.record_pass`)
PASSES_DUE = 32


class RoutingStats:
    """Routed experts per layer over the last ``window`` tokens, thread-safe.

    Recording is on the decode path (once per MoE layer and token), so it only stores: each layer's
    last ``window`` tokens' expert ids in a ring, and per call the distinct experts read. The hits
    and the bytes per node are counted when a snapshot is asked for (the dashboard's twice a
    second), with NumPy over the rings. A decoded token computed in one compiled call records
    through a `TokenJournal` instead (no Python per token), read in bulk into the same rings."""

    def __init__(self, n_layer: int, n_expert: int, window: int = 256,
                 bytes_by_node: Callable[[str, int], dict[int, float]] | None = None,
                 nodes: Callable[[], list[int]] | None = None):
        self.n_layer, self.n_expert, self.window = n_layer, n_expert, window
        self._ring: list[np.ndarray | None] = [None] * n_layer   # [window, k] expert ids per layer
        self._filled = [0] * n_layer                              # tokens recorded per layer (all time)
        self._pos = [0] * n_layer                                 # the ring's next row per layer
        self._calls: deque = deque()   # (token count, layer, table key, distinct experts read) per call
        self._bytes_by_node = bytes_by_node
        self._nodes = nodes
        self._tables: dict[tuple, tuple] = {}  # (tensor, tensors) -> _layer_table's entry
        self._lock = threading.Lock()
        self._layers: set[int] = set()
        self._journals: "weakref.WeakSet[TokenJournal]" = weakref.WeakSet()
        self._passes: list[tuple[tuple, np.ndarray]] = []   # decode batches' passes not yet counted

    def attach(self, journal: TokenJournal) -> None:
        """Count the rows compiled code writes into `journal` from now on (see TokenJournal)."""
        with self._lock:
            if journal not in self._journals:
                journal.read = int(journal.written[0])
                self._journals.add(journal)

    def read_journals(self) -> None:
        """Count the journals' new rows (also done at every snapshot and record)."""
        with self._lock:
            self._read_journals()

    def record_pass(self, keys: list[tuple[str, tuple[str, ...]]], ids: np.ndarray) -> None:
        """A decode batch's pass in one compiled call (`engine.batch`): routed layer i's rows'
        experts ids[i] [n, k], keys[i] its (tensor, expert tensors) as `record` takes them. Kept and
        counted with the journals (at a snapshot, or every `PASSES_DUE` passes): a pass costs no
        Python per layer."""
        with self._lock:
            self._passes.append((tuple(keys), ids.copy()))
            if len(self._passes) >= PASSES_DUE:
                self._read_journals()

    def _read_journals(self) -> None:
        passes, self._passes = self._passes, []
        for keys, ids in passes:
            for key, rows in zip(keys, ids):
                entry = self._layer_table(*key)
                if entry is not None:
                    self._add(entry, key, rows)
        for j in list(self._journals):
            written = int(j.written[0])
            n = written - j.read
            if n <= 0:
                continue
            size = j.ids.shape[0]
            n = min(n, size)  # rows lapped by the writer are lost (never with `due` honoured)
            rows = j.ids[(written - n + np.arange(n)) % size]  # [n, layers, k], oldest first
            j.read = written
            entries = [(li, self._layer_table(*key), key) for li, key in enumerate(j.keys)]
            entries = [(li, e, key) for li, e, key in entries if e is not None]
            for li, entry, _key in entries:
                self._ring_add(entry[0], rows[:, li, :])
            # the calls in the order they ran: token by token, layer by layer
            self._calls.extend((1, entry[0], key, rows[t, li]) for t in range(n) for li, entry, key in entries
                               if entry[2] is not None)
            self._trim()

    def _layer_table(self, tensor: str, tensors: tuple[str, ...]) -> tuple[int, list[int], np.ndarray | None] | None:
        """(layer, nodes, bytes [n_expert, len(nodes)] read per routed token of each expert), made
        once per layer and placement."""
        key = (tensor, tensors)
        entry = self._tables.get(key)
        if entry is None:
            m = _LAYER.search(tensor)
            if m is None:
                return None
            il = int(m.group(1))
            if self._bytes_by_node is None or not tensors:
                entry = (il, [], None)
            else:
                per_expert = [[self._bytes_by_node(name, e) for name in tensors] for e in range(self.n_expert)]
                nodes = sorted({n for row in per_expert for nb in row for n in nb} | set(self._nodes() if self._nodes else ()))
                table = np.zeros((self.n_expert, len(nodes)), dtype=np.float64)
                for e, row in enumerate(per_expert):
                    for nb in row:
                        for n, b in nb.items():
                            table[e, nodes.index(n)] += b
                entry = (il, nodes, table)
            self._tables[key] = entry
        return entry

    def record(self, tensor: str, experts: np.ndarray, tensors: tuple[str, ...] = ()) -> None:
        """Tokens' routed experts [n, k] of the layer that ``tensor`` (``blk.N.…``) belongs to,
        computed in one call; ``tensors``: the expert tensors read for them (their bytes per node
        are counted)."""
        entry = self._layer_table(tensor, tensors)
        if entry is None:
            return
        with self._lock:
            self._read_journals()
            self._add(entry, (tensor, tensors), np.asarray(experts, dtype=np.int64))

    def _add(self, entry: tuple, key: tuple, rows: np.ndarray) -> None:
        """Rows [n, k] of one layer, computed in one call. Under the lock."""
        n = rows.shape[0]
        self._ring_add(entry[0], rows)
        if entry[2] is not None:
            # each routed expert's rows are read once per call, however many tokens chose it
            self._calls.append((n, entry[0], key, rows[0].copy() if n == 1 else np.unique(rows)))
            self._trim()

    def _ring_add(self, il: int, rows: np.ndarray) -> None:
        n, k = rows.shape
        self._layers.add(il)
        ring = self._ring[il]
        if ring is None or ring.shape[1] != k:
            ring = self._ring[il] = np.zeros((self.window, k), dtype=np.int64)
            self._filled[il] = self._pos[il] = 0
        take = rows[-self.window:]
        at = self._pos[il]
        first = min(len(take), self.window - at)
        ring[at:at + first] = take[:first]
        ring[:len(take) - first] = take[first:]
        self._pos[il] = (at + len(take)) % self.window
        self._filled[il] += n

    def _trim(self) -> None:
        limit = self.window * max(1, len(self._layers))
        while len(self._calls) > limit:
            self._calls.popleft()

    def snapshot(self) -> RoutingSnapshot:
        with self._lock:
            self._read_journals()
            hits = np.zeros((self.n_layer, self.n_expert), dtype=np.int64)
            window = 0
            for il, ring in enumerate(self._ring):
                if ring is not None:
                    m = min(self._filled[il], self.window)
                    window = max(window, m)
                    hits[il] = np.bincount(ring[:m].ravel(), minlength=self.n_expert)[:self.n_expert]
            calls = list(self._calls)
            tables = dict(self._tables)
            layers = tuple(sorted(self._layers))
        tot: dict[int, float] = {}
        tokens_per_layer: dict[int, int] = {}
        ratios = []
        for n_tok, il, key, used in calls:
            _il, nodes, table = tables[key]
            vals = table[used].sum(0)
            total = float(vals.sum())
            if total:
                ratios.append(float(vals.max()) * len(vals) / total)
            tokens_per_layer[il] = tokens_per_layer.get(il, 0) + n_tok
            for nd, b in zip(nodes, vals.tolist()):
                tot[nd] = tot.get(nd, 0.0) + b
        n_tokens = max(tokens_per_layer.values(), default=0)
        node_bytes = {nd: b / n_tokens for nd, b in tot.items()} if n_tokens else {}
        return RoutingSnapshot(window, hits, node_bytes, layers,
                               sum(ratios) / len(ratios) if ratios else 1.0)

    def clear(self) -> None:
        """Forget the window (and the bytes per expert: after a switch they come from other nodes)."""
        with self._lock:
            for j in self._journals:  # what they hold now was routed before the switch
                j.read = int(j.written[0])
            self._passes = []
            self._tables = {}
            self._ring = [None] * self.n_layer
            self._filled = [0] * self.n_layer
            self._pos = [0] * self.n_layer
            self._calls.clear()

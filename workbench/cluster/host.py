"""One host's part of a pipelined model: the object each Ray actor runs (no Ray import here).

The host reads only its own layers' tensors from its own copy of the GGUF file, places them
with its own NUMA plan (topology, pinned workers, weights and KV modes) and runs
`Session.forward_stage`; the hidden state comes in and goes out, and the last stage samples
the next token itself, so only a token id goes back to the driver.
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from typing import Any

import numpy as np

HEADER_DIGEST_BYTES = 64 << 20  # a header longer than this is compared on its first 64 MiB


def file_facts(path: str) -> tuple[int, str]:
    """(size, sha256 of the GGUF header: metadata and tensor table), or (-1, reason)."""
    from ..engine.gguf_file import ModelLoadError, read_gguf
    try:
        size = os.path.getsize(path)
        g = read_gguf(path)
    except OSError as e:
        return -1, e.strerror or str(e)
    except ModelLoadError as e:
        return -1, str(e)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(min(g.data_offset, HEADER_DIGEST_BYTES)))
    return size, h.hexdigest()


class StageHost:
    """A pipeline stage on one host (see module doc). Every method returns plain data."""

    def __init__(self, label: str):
        self.label = label
        self.engine = None
        self.pool = None
        self.sessions: dict[int, Any] = {}
        self.pickers: dict[int, Any] = {}  # sid -> its request's Picker (the last stage samples)

    # -- before loading ------------------------------------------------------------
    def describe(self, path: str) -> dict[str, Any]:
        """This host and its copy of the model: file size and header digest, layer sizes."""
        size, digest = file_facts(path)
        out: dict[str, Any] = {"label": self.label, "hostname": socket.gethostname(), "pid": os.getpid(),
                               "path": path, "size": size, "digest": digest}
        if size >= 0:
            from ..engine.gguf_file import read_gguf
            g = read_gguf(path)
            arch = g.architecture
            out["n_layer"] = int(g.metadata.get(f"{arch}.block_count", 0))
            out["n_embd"] = int(g.metadata.get(f"{arch}.embedding_length", 0))
            out["tensor_bytes"] = {n: t.nbytes for n, t in g.tensors.items()}
            out["n_params"] = int(sum(int(np.prod(t.shape)) for t in g.tensors.values()))
        return out

    def metadata(self, path: str) -> dict[str, Any]:
        """The GGUF metadata (the driver's tokenizer is built from it)."""
        from ..engine.gguf_file import read_metadata
        return read_metadata(path)

    def plan(self, path: str, layers: tuple[int, int], placement: Any, n_ctx: int) -> dict[str, Any]:
        """Need and free per NUMA node of this host's part (weights of its layers + a KV cache of
        n_ctx positions for them), from the placement plan; nothing of the model is allocated."""
        from ..engine.config import config_from_metadata
        from ..engine.engine import kv_sizes, stage_tensors, tensor_specs
        from ..engine.gguf_file import read_gguf
        from ..numa.plan import KVRequest, plan_for_pool
        g = read_gguf(path)
        tokens = g.metadata.get("tokenizer.ggml.tokens") or []
        cfg = config_from_metadata(g.metadata, len(tokens))
        keep = set(stage_tensors(g.tensors, cfg.n_layer, layers))
        g.tensors = {n: t for n, t in g.tensors.items() if n in keep}
        pool = self._pool(placement)
        n_ctx = min(n_ctx, cfg.n_ctx_train)
        plan = plan_for_pool(tensor_specs(g), placement.weights, pool, budget=placement.budget,
                             kv=KVRequest(layers[1] - layers[0], kv_sizes(cfg, n_ctx, pool), placement.kv))
        return {"need": plan.need(), "free": dict(plan.free), "notes": list(pool.notes)}

    def bandwidth(self, placement: Any) -> float | None:
        """This host's measured bandwidth for its workers (bytes/s) from the advisor probe cached
        here ($XDG_CACHE_HOME/numawb/), or None when this machine has not been probed."""
        from collections import Counter

        from ..advisor.probe import cached_profile
        from ..numa.topology import load_topology
        from .split import host_bandwidth
        prof = cached_profile(load_topology())
        if prof is None:
            return None
        pool = self._pool(placement)
        return host_bandwidth(prof, Counter(w.node for w in pool.workers)) or None

    def _pool(self, placement: Any):
        from ..numa.workers import WorkerPool
        if self.pool is None:
            self.pool = WorkerPool(placement.threads, placement.policy, placement.cpus, placement.smt)
        return self.pool

    # -- loading -------------------------------------------------------------------
    def load(self, path: str, layers: tuple[int, int], placement: Any) -> dict[str, Any]:
        """Read and place this host's layers (Engine.load(layers=...)) on its own workers."""
        from ..engine.engine import Engine
        self.close_engine()
        pool = self._pool(placement)
        self.engine = Engine.load(path, placement=placement, pool=pool, layers=tuple(layers))
        eng = self.engine
        return {"load_seconds": eng.load_seconds, "weight_bytes": eng.weight_bytes,
                "tensors": len(eng.gguf.tensors), "threads": pool.n_threads,
                "nodes": sorted({w.node for w in pool.workers})}

    def open(self, sid: int, n_ctx: int) -> int:
        """A session (KV cache of this host's layers) for request stream `sid`; returns its n_ctx."""
        old = self.sessions.pop(sid, None)
        if old is not None:
            old.close()
        s = self.engine.new_session(n_ctx)
        self.sessions[sid] = s
        return s.n_ctx

    def drop(self, sid: int) -> None:
        """Release request stream `sid`'s cache."""
        s = self.sessions.pop(sid, None)
        self.pickers.pop(sid, None)
        if s is not None:
            s.close()

    # -- running -------------------------------------------------------------------
    def step(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One pipeline step. msg: rows [(sid, n_past, n)] (one sequence's n tokens, or several
        sequences' one token each: a batched pass), x (their token ids on the first stage, else
        the previous stage's hidden rows), pick {sid: Picker} for sequences starting a request,
        want (sample?). Out: the next stage's msg (x = this stage's hidden rows), or on the last
        stage {tokens: one picked per row} when `want` (else {})."""
        from ..engine.batch import stage_batch
        rows = msg["rows"]
        self.busy_since = time.monotonic()
        self.caller_tid = threading.get_native_id()  # worker 0's share runs on this thread
        try:
            sessions = [self.sessions[sid] for sid, _, _ in rows]
            with self.engine.lock:
                if len(rows) == 1:
                    out = sessions[0].forward_stage(msg["x"], rows[0][1])
                else:
                    for s, (_, n_past, n) in zip(sessions, rows):
                        if n != 1 or n_past > s.kv.n:
                            raise ValueError(f"a batched step takes one token per sequence at a cached position "
                                             f"(got {n} at {n_past}, cache holds {s.kv.n})")
                        s.kv.truncate(n_past)
                    out = stage_batch(self.engine, sessions, msg["x"])
        except Exception as e:  # the driver shows it as one line naming this host
            raise RuntimeError(f"host {self.label}: {type(e).__name__}: {e}") from None
        finally:
            self.busy_since = None
        if not self.engine.model.is_last:
            return dict(msg, x=out)
        self.pickers.update(msg.get("pick") or {})
        if not msg.get("want", True):
            return {}
        logits = out if out.ndim == 2 else out[None]
        return {"tokens": [self.pickers[sid].pick(logits[-1 if len(rows) == 1 else i])
                           for i, (sid, _, _) in enumerate(rows)]}

    busy_since: float | None = None
    caller_tid: int | None = None

    def ping(self) -> tuple[str, float]:
        """This host's label and for how long its current step has run (0: idle); answered
        beside a running step (a compiled graph runs steps on its own thread)."""
        t = self.busy_since
        return self.label, (time.monotonic() - t) if t is not None else 0.0

    # -- the proof -----------------------------------------------------------------
    def proof(self) -> dict[str, Any]:
        """Where this host's pages and threads are: the proof per buffer, numastat and the workers."""
        from ..numa.proof import format_proof, process_numastat, prove
        from ..numa.views import format_numastat
        eng = self.engine
        buffers = eng.buffers()
        proofs = prove(buffers)
        stat = process_numastat(buffers)
        busy = eng.pool.busy_fraction()  # since the previous proof (before check() runs on the workers)
        workers = eng.pool.check()
        p = eng.placement
        from ..numa.budget import free_per_node
        from ..numa.topology import format_cpulist, load_topology
        topo = load_topology()
        free = free_per_node(topo)
        mem = {str(n.id): (int(n.mem_total), int(free.get(n.id, 0))) for n in topo.nodes}
        cpus = {str(n.id): format_cpulist(list(n.cpus)) for n in topo.nodes}
        return {"label": self.label, "path": eng.path, "mem": mem, "cpus": cpus, "layers": [eng.layers.start, eng.layers.stop],
                "weights_mode": p.weights, "kv_mode": p.kv, "load_seconds": eng.load_seconds,
                "proof": format_proof(proofs), "numastat": format_numastat(stat),
                "nodes": {str(n): {k: v.get(n, 0) for k, v in stat.items()}
                          for n in sorted({n for d in stat.values() for n in d})},
                "buffers": [{"label": b.label, "kind": b.kind, "intended": list(b.intended), "bytes": b.nbytes,
                             "pages_by_node": {str(k): v for k, v in b.pages_by_node.items()},
                             "share_in_place": b.share} for b in proofs],
                "workers": [self._worker_row(w, busy, topo) for w in workers]}

    def _worker_row(self, w: Any, busy: list[float], topo: Any) -> dict[str, Any]:
        """Where a worker runs; worker 0's share runs on the thread that runs the steps (as in one
        process, where it is the caller's), so its row is that thread's CPU (None before a step)."""
        from ..telemetry import thread_cpu
        row = {"index": w.index, "cpu": w.actual_cpu, "node": w.actual_node, "wanted_cpu": w.cpu,
               "wanted_node": w.node, "misplaced": w.misplaced, "thread": "pool",
               "busy": busy[w.index] if w.index < len(busy) else 0.0}
        if w.index == 0:
            cpu = thread_cpu(self.caller_tid) if self.caller_tid is not None else None
            node = topo.cpu_node.get(cpu) if cpu is not None else None
            row.update(cpu=cpu, node=node, thread="caller", misplaced=node is not None and node != w.node)
        return row

    # -- cost ----------------------------------------------------------------------
    def relay(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Pass a message on untouched (the hand-off benchmark: transport cost without compute)."""
        return msg

    def close_engine(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()
        self.pickers.clear()
        if self.engine is not None:
            self.engine.close()  # closes the pool too
            self.engine = None
            self.pool = None

    def close(self) -> None:
        self.close_engine()
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def now(self) -> float:
        return time.time()

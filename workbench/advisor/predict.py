"""Predict every placement: memory per node, decode and prompt tokens/s, and recommend one.

For each candidate (threads on a node set x weights mode x KV mode):

* **memory per node** comes from the NUMA layer's own planner (``plan_memory`` below, the one
  place that calls it), checked against free memory per node;
* **bytes read per token** ``B[i][j]``: what node i's workers read from node j's memory. Each
  worker computes its ``row_split`` share of every product (as the engine does), so node i's
  share of a tensor is its workers' rows; where that share lives follows the tensor's placement
  (mirror/slice: node i; interleave: evenly over the nodes in use; none: the loader's node).
  The KV cache is split between nodes (one owner per node) and read where its mode put it;
* **decode time per token** = the slowest of: each node's memory time ``sum_j B[i][j] / bw(i, j, n_i)``
  (the probed matrix, scaled by the node's thread curve); each node's kernel time; and each source
  node's total ``sum_i B[i][j]`` over what its memory can serve; plus the engine's measured
  per-token overhead. The kernel time, with the engine's constants measured on this machine, is per
  GGML type the in-cache product time (the compute ceiling) plus the share of the memory time the
  kernel does not hide, calibrated so that on local memory it is exactly the measured streamed rate
  (``kernel_time``); remote bytes then cost more by that share of their extra wait. Each product's
  start on a matrix in no cache (``cold``: measured per type and shape) is added to the slower of
  memory and kernels: the first lines' latency is time the memory does not stream (R1's narrow experts
  at 2 threads on a host whose second core adds 5 % bandwidth: +21 % hidden under the memory time,
  +8 % added to it).
  Fixtures have no engine constants: their compute time is FLOPs over the stated FLOP/s per core;
* **prompt time per token** = FLOPs per token over the measured kernel throughput of the threads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from gguf.constants import GGMLQuantizationType as _T

from ..numa.budget import free_per_node
from ..numa.plan import KVRequest, TensorSpec, make_plan, row_split
from ..numa.modes import KV_FIXED, WEIGHT_MODES, kv_choices
from ..numa.topology import Topology
from ..numa.workers import plan_cpus
from .cost import ModelCost
from .probe import MemoryProfile

GiB = 1 << 30
KV_BLOCK = 32          # the engine deals cache positions to owners in blocks of this many
PROMPT_BATCH = 512     # the engine's prompt batch (weights are read once per batch)
#: the types whose measured kernels (`engine_cal`'s keys, ggml's type names) the engine model reads
TYPE_NAMES = {int(t): t.name for t in (_T.F32, _T.F16, _T.BF16, _T.Q8_0, _T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1,
                                      _T.Q4_K, _T.Q5_K, _T.Q6_K)}


# ------------------------------------------------------------------------------------ the planner


@dataclass(frozen=True)
class _PlanWorker:
    index: int
    cpu: int | None
    node: int


class PlanPool:
    """The workers a ``WorkerPool`` would start (CPU and node each), without starting threads:
    what the NUMA layer's planners need, on the live machine or on a fixture topology."""

    def __init__(self, topology: Topology, n_threads: int | None, policy: str = "distribute"):
        plan, self.notes = plan_cpus(topology, n_threads, policy)
        self.topology = topology
        self.policy = policy
        self.workers = [_PlanWorker(i, c, n) for i, (c, n) in enumerate(plan)]

    @property
    def n_threads(self) -> int:
        return len(self.workers)

    @property
    def nodes(self) -> list[int]:
        out: list[int] = []
        for w in self.workers:
            if w.node not in out:
                out.append(w.node)
        return out

    def node_workers(self, node: int) -> list[int]:
        return [w.index for w in self.workers if w.node == node]


def plan_memory(cost: ModelCost, weights: str, kv: str, pool: PlanPool, topology: Topology,
                n_ctx: int, free: Mapping[int, int]) -> tuple[dict[str, str], dict[int, int], dict[int, int]]:
    """(placement per tensor, weight bytes per node, KV bytes per node) from the NUMA layer's
    placement plan: the same object the engine checks and allocates from."""
    specs = [TensorSpec(t.name, t.rows, t.row_bytes, t.shape[2] if len(t.shape) == 3 else 1)
             for t in cost.tensors]
    owners = pool.nodes  # one KV owner per node, its first worker holds the node's part
    per_owner = -(-(-(-n_ctx // KV_BLOCK)) // len(owners)) * KV_BLOCK * cost.kv_bytes_per_position
    firsts = {pool.node_workers(n)[0] for n in owners}
    sizes = [per_owner if w.index in firsts else 0 for w in pool.workers]
    plan = make_plan(specs, weights, pool.workers, topology, free=free, kv=KVRequest(1, sizes, kv))
    placement = {name: t.placement for name, t in plan.tensors.items()}
    return placement, plan.weights_need(), plan.kv_need()


# ------------------------------------------------------------------------------------ candidates


@dataclass
class Candidate:
    weights: str
    kv: str
    threads: int
    nodes: list[int]                      # nodes the workers run on
    policy: str
    memory_per_node: dict[int, int]       # weights + KV, bytes
    weights_per_node: dict[int, int]
    kv_per_node: dict[int, int]
    fits: bool
    reads: dict[int, dict[int, float]]    # worker node -> source node -> bytes per token
    bytes_per_token: float
    remote_share: float
    predicted_decode_tps: float
    predicted_prompt_tps: float
    decode_limit: str                     # what bounds decode: "memory node 0", "compute", ...
    same_as: list[str] = field(default_factory=list)
    placement_counts: dict[str, int] = field(default_factory=dict)
    decode_breakdown: dict[str, float] = field(default_factory=dict)   # per token: bytes, FLOPs, seconds
    llamacpp_decode_tps: float = 0.0      # fixtures: llama.cpp's cost model for the same placement
    llamacpp_breakdown: dict[str, float] = field(default_factory=dict)
    prompt_breakdown: dict[str, float] = field(default_factory=dict)   # per prompt token

    @property
    def label(self) -> str:
        return f"{self.weights}/{self.kv}/t{self.threads}@{','.join(map(str, self.nodes))}"

    def to_json(self) -> dict[str, Any]:
        return {"weights": self.weights, "kv": self.kv, "threads": self.threads, "nodes": self.nodes,
                "policy": self.policy, "predicted_decode_tps": self.predicted_decode_tps,
                "predicted_prompt_tps": self.predicted_prompt_tps, "bytes_per_token": self.bytes_per_token,
                "memory_per_node": {str(k): v for k, v in self.memory_per_node.items()},
                "weights_per_node": {str(k): v for k, v in self.weights_per_node.items()},
                "kv_per_node": {str(k): v for k, v in self.kv_per_node.items()},
                "fits": self.fits, "remote_share": self.remote_share,
                "reads_per_token": {str(i): {str(j): v for j, v in row.items()} for i, row in self.reads.items()},
                "decode_limit": self.decode_limit, "same_as": self.same_as,
                "placement_counts": self.placement_counts, "decode_breakdown": self.decode_breakdown,
                "prompt_breakdown": self.prompt_breakdown,
                **({"llamacpp_decode_tps": self.llamacpp_decode_tps, "llamacpp_breakdown": self.llamacpp_breakdown}
                   if self.llamacpp_breakdown else {})}


def _shares(rows: int, pool: PlanPool) -> dict[int, float]:
    """Share of a tensor's rows each node's workers compute (``row_split`` over the workers)."""
    if rows <= 0:
        return {n: 0.0 for n in pool.nodes}
    out: dict[int, float] = {}
    for w, (lo, hi) in zip(pool.workers, row_split(rows, len(pool.workers))):
        out[w.node] = out.get(w.node, 0.0) + (hi - lo) / rows
    return out


def reads_per_token(cost: ModelCost, placement: Mapping[str, str], kv: str, pool: PlanPool,
                    depth: int, loader_node: int) -> tuple[dict[int, dict[int, float]], dict[int, dict[int, float]]]:
    """(B[i][j] weight+KV bytes node i's workers read from node j per token, bytes by type per node)."""
    nodes = pool.nodes
    B: dict[int, dict[int, float]] = {i: {} for i in nodes}
    by_type: dict[int, dict[int, float]] = {i: {} for i in nodes}

    def add(i: int, j: int, v: float) -> None:
        B[i][j] = B[i].get(j, 0.0) + v

    for t in cost.tensors:
        r = t.nbytes * cost.read_fraction[t.name]
        if r <= 0:
            continue
        p = placement.get(t.name, "none")
        if t.name == "token_embd.weight" and cost.read_fraction[t.name] < 1.0:
            shares = {nodes[0]: 1.0}  # a lookup of one row, on the calling thread
        else:
            shares = _shares(t.rows, pool)
        for i, s in shares.items():
            if s <= 0:
                continue
            by_type[i][t.ggml_type] = by_type[i].get(t.ggml_type, 0.0) + r * s
            if p in ("mirror", "slice", "experts"):  # experts: each owner computes its own, locally
                add(i, i, r * s)
            elif p == "interleave":
                for j in nodes:
                    add(i, j, r * s / len(nodes))
            else:
                add(i, loader_node, r * s)
    kv_total = cost.kv_read_bytes(depth)
    if kv_total > 0:
        for i in nodes:
            part = kv_total / len(nodes)
            by_type[i][1] = by_type[i].get(1, 0.0) + part  # f16 cache
            if kv == "first-touch":
                add(i, i, part)
            elif kv == "interleave":
                for j in nodes:
                    add(i, j, part / len(nodes))
            else:
                add(i, int(kv[5:]), part)
    return B, by_type


@dataclass
class EngineModel:
    """What the predicted engine adds to the memory traffic: per-token overhead and kernel limits.

    ``from_profile`` uses this machine's measured constants; fixtures (published llama.cpp runs)
    have none: no overhead, and compute bounded only by the fixture's stated FLOP/s per core."""

    overhead: dict[int, tuple[float, float]] = field(default_factory=dict)  # threads -> (a, b)
    # threads -> type -> rate per thread, measured with that many threads at once
    decode_rates: dict[int, dict[int, float]] = field(default_factory=dict)  # streamed bytes/s
    cache_rates: dict[int, dict[int, float]] = field(default_factory=dict)   # in-cache bytes/s
    prompt_rates: dict[int, dict[int, float]] = field(default_factory=dict)  # FLOP/s
    flops_per_core: float = 0.0
    # threads -> the twins' fixed costs and attention per position (engine_cal.measure_structure)
    structure: dict[int, dict[str, float]] = field(default_factory=dict)
    cold: dict[int, dict[int, float]] = field(default_factory=dict)  # threads -> type -> s a product
    # threads -> type -> FLOP/s of a routed expert's prompt product (its share of the batch's columns)
    expert_prompt_rates: dict[int, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def from_profile(cls, prof: MemoryProfile, arch: str, rows: Mapping[int, int] | None = None,
                     structure_key: str | None = None,
                     cold_shapes: Mapping[int, tuple[int, int]] | None = None) -> "EngineModel":
        """The measured constants; per type the kernel measured at ``rows[type]`` (row length)
        when there is one, else the one at the nearest row length; the twins' costs of
        ``structure_key`` (``twins.TwinShape.key``) when measured."""
        eng = prof.engine or {}
        ids = {v: k for k, v in TYPE_NAMES.items()}
        rows = dict(rows or {})

        def pick(kern: Mapping[str, Any]) -> dict[int, Mapping[str, float]]:
            out: dict[int, tuple[int, Mapping[str, float]]] = {}
            for key, v in kern.items():
                name, _, k = key.partition("@")
                if name not in ids:
                    continue
                t, k_ = ids[name], int(k or 0)
                dist = abs(k_ - rows.get(t, k_))
                if t not in out or dist < out[t][0]:
                    out[t] = (dist, v)
            return {t: v for t, (_, v) in out.items()}
        over_all = eng.get("overhead", {})
        over = over_all.get(arch) or over_all.get("llama") or {}
        dec: dict[int, dict[int, float]] = {}
        cac: dict[int, dict[int, float]] = {}
        pro: dict[int, dict[int, float]] = {}
        for n, kern in eng.get("kernels", {}).items():
            if not n.isdigit():
                continue
            chosen = pick(kern)
            dec[int(n)] = {t: float(v.get("stream_bytes_per_s", v["decode_bytes_per_s"])) for t, v in chosen.items()}
            cac[int(n)] = {t: float(v["decode_bytes_per_s"]) for t, v in chosen.items()}
            pro[int(n)] = {t: float(v["prompt_flops_per_s"]) for t, v in chosen.items()}
        struct = {int(n): {k: float(v) for k, v in d.items()}
                  for n, d in (eng.get("structure", {}).get(structure_key or "", {}) or {}).items()}
        expert_pp: dict[int, dict[int, float]] = {}
        for n, table in eng.get("expert_prompt", {}).items():
            for key, v in table.items():
                name = key.partition("@")[0]
                if name in ids:
                    expert_pp.setdefault(int(n), {})[ids[name]] = float(v)
        cold: dict[int, dict[int, float]] = {}  # the model's own product shapes (cold_shapes) only
        for n, table in eng.get("cold", {}).items():
            for t, (k, rows_total) in (cold_shapes or {}).items():
                key = f"{TYPE_NAMES.get(t, t)}@{k}x{max(8, rows_total // max(int(n), 1))}"
                if key in table:
                    cold.setdefault(int(n), {})[t] = float(table[key])
        return cls(overhead={int(k): (float(v[0]), float(v[1])) for k, v in over.items()},
                   decode_rates=dec, cache_rates=cac, prompt_rates=pro, flops_per_core=prof.flops_per_core,
                   structure=struct, cold=cold, expert_prompt_rates=expert_pp)

    @staticmethod
    def _nearest(table: Mapping[int, Any], threads: int) -> Any:
        return table[min(table, key=lambda t: (abs(t - threads), -t))] if table else {}

    def decode_rate(self, threads: int) -> dict[int, float]:
        """Streamed bytes/s per thread by type, measured with the nearest thread count."""
        return self._nearest(self.decode_rates, threads)

    def cache_rate(self, threads: int) -> dict[int, float]:
        """The same products on a matrix in the L2 cache (the compute ceiling), bytes/s per thread."""
        return self._nearest(self.cache_rates, threads)

    def prompt_rate(self, threads: int) -> dict[int, float]:
        return self._nearest(self.prompt_rates, threads)

    def overhead_s(self, threads: int, n_layer: int) -> float:
        if not self.overhead:
            return 0.0
        a, b = self._nearest(self.overhead, threads)
        return a + b * n_layer

    def fixed_s(self, threads: int, n_dense: int, n_moe: int, prompt: bool = False) -> float:
        """The engine's fixed cost of a token (a prompt token: in a 512-token batch) with these
        blocks, from the twins when measured, else the tiny models' ``a + b x layers`` (decode)."""
        st = self._nearest(self.structure, threads)
        if st:
            pre = "prompt_" if prompt else ""
            return st[pre + "base"] + n_dense * st[pre + "dense_block"] + n_moe * st[pre + "moe_block"]
        return 0.0 if prompt else self.overhead_s(threads, n_dense + n_moe)

    def attention_block_s(self, threads: int, depth: float, prompt: bool = False) -> float | None:
        """Seconds one block spends attending over ``depth`` cached positions (a prompt: per query
        row), on ``threads`` workers: the attention twin's times at its depths, linear between them
        (and from 0), the last segment's slope beyond; None when not measured."""
        st = self._nearest(self.structure, threads)
        key = "prompt_attention_s@" if prompt else "decode_attention_s@"
        pts = sorted((int(k[len(key):]), v) for k, v in (st or {}).items() if k.startswith(key))
        if not pts:
            return None
        pts = [(0, 0.0)] + pts
        for (d0, t0), (d1, t1) in zip(pts, pts[1:]):
            if depth <= d1:
                return t0 + (t1 - t0) * (depth - d0) / max(d1 - d0, 1)
        (d0, t0), (d1, t1) = pts[-2], pts[-1]
        return t1 + max(0.0, (t1 - t0) / max(d1 - d0, 1)) * (depth - d1)

    def cold_s(self, threads: int) -> dict[int, float]:
        """Per type, what one product on a matrix in no cache costs a worker beyond its bytes."""
        return self._nearest(self.cold, threads)


def block_counts(cost: ModelCost) -> tuple[int, int]:
    """(dense blocks, MoE blocks): a block is MoE when it has routed experts' tensors."""
    moe = {t.name.split(".")[1] for t in cost.tensors if t.is_expert and t.name.startswith("blk.")}
    return cost.n_layer - len(moe), len(moe)


def products_per_token(cost: ModelCost) -> dict[int, float]:
    """Matrix products a decoded token runs, by GGML type (a routed expert's tensor: one per expert
    used; the embedding lookup none): each costs every worker a start on a matrix in no cache."""
    out: dict[int, float] = {}
    for t in cost.tensors:
        f = cost.read_fraction[t.name]
        if len(t.shape) < 2 or f <= 0 or (t.name == "token_embd.weight" and f < 1.0):
            continue
        n = cost.expert_used_count if (t.is_expert and cost.expert_count and cost.expert_used_count) else 1
        out[t.ggml_type] = out.get(t.ggml_type, 0.0) + n
    return out


def engine_attention_s(cost: ModelCost, eng: "EngineModel", threads: int, depth: float,
                       prompt: bool = False) -> float | None:
    """Seconds a token's attention takes over every block at ``depth`` (sliding-window layers:
    their window) as the attention twin measured it; None when not measured."""
    if eng.attention_block_s(threads, 1.0, prompt) is None:
        return None
    return float(sum(eng.attention_block_s(threads, min(depth, w) if w else depth, prompt) or 0.0
                     for w in cost.kv_window))


def _decode_time(B: Mapping[int, Mapping[int, float]], by_type: Mapping[int, Mapping[int, float]],
                 pool: PlanPool, prof: MemoryProfile, eng: EngineModel, cost: ModelCost,
                 depth: int, B_kv: Mapping[int, Mapping[int, float]] | None = None) -> tuple[float, str, dict[str, float]]:
    """Seconds per decoded token, what bounds it, and the per-token breakdown (see the module doc:
    the weights' part, the slower of memory and kernels per node; the cache's part, the slower of
    its reads and the attention's arithmetic; the engine's fixed costs; added, as a token runs
    them one after another). ``B``/``by_type`` are the weights' reads, ``B_kv`` the cache's."""
    per_node = {n: len(pool.node_workers(n)) for n in pool.nodes}
    B_kv = B_kv or {}
    n_nodes = len(pool.nodes)
    sum_bytes = sum(sum(row.values()) for row in by_type.values()) or 1.0
    stream, cache = eng.decode_rate(pool.n_threads), eng.cache_rate(pool.n_threads)
    cold = eng.cold_s(pool.n_threads)
    prods = products_per_token(cost) if cold else {}
    attn_engine = engine_attention_s(cost, eng, pool.n_threads, depth)
    attn_flops = cost.attn_flops(depth)
    t_w, why, t_prod, t_mem_w = 0.0, "", 0.0, 0.0
    t_kv_mem, t_attn = 0.0, 0.0
    for i, row in B.items():
        n_i = per_node[i]
        t_mem = sum(v / max(prof.bw(i, j, n_i), 1.0) for j, v in row.items())
        t_cmp, t_p = 0.0, 0.0
        if stream:
            t_cmp = kernel_time(by_type[i], row, n_i, stream, cache,
                                {j: prof.bw(i, j, n_i) for j in row}, prof.bw(i, i, n_i))
            t_p = sum(n * cold.get(ty, 0.0) for ty, n in prods.items())
        elif eng.flops_per_core:
            share = sum(by_type[i].values()) / sum_bytes
            t_cmp = cost.matmul_flops_per_token() * share / (n_i * eng.flops_per_core)
        node_t = max(t_mem, t_cmp) + t_p
        if node_t > t_w:
            t_w, t_prod, t_mem_w = node_t, t_p, t_mem
            why = f"memory reads of node {i}" if t_mem >= t_cmp else (
                f"kernels on node {i} (compute and exposed memory waits)" if stream else f"compute on node {i}")
        kv_row = B_kv.get(i, {})
        t_kv_mem = max(t_kv_mem, sum(v / max(prof.bw(i, j, n_i), 1.0) for j, v in kv_row.items()))
        if attn_engine is not None:
            t_attn = max(t_attn, attn_engine / n_nodes)
        elif eng.flops_per_core:
            t_attn = max(t_attn, attn_flops / n_nodes / (n_i * eng.flops_per_core))
    for j in prof.nodes:
        served = sum(row.get(j, 0.0) for row in B.values())
        cap = prof.capacity(j)
        if served and cap and served / cap > t_w:
            t_w, why = served / cap, f"node {j}'s memory (all readers together)"
    n_dense, n_moe = block_counts(cost)
    t_fixed = eng.fixed_s(pool.n_threads, n_dense, n_moe)
    t_cache = max(t_kv_mem, t_attn)
    total = t_w + t_cache + t_fixed
    if t_cache > t_w:
        why = "attention's arithmetic" if t_attn >= t_kv_mem else "KV cache reads"
    if t_fixed > max(t_w, t_cache):
        why = "the engine's fixed costs (blocks, experts, hand-offs)"
    breakdown = {"weight_bytes": cost.weight_bytes_per_token, "kv_bytes": cost.kv_read_bytes(depth),
                 "attention_flops": attn_flops, "products": float(sum(products_per_token(cost).values())),
                 "dense_blocks": float(n_dense), "moe_blocks": float(n_moe),
                 "weights_s": t_w, "weights_memory_s": t_mem_w, "products_cold_s": t_prod,
                 "kv_s": t_kv_mem, "attention_s": t_attn, "fixed_s": t_fixed, "total_s": total}
    return total, why, breakdown


def kernel_time(types: Mapping[int, float], sources: Mapping[int, float], threads: int,
                stream: Mapping[int, float], cache: Mapping[int, float], bw: Mapping[int, float],
                local_bw: float) -> float:
    """Seconds for ``threads`` workers to run one token's products over ``types`` (GGML type ->
    bytes) read from ``sources`` (node -> bytes, same total) whose bandwidths are ``bw``.

    Per byte of type t: ``c_t`` = in-cache kernel time (the compute ceiling), ``s_t`` = the same
    kernel streamed from local memory (measured), ``m_j`` = memory time from node j. The share of
    memory time the kernel does not hide is ``beta_t = (s_t - c_t) / m_local``, so a byte from node
    j costs ``c_t + beta_t x m_j``: on local memory exactly the measured ``s_t``, on slower
    (remote) memory more, by the exposed share of the extra wait."""
    total = sum(sources.values())
    if total <= 0:
        return 0.0
    frac = {j: v / total for j, v in sources.items()}
    m_loc = 1.0 / max(local_bw, 1.0)  # seconds per byte for the node's workers, local memory
    fallback = min(stream.values())
    t = 0.0
    for ty, b in types.items():
        s_t = 1.0 / (threads * stream.get(ty, fallback))
        c_t = min(s_t, 1.0 / (threads * cache[ty])) if cache.get(ty) else s_t
        beta = max(0.0, s_t - c_t) / m_loc if m_loc > 0 else 0.0
        m_avg = sum(f / max(bw.get(j, local_bw), 1.0) for j, f in frac.items())
        t += b * (c_t + beta * m_avg)
    return t


def _prompt_time(cost: ModelCost, by_type: Mapping[int, Mapping[int, float]], B: Mapping[int, Mapping[int, float]],
                 pool: PlanPool, prof: MemoryProfile, eng: EngineModel, depth: int,
                 n_prompt: int) -> tuple[float, dict[str, float]]:
    """Seconds per prompt token in a batch of ``n_prompt`` (the slower over nodes of the products'
    compute and the weights read once per batch; then the attention over ``depth`` + the batch's
    own earlier rows and the engine's fixed costs), and its breakdown."""
    per_node = {n: len(pool.node_workers(n)) for n in pool.nodes}
    wbytes = sum(sum(r.values()) for r in by_type.values()) or 1.0
    seen = depth + n_prompt / 2.0
    attn = cost.attn_flops(seen)
    attn_engine = engine_attention_s(cost, eng, pool.n_threads, seen, prompt=True)
    expert_rate = eng._nearest(eng.expert_prompt_rates, pool.n_threads)
    flops_by_type: dict[int, float] = {}
    expert_time = 0.0  # one worker's share is taken below, with the node's
    for t in cost.tensors:
        if len(t.shape) == 1 or (t.name == "token_embd.weight" and cost.read_fraction[t.name] < 1.0):
            continue
        f = 2.0 * t.n_elements * cost.read_fraction[t.name] * cost.prompt_share(t.name, n_prompt)
        if t.is_expert and expert_rate.get(t.ggml_type):
            expert_time += f / expert_rate[t.ggml_type]
            continue
        flops_by_type[t.ggml_type] = flops_by_type.get(t.ggml_type, 0.0) + f
    # a batch reads every expert some token of it was routed to, not the used share a token reads
    hit = 1.0 - (1.0 - cost.expert_used_count / cost.expert_count) ** n_prompt if cost.expert_count else 1.0
    batch_bytes = sum(t.nbytes * (hit if t.is_expert and cost.expert_count else cost.read_fraction[t.name])
                      for t in cost.tensors)
    batch_factor = batch_bytes / max(cost.weight_bytes_per_token, 1.0)
    worst, t_attn = 0.0, 0.0
    for i in pool.nodes:
        n_i = per_node[i]
        share = sum(by_type[i].values()) / wbytes
        rate = eng.prompt_rate(pool.n_threads)
        if rate:
            fallback = min(rate.values())
            t_cmp = sum(f * share / (n_i * rate.get(t, fallback)) for t, f in flops_by_type.items())
            t_cmp += expert_time * share / n_i
            if attn_engine is not None:
                t_attn = max(t_attn, attn_engine / len(pool.nodes))
            else:
                t_attn = max(t_attn, attn * share / (n_i * rate.get(1, fallback)))
        elif eng.flops_per_core:
            t_cmp = sum(flops_by_type.values()) * share / (n_i * eng.flops_per_core)
            t_attn = max(t_attn, attn * share / (n_i * eng.flops_per_core))
        else:
            return 0.0, {}
        t_mem = sum(v / max(prof.bw(i, j, n_i), 1.0) for j, v in B[i].items()) * batch_factor / n_prompt
        worst = max(worst, t_cmp, t_mem)
    n_dense, n_moe = block_counts(cost)
    t_fixed = eng.fixed_s(pool.n_threads, n_dense, n_moe, prompt=True)
    total = worst + t_attn + t_fixed
    return total, {"flops": sum(flops_by_type.values()), "attention_flops": attn, "products_s": worst,
                   "attention_s": t_attn, "fixed_s": t_fixed, "total_s": total}


def _loader_node(topology: Topology, pool: PlanPool) -> int:
    """Where 'none' puts everything: the loading thread's node (on a fixture: the first CPU node)."""
    if topology.root == "/":
        from ..numa import syscalls as sc
        r = sc.getcpu()
        if r:
            return topology.node_of(r.value[0])
    return pool.nodes[0]


def thread_configs(topology: Topology, threads: Sequence[int] | None = None) -> list[tuple[int | None, str]]:
    """(threads, policy) pairs to predict: every CPU node's physical cores together, and one node's
    alone when there are several; on one node, 1 thread and all cores (bench's default)."""
    cpu_nodes = list(topology.cpu_node_ids)
    if threads:
        out: list[tuple[int | None, str]] = [(t, "distribute") for t in threads]
        if len(cpu_nodes) > 1:
            out += [(t, f"isolate:{cpu_nodes[0]}") for t in threads
                    if t <= len(topology.physical_cpus(list(topology.node(cpu_nodes[0]).cpus)))]
        return out
    n_all = len(topology.physical_cpus(list(topology.allowed_cpus)))
    if len(cpu_nodes) == 1:
        return [(t, "distribute") for t in sorted({1, n_all})]
    return [(None, "distribute"), (None, f"isolate:{cpu_nodes[0]}")]


def kv_modes_for(topology: Topology, pool_nodes: Sequence[int], all_modes: bool = False) -> list[str]:
    """first-touch, interleave (several nodes), node:N of memory-only nodes (every node with ``all_modes``)."""
    out = ["first-touch"] + (["interleave"] if len(pool_nodes) > 1 else [])
    mem_only = [n.id for n in topology.nodes if n.memory_only]
    if all_modes:
        out = kv_choices(topology.node_ids)
    else:
        out += [f"node:{n}" for n in mem_only]
    return [m for m in out if m in KV_FIXED or m.startswith("node:")]


def predict(cost: ModelCost, topology: Topology, profile: MemoryProfile, *, n_ctx: int = 4096,
            depth: int = 0, n_prompt: int = PROMPT_BATCH, threads: Sequence[int] | None = None,
            weights: Sequence[str] | None = None, kvs: Sequence[str] | None = None,
            engine: EngineModel | None = None, free: Mapping[int, int] | None = None) -> list[Candidate]:
    """Every candidate placement with its memory per node and predicted rates (see module doc)."""
    eng = engine if engine is not None else EngineModel.from_profile(profile, cost.arch)
    free = dict(free) if free is not None else free_per_node(topology)
    out: list[Candidate] = []
    seen: dict[tuple, Candidate] = {}
    for n_threads, policy in thread_configs(topology, threads):
        pool = PlanPool(topology, n_threads, policy)
        loader = _loader_node(topology, pool)
        if loader not in pool.nodes and policy.startswith("isolate"):
            loader = pool.nodes[0]
        for wm in (weights or WEIGHT_MODES):
            for kv in (kvs or kv_modes_for(topology, pool.nodes)):
                if kv.startswith("node:") and int(kv[5:]) not in topology.node_ids:
                    continue
                placement, wneed, kvneed = plan_memory(cost, wm, kv, pool, topology, n_ctx, free)
                if wm == "none":  # the planner asks the live CPU; the prediction's loader decides
                    total = sum(wneed.values())
                    wneed = {loader: total}
                mem = dict(wneed)
                for k, v in kvneed.items():
                    mem[k] = mem.get(k, 0) + v
                fits = all(v <= free.get(k, 0) for k, v in mem.items() if v > 0)
                B, by_type = reads_per_token(cost, placement, kv, pool, depth, loader)
                B_w, by_type_w = reads_per_token(cost, placement, kv, pool, 0, loader)
                B_kv = {i: {j: v - B_w[i].get(j, 0.0) for j, v in row.items()} for i, row in B.items()}
                total_b = sum(sum(r.values()) for r in B.values())
                remote = sum(v for i, r in B.items() for j, v in r.items() if j != i)
                t_dec, why, dec_parts = _decode_time(B_w, by_type_w, pool, profile, eng, cost, depth, B_kv)
                t_pp, pp_parts = _prompt_time(cost, by_type_w, B_w, pool, profile, eng, depth, n_prompt)
                llama_t, llama_parts = 0.0, {}
                if profile.flops_per_core and not eng.decode_rates:  # a fixture: llama.cpp's runs
                    from .llamacpp import llamacpp_decode
                    llama_t, llama_parts = llamacpp_decode(
                        cost, B_w, profile, {n: len(pool.node_workers(n)) for n in pool.nodes}, depth)
                counts: dict[str, int] = {}
                for p in placement.values():
                    counts[p] = counts.get(p, 0) + 1
                c = Candidate(weights=wm, kv=kv, threads=pool.n_threads, nodes=pool.nodes, policy=policy,
                              memory_per_node=mem, weights_per_node=wneed, kv_per_node=kvneed, fits=fits,
                              reads=B, bytes_per_token=total_b, remote_share=remote / total_b if total_b else 0.0,
                              predicted_decode_tps=1.0 / t_dec if t_dec > 0 else 0.0,
                              predicted_prompt_tps=1.0 / t_pp if t_pp > 0 else 0.0,
                              decode_limit=why, placement_counts=counts, decode_breakdown=dec_parts,
                              prompt_breakdown=pp_parts, llamacpp_decode_tps=1.0 / llama_t if llama_t > 0 else 0.0,
                              llamacpp_breakdown=llama_parts)
                sig = (pool.n_threads, tuple(pool.nodes), tuple(sorted(mem.items())),
                       tuple((i, tuple(sorted((j, round(v)) for j, v in r.items()))) for i, r in sorted(B.items())))
                if sig in seen:
                    seen[sig].same_as.append(f"{wm}/{kv}")
                    continue
                seen[sig] = c
                out.append(c)
    return out


def recommend(cands: Sequence[Candidate]) -> tuple[int | None, str]:
    """Index of the fastest candidate that fits (ties: less memory), and one line saying why."""
    fitting = [i for i, c in enumerate(cands) if c.fits]
    if not fitting:
        smallest = min(range(len(cands)), key=lambda i: max(cands[i].memory_per_node.values() or [0]))
        c = cands[smallest]
        return None, (f"nothing fits: the smallest plan ({c.weights}) needs "
                      f"{_need_text(c)} and free memory is short")
    # ties (same predicted rate, e.g. compute-bound): less memory, then fewer remote reads
    best = max(fitting, key=lambda i: (round(cands[i].predicted_decode_tps, 6),
                                       -sum(cands[i].memory_per_node.values()), -cands[i].remote_share))
    c = cands[best]
    # compare with the best fitting candidate of another weights mode, interleave first
    others = [i for i in fitting if cands[i].weights != c.weights and not _same_mode(cands[i], c.weights)]
    ref = None
    inter = [i for i in others if cands[i].weights == "interleave" and cands[i].threads == c.threads]
    pool = inter or others
    if pool:
        ref = max(pool, key=lambda i: cands[i].predicted_decode_tps)
    if ref is not None and cands[ref].predicted_decode_tps > 0:
        gain = (c.predicted_decode_tps / cands[ref].predicted_decode_tps - 1) * 100
        vs = (f"{gain:+.0f} % over {cands[ref].weights}" if abs(gain) >= 0.5 else
              f"as fast as {cands[ref].weights} (bound by {c.decode_limit}), less memory or fewer remote reads")
    else:
        vs = "every weights mode predicts the same here"
    where = (f"{c.threads} thread{'s' if c.threads > 1 else ''} on node{'s' if len(c.nodes) > 1 else ''} "
             f"{','.join(map(str, c.nodes))}")
    return best, f"{c.weights} (kv {c.kv}, {where}): {vs}, needs {_need_text(c)}: fits"


def _same_mode(c: Candidate, mode: str) -> bool:
    return any(s.split("/")[0] == mode for s in c.same_as)


def _need_text(c: Candidate) -> str:
    vals = [v for v in c.memory_per_node.values() if v > 0]
    if not vals:
        return "nothing"
    if len(vals) > 1 and max(vals) - min(vals) <= 0.02 * max(vals):
        return f"{len(vals)} x {max(vals) / GiB:.1f} GiB"
    return " + ".join(f"{v / GiB:.1f} GiB" for v in vals)

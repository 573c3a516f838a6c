"""The engine's own constants, measured on this machine (Numba; imported only when measuring).

* **per-token overhead**: decode time of tiny models (a few KiB of weights, so the time is the
  engine's dispatch, Python and synchronisation work, not memory traffic) with two layer counts,
  fitted as ``a + b x layers`` per thread count and architecture;
* **kernel rates** per GGML type and thread count, all threads running at once (two vCPUs may be
  one core's SMT siblings): one-token products streamed from memory (bytes/s per thread: what a
  decoding thread reaches, its work and its memory waits overlapping only in part), the same on a
  matrix in the L2 cache (for reference), and prompt products of 64 columns (FLOP/s per thread).

Measured lazily, for the types, architecture and thread counts a prediction needs, and kept in the
machine's cached profile (``MemoryProfile.engine``) next to the memory matrices.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Callable

import numpy as np

from .probe import MemoryProfile

TINY_LAYERS = (2, 8)
REPEAT_VEC = 64   # in-cache one-token products per timed dispatch
REPEAT_MAT = 16   # in-cache prompt products per timed dispatch
PASSES = 3        # kernel measurements: passes over every (threads, type), best of each kept
Progress = Callable[[str], None]


def _bench(fn: Callable[[], None], min_time: float = 0.5, reps: int = 5) -> float:
    """Best time of ``fn`` (best-of: other processes on a shared box only ever add time)."""
    fn()
    best = float("inf")
    t_end = time.perf_counter() + min_time
    n = 0
    while n < reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        n += 1
    return best


def _matrix(ggml_type: int, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    from ..engine import kernels as K
    bs, ts = K.BLOCK_SIZES[ggml_type]
    if ggml_type in (K.F32, K.F16, K.BF16):
        x = (rng.standard_normal((rows, k)) * 0.05).astype(np.float32)
        if ggml_type == K.F32:
            return x.view(np.uint8)
        if ggml_type == K.F16:
            return x.astype(np.float16).view(np.uint8)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    w = rng.integers(0, 256, (rows, k // bs, ts), dtype=np.uint8)
    scale = np.array([0.01], np.float16).view(np.uint8)
    offs = {K.Q4_K: (0, 2), K.Q5_K: (0, 2), K.Q6_K: (208,), K.Q4_1: (0, 2), K.Q5_1: (0, 2)}.get(ggml_type, (0,))
    for off in offs:
        w[..., off:off + 2] = scale
    return w.reshape(rows, -1)


def kernel_key(ggml_type: int, k: int) -> str:
    """Name of a measured kernel: type and row length (``Q8_0@640``): short rows cost more per byte."""
    from ..engine import kernels as K
    return f"{K.SUPPORTED_TYPES[ggml_type]}@{k}"


def measure_kernel(ggml_type: int, threads: int = 1, k: int = 2048, cols: int = 64) -> dict[str, float]:
    """Per-thread rates with ``threads`` pinned workers running the same kind of product at once
    (each on its own data), so what threads share (a core's SMT sibling, caches, memory) counts:
    one-token product bytes/s on an L2-resident matrix and streamed from memory (64 MiB each),
    and prompt FLOP/s with ``cols`` columns (64; a routed expert in a prompt batch gets fewer). The kernels are those of the layout the engine keeps the
    type's weight matrices in on this path (`engine.packing`; random bytes are valid data in any)."""
    from ..engine import kernels as K
    from ..engine import packing
    from ..numa.workers import WorkerPool
    rng = np.random.default_rng(0)
    x = rng.standard_normal(k).astype(np.float32)
    xp = K.prepare(ggml_type, x)
    X = rng.standard_normal((cols, k)).astype(np.float32)
    Xp = K.prepare(ggml_type, X)
    n_small = max(16, 256 * 1024 // max(k, 1)) // 8 * 8  # ~256 K weights: in L2 (whole 8-row groups)
    rows_big = max(128, (64 << 20) // _matrix(ggml_type, 1, k, rng).shape[1]) // 8 * 8
    ggml_type = (K.packed_type(ggml_type) if packing.enabled() else None) or ggml_type
    small: list[np.ndarray] = [np.empty(0, np.uint8)] * threads
    big: list[np.ndarray] = [np.empty(0, np.uint8)] * threads
    outs: list[np.ndarray] = [np.empty(0, np.float32)] * threads
    mats: list[np.ndarray] = [np.empty(0, np.float32)] * threads
    with WorkerPool(threads) as pool:
        def make(i: int) -> None:  # each worker writes its own data first: on its own node's memory
            r = np.random.default_rng(1 + i)
            small[i] = _matrix(ggml_type, n_small, k, r)
            big[i] = _matrix(ggml_type, rows_big, k, r)
            outs[i] = np.zeros(rows_big, np.float32)
            mats[i] = np.zeros((cols, n_small), np.float32)
        pool.run(make)
        def run(fn: Callable[[int], None]) -> Callable[[], None]:
            return lambda: pool.run(fn)
        # in-cache products are repeated inside each dispatch so the pool's hand-off (~0.1 ms) is noise
        def small_vec(i: int) -> None:
            for _ in range(REPEAT_VEC):
                K.matvec(ggml_type, small[i], xp, outs[i], 0, n_small)

        def small_mat(i: int) -> None:
            for _ in range(REPEAT_MAT):
                K.matmat(ggml_type, small[i], Xp, mats[i], 0, n_small)
        t = _bench(run(small_vec), min_time=0.1) / REPEAT_VEC
        # streamed from memory: what a decoding thread reaches, its work and its waits overlapping
        ts = _bench(run(lambda i: K.matvec(ggml_type, big[i], xp, outs[i], 0, rows_big)), min_time=0.3)
        tm = _bench(run(small_mat), min_time=0.2) / REPEAT_MAT
    return {"decode_bytes_per_s": small[0].nbytes / t, "stream_bytes_per_s": big[0].nbytes / ts,
            "prompt_flops_per_s": 2.0 * cols * n_small * k / tm}


# ---- tiny models --------------------------------------------------------------------------------


def write_model(path: str, arch: str, n_layer: int, *, d: int = 64, ff: int = 128, n_head: int = 4,
                n_head_kv: int = 2, head_dim: int = 16, qtype: int = 0, seed: int = 1) -> None:
    """A random model of ``arch`` with a 300-token vocabulary: matrices of GGML type ``qtype``
    (F32, F16 or Q8_0; quantized blocks are random bytes with small scales), norms in F32.
    Tiny by default (the overhead calibration); larger shapes give a validation model."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from .twins import add_vocab
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    for key, val in (("context_length", 8192), ("embedding_length", d), ("block_count", n_layer),
                     ("feed_forward_length", ff), ("attention.head_count", n_head),
                     ("attention.head_count_kv", n_head_kv), ("attention.key_length", head_dim),
                     ("attention.value_length", head_dim)):
        w.add_uint32(f"{arch}.{key}", val)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    if arch == "gemma3":
        w.add_uint32(f"{arch}.attention.sliding_window", 64)
    tokens = add_vocab(w)

    def mat(name: str, rows: int, cols: int) -> None:
        if qtype == 8:  # Q8_0: 32 int8 values behind one f16 scale per block
            blocks = rng.integers(-64, 64, (rows, cols // 32, 34), dtype=np.int8).view(np.uint8)
            blocks[..., 0:2] = np.array([0.002], np.float16).view(np.uint8)
            w.add_tensor(name, blocks.reshape(rows, -1), raw_dtype=Q.Q8_0)
            return
        a = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.05)
        w.add_tensor(name, a.astype(np.float16) if qtype == 1 else a)

    def vec(name: str, n: int, base: float = 1.0) -> None:
        w.add_tensor(name, (base + rng.standard_normal(n) * 0.1).astype(np.float32))

    mat("token_embd.weight", len(tokens), d)
    vec("output_norm.weight", d)
    nh, nkv, hd = n_head, n_head_kv, head_dim
    for il in range(n_layer):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", nh * hd, d)
        mat(p + "attn_k.weight", nkv * hd, d)
        mat(p + "attn_v.weight", nkv * hd, d)
        mat(p + "attn_output.weight", d, nh * hd)
        vec(p + "ffn_norm.weight", d)
        mat(p + "ffn_gate.weight", ff, d)
        mat(p + "ffn_up.weight", ff, d)
        mat(p + "ffn_down.weight", d, ff)
        if arch == "qwen2":
            for t, n in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                vec(p + f"attn_{t}.bias", n, 0.0)
        if arch in ("gemma3", "qwen3"):
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if arch == "gemma3":
            vec(p + "post_attention_norm.weight", d)
            vec(p + "post_ffw_norm.weight", d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def decode_seconds(path: str, threads: int, n_tokens: int = 24, rounds: int = 5) -> float:
    """Per-token decode time of the model at ``path`` (like bench's tg: one eval per token): the
    lower quartile of each round's tokens, best round (other processes only ever add time)."""
    from ..engine import Engine
    from ..engine.engine import Placement
    eng = Engine.load(path, placement=Placement(threads=threads))
    try:
        s = eng.new_session(256)
        s.eval([2, 270, 271, 272])
        best = float("inf")
        for _ in range(rounds):
            s.kv.truncate(4)
            del s.tokens[4:]
            times = []
            for i in range(n_tokens):
                t0 = time.perf_counter()
                s.eval([280 + i % 16])
                times.append(time.perf_counter() - t0)
            best = min(best, statistics.quantiles(times, n=4)[0])
        return best
    finally:
        eng.close()


def measure_overhead(arch: str, threads: int) -> tuple[float, float]:
    """(a, b): per-token engine overhead ``a + b x layers`` seconds, from two tiny models."""
    with tempfile.TemporaryDirectory(prefix="numawb-cal-") as d:
        ts = []
        for n in TINY_LAYERS:
            p = os.path.join(d, f"tiny-{arch}-{n}.gguf")
            write_model(p, arch, n)
            ts.append(decode_seconds(p, threads))
    (l0, l1), (t0, t1) = TINY_LAYERS, ts
    b = max(0.0, (t1 - t0) / (l1 - l0))
    return max(0.0, t0 - b * l0), b


TINY_ARCHS = ("llama", "gemma3", "qwen2", "qwen3")


def cold_key(ggml_type: int, k: int, rows: int) -> str:
    """Name of a cold-product measurement: ``Q4_K@256x128`` (type, row length, rows a worker)."""
    return f"{kernel_key(ggml_type, k)}x{rows}"


def ensure_engine(profile: MemoryProfile, types: dict[int, int], arch: str, threads: list[int],
                  progress: Progress | None = None, *, shape=None, n_dense: int = 0, kv_bpp_block: int = 0,
                  cold: dict[int, tuple[int, int]] | None = None,
                  expert_cols: dict[int, tuple[int, int]] | None = None, weight_bytes_block: float = 0.0,
                  weight_bytes_token: float = 0.0) -> bool:
    """Measure what ``profile.engine`` lacks for these kernels (type -> row length), architecture
    and thread counts; with ``shape`` (``twins.TwinShape``) also the twins' fixed and attention costs
    (``measure_structure``), and with ``cold`` (type -> (row length, rows a product)) the cost of a
    product on a matrix in no cache (``measure_cold``). Returns True when something was added (the
    caller saves the profile). ``expert_cols`` (type -> (row length, columns)): the prompt product of a
    routed expert, which gets only its share of a batch's columns."""
    from ..engine import kernels as K
    eng = profile.engine
    krev = kernels_revision()
    if eng.get("kernel_path") not in (None, K.kernel_path()) or eng.get("kernels_revision") != krev:
        eng.clear()  # another kernel path, or the kernels changed since: the old constants do not apply
    eng["kernel_path"] = K.kernel_path()
    eng["kernels_revision"] = krev
    rev = engine_revision()
    if eng.get("engine_revision") != rev:  # the engine changed: its own costs are measured again
        for key in ("overhead", "structure", "cold", "expert_prompt"):
            eng.pop(key, None)
    eng["engine_revision"] = rev
    kern = eng.setdefault("kernels", {})
    over = eng.setdefault("overhead", {})
    changed = False
    want = dict(types)
    want.setdefault(K.F16, 128)  # the KV cache (f16), read in head-sized rows
    todo = [(n, t, kernel_key(t, k)) for n in threads for t, k in sorted(want.items())
            if t in K.SUPPORTED_TYPES and kernel_key(t, k) not in kern.get(str(n), {})]
    # several passes over all of them, keeping each rate's best: on a shared machine a burst of
    # other work then spoils one pass of a measurement, not all of it
    best: dict[tuple[int, str], dict[str, float]] = {}
    for p in range(PASSES if todo else 0):
        for n, t, name in todo:
            if progress:
                progress(f"measuring the kernels, pass {p + 1}/{PASSES}: {name}, "
                         f"{n} thread{'s' if n > 1 else ''} ...")
            r = measure_kernel(t, n, want[t])
            old = best.setdefault((n, name), r)
            for key, v in r.items():
                old[key] = max(old[key], v)
    for (n, name), r in best.items():
        kern.setdefault(str(n), {})[name] = r
        changed = True
    if changed:
        try:
            eng["load_average"] = max(float(eng.get("load_average", 0.0)), os.getloadavg()[0])
        except OSError:
            pass
    tiny = arch if arch in TINY_ARCHS else "llama"
    per = over.setdefault(tiny, {})
    for n in threads:
        if str(n) in per:
            continue
        if progress:
            progress(f"measuring the engine's per-token overhead ({tiny}, {n} thread{'s' if n > 1 else ''}) ...")
        per[str(n)] = list(measure_overhead(tiny, n))
        changed = True
    for ty, (k, rows_total) in sorted((cold or {}).items()):
        if ty not in K.SUPPORTED_TYPES:
            continue
        for n in threads:
            rows = max(8, rows_total // n)  # a worker's share of the product
            name = cold_key(ty, k, rows)
            table = eng.setdefault("cold", {}).setdefault(str(n), {})
            if name in table:
                continue
            if progress:
                progress(f"measuring products on cold matrices ({name}, {n} thread{'s' if n > 1 else ''}) ...")
            rates = kern.get(str(n), {}).get(kernel_key(ty, k)) or measure_kernel(ty, n, k)
            # the median of three: a start is a difference of two timings, and the least of two
            # once gave 2 threads no start at all on SmolLM2's Q4_1 (1 thread: 1.4 us a product)
            table[name] = statistics.median(
                measure_cold(ty, n, k, rows, rates["stream_bytes_per_s"], rates["decode_bytes_per_s"])
                for _ in range(3))
            changed = True
    for ty, (k, cols) in sorted((expert_cols or {}).items()):
        if ty not in K.SUPPORTED_TYPES or cols >= 64:
            continue
        for n in threads:
            name = f"{kernel_key(ty, k)}/c{cols}"
            table = eng.setdefault("expert_prompt", {}).setdefault(str(n), {})
            if name in table:
                continue
            if progress:
                progress(f"measuring a routed expert's prompt product ({name}, {n} thread{'s' if n > 1 else ''}) ...")
            table[name] = max(measure_kernel(ty, n, k, cols)["prompt_flops_per_s"] for _ in range(2))
            changed = True
    if shape is not None:
        per_shape = eng.setdefault("structure", {}).setdefault(shape.key, {})
        for n in threads:
            if str(n) in per_shape:
                continue
            per_shape[str(n)] = measure_structure(shape, n, n_dense, kv_bpp_block, progress, weight_bytes_block,
                                                  weight_bytes_token=weight_bytes_token)
            changed = True
    return changed


# ---- products on cold small matrices -------------------------------------------------------------


def measure_cold(ggml_type: int, threads: int, k: int, rows: int, stream_bytes_per_s: float,
                 cache_bytes_per_s: float) -> float:
    """Seconds one product costs a worker beyond its bytes at the streamed rate, on a matrix of
    ``rows`` rows of length ``k`` that is in no cache (a routed expert's, or a narrow model's every
    matrix): ``threads`` workers each run products over their own randomly ordered matrices from a
    256 MiB pool, one after another as a token's products come, and the same number of products on
    one matrix in the L2 cache; the difference, less the bytes' streamed-over-cached time, is the
    start's cost (the Python loop around both cancels). Best of three passes."""
    from ..engine import kernels as K
    from ..engine import packing
    from ..numa.workers import WorkerPool
    rng = np.random.default_rng(2)
    x = rng.standard_normal(k).astype(np.float32)
    xp = K.prepare(ggml_type, x)
    row_bytes = _matrix(ggml_type, 1, k, rng).shape[1]
    # a start matters on small matrices; a large one's is measured on its first MiB (the pool stays 256 MiB)
    rows = max(8, min(rows, (1 << 20) // row_bytes) // 8 * 8)
    n_mat = max(16, min(4096, (256 << 20) // (row_bytes * rows)))
    ptype = (K.packed_type(ggml_type) if packing.enabled() else None) or ggml_type
    pools: list[np.ndarray] = [np.empty(0, np.uint8)] * threads
    orders: list[list[np.ndarray]] = [[]] * threads
    outs: list[np.ndarray] = [np.empty(0, np.float32)] * threads
    with WorkerPool(threads) as pool:
        def make(i: int) -> None:
            r = np.random.default_rng(10 + i)
            pools[i] = _matrix(ptype, rows * n_mat, k, r)
            orders[i] = [pools[i][m * rows:(m + 1) * rows] for m in r.permutation(n_mat)]
            outs[i] = np.zeros(rows, np.float32)
        pool.run(make)

        def cold(i: int) -> None:
            out = outs[i]
            for m in orders[i]:
                K.matvec(ptype, m, xp, out, 0, rows)

        def hot(i: int) -> None:
            out, m0 = outs[i], orders[i][0]
            for _ in orders[i]:
                K.matvec(ptype, m0, xp, out, 0, rows)
        t_cold = _bench(lambda: pool.run(cold), min_time=0.1, reps=3)
        t_hot = _bench(lambda: pool.run(hot), min_time=0.1, reps=3)
    nbytes = rows * row_bytes
    extra = nbytes * (1.0 / max(stream_bytes_per_s, 1.0) - 1.0 / max(cache_bytes_per_s, 1.0))
    return max(0.0, (t_cold - t_hot) / n_mat - max(0.0, extra))


# ---- the engine on twins of the target's structure ----------------------------------------------------

FFN_MIN = 64
TWIN_MOE = (2, 6)      # MoE blocks of the two routing twins (one leading dense block when the target has any)
STRUCTURE_ROUNDS = 3   # rounds of the fixed-cost twins (median of each figure)
PROMPT_TOKENS = 512    # the prompt twins' batch (bench's pp512)
ATTN_DEPTHS = (1024, 4096, 16384)   # depths the attention twin is timed at (and at ATTN_BASE)
ATTN_BASE = 64
ATTN_PROMPT_ROWS = 32               # the attention twin's prompt (after ATTN_BASE and each depth)


def _fill(session, depth: int, rng: np.random.Generator) -> None:
    """Put ``depth`` positions of random keys and values into the session's cache (written, so
    they are in memory like a real cache's), as if a prompt had been evaluated."""
    kv = session.kv
    kv.truncate(0)
    step = 1024
    for il in range(kv.cfg.n_layer):
        for p in range(0, depth, step):
            n = min(step, depth - p)
            # small values: a flat softmax (a peaked one over random rows spends its time on
            # subnormal exponentials, which a real cache's scores rarely give)
            if hasattr(kv, "kv_lora"):  # MLA: latent + rotary rows
                kv.store(il, (rng.standard_normal((n, kv.width)) * 0.05).astype(np.float32), p)
            else:
                c = kv.cfg
                kv.store(il, (rng.standard_normal((n, c.n_head_kv, c.head_dim)) * 0.05).astype(np.float32),
                         (rng.standard_normal((n, c.n_head_kv, c.head_dim_v)) * 0.05).astype(np.float32), p)
    kv.n = depth
    session.tokens = [280] * depth


def _at_depth(session, depth: int) -> None:
    """Make the session's cache hold its first ``depth`` positions again (``_fill`` wrote them;
    ``truncate`` only ever shortens, so the count is set back)."""
    session.kv.n = depth
    del session.tokens[depth:]


def _decode_at(session, depth: int, n_tokens: int, rounds: int) -> float:
    """Lower quartile of one-token evals at ``depth`` cached positions, best round."""
    best = float("inf")
    for _ in range(rounds):
        times = []
        for i in range(n_tokens):
            _at_depth(session, depth)
            t0 = time.perf_counter()
            session.eval([280 + i % 16])
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.quantiles(times, n=4)[0] if len(times) >= 4 else min(times))
    return best


def _prompt_at(session, depth: int, n: int, reps: int = 3) -> float:
    """Best seconds of evaluating ``n`` prompt tokens after ``depth`` cached positions."""
    rng = np.random.default_rng(5)
    ids = [int(t) for t in rng.integers(260, 300, n)]
    best = float("inf")
    for _ in range(reps):
        _at_depth(session, depth)
        t0 = time.perf_counter()
        session.eval(ids)
        best = min(best, time.perf_counter() - t0)
    return best


def _twin_times(path: str, threads: int, *, prompt: bool = True) -> tuple[float, float]:
    """(decode seconds a token, prompt seconds a token of a PROMPT_TOKENS batch) of a twin."""
    from ..engine import Engine
    from ..engine.engine import Placement
    eng = Engine.load(path, placement=Placement(threads=threads))
    try:
        s = eng.new_session(PROMPT_TOKENS + 64)
        s.eval([2, 270, 271, 272])
        dec = _decode_at(s, 4, 24, 5)
        pp = _prompt_at(s, 0, PROMPT_TOKENS) / PROMPT_TOKENS if prompt else 0.0
        return dec, pp
    finally:
        eng.close()


LLC_BYTES = 64 << 20   # a large last-level cache: what the attention twin's cache must exceed


def attention_blocks(bytes_per_position_block: int, depth: int, llc_bytes: int = LLC_BYTES) -> int:
    """Blocks of the attention twin: enough that its cache at ``depth`` is twice a large last-level
    cache (a real model's cache is read from memory), 2 to 16."""
    per_block = max(1, bytes_per_position_block * depth)
    return max(2, min(16, -(-2 * llc_bytes // per_block)))


def twin_block_bytes(weight_bytes_block: float, weight_bytes_token: float, blocks: int) -> float:
    """Weight bytes each of the attention twin's ``blocks`` blocks streams a token: together the
    target's bytes a token, up to twice `LLC_BYTES` (then every cache line is evicted anyway), at
    least the target's bytes a block, at most 64 MiB a block."""
    token = min(max(float(weight_bytes_token), float(weight_bytes_block)), 2.0 * LLC_BYTES)
    return min(max(float(weight_bytes_block), token / blocks), float(64 << 20))


ATTN_ROUNDS = 3   # rounds of the attention twin's timings: base and every depth each round


def _attention_times(path: str, threads: int, blocks: int) -> dict[str, float]:
    """The attention twin (``blocks`` dense blocks): seconds a block spends attending at each of
    ATTN_DEPTHS, over its time at ATTN_BASE: ``decode_attention_s@D`` for a decoded token,
    ``prompt_attention_s@D`` for each row of a prompt evaluated after D positions.

    Each round times the base and every depth back to back (8 decoded tokens and one prompt a
    point), and a depth's figure is the median of its rounds' differences: a burst of other work
    on a shared machine spoils one round's pair, not the figure (one base timed once, against
    depths timed after it, once gave 2 threads 0 at depth 1024 on SmolLM2's shape while the real
    model spent ~80 us a block there). `monotone_in_depth` then mends a point that still came out
    at or below a shallower one."""
    from ..engine import Engine
    from ..engine.engine import Placement
    deepest = max(ATTN_DEPTHS)
    eng = Engine.load(path, placement=Placement(threads=threads))
    dec: dict[int, list[float]] = {d: [] for d in ATTN_DEPTHS}
    pp: dict[int, list[float]] = {d: [] for d in ATTN_DEPTHS}
    try:
        s = eng.new_session(deepest + ATTN_PROMPT_ROWS + 8)
        _fill(s, deepest, np.random.default_rng(4))
        s.eval([280])  # the token program's first call
        for _ in range(ATTN_ROUNDS):
            dec0 = _decode_at(s, ATTN_BASE, 8, 1)
            pp0 = _prompt_at(s, ATTN_BASE, ATTN_PROMPT_ROWS, 1)
            for d in ATTN_DEPTHS:
                dec[d].append((_decode_at(s, d, 8, 1) - dec0) / blocks)
                pp[d].append((_prompt_at(s, d, ATTN_PROMPT_ROWS, 1) - pp0) / (blocks * ATTN_PROMPT_ROWS))
    finally:
        eng.close()
    out: dict[str, float] = {"attention_blocks": float(blocks)}
    for key, table in (("decode_attention_s@", dec), ("prompt_attention_s@", pp)):
        mended = monotone_in_depth({d: statistics.median(v) for d, v in table.items()})
        out.update({f"{key}{d}": t for d, t in mended.items()})
    return out


def monotone_in_depth(times: dict[int, float]) -> dict[int, float]:
    """Attention's seconds at each depth, mended where a measurement cannot be right: attending
    over more positions never costs less. A point at or below the one before it (or at or below
    0) is put on the line from the origin through the next deeper point that is above it; with
    none deeper, it keeps the one before's time per position. All non-positive: all 0."""
    depths = sorted(times)
    out = dict(times)
    for i, d in enumerate(depths):
        prev = out[depths[i - 1]] if i else 0.0
        if out[d] > prev and out[d] > 0.0:
            continue
        deeper = [e for e in depths[i + 1:] if times[e] > max(prev, 0.0)]
        if deeper:
            out[d] = max(prev, times[deeper[0]] * d / deeper[0])
        elif i and prev > 0.0:
            out[d] = prev * d / depths[i - 1]
        else:
            out[d] = max(prev, 0.0)
    return out


def measure_structure(shape, threads: int, n_dense_target: int, kv_bytes_per_position_block: int,
                      progress: Progress | None = None, weight_bytes_block: float = 0.0,
                      weight_bytes_token: float = 0.0) -> dict[str, float]:
    """The engine's fixed costs on twins of ``shape`` (``twins.TwinShape``) at ``threads``, in seconds:
    ``base`` a token, ``dense_block`` and ``moe_block`` (at the target's experts used) a block,
    ``expert`` each routed expert used (its share of ``moe_block``), the ``prompt_*`` of the same
    per prompt token in a 512-token batch, and the attention twin's seconds a block at each depth
    (``_attention_times``)."""
    from .twins import write_twin
    say = progress or (lambda m: None)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="numawb-twin-") as d:
        def twin(n_dense: int, n_moe: int, used: int | None = None, **kw) -> str:
            p = os.path.join(d, f"t{n_dense}-{n_moe}-{used}-{len(kw)}.gguf")
            if not os.path.exists(p):   # written once, timed every round
                write_twin(p, shape, n_dense, n_moe, used=used, **kw)
            return p
        plural = "s" if threads > 1 else ""

        def one_round(r: int) -> dict[str, float]:
            what = (f"measuring the engine on twins of {shape.key} ({threads} thread{plural}), "
                    f"round {r + 1}/{STRUCTURE_ROUNDS}")
            if shape.n_expert:
                lead = 1 if n_dense_target else 0
                m0, m1 = TWIN_MOE
                say(f"{what}: routing ...")
                a = _twin_times(twin(lead, m0), threads)
                b = _twin_times(twin(lead, m1), threads)
                moe = [max(0.0, (y - x) / (m1 - m0)) for x, y in zip(a, b)]
                dense = [0.0, 0.0]
                if lead:
                    say(f"{what}: dense blocks ...")
                    c = _twin_times(twin(lead + 2, m0), threads)
                    dense = [max(0.0, (y - x) / 2) for x, y in zip(a, c)]
                expert = [0.0, 0.0]
                used = shape.n_expert_used
                if used > 1:
                    say(f"{what}: experts ...")
                    half = max(1, used // 2)
                    e = _twin_times(twin(lead, m1, used=half), threads)
                    expert = [max(0.0, (y - x) / (m1 * (used - half))) for x, y in zip(e, b)]
                base = [max(0.0, t - lead * dn - m0 * mo) for t, dn, mo in zip(a, dense, moe)]
            else:
                say(f"{what}: blocks ...")
                a = _twin_times(twin(2, 0), threads)
                b = _twin_times(twin(8, 0), threads)
                dense = [max(0.0, (y - x) / 6) for x, y in zip(a, b)]
                moe, expert = [0.0, 0.0], [0.0, 0.0]
                base = [max(0.0, t - 2 * dn) for t, dn in zip(a, dense)]
            return {pre + key: v[i] for i, pre in enumerate(("", "prompt_"))
                    for key, v in (("base", base), ("dense_block", dense), ("moe_block", moe), ("expert", expert))}

        # whole rounds, each twin's figure the median of its rounds': the fixed costs are
        # differences of two twins' times, and one twin timed during a burst of other work
        # once doubled 2 threads' cost a dense block (32.7 us against 16.5-17.3 in four
        # runs minutes later, SmolLM2's shape, Zen 4)
        rounds = [one_round(r) for r in range(STRUCTURE_ROUNDS)]
        out.update({k: statistics.median(x[k] for x in rounds) for k in rounds[0]})
        say(f"measuring the engine's attention on a twin of {shape.key} ({threads} thread{plural}) ...")
        blocks = attention_blocks(kv_bytes_per_position_block, max(ATTN_DEPTHS))
        # between two visits of a block's cache the target streams a whole token's weights (and the
        # other blocks' caches): the twin's blocks stream as many weight bytes a token, up to twice
        # a large last-level cache (at least the target's bytes a block, at most 64 MiB a block), so
        # the twin's cache comes from memory when the target's does. With a block's bytes only, R1's
        # narrow blocks (1.6 MB) left the twin's 16 blocks' cache at depth 4096 (25 MB) in L3:
        # attention predicted at 31 ms a token against ~50 measured (advisor_check, 23:33 UTC)
        per_block = twin_block_bytes(weight_bytes_block, weight_bytes_token, blocks)
        ffn = max(FFN_MIN, int(per_block / (3 * shape.width * 34 / 32)) // 32 * 32)
        out.update(_attention_times(twin(blocks, 0, full_attention=True, ffn=ffn), threads, blocks))
    return out


def _hash_sources(h, root: str) -> None:
    """Feed every .py file under ``root`` (sorted, caches skipped) into the hash ``h``."""
    for dirpath, dirnames, files in sorted(os.walk(root)):
        dirnames[:] = sorted(x for x in dirnames if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(dirpath, f), "rb") as fh:
                    h.update(f.encode() + b"\0" + fh.read())


def engine_revision() -> str:
    """A hash of the engine's sources and of the twins' measurement (this module, `twins`): the
    twins' figures are measured again when either changes."""
    import hashlib
    from .. import engine as pkg
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for f in ("engine_cal.py", "twins.py"):
        with open(os.path.join(here, f), "rb") as fh:
            h.update(f.encode() + b"\0" + fh.read())
    _hash_sources(h, os.path.dirname(pkg.__file__))
    return h.hexdigest()[:16]


def kernels_revision() -> str:
    """A hash of the kernels' sources (`engine.kernels`): the kernels' rates are measured again
    when it changes. (A hand-bumped revision number was forgotten: the Q4_1 kernel got 13 % faster
    and the advisor kept predicting from its old rate.)"""
    import hashlib
    from ..engine import kernels as pkg
    h = hashlib.sha256()
    _hash_sources(h, os.path.dirname(pkg.__file__))
    return h.hexdigest()[:16]

"""The engine's own compiled helpers with the signatures a model's first prompt calls them with.

On a first start these are the last tasks of `kernels.precompile`'s list, which the engine and its
compile helper share (`kernels.compile_helper`) while the engine is still loading: the first
prompt then loads them in milliseconds instead of compiling them (seconds each). A signature that no longer
matches the engine's calls only costs the helper's time: the call compiles as before.
"""
from __future__ import annotations

from numba import types


def _c(dtype, ndim: int) -> types.Array:
    return types.Array(dtype, ndim, "C")


def signatures(uses: str = "") -> list:
    """(dispatcher, argument types) pairs, in the order a first prompt calls them (the engine may
    reach one before the helper does: then both compile it). `uses` ("gelu" or "silu", plus
    ",experts"; empty: every one) leaves out the other activation and a dense model's router."""
    from . import attention, crew, gating, kv_cache, ops, sampling
    f32, f64, i64, b = types.float32, types.float64, types.int64, types.boolean
    v, m, t = _c(f32, 1), _c(f32, 2), _c(f32, 3)
    a2 = types.Array(f32, 2, "A")
    want = set(uses.split(",")) if uses else {"gelu", "silu", "experts"}
    sigs = [
        (ops.rms_norm, (m, v, f64, m)),
        (ops.rope_cache, (_c(i64, 1), i64, f64, f64, v, f64, f64, f64, f64)),
        (ops.rms_norm_heads, (t, v, f64)),
        (ops.apply_rope, (t, t, b)),
        (kv_cache.store_f16, (_c(types.uint16, 3), _c(types.uint16, 3), t, t, i64)),
        (attention.prompt_rows_probs, (t, t, i64, i64, i64, i64, i64, i64, f64)),   # one owner's prompt
        (attention.softmax_stats, (t, i64, i64, i64, i64, i64, i64, f64, m, _c(f64, 2), i64)),   # several owners'
        (attention.merge_stats, (t, _c(f64, 3), m, m)),
        (attention.probabilities, (t, i64, i64, m, m)),
        (attention.probabilities, (types.Array(f32, 3, "A"), i64, i64, m, m)),
        (ops.add_rms_norm, (m, m, v, b, v, f64, m)),
        (attention.probs_chunk, crew.CHUNK_ARGS),         # a long decoded softmax's crew job
        (sampling.candidates, (v, i64, f64, f64, f64)),   # a sampled first token: the chain
        (sampling.draw, (_c(f64, 1), f64)),               # and the draw
    ]
    if "gelu" in want:
        sigs += [(ops.gelu_mul, (m, m, m, v)),
                 (ops.gelu_mul, (a2, a2, a2, v))]  # column ranges of the gated product (worker shares)
    if "silu" in want:
        sigs += [(ops.silu_mul, (m, m, m)),
                 (ops.silu_mul, (a2, a2, a2))]
    if "experts" in want:
        sigs.append((gating.gate, (m, i64)))  # a mixture of experts' router, prompt path
    return sigs


def warm_one(arg: str) -> None:
    """Compile (or load) signature I of `signatures(USES)`, given as "I@USES" (a compile task).
    A warm-up, also when the engine runs it: one that fails is left to the first real call, which
    compiles what it needs or reports the error there (a model load never fails here)."""
    i, _, uses = arg.partition("@")
    fn, sig = signatures(uses)[int(i)]
    try:
        fn.compile(sig)
    except Exception:  # noqa: BLE001 - see above
        pass


def compile_tasks(uses: str = "") -> list[tuple[str, bool, bool]]:
    """`kernels.precompile`'s `after` tasks for these helpers: the engine does not wait for them
    (its first prompt compiles one the helper has not reached)."""
    return [(f"call:{__name__}:warm_one:{i}@{uses}", False, False) for i in range(len(signatures(uses)))]


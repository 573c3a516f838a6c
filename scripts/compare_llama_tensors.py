#!/usr/bin/env python3
"""Compare our engine's intermediate tensors with a llama.cpp dump, layer by layer.

First write the dump with the reference venv (see ``scripts/dump_llama_tensors.py``)::

    /opt/refvenv/bin/python scripts/dump_llama_tensors.py --case 1 -o /tmp/llama_case1.npz
    PYTHONPATH=. python3 scripts/compare_llama_tensors.py /tmp/llama_case1.npz --case 1

or with ``scripts/llama_dump.cpp`` (the vendored build's library; any model, FA=0 for the non-flash
attention numawb follows), whose raw output is read as it is::

    FA=0 /tmp/llama_dump MODEL /tmp/x.bin 1 2 818 5279 -- 1234
    PYTHONPATH=. python3 scripts/compare_llama_tensors.py /tmp/x.bin -m MODEL --ids 2,818,5279 --decode 1234

Prints, for each tapped tensor (see ``Decoder.tap``), the max abs difference, the
max relative difference (abs diff / max |ref|) and how many elements differ.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def llama_lookup(z) -> dict[str, np.ndarray]:
    """Our tap names -> llama.cpp tensors (squeezed to [tokens, features])."""
    keys = [k for k in z.keys() if ":" in k]
    names = [k.split(":", 1)[1] for k in keys]
    out: dict[str, np.ndarray] = {}

    def flat(a):
        a = np.asarray(a, dtype=np.float32)
        a = a.reshape(-1, a.shape[-2] * a.shape[-1]) if a.ndim == 4 and a.shape[1] > 1 else a.reshape(-1, a.shape[-1])
        return a

    for i, (k, nm) in enumerate(zip(keys, names)):
        m = re.fullmatch(r"(Qcur|Kcur)-(\d+)", nm)
        if m and i > 0 and names[i - 1] == f"{m.group(1)}_normed-{m.group(2)}":
            # our Qrope tap comes after the query scaling (the next node in llama.cpp's graph)
            out[f"{m.group(1)[0]}rope-{m.group(2)}"] = flat(z[keys[i + 1]] if m.group(1) == "Qcur" else z[k])
        elif re.fullmatch(r"kqv_out-\d+", nm):
            out[nm] = flat(z[k])
            out["attn_out-" + nm.split("-")[1]] = flat(z[keys[i + 1]])
        elif re.fullmatch(r"(inp_scaled|attn_norm|Qcur_normed|Kcur_normed|sa_out|ffn_norm|ffn_gate|ffn_up|"
                          r"ffn_geglu|ffn_out|l_out)(-\d+)?|result_norm|result_output", nm):
            out[nm] = flat(z[k])
        elif re.fullmatch(r"Vcur-\d+", nm) and z[k].shape[1] > 1:
            out[nm] = flat(z[k])
    if "logits" in z:
        out["result_output"] = z["logits"][None, :]
    return out


def read_llama_dump(path: str) -> dict[str, np.ndarray]:
    """scripts/llama_dump.cpp's records as the .npz holds them: numpy axis order (ne3, ne2, ne1, ne0)."""
    out: dict[str, np.ndarray] = {}
    with open(path, "rb") as f:
        while head := f.read(4):
            name = f.read(int(np.frombuffer(head, np.int32)[0])).decode()
            ne = np.frombuffer(f.read(32), np.int64)
            a = np.frombuffer(f.read(4 * int(np.prod(ne))), np.float32)
            out[name] = a if name == "logits" else a.reshape(tuple(int(n) for n in ne[::-1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump")
    ap.add_argument("--case", type=int, default=1)
    ap.add_argument("--ids")
    ap.add_argument("--decode", help="token ids decoded one at a time after the prompt (comma-separated): "
                                     "compare the last one's step")
    ap.add_argument("--decode-batch", type=int, default=1, help="decode ids a batch (llama_dump's DECODE_BATCH)")
    ap.add_argument("-m", "--model", help="the GGUF file (default: the default model)")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--all", action="store_true", help="print every tensor, not only a summary per layer")
    args = ap.parse_args()

    from workbench.engine import Engine
    from workbench.engine.engine import Placement

    ref = llama_lookup(np.load(args.dump) if args.dump.endswith(".npz") else read_llama_dump(args.dump))
    ids = ([int(t) for t in args.ids.split(",")] if args.ids else
           json.loads((REPO / "tests/data/gemma3_golden.json").read_text())["greedy"][args.case]["prompt_ids"])
    eng = Engine.load(args.model, placement=Placement(threads=args.threads))
    ours: dict[str, np.ndarray] = {}

    def tap(name, a):
        ours[name] = np.array(a, dtype=np.float32).reshape(a.shape[0], -1)

    sess = eng.new_session(512)
    if args.decode:
        sess.eval(ids)
        dec = [int(t) for t in args.decode.split(",")]
        step = args.decode_batch
        while len(dec) > step:
            sess.eval(dec[:step])
            dec = dec[step:]
        ids = dec
    eng.model.tap = tap
    sess.eval(ids)
    eng.model.tap = None
    for name, a in ours.items():
        r = ref.get(name)
        if r is None:
            continue
        if r.shape != a.shape:  # llama.cpp keeps only the output rows after the last attention
            a = a[-r.shape[0]:]
        if r.shape != a.shape:
            print(f"{name:18s} shape {a.shape} vs {r.shape}")
            continue
        d = np.abs(a - r)
        rel = d.max() / max(np.abs(r).max(), 1e-30)
        print(f"{name:18s} maxabs {d.max():.3e} rel {rel:.3e} ndiff {int((d > 0).sum()):7d}/{d.size}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compare our engine's intermediate tensors with a llama.cpp dump, layer by layer.

First write the dump with the reference venv (see ``scripts/dump_llama_tensors.py``)::

    /opt/refvenv/bin/python scripts/dump_llama_tensors.py --case 1 -o /tmp/llama_case1.npz
    PYTHONPATH=. python3 scripts/compare_llama_tensors.py /tmp/llama_case1.npz --case 1

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump")
    ap.add_argument("--case", type=int, default=1)
    ap.add_argument("--ids")
    ap.add_argument("--decode", type=int, default=-1, help="compare the decode step of this token")
    ap.add_argument("--all", action="store_true", help="print every tensor, not only a summary per layer")
    args = ap.parse_args()

    from workbench.engine import Engine

    ref = llama_lookup(np.load(args.dump))
    ids = ([int(t) for t in args.ids.split(",")] if args.ids else
           json.loads((REPO / "tests/data/gemma3_golden.json").read_text())["greedy"][args.case]["prompt_ids"])
    eng = Engine.load()
    ours: dict[str, np.ndarray] = {}

    def tap(name, a):
        ours[name] = np.array(a, dtype=np.float32).reshape(a.shape[0], -1)

    sess = eng.new_session(512)
    if args.decode >= 0:
        sess.eval(ids)
        ids = [args.decode]
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

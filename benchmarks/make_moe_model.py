"""Write a synthetic mixture-of-experts GGUF file of realistic shape, for speed comparisons.

    python3 benchmarks/make_moe_model.py [--out PATH] [--layers 8] [--experts 128] [--used 8]
    python3 benchmarks/make_moe_model.py --dense [--layers 6] [--type Q4_0]

``--dense``: a dense llama-style model of Q4_K matrices instead (n_embd 2048, FFN 5632, 16 query /
4 KV heads of 128, tied embeddings: 153 MB, all of it read per token), the shape of the Q4_K
matrices of a 1-3B Llama-family model at Q4_K_M. ``--type``: the weights' type (Q4_K by default;
Q4_0 as Google's QAT Gemma files, IQ4_NL, Q8_0, ...), in the file's name too.

Default: qwen3moe, n_embd 1024, 8 layers, 128 experts of which 8 are routed per token, expert FFN
768 (Qwen3-30B-A3B's expert width), 16 query / 4 KV heads of 64, Q4_K weights: about 1.2 GB, of
which a token reads about 90 MB. The weights are random (valid blocks), so the text is nonsense but
every kernel, the router and the expert products do the work of a real model. Written once into
$XDG_CACHE_HOME/numawb/bench-models/ (reused when it exists); prints the path.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def default_path(layers: int, experts: int, used: int, dense: bool = False, qtype: str = "Q4_K") -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    t = qtype.lower()
    name = f"llama-synth-L{layers}-2048x5632-{t}.gguf" if dense else \
        f"qwen3moe-synth-L{layers}-E{experts}x{used}-{t}.gguf"
    return os.path.join(base, "numawb", "bench-models", name)


def main() -> int:
    from gguf import GGMLQuantizationType as T

    from gguf_factory import TinySpec, write_tiny_model
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--dense", action="store_true", help="a dense Q4_K model instead (see above)")
    ap.add_argument("--type", default="Q4_K", help="the weight matrices' type (default Q4_K)")
    ap.add_argument("--out")
    args = ap.parse_args()
    qtype = T.__members__.get(args.type.upper())
    if qtype is None:
        ap.error(f"unknown type {args.type!r}; e.g. Q4_K, Q4_0, IQ4_NL, Q8_0")
    layers = args.layers or (6 if args.dense else 8)
    path = args.out or default_path(layers, args.experts, args.used, args.dense, qtype.name)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if args.dense:
            spec = TinySpec(arch="llama", qtype=qtype, n_embd=2048, n_head=16, n_head_kv=4, head_dim=128,
                            n_ff=5632, n_layer=layers, n_ctx=4096, tied=True, seed=2)
        else:
            spec = TinySpec(arch="qwen3moe", qtype=qtype, n_embd=1024, n_head=16, n_head_kv=4, head_dim=64,
                            n_ff=768, n_ff_exp=768, n_layer=layers, n_ctx=8192, n_expert=args.experts,
                            n_expert_used=args.used, seed=1)
        tmp = path + ".part"
        write_tiny_model(tmp, spec, reference=False)
        os.replace(tmp, path)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Write a synthetic mixture-of-experts GGUF file of realistic shape, for speed comparisons.

    python3 benchmarks/make_moe_model.py [--out PATH] [--layers 8] [--experts 128] [--used 8]

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


def default_path(layers: int, experts: int, used: int) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "numawb", "bench-models", f"qwen3moe-synth-L{layers}-E{experts}x{used}-q4_k.gguf")


def main() -> int:
    from gguf import GGMLQuantizationType as T

    from gguf_factory import TinySpec, write_tiny_model
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    path = args.out or default_path(args.layers, args.experts, args.used)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        spec = TinySpec(arch="qwen3moe", qtype=T.Q4_K, n_embd=1024, n_head=16, n_head_kv=4, head_dim=64,
                        n_ff=768, n_ff_exp=768, n_layer=args.layers, n_ctx=8192, n_expert=args.experts,
                        n_expert_used=args.used, seed=1)
        tmp = path + ".part"
        write_tiny_model(tmp, spec, reference=False)
        os.replace(tmp, path)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

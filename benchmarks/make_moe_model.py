"""Write a synthetic mixture-of-experts GGUF file of realistic shape, for speed comparisons.

    python3 benchmarks/make_moe_model.py [--out PATH] [--layers 8] [--experts 128] [--used 8] [--ffn 768]
    python3 benchmarks/make_moe_model.py --dense [--layers 6] [--type Q4_0]
    python3 benchmarks/make_moe_model.py --shape r1|v3-attn [--type Q4_K] [--layers N]

``--dense``: a dense llama-style model of Q4_K matrices instead (n_embd 2048, FFN 5632, 16 query /
4 KV heads of 128, tied embeddings: 153 MB, all of it read per token), the shape of the Q4_K
matrices of a 1-3B Llama-family model at Q4_K_M. ``--type``: the weights' type (Q4_K by default;
Q4_0 as Google's QAT Gemma files, IQ4_NL, Q8_0, ...), in the file's name too.

``--shape r1``: the seeds' DeepSeek-R1 depth and routing at narrow widths (deepseek2: 61 blocks of which
3 dense, 256 experts of FFN 256 in 8 groups of which 4 are used, 8 routed + 1 shared, sigmoid gating
with exp_probs_b, weights normalised and scaled by 2.5, q-LoRA 256, MLA with kv_lora 128 / rope 64
(R1's) / nope 64 / v 32, 8 heads, n_embd 256): every per-block and per-expert step of R1, ~1.7 GB.
``--shape v3-attn``: V3's attention widths (n_embd 2048, 16 heads, q_lora 1536, kv_lora 512, rope 64,
nope 128, v 128) over 4 blocks (1 dense) of 32 experts of FFN 512, 8 used + 1 shared: attention at
depth is the work.

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


def default_path(layers: int, experts: int, used: int, dense: bool = False, qtype: str = "Q4_K",
                 shape: str = "", ffn: int = 768) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    t = qtype.lower()
    if shape:
        # --layers N: the shape's first N blocks (its dense lead blocks first), e.g. a short R1
        deep = "" if layers == SHAPES[shape]["n_layer"] else f"-L{layers}"
        name = f"deepseek2-synth-{shape}{deep}-{t}.gguf"
    else:
        name = f"llama-synth-L{layers}-2048x5632-{t}.gguf" if dense else \
            f"qwen3moe-synth-L{layers}-E{experts}x{used}{'' if ffn == 768 else f'-F{ffn}'}-{t}.gguf"
    return os.path.join(base, "numawb", "bench-models", name)


# the seeds' shapes as TinySpec fields (deepseek2, llama.cpp's current MLA layout)
SHAPES = {
    "r1": dict(arch="deepseek2", n_embd=256, n_head=8, n_head_kv=1, head_dim=128, n_rot=64, head_dim_v_mla=32,
               q_lora_rank=256, kv_lora_rank=128, n_ff=512, n_ff_exp=256, n_layer=61, n_layer_dense_lead=3,
               n_ctx=65536, n_expert=256, n_expert_used=8, n_expert_shared=1, gating=2, probs_bias=True,
               n_groups=8, n_group_used=4, weights_norm=True, weights_scale=2.5, seed=3),
    "v3-attn": dict(arch="deepseek2", n_embd=2048, n_head=16, n_head_kv=1, head_dim=192, n_rot=64,
                    head_dim_v_mla=128, q_lora_rank=1536, kv_lora_rank=512, n_ff=2048, n_ff_exp=512, n_layer=4,
                    n_layer_dense_lead=1, n_ctx=65536, n_expert=32, n_expert_used=8, n_expert_shared=1,
                    gating=2, probs_bias=True, n_groups=4, n_group_used=2, weights_norm=True,
                    weights_scale=2.5, seed=4),
}


def main() -> int:
    from gguf import GGMLQuantizationType as T

    from gguf_factory import TinySpec, write_tiny_model
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=768, help="an expert's FFN width (qwen3moe; default 768)")
    ap.add_argument("--dense", action="store_true", help="a dense Q4_K model instead (see above)")
    ap.add_argument("--type", default="Q4_K", help="the weight matrices' type (default Q4_K)")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="a deepseek2 file of the seeds' shape (see above)")
    ap.add_argument("--out")
    args = ap.parse_args()
    qtype = T.__members__.get(args.type.upper())
    if qtype is None:
        ap.error(f"unknown type {args.type!r}; e.g. Q4_K, Q4_0, IQ4_NL, Q8_0")
    layers = args.layers or (SHAPES[args.shape]["n_layer"] if args.shape else 6 if args.dense else 8)
    path = args.out or default_path(layers, args.experts, args.used, args.dense, qtype.name, args.shape or "",
                                    args.ffn)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if args.shape:
            spec = TinySpec(qtype=qtype, **dict(SHAPES[args.shape], n_layer=layers))
        elif args.dense:
            spec = TinySpec(arch="llama", qtype=qtype, n_embd=2048, n_head=16, n_head_kv=4, head_dim=128,
                            n_ff=5632, n_layer=layers, n_ctx=4096, tied=True, seed=2)
        else:
            spec = TinySpec(arch="qwen3moe", qtype=qtype, n_embd=1024, n_head=16, n_head_kv=4, head_dim=64,
                            n_ff=args.ffn, n_ff_exp=args.ffn, n_layer=layers, n_ctx=8192, n_expert=args.experts,
                            n_expert_used=args.used, seed=1)
        tmp = path + ".part"
        write_tiny_model(tmp, spec, reference=False)
        os.replace(tmp, path)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

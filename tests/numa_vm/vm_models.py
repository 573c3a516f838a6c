"""The small files the in-guest engine proofs decode (a helper, not a test module): a dense GQA
llama (Q4_K) and a deepseek2 with MLA (Q8_0), as tests/engine/test_token_owners.py builds them.

    python3 tests/numa_vm/vm_models.py DIR     # writes DIR/llama-tiny-q4_k.gguf, DIR/deepseek2-tiny-q8_0.gguf

`.ci/numa_vm.sh` and `scripts/numa_vm_proof.sh` write them on the host (the emulated guest would
take long to quantize them) and warm the Numba cache with them before the guest boots.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("llama-tiny-q4_k.gguf", "deepseek2-tiny-q8_0.gguf")


def write(folder: str) -> list[str]:
    sys.path.insert(0, os.path.dirname(HERE))   # tests/, for gguf_factory
    from gguf import GGMLQuantizationType as T
    from gguf_factory import TinySpec, write_tiny_model
    specs = {
        FILES[0]: TinySpec(seed=9, arch="llama", qtype=T.Q4_K, n_layer=2),
        FILES[1]: TinySpec(seed=9, arch="deepseek2", qtype=T.Q8_0, n_layer=3, n_head=4, head_dim=64, n_ff=256,
                           n_ff_exp=64, n_expert=8, n_expert_used=2, q_lora_rank=64, gating=2, probs_bias=True,
                           n_groups=4, n_group_used=2, weights_norm=True, weights_scale=2.5),
    }
    os.makedirs(folder, exist_ok=True)
    out = []
    for name, spec in specs.items():
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            write_tiny_model(path + ".part", spec, reference=False)
            os.replace(path + ".part", path)
        out.append(path)
    return out


if __name__ == "__main__":
    print("\n".join(write(sys.argv[1])))

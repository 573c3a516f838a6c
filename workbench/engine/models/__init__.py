"""One module per architecture; `ARCHITECTURES` maps GGUF `general.architecture` to its class."""

from __future__ import annotations

from typing import Container

from .deepseek2 import DeepSeek2
from .gemma3 import Gemma3
from .llama import Llama
from .llama_moe import LlamaMoE
from .qwen2 import Qwen2
from .qwen3 import Qwen3
from .qwen3moe import Qwen3MoE

ARCHITECTURES = {cls.arch: cls for cls in (DeepSeek2, Gemma3, Llama, Qwen2, Qwen3, Qwen3MoE)}


def model_class(arch: str, tensor_names: Container[str]) -> type:
    """The class for a file: its architecture's, or the variant its tensors show (a `llama` file
    with expert tensors is Mixtral-style)."""
    if arch == "llama" and "blk.0.ffn_gate_inp.weight" in tensor_names:
        return LlamaMoE
    return ARCHITECTURES[arch]

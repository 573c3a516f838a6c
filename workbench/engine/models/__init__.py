"""One module per architecture; `ARCHITECTURES` maps GGUF `general.architecture` to its class."""

from .gemma3 import Gemma3
from .llama import Llama
from .qwen2 import Qwen2
from .qwen3 import Qwen3

ARCHITECTURES = {cls.arch: cls for cls in (Gemma3, Llama, Qwen2, Qwen3)}

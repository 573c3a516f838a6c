"""numawb: a terminal workbench for LLM inference on NUMA CPU servers."""

__version__ = "0.1.0"

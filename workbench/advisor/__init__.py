"""The advisor: measure this machine's memory, cost a model from its GGUF header, predict every
placement and recommend one (``numawb probe``, ``numawb advise``).

Public API: ``advise(path, topology, ctx) -> Advice`` (for the command line and the app),
``model_cost(path)``, ``machine_profile(topology)``, ``probe(topology)``.
Importing this package compiles nothing: the probe's and the engine's Numba code load on use.
"""
from .advise import Advice, advise, resolve_topology
from .cost import HeaderError, ModelCost, model_cost, read_header
from .predict import Candidate, EngineModel, PlanPool, plan_memory, predict, recommend
from .probe import MemoryProfile, machine_profile, probe

__all__ = ["Advice", "Candidate", "EngineModel", "HeaderError", "MemoryProfile", "ModelCost", "PlanPool",
           "advise", "machine_profile", "model_cost", "plan_memory", "predict", "probe", "read_header",
           "recommend", "resolve_topology"]

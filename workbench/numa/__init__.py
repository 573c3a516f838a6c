"""NUMA layer of numawb: topology, placed memory, pinned workers, placement modes, proof.

Imports only numpy, psutil, ctypes, the standard library and ``workbench.errors`` (its
ModeError and BudgetError are user errors), so it runs in a small VM and on any box (no Numba,
no Textual).
"""
from .budget import BudgetError, check_need, free_per_node
from .layout import (KVLayout, ProgressEvent, WeightLayout, execute_weights, place_kv, place_weights, read_into,
                     switch_weights)
from .plan import KVRequest, PlacementPlan, TensorSpec, make_plan, plan_for_pool, row_split
from .memory import PlacedBuffer, Policy, alloc, first_touch, migrate
from .proof import BufferProof, format_proof, process_numastat, prove
from .system import disable_numa_balancing, drop_page_cache, numa_balancing
from .topology import Topology, fixture_names, fixture_path, load_topology
from .views import format_numastat, format_topo, topo_json
from .workers import WorkerInfo, WorkerPool, plan_cpus

__all__ = [
    "BudgetError", "BufferProof", "KVLayout", "PlacedBuffer", "Policy", "ProgressEvent", "TensorSpec",
    "Topology", "WeightLayout", "WorkerInfo", "WorkerPool", "alloc", "check_need", "execute_weights", "KVRequest", "make_plan", "PlacementPlan", "plan_for_pool",
    "disable_numa_balancing", "drop_page_cache", "first_touch", "fixture_names", "fixture_path",
    "format_numastat", "format_proof", "format_topo", "free_per_node", "load_topology",
    "migrate", "numa_balancing", "place_kv", "place_weights", "plan_cpus",
    "process_numastat", "prove", "read_into", "row_split", "switch_weights", "topo_json",
]

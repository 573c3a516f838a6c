"""Fixtures the service tests share: the compiled-kernel set kept as it was, and a local 2-node
Ray cluster (127.0.0.1) for the cluster tests."""
from __future__ import annotations

import logging

import pytest

#: one Ray node: a CPU and a small object store (hidden states per token are a few KB)
RAY_NODE = {"num_cpus": 1, "object_store_memory": 100 << 20}


@pytest.fixture(scope="module", autouse=True)
def _kernel_set_restored():
    """Models loaded here narrow the process's compiled kernel set (kernels.precompile); later
    test modules that build crews for every type (test_crew.py) expect it as it was."""
    from workbench.engine import kernels
    saved = kernels._active
    yield
    kernels._active = saved


@pytest.fixture(scope="module")
def ray_node() -> dict:
    """Arguments of one more node for `cluster.add_node`."""
    return dict(RAY_NODE)


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 nodes, started once per module (Ray must be installed: the modules
    that use it skip without it)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
    from ray.cluster_utils import Cluster
    c = Cluster(initialize_head=True, head_node_args=dict(RAY_NODE, include_dashboard=False))
    c.add_node(**RAY_NODE)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level=logging.ERROR, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()

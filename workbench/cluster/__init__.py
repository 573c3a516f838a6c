"""A model split over several hosts on Ray: one pipeline stage (a contiguous layer range) per Ray
node, each run by numawb's engine on that host with its own NUMA placement; only the hidden
state crosses hosts.

Ray is optional (``pip install -e '.[cluster]'``): this package imports it only when a cluster
is used, and `require_ray` turns its absence into one line saying how to install it.
"""
from __future__ import annotations

from ..errors import UserError

INSTALL_HINT = "--ray needs Ray: pip install -e '.[cluster]' (or pip install 'ray>=2.40')"


class ClusterError(UserError):
    """A cluster request that cannot go on (a host refused, stopped or timed out): one line."""


def ray_available() -> bool:
    """Whether Ray can be imported (without importing it)."""
    import importlib.util
    return importlib.util.find_spec("ray") is not None


def require_ray():
    """The `ray` module, or a one-line ClusterError saying how to install it."""
    if not ray_available():
        raise ClusterError(INSTALL_HINT)
    import ray
    return ray


__all__ = ["ClusterError", "INSTALL_HINT", "ray_available", "require_ray"]

"""Fixtures of the engine's tests."""
from __future__ import annotations

import pytest

from kernel_emulation import SIMD_PATHS
from workbench.engine import kernels as K


@pytest.fixture(params=SIMD_PATHS)
def path(request):
    prev = K.kernel_path()
    K.set_kernel_path(request.param)
    yield request.param
    K.set_kernel_path(prev)

"""Former name of ``intrinsics`` (the LLVM-level primitives), kept for engine modules that import it."""
from .intrinsics import *  # noqa: F401,F403
from .intrinsics import _fn  # noqa: F401

"""A second process that compiles part of a first start's kernels into the disk cache.

Numba compiles on one core and holds the GIL while it does, so a first start's tens of seconds
of kernel compilation leave every other core idle. When `precompile` finds that a step really
compiled (not a cache load), it hands every other remaining step to this helper process, which
compiles them into the same disk cache meanwhile; the engine then loads them from there in
milliseconds; then it compiles the engine's own helpers a first prompt needs (`warm_ops`),
still in the background. Without a disk cache, on one core, or with NUMAWB_PARALLEL_COMPILE=0 nothing is
started and the engine compiles everything itself, as before.

    python -m workbench.engine.kernels.compile_helper PATH TYPE:STEP[,TYPE:STEP...] [WARM]

WARM: what the model's first prompt uses, for `warm_ops.signatures` ("gelu" or "silu", plus
",experts" for a mixture of experts; empty: everything).
"""
from __future__ import annotations

import os
import subprocess
import sys

from numba.core import caching

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def usable(probe) -> bool:
    """Whether a helper could help: several CPUs, not turned off, and `probe` (a kernel dispatcher
    that has compiled) writes to a disk cache the helper shares."""
    if os.environ.get("NUMAWB_PARALLEL_COMPILE", "1") == "0" or (os.cpu_count() or 1) < 2:
        return False
    return not isinstance(getattr(probe, "_cache", None), caching.NullCache)


def start(path: str, steps: list[tuple[int, str]], warm: str = "") -> subprocess.Popen | None:
    """Start compiling `steps` ((ggml type, step name)) of kernel path `path` in a helper process,
    then the engine helpers `warm` names (see the module's docstring)."""
    env = dict(os.environ, NUMAWB_KERNEL_PATH=path, NUMAWB_PARALLEL_COMPILE="0",
               PYTHONPATH=os.pathsep.join(p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")) if p))
    spec = ",".join(f"{t}:{s}" for t, s in steps)
    try:
        return subprocess.Popen([sys.executable, "-m", "workbench.engine.kernels.compile_helper", path, spec, warm],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


def main(argv: list[str]) -> int:
    from workbench.engine import kernels
    path, spec, warm = (argv + [""])[:3]
    kernels.set_kernel_path(path)
    for item in spec.split(","):
        t, step = item.split(":")
        kernels._precompile_step(int(t), step)
    # the kernels are in the cache: the engine stops waiting here (`wait`), while this process
    # goes on with the engine's own helpers that a first prompt compiles
    print("kernels done", flush=True)
    from workbench.engine import warm_ops
    warm_ops.warm(warm)
    return 0


def wait(helper: subprocess.Popen) -> None:
    """Until the helper has compiled its kernels (or ended); it may go on warming the engine's
    helpers in the background (`_running` keeps it referenced until it ends)."""
    if helper.stdout is not None:
        helper.stdout.readline()
        helper.stdout.close()
    if helper.poll() is None:
        _running.append(helper)
    _running[:] = [p for p in _running if p.poll() is None]


_running: list[subprocess.Popen] = []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

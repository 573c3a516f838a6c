"""The compiled-kernel disk cache (kernels/jitcache.py): what its key covers and where it lives.

The end-to-end tests run fresh interpreters on a private copy of the ``workbench`` package (so the
real tree and its cache are never touched) and read Numba's own per-dispatcher cache statistics.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.engine import kernels as K
from workbench.engine.kernels import jitcache

ROOT = Path(__file__).resolve().parent.parent
SIMD = [p for p in K.available_paths() if p != "portable"]

#: run in the copy: one F32 product on the first SIMD path (or portable), then report whether the
#: kernel came from the disk cache and where that cache is
PROBE = r"""
import json, sys
import numpy as np
from workbench.engine import kernels as K
path = sys.argv[1]
K.set_kernel_path(path)
w = np.arange(64, dtype=np.float32).reshape(2, 32).view(np.uint8)
out = np.zeros(2, np.float32)
K.matvec(K.F32, w, K.prepare(K.F32, np.ones(32, np.float32)), out, 0, 2)
fn = K.matvec_kernels()[K.F32]
print(json.dumps({"out": out.tolist(), "hits": sum(fn.stats.cache_hits.values()),
                  "misses": sum(fn.stats.cache_misses.values()),
                  "cache": getattr(fn._cache, "cache_path", None), "file": K.__file__}))
"""


def _copy_package(dst: Path) -> Path:
    shutil.copytree(ROOT / "workbench", dst / "workbench",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    return dst


def _probe(cwd: Path, env: dict | None = None, path: str | None = None) -> tuple[dict, str]:
    e = dict(os.environ)
    e.pop("NUMBA_CACHE_DIR", None)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", PROBE, path or (SIMD[0] if SIMD else "portable")],
                       cwd=cwd, env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.mark.skipif(not SIMD, reason="no SIMD kernel path on this CPU")
def test_simd_kernel_depends_on_its_helper_modules():
    """A prompt kernel built in k_quants reaches the intrinsics, the shared block helpers and the
    repacked kernels it calls: all of them are in its cache key."""
    mm = K.x86.tables(SIMD[0])[1][K.Q4_K]
    names = {Path(f).name for f in jitcache.dependency_files(mm.py_func)}
    assert {"k_quants.py", "repack.py", "blocks.py", "intrinsics.py"} <= names
    assert not any("numpy" in f or "numba" in f for f in jitcache.dependency_files(mm.py_func))


def test_editing_a_helper_module_invalidates_the_cached_kernel(tmp_path):
    """Compile once (miss), start again (hit), edit only intrinsics.py (not the kernel's own file):
    the next start must recompile instead of loading the stale machine code."""
    _copy_package(tmp_path)
    first, _ = _probe(tmp_path)
    assert first["file"].startswith(str(tmp_path)) and first["misses"] == 1
    second, _ = _probe(tmp_path)
    assert second["hits"] == 1 and second["misses"] == 0
    helper = tmp_path / "workbench" / "engine" / "kernels" / "intrinsics.py"
    helper.write_text(helper.read_text() + "\n# an edit\n")
    third, _ = _probe(tmp_path)
    assert third["misses"] == 1 and third["hits"] == 0
    assert third["out"] == first["out"]

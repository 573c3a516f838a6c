"""Layering, proven in a fresh interpreter: the engine imports nothing from Textual, the NUMA
layer neither Numba nor Textual, and the front door's light modules stay light."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import importlib, json, pkgutil, sys
names = sys.argv[1:]
for name in names:
    mod = importlib.import_module(name)
    if hasattr(mod, "__path__"):  # a package: every submodule too
        for info in pkgutil.walk_packages(mod.__path__, name + "."):
            importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def modules_after_import(*names: str) -> list[str]:
    """Every module loaded by importing ``names`` (packages with all their submodules) in a
    fresh interpreter."""
    r = subprocess.run([sys.executable, "-c", PROBE, *names], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def from_package(mods: list[str], top: str) -> list[str]:
    return [m for m in mods if m == top or m.startswith(top + ".")]


def test_engine_imports_nothing_from_textual():
    mods = modules_after_import("workbench.engine")
    assert "workbench.engine.kernels" in mods  # the walk did reach the submodules
    assert from_package(mods, "textual") == [] and from_package(mods, "rich") == []


def test_numa_imports_neither_numba_nor_textual():
    mods = modules_after_import("workbench.numa")
    assert "workbench.numa.workers" in mods and "workbench.numa.layout" in mods
    assert from_package(mods, "numba") == []
    assert from_package(mods, "textual") == []
    assert from_package(mods, "workbench.engine") == []


@pytest.mark.parametrize("module", ["workbench.errors", "workbench.cli", "workbench.telemetry",
                                    "workbench.replay"])
def test_front_door_modules_are_light(module):
    """The command line (and what it shares with the app) loads without Numba or Textual: the
    compiled kernels and the UI are imported only by the commands that use them."""
    mods = modules_after_import(module)
    assert from_package(mods, "numba") == [] and from_package(mods, "textual") == []
    assert from_package(mods, "workbench.engine") == []


def test_the_app_never_imports_the_command_line():
    """One way through the code: the command line starts the app, never the reverse."""
    mods = modules_after_import("workbench.app", "workbench.record", "workbench.replay", "workbench.screens")
    assert "workbench.app" in mods and "workbench.cli" not in mods


def test_no_import_cycles_between_modules():
    """Module-level imports form no cycle (a package's own __init__ re-exporting its submodules
    aside): each layer can be read and loaded bottom-up."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "workbench"
    mods: dict[str, Path] = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)] if node.level else []
                tgt = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
                subs = {f"{tgt}.{a.name}" for a in node.names} & set(mods)
                edges[m] |= subs or ({tgt} & set(mods)) - {m}
            elif isinstance(node, ast.Import):
                edges[m] |= {a.name for a in node.names} & set(mods)
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for n in edges[m]:
            if state.get(n) == 1:
                cycle.extend(path[path.index(n):] + [n])
                return True
            if state.get(n) is None and visit(n, path + [n]):
                return True
        state[m] = 2
        return False

    for m in sorted(mods):
        if state.get(m) is None and visit(m, [m]):
            break
    assert not cycle, " -> ".join(cycle)

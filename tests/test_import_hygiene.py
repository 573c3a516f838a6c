"""Layering: every import statement (inside functions too) read with `ast` against
docs/architecture.md's layer table (nothing goes up a layer, no cycle between modules), and in a
fresh interpreter: the engine imports nothing from Textual, the NUMA layer neither Numba nor
Textual, and the front door's light modules stay light."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.parametrize("module", ["workbench.errors", "workbench.cli", "workbench.options",
                                    "workbench.telemetry", "workbench.replay"])
def test_front_door_modules_are_light(module):
    """The command line (and what it shares with the app and the services, the options included)
    loads without Numba or Textual: the compiled kernels and the UI are imported only by the
    commands that use them."""
    mods = modules_after_import(module)
    assert from_package(mods, "numba") == [] and from_package(mods, "textual") == []
    assert from_package(mods, "workbench.engine") == []


def test_the_app_never_imports_the_command_line():
    """One way through the code: the command line starts the app, never the reverse."""
    mods = modules_after_import("workbench.app", "workbench.record", "workbench.replay", "workbench.screens")
    assert "workbench.app" in mods and "workbench.cli" not in mods


ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def workbench_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under ``root`` by dotted name (a package by its own name)."""
    mods: dict[str, Path] = {}
    for p in sorted((root / "workbench").rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def import_edges(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Per module, the workbench modules it imports and the line of the first such import: every
    ``import`` and ``from ... import`` statement, at module level or inside a function, a class or
    an ``if TYPE_CHECKING`` block. ``from pkg import name`` is an edge to the submodule
    ``pkg.name`` when there is one, else to ``pkg``."""
    edges: dict[str, dict[str, int]] = {m: {} for m in mods}

    def owner(name: str) -> str | None:  # the longest workbench module a dotted name starts with
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in mods:
                return ".".join(parts[:k])
        return None

    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            targets: set[str | None] = set()
            if isinstance(node, ast.Import):
                targets = {owner(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    tgt = ".".join(base + ([node.module] if node.module else []))
                else:
                    tgt = node.module or ""
                for a in node.names:
                    sub = f"{tgt}.{a.name}"
                    targets.add(sub if sub in mods else owner(tgt))
            for t in targets - {None, m}:
                if t not in found:
                    found.add(t)
                    edges[m][t] = node.lineno
        edges[m] = dict(sorted(edges[m].items(), key=lambda kv: kv[1]))
    return edges


def find_cycle(edges: dict[str, dict[str, int]], skip: set[tuple[str, str]] = frozenset()) -> list[str]:
    """One cycle as the modules along it (the first one back again), or []."""
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str]:
        state[m] = 1
        for n in edges[m]:
            if (m, n) in skip:
                continue
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if state.get(n) is None:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = 2
        return []

    for m in sorted(edges):
        if state.get(m) is None:
            found = visit(m, [m])
            if found:
                return found
    return []


def describe(cycle: list[str], edges: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def layer_table() -> list[tuple[str, list[str], set[str]]]:
    """docs/architecture.md's layer table, top row first: (layer, module paths, the layers its
    "may import" column names before its ';')."""
    rows = []
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not line.lstrip().startswith("|") or set(cells[0]) <= set("-: "):
            continue
        if cells[0] == "layer":
            continue
        paths = re.findall(r"`([^`]+)`", cells[1])
        names = {n.strip().lower() for n in cells[2].split(";")[0].split(",")} - {"nothing", ""}
        rows.append((cells[0].lower(), paths, names))
        if rows[-1][0] == "base":  # the bottom row ends the table
            break
    return rows


def module_layers(mods: dict[str, Path], rows: list[tuple[str, list[str], set[str]]]) -> dict[str, int]:
    """Each module's row in the table (0: the top): the row naming its file or the closest folder
    above it."""
    where: dict[str, int] = {}
    for m, p in mods.items():
        rel = p.relative_to(ROOT).as_posix()
        best, depth = None, -1
        for i, (_, paths, _) in enumerate(rows):
            for path in paths:
                hit = rel == path if not path.endswith("/") else rel.startswith(path)
                if hit and len(path) > depth:
                    best, depth = i, len(path)
        if best is not None:
            where[m] = best
    return where


def test_the_layer_table_says_what_each_layer_may_import():
    """Each row's "may import" names exactly the rows below it, so the table is the rule."""
    rows = layer_table()
    assert [r[0] for r in rows][:1] == ["front door"] and rows[-1][0] == "base", [r[0] for r in rows]
    for i, (name, _, may) in enumerate(rows):
        below = {r[0] for r in rows[i + 1:]}
        assert may == below, f"docs/architecture.md: {name!r} may import {sorted(may)}, the rows below are {sorted(below)}"


def test_every_module_is_on_a_layer():
    mods = workbench_modules()
    where = module_layers(mods, layer_table())
    missing = sorted(set(mods) - set(where))
    assert not missing, f"on no layer of docs/architecture.md's table: {missing}"


def test_no_import_goes_up_the_layer_table():
    """Every import statement (inside functions too) goes to the importer's own layer or one
    below it: the services never reach into the command line or the app, the engine never into
    the services, ..."""
    mods = workbench_modules()
    rows = layer_table()
    where = module_layers(mods, rows)
    edges = import_edges(mods)
    upward = [f"{m}:{line} imports {t} ({rows[where[m]][0]} -> {rows[where[t]][0]})"
              for m in sorted(edges) for t, line in edges[m].items()
              if m in where and t in where and where[t] < where[m]]
    assert not upward, "\n".join(upward)


def test_no_import_cycles_between_modules():
    """No cycle among workbench's modules, counting imports inside functions (a lazy import closes
    a cycle as surely as one at the top): each layer can be read and loaded bottom-up."""
    edges = import_edges(workbench_modules())
    cycle = find_cycle(edges)
    assert not cycle, describe(cycle, edges)


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    """The reader counts a function's import: the cycles of issue 42 (cli <-> cluster.cli through
    a lazy import, engine <-> generation) are found when they come back."""
    pkg = tmp_path / "workbench"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("def f():\n    from .cluster.cli import run_ray\n")
    (pkg / "cluster").mkdir()
    (pkg / "cluster" / "__init__.py").write_text("")
    (pkg / "cluster" / "cli.py").write_text("def g():\n    from ..cli import build_placement\n")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "engine.py").write_text("def gen():\n    from .generation import Generation\n")
    (pkg / "engine" / "generation.py").write_text("from .engine import DoneEvent\n")
    edges = import_edges(workbench_modules(tmp_path))
    assert edges["workbench.cli"] == {"workbench.cluster.cli": 2}
    assert edges["workbench.engine.generation"] == {"workbench.engine.engine": 1}
    first = find_cycle(edges)
    assert first[0] == first[-1] and set(first) in ({"workbench.cli", "workbench.cluster.cli"},
                                                    {"workbench.engine.engine", "workbench.engine.generation"})
    rest = find_cycle(edges, {(first[0], first[1])})
    assert rest and set(rest) != set(first)


def test_the_cycle_check_sees_a_package_and_its_own_submodule(tmp_path):
    """A package's __init__ that imports a submodule which imports the package back (in a
    function, by absolute name) is a cycle too: the kernels' compile helper was one."""
    kernels = tmp_path / "workbench" / "engine" / "kernels"
    kernels.mkdir(parents=True)
    for init in (tmp_path / "workbench", tmp_path / "workbench" / "engine"):
        (init / "__init__.py").write_text("")
    (kernels / "__init__.py").write_text("from . import compile_helper as _helper\n")
    (kernels / "compile_helper.py").write_text("def main():\n    from workbench.engine import kernels\n")
    edges = import_edges(workbench_modules(tmp_path))
    assert edges["workbench.engine.kernels.compile_helper"] == {"workbench.engine.kernels": 2}
    assert set(find_cycle(edges)) == {"workbench.engine.kernels", "workbench.engine.kernels.compile_helper"}

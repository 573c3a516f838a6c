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

import numpy as np
import pytest

from workbench.engine import kernels as K
from workbench.engine.kernels import jitcache

ROOT = Path(__file__).resolve().parents[2]
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
    """A prompt kernel built in k_quants reaches the intrinsics, the IR helpers their code
    generators use, the shared block helpers and the repacked kernels it calls: all of them are in
    its cache key."""
    mm = K.x86.tables(SIMD[0])[1][K.Q4_K]
    names = {Path(f).name for f in jitcache.dependency_files(mm.py_func)}
    assert {"k_quants.py", "repack.py", "blocks.py", "dots.py", "llvm_ir.py"} <= names
    assert not any("numpy" in f or "numba" in f for f in jitcache.dependency_files(mm.py_func))


def test_editing_a_helper_module_invalidates_the_cached_kernel(tmp_path):
    """Compile once (miss), start again (hit), edit only llvm_ir.py (not the kernel's own file, nor
    an intrinsic's: the IR helpers the intrinsics' code generators call): the next start must
    recompile instead of loading the stale machine code."""
    _copy_package(tmp_path)
    first, _ = _probe(tmp_path)
    assert first["file"].startswith(str(tmp_path)) and first["misses"] == 1
    second, _ = _probe(tmp_path)
    assert second["hits"] == 1 and second["misses"] == 0
    helper = tmp_path / "workbench" / "engine" / "kernels" / "llvm_ir.py"
    helper.write_text(helper.read_text() + "\n# an edit\n")
    third, _ = _probe(tmp_path)
    assert third["misses"] == 1 and third["hits"] == 0
    assert third["out"] == first["out"]


# ----------------------------------------------------------------------------- read-only installs
def _read_only_copy(tmp_path: Path) -> Path:
    """A copy of the package nobody can write into.

    chmod a-w stops an ordinary account; root ignores permissions, so every package folder also gets
    a regular *file* named ``__pycache__``: creating the cache folder then fails for root too
    (FileExistsError / NotADirectoryError), as Numba's in-tree cache would on a read-only mount."""
    dst = _copy_package(tmp_path / "install")
    for d in [p for p in (dst / "workbench").rglob("*") if p.is_dir()] + [dst / "workbench"]:
        (d / "__pycache__").write_text("not a folder")
    for p in sorted((dst / "workbench").rglob("*"), reverse=True):
        p.chmod(0o444 if p.is_file() else 0o555)
    return dst


def _unwritable(tmp_path: Path, name: str) -> str:
    """A path no account can create: it lies under a regular file (works for root as well)."""
    blocker = tmp_path / f"{name}-is-a-file"
    blocker.write_text("")
    return str(blocker / name)


def _numawb_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("numawb:")]


@pytest.fixture
def read_only_install(tmp_path):
    dst = _read_only_copy(tmp_path)
    yield dst
    for p in [dst] + list(dst.rglob("*")):
        if p.is_dir():
            p.chmod(0o755)


def test_read_only_install_caches_in_xdg_cache_home(tmp_path, read_only_install):
    """Package and HOME unwritable, $XDG_CACHE_HOME writable: the kernels run, are cached under
    $XDG_CACHE_HOME/numawb, one line says so, and the next start loads them from there."""
    xdg = tmp_path / "xdg"
    env = {"HOME": _unwritable(tmp_path, "home"), "XDG_CACHE_HOME": str(xdg)}
    first, err = _probe(read_only_install, env)
    assert first["out"] == [496.0, 1520.0]
    assert first["cache"].startswith(str(xdg / "numawb" / "numba"))
    lines = _numawb_lines(err)
    assert len(lines) == 1 and str(xdg / "numawb" / "numba") in lines[0], err
    assert "Traceback" not in err
    second, _ = _probe(read_only_install, env)
    assert second["hits"] == 1 and second["misses"] == 0


def test_read_only_install_without_home_uses_a_temporary_folder(tmp_path, read_only_install):
    env = {"HOME": _unwritable(tmp_path, "home"), "XDG_CACHE_HOME": _unwritable(tmp_path, "xdg"),
           "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    res, err = _probe(read_only_install, env)
    assert res["out"] == [496.0, 1520.0]
    assert res["cache"].startswith(str(tmp_path / "tmp" / f"numawb-{os.getuid()}"))
    assert len(_numawb_lines(err)) == 1 and "temporary" in _numawb_lines(err)[0], err


def test_nothing_writable_compiles_without_a_disk_cache(tmp_path, read_only_install):
    """No folder at all can be written (the temporary directory is pointed under a regular file
    through tempfile.tempdir, since root could write any real one): still works, says so once."""
    env = {"HOME": _unwritable(tmp_path, "home"), "XDG_CACHE_HOME": _unwritable(tmp_path, "xdg")}
    e = dict(os.environ)
    e.pop("NUMBA_CACHE_DIR", None)
    e.update(env)
    code = f"import tempfile; tempfile.tempdir = {_unwritable(tmp_path, 'tmp')!r}\n" + PROBE
    r = subprocess.run([sys.executable, "-c", code, SIMD[0] if SIMD else "portable"], cwd=read_only_install,
                       env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["out"] == [496.0, 1520.0] and res["cache"] is None and res["hits"] == 0
    lines = _numawb_lines(r.stderr)
    assert len(lines) == 1 and "compiled at every start" in lines[0], r.stderr


# ----------------------------------------------------------------------------- precompile
@pytest.fixture(autouse=True)
def _keep_active_types():
    """precompile narrows what compiled callers link (process-wide): restore it for other tests."""
    saved = K._active
    yield
    K._active = saved


def test_precompile_reports_progress_and_compiles_what_calls_use():
    """precompile compiles exactly the specialisations the engine's calls use: a real call afterwards
    adds no new signature.  Progress counts finished tasks from 0 up to the total, one named
    task at a time, then "done"."""
    events = []
    types = [K.Q8_0, K.Q4_K, K.F16]
    K.precompile(types, lambda d, n, name: events.append((d, n, name)), dequantize=[K.Q8_0])
    total = len(K.plan(types, [K.Q8_0], []))
    done = [e[0] for e in events]
    assert done[0] == 0 and done == sorted(done) and done[-1] == total and max(done[:-1]) < total
    assert {e[1] for e in events} == {total}
    assert events[0][2] == "Q8_0 prepare" and events[-1][2] == "done"
    assert {"Q8_0 dequantize", "Q4_K matmat"} <= {e[2] for e in events} | set(map(K._task_label, K.last_split["helper"]))
    assert set(types) <= K.active_types()
    rng = np.random.default_rng(0)
    for t in types:
        mv, mm = K._MATVEC[t], K._MATMAT[t]
        n_mv, n_mm = len(mv.signatures), len(mm.signatures)
        assert n_mv >= 1 and n_mm >= 1
        rows, k = 16, 512
        w = rng.integers(0, 256, (rows, K.row_bytes(t, k)), dtype=np.uint8)
        if t == K.F16:
            w = rng.standard_normal((rows, k)).astype(np.float16).view(np.uint8)
        x = rng.standard_normal((5, k)).astype(np.float32)
        K.matvec(t, w, K.prepare(t, x[0]), np.empty(rows, np.float32), 0, rows)
        K.matmat(t, w, K.prepare(t, x), np.empty((5, rows), np.float32), 0, rows)
        assert (len(mv.signatures), len(mm.signatures)) == (n_mv, n_mm), K.SUPPORTED_TYPES[t]


def test_matvec_kernels_links_only_the_prepared_types():
    K.precompile([K.Q8_0], dequantize=[])
    table = K.matvec_kernels([K.Q8_0])
    assert table[K.Q8_0] is K._MATVEC[K.Q8_0]
    other = table[K.Q6_K]
    assert other is not K._MATVEC[K.Q6_K]
    w = np.zeros((8, K.row_bytes(K.Q6_K, 256)), np.uint8)
    with pytest.raises(RuntimeError, match="no kernel was prepared"):
        other(w, K.prepare(K.Q6_K, np.zeros(256, np.float32)), np.zeros(8, np.float32), 0, 8)
    # every file type, plus the engine's own layouts where the path has them (Q4_K_x8 and the plain
    # ids of 3-D non-expert weights on SIMD paths, Q5_0_x2, Q8_0_x2, Q4_0_x8 and IQ4_NL_x8 on
    # AVX-512 VNNI)
    layouts = {K.Q4_K_X8} | set(K.PLAIN_TYPES.values()) if K.kernel_path() != "portable" else set()
    layouts |= {K.Q5_0_X2, K.Q8_0_X2, K.Q4_0_X8, K.IQ4_NL_X8} if K.kernel_path() == "avx512-vnni" else set()
    assert set(K.matvec_kernels(None)) == set(K.SUPPORTED_TYPES) | layouts


def test_precompile_refuses_an_unknown_type():
    with pytest.raises(ValueError, match="unsupported ggml type"):
        K.precompile([99])


HELPER_PROBE = r"""
import glob, json, os, sys, time
from workbench.engine import kernels as K
from workbench.engine.kernels import compile_helper
K.set_kernel_path(sys.argv[1])
K.COMPILED_SECONDS = 0.0  # the first task counts as a compile however fast this machine is
boards = []
real_create = compile_helper.Board.create
compile_helper.Board.create = lambda tasks: boards.append(real_create(tasks)) or boards[-1]
real_run, runs = K.run_task, []

def run_task(name):
    # once the helper is started, the engine takes its next task only after the helper has
    # taken one (however slow the helper's start): both processes then have work to show
    runs.append(name)
    t0 = time.time()
    while boards and len(runs) > 1 and time.time() - t0 < 300 \
            and len(glob.glob(os.path.join(boards[0].folder, "claim-*"))) <= len(runs):
        time.sleep(0.01)
    real_run(name)

K.run_task = run_task
K.precompile([K.Q8_0, K.F16], dequantize=[K.Q8_0])
stats = {}
for name in K.last_split["helper"]:
    step, _, t = name.partition(":")
    table = {"matvec": K._MATVEC, "matmat": K._MATMAT}.get(step)
    if table is not None:
        fn = table[int(t)]
        stats[name] = [sum(fn.stats.cache_hits.values()), sum(fn.stats.cache_misses.values())]
print(json.dumps({"split": K.last_split, "tasks": [t.name for t in K.plan([K.Q8_0, K.F16], [K.Q8_0], [])],
                  "stats": stats, "board_left": bool(boards) and os.path.exists(boards[0].folder)}))
"""


def test_first_start_shares_one_task_list_with_a_helper_process(tmp_path):
    """A first start (empty cache) writes its task list to a board that a helper process takes
    tasks from too: every task runs in exactly one of the two processes, and a kernel the helper
    compiled is a disk-cache load in the engine, not a second compile."""
    cwd = _copy_package(tmp_path)
    e = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    e.pop("NUMBA_CACHE_DIR", None)
    e.pop("NUMAWB_PARALLEL_COMPILE", None)
    r = subprocess.run([sys.executable, "-c", HELPER_PROBE, SIMD[0] if SIMD else "portable"], cwd=cwd, env=e,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    here, helper = got["split"]["here"], got["split"]["helper"]
    if (os.cpu_count() or 1) < 2:
        assert helper == []
        return
    assert helper and here
    assert sorted(here + helper) == sorted(got["tasks"])  # each task once
    for name, (hits, misses) in got["stats"].items():
        assert hits >= 1 and misses == 0, name


def test_the_plan_orders_every_task_after_what_it_links():
    """Each step waits for its type's preparation and its parts, the crew's run_chunk for every
    one-token kernel; types that share a preparation (Q4_K, Q6_K: quantize_q8_K) share its task."""
    from workbench.engine import crew
    tasks = K.plan([K.F16, K.Q4_K, K.Q6_K], [K.F32], [], crew.compile_tasks())
    names = [t.name for t in tasks]
    assert all(d < i for i, t in enumerate(tasks) for d in t.deps)
    assert [n for n in names if n.startswith("prepare:")] == [f"prepare:{K.F16}", f"prepare:{K.Q4_K}"]
    mm = names.index(f"matmat:{K.Q4_K}")
    parts = [i for i, n in enumerate(names) if n.startswith(f"part:matmat:{K.Q4_K}:")]
    assert set(parts) <= set(tasks[mm].deps)
    if K.kernel_path() != "portable":
        assert parts  # the repacked and the per-row prompt products are compiled on their own
    chunk = tasks[names.index("call:workbench.engine.crew:warm_one:run_chunk")]
    assert {names.index(f"matvec:{t}") for t in (K.F16, K.Q4_K, K.Q6_K)} <= set(chunk.deps)
    assert tasks[names.index("call:workbench.engine.crew:warm_one:serve")].deps == ()


@pytest.mark.parametrize("t", [K.Q4_K, K.Q6_K])
def test_a_kernels_parts_compile_with_the_signature_its_own_call_uses(t):
    """A part compiled on its own (by either process) is the specialisation the kernel then links:
    after the kernel's own call, each part still has exactly the one signature."""
    for step in ("matvec", "matmat"):
        fn = {"matvec": K._MATVEC, "matmat": K._MATMAT}[step][t]
        cells = dict(zip(fn.py_func.__code__.co_freevars, fn.py_func.__closure__ or ()))
        for name in K._parts(t, step):
            K._compile_part(t, step, name)
        K._precompile_step(t, step)
        for name in K._parts(t, step):
            assert len(cells[name].cell_contents.signatures) == 1, (step, name)


def test_the_board_gives_each_task_to_one_process(tmp_path):
    from workbench.engine.kernels.compile_helper import Board, Task
    tasks = [Task("prepare:8"), Task("matvec:8", (0,)), Task("call:m:f:x", (), False)]
    a = Board.create(tasks)
    try:
        b = Board(a.folder)  # the helper's view of the same folder
        assert b.tasks() == tasks
        assert a.claim(1) and not b.claim(1) and b.claim(0)
        assert not a.is_done(0)
        b.finish(0)
        assert a.is_done(0) and a.wait(0, lambda: True)
        assert a.wait(2, lambda: False) is False  # whoever took it is gone: stop waiting
    finally:
        a.remove()
    assert not os.path.exists(a.folder) and not a.claim(2)


WARM_PROBE = r"""
import json
from numba import types
from workbench.engine import Engine, warm_ops
e = Engine.load(None if len(__import__("sys").argv) < 2 else __import__("sys").argv[1])
s = e.new_session(64)
s.eval(e.tokenizer.encode("hello there, how are you?"))
s.eval([100])
warmed = {}
for fn, sig in warm_ops.signatures():
    warmed.setdefault(fn, set()).add(tuple(sig))
other = []
for fn, sigs in warmed.items():
    for used in fn.overloads:
        if any(isinstance(a, types.Literal) for a in used):
            continue  # a compiled caller's constants: compiled with that caller
        if tuple(used) not in sigs:
            other.append(f"{fn.py_func.__qualname__}{used}")
print(json.dumps(other))
"""


@pytest.mark.parametrize("arch", ["default", "llama"])
def test_warm_ops_cover_the_calls_of_a_first_prompt(tiny_model, arch):
    """warm_ops lists the signatures the engine's helpers are called with from Python in a prompt
    and a decoded token: a call with other argument types (a new caller, a changed dtype) fails
    here instead of silently compiling on every first start."""
    args = [] if arch == "default" else [tiny_model]
    r = subprocess.run([sys.executable, "-c", WARM_PROBE, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_two_processes_saving_specialisations_never_swap_their_code(tmp_path):
    """The race behind 'a crew built for one model ran another build's stubs': process A is
    between writing its index and its data when process B (whose view of the index is stale)
    saves another specialisation of the same function. With Numba's numbered data files both
    took file 1 and B's key ended up pointing at A's code; with data files named by their key,
    each key loads its own data or misses."""
    from numba.core import caching
    a = caching.IndexDataCacheFile(str(tmp_path), "fn-1.py311", 1.0)
    b = caching.IndexDataCacheFile(str(tmp_path), "fn-1.py311", 1.0)
    b._load_index = lambda: {}  # B read the index before A's entry was there
    real = a._save_data

    def a_save_data(name, data):
        b.save(("key-b",), "code of B")  # B runs its whole save in the middle of A's
        real(name, data)
    a._save_data = a_save_data
    a.save(("key-a",), "code of A")
    reader = caching.IndexDataCacheFile(str(tmp_path), "fn-1.py311", 1.0)
    assert reader.load(("key-b",)) in ("code of B", None)
    assert reader.load(("key-a",)) in ("code of A", None)


# ----------------------------------------------------------------------------- symbols across processes
#: a factory whose closures share one qualified name and argument types (like the kernel families,
#: the crew's build and the experts' products); ``g`` calls ``f`` (too big to inline) by its symbol
FAMILY = r"""
import numpy as np
import numba
from workbench.engine.kernels import jitcache


def make(c):
    @numba.njit(**jitcache.JIT)
    def f(a):
        s = 0.0
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                s += np.sin(a[i, j]) * c + np.cos(a[j, i]) - np.exp(a[i, i] * c) + np.log1p(abs(a[i, j]))
        for i in range(a.shape[0]):
            a[i, 0] = np.tanh(a[i, 1] * c) + np.arctan2(a[i, 0], c)
        return s + c * 1000.0

    @numba.njit(**jitcache.JIT)
    def g(a):
        return f(a) + f(a.T.copy()) + 0.5
    return g
"""

#: compile (or load) make(c)'s g for each c on the command line, in that order; report results,
#: cache statistics and the symbols of g and of the f it calls
FAMILY_PROBE = r"""
import json, sys
import numpy as np
import family
out = {}
for c in map(int, sys.argv[1:]):
    g = family.make(c)
    f = g.py_func.__closure__[0].cell_contents
    out[c] = {"value": g(np.zeros((3, 3))), "hits": sum(g.stats.cache_hits.values()),
              "misses": sum(g.stats.cache_misses.values()),
              "symbols": [cr.fndesc.mangled_name for d in (g, f) for cr in d.overloads.values()]}
print(json.dumps(out))
"""


def test_closures_compiled_by_two_processes_keep_their_own_code(tmp_path):
    """The bug behind 'a cold start's cached mul_mat_id kernels gave wrong logits in a later model'
    and 'a crew ran another build's stubs': two processes with the same compile history each
    compile one closure of a factory into one disk cache; a third loads both.  With Numba's
    per-process counter in the symbols both got the same names and the loader ran the first one's
    ``f`` for the second's ``g``; each must run its own code, under symbols of its own."""
    (tmp_path / "family.py").write_text(FAMILY)
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    e.pop("NUMBA_CACHE_DIR", None)

    def run(*cs: int) -> dict:
        r = subprocess.run([sys.executable, "-c", FAMILY_PROBE, *map(str, cs)], cwd=tmp_path, env=e,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}

    one, two = run(1), run(2)  # two processes, one closure each, into the same cache
    assert one[1]["misses"] == 1 and two[2]["misses"] == 1
    assert one[1]["value"] != two[2]["value"]
    both = run(1, 2)  # one process loads both
    assert [both[c]["hits"] for c in (1, 2)] == [1, 1] and [both[c]["misses"] for c in (1, 2)] == [0, 0]
    assert both[1]["value"] == one[1]["value"]
    assert both[2]["value"] == two[2]["value"]
    assert not set(both[1]["symbols"]) & set(both[2]["symbols"])


def test_the_compile_helper_warms_only_what_the_models_first_prompt_calls():
    """`warm_ops.signatures(uses)`: a GELU model's helper does not compile SiLU or the router (the
    engine's first prompt reached those before the helper did and compiled them twice); with no
    hint every helper is warmed."""
    from workbench.engine import gating, ops, warm_ops
    fns = lambda uses: {fn for fn, _sig in warm_ops.signatures(uses)}  # noqa: E731
    gelu, silu_moe, every = fns("gelu"), fns("silu,experts"), fns("")
    assert ops.gelu_mul in gelu and ops.silu_mul not in gelu and gating.gate not in gelu
    assert ops.silu_mul in silu_moe and gating.gate in silu_moe and ops.gelu_mul not in silu_moe
    assert every == gelu | silu_moe
    assert warm_ops.signatures("gelu")[0][0] is ops.rms_norm  # the first call of a prompt first


@pytest.mark.parametrize("user", [None, "3"])
def test_the_engine_compiles_at_llvm_o2_unless_the_user_chose_a_level(user):
    """jitcache sets NUMBA_OPT=2 (a quarter less compile time, the same kernel speed) unless the
    environment already names a level, which is kept."""
    e = dict(os.environ)
    e.pop("NUMBA_OPT", None)
    if user:
        e["NUMBA_OPT"] = user
    code = ("import numba, os\nfrom workbench.engine import kernels\nnumba.njit(lambda x: x + 1)(1)\n"
            "print(int(numba.config.OPT), os.environ['NUMBA_OPT'])")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    want = user or jitcache.DEFAULT_OPT
    assert r.stdout.split() == [want, want]


def test_a_process_takes_a_ready_task_while_another_waits_for_its_inputs(tmp_path):
    """While the other process compiles task 0, the task that links it (1) waits and this one
    takes task 2 first; 1 runs once 0 is done."""
    import threading
    import time
    from workbench.engine.kernels.compile_helper import Board, Task, work
    tasks = [Task("prepare:12"), Task("matvec:12", (0,)), Task("dequantize:8")]
    mine = Board.create(tasks)
    try:
        other = Board(mine.folder)
        assert other.claim(0)
        order: list[int] = []
        t = threading.Thread(target=lambda: order.extend(work(mine, tasks, lambda i: None, lambda: True)))
        t.start()
        deadline = time.time() + 30
        while not mine.is_done(2) and time.time() < deadline:
            time.sleep(0.01)
        assert mine.is_done(2) and not mine.is_claimed(1)  # 2 ran; 1 still waits for 0
        other.finish(0)
        t.join(30)
        assert order == [2, 1]
    finally:
        mine.remove()


def test_an_empty_disk_cache_is_a_first_start_before_anything_compiles(tmp_path):
    """never_compiled reads the probe kernel's cache index: missing -> start the helper at once."""
    from types import SimpleNamespace
    from workbench.engine.kernels.compile_helper import never_compiled
    index = tmp_path / "kernel.nbi"
    probe = SimpleNamespace(_cache=SimpleNamespace(_cache_file=SimpleNamespace(_index_path=str(index))))
    assert never_compiled(probe)
    index.write_bytes(b"")
    assert not never_compiled(probe)
    assert not never_compiled(object())  # no disk cache to read: decided by timing the first task
    from numba.core import caching
    probe = K._MATVEC[K.F16]
    K._precompile_step(K.F16, "matvec")  # compiled or loaded: either way its index is on disk now
    if not isinstance(probe._cache, caching.NullCache):
        assert not never_compiled(probe)


def test_a_warm_up_that_fails_never_fails_the_load(monkeypatch):
    """warm_ops' tasks run in the engine too (when it takes them): a signature the engine's calls
    no longer match is left to the real call instead of raising out of the model load."""
    from numba import types
    from workbench.engine import ops, warm_ops
    monkeypatch.setattr(warm_ops, "signatures", lambda uses="": [(ops.rms_norm, (types.unicode_type,))])
    warm_ops.warm_one("0@gelu")  # does not raise
    with pytest.raises(Exception):
        ops.rms_norm.compile((types.unicode_type,))


# ----------------------------------------------------------------------------- a bounded cache
#: a module with one cached function; {body} is its return expression, {pad} blank lines before it
CACHED = "{pad}import numba\nfrom workbench.engine.kernels import jitcache\n\n\n@numba.njit(**jitcache.JIT)\n" \
         "def f(x):\n    return {body}\n\n\nprint(f(1))\n"


def _run_cached(folder: Path, body: str, pad: int = 0) -> str:
    (folder / "cached_mod.py").write_text(CACHED.format(body=body, pad="\n" * pad))
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    e.pop("NUMBA_CACHE_DIR", None)
    r = subprocess.run([sys.executable, "cached_mod.py"], cwd=folder, env=e, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


def _cache_files(folder: Path, ext: str) -> list[Path]:
    return sorted((folder / "__pycache__").glob(f"cached_mod.*{ext}"))


def test_a_save_deletes_the_code_of_a_source_that_changed(tmp_path):
    """Edit the function (its index is for another source now) and move it to another line (a new
    index name): each save deletes what only the old source could load, index and data."""
    assert _run_cached(tmp_path, "x + 1") == "2"
    first = _cache_files(tmp_path, ".nbc")
    assert len(first) == 1 and len(_cache_files(tmp_path, ".nbi")) == 1
    assert _run_cached(tmp_path, "x + 2") == "3"
    second = _cache_files(tmp_path, ".nbc")
    assert len(second) == 1 and second != first
    assert _run_cached(tmp_path, "x + 3", pad=2) == "4"        # the function two lines further down
    assert len(_cache_files(tmp_path, ".nbc")) == 1 and len(_cache_files(tmp_path, ".nbi")) == 1
    assert _run_cached(tmp_path, "x + 3", pad=2) == "4"        # and the survivor loads


def test_pruning_deletes_code_unused_for_weeks_and_keeps_code_in_use(tmp_path):
    """A data file nobody loaded for MAX_AGE_DAYS goes, with the index left pointing at nothing; a
    load refreshes a day-old file's time, so code in use stays."""
    assert _run_cached(tmp_path, "x + 1") == "2"
    data, = _cache_files(tmp_path, ".nbc")
    folder = str(tmp_path / "__pycache__")
    now = os.stat(data).st_mtime
    os.utime(data, (now - 3 * 86400, now - 3 * 86400))
    assert _run_cached(tmp_path, "x + 1") == "2"                # a cache hit: the file's time refreshed
    assert os.stat(data).st_mtime > now - 86400
    assert jitcache.prune_folder(folder, force=True) == 0 and data.exists()
    old = now - (jitcache.MAX_AGE_DAYS + 1) * 86400
    os.utime(data, (old, old))
    assert jitcache.prune_folder(folder, force=True) == 2     # the data file and its index
    assert not _cache_files(tmp_path, ".nbc") and not _cache_files(tmp_path, ".nbi")
    assert _run_cached(tmp_path, "x + 1") == "2"                # a miss: compiled again

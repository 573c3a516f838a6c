"""`numawb bench`: llama-bench-style throughput table for every placement (NUMA) mode.

Like llama-bench: for each configuration (threads x weights mode x KV mode) and each test, one
warm-up run, then ``r`` timed repetitions; t/s is averaged over the repetitions (± sample standard
deviation).

* ``pp<P>``: a prompt of P random token ids evaluated at once (one ``Session.eval``);
* ``tg<N>``: N single-token evaluations;
* ``... @ d<D>``: the same after a D-token prefix already in the KV cache.  The prefix is
  evaluated once per depth (untimed; the filled cache is kept for the run's other configurations,
  moved with each placement switch) and truncated back to it before every run, so a run sees
  exactly D cached positions.

Each result also carries the share of CPU time its timed repetitions got (the process's CPU seconds
over wall seconds x threads): below ~90 % the machine was shared and the figure is not the engine's.

Also reported: model load time with a cold page cache for the model file (its pages evicted with
``posix_fadvise(DONTNEED)``; if that cannot be verified the row says so) and with a warm one, and
the time to first token of a fresh process (``python -m workbench generate -n 1``), and the peak
resident memory of a fresh process that loads the model with a 4096-token context and generates a
few tokens, against the target "peak RSS within 1.2 x the file size plus the KV cache" (judged on
the memory the model adds to the Python runtime, see ``fresh_process_memory``).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from .options import add_model_path

FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
              10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
              16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


# ----------------------------------------------------------------------------- results
@dataclass
class TestResult:
    model: str
    model_file: str
    size_bytes: int
    n_params: int
    kernel_path: str
    threads: int
    weights: str
    kv: str
    test: str
    n_prompt: int
    n_gen: int
    n_depth: int
    samples_ts: list[float] = field(default_factory=list)
    samples_s: list[float] = field(default_factory=list)
    samples_cpu: list[float] = field(default_factory=list)  # CPU share per timed repetition

    @property
    def cpu_share(self) -> float | None:
        """Mean share of the threads' CPU time the repetitions got (None when not measured)."""
        return statistics.fmean(self.samples_cpu) if self.samples_cpu else None

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts) if self.samples_ts else 0.0

    @property
    def stdev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0

    @property
    def median_ts(self) -> float:
        return statistics.median(self.samples_ts) if self.samples_ts else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(avg_ts=self.avg_ts, stdev_ts=self.stdev_ts, median_ts=self.median_ts, cpu_share=self.cpu_share)
        return d


@dataclass
class BenchReport:
    machine: dict
    model_file: str
    load: dict
    ttft: dict
    results: list[TestResult]
    memory: dict = field(default_factory=lambda: {"ok": False, "error": "not measured"})
    traffic: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"machine": self.machine, "model_file": self.model_file, "load": self.load,
                "ttft": self.ttft, "memory": self.memory, "traffic": self.traffic,
                "results": [r.as_dict() for r in self.results]}


# ----------------------------------------------------------------------------- helpers
def parse_int_list(s: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in str(s).split(",") if v.strip() != ""]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {s!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise ValueError(f"{what}: expected non-negative integers, got {s!r}")
    return vals


def weight_modes(spec: str) -> list[str]:
    from .numa.modes import parse_weights_list
    return parse_weights_list(spec)


def kv_modes(spec: str) -> list[str]:
    from .numa.modes import parse_kv_list
    from .numa.topology import load_topology
    return parse_kv_list(spec, load_topology().node_ids)


def model_label(eng) -> str:
    md = eng.gguf.metadata
    arch = md.get("general.architecture", eng.cfg.arch)
    size = md.get("general.size_label", "")
    ft = FILE_TYPES.get(md.get("general.file_type", -1), "")
    return " ".join(str(p) for p in (arch, size, ft) if p)


def fmt_size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def test_name(n_prompt: int, n_gen: int, depth: int) -> str:
    name = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
    return f"{name} @ d{depth}" if depth else name


def machine_info() -> dict:
    from .engine.kernels import kernel_path
    from .engine.kernels.cpu import cpuinfo_field
    cpu = cpuinfo_field("model name") or platform.processor() or ""
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "kernel_path": kernel_path(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "host": platform.node()}


# ----------------------------------------------------------------------------- page cache
def resident_fraction(path: str) -> float | None:
    """Fraction of the file's pages in the page cache (util-linux ``fincore``), None if unknown."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", path],
                             capture_output=True, text=True, timeout=30)
        res, size = out.stdout.split()[:2]
        return int(res) / max(int(size), 1)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def evict_file(path: str) -> tuple[bool, str]:
    """Drop the file's pages from the page cache (only this file; no root needed).

    Returns (cold, how).  Falls back to /proc/sys/vm/drop_caches when fadvise leaves pages
    resident and we are allowed to write it.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd) if os.access(path, os.W_OK) else None
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    frac = resident_fraction(path)
    if frac is not None and frac < 0.02:
        return True, "posix_fadvise(DONTNEED) on the model file"
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        frac = resident_fraction(path)
        if frac is None or frac < 0.02:
            return True, "drop_caches"
    except OSError:
        pass
    if frac is None:
        return True, "posix_fadvise(DONTNEED) (unverified: no fincore)"
    return False, f"could not evict ({frac:.0%} of the file still cached): warm only"


# ----------------------------------------------------------------------------- time to first token
_TTFT_SNIPPET = """
import json, sys, time
from workbench.engine import Engine, SamplingParams
eng = Engine.load(sys.argv[1] if len(sys.argv) > 1 else None)
ids = eng.tokenizer.encode("hi", add_bos=None)
s = eng.new_session(64)
t0 = time.perf_counter()
for ev in s.generate(ids, SamplingParams(temperature=0.0), 1):
    pass
print(json.dumps({"ttft": ev.stats.ttft}))
"""


def fresh_process_ttft(model: str | None, timeout: float = 600.0) -> dict:
    """Wall time of `python -m workbench generate -n 1 --temp 0 -p hi --json` in a new process.

    If that command fails (e.g. a broken CLI), the same steps are timed through the engine API
    in a new process (``method`` says which one ran).
    """
    cmd = [sys.executable, "-m", "workbench", "generate", "-n", "1", "--temp", "0", "-p", "hi", "--json"]
    if model:
        cmd[3:3] = ["-m", model]
    res = _time_process(cmd, timeout)
    res["method"] = "python -m workbench generate -n 1"
    if not res["ok"]:
        first_error = res.get("error")
        res = _time_process([sys.executable, "-c", _TTFT_SNIPPET] + ([model] if model else []), timeout)
        res["method"] = "engine API in a new process (CLI failed: %s)" % first_error
    return res


def _run_child(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess | None, float, str]:
    """Run ``cmd`` from the repository root with it on PYTHONPATH: (process, wall seconds, error)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return None, timeout, f"timed out after {timeout:.0f} s"
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return p, wall, (p.stderr.strip().splitlines() or ["?"])[-1]
    return p, wall, ""


def _last_json(p: subprocess.CompletedProcess) -> dict:
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def _time_process(cmd: list[str], timeout: float) -> dict:
    p, wall, error = _run_child(cmd, timeout)
    if p is None:
        return {"ok": False, "error": error}
    if error:
        return {"ok": False, "wall_s": wall, "error": error}
    return {"ok": True, "wall_s": wall, "in_process_ttft_s": _last_json(p).get("ttft")}


# ----------------------------------------------------------------------------- peak memory
MEMORY_FACTOR = 1.2   # target: peak RSS within 1.2 x the model file size plus the KV cache
MEMORY_CTX = 4096
MEMORY_TOKENS = 4

_MEMORY_SNIPPET = """
import json, os, sys

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out

from numba.core import event

class Compiles(event.Listener):  # code compiled here (not found in the disk cache) grows the peak
    n = 0
    def on_start(self, ev):
        pass
    def on_end(self, ev):
        Compiles.n += 1

event.register("numba:compile", Compiles())
from workbench.engine import Engine, SamplingParams
path, n_ctx, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
baseline = status()["VmRSS"]
eng = Engine.load(path)
s = eng.new_session(n_ctx)
ids = eng.tokenizer.encode("hi", add_bos=None)
n = 0
for ev in s.generate(ids, SamplingParams(temperature=0.0), n_gen):
    n += 1
end = status()
print(json.dumps({"baseline_rss": baseline, "peak_rss": end["VmHWM"], "end_rss": end["VmRSS"],
                  "file_bytes": eng.gguf.file_size, "kv_bytes": s.kv.nbytes, "n_ctx": s.n_ctx,
                  "n_gen": n_gen, "compiled": Compiles.n}))
"""


def memory_summary(raw: dict, factor: float = MEMORY_FACTOR) -> dict:
    """The memory target from a fresh process's raw numbers (``_MEMORY_SNIPPET``'s JSON, bytes).

    ``attributable_bytes`` = peak RSS - the RSS after imports (interpreter, numpy, numba, the
    engine's modules: not the model's); the target is met when it is within
    ``factor`` x the file size + the KV cache bytes of the session (``limit_bytes``).
    """
    keys = ("baseline_rss", "peak_rss", "file_bytes", "kv_bytes")
    missing = [k for k in keys if not isinstance(raw.get(k), int)]
    if missing:
        return {"ok": False, "error": "no " + ", ".join(missing) + " in the child's output"}
    attributable = raw["peak_rss"] - raw["baseline_rss"]
    limit = int(factor * raw["file_bytes"]) + raw["kv_bytes"]
    return {"ok": True, "n_ctx": raw.get("n_ctx"), "n_gen": raw.get("n_gen"),
            "peak_rss_bytes": raw["peak_rss"], "baseline_rss_bytes": raw["baseline_rss"],
            "end_rss_bytes": raw.get("end_rss"), "file_bytes": raw["file_bytes"], "kv_bytes": raw["kv_bytes"],
            "attributable_bytes": attributable, "limit_factor": factor, "limit_bytes": limit,
            "met": attributable <= limit}


def format_memory(mem: dict) -> str:
    """One line: peak RSS, the runtime baseline, the model-attributable part against the limit."""
    if not mem.get("ok"):
        return f"peak memory, fresh process: failed ({mem.get('error')})"
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    again = (f"; kernels from the disk cache: a first process compiled {mem['compiled_first']} functions"
             if mem.get("compiled_first") else "")
    return (f"peak memory, fresh process (context {mem['n_ctx']}, {mem['n_gen']} tokens{again}): peak RSS "
            f"{mib(mem['peak_rss_bytes'])} = {mib(mem['baseline_rss_bytes'])} Python runtime after imports "
            f"(not the model's) + {mib(mem['attributable_bytes'])} model-attributable; target <= "
            f"{mem['limit_factor']:g} x file {mib(mem['file_bytes'])} + KV {mib(mem['kv_bytes'])} = "
            f"{mib(mem['limit_bytes'])}: {'met' if mem['met'] else 'not met'}")


def fresh_process_memory(model: str, n_ctx: int = MEMORY_CTX, n_gen: int = MEMORY_TOKENS,
                         timeout: float = 600.0) -> dict:
    """Peak resident memory (VmHWM) of a new process that loads ``model`` with the default placement,
    opens a session of ``n_ctx`` tokens and generates ``n_gen`` tokens; see ``memory_summary``.

    A process that had to compile (code not yet in the disk cache: a fresh install, an edited
    source) counts LLVM's working memory in its peak (~120 MiB at the default model's first
    decoded token on the EPYC VM): it is run again, and the second process, which finds
    everything compiled, is the one measured (``compiled_first``: what the first compiled)."""
    first = None
    for _ in range(2):
        p, wall, error = _run_child([sys.executable, "-c", _MEMORY_SNIPPET, model, str(n_ctx), str(n_gen)],
                                    timeout)
        if p is None or error:
            return {"ok": False, "error": error}
        raw = _last_json(p)
        if not raw.get("compiled") or first is not None:
            break
        first = raw
    mem = memory_summary(raw)
    mem["wall_s"] = wall
    mem["compiled_first"] = int(first["compiled"]) if first is not None else 0
    return mem


# ----------------------------------------------------------------------------- the runs
class Progress:
    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def __call__(self, msg: str, final: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K" + msg + ("\n" if final else ""))
        else:
            self.stream.write(msg + "\n")
        self.stream.flush()


def _random_ids(rng: np.random.Generator, n_vocab: int, n: int) -> list[int]:
    # llama-bench uses random ids over the vocabulary; skip the first ids (control tokens)
    lo = min(4, n_vocab - 1)
    return [int(v) for v in rng.integers(lo, n_vocab, n)]


def _run_pp(session, prompt: list[int], depth: int) -> float:
    session.kv.truncate(depth)
    del session.tokens[depth:]
    t0 = time.perf_counter()
    session.eval(prompt)
    return time.perf_counter() - t0


def _run_tg(session, tokens: list[int], depth: int) -> float:
    session.kv.truncate(depth)
    del session.tokens[depth:]
    t0 = time.perf_counter()
    for t in tokens:
        session.eval([t])
    return time.perf_counter() - t0


def _prefix_session(eng, prefixes: dict, depth: int, n_ctx: int, rng: np.random.Generator, n_vocab: int,
                    progress: Progress, cfg: str):
    """The session holding ``depth`` random tokens, filled on first use and kept for the other
    configurations (a placement switch moves its cache with its contents)."""
    session = prefixes.get(depth)
    if session is None:
        session = prefixes[depth] = eng.new_session(n_ctx)
        if depth:
            progress(f"{cfg}: filling depth {depth} ...")
            t0 = time.perf_counter()
            session.eval(_random_ids(rng, n_vocab, depth))
            progress(f"{cfg}: depth {depth} filled in {time.perf_counter() - t0:.1f} s", final=True)
    return session


def run_config(eng, prefixes: dict, *, threads: int, weights: str, kv: str, n_prompts: Sequence[int],
               n_gens: Sequence[int], depths: Sequence[int], reps: int, rng: np.random.Generator,
               progress: Progress, label: str, size: int, n_params: int, kpath: str) -> list[TestResult]:
    n_vocab = eng.cfg.n_vocab if hasattr(eng.cfg, "n_vocab") else eng.tokenizer.n_vocab
    tests = [(p, 0) for p in n_prompts if p > 0] + [(0, n) for n in n_gens if n > 0]
    out: list[TestResult] = []
    cfg = f"t={threads} weights={weights} kv={kv}"
    for depth in depths:
        n_ctx = depth + max(n_prompt or n_gen for n_prompt, n_gen in tests) + 8 if tests else depth + 8
        session = _prefix_session(eng, prefixes, depth, n_ctx, rng, n_vocab, progress, cfg)
        for n_prompt, n_gen in tests:
            name = test_name(n_prompt, n_gen, depth)
            res = TestResult(label, eng.path, size, n_params, kpath, threads, weights, kv, name,
                             n_prompt, n_gen, depth)
            n_tok = n_prompt or n_gen
            for rep in range(reps + 1):  # rep 0 is the warm-up
                ids = _random_ids(rng, n_vocab, n_tok)
                what = "warm-up" if rep == 0 else f"rep {rep}/{reps}"
                progress(f"{cfg}: {name} {what}"
                         + (f"  ({res.samples_ts[-1]:.1f} t/s)" if res.samples_ts else ""))
                c0 = time.process_time()  # every thread of the process, fine-grained
                dt = _run_pp(session, ids, depth) if n_prompt else _run_tg(session, ids, depth)
                if rep > 0:
                    res.samples_s.append(dt)
                    res.samples_ts.append(n_tok / dt)
                    res.samples_cpu.append(min(1.0, (time.process_time() - c0) / (dt * threads)))
            progress(f"{cfg}: {name} {res.avg_ts:.2f} ± {res.stdev_ts:.2f} t/s", final=True)
            out.append(res)
    return out


SHARED_BELOW = 0.9   # a test whose threads got less of their CPU time shared the machine

COMPILE_WAIT_NOTED_S = 0.2   # a load that waited longer on compiling kernels was a first start


def _first_start_note(ld: dict) -> str:
    """The first load's figure when it waited on compiling kernels (not a page-cache time)."""
    wait = ld.get("compile_wait_s") or 0.0
    if wait <= COMPILE_WAIT_NOTED_S:
        return ""
    return f"; the first load {ld['first_load_s']:.2f} s, {wait:.1f} s of it waiting for kernels to compile"


def measure_load(path: str | None, placement, progress: Progress) -> tuple[dict, object]:
    """(load report, engine loaded cold if possible)."""
    from .engine import Engine
    from .engine.engine import default_model_path
    path = path or default_model_path()
    cold, how = evict_file(path)
    progress(f"loading {path} ({'cold page cache' if cold else 'warm'}) ...")
    eng = Engine.load(path, placement=placement)
    first, compile_wait = eng.load_seconds, eng.compile_wait_seconds
    if compile_wait > COMPILE_WAIT_NOTED_S:
        # a first start: that load waited on kernels compiling; the cold figure is taken again
        # with them in the disk cache, so it times the page cache and not the compiler
        progress(f"first load waited {compile_wait:.1f} s for kernels to compile; loading cold again ...")
        eng.close()
        cold, how = evict_file(path)
        eng = Engine.load(path, placement=placement)
    cold_s = eng.load_seconds
    progress("loading again (warm page cache) ...")
    eng2 = Engine.load(path, placement=placement)
    warm = eng2.load_seconds
    eng2.close()
    report = {"cold_s": cold_s if cold else None, "warm_s": warm, "cold_method": how,
              "first_load_s": first, "compile_wait_s": compile_wait}
    progress(f"load: cold {cold_s:.2f} s ({how}), warm {warm:.2f} s" if cold
             else f"load: warm {warm:.2f} s ({how})", final=True)
    return report, eng


def run_bench(model: str | None = None, threads: Sequence[int] = (1,), n_prompts: Sequence[int] = (512,),
              n_gens: Sequence[int] = (128,), depths: Sequence[int] = (0,), reps: int = 5,
              weights: Sequence[str] = ("none",), kvs: Sequence[str] = ("first-touch",),
              measure_startup: bool = True, progress: Progress | None = None,
              seed: int = 1234) -> BenchReport:
    from .engine.engine import Placement
    from .engine.kernels import kernel_path
    progress = progress or Progress()
    rng = np.random.default_rng(seed)
    placement = Placement(weights=weights[0], kv=kvs[0], threads=threads[0])
    if measure_startup:
        load, eng = measure_load(model, placement, progress)
    else:
        from .engine import Engine
        eng = Engine.load(model, placement=placement)
        load = {"cold_s": None, "warm_s": None, "cold_method": "not measured", "first_load_s": eng.load_seconds}
    try:
        label = model_label(eng)
        size = eng.weight_bytes
        n_params = eng.n_params
        kpath = kernel_path()
        n_ctx = max(depths) + max([*n_prompts, *n_gens, 1]) + 8
        if n_ctx > eng.cfg.n_ctx_train:
            raise ValueError(f"depth + test length {n_ctx} exceeds the model's context {eng.cfg.n_ctx_train}")
        prefixes: dict = {}  # depth -> the session filled to it
        results: list[TestResult] = []
        for t in threads:
            for wm in weights:
                for kv in kvs:
                    progress(f"placing: threads={t} weights={wm} kv={kv} ...")
                    eng.switch(weights=wm, kv=kv, threads=t)
                    results += run_config(eng, prefixes, threads=t, weights=wm, kv=kv, n_prompts=n_prompts,
                                          n_gens=n_gens, depths=depths, reps=reps, rng=rng, progress=progress,
                                          label=label, size=size, n_params=n_params, kpath=kpath)
        path = eng.path
    finally:
        eng.close()
    ttft = {"ok": False, "error": "not measured"}
    memory = {"ok": False, "error": "not measured"}
    if measure_startup:
        progress("time to first token of a fresh process ...")
        ttft = fresh_process_ttft(path)
        if ttft.get("ok"):
            progress(f"fresh process: first token after {ttft['wall_s']:.2f} s", final=True)
        progress(f"peak memory of a fresh process (context {MEMORY_CTX}) ...")
        memory = fresh_process_memory(path)
        if memory.get("ok"):
            progress(f"fresh process: peak RSS {memory['peak_rss_bytes'] / 2**20:.1f} MiB", final=True)
    return BenchReport(machine_info(), path, load, ttft, results, memory, traffic_facts(path))


def traffic_facts(path: str) -> dict:
    """What a decoded token reads, from the file's header: the active weights (a mixture of
    experts reads only its routed experts) beside the file size, and the KV cache per position."""
    from .advisor.cost import model_cost
    c = model_cost(path)
    return {"file_bytes": c.file_size, "weight_bytes": c.weight_bytes,
            "active_bytes_per_token": c.weight_bytes_per_token, "kv_bytes_per_position": c.kv_bytes_per_position,
            "mla": c.mla, "experts": c.expert_count, "experts_used": c.expert_used_count}


# ----------------------------------------------------------------------------- output
COLUMNS = ("model", "size", "params", "kernels", "threads", "weights", "kv", "test", "t/s")


def table_rows(rep: BenchReport) -> list[list[str]]:
    return [[r.model, fmt_size(r.size_bytes), fmt_params(r.n_params), r.kernel_path, str(r.threads),
             r.weights, r.kv, r.test, f"{r.avg_ts:.2f} ± {r.stdev_ts:.2f}"] for r in rep.results]


def format_markdown(rep: BenchReport) -> str:
    rows = table_rows(rep)
    right = {"size", "params", "threads", "test", "t/s"}
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(COLUMNS)]

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if h in right else c.ljust(w)
                                 for c, w, h in zip(cells, widths, COLUMNS)) + " |"
    sep = "| " + " | ".join(("-" * (w - 1) + ":") if h in right else "-" * w
                            for w, h in zip(widths, COLUMNS)) + " |"
    out = [line(COLUMNS), sep] + [line(r) for r in rows]
    ld = rep.load
    out.append("")
    tr = rep.traffic
    if tr:
        moe = f", routed experts {tr['experts_used']} of {tr['experts']}" if tr.get("experts") else ""
        out.append(f"active weights per token: {fmt_size(int(tr['active_bytes_per_token']))} of a "
                   f"{fmt_size(tr['file_bytes'])} file{moe}; KV cache {tr['kv_bytes_per_position'] / 1024:.1f} KiB "
                   "per position" + (" (MLA latent + rotary key, and the latent transposed)" if tr.get("mla") else ""))
    if ld.get("cold_s") is not None:
        out.append(f"load: cold page cache {ld['cold_s']:.2f} s ({ld['cold_method']}), "
                   f"warm {ld['warm_s']:.2f} s" + _first_start_note(ld))
    elif ld.get("warm_s") is not None:
        out.append(f"load: warm page cache {ld['warm_s']:.2f} s (cold not measured: {ld['cold_method']})"
                   + _first_start_note(ld))
    if rep.ttft.get("ok"):
        extra = rep.ttft.get("in_process_ttft_s")
        out.append(f"time to first token, fresh process: {rep.ttft['wall_s']:.2f} s"
                   + (f" (in-process prompt+first token {extra * 1000:.0f} ms)" if extra is not None else "")
                   + f" [{rep.ttft.get('method', '')}]")
    elif rep.ttft.get("error") != "not measured":
        out.append(f"time to first token, fresh process: failed ({rep.ttft.get('error')})")
    if rep.memory.get("ok") or rep.memory.get("error") != "not measured":
        out.append(format_memory(rep.memory))
    shared = [r for r in rep.results if r.cpu_share is not None and r.cpu_share < SHARED_BELOW]
    if shared:
        out.append("shared machine: " + ", ".join(f"{r.test} at {r.threads} t got {r.cpu_share * 100:.0f} %"
                                                  for r in shared)
                   + " of its threads' CPU time: those rows are not the engine's speed")
    m = rep.machine
    out.append(f"machine: {m['cpu']}, {m['cores']} cores, kernels {m['kernel_path']}, {m['date']}")
    return "\n".join(out)


def format_csv(rep: BenchReport) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "model_file", "size_bytes", "n_params", "kernel_path", "threads", "weights", "kv",
                "test", "n_prompt", "n_gen", "n_depth", "avg_ts", "stdev_ts", "median_ts", "samples_ts"])
    for r in rep.results:
        w.writerow([r.model, r.model_file, r.size_bytes, r.n_params, r.kernel_path, r.threads, r.weights, r.kv,
                    r.test, r.n_prompt, r.n_gen, r.n_depth, f"{r.avg_ts:.4f}", f"{r.stdev_ts:.4f}",
                    f"{r.median_ts:.4f}", ";".join(f"{v:.4f}" for v in r.samples_ts)])
    return buf.getvalue()


# ----------------------------------------------------------------------------- cli
def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_path(p)
    p.add_argument("-t", "--threads", default=None, metavar="N[,N...]",
                   help="thread counts (default: 1,all cores)")
    p.add_argument("-p", "--n-prompt", default="512", metavar="N[,N...]", help="prompt lengths (0: none)")
    p.add_argument("-n", "--n-gen", default="128", metavar="N[,N...]", help="generated tokens (0: none)")
    p.add_argument("-d", "--n-depth", default="0", metavar="D[,D...]", help="KV-cache depths")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--weights", default="none", metavar="MODES|all",
                   help="weight placement modes (mirror, interleave, slice, none, auto; all)")
    p.add_argument("--kv", default="first-touch", metavar="MODES|all",
                   help="KV placement modes (first-touch, interleave, node:N; all)")
    p.add_argument("--no-startup", action="store_true", help="skip load-time, first-token and peak-memory measurements")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--csv", action="store_true", help="print CSV rows")


def main(args: argparse.Namespace) -> int:
    """Run from parsed arguments; raises ValueError on bad input."""
    ncores = len(os.sched_getaffinity(0))
    threads = parse_int_list(args.threads, "-t") if args.threads else sorted({1, ncores})
    if any(t < 1 for t in threads):
        raise ValueError("-t: thread counts must be >= 1")
    n_prompts = parse_int_list(args.n_prompt, "-p")
    n_gens = parse_int_list(args.n_gen, "-n")
    depths = parse_int_list(args.n_depth, "-d")
    if args.repetitions < 1:
        raise ValueError("-r must be >= 1")
    if not any(n_prompts) and not any(n_gens):
        raise ValueError("nothing to run: -p and -n are all 0")
    rep = run_bench(args.model, threads, n_prompts, n_gens, depths, args.repetitions,
                    weight_modes(args.weights), kv_modes(args.kv), measure_startup=not args.no_startup,
                    progress=Progress(not args.quiet))
    if args.json:
        print(json.dumps(rep.as_dict(), indent=2))
    elif args.csv:
        sys.stdout.write(format_csv(rep))
    else:
        print(format_markdown(rep))
    return 0


if __name__ == "__main__":  # pragma: no cover
    ap = argparse.ArgumentParser(prog="numawb bench")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))

"""`numawb bench` on a tiny synthetic model: table, JSON and CSV structure (no speed assertions)."""
from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest

from gguf_factory import TinySpec, write_tiny_model
from workbench import bench
from workbench.cli import main as cli_main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    write_tiny_model(path, TinySpec())
    return str(path)


@pytest.fixture(scope="module")
def report(tiny):
    return bench.run_bench(tiny, threads=[1], n_prompts=[8], n_gens=[4], depths=[0, 16], reps=2,
                           weights=["none"], kvs=["first-touch"], measure_startup=False,
                           progress=bench.Progress(False))


def test_results_structure(report):
    tests = [r.test for r in report.results]
    assert tests == ["pp8", "tg4", "pp8 @ d16", "tg4 @ d16"]
    for r in report.results:
        assert len(r.samples_ts) == 2 and len(r.samples_s) == 2
        assert all(v > 0 for v in r.samples_ts) and r.avg_ts > 0 and r.stdev_ts >= 0
        assert r.size_bytes > 0 and r.n_params > 0 and r.threads == 1
        assert r.weights == "none" and r.kv == "first-touch"
        assert r.kernel_path in ("portable", "avx2", "avx512-vnni")
    assert report.results[2].n_depth == 16 and report.results[0].n_depth == 0


def test_markdown_table(report):
    md = bench.format_markdown(report)
    lines = md.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == list(bench.COLUMNS)
    rows = [ln for ln in lines[2:] if ln.startswith("|")]
    assert len(rows) == 4
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == len(header)
        avg, sd = cells[-1].split("±")
        assert float(avg) > 0 and float(sd) >= 0
    assert "tg4 @ d16" in md and "machine:" in md


def test_csv(report):
    rows = list(csv.DictReader(io.StringIO(bench.format_csv(report))))
    assert len(rows) == 4
    assert all(float(r["avg_ts"]) > 0 for r in rows)
    assert {r["test"] for r in rows} == {"pp8", "tg4", "pp8 @ d16", "tg4 @ d16"}


def test_cli_json(tiny, capsys):
    rc = cli_main(["bench", "-m", tiny, "-t", "1", "-p", "8", "-n", "4", "-r", "1", "--weights", "none,mirror",
                   "--json", "-q"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert {"machine", "model_file", "load", "ttft", "results"} <= set(d)
    assert d["load"]["warm_s"] > 0
    assert d["machine"]["kernel_path"] in ("portable", "avx2", "avx512-vnni")
    assert [(r["weights"], r["test"]) for r in d["results"]] == [
        ("none", "pp8"), ("none", "tg4"), ("mirror", "pp8"), ("mirror", "tg4")]
    for r in d["results"]:
        assert r["avg_ts"] > 0 and r["n_params"] > 0 and r["size_bytes"] > 0
    assert d["ttft"]["ok"] and d["ttft"]["wall_s"] > 0
    mem = d["memory"]
    assert mem["ok"], mem
    assert mem["peak_rss_bytes"] >= mem["baseline_rss_bytes"] > 0
    assert mem["file_bytes"] > 0 and mem["kv_bytes"] > 0 and mem["limit_bytes"] > mem["kv_bytes"]


def test_bad_arguments(tiny, capsys):
    assert cli_main(["bench", "-m", tiny, "--weights", "bogus", "-q"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert cli_main(["bench", "-m", tiny, "-p", "x", "-q"]) == 2
    assert cli_main(["bench", "-m", tiny, "-p", "0", "-n", "0", "-q"]) == 2


def test_mode_lists():
    assert "mirror" in bench.weight_modes("all") and "none" in bench.weight_modes("all")
    kv = bench.kv_modes("all")
    assert kv[:2] == ["first-touch", "interleave"] and any(m.startswith("node:") for m in kv)
    assert bench.parse_int_list("0,4096", "-d") == [0, 4096]
    assert bench.test_name(512, 0, 4096) == "pp512 @ d4096"
    assert bench.test_name(0, 128, 0) == "tg128"


RAW_MEMORY = {"baseline_rss": 175_000_000, "peak_rss": 581_000_000, "end_rss": 580_000_000,
              "file_bytes": 253_113_024, "kv_bytes": 75_497_472, "n_ctx": 4096, "n_gen": 4}


def test_memory_summary_and_format(report):
    mem = bench.memory_summary(RAW_MEMORY)
    assert mem["ok"] and mem["n_ctx"] == 4096 and mem["n_gen"] == 4
    assert mem["attributable_bytes"] == 581_000_000 - 175_000_000
    assert mem["limit_bytes"] == int(1.2 * 253_113_024) + 75_497_472
    assert mem["met"] is False
    line = bench.format_memory(mem)
    assert "peak RSS 554.1 MiB" in line and "166.9 MiB Python runtime" in line
    assert "387.2 MiB model-attributable" in line and "= 361.7 MiB" in line and line.endswith(": not met")

    ok = bench.memory_summary(dict(RAW_MEMORY, peak_rss=500_000_000))
    assert ok["met"] and bench.format_memory(ok).endswith(": met")

    bad = bench.memory_summary({"baseline_rss": 1})
    assert not bad["ok"] and "peak_rss" in bad["error"]
    assert "failed" in bench.format_memory(bad)

    assert "peak memory" not in bench.format_markdown(report)  # not measured: no line
    md = bench.format_markdown(dataclasses.replace(report, memory=mem))
    assert line in md
    assert json.loads(json.dumps(dataclasses.replace(report, memory=mem).as_dict()))["memory"]["met"] is False


def test_fresh_process_memory_measures_a_process_that_found_its_code_compiled(monkeypatch):
    """A first process that compiled (LLVM's working memory in its peak) is run again; the second
    one is measured, and the line says what the first compiled."""
    outs = iter([dict(RAW_MEMORY, peak_rss=900_000_000, compiled=14), dict(RAW_MEMORY, compiled=0)])
    calls = []
    monkeypatch.setattr(bench, "_run_child", lambda cmd, timeout: (calls.append(cmd) or object(), 1.0, None))
    monkeypatch.setattr(bench, "_last_json", lambda p: next(outs))
    mem = bench.fresh_process_memory("model.gguf")
    assert len(calls) == 2 and mem["peak_rss_bytes"] == RAW_MEMORY["peak_rss"] and mem["compiled_first"] == 14
    assert "a first process compiled 14 functions" in bench.format_memory(mem)
    # nothing compiled: one process
    outs = iter([dict(RAW_MEMORY, compiled=0)])
    calls.clear()
    mem = bench.fresh_process_memory("model.gguf")
    assert len(calls) == 1 and mem["compiled_first"] == 0 and "compiled" not in bench.format_memory(mem)


def test_fresh_process_memory_default_model():
    """One fresh process on the default model (a few seconds): the fields are there and sane."""
    try:
        from workbench.engine.engine import default_model_path
        path = default_model_path()
    except Exception as e:  # pragma: no cover - the model package is missing
        pytest.skip(f"default model unavailable: {e}")
    mem = bench.fresh_process_memory(path)
    assert mem["ok"], mem
    for key in ("peak_rss_bytes", "baseline_rss_bytes", "file_bytes", "kv_bytes", "attributable_bytes",
                "limit_bytes"):
        assert mem[key] > 0, key
    assert mem["peak_rss_bytes"] >= mem["baseline_rss_bytes"]
    assert mem["n_ctx"] == 4096 and isinstance(mem["met"], bool)
    assert mem["peak_rss_bytes"] - mem["baseline_rss_bytes"] >= mem["file_bytes"] * 0.8  # the weights are in


def test_active_bytes_per_token_beside_the_file_size(report, tmp_path):
    """Dense: every matrix is read per token (the embedding is tied to the output). MoE: only the
    routed experts' share of the expert tensors."""
    tr = report.traffic
    assert tr["file_bytes"] > tr["weight_bytes"] > 0 and tr["experts"] == 0
    assert tr["active_bytes_per_token"] == pytest.approx(tr["weight_bytes"], rel=1e-9)
    assert "active weights per token" in bench.format_markdown(report)
    moe = tmp_path / "moe.gguf"
    write_tiny_model(moe, TinySpec(arch="qwen3moe", n_expert=8, n_expert_used=2, n_ff=256, n_ff_exp=256),
                     reference=False)
    t = bench.traffic_facts(str(moe))
    from workbench.engine.gguf_file import read_gguf
    tensors = read_gguf(str(moe)).tensors
    exps = sum(x.nbytes for n, x in tensors.items() if "_exps" in n)
    assert (t["experts"], t["experts_used"]) == (8, 2)
    assert t["active_bytes_per_token"] == pytest.approx(t["weight_bytes"] - exps + exps * 2 / 8, rel=1e-9)


def test_cold_load_is_timed_again_when_the_first_load_waited_on_compiling(tiny, monkeypatch):
    """A first start's load waits on the compiler: its figure is reported as such, and the cold
    page-cache time comes from a second cold load (kernels in the disk cache by then)."""
    from workbench import engine as engine_mod

    loads, evictions = [], []

    class FakeEngine:
        def __init__(self, seconds, wait):
            self.load_seconds, self.compile_wait_seconds, self.closed = seconds, wait, False

        def close(self):
            self.closed = True

    plan = [(9.0, 8.4), (0.6, 0.0), (0.3, 0.0)]   # first start, cold again, warm

    def fake_load(path, placement=None):
        loads.append(FakeEngine(*plan[len(loads)]))
        return loads[-1]

    monkeypatch.setattr(engine_mod.Engine, "load", staticmethod(fake_load))
    monkeypatch.setattr(bench, "evict_file", lambda p: (evictions.append(p), (True, "test eviction"))[1])
    report, eng = bench.measure_load(tiny, None, bench.Progress(False))
    assert len(loads) == 3 and len(evictions) == 2 and loads[0].closed and eng is loads[1]
    assert report["cold_s"] == 0.6 and report["warm_s"] == 0.3
    assert report["first_load_s"] == 9.0 and report["compile_wait_s"] == 8.4
    assert "9.00 s, 8.4 s of it waiting for kernels to compile" in bench._first_start_note(report)

    # kernels already cached: one cold load is the figure, no note
    loads.clear(), evictions.clear()
    plan[:] = [(0.6, 0.05), (0.3, 0.0)]
    report, eng = bench.measure_load(tiny, None, bench.Progress(False))
    assert len(loads) == 2 and report["cold_s"] == 0.6 and bench._first_start_note(report) == ""


def test_depth_filled_once_and_kept_across_configurations(tiny, monkeypatch):
    """A depth's prefix is evaluated once per run; the second thread count's runs still see it
    (the placement switch moved the cache with its contents), and each repetition's CPU share is
    measured."""
    seen = []
    run_tg = bench._run_tg

    def spy(session, tokens, depth):
        session.kv.truncate(depth)
        del session.tokens[depth:]
        seen.append((depth, session.kv.n, len(session.tokens), session.engine.placement.threads))
        return run_tg(session, tokens, depth)

    monkeypatch.setattr(bench, "_run_tg", spy)
    log = io.StringIO()
    prog = bench.Progress(True, stream=log)
    rep = bench.run_bench(tiny, threads=[1, 2], n_prompts=[0], n_gens=[3], depths=[0, 12], reps=1,
                          weights=["none"], kvs=["first-touch"], measure_startup=False, progress=prog)
    assert log.getvalue().count("filling depth 12") == 1
    deep = [s for s in seen if s[0] == 12]
    assert {w for *_, w in deep} == {1, 2}
    assert all(n == 12 and toks == 12 for _, n, toks, _ in deep)
    assert [(r.threads, r.n_depth) for r in rep.results] == [(1, 0), (1, 12), (2, 0), (2, 12)]
    for r in rep.results:
        assert r.cpu_share is not None and 0.0 < r.cpu_share <= 1.0
        assert r.as_dict()["cpu_share"] == r.cpu_share


def test_markdown_names_a_shared_machine(report):
    """A test whose threads got under 90 % of their CPU time is named under the table."""
    quiet = dataclasses.replace(report, results=[dataclasses.replace(r, samples_cpu=[1.0]) for r in report.results])
    assert "shared machine" not in bench.format_markdown(quiet)
    busy = [dataclasses.replace(r, samples_cpu=[0.5 if i == 1 else 1.0]) for i, r in enumerate(report.results)]
    md = bench.format_markdown(dataclasses.replace(report, results=busy))
    assert "shared machine: tg4 at 1 t got 50 %" in md

"""`numawb probe` and `numawb advise`: the probe on this machine and its cache, the JSON the
app and scripts read, fixture machines, and one-line errors for user mistakes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench.advisor import engine_cal
from workbench.advisor.probe import MemoryProfile, cache_path, machine_profile, probe
from workbench.advisor.synthetic import qwq_32b
from workbench.numa.topology import load_topology


def numawb(*args: str, cache: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("xdg-cache"))


def test_probe_measures_every_pair_and_reports_progress():
    topo = load_topology()
    seen = []
    prof = probe(topo, size_mb=64, reps=1, progress=lambda d, t, m: seen.append((d, t, m)))
    assert prof.source == "probed" and prof.date
    for i in topo.cpu_node_ids:
        for j in prof.nodes:
            assert prof.bandwidth[i][j] > 0
            assert prof.latency_ns[i][j] > 0
        assert [t for t, _ in prof.scaling[i]][0] == 1
    assert seen and seen[-1][0] == seen[-1][1]  # done == total at the end
    again = MemoryProfile.from_json(json.loads(json.dumps(prof.to_json())))
    assert again.bandwidth == prof.bandwidth and again.scaling == prof.scaling


def test_probe_cli_caches_per_machine(cache):
    r = numawb("probe", "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    assert first["cached"] is False and os.path.isfile(first["cache_file"])
    assert first["cache_file"].startswith(cache + "/numawb/")
    r = numawb("probe", "--json", cache=cache)
    second = json.loads(r.stdout)
    assert second["cached"] is True and second["date"] == first["date"]
    r = numawb("probe", "--refresh", cache=cache)
    assert r.returncode == 0 and "read bandwidth" in r.stdout and "saved:" in r.stdout


def test_engine_constants_are_measured_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    topo = load_topology()
    prof, _ = machine_profile(topo)
    assert engine_cal.ensure_engine(prof, {8: 512}, "llama", [1]) is True
    a, b = prof.engine["overhead"]["llama"]["1"]
    assert a >= 0 and b >= 0 and a + b > 0
    k = prof.engine["kernels"]["1"]["Q8_0@512"]  # per thread count, then type and row length
    assert k["decode_bytes_per_s"] > 0 and k["prompt_flops_per_s"] > 0
    assert engine_cal.ensure_engine(prof, {8: 512}, "llama", [1]) is False  # nothing left to measure
    prof.engine["kernels_revision"] = "older"   # measured on other kernels' sources: measured again
    assert engine_cal.ensure_engine(prof, {8: 512}, "llama", [1]) is True
    assert prof.engine["kernels_revision"] == engine_cal.kernels_revision()


def test_advise_json_on_this_machine(cache):
    r = numawb("advise", "--no-measure", "--json", "-c", "1024", cache=cache)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["candidates"] and isinstance(d["recommended"], int)
    for c in d["candidates"]:
        assert {"weights", "kv", "threads", "predicted_decode_tps", "predicted_prompt_tps", "bytes_per_token",
                "memory_per_node", "fits"} <= set(c)
        assert c["predicted_decode_tps"] > 0
    assert d["machine"]["simulated"] is False and d["machine"]["profile_source"] == "probed"


def test_advise_table_on_a_fixture_machine(tmp_path, cache):
    p = tmp_path / "qwq.gguf"
    qwq_32b(p)
    r = numawb("advise", "-m", str(p), "--topology", "epyc-9275f-2s", cache=cache)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    marked = [ln for ln in lines if ln.startswith("| * ")]
    assert len(marked) == 1
    assert any(ln.startswith("recommended: ") and "fits" in ln for ln in lines)
    assert "SIMULATED epyc-9275f-2s" in r.stdout and "published" in r.stdout


@pytest.mark.parametrize("args, match", [
    (["advise", "-m", "/nonexistent.gguf", "--topology", "epyc-2socket"], "no such file"),
    (["advise", "--topology", "nope"], "neither a directory nor a known fixture"),
    (["advise", "-c", "0", "--topology", "epyc-2socket"], "context must be >= 1"),
    (["advise", "--weights", "bogus", "--topology", "epyc-2socket"], "unknown weights mode"),
    (["advise", "--kv", "node:7", "--topology", "epyc-2socket"], "no node 7"),
    (["advise", "-t", "0", "--topology", "epyc-2socket"], "-t"),
    (["advise", "-d", "8192", "-c", "4096", "--topology", "epyc-2socket"], "below the context size"),
    (["probe", "--topology", "nope"], "neither a directory"),
])
def test_user_mistakes_are_one_line(args, match, cache):
    r = numawb(*args, cache=cache)
    assert r.returncode == 2
    err = r.stderr.strip()
    assert "\n" not in err and err.startswith("numawb: error:") and match in err
    assert "Traceback" not in r.stderr


def test_cache_key_depends_on_the_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from workbench.numa.topology import fixture_path
    a = cache_path(load_topology(fixture_path("epyc-2socket")))
    b = cache_path(load_topology(fixture_path("epyc-9275f-2s")))
    assert a != b and a.parent == b.parent == tmp_path / "numawb"


def test_probe_stream_read_reads_every_word():
    """The probe's streaming read (32-byte vector loads, four XOR chains, the words past the last
    whole 128 bytes one by one) folds every word of its input: its XOR equals numpy's, whatever the
    length, so no load is left out (or optimised away)."""
    import numpy as np
    from workbench.advisor._kernels import stream_read
    rng = np.random.default_rng(3)
    for n in (0, 1, 15, 16, 17, 1000, 4099):
        a = rng.integers(0, 1 << 63, n, dtype=np.uint64)
        assert stream_read(a) == np.bitwise_xor.reduce(a, initial=np.uint64(0)), n
        if n:
            b = a.copy()
            b[n // 2] ^= np.uint64(1 << 40)   # any one word changed changes the fold
            assert stream_read(b) != stream_read(a), n


@pytest.mark.parametrize("repack", ["0", ""])
def test_kernel_rates_are_measured_on_the_layout_the_engine_uses(repack, monkeypatch):
    """Where the engine keeps Q5_0 matrices in row pairs (AVX-512 VNNI), the advisor times those
    kernels; with packing off (NUMAWB_REPACK=0), the file layout's."""
    from workbench.engine import kernels as K
    from workbench.engine import packing
    monkeypatch.setattr(packing, "REPACK", repack)
    seen = set()
    real_mv, real_mm = K.matvec, K.matmat
    monkeypatch.setattr(K, "matvec", lambda t, *a: (seen.add(t), real_mv(t, *a))[1])
    monkeypatch.setattr(K, "matmat", lambda t, *a: (seen.add(t), real_mm(t, *a))[1])
    rates = engine_cal.measure_kernel(K.Q5_0, threads=1, k=256)
    packed = K.packed_type(K.Q5_0) if repack == "" and packing.enabled() else None
    assert seen == {packed or K.Q5_0}
    assert all(v > 0 for v in rates.values())

"""The command line: JSON output, topology views, and one-line errors (no traceback) for user mistakes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as T

from gguf_factory import TinySpec, write_tiny_model


def numawb(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3", qtype=T.Q8_0, n_layer=1))
    return str(path)


def test_generate_json(tiny):
    r = numawb("generate", "-m", tiny, "-p", "the cat", "-n", "5", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"prompt_tokens", "tokens", "text", "prompt_tps", "decode_tps"}
    assert out["prompt_tokens"][0] == 2 and 1 <= len(out["tokens"]) <= 5
    assert out["decode_tps"] >= 0


def test_generate_text_ends_with_rates(tiny):
    r = numawb("generate", "-m", tiny, "-p", "the cat", "-n", "3", "--temp", "0", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("prompt:")
    assert "decode:" in r.stdout and "t/s" in r.stdout


def test_placement_json_proves_pages(tiny):
    r = numawb("placement", "-m", tiny, "--weights", "mirror", "--kv", "first-touch", "-n", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["weights_mode"] == "mirror" and out["workers"]
    node0 = out["nodes"]["0"]
    assert node0["weights_bytes"] > 0 and node0["kv_bytes"] > 0
    assert node0["weights_share_in_place"] >= 0.99 and node0["kv_share_in_place"] >= 0.99
    w0, rest = out["workers"][0], out["workers"][1:]
    assert w0["thread"] == "caller" and w0["node"] == w0["wanted_node"]  # where worker 0's share runs
    assert all(w["thread"] == "pool" for w in rest)
    assert out["placement"]["weights"] == "mirror" and out["placement"]["threads"] == len(out["workers"])


@pytest.mark.parametrize("fixture, nodes", [("xeon-8node-smt", 8), ("epyc-2socket", 2), ("cxl-memory-only", 2)])
def test_topo_on_fixture_trees(fixture, nodes):
    r = numawb("topo", "--root", fixture, "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["nodes"]) == nodes
    text = numawb("topo", "--root", fixture).stdout
    assert text.startswith(f"available: {nodes} nodes")


@pytest.mark.parametrize("args, message", [
    (["generate", "-m", "/nonexistent.gguf", "-p", "hi"], "no such file"),
    (["generate", "-m", "/", "-p", "hi"], "is a directory"),
    (["generate", "-m", "/etc/hostname", "-p", "hi"], "not a GGUF file"),
    (["generate", "-p", "hi", "--top-p", "2"], "top-p must be in (0, 1]"),
    (["generate", "-p", "hi", "--weights", "everywhere"], "unknown weights mode"),
    (["generate", "-p", "hi", "--kv", "node:99"], "no node 99"),
    (["generate", "-p", "hi", "--cpus", "a-b"], "not a CPU list"),
    (["perplexity", "-f", "/nonexistent.txt"], "No such file"),
    (["topo", "--root", "no-such-fixture"], "neither a directory nor a known fixture"),
])
def test_user_errors_are_one_line(args, message):
    r = numawb(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("numawb: error:") and message in lines[0], r.stderr


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 128 + 15)])
def test_signals_end_generation_cleanly(tmp_path, sig, code):
    import signal
    import time
    path = tmp_path / "long.gguf"
    write_tiny_model(path, TinySpec(arch="llama", qtype=T.Q8_0, n_layer=1, n_ctx=1 << 16))
    # the child starts with SIGINT at its default, as from a terminal: a test run started as a
    # background job of a non-interactive shell (`pytest &`) has SIGINT ignored, children inherit
    # that, and Python then installs no KeyboardInterrupt handler (generation ran on past it)
    p = subprocess.Popen([sys.executable, "-m", "workbench", "generate", "-m", str(path), "-p", "the cat",
                          "-n", "60000", "-c", "65536", "--temp", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = p.stdout.read(1)  # generation has started
        assert first != ""
        time.sleep(0.3)
        p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == code
    assert "Traceback" not in err


def test_signal_wrapped_by_a_compiled_call_is_found():
    """A signal's exception raised during a Numba call surfaces as SystemError with it as cause."""
    from workbench.cli import _signal_exception
    for sig in (KeyboardInterrupt(), SystemExit(143)):
        try:
            try:
                raise sig
            except BaseException as inner:
                raise SystemError("CPUDispatcher(...) returned a result with an exception set") from inner
        except SystemError as e:
            assert _signal_exception(e) is sig
    assert _signal_exception(SystemError("unrelated")) is None


# ---- options on either side of the subcommand (issue 10, bug 1) ----------------------------

def placement_reached(tiny: str, *args: str) -> dict:
    """The placement the engine ran with, from `generate --json`."""
    r = numawb(*args, timeout=900)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["placement"]


def test_placement_options_before_the_subcommand_reach_the_engine(tiny):
    got = placement_reached(tiny, "-t", "1", "--weights", "mirror", "--kv", "interleave", "--cpus", "1",
                            "generate", "-m", tiny, "-p", "the cat", "-n", "1", "--temp", "0", "--json")
    assert (got["weights"], got["kv"], got["threads"], got["cpus"]) == ("mirror", "interleave", 1, [1])


def test_placement_options_after_the_subcommand_reach_the_engine(tiny):
    got = placement_reached(tiny, "-m", tiny, "generate", "-p", "the cat", "-n", "1", "--temp", "0", "--json",
                            "-t", "1", "--weights", "interleave", "--cpus", "0")
    assert (got["weights"], got["kv"], got["threads"], got["cpus"]) == ("interleave", "first-touch", 1, [0])


@pytest.mark.parametrize("argv, expect", [
    ("-t 2 --weights mirror generate -p hi", {"threads": "2", "weights": "mirror", "kv": "first-touch"}),
    ("generate -p hi -t 2 --weights mirror", {"threads": "2", "weights": "mirror", "kv": "first-touch"}),
    ("--kv interleave -m a.gguf generate --weights slice -p hi",
     {"kv": "interleave", "model": "a.gguf", "weights": "slice", "threads": None}),
    ("--smt --numa isolate --cpus 0-3 perplexity -f x",
     {"smt": True, "numa": "isolate", "cpus": "0-3", "weights": "none"}),
    ("-t 2 generate -t 3 -p hi", {"threads": "3"}),  # given twice: the last one, as argparse does
    ("-t 1,2 --weights all bench", {"threads": "1,2", "weights": "all", "kv": "first-touch"}),
    ("bench --kv all", {"threads": None, "weights": "none", "kv": "all"}),
    ("--weights auto -t 4", {"cmd": None, "weights": "auto", "threads": "4", "numa": "distribute"}),
    ("--hugepages 2M placement", {"hugepages": "2M", "prompt": "The capital of France is"}),
])
def test_every_option_is_read_on_either_side(argv, expect):
    from workbench.cli import parse_args
    args = vars(parse_args(argv.split()))
    assert {k: args[k] for k in expect} == expect


def test_the_placement_built_from_either_side_is_the_same():
    from workbench.cli import build_placement, parse_args
    before = build_placement(parse_args("-t 2 --weights mirror --kv interleave --smt generate -p hi".split()))
    after = build_placement(parse_args("generate -p hi -t 2 --weights mirror --kv interleave --smt".split()))
    assert before == after
    assert (before.threads, before.weights, before.kv, before.smt) == (2, "mirror", "interleave", True)


@pytest.mark.parametrize("args, message", [
    (["-t", "2", "topo"], "-t/--threads does not apply to 'numawb topo'"),
    (["--numa", "isolate", "bench"], "--numa does not apply to 'numawb bench'"),
    (["--record", "out", "generate", "-p", "hi"], "--record is an option of the app"),
    (["generate", "-p", "hi", "--replay", "x.jsonl"], "--replay is an option of the app"),
    (["-n", "5", "generate", "-p", "hi"], "-n is an option of generate / placement / bench: put it after"),
    (["--temp", "0", "generate", "-p", "hi"], "--temp is an option of generate: put it after"),
    (["--json", "topo"], "--json is an option of"),
    (["--script", "s.txt"], "--script needs --record DIR"),
    (["-t", "x", "generate", "-p", "hi"], "-t must be a whole number >= 1 (got 'x')"),
    (["generate", "-p", "hi", "-t", "0"], "-t must be >= 1 (got 0)"),
    (["--replay", "/nonexistent/events.jsonl"], "no such recording"),
    (["topo", "--bogus"], "unrecognized arguments: --bogus"),
    (["topo", "-t", "2"], "-t does not apply to 'numawb topo'"),
    (["bench", "--smt"], "--smt does not apply to 'numawb bench'"),
])
def test_misplaced_options_are_refused_in_one_line(args, message):
    r = numawb(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and message in lines[0], r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("fixture", ["xeon-8node-smt", "cxl-memory-only"])  # long output, short output
def test_a_closed_pipe_is_not_a_traceback(fixture):
    """`numawb topo | head -1`: the reader goes away early; numawb ends quietly."""
    p = subprocess.Popen([sys.executable, "-m", "workbench", "topo", "--root", fixture],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # nobody reads: the first write fails with EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err, err


# ---- topo and --help stay light (issue 10, structure 2) --------------------------------------

@pytest.mark.parametrize("argv", [["topo"], ["topo", "--json"], ["topo", "--root", "epyc-2socket"], ["--help"],
                                  ["generate", "--help"]])
def test_topo_and_help_load_neither_numba_nor_the_kernels(argv):
    probe = ("import json, sys\nfrom workbench.cli import main\n"
             "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
             "print(json.dumps([rc, sorted(sys.modules)]), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=300)
    rc, mods = json.loads(r.stderr.strip().splitlines()[-1])
    assert rc in (0, None), r.stderr
    assert [m for m in mods if m == "numba" or m.startswith("numba.")] == []
    assert [m for m in mods if m.startswith("workbench.engine")] == []
    assert [m for m in mods if m == "textual" or m.startswith("textual.")] == []


def test_generate_ignore_eos_keeps_going(tmp_path):
    """--ignore-eos (llama.cpp's flag) generates the whole budget through end-of-generation tokens:
    a model whose greedy first token is made its EOS stops at once without it."""
    spec = TinySpec(arch="qwen3", qtype=T.Q8_0, n_layer=1)
    probe = tmp_path / "probe.gguf"
    write_tiny_model(probe, spec)
    r = numawb("generate", "-m", str(probe), "-p", "the cat", "-n", "1", "--temp", "0", "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)["tokens"][0]
    path = tmp_path / "eos.gguf"
    write_tiny_model(path, TinySpec(arch="qwen3", qtype=T.Q8_0, n_layer=1, eos_id=first))
    args = ("generate", "-m", str(path), "-p", "the cat", "-n", "6", "--temp", "0", "-t", "1", "--json")
    stopped = json.loads(numawb(*args).stdout)
    assert stopped["stop_reason"] == "eos" and len(stopped["tokens"]) <= 1
    r = numawb(*args, "--ignore-eos")
    assert r.returncode == 0, r.stderr
    kept = json.loads(r.stdout)
    assert kept["stop_reason"] == "length" and len(kept["tokens"]) == 6 and kept["tokens"][0] == first

"""The `numawb` command line: the app by default, plus generate/perplexity/topo/placement/bench."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Sequence

from .numa.modes import KV_MODE_HELP, WEIGHT_MODE_HELP


class UserError(Exception):
    """A mistake in the user's input: reported as one line, exit status 2."""


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", metavar="PATH", help="GGUF model file (default: Gemma 3 270M Q4_K_M)")
    p.add_argument("-t", "--threads", type=int, default=None, help="worker threads (default: all cores given)")
    p.add_argument("--weights", default="none", metavar="MODE",
                   help="weight placement: " + WEIGHT_MODE_HELP + " (default: none)")
    p.add_argument("--kv", default="first-touch", metavar="MODE",
                   help="KV cache placement: " + KV_MODE_HELP + " (default: first-touch)")
    p.add_argument("--numa", default="distribute", choices=["distribute", "isolate"],
                   help="worker spread: over all nodes, or on one node (default: distribute)")
    p.add_argument("--cpus", metavar="LIST", help="pin workers to these CPUs, e.g. 0-7,16-23")
    p.add_argument("--smt", action="store_true", help="use SMT siblings too (default: physical cores only)")
    p.add_argument("--hugepages", choices=["2M", "1G"],
                   help="explicit hugetlbfs pages for weights and KV (checked per node before allocating; "
                        "released at exit). Default: transparent huge pages")
    p.add_argument("--no-numa-balancing", action="store_true",
                   help="turn the kernel's automatic NUMA balancing off for this run (root; restored at exit)")
    p.add_argument("--drop-caches", action="store_true",
                   help="drop the page cache before loading, for a cold load (root)")


def _placement(args: argparse.Namespace):
    from .engine.engine import Placement
    from .numa.modes import ModeError, parse_kv, parse_weights
    from .numa.topology import parse_cpulist
    try:
        parse_weights(args.weights)
        parse_kv(args.kv)
        if args.kv.startswith("node:"):
            from .numa.topology import load_topology
            parse_kv(args.kv, load_topology().node_ids)
    except ModeError as e:
        raise UserError(str(e)) from None
    if args.threads is not None and args.threads < 1:
        raise UserError(f"-t must be >= 1 (got {args.threads})")
    try:
        cpus = parse_cpulist(args.cpus) if args.cpus else None
    except ValueError:
        raise UserError(f"--cpus {args.cpus!r} is not a CPU list like 0-7,16") from None
    return Placement(weights=args.weights, kv=args.kv, threads=args.threads, policy=args.numa,
                     cpus=cpus, smt=args.smt,
                     hugepages_kb={"2M": 2048, "1G": 1 << 20}.get(getattr(args, "hugepages", None) or ""))


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size in tokens")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="numawb", description="NUMA workbench for GGUF language models on CPUs")
    ap.add_argument("--record", metavar="DIR", help="run a scripted session headless and record it")
    ap.add_argument("--script", metavar="FILE", help="session script for --record")
    ap.add_argument("--replay", metavar="FILE", help="show a recorded events.jsonl in the dashboard")
    ap.add_argument("--simulate-topology", metavar="FIXTURE", help="show a fixture topology (simulated)")
    ap.add_argument("--new-chat", action="store_true", help="start a fresh conversation")
    ap.add_argument("--theme", metavar="NAME", help="app theme from themes/ (saved for next time)")
    _add_model(ap)
    sub = ap.add_subparsers(dest="cmd")

    g = sub.add_parser("generate", help="complete a prompt")
    _add_model(g)
    g.add_argument("-p", "--prompt", required=True)
    _add_sampling(g)
    g.add_argument("--json", action="store_true", help="print one JSON object")

    pp = sub.add_parser("perplexity", help="llama-perplexity's estimate over a text file")
    _add_model(pp)
    pp.add_argument("-f", "--file", required=True)
    pp.add_argument("--ctx", "-c", type=int, default=512)
    pp.add_argument("--json", action="store_true")

    pl = sub.add_parser("placement", help="load, place, generate a little, and prove where pages and threads are")
    _add_model(pl)
    pl.add_argument("-p", "--prompt", default="The capital of France is")
    pl.add_argument("-n", "--n-predict", type=int, default=8)
    pl.add_argument("--json", action="store_true")

    tp = sub.add_parser("topo", help="NUMA topology, like numactl --hardware")
    tp.add_argument("--root", metavar="PATH_OR_FIXTURE", help="read a sysfs tree or a named fixture")
    tp.add_argument("--json", action="store_true")

    from .bench import add_arguments as _bench_args
    _bench_args(sub.add_parser("bench", help="llama-bench-style throughput per placement mode"))
    from .server import add_arguments as _serve_args
    _serve_args(sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching"))
    from .advisor.cli import add_advise_arguments, add_probe_arguments
    add_probe_arguments(sub.add_parser("probe", help="measure node-to-node memory bandwidth and latency"))
    add_advise_arguments(sub.add_parser("advise", help="predict every placement mode for a model, recommend one"))
    return ap


_guards: list = []  # kept alive for the process: restore system settings at exit


def _system_knobs(args: argparse.Namespace) -> None:
    from .numa.system import disable_numa_balancing, drop_page_cache
    try:
        if getattr(args, "no_numa_balancing", False):
            _guards.append(disable_numa_balancing())
        if getattr(args, "drop_caches", False):
            drop_page_cache()
    except (PermissionError, FileNotFoundError) as e:
        raise UserError(str(e)) from None


def _load_engine(args: argparse.Namespace, quiet: bool = False):
    from .engine import Engine
    from .engine.gguf_file import ModelLoadError
    from .numa.budget import BudgetError

    placement = _placement(args)
    _system_knobs(args)

    def progress(ev) -> None:
        if not quiet and ev.stage == "load" and ev.total and sys.stderr.isatty():
            print(f"\rloading {ev.done / 2**20:8.1f} / {ev.total / 2**20:.1f} MiB "
                  f"({ev.bytes_per_s / 2**20:.0f} MiB/s)", end="", file=sys.stderr)

    try:
        eng = Engine.load(args.model, placement=placement, progress=progress)
    except ModelLoadError as e:
        raise UserError(str(e)) from None
    except BudgetError as e:
        raise UserError("; ".join(line.strip() for line in str(e).splitlines())) from None
    except ValueError as e:  # a placement the machine cannot do (e.g. no such node)
        raise UserError(str(e)) from None
    if not quiet and sys.stderr.isatty():
        print(file=sys.stderr)
    return eng


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine import ContextFullError, DoneEvent, SamplingParams, TokenEvent
    if args.n_predict < 0:
        raise UserError(f"-n must be >= 0 (got {args.n_predict})")
    params = SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repeat_penalty=args.repeat_penalty, seed=args.seed)
    try:
        params.validate()
    except ValueError as e:
        raise UserError(str(e)) from None
    eng = _load_engine(args, quiet=args.json)
    ids = eng.tokenizer.encode(args.prompt, add_bos=None)
    if len(ids) == 0 or (len(ids) == 1 and ids[0] == eng.tokenizer.bos_id and not args.prompt):
        raise UserError("empty prompt: give some text with -p")
    session = eng.new_session(max(args.ctx_size, len(ids) + args.n_predict + 1))
    done = None
    try:
        for ev in session.generate(ids, params, args.n_predict):
            if isinstance(ev, TokenEvent) and not args.json:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, DoneEvent):
                done = ev
    except ContextFullError as e:
        raise UserError(str(e)) from None
    st = done.stats
    if args.json:
        print(json.dumps({"prompt_tokens": ids, "tokens": done.tokens, "text": done.text,
                          "prompt_tps": st.prompt_tps, "decode_tps": st.decode_tps,
                          "ttft": st.ttft, "stop_reason": st.stop_reason}, ensure_ascii=False))
    else:
        print()
        print(f"prompt: {st.prompt_tokens} tokens, {st.prompt_tps:.1f} t/s | "
              f"decode: {st.decode_tokens} tokens, {st.decode_tps:.1f} t/s | ttft {st.ttft * 1000:.0f} ms")
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .engine.perplexity import perplexity
    try:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"{args.file}: {e.strerror}") from None
    eng = _load_engine(args, quiet=args.json)

    def progress(i: int, n: int, ppl: float) -> None:
        if not args.json:
            print(f"[{i}/{n}] {ppl:.4f}", file=sys.stderr)
    try:
        res = perplexity(eng, text, args.ctx, progress)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps({"ppl": res.ppl, "chunks": res.chunks, "n_ctx": res.n_ctx,
                          "scored_tokens": res.scored_tokens, "chunk_ppl": res.chunk_ppl}))
    else:
        print(f"Final estimate: PPL = {res.ppl:.4f} ({res.chunks} chunks of {res.n_ctx} tokens)")
    return 0


def cmd_placement(args: argparse.Namespace) -> int:
    from .engine import SamplingParams
    from .numa.proof import process_numastat, prove
    eng = _load_engine(args, quiet=True)
    ids = eng.tokenizer.encode(args.prompt)
    session = eng.new_session(max(256, len(ids) + args.n_predict + 1))
    done = None
    for ev in session.generate(ids, SamplingParams(temperature=0), args.n_predict):
        done = ev
    buffers = eng.buffers()
    proofs = prove(buffers)
    stat = process_numastat(buffers)
    workers = eng.pool.check()
    nodes = sorted({n for d in stat.values() for n in d} | {w.node for w in workers})
    per_node = {}
    for n in nodes:
        def share(kind: str) -> float | None:
            ps = [p for p in proofs if p.kind == kind and p.present and n in p.intended]
            if not ps:
                return None
            return sum(p.pages_by_node.get(n, 0) for p in ps) / sum(sum(p.pages_by_node.values()) for p in ps)
        per_node[str(n)] = {"weights_bytes": stat["weights"].get(n, 0), "kv_bytes": stat["kv"].get(n, 0),
                            "other_bytes": stat["other"].get(n, 0),
                            "weights_share_in_place": share("weights"), "kv_share_in_place": share("kv")}
    out = {
        "model": eng.path, "weights_mode": eng.placement.weights, "kv_mode": eng.placement.kv,
        "load_seconds": eng.load_seconds, "generated": done.text if done else "",
        "decode_tps": done.stats.decode_tps if done else 0.0,
        "nodes": per_node,
        "buffers": [{"label": p.label, "kind": p.kind, "intended": list(p.intended), "bytes": p.nbytes,
                     "pages_by_node": {str(k): v for k, v in p.pages_by_node.items()},
                     "share_in_place": p.share, "note": p.reason} for p in proofs],
        "workers": [{"index": w.index, "cpu": w.actual_cpu, "node": w.actual_node, "wanted_cpu": w.cpu,
                     "wanted_node": w.node, "misplaced": w.misplaced} for w in workers],
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from .numa.proof import format_proof
        from .numa.views import format_numastat
        print(f"weights {out['weights_mode']}, kv {out['kv_mode']}, loaded in {eng.load_seconds:.2f} s")
        print(format_proof(proofs))
        print(format_numastat(stat))
        for w in out["workers"]:
            flag = "  MISPLACED" if w["misplaced"] else ""
            print(f"worker {w['index']}: cpu {w['cpu']} node {w['node']}{flag}")
    eng.close()
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    from .numa import topology as topo_mod
    from .numa.views import format_topo, topo_json
    root = args.root
    if root and not os.path.isdir(root):
        try:
            root = topo_mod.fixture_path(root)
        except (KeyError, FileNotFoundError, ValueError):
            raise UserError(f"{args.root}: neither a directory nor a known fixture "
                            f"({', '.join(topo_mod.fixture_names())})") from None
    t = topo_mod.load_topology(root)
    from .engine.kernels import kernel_path
    if args.json:
        d = topo_json(t)
        d["kernel_path"] = kernel_path()
        print(json.dumps(d, indent=2))
    else:
        print(format_topo(t))
    return 0


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds: atexit hooks restore system settings, buffers are freed


def _signal_exception(e: BaseException) -> BaseException | None:
    """The KeyboardInterrupt / SystemExit (SIGTERM) behind `e`, if any. A signal's exception raised
    while a compiled (Numba) call ran comes back wrapped in SystemError ("returned a result with
    an exception set"), the signal's exception as its cause."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (KeyboardInterrupt, SystemExit)):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "generate":
            return cmd_generate(args)
        if args.cmd == "perplexity":
            return cmd_perplexity(args)
        if args.cmd == "placement":
            return cmd_placement(args)
        if args.cmd == "topo":
            return cmd_topo(args)
        if args.cmd == "serve":
            from .server import main as serve_main
            return serve_main(args)
        if args.cmd == "bench":
            from .bench import main as bench_main
            try:
                return bench_main(args)
            except ValueError as e:
                raise UserError(str(e)) from None
        if args.cmd in ("probe", "advise"):
            from .advisor.cli import run_advise, run_probe
            try:
                return run_probe(args) if args.cmd == "probe" else run_advise(args)
            except ValueError as e:
                raise UserError(str(e)) from None
        from .app import run_app
        return run_app(args)
    except UserError as e:
        print(f"numawb: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # the NUMA layer's BudgetError: need and free per node, nothing allocated
        print("numawb: error: " + "; ".join(line.strip() for line in str(e).splitlines()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("numawb: interrupted", file=sys.stderr)
        return 130
    except SystemError as e:
        sig = _signal_exception(e)
        if isinstance(sig, KeyboardInterrupt):
            print("numawb: interrupted", file=sys.stderr)
            return 130
        if isinstance(sig, SystemExit):
            return sig.code if isinstance(sig.code, int) else 1
        raise


if __name__ == "__main__":
    sys.exit(main())

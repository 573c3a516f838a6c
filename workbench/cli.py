"""The `numawb` command line, the front door: it parses the request, builds the Placement (with
``workbench.options``, which the services share), and starts a command or the app (nothing below
imports this module).

Every option works before or after the subcommand (``numawb -t 2 generate -p hi`` and
``numawb generate -t 2 -p hi`` are the same request) or is refused with one line: an option
is never silently dropped. User errors (``workbench.errors``) end with one line and status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any, Sequence

from .errors import EXIT_USER_ERROR, UserError, format_error, is_user_error
from .options import (add_model, add_sampling, build_placement, load_engine, print_completion, sampling_params,
                      system_knobs)

#: subcommands that load a model and take every model/placement option
MODEL_COMMANDS = ("generate", "perplexity", "placement")
#: options of the app alone (no subcommand), by dest
APP_ONLY = ("record", "script", "replay", "simulate_topology", "new_chat", "theme", "serve")


class _Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors (no usage block)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.refuse(f"{message} (see {self.prog} --help)")

    def refuse(self, message: str) -> None:
        """Print ``<prog>: error: message`` and exit with status 2."""
        print(format_error(message, self.prog), file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


class _Refuse(argparse.Action):
    """An option that belongs elsewhere: refused with a line saying where it goes."""

    def __init__(self, option_strings: list[str], dest: str, where: str = "", **kw: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.where = where

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        assert isinstance(parser, _Parser)
        parser.refuse(f"{option_string} {self.where}")


def _option_actions(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.dest not in ("help", argparse.SUPPRESS)]


def _flag(a: argparse.Action) -> str:
    return "/".join(a.option_strings)


class CommandLine:
    """The parser plus what it needs to resolve options given on either side of the subcommand.

    Options the app and a subcommand share (model and placement) are defined on both parsers
    with no default: whichever side gives one wins, and the defaults are filled in afterwards
    from the parser of the command that runs. An option the running command does not take is
    refused, wherever it was given.
    """

    def __init__(self) -> None:
        ap = _Parser(prog="numawb", description="NUMA workbench for GGUF language models on CPUs")
        ap.add_argument("--record", metavar="DIR", help="run a scripted session headless and record it")
        ap.add_argument("--script", metavar="FILE", help="session script for --record")
        ap.add_argument("--replay", metavar="FILE", help="show a recorded events.jsonl in the dashboard")
        ap.add_argument("--simulate-topology", metavar="FIXTURE", help="show a fixture topology (simulated)")
        ap.add_argument("--new-chat", action="store_true", help="start a fresh conversation")
        ap.add_argument("--theme", metavar="NAME", help="app theme from themes/ (saved for next time)")
        ap.add_argument("--serve", nargs="?", const=8080, type=int, metavar="PORT",
                        help="also serve the loaded model (OpenAI API) on 127.0.0.1:PORT (default 8080; 0: any "
                             "free port) and show its requests in the dashboard")
        add_model(ap)
        from .cluster.cli import add_ray_argument as _ray_args
        _ray_args(ap)  # the app over a Ray cluster too (shared with the commands that take --ray)
        sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")

        g = sub.add_parser("generate", help="complete a prompt")
        add_model(g)
        g.add_argument("-p", "--prompt", required=True)
        add_sampling(g)
        g.add_argument("--ignore-eos", action="store_true",
                       help="keep generating past end-of-generation tokens (as llama.cpp's --ignore-eos)")
        g.add_argument("--json", action="store_true", help="print one JSON object")

        pp = sub.add_parser("perplexity", help="llama-perplexity's estimate over a text file")
        add_model(pp)
        pp.add_argument("-f", "--file", required=True)
        pp.add_argument("--ctx", "-c", type=int, default=512)
        pp.add_argument("--json", action="store_true")

        pl = sub.add_parser("placement", help="load, place, generate a little, and prove where pages and threads are")
        add_model(pl)
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
        add_advise_arguments(sub.add_parser("advise", help="predict every placement mode for a model, "
                                                           "recommend one"))
        from .models_store import add_arguments as _pull_args  # numawb pull [NAME]: fetch an instruct model
        _pull_args(sub.add_parser("pull", help="fetch an instruct model (SmolLM2-135M-Instruct) for the app "
                                               "and serve"))

        self.parser = ap
        self.commands: dict[str, argparse.ArgumentParser] = dict(sub.choices)
        from .cluster.cli import RAY_COMMANDS, add_ray_argument  # --ray ADDRESS: over a Ray cluster
        for name in RAY_COMMANDS:
            add_ray_argument(self.commands[name])
        top_shared = {a.dest for a in _option_actions(ap)} - set(APP_ONLY)
        #: per command (None: the app), the defaults of the shared options it takes
        self.defaults: dict[str | None, dict[str, Any]] = {}
        #: flag text per dest, for messages
        self.flags: dict[str, str] = {a.dest: _flag(a) for a in _option_actions(ap)}
        for name, p in [(None, ap), *self.commands.items()]:
            self.defaults[name] = {}
            for a in _option_actions(p):
                if a.dest in top_shared:
                    self.defaults[name][a.dest] = a.default
                    a.default = argparse.SUPPRESS  # absent unless given, on whichever side
        # an option of a subcommand given before it, or an app option given after one: one line
        owners: dict[str, list[str]] = {}
        for name, p in self.commands.items():
            for a in _option_actions(p):
                if a.dest not in top_shared:
                    for s in a.option_strings:
                        owners.setdefault(s, []).append(name)
        for s, names in owners.items():
            ap.add_argument(s, action=_Refuse,
                            where=f"is an option of {' / '.join(names)}: put it after the subcommand "
                                  f"(numawb {names[0]} {s} ...)")
        app_flags = [s for a in _option_actions(ap) if a.dest in APP_ONLY for s in a.option_strings]
        shared_flags = {a.dest: a.option_strings for a in _option_actions(ap) if a.dest in top_shared}
        for name, p in self.commands.items():
            for s in app_flags:
                p.add_argument(s, action=_Refuse,
                               where=f"is an option of the app (numawb without a subcommand), not of {name}")
            for d, strings in shared_flags.items():
                if d not in self.defaults[name]:  # e.g. -t after topo: the same line as before it
                    p.add_argument(*strings, action=_Refuse, where=f"does not apply to 'numawb {name}'")

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """Parse ``argv``; refuse (one line, exit 2) what the chosen command does not take."""
        args = self.parser.parse_args(argv)
        cmd = args.cmd
        taken = self.defaults[cmd]
        given_shared = [d for d in self.defaults[None] if hasattr(args, d)]
        for d in given_shared:
            if d not in taken:
                self.parser.refuse(f"{self.flags[d]} does not apply to 'numawb {cmd}'")
        if cmd is not None:
            for d in APP_ONLY:
                if getattr(args, d, None) not in (None, False):
                    self.parser.refuse(f"{self.flags[d]} is an option of the app (numawb without a "
                                      f"subcommand), not of {cmd}")
        for d, default in taken.items():
            if not hasattr(args, d):
                setattr(args, d, default)
        return args


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The request on the command line, with every option resolved (see `CommandLine`)."""
    return CommandLine().parse(argv)


def placement_json(eng: Any) -> dict[str, Any]:
    """The placement in force, as the engine received it (threads: the workers it started)."""
    p = eng.placement
    return {"weights": p.weights, "kv": p.kv, "threads": eng.pool.n_threads, "policy": p.policy,
            "smt": p.smt, "cpus": [w.cpu for w in eng.pool.workers], "hugepages_kb": p.hugepages_kb}


def cmd_generate(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    eng = load_engine(args, quiet=args.json)
    ids = eng.tokenizer.encode(args.prompt, add_bos=None)
    if len(ids) == 0 or (len(ids) == 1 and ids[0] == eng.tokenizer.bos_id and not args.prompt):
        raise UserError("empty prompt: give some text with -p")
    session = eng.new_session(max(args.ctx_size, len(ids) + args.n_predict + 1))
    if args.n_predict > 1:  # a first start compiles the decoded tokens' call while the prompt runs
        compile_ = session.decoding_compile()
        if compile_ is not None:
            threading.Thread(target=compile_, name="numawb-decode-compile", daemon=True).start()
    events = session.generate(ids, params, args.n_predict, stop_ids=set() if args.ignore_eos else None)
    return print_completion(args, ids, events, lambda: {"placement": placement_json(eng)})


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .engine.perplexity import perplexity
    try:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"{args.file}: {e.strerror}") from None
    eng = load_engine(args, quiet=args.json)

    def progress(i: int, n: int, ppl: float) -> None:
        if not args.json:
            print(f"[{i}/{n}] {ppl:.4f}", file=sys.stderr)
    try:
        res = perplexity(eng, text, args.ctx, progress)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps({"ppl": res.ppl, "chunks": res.chunks, "n_ctx": res.n_ctx,
                          "scored_tokens": res.scored_tokens, "chunk_ppl": res.chunk_ppl,
                          "placement": placement_json(eng)}))
    else:
        print(f"Final estimate: PPL = {res.ppl:.4f} ({res.chunks} chunks of {res.n_ctx} tokens)")
    return 0


def _caller_location(pool: Any) -> tuple[int | None, int | None]:
    """Where worker 0's share runs: on the calling thread, which the engine pins to worker 0's
    node for each pass (``WorkerPool.lead``) when there are several workers; asked with getcpu."""
    from .numa import syscalls as sc

    def here() -> tuple[int | None, int | None]:
        r = sc.getcpu()
        return tuple(r.value) if r else (None, None)  # type: ignore[return-value]
    if pool.n_threads > 1:
        with pool.lead():
            return here()
    return here()


def cmd_placement(args: argparse.Namespace) -> int:
    from .engine import SamplingParams
    from .numa.proof import process_numastat, prove
    eng = load_engine(args, quiet=True)
    ids = eng.tokenizer.encode(args.prompt)
    session = eng.new_session(max(256, len(ids) + args.n_predict + 1))
    done = None
    for ev in session.generate(ids, SamplingParams(temperature=0), args.n_predict):
        done = ev
    buffers = eng.buffers()
    proofs = prove(buffers)
    stat = process_numastat(buffers)
    workers = eng.pool.check()
    lead_cpu, lead_node = _caller_location(eng.pool)
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

    def worker_row(w: Any) -> dict[str, Any]:
        if w.index == 0:  # its share runs on the calling thread, not on the pool's thread 0
            return {"index": 0, "thread": "caller", "cpu": lead_cpu, "node": lead_node, "wanted_cpu": w.cpu,
                    "wanted_node": w.node, "misplaced": lead_node is not None and lead_node != w.node}
        return {"index": w.index, "thread": "pool", "cpu": w.actual_cpu, "node": w.actual_node,
                "wanted_cpu": w.cpu, "wanted_node": w.node, "misplaced": w.misplaced}
    out = {
        "model": eng.path, "weights_mode": eng.placement.weights, "kv_mode": eng.placement.kv,
        "placement": placement_json(eng),
        "load_seconds": eng.load_seconds, "generated": done.text if done else "",
        "decode_tps": done.stats.decode_tps if done else 0.0,
        "nodes": per_node,
        "buffers": [{"label": p.label, "kind": p.kind, "intended": list(p.intended), "bytes": p.nbytes,
                     "pages_by_node": {str(k): v for k, v in p.pages_by_node.items()},
                     "share_in_place": p.share, "note": p.reason} for p in proofs],
        "workers": [worker_row(w) for w in workers],
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
            who = " (calling thread)" if w["thread"] == "caller" else ""
            print(f"worker {w['index']}: cpu {w['cpu']} node {w['node']}{who}{flag}")
    eng.close()
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    """The machine's NUMA layout; reads sysfs only (no model, no compiled kernels)."""
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
    if args.json:
        print(json.dumps(topo_json(t), indent=2))
    else:
        print(format_topo(t))
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    """The workbench app (``--record``: headless and scripted; ``--replay``: a recording)."""
    simulate = args.simulate_topology
    if simulate:
        from .numa.topology import fixture_names
        if simulate not in fixture_names():
            raise UserError(f"{simulate}: not a known topology fixture ({', '.join(fixture_names())})")
    if args.script and not args.record:
        raise UserError("--script needs --record DIR")
    if args.record and args.replay:
        raise UserError("--record and --replay cannot be used together")
    if args.serve is not None and not 0 <= args.serve < 65536:
        raise UserError(f"--serve: the port must be in 0..65535 (got {args.serve})")
    if args.serve is not None and args.replay:
        raise UserError("--serve and --replay cannot be used together (a replay has no model)")
    ray = getattr(args, "ray", None)
    if ray:
        from .cluster import require_ray
        require_ray()
        for flag, given in (("--replay", args.replay), ("--record", args.record), ("--simulate-topology", simulate)):
            if given:
                raise UserError(f"--ray and {flag} cannot be used together")
    recording = None
    if args.replay:
        from .replay import Recording
        recording = Recording.load(args.replay)
    placement = build_placement(args)
    system_knobs(args)
    if args.record:
        from .record import run_record
        return run_record(args.record, script=args.script, model=args.model, placement=placement,
                          simulate=simulate, serve=args.serve)
    from .app import WorkbenchApp
    history = None
    if recording is None:
        from .history import ChatHistory
        history = ChatHistory.default()
        if args.new_chat:
            history.start_new()
    app = WorkbenchApp(args.model, placement=placement, simulate=simulate, replay=recording,
                       theme=args.theme, autoload=recording is None, history=history, serve=args.serve, ray=ray,
                       ray_timeout=getattr(args, "ray_timeout", None))
    app.run()
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


def run(args: argparse.Namespace) -> int:
    """Run a parsed request (errors propagate; `main` turns them into one line)."""
    if getattr(args, "ray", None) and args.cmd is not None:
        from .cluster.cli import run_ray
        return run_ray(args)
    if args.cmd == "generate":
        return cmd_generate(args)
    if args.cmd == "perplexity":
        return cmd_perplexity(args)
    if args.cmd == "placement":
        return cmd_placement(args)
    if args.cmd == "topo":
        return cmd_topo(args)
    if args.cmd == "bench":
        from .bench import main as bench_main
        try:
            return bench_main(args)
        except ValueError as e:
            raise UserError(str(e)) from None
    if args.cmd == "serve":
        from .server import main as serve_main
        return serve_main(args)
    if args.cmd in ("probe", "advise"):
        from .advisor.cli import run_advise, run_probe
        try:
            return run_probe(args) if args.cmd == "probe" else run_advise(args)
        except ValueError as e:
            raise UserError(str(e)) from None
    if args.cmd == "pull":
        from .models_store import main as pull_main
        return pull_main(args)
    return cmd_app(args)


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    args = parse_args(argv)
    try:
        rc = run(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return rc
    except KeyboardInterrupt:
        print("numawb: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `numawb topo | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 0
    except SystemError as e:
        sig = _signal_exception(e)
        if isinstance(sig, KeyboardInterrupt):
            print("numawb: interrupted", file=sys.stderr)
            return 130
        if isinstance(sig, SystemExit):
            return sig.code if isinstance(sig.code, int) else 1
        raise
    except Exception as e:
        if is_user_error(e):  # UserError, and the NUMA layer's ModeError / BudgetError
            print(format_error(e), file=sys.stderr)
            return EXIT_USER_ERROR
        raise


if __name__ == "__main__":
    sys.exit(main())

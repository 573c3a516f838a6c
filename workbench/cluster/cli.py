"""`--ray ADDRESS` for numawb generate / bench / placement / serve: the same commands over a Ray cluster."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import UserError
from ..options import build_placement, print_completion, sampling_params
from . import ClusterError, require_ray

RAY_COMMANDS = ("generate", "bench", "placement", "serve")


def add_ray_argument(p: argparse.ArgumentParser) -> None:
    """The --ray option of a command that can run over a cluster."""
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="split the model over the nodes of this Ray cluster (host:port, or 'auto'); "
                        "needs pip install -e '.[cluster]'")
    p.add_argument("--ray-timeout", type=float, default=None, metavar="S",
                   help="seconds one pipeline step may take before the request ends (default 600)")


def _placement(args: argparse.Namespace):
    """The placement every host uses for its part (bench: one weights mode, one KV mode, one count)."""
    if args.cmd != "bench":
        return build_placement(args)
    from ..bench import parse_int_list
    from ..engine.engine import Placement
    from ..numa.modes import parse_kv, parse_weights
    if "," in args.weights or "," in args.kv or args.weights == "all" or args.kv == "all":
        raise UserError("bench --ray measures one placement: give one --weights and one --kv mode")
    threads = parse_int_list(args.threads, "-t") if args.threads else [None]
    if len(threads) != 1 or (threads[0] is not None and threads[0] < 1):
        raise UserError("bench --ray measures one thread count per host: give one -t N (N >= 1)")
    return Placement(weights=parse_weights(args.weights), kv=parse_kv(args.kv), threads=threads[0])


def _pipeline(args: argparse.Namespace, n_ctx: int):
    from .pipeline import STEP_TIMEOUT, RayPipeline
    require_ray()
    placement = _placement(args)
    pipe = RayPipeline(args.ray, getattr(args, "model", None), placement, n_ctx=n_ctx,
                       step_timeout=args.ray_timeout or STEP_TIMEOUT)
    if not getattr(args, "json", False) and sys.stderr.isatty():
        print(f"loading over the Ray cluster at {args.ray} ...", file=sys.stderr)
    try:
        pipe.load()
    except ValueError as e:  # ModelLoadError, a placement the hosts cannot do
        raise UserError(str(e)) from None
    return pipe


def _split_line(pipe) -> str:
    return " | ".join(f"{d['host']} layers {d['layers'][0]}..{d['layers'][1] - 1}" for d in pipe.describe())


def cmd_generate(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    if not args.prompt:
        raise UserError("empty prompt: give some text with -p")
    pipe = _pipeline(args, args.ctx_size)
    try:
        ids = pipe.tokenizer.encode(args.prompt, add_bos=None)
        events = pipe.generate(ids, params, args.n_predict, stop_ids=set() if args.ignore_eos else None)
        return print_completion(args, ids, events,
                                lambda: {"hosts": pipe.describe(),
                                         "hidden_bytes_per_token": pipe.hidden_bytes_per_token()},
                                lambda: f" | {_split_line(pipe)}")
    finally:
        pipe.close()


def cmd_placement(args: argparse.Namespace) -> int:
    from ..engine import DoneEvent, SamplingParams
    pipe = _pipeline(args, 256)
    try:
        ids = pipe.tokenizer.encode(args.prompt)
        done = None
        for ev in pipe.generate(ids, SamplingParams(temperature=0), args.n_predict):
            if isinstance(ev, DoneEvent):
                done = ev
        proofs = pipe.proofs()
        if args.json:
            print(json.dumps({"model": pipe.model, "generated": done.text if done else "",
                              "hosts": [dict(d, **{k: v for k, v in p.items() if k not in ("proof", "numastat")})
                                        for d, p in zip(pipe.describe(), proofs)]}, indent=2))
        else:
            print(f"{pipe.model}: {len(proofs)} hosts, layers split by "
                  + ("each host's measured bandwidth (cached probes) within its free memory"
                     if pipe.split_by == "bandwidth" else "free memory"))
            for d, p in zip(pipe.describe(), proofs):
                print(f"host {p['label']}: layers {p['layers'][0]}..{p['layers'][1] - 1}, weights {p['weights_mode']}, "
                      f"kv {p['kv_mode']}, loaded in {p['load_seconds']:.2f} s ({d['path']})")
                for block in (p["proof"], p["numastat"]):
                    for line in block.splitlines():
                        print("  " + line)
                for w in p["workers"]:
                    flag = "  MISPLACED" if w["misplaced"] else ""
                    print(f"  worker {w['index']}: cpu {w['cpu']} node {w['node']}{flag}")
    finally:
        pipe.close()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """pp and tg throughput through the pipeline, llama-bench style (one row per test)."""
    import numpy as np
    from ..bench import parse_int_list
    from ..engine import SamplingParams
    from ..engine.generation import Picker
    n_prompts = [n for n in parse_int_list(args.n_prompt, "-p") if n > 0]
    n_gens = [n for n in parse_int_list(args.n_gen, "-n") if n > 0]
    reps = max(1, args.repetitions)
    need = max(n_prompts + [0]) + max(n_gens + [0]) + 2
    pipe = _pipeline(args, max(need, 256))
    rows = []
    try:
        rng = np.random.default_rng(0)
        vocab = pipe.tokenizer.n_vocab
        greedy = SamplingParams(temperature=0)
        for n in n_prompts:
            ts = []
            for _ in range(reps):
                ids = [int(t) for t in rng.integers(10, vocab, n)]
                pipe.tokens = pipe.tokens[:0]
                t0 = time.perf_counter()
                pipe.eval(ids, Picker(greedy, ids))
                ts.append(n / (time.perf_counter() - t0))
            rows.append({"test": f"pp{n}", "tps": float(np.mean(ts)), "stdev": float(np.std(ts))})
        for n in n_gens:
            ts = []
            for _ in range(reps):
                pipe.tokens = pipe.tokens[:0]
                tok = pipe.eval([int(rng.integers(10, vocab))], Picker(greedy))
                t0 = time.perf_counter()
                for _ in range(n):
                    tok = pipe.next_token(tok)
                ts.append(n / (time.perf_counter() - t0))
            rows.append({"test": f"tg{n}", "tps": float(np.mean(ts)), "stdev": float(np.std(ts))})
        hosts = pipe.describe()
        if getattr(args, "json", False):
            print(json.dumps({"model": pipe.model, "hosts": hosts, "results": rows,
                              "hidden_bytes_per_token": pipe.hidden_bytes_per_token()}))
        else:
            print(f"model {pipe.model} over {len(hosts)} hosts: {_split_line(pipe)}")
            print("| test | t/s |")
            print("| ---: | ---: |")
            for r in rows:
                print(f"| {r['test']} | {r['tps']:.2f} ± {r['stdev']:.2f} |")
    finally:
        pipe.close()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """`numawb serve --ray`: the OpenAI-compatible server over the pipeline; its scheduler's slots
    are request streams on every host, decoded together (one batched pass per host per token)."""
    from ..server.config import ServeOptions
    from ..server.run import serve
    require_ray()
    opts = ServeOptions.from_args(args).check()
    return serve(_pipeline(args, opts.slot_ctx * opts.parallel), opts)


def run_ray(args: argparse.Namespace) -> int:
    """Run a command with --ray over the cluster."""
    cmd = {"generate": cmd_generate, "placement": cmd_placement, "bench": cmd_bench, "serve": cmd_serve}[args.cmd]
    try:
        return cmd(args)
    except ClusterError:
        raise
    except (ConnectionError, TimeoutError) as e:
        raise ClusterError(f"Ray cluster at {args.ray}: {e}") from None


__all__ = ["RAY_COMMANDS", "add_ray_argument", "run_ray"]

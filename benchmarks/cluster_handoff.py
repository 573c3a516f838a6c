"""Per-token hand-off cost between pipeline stages on a local Ray cluster (a benchmark, not a test).

    PYTHONPATH=. python3 benchmarks/cluster_handoff.py [--nodes 2] [-n 200] [--model PATH] [--no-model]

Starts a Ray cluster of `--nodes` nodes on this machine (ray.cluster_utils.Cluster, each node a
separate host to Ray), puts one `StageHost` actor on each node, and measures:

1. transport alone: a one-token pipeline message (token id, or the hidden state of n_embd
   float32) relayed untouched through 1..N stages, by the two mechanisms Ray offers:
   - `calls`: one actor call per stage, each stage's output ref handed to the next stage's call
     (what `RayPipeline` does);
   - `compiled`: a compiled graph (ray.dag ... experimental_compile) over the same actors.
   The cost of one hand-off is the slope of the round trip over the number of stages
   (median of `-n` tokens per point);
2. with the model (default: Gemma 3 270M): decode tokens/s of one process and of the pipeline
   over the nodes, and the time per token the pipeline adds;
3. the bytes per token that cross hosts (hidden state rows, and the pickled message);
4. with the model and `--streams K` (default 4): one pipeline pass carrying K sequences (what
   `numawb serve --ray` does with K busy slots) against K passes of one sequence each, as
   tokens/s over all sequences.

Prints a Markdown table, and JSON with --json. The load average is printed: the figures move
with whatever else the machine runs.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _median_ms(fn, n: int, warm: int = 10) -> float:
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (ms per added stage)."""
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0]) if len(xs) > 1 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3, help="Ray nodes (hosts) to start on this machine")
    ap.add_argument("-n", type=int, default=200, help="tokens per measurement")
    ap.add_argument("--n-embd", type=int, default=640, help="hidden size for the transport test (Gemma 3 270M: 640)")
    ap.add_argument("--model", default=None, help="GGUF for the decode comparison (default: Gemma 3 270M)")
    ap.add_argument("--no-model", action="store_true", help="transport only")
    ap.add_argument("-t", "--threads", type=int, default=1, help="worker threads per host")
    ap.add_argument("--streams", type=int, default=4, help="sequences per pass for the batched measurement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster
    from ray.dag import InputNode
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from workbench.cluster.host import StageHost
    from workbench.cluster.pipeline import alive_nodes

    node = {"num_cpus": 1, "object_store_memory": 100 << 20}
    c = Cluster(initialize_head=True, head_node_args=dict(node, include_dashboard=False))
    for _ in range(args.nodes - 1):
        c.add_node(**node)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level=logging.ERROR, log_to_driver=False)
    res: dict = {"nodes": args.nodes, "tokens": args.n, "load_average": os.getloadavg(), "ray": ray.__version__,
                 "cpus": os.cpu_count()}
    try:
        Actor = ray.remote(num_cpus=0, max_restarts=0)(StageHost)
        actors = [Actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                  .remote(n["NodeID"][:6]) for n in alive_nodes(ray)]
        ray.get([a.ping.remote() for a in actors], timeout=120)
        hidden = np.random.default_rng(0).standard_normal((1, args.n_embd)).astype(np.float32)
        msg = {"rows": [(1, 100, 1)], "x": hidden, "pick": None, "want": True}
        res["message_bytes"] = len(pickle.dumps(msg, protocol=5))
        res["hidden_bytes_per_boundary"] = hidden.nbytes
        stages = list(range(1, len(actors) + 1))

        calls = []
        for k in stages:
            def chain(k=k):
                cur = msg
                for a in actors[:k]:
                    cur = a.relay.remote(cur)
                return ray.get(cur, timeout=60)
            calls.append(_median_ms(chain, args.n))
        res["calls_round_trip_ms"] = dict(zip(map(str, stages), calls))
        res["calls_per_handoff_ms"] = slope(stages, calls)

        compiled = []
        try:
            for k in stages:
                with InputNode() as inp:
                    out = inp
                    for a in actors[:k]:
                        out = a.relay.bind(out)
                dag = out.experimental_compile()
                try:
                    compiled.append(_median_ms(lambda: ray.get(dag.execute(msg), timeout=60), args.n))
                finally:
                    dag.teardown()
            res["compiled_round_trip_ms"] = dict(zip(map(str, stages), compiled))
            res["compiled_per_handoff_ms"] = slope(stages, compiled)
        except Exception as e:  # noqa: BLE001 -- report what this Ray cannot do
            res["compiled_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        for a in actors:
            ray.kill(a)

        if not args.no_model:
            from workbench.cluster.pipeline import RayPipeline
            from workbench.engine import SamplingParams
            from workbench.engine.engine import Engine, Placement, default_model_path
            from workbench.engine.generation import Picker
            path = args.model or default_model_path()
            pl = Placement(threads=args.threads)
            eng = Engine.load(path, placement=pl)
            pipe = RayPipeline(c.address, path, pl, n_ctx=1024)
            try:
                pipe.load()
                res["n_embd"] = eng.cfg.n_embd
                s = eng.new_session(1024)
                greedy = Picker(SamplingParams(temperature=0))
                state = {"tok": pipe.eval([2, 651, 6037], greedy)}
                s.eval([2, 651, 6037])

                def one_single() -> None:
                    if s.kv.n > 900:
                        s.reset()
                        s.eval([2, 651])
                    s.eval([1000 + s.kv.n % 50])

                def one_piped() -> None:
                    if len(pipe.tokens) > 900:
                        pipe.tokens = []
                        state["tok"] = pipe.eval([2, 651], greedy)
                    state["tok"] = pipe.next_token(state["tok"])
                # taking turns in blocks, so both see the same background load
                singles, pipes = [], []
                block = max(args.n // 10, 1)
                for _ in range(10):
                    singles.append(_median_ms(one_single, block, 2))
                    pipes.append(_median_ms(one_piped, block, 2))
                # several sequences per pass (serve --ray's batched decode) against one per pass
                k = max(args.streams, 1)
                seqs = [pipe.open(1024) for _ in range(k)]
                toks = [pipe.prefill(q, [2, 651, 1000 + i], Picker(SamplingParams(temperature=0)), True, True)
                        for i, q in enumerate(seqs)]
                box = {"toks": toks}

                def refill() -> None:
                    if len(seqs[0].tokens) > 900:
                        for i, q in enumerate(seqs):
                            pipe.truncate(q, 3)
                            box["toks"][i] = 1000 + i

                def batched() -> None:
                    refill()
                    box["toks"] = pipe.decode(seqs, box["toks"])

                def one_by_one() -> None:
                    refill()
                    box["toks"] = [pipe.decode([q], [t])[0] for q, t in zip(seqs, box["toks"])]
                block = max(args.n // (10 * k), 1)
                per_pass, per_row = [], []
                for _ in range(10):
                    per_pass.append(_median_ms(batched, block, 2))
                    per_row.append(_median_ms(one_by_one, block, 2))
                pipe.close(seqs)
                res["streams"] = k
                res["batched_tps"] = k / (statistics.median(per_pass) / 1e3)
                res["one_per_pass_tps"] = k / (statistics.median(per_row) / 1e3)
                res["split"] = [d["layers"] for d in pipe.describe()]
                res["hidden_bytes_per_token"] = pipe.hidden_bytes_per_token()
                res["transport"] = "compiled graph" if pipe.dag is not None else "actor calls"
            finally:
                pipe.close()
                eng.close()
            res["model"] = os.path.basename(path)
            res["single_ms_per_token"] = statistics.median(singles)
            res["pipeline_ms_per_token"] = statistics.median(pipes)
            res["pipeline_added_ms_per_token"] = statistics.median([b - a for a, b in zip(singles, pipes)])
        res["load_average_after"] = os.getloadavg()
    finally:
        ray.shutdown()
        c.shutdown()

    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"Ray {res['ray']}, {args.nodes} nodes on one machine ({res['cpus']} CPUs), "
          f"load average {res['load_average'][0]:.1f} -> {res['load_average_after'][0]:.1f}; median of {args.n} tokens")
    print(f"one-token message: {res['message_bytes']} B pickled, hidden state {res['hidden_bytes_per_boundary']} B "
          f"per stage boundary")
    print("| mechanism | " + " | ".join(f"{k} stage{'s' if k > 1 else ''}" for k in stages) + " | per hand-off |")
    print("| --- |" + " ---: |" * (len(stages) + 1))
    print("| actor calls (RayPipeline: prompt batches) | " + " | ".join(f"{v:.2f} ms" for v in calls)
          + f" | {res['calls_per_handoff_ms']:.2f} ms |")
    if compiled:
        print("| compiled graph (RayPipeline: tokens) | " + " | ".join(f"{v:.2f} ms" for v in compiled)
              + f" | {res['compiled_per_handoff_ms']:.2f} ms |")
    else:
        print(f"| compiled graph | {res.get('compiled_error', 'n/a')} |")
    if "single_ms_per_token" in res:
        print(f"{res['model']} decode, split {res['split']}: one process {res['single_ms_per_token']:.2f} ms/token, "
              f"pipeline ({res['transport']}) {res['pipeline_ms_per_token']:.2f} ms/token "
              f"(added: {res['pipeline_added_ms_per_token']:+.2f} ms, median of per-block differences); "
              f"{res['hidden_bytes_per_token']} B of hidden state cross hosts per token")
        print(f"{res['streams']} sequences: {res['batched_tps']:.1f} t/s together with one pass for all of them, "
              f"{res['one_per_pass_tps']:.1f} t/s with one pass per sequence "
              f"({res['batched_tps'] / res['one_per_pass_tps']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

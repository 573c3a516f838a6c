"""The server's scheduler under concurrent clients, in this process and without HTTP: where a
served token's time goes (a benchmark, not a test).

    python3 benchmarks/scheduler_load.py -m MODEL [-t 2] [-np 8] [-c 1,4,8] [-n 64] [-r 2]

Each level starts `-c` requests at once on a `engine.scheduler.Scheduler` of `-np` slots (short
random prompts, `-n` tokens each, no stop ids, temperature 1), as serve_bench's rounds do over
HTTP, and measures the same aggregate: tokens after each request's first, summed, over the span
from the first request's first token to the last request's last. Then the span split by what the
scheduler's thread did: decode passes (those whose rows equal the last pass's and those whose rows
changed: a request joined or left), prompt pieces, and the rest (sampling, events, bookkeeping).
Set against serve_bench's figures, the gap between them is HTTP's; set against batch_pass.py's,
the scheduler's own.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from attention_kernel_bench import cpu  # noqa: E402
from workbench.engine.engine import Engine, Placement  # noqa: E402
from workbench.engine.events import DoneEvent  # noqa: E402
from workbench.engine.sampling import SamplingParams  # noqa: E402
from workbench.engine.scheduler import LocalModel, Request, Scheduler  # noqa: E402


class TimedModel(LocalModel):
    """LocalModel with each pass timed and its rows noted."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.log: list[tuple[str, float, float, tuple]] = []   # (kind, start, seconds, rows)

    def prefill(self, seq, piece, picker, first, last):
        t0 = time.perf_counter()
        out = super().prefill(seq, piece, picker, first, last)
        self.log.append(("prompt", t0, time.perf_counter() - t0, (len(piece), id(seq))))
        return out

    def decode(self, seqs, tokens, pickers):
        t0 = time.perf_counter()
        out = super().decode(seqs, tokens, pickers)
        self.log.append(("decode", t0, time.perf_counter() - t0, tuple(id(s) for s in seqs)))
        return out


def level(sched: Scheduler, model: TimedModel, clients: int, n: int, vocab: int, round_: int) -> dict:
    rng = np.random.default_rng(round_)
    finished = threading.Semaphore(0)

    def on_event(ev):   # (on the scheduler's thread)
        if isinstance(ev, DoneEvent) or hasattr(ev, "message"):
            finished.release()
    model.log.clear()
    reqs = []
    for i in range(clients):
        prompt = [int(t) for t in rng.integers(10, min(vocab, 30000), 8)]
        reqs.append(sched.submit(Request(prompt, SamplingParams(temperature=1.0, seed=i), n_predict=n,
                                         stop_ids=set(), on_event=on_event)))
    for _ in range(clients):
        finished.acquire()
    # each request's token times: its prompt's last piece, then every pass its slot's row was in
    # (from the passes' log, not from text events: a synthetic file's tokens may print nothing)
    times: list[list[float]] = []
    for r in reqs:
        sid = id(sched.slots[r.slot].session)
        ends = [t0 + dt for k, t0, dt, rows in model.log if k == "decode" and sid in rows]
        first = [t0 + dt for k, t0, dt, rows in model.log if k == "prompt" and rows[1] == sid]
        times.append(sorted(first[-1:] + ends)[:len(r.out)])
    first = min(t[0] for t in times if t)
    last = max(t[-1] for t in times if t)
    tokens = sum(len(t) - 1 for t in times)
    span = [(k, t0, dt, rows) for k, t0, dt, rows in model.log if t0 + dt > first and t0 < last]
    steady = changed = prompt = 0.0
    n_steady = n_changed = 0
    prev = None
    for k, t0, dt, rows in span:
        if k == "prompt":
            prompt += dt
            continue
        if rows == prev:
            steady += dt
            n_steady += 1
        else:
            changed += dt
            n_changed += 1
        prev = rows
    return {"tps": tokens / (last - first), "span": last - first, "tokens": tokens, "steady": steady,
            "n_steady": n_steady, "changed": changed, "n_changed": n_changed, "prompt": prompt,
            "steady_pass_ms": 1e3 * steady / max(n_steady, 1),
            "rows": statistics.mean(len(r) for k, _, _, r in span if k == "decode") if span else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("-c", "--clients", default="1,4,8")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-r", "--rounds", type=int, default=2)
    a = ap.parse_args()
    eng = Engine.load(a.model, placement=Placement(threads=a.threads))
    model = TimedModel(eng)
    sched = Scheduler(eng, n_parallel=a.parallel, n_ctx=1024)
    sched.model = model
    # the scheduler made its own LocalModel over the same slots: keep its sessions
    print(f"# {os.path.basename(a.model)}, {a.threads} threads, -np {a.parallel}, {a.n_gen} tokens a request; "
          f"host: {cpu()}")
    level(sched, model, max(int(c) for c in a.clients.split(",")), 8, eng.cfg.n_vocab, 99)  # warm-up
    print("| clients | aggregate t/s | span s | decode passes, same rows (ms a pass) | passes with rows changed "
          "(s) | prompt pieces (s) | other (s) | rows a pass |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    for c in [int(x) for x in a.clients.split(",")]:
        best = max((level(sched, model, c, a.n_gen, eng.cfg.n_vocab, r) for r in range(a.rounds)),
                   key=lambda r: r["tps"])
        other = best["span"] - best["steady"] - best["changed"] - best["prompt"]
        print(f"| {c} | {best['tps']:.1f} | {best['span']:.2f} | {best['n_steady']} x {best['steady_pass_ms']:.1f} "
              f"= {best['steady']:.2f} s | {best['n_changed']}: {best['changed']:.2f} | {best['prompt']:.2f} "
              f"| {other:.2f} | {best['rows']:.1f} |", flush=True)
    sched.close()
    eng.close()


if __name__ == "__main__":
    main()

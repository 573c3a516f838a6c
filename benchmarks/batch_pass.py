"""A server's decode pass over n sequences in this process: `engine.batch.decode_batch` against the
same n sequences decoded one after another by the one-token path (a benchmark, not a test).

    python3 benchmarks/batch_pass.py -m MODEL [-t 2] [-b 1,2,4,8] [-r 10] [--depth 8]

Each batch size: n sessions, each fed a prompt of `--depth` random tokens, then `-r` timed passes
(after 3 warm-up passes). Printed per size: milliseconds a pass (wall and this process's CPU time:
on a busy machine the CPU time is the steadier figure at one thread), aggregate tokens a second,
and the ratio to the one-after-another decode of the same rows. The server's aggregate throughput
is `serve_bench.py`'s; this isolates the pass from HTTP, sampling and scheduling.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from attention_kernel_bench import cpu  # noqa: E402 (cpuinfo's name, family and model)
from workbench.engine.batch import decode_batch  # noqa: E402
from workbench.engine.engine import Engine, Placement  # noqa: E402


def timed(fn, reps: int) -> tuple[float, float]:
    """(wall, CPU) seconds per call of fn, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps, (time.process_time() - c0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-b", "--batch", default="1,2,4,8", help="sequences a pass (default 1,2,4,8)")
    ap.add_argument("-r", "--repetitions", type=int, default=10)
    ap.add_argument("--depth", type=int, default=8, help="prompt tokens in each sequence's cache first")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    eng = Engine.load(a.model, placement=Placement(threads=a.threads))
    rng = np.random.default_rng(0)
    vocab = eng.cfg.n_vocab
    rows = []
    print(f"# {os.path.basename(a.model)}, {a.threads} threads, depth {a.depth}; host: {cpu()}")
    print("| rows | batched ms/pass (wall / CPU) | one after another ms (wall / CPU) | batched t/s | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for n in [int(b) for b in a.batch.split(",")]:
        sessions = [eng.new_session(a.depth + 3 * (2 * a.repetitions + 8) + 8) for _ in range(n)]
        for s in sessions:
            s.prefill([int(t) for t in rng.integers(10, min(vocab, 30000), a.depth)])
        toks = [int(t) for t in rng.integers(10, min(vocab, 30000), n)]
        with eng.lock:
            bw, bc = timed(lambda: decode_batch(eng, sessions, toks), a.repetitions)
            sw, sc = timed(lambda: [s.eval([t]) for s, t in zip(sessions, toks)], a.repetitions)
        for s in sessions:
            s.close()
        rows.append({"rows": n, "batched_wall": bw, "batched_cpu": bc, "serial_wall": sw, "serial_cpu": sc})
        print(f"| {n} | {bw * 1e3:.1f} / {bc * 1e3:.1f} | {sw * 1e3:.1f} / {sc * 1e3:.1f} | {n / bw:.1f} "
              f"| {sw / bw:.2f}x |", flush=True)
    eng.close()
    if a.json:
        print(json.dumps({"model": a.model, "threads": a.threads, "depth": a.depth, "host": cpu(), "rows": rows}))


if __name__ == "__main__":
    main()

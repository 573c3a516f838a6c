"""Where a decoded token's time goes between the crew's threads (a benchmark, not a test).

    python3 benchmarks/crew_timeline.py [-m MODEL] [-t 2] [-n 32] [--jobs] [--random] [--depth 4096]
                                        [--batch 8]

Decodes ``-n`` tokens with the crew traced (`Crew.trace`: for every job the caller's post, the end
of its own part and the acknowledgements, and every worker's start and end, in ns) and prints per
token: the wall time, the caller's and the workers' working time, the caller's waits for
acknowledgements, and the *serial gaps* between one job's acknowledgements and the next post, when
only the calling thread runs (Python between compiled calls, gating, activations, input
quantization) while the workers spin. ``--jobs`` adds one line per job of a token, in order
(median over the tokens): its task count, the gap before it, the caller's and the workers' parts.
``--batch N``: the same for a server's decode pass of N sequences (`engine.batch.decode_batch`,
each sequence fed a prompt of ``--depth`` (default 32) random ids first, every pass random ids):
"per token" is then per pass.

AMD EPYC Zen 4 VM (cpuinfo family 25 model 17), 2 threads, the R1 shape (`make_moe_model.py
--shape r1`), 2026-12-07 19:42 UTC, ``--batch 8 -n 8 --jobs``: 608 jobs a pass, 26.6 ms, serial
gaps 8.6 ms (one token alone, 17:58: 1.76 of 7.13 ms); a routed block's gaps 3.5 / 12.3 / 17.8 /
13.8 / 9.0 / 1.9 / 5.2 / 26.9 / 25.9 / 15.8 us against 1-6 us each for one token (a process 17:58
that ran 35.3 ms a pass: 14.0 ms of gaps) -- the caller's per-row steps (routing, the activation
and its quantization, the task tables, each row's softmax) grow with the rows while the workers
wait.

AMD EPYC, 2 threads, the synthetic qwen3moe of `make_moe_model.py`, 2026-12-01 23:20 UTC
(before the trace went into the crew; same figures): 57 jobs a token, 5.38 ms a token, caller
working 3.22 ms, worker 3.41 ms, waits for acknowledgements 0.70 ms, serial gaps 1.31 ms (per
layer: 55-73 us before the q/k/v products -- the Python between layers --, 24 us before the
router, 20 us before the experts' down products).

The same host, 2026-12-02 03:00 UTC, after the token went into one compiled call and the crew
stayed launched between tokens: 2 threads (ids 200..): 3.80 ms a token, caller working 2.43 ms,
acknowledgements 0.38 ms, serial gaps 0.54 ms, 0.26 ms outside the jobs; 1 thread with
``--random``: 5.02 ms, jobs 4.45 ms (the experts' gate/up at 23.5 GB/s, down at 25 GB/s: the
probe's rate), serial gaps 0.36 ms, 0.20 ms outside the jobs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workbench.engine import Engine, kernels  # noqa: E402
from workbench.engine.crew import TRACE_LEAD_N  # noqa: E402
from workbench.engine.engine import Placement, default_model_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=32, help="decoded tokens traced")
    ap.add_argument("--jobs", action="store_true", help="one line per job of a token")
    ap.add_argument("--depth", type=int, default=0,
                    help="tokens already in the cache before the traced ones (a prompt of random ids)")
    ap.add_argument("--batch", type=int, default=0, metavar="N",
                    help="trace decode passes of N sequences (engine.batch.decode_batch) instead of one")
    ap.add_argument("--random", action="store_true",
                    help="random token ids (as llama-bench and `numawb bench`: routing differs token to token)")
    a = ap.parse_args()
    path = a.model or default_model_path()
    eng = Engine.load(path, placement=Placement(threads=a.threads))
    s = eng.new_session(max(512, a.depth + a.n + 64))
    if a.depth:
        s.eval([int(t) for t in np.random.default_rng(1).integers(4, eng.cfg.n_vocab, a.depth)])
    else:
        s.eval(eng.tokenizer.encode("The capital of France is")[:16])
    for i in range(4):
        s.eval([100 + i])
    rng = np.random.default_rng(0)
    if a.batch:
        step = _batch_steps(eng, a.batch, a.depth or 32, a.n + 8, rng)
    else:
        ids = rng.integers(4, eng.cfg.n_vocab, a.n) if a.random else 200 + np.arange(a.n)
        step = (lambda i: s.eval([int(ids[i])]))
    crew = eng.rt.crew
    crew.trace()
    bounds, walls = [0], []
    for i in range(a.n):
        t = time.perf_counter_ns()
        step(i)
        walls.append(time.perf_counter_ns() - t)
        bounds.append(int(crew.ctl[TRACE_LEAD_N]) // 4)
    lead, work = crew.stop_trace().records
    if len(lead) < bounds[-1]:
        sys.exit("the trace log filled up: lower -n")
    what = f"{a.n} passes of {a.batch} sequences" if a.batch else f"{a.n} tokens"
    print(f"{os.path.basename(path)}, {a.threads} threads, {what}, kernels {kernels.kernel_path()}; "
          f"load average {os.getloadavg()[0]:.2f}")
    per_tok = []
    rows = []
    # each worker record belongs to the job posted last before it started (jobs do not overlap)
    posts = lead[:, 0]
    job_of = np.searchsorted(posts, work[:, 2], side="right") - 1
    wk_job = np.zeros(len(lead), dtype=np.int64)
    np.add.at(wk_job, job_of[job_of >= 0], (work[:, 3] - work[:, 2])[job_of >= 0])
    # how long after the post the (last) worker started, and finished after the caller's own part
    late = np.zeros(len(lead), dtype=np.int64)
    ok = job_of >= 0
    np.maximum.at(late, job_of[ok], work[ok, 2] - posts[job_of[ok]])
    after = np.full(len(lead), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(after, job_of[ok], work[ok, 3] - lead[job_of[ok], 1])
    for k in range(a.n):
        jobs = lead[bounds[k]:bounds[k + 1]]
        if len(jobs) == 0:  # a token decoded without posting a job (the crew ran solo)
            continue
        own = jobs[:, 1] - jobs[:, 0]
        acks = jobs[:, 2] - jobs[:, 1]
        gaps = np.concatenate([[0], jobs[1:, 0] - jobs[:-1, 2]])
        wks = wk_job[bounds[k]:bounds[k + 1]]
        per_tok.append((walls[k], own.sum(), wks.sum(), acks.sum(), gaps.sum(), len(jobs),
                        walls[k] - (jobs[-1, 2] - jobs[0, 0])))
        rows.append(np.stack([jobs[:, 3], gaps, own, wks, late[bounds[k]:bounds[k + 1]],
                              np.maximum(after[bounds[k]:bounds[k + 1]], 0)], 1))
    p = np.median(np.array(per_tok, dtype=np.float64), 0)
    print(f"per token (median): {p[5]:.0f} jobs, wall {p[0] / 1e6:.2f} ms; caller working {p[1] / 1e6:.2f} ms, "
          f"workers working {p[2] / 1e6:.2f} ms, caller waiting for acknowledgements {p[3] / 1e6:.2f} ms, "
          f"serial gaps between jobs {p[4] / 1e6:.2f} ms, outside the jobs' span (Python before the first "
          f"post and after the last acknowledgement) {p[6] / 1e6:.2f} ms")
    if a.jobs:
        n = min(len(r) for r in rows)
        m = np.median(np.stack([r[:n] for r in rows]), 0)
        print("job  tasks  gap before (us)  caller (us)  workers (us)  worker started after post (us)  "
              "worker done after caller (us)")
        for j, (nt, g, o, w, lt, af) in enumerate(m):
            print(f"{j:3d}  {nt:5.0f}  {g / 1e3:15.1f}  {o / 1e3:11.1f}  {w / 1e3:12.1f}  {lt / 1e3:30.1f}  "
                  f"{af / 1e3:29.1f}")
    eng.close()


def _batch_steps(eng, n: int, depth: int, passes: int, rng):
    """A step function decoding one pass of n sequences (random ids each pass), after three
    untraced passes; the sequences hold a `depth`-token prompt of random ids first."""
    from workbench.engine.batch import decode_batch
    vocab = eng.cfg.n_vocab
    seqs = [eng.new_session(depth + passes + 8) for _ in range(n)]
    for q in seqs:
        q.prefill([int(t) for t in rng.integers(4, vocab, depth)])

    def step(_i: int) -> None:
        with eng.lock:
            decode_batch(eng, seqs, [int(t) for t in rng.integers(4, vocab, n)])
    for i in range(3):
        step(i)
    return step


if __name__ == "__main__":
    main()

"""Full soak: 500 sliding chat turns on the default model (or -m PATH).

    python3 benchmarks/soak.py [-m PATH] [--turns 500] [-t THREADS]

Prints resident memory, thread count and reply checks as it goes, then a
verdict: RSS within 5 % after warm-up, constant thread count, and every
checked reply identical to a fresh session over the same conversation.
"""

from __future__ import annotations

import argparse
import sys

from workbench.engine import Engine
from workbench.engine.engine import Placement
from workbench.soak import soak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model")
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("-t", "--threads", type=int)
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args()
    eng = Engine.load(args.model, placement=Placement(threads=args.threads))

    def progress(i, res):
        if i % 25 == 0:
            print(f"turn {i}: rss {res.rss_mb[-1]:.1f} MiB, threads {res.threads[-1]}, "
                  f"slides {res.slides}, mismatches {len(res.mismatches)}", flush=True)

    res = soak(eng, args.turns, n_ctx=args.ctx, n_predict=48, check_every=10, progress=progress)
    warm = min(50, args.turns // 4)
    growth = res.rss_growth(warm)
    ok = growth < 0.05 and len(set(res.threads)) == 1 and not res.mismatches
    print(f"{res.turns} turns, {res.slides} slides: RSS growth after turn {warm} {100 * growth:.2f} %, "
          f"threads {sorted(set(res.threads))}, mismatching replies {res.mismatches or 'none'} -> "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

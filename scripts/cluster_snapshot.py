"""Capture the per-host proofs of a model pipelined over a local 2-node Ray cluster (both nodes on
this machine, started here), after a short greedy generation, as JSON: the frozen input of the
dashboard's grouped-by-host snapshot test (tests/services/test_cluster_dashboard.py).

    python scripts/cluster_snapshot.py [-m MODEL] [-t THREADS] -o tests/data/cluster-2host-proofs.json
"""
from __future__ import annotations

import argparse
import json
import logging


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("-t", "--threads", type=int, default=1, help="worker threads per host")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from workbench.cluster.pipeline import RayPipeline
    from workbench.engine import SamplingParams
    from workbench.engine.engine import DoneEvent, Placement

    node = {"num_cpus": 1, "object_store_memory": 100 << 20}
    c = Cluster(initialize_head=True, head_node_args=dict(node, include_dashboard=False))
    c.add_node(**node)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        pipe = RayPipeline(c.address, args.model, Placement(threads=args.threads), n_ctx=512)
        pipe.load()
        try:
            ids = pipe.tokenizer.encode("The capital of France is", add_bos=None)
            done = [e for e in pipe.generate(ids, SamplingParams(temperature=0), 8) if isinstance(e, DoneEvent)][0]
            out = {"model": pipe.path, "generated": done.text, "hosts": pipe.describe(), "proofs": pipe.proofs()}
        finally:
            pipe.close()
    finally:
        ray.shutdown()
        c.shutdown()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, default=list)
    print(f"{args.out}: {len(out['proofs'])} hosts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

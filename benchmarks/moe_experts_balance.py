"""Why owning whole experts per node helps little: the per-layer-step imbalance of real routing.

    python3 benchmarks/moe_experts_balance.py [-m MOE_MODEL] [-n 64] [--nodes 2,4]

Generates ``-n`` tokens with the model on this machine, records the experts each layer routes
every token to, then replays that routing against the placement plan of a machine with N nodes:
for ``experts`` (whole experts owned by nodes) each node reads only its own experts, so a layer
waits for the node whose experts were routed most; for ``slice`` every node reads its rows of
every routed expert (even by construction). Prints, per node count, the mean over layer steps of
the busiest node's expert bytes over the mean node's (1.00 = even). Default model: the synthetic
file of benchmarks/make_moe_model.py (its random router is close to uniform, so real models, whose
routing is skewed, do worse, not better).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main() -> int:
    import numpy as np

    from workbench.engine.engine import Engine, Placement, tensor_specs
    from workbench.engine.sampling import SamplingParams
    from workbench.numa.plan import make_plan
    from workbench.numa.topology import fixture_path, load_topology
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--nodes", default="2,4")
    a = ap.parse_args()
    path = a.model or subprocess.run([sys.executable, os.path.join(HERE, "make_moe_model.py")],
                                     capture_output=True, text=True, check=True).stdout.strip()
    eng = Engine.load(path, placement=Placement(threads=1))
    steps: list[tuple[str, np.ndarray]] = []
    moe = eng.rt.moe

    def spy(x, gate, up, down, experts, weights, activation="silu"):
        steps.append((up, np.array(experts)))
        return moe(x, gate, up, down, experts, weights, activation)
    eng.rt.moe = spy
    s = eng.new_session(512)
    for _ in s.generate(eng.tokenizer.encode("The history of the", add_bos=True),
                        SamplingParams(temperature=0.8, seed=1), a.n, stop_ids=set()):
        pass
    specs = tensor_specs(eng.gguf)
    eng.close()
    decode = [(g, ids) for g, ids in steps if len(ids) == 1]
    topo = load_topology(fixture_path("xeon-8node-smt"))
    print(f"{os.path.basename(path)}: {len(decode)} decode layer steps, "
          f"{decode[0][1].shape[1] if decode else 0} experts routed per token")
    for n_nodes in [int(v) for v in a.nodes.split(",")]:
        workers = [(i, i) for i in range(n_nodes)]  # one worker per node of the 8-node fixture
        free = {n.id: 1 << 50 for n in topo.nodes}
        for mode in ("experts", "slice"):
            plan = make_plan(specs, mode, workers, topo, free=free)
            ratios = []
            for gate, ids in decode:
                per = {n: 0.0 for n in plan.nodes}
                for e in np.unique(ids):
                    for n, b in plan.expert_read_bytes(gate, int(e)).items():
                        per[n] += b
                vals = list(per.values())
                ratios.append(max(vals) * len(vals) / sum(vals))
            print(f"  {n_nodes} nodes, {mode:7s}: busiest node reads {np.mean(ratios):.2f}x the mean per layer step "
                  f"(worst {max(ratios):.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

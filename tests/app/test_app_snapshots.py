"""SVG snapshots (pytest-textual-snapshot) of the dashboard, the chat and the help screen.

Deterministic: telemetry is a fixed Snapshot (no sampler thread, no engine), the cursor does
not blink, no clock is shown; update with ``pytest tests/test_app_snapshots.py --snapshot-update``.
"""
from __future__ import annotations

import dataclasses

import pytest

from workbench.app import WorkbenchApp
from workbench.engine.engine import Placement
from workbench.settings import Settings
from workbench.telemetry import BufferShare, Rates, RequestRow, RoutingInfo, Snapshot, Telemetry, WorkerRow

GiB, MiB = 1 << 30, 1 << 20
WEIGHTS = 236 * MiB


@pytest.fixture(autouse=True)
def xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def frozen_snapshot() -> Snapshot:
    """8-node Xeon fixture, weights mirrored, KV first-touch, 32 workers, a few replies' rates."""
    base = Telemetry(None, simulate="xeon-8node-smt").sample(now=0.0)
    nodes = tuple(dataclasses.replace(n, weights=WEIGHTS, kv=9 * MiB, other=(40 if n.node == 0 else 0) * MiB,
                                      system=max(0, n.total - n.free - WEIGHTS - 9 * MiB), in_place=1.0)
                  for n in base.nodes)
    workers = tuple(WorkerRow(i, i, i // 4, i if i != 13 else 45, i // 4 if i != 13 else 7,
                              f"mirror replica {i // 4} (node {i // 4})", ((i * 7) % 50 + 40) / 100, i == 13,
                              "caller" if i == 0 else "pool")
                    for i in range(32))
    buffers = tuple(BufferShare(f"weights mirror replica {n} (node {n})", "weights", (n,), WEIGHTS, 1.0, "")
                    for n in range(8)) + (BufferShare("kv first-touch node 0", "kv", (0,), 9 * MiB, 0.97, ""),)
    rates = Rates(prompt_tps=(61.0, 78.5, 74.2, 80.1), decode_tps=(9.8, 11.1, 10.4, 10.9), ttft=(0.42, 0.31, 0.33, 0.3))
    return dataclasses.replace(
        base, seq=1, t=0.0, model="gemma-3-270m-q4_k_m.gguf", weight_bytes=WEIGHTS,
        placement={"weights": "mirror", "kv": "first-touch", "threads": 32, "policy": "distribute"},
        nodes=nodes, workers=workers, buffers=buffers, rates=rates, bandwidth=WEIGHTS * 10.9,
        topo=dataclasses.replace(base.topo, kernel_path="avx2"), sample_seconds=0.0)


def frozen_app(**kw) -> WorkbenchApp:
    return WorkbenchApp(None, autoload=False, persist=False, settings=Settings(), frozen=frozen_snapshot(),
                        **kw)


def test_dashboard_simulated_8_nodes(snap_compare):
    app = frozen_app(simulate="xeon-8node-smt", placement=Placement(weights="mirror", threads=32))
    assert snap_compare(app, terminal_size=(170, 110))


REPLY = """\
A **NUMA node** is a group of CPU cores with the memory attached to them.

- local memory: fast
- remote memory: one hop away, slower

```sh
numactl --hardware
```
"""


def test_chat_with_finished_reply(snap_compare):
    app = frozen_app()

    async def run_before(pilot) -> None:
        await pilot.pause()
        await app.chat_pane.add_user("What is a NUMA node?")
        await app.chat_pane.start_reply(REPLY, "57 tokens · prompt 16 tok @ 80.1 t/s · decode 10.9 t/s · "
                                               "ttft 300 ms · eos · weights mirror · KV first-touch · 32 threads")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 32), run_before=run_before)


def test_help_screen(snap_compare):
    assert snap_compare(frozen_app(), terminal_size=(110, 50), press=["f1"])


def moe_serving_snapshot() -> Snapshot:
    """2-socket EPYC fixture serving a mixture-of-experts model with its weights sliced: the routing
    window is counted by the engine's own ``RoutingStats`` from a fixed, skewed routing (seeded;
    each routed expert's 3 tensors of 0.84 MiB read half from each node's slice), three requests
    in slots and one queued."""
    import numpy as np
    from workbench.engine.routing import RoutingStats
    n_layer, n_expert, k = 12, 64, 8
    per_tensor = 0.84 * MiB
    stats = RoutingStats(n_layer, n_expert, window=256,
                         bytes_by_node=lambda name, e: {0: per_tensor / 2, 1: per_tensor / 2})
    rng = np.random.default_rng(7)
    pop = 1.0 / np.arange(1, n_expert + 1) ** 0.8  # a few hot experts, as real routers have
    for il in range(n_layer):
        p = np.roll(pop, 5 * il)
        p = p / p.sum()
        for _ in range(256):
            ids = rng.choice(n_expert, size=k, replace=False, p=p)
            stats.record(f"blk.{il}.ffn_gate_exps.weight", ids[None, :], ("gate", "up", "down"))
    routing = RoutingInfo.from_routing(stats.snapshot())
    base = Telemetry(None, simulate="epyc-2socket").sample(now=0.0)
    wb = 17 * GiB
    nodes = tuple(dataclasses.replace(n, weights=wb // 2, kv=96 * MiB, other=(60 if n.node == 0 else 0) * MiB,
                                      system=max(0, n.total - n.free - wb // 2 - 96 * MiB), in_place=1.0)
                  for n in base.nodes)
    workers = tuple(WorkerRow(i, i * 8, i // 2, i * 8, i // 2, f"slice node {i // 2}", 0.6 + 0.05 * i, False,
                              "caller" if i == 0 else "pool") for i in range(4))
    buffers = tuple(BufferShare(f"weights slice node {n}", "weights", (n,), wb // 2, 1.0, "") for n in (0, 1))
    requests = (RequestRow("req-1", "decode", 0, 42, 118, 6.1, (0,), 21.4),
                RequestRow("req-2", "decode", 1, 310, 57, 5.8, (1,), 12.0, reused_tokens=256),
                RequestRow("req-3", "prompt", 2, 1200, 0, 0.0, (0,), 1.5),
                RequestRow("req-4", "queued", -1, 35, 0, 0.0, (), 0.2))
    return dataclasses.replace(
        base, seq=1, t=0.0, model="Qwen3-30B-A3B-Q4_K_M.gguf", weight_bytes=wb,
        placement={"weights": "slice", "kv": "first-touch", "threads": 4, "policy": "distribute"},
        nodes=nodes, workers=workers, buffers=buffers, rates=Rates(decode_tps=(11.2, 11.9)),
        topo=dataclasses.replace(base.topo, kernel_path="avx2"), sample_seconds=0.0, routing=routing,
        serving="serving Qwen3-30B-A3B-Q4_K_M.gguf on http://127.0.0.1:8080 · 4 slots × 4096 tokens",
        requests=requests)


def test_dashboard_moe_routing_and_serving_2_nodes(snap_compare):
    app = WorkbenchApp(None, autoload=False, persist=False, settings=Settings(), frozen=moe_serving_snapshot(),
                       simulate="epyc-2socket", placement=Placement(weights="slice", threads=4))

    async def run_before(pilot) -> None:
        await pilot.pause()
        app.screen_stack[0].view = "dashboard"
        await pilot.pause()
    assert snap_compare(app, terminal_size=(130, 120), run_before=run_before)

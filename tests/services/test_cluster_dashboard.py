"""The dashboard over a model pipelined on Ray hosts: memory, proof and workers grouped by host,
then node. The input is frozen: the per-host proofs a live local 2-node cluster gave for the
default model (`scripts/cluster_snapshot.py` wrote tests/data/cluster-2host-proofs.json), so
the view is deterministic; update the SVG with ``--snapshot-update``."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from workbench.app import WorkbenchApp
from workbench.screens.dashboard import MemoryBars
from workbench.settings import Settings
from workbench.telemetry import Rates, Snapshot, pipeline_snapshot

DATA = Path(__file__).resolve().parents[1] / "data" / "cluster-2host-proofs.json"


@pytest.fixture(autouse=True)
def xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def captured() -> dict:
    return json.loads(DATA.read_text())


def frozen() -> Snapshot:
    d = captured()
    snap = pipeline_snapshot(d["proofs"], seq=1, now=0.0, model="gemma-3-270m-q4_k_m.gguf",
                             rates=Rates(prompt_tps=(41.0,), decode_tps=(18.5,), ttft=(0.12,)))
    return dataclasses.replace(snap, sample_seconds=0.0)


def test_pipeline_snapshot_groups_rows_by_host():
    d = captured()
    s = frozen()
    labels = [p["label"] for p in d["proofs"]]
    assert len(labels) == 2 and len(set(labels)) == 2
    assert [h.split(" ", 2)[1] for h in s.hosts] == labels  # pipeline order
    assert "layers 0..8" in s.hosts[0] and "layers 9..17" in s.hosts[1]
    for p in d["proofs"]:
        mine = [n for n in s.nodes if n.host == p["label"]]
        assert [n.node for n in mine] == sorted(int(k) for k in p["mem"])
        for n in mine:
            assert n.weights == p["nodes"][str(n.node)]["weights"] and n.total == p["mem"][str(n.node)][0]
        assert len([b for b in s.buffers if b.host == p["label"]]) == len(p["buffers"])
        assert len([w for w in s.workers if w.host == p["label"]]) == len(p["workers"])
    assert s.weight_bytes == sum(h["weight_bytes"] for h in d["hosts"])
    # a recording keeps the grouping
    assert Snapshot.from_json(json.loads(json.dumps(s.to_json()))) == s


def test_memory_panel_titles_each_host_then_its_nodes():
    async def run() -> str:
        app = WorkbenchApp(None, autoload=False, persist=False, settings=Settings(), frozen=frozen())
        async with app.run_test(size=(130, 60)) as pilot:
            await pilot.pause()
            return str(app.dashboard.query_one(MemoryBars).render())
    text = asyncio.run(run())
    s = frozen()
    first, second = (text.index(h) for h in s.hosts)
    assert first < second
    head, tail = text[first:second], text[second:]
    for part in (head, tail):
        assert "node 0" in part and "proof (pages on intended nodes):" in part and "weights none" in part


def test_dashboard_two_hosts(snap_compare):
    app = WorkbenchApp(None, autoload=False, persist=False, settings=Settings(), frozen=frozen())

    async def run_before(pilot) -> None:
        await pilot.pause()
        app.screen_stack[0].view = "dashboard"
        await pilot.pause()
    assert snap_compare(app, terminal_size=(130, 100), run_before=run_before)

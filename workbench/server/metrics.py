"""GET /metrics: Prometheus text built at scrape time from the scheduler and the NUMA proof.

Names are `numawb_*` (llama-server's are `llamacpp:*`; a colon is reserved for recording rules).
Per node: bytes of weights and KV cache of this process and the share of pages proven on their
intended node (workbench.telemetry, which reads move_pages and numa_maps); per worker: its
CPU, node and the share of time it was busy since the previous scrape.
"""

from __future__ import annotations

import threading

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from ..telemetry import Telemetry

_telemetry: dict[int, Telemetry] = {}
_lock = threading.Lock()


class _Collector:
    def __init__(self, state):
        self.state = state

    def collect(self):
        st = self.state
        sch = st.scheduler
        if hasattr(st.engine, "proofs"):  # a pipeline over Ray hosts: each host's proof
            snap = None
        else:
            with _lock:
                tel = _telemetry.get(id(st.engine))
                if tel is None:
                    tel = _telemetry[id(st.engine)] = Telemetry(st.engine, max_pages=512)
                snap = tel.sample()
        c = CounterMetricFamily("numawb_http_requests", "HTTP requests by path and status", labels=["path", "status"])
        with st.lock:
            for (path, status), n in sorted(st.http.items()):
                c.add_metric([path, str(status)], n)
        yield c
        g = CounterMetricFamily("numawb_requests", "Generation requests finished, by outcome", labels=["outcome"])
        g.add_metric(["completed"], sch.requests_done)
        g.add_metric(["cancelled"], sch.requests_cancelled)
        g.add_metric(["failed"], sch.requests_failed)
        yield g
        yield GaugeMetricFamily("numawb_requests_processing", "Requests in a slot", value=sch.running)
        yield GaugeMetricFamily("numawb_requests_deferred", "Requests waiting for a slot", value=sch.queued)
        yield GaugeMetricFamily("numawb_slots", "Slots (sequences decoded together)", value=sch.n_parallel)
        yield CounterMetricFamily("numawb_prompt_tokens", "Prompt tokens processed", value=sch.prompt_tokens_total)
        yield CounterMetricFamily("numawb_tokens_predicted", "Tokens generated", value=sch.decode_tokens_total)
        yield CounterMetricFamily("numawb_decode_passes", "Batched decode passes", value=sch.passes)
        solo = getattr(getattr(st.engine, "rt", None), "solo_passes", None)   # (none over Ray hosts)
        if solo is not None:
            yield CounterMetricFamily("numawb_crew_solo_passes",
                                      "Forward passes the calling thread ran alone: the crew's workers had waited "
                                      "for a CPU in several passes in a row (another process on their cores)",
                                      value=solo)
        yield GaugeMetricFamily("numawb_decode_batch_mean", "Mean sequences per decode pass",
                                value=sch.pass_rows / sch.passes if sch.passes else 0.0)
        yield GaugeMetricFamily("numawb_predicted_tokens_seconds",
                                "Tokens generated per second over the last 5 s (all requests)",
                                value=sch.decode_rate(5.0))
        yield CounterMetricFamily("numawb_busy_seconds", "Seconds the scheduler spent in forward passes",
                                  value=sch.busy_seconds)
        if snap is None:
            yield from _hosts(st.engine)
            return
        w = GaugeMetricFamily("numawb_node_weights_bytes", "Bytes of model weights on each node", labels=["node"])
        k = GaugeMetricFamily("numawb_node_kv_bytes", "Bytes of KV cache on each node", labels=["node"])
        f = GaugeMetricFamily("numawb_node_free_bytes", "Free memory on each node", labels=["node"])
        p = GaugeMetricFamily("numawb_node_pages_in_place_ratio",
                              "Share of pages meant for the node that are on it", labels=["node"])
        for n in snap.nodes:
            w.add_metric([str(n.node)], n.weights)
            k.add_metric([str(n.node)], n.kv)
            f.add_metric([str(n.node)], n.free)
            if n.in_place is not None:
                p.add_metric([str(n.node)], n.in_place)
        yield w
        yield k
        yield f
        yield p
        s = GaugeMetricFamily("numawb_slot_kv_bytes", "Bytes of each busy slot's KV cache on each node (its pages)",
                              labels=["slot", "node"])
        for slot, per_node in sch.slot_kv():
            for node, nbytes in sorted(per_node.items()):
                s.add_metric([str(slot), str(node)], nbytes)
        yield s
        b = GaugeMetricFamily("numawb_worker_busy_ratio", "Share of time a worker was busy since the last scrape",
                              labels=["worker", "cpu", "node"])
        for row in snap.workers:
            b.add_metric([str(row.index), str(row.actual_cpu if row.actual_cpu is not None else row.cpu),
                          str(row.actual_node if row.actual_node is not None else row.node)], row.busy)
        yield b


def _hosts(pipe):
    """Per host and node of a pipeline: bytes of weights and KV cache and the share of pages in
    place, from each host's own proof (a host that does not answer leaves its rows out)."""
    from ..errors import UserError
    try:
        proofs = pipe.proofs()
    except UserError:
        proofs = []
    w = GaugeMetricFamily("numawb_node_weights_bytes", "Bytes of model weights on each node", labels=["host", "node"])
    k = GaugeMetricFamily("numawb_node_kv_bytes", "Bytes of KV cache on each node", labels=["host", "node"])
    p = GaugeMetricFamily("numawb_node_pages_in_place_ratio", "Share of pages meant for the node that are on it",
                          labels=["host", "node"])
    for pr in proofs:
        for node, kinds in pr["nodes"].items():
            w.add_metric([pr["label"], node], kinds.get("weights", 0))
            k.add_metric([pr["label"], node], kinds.get("kv", 0))
        for node, share in _in_place(pr["buffers"]).items():
            p.add_metric([pr["label"], node], share)
    yield w
    yield k
    yield p


def _in_place(buffers: list[dict]) -> dict[str, float]:
    """Per intended node: the share of the pages meant for it that are on it."""
    meant: dict[str, int] = {}
    there: dict[str, int] = {}
    for b in buffers:
        pages = b["pages_by_node"]
        total = sum(v for v in pages.values())
        for n in b["intended"]:
            n = str(n)
            meant[n] = meant.get(n, 0) + total
            there[n] = there.get(n, 0) + pages.get(n, 0)
    return {n: there[n] / meant[n] for n in meant if meant[n]}


def render(state) -> tuple[bytes, str]:
    """The metrics page and its content type."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(state))
    return generate_latest(reg), CONTENT_TYPE_LATEST

"""The live NUMA dashboard: memory per node, workers, rates, topology and the placement controls."""
from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.coordinate import Coordinate
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Button, DataTable, Input, Label, ProgressBar, Select, Sparkline, Static

from ..numa.budget import fmt_bytes
from ..numa.modes import EXPERT_MODES, POLICIES, WEIGHT_MODES, kv_choices
from ..telemetry import Rates, RoutingInfo, Snapshot, empty_snapshot
from .inplace import Readout, repaint
from .themes import Palette

_BALANCING = {0: "off", 1: "on", 2: "on (tiering)", 3: "on (normal + tiering)"}


def fmt_short(n: float) -> str:
    """Compact bytes: 25.9G, 235M, 9.0M, 12K."""
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.1f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{int(n)}B"


def fmt_rate(v: float | None, unit: str = "t/s") -> str:
    return "-" if v is None else f"{v:,.1f} {unit}"


def fmt_bw(v: float | None) -> str:
    return "-" if not v else f"{fmt_bytes(v)}/s"


class DashPanel(Vertical):
    """A bordered section with a title."""

    def __init__(self, title: str, *children: Widget, **kw) -> None:
        super().__init__(*children, **kw)
        self.border_title = title


class MemoryBars(Widget):
    """Per node: a stacked bar (weights / KV / other / rest of system / free) and its numbers."""

    DEFAULT_CSS = "MemoryBars { height: auto; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.snapshot: Snapshot = empty_snapshot()
        self.palette = Palette()

    def show(self, snapshot: Snapshot, palette: Palette) -> None:
        self.snapshot, self.palette = snapshot, palette
        repaint(self)  # a layout only when the nodes, buffers or hosts change the height

    def get_content_height(self, container, viewport, width: int) -> int:  # noqa: ANN001
        s = self.snapshot
        per_host = 2 * len(s.hosts)  # a pipeline: each host's heading and its proof's heading
        return max(1, 1 + 2 * len(s.nodes) + (1 + len(s.buffers)) + per_host - (1 if s.hosts else 0))

    def _bar(self, n, width: int) -> Text:  # noqa: ANN001
        pal, col = self.palette, self.palette.node(n.node)
        total = max(n.total, 1)
        parts = [(n.weights, "█", col), (n.kv, "▓", col), (n.other, "▒", col),
                 (n.system, "░", pal.system)]
        cells = []
        for v, ch, style in parts:
            c = round(width * v / total)
            cells.append([max(1, c) if v > 0 else 0, ch, style])
        used = sum(c[0] for c in cells)
        if used > width:  # the rounding overflowed: take it from the biggest segment
            big = max(cells, key=lambda c: c[0])
            big[0] -= used - width
            used = width
        bar = Text()
        for c, ch, style in cells:
            bar.append(ch * c, style=style)
        bar.append("·" * (width - used), style=pal.system)
        return bar

    def render(self) -> RenderableType:
        s = self.snapshot
        width = max(10, self.size.width - 14)
        out = Text()
        if not s.nodes:
            return Text("waiting for the first sample…", style="dim")
        legend = Text("█ weights  ▓ KV  ▒ other (this process)  ", style="bold")
        legend.append("░ rest of system  ", style=self.palette.system)
        legend.append("· free", style=self.palette.system)
        out.append_text(legend)
        out.append("\n")
        if s.hosts:  # a pipeline over Ray hosts: each host's nodes, then its proof
            for heading in s.hosts:
                host = heading.split(" ", 2)[1]
                out.append(heading, style="bold underline")
                out.append("\n")
                self._node_rows(out, [n for n in s.nodes if n.host == host], width, "  ")
                self._proof_rows(out, [b for b in s.buffers if b.host == host], "  ")
                out.append("\n")
            out.rstrip()
            return out
        self._node_rows(out, s.nodes, width, "")
        self._proof_rows(out, s.buffers, "")
        return out

    def _node_rows(self, out: Text, nodes, width: int, indent: str) -> None:  # noqa: ANN001
        for n in nodes:
            col = self.palette.node(n.node)
            out.append(f"{indent}node {n.node:<2}", style=f"bold {col}")
            out.append(" [")
            out.append_text(self._bar(n, width - len(indent)))
            out.append("]\n")
            place = "-" if n.in_place is None else f"{100 * n.in_place:.1f}%"
            out.append(f"{indent}  W {fmt_short(n.weights)}  KV {fmt_short(n.kv)}  other {fmt_short(n.other)}  "
                       f"system {fmt_short(n.system)}  free {fmt_short(n.free)}/{fmt_short(n.total)}  "
                       f"in place {place}", style="dim" if not (n.weights or n.kv) else "")
            out.append("\n")

    @staticmethod
    def _proof_rows(out: Text, buffers, indent: str) -> None:  # noqa: ANN001
        out.append(f"{indent}proof (pages on intended nodes):", style="bold")
        for b in buffers:
            share = "n/a" if b.share is None else f"{100 * b.share:.1f}%"
            style = "" if b.share is None or b.share >= 0.99 else "bold red"
            out.append(f"\n{indent}  {b.label} ({fmt_bytes(b.nbytes)}): {share}", style=style)


class RatesPanel(Vertical):
    """Prompt / decode tokens per second with sparklines, ttft and implied bandwidth."""

    def compose(self) -> ComposeResult:
        yield Readout(id="rates-text")
        with Horizontal(classes="spark-row"):
            yield Label("prompt ", classes="spark-label")
            yield Sparkline([], id="spark-prompt", summary_function=max)
        with Horizontal(classes="spark-row"):
            yield Label("decode ", classes="spark-label")
            yield Sparkline([], id="spark-decode", summary_function=max)

    def show(self, snapshot: Snapshot) -> None:
        r: Rates = snapshot.rates
        rows: list[tuple[str, str, str, str]] = []

        def row(name: str, values: tuple[float, ...], fmt, live: float | None = None) -> None:  # noqa: ANN001
            cap = Rates.cur_avg_peak(values)
            cur = live if live is not None else (cap[0] if cap else None)
            rows.append((name, fmt(cur), fmt(cap[1] if cap else None), fmt(max(cap[2], live or 0) if cap else live)))

        row("prompt", r.prompt_tps, fmt_rate)
        row("decode", r.decode_tps, fmt_rate, r.live_decode_tps)
        row("ttft", r.ttft, lambda v: "-" if v is None else f"{1000 * v:,.0f} ms")
        wb = snapshot.weight_bytes
        row("bandwidth", tuple(wb * v for v in r.decode_tps), fmt_bw,
            wb * r.live_decode_tps if r.live_decode_tps else None)
        self.query_one("#rates-text", Readout).show(lambda: self._table(rows, r.generating), (rows, r.generating))
        self.query_one("#spark-prompt", Sparkline).data = list(r.prompt_tps)
        self.query_one("#spark-decode", Sparkline).data = list(r.decode_tps)

    @staticmethod
    def _table(rows: list[tuple[str, str, str, str]], generating: bool) -> RenderableType:
        t = Table.grid(padding=(0, 2))
        for _ in range(4):
            t.add_column(justify="right")
        t.add_row("", Text("current", style="bold"), Text("average", style="bold"), Text("peak", style="bold"))
        for name, *cells in rows:
            t.add_row(Text(name, style="bold"), *cells)
        note = Text("bandwidth = weight bytes per token × decode t/s" +
                    ("   ● generating" if generating else ""), style="dim")
        return Group(t, note)


def topology_view(s: Snapshot, palette: Palette) -> RenderableType:
    tp = s.topo
    if not tp.node_ids:
        return Text("no topology yet", style="dim")
    t = Table(box=None, padding=(0, 1), show_edge=False)
    t.add_column("node")
    t.add_column("cpus")
    for n in tp.node_ids:
        t.add_column(str(n), justify="right", style=palette.node(n))
    for i, n in enumerate(tp.node_ids):
        cells = [Text(str(d), style="bold" if d == 10 else "dim") for d in tp.distances[i]]
        t.add_row(Text(f"● {n}", style=f"bold {palette.node(n)}"), tp.node_cpus[i] or "(memory only)", *cells)
    nb = tp.numa_balancing
    nb_text = "not available" if nb is None else f"{nb} ({_BALANCING.get(nb, 'on')})"
    info = Text()
    info.append(f"sockets {tp.sockets} · numa_balancing {nb_text}", style="bold red" if nb and len(tp.node_ids) > 1 else "")
    info.append(f"\nTHP {tp.thp or 'n/a'} · hugepages {tp.hugepages}")
    info.append(f"\nkernel path {tp.kernel_path} (CPU best: {tp.simd})")
    if tp.degraded:
        info.append(f"\nnote: {tp.degraded}", style="yellow")
    return Group(Text("distance matrix", style="dim"), t, info)


SHADES = " ░▒▓█"  # no hits … most hits: readable in any theme, colour only adds to it


def _bins(n: int, k: int) -> list[tuple[int, int]]:
    """``n`` items into at most ``k`` contiguous bins: (start, end) pairs."""
    k = max(1, min(n, k))
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def routing_view(r: RoutingInfo, palette: Palette, width: int, max_rows: int = 24) -> RenderableType:
    """A mixture-of-experts model's routing: a heat map (MoE layers as rows, experts binned into
    columns, shade by hits in the window), each node's share of the expert bytes read per token,
    and the imbalance between nodes."""
    out = Text()
    n_exp = r.n_expert
    if not r.layers or not n_exp:
        out.append("no routed token yet", style="dim")
        return out
    cols = _bins(n_exp, max(4, width - 12))
    rows = _bins(len(r.layers), max_rows)
    cells = [[sum(r.hits[i][e] for i in range(a, b) for e in range(c0, c1)) for c0, c1 in cols] for a, b in rows]
    top = max((v for row in cells for v in row), default=0)
    per_col = cols[0][1] - cols[0][0]
    out.append(f"expert hits over the last {r.window} tokens · {len(r.layers)} MoE layers × {n_exp} experts"
               + (f" ({per_col} per column)" if per_col > 1 else ""), style="dim")
    for (a, b), row in zip(rows, cells):
        first, last = r.layers[a], r.layers[b - 1]
        label = f"L{first}" if first == last else f"L{first}-{last}"
        out.append(f"\n{label:>7} ")
        for v in row:
            level = 0 if not v or not top else 1 + min(3, int(4 * v / (top + 1)))
            out.append(SHADES[level], style="bold yellow" if level == 4 else ("yellow" if level else palette.system))
    out.append(f"\n{'':>7} ")
    out.append("░ few … █ most hits (shade scaled to the busiest cell)", style="dim")
    shares = r.node_shares
    if shares:
        out.append(f"\nexpert bytes read per token: {fmt_bytes(r.bytes_per_token)}", style="bold")
        bar_w = max(10, min(40, width - 40))
        for node, b in r.node_bytes:
            share = shares.get(node, 0.0)
            col = palette.node(node)
            out.append(f"\n  node {node:<2} ", style=f"bold {col}")
            filled = round(bar_w * share)
            out.append("█" * filled, style=col)
            out.append("·" * (bar_w - filled), style=palette.system)
            out.append(f" {100 * share:5.1f}%  {fmt_bytes(b)}/token")
        imb = r.imbalance
        out.append(f"\nimbalance {imb:.2f}× (busiest node over the mean; 1.00 = even)",
                   style="bold red" if imb >= 1.5 else ("yellow" if imb >= 1.15 else "green"))
    else:
        out.append("\nexpert bytes per node: not counted yet", style="dim")
    return out


class RoutingView(Widget):
    """The routing section: redrawn on each snapshot and on resize (columns follow the width)."""

    DEFAULT_CSS = "RoutingView { height: auto; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.routing: RoutingInfo | None = None
        self.palette = Palette()

    def show(self, routing: RoutingInfo | None, palette: Palette) -> None:
        self.routing, self.palette = routing, palette
        repaint(self)

    def get_content_height(self, container, viewport, width: int) -> int:  # noqa: ANN001
        r = self.routing
        if r is None or not r.layers:
            return 1
        return 2 + min(len(r.layers), 24) + (2 + len(r.node_bytes) if r.node_bytes else 1)

    def render(self) -> RenderableType:
        if self.routing is None:
            return Text("")
        return routing_view(self.routing, self.palette, self.size.width)


@dataclass(frozen=True)
class AdviceView:
    """What the advice panel shows (made by the app from ``workbench.advisor.advise``)."""

    status: str = ""                       # progress, or why there is no advice
    machine: str = ""                      # "this machine (probe 2026-12-01)" / "SIMULATED epyc-2socket"
    current: str = ""                      # the mode in force, e.g. "mirror / first-touch / 32 threads"
    current_tps: float | None = None       # its predicted decode rate
    current_depth: int = 0                 # ... at this KV-cache depth (the last reply's mean position)
    current_fits: bool = True
    best: str = ""
    best_tps: float | None = None
    reason: str = ""
    whatif: str = ""                       # another file's header: its model, best mode and rate
    warnings: tuple[tuple[str, str, str], ...] = ()  # (level "warn" | "info", message, fix) from advise


def advice_view(a: AdviceView, measured: float | None) -> RenderableType:
    """Predicted against measured decode for the mode in force, the best mode and why, the what-if."""
    out = Text()
    if a.machine:
        out.append(f"predictions for {a.machine}", style="dim")
    if a.current:
        out.append(f"\nthis mode ({a.current}): ", style="bold")
        out.append(f"predicted {fmt_rate(a.current_tps)}")
        if a.current_depth:
            out.append(f" at depth {a.current_depth:,}", style="dim")
        out.append(" · measured ")
        out.append(fmt_rate(measured), style="bold" if measured else "dim")
        if measured and a.current_tps:
            out.append(f" ({100 * (measured / a.current_tps - 1):+.0f} %)", style="dim")
        if not a.current_fits:
            out.append("  does not fit", style="bold red")
    elif a.machine:
        out.append("\nthis mode: not among the predicted candidates", style="dim")
    if a.best:
        out.append("\nbest mode: ", style="bold")
        out.append(f"{a.best} · {fmt_rate(a.best_tps)}", style="green")
    if a.reason:
        out.append(f"\n  {a.reason}", style="dim")
    if a.whatif:
        out.append("\nwhat-if: ", style="bold")
        out.append(a.whatif)
    for level, message, fix in a.warnings:
        warn = level == "warn"
        out.append("\n" + ("warning: " if warn else "note: "), style="bold yellow" if warn else "bold")
        out.append(message, style="yellow" if warn else "")
        out.append(f"\n  fix: {fix}", style="dim")
    if a.status:
        out.append(("\n" if out.plain else "") + a.status, style="yellow" if not a.machine else "dim")
    if not out.plain:
        out.append("no advice yet (F9 predicts every placement for this model; F10: what-if for another file)",
                   style="dim")
    return out


class Controls(Vertical):
    """Weight mode, KV mode, thread policy and count; Apply switches live."""

    class Apply(Message):
        def __init__(self, weights: str, kv: str, policy: str, threads: int | None) -> None:
            super().__init__()
            self.weights, self.kv, self.policy, self.threads = weights, kv, policy, threads

    def compose(self) -> ComposeResult:
        with Horizontal(id="controls-row"):
            with Vertical(classes="control"):
                yield Label("weights")
                yield Select([(m, m) for m in WEIGHT_MODES], value="none", allow_blank=False, id="weights")
            with Vertical(classes="control"):
                yield Label("KV cache")
                yield Select([(m, m) for m in kv_choices([0])], value="first-touch", allow_blank=False, id="kv")
            with Vertical(classes="control"):
                yield Label("threads policy")
                yield Select([(m, m) for m in POLICIES], value="distribute", allow_blank=False, id="policy")
            with Vertical(classes="control", id="threads-control"):
                yield Label("count")
                yield Input(placeholder="all", id="threads", type="integer", max_length=4)
            yield Button("Apply", id="apply", variant="primary")
        yield Static("", id="switch-status")

    def set_nodes(self, node_ids: tuple[int, ...] | list[int]) -> None:
        sel = self.query_one("#kv", Select)
        cur = sel.value
        modes = kv_choices(node_ids)
        sel.set_options([(m, m) for m in modes])
        sel.value = cur if cur in modes else "first-touch"

    def set_weight_modes(self, moe: bool) -> None:
        """The weights modes a model can take (``experts`` only for a mixture of experts)."""
        sel = self.query_one("#weights", Select)
        cur = sel.value
        modes = WEIGHT_MODES + (EXPERT_MODES if moe else ())
        sel.set_options([(m, m) for m in modes])
        sel.value = cur if cur in modes else "none"

    def set_values(self, weights: str, kv: str, policy: str, threads: int | None) -> None:
        """Show the placement in force (after a switch, or to restore it after a refusal)."""
        self.query_one("#weights", Select).value = weights
        kv_sel = self.query_one("#kv", Select)
        if kv not in [v for _, v in kv_sel._options]:
            kv_sel.set_options([(m, m) for m in [v for _, v in kv_sel._options] + [kv]])
        kv_sel.value = kv
        self.query_one("#policy", Select).value = policy.split(":")[0] if policy.split(":")[0] in POLICIES else "distribute"
        self.query_one("#threads", Input).value = "" if threads is None else str(threads)

    def set_status(self, text: str | Text) -> None:
        self.query_one("#switch-status", Static).update(text)

    def request(self) -> None:
        raw = self.query_one("#threads", Input).value.strip()
        threads = int(raw) if raw.isdigit() and int(raw) > 0 else None
        self.post_message(self.Apply(str(self.query_one("#weights", Select).value),
                                     str(self.query_one("#kv", Select).value),
                                     str(self.query_one("#policy", Select).value), threads))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            event.stop()
            self.request()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "threads":
            event.stop()
            self.request()


class LoadPanel(Vertical):
    """Progress of a model load or a placement switch: bar, bytes, bytes/s and phase."""

    def compose(self) -> ComposeResult:
        yield Static("", id="load-text")
        yield ProgressBar(total=None, show_eta=False, id="load-bar")

    def show(self, phase: str, done: int, total: int, rate: float, message: str = "") -> None:
        bar = self.query_one(ProgressBar)
        if total:
            bar.update(total=total, progress=done)
        if phase == "kernels":  # steps, not bytes: compiled once per machine, then read from the cache
            text = f"compiling kernels (first start only): {done}/{total}"
        else:
            text = f"{phase}: {fmt_bytes(done)} / {fmt_bytes(total)}" if total else f"{phase}"
        if rate:
            text += f" · {fmt_bytes(rate)}/s"
        if message:
            text += f" · {message}"
        self.query_one("#load-text", Static).update(text)


def fill_table(table: DataTable, rows: list[tuple[RenderableType, ...]]) -> None:
    """Show ``rows`` in ``table``. With as many rows as it has, only the cells that changed are
    replaced (a repaint); else it is filled anew (clearing re-measures every cell and resets the
    scroll)."""
    if table.row_count == len(rows):
        for y, row in enumerate(rows):
            for x, value in enumerate(row):
                if table.get_cell_at(Coordinate(y, x)) != value:
                    table.update_cell_at(Coordinate(y, x), value, update_width=True)
        return
    table.clear()
    table.add_rows(rows)


class Dashboard(VerticalScroll):
    """Everything the sampler measures, refreshed on each snapshot."""

    can_focus = True
    snapshot: reactive[Snapshot] = reactive(empty_snapshot, always_update=True, init=False)

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.palette = Palette()
        self.advice = AdviceView()

    def compose(self) -> ComposeResult:
        yield Readout("", id="banner")
        yield LoadPanel(id="load-panel")
        yield DashPanel("placement", Controls(id="controls"), id="controls-panel")
        yield DashPanel("memory per node", MemoryBars(id="memory"), id="memory-panel")  # per host, then node
        requests: DataTable = DataTable(id="requests", cursor_type="none", zebra_stripes=True)
        yield DashPanel("serving", Readout("", id="serving-text"), requests, id="serving-panel")
        yield DashPanel("token rates", RatesPanel(id="rates"), id="rates-panel")
        yield DashPanel("advice", Readout("", id="advice-text"), id="advice-panel")
        yield DashPanel("expert routing", RoutingView(id="routing"), id="routing-panel")
        table: DataTable = DataTable(id="workers", cursor_type="none", zebra_stripes=True)
        yield DashPanel("workers", table, id="workers-panel")
        yield DashPanel("topology", Readout("", id="topology"), id="topology-panel")

    def on_mount(self) -> None:
        self.query_one("#workers", DataTable).add_columns("worker", "thread", "cpu", "node", "reads", "busy",
                                                          "state")
        self.query_one("#requests", DataTable).add_columns("request", "state", "slot", "prompt", "tokens", "t/s",
                                                           "KV node", "age")
        self.snapshot = self.snapshot

    def show_advice(self, advice: AdviceView) -> None:
        """Show new advice (the app's advice worker made it); the measured rate follows the snapshots."""
        self.advice = advice
        self._advice(self.snapshot)

    def _advice(self, s: Snapshot) -> None:
        try:
            self.query_one("#advice-text", Readout).show(advice_view(self.advice, s.rates.current_decode))
        except NoMatches:
            pass

    def set_palette(self, palette: Palette) -> None:
        self.palette = palette
        self.snapshot = self.snapshot

    def watch_snapshot(self, s: Snapshot) -> None:
        try:
            banner = self.query_one("#banner", Readout)
        except NoMatches:  # not composed yet: on_mount shows it
            return
        banner.show(self._banner(s))
        memory = self.query_one("#memory-panel")
        title = "memory per host and node" if s.hosts else "memory per node"
        if memory.border_title != title:
            memory.border_title = title
        self.query_one(MemoryBars).show(s, self.palette)
        self.query_one(RatesPanel).show(s)
        self._advice(s)
        routing = self.query_one("#routing-panel")
        routing.display = s.routing is not None  # dense models have no routing
        if s.routing is not None:
            self.query_one(RoutingView).show(s.routing, self.palette)
        self._requests(s)
        self._workers(s)
        self.query_one("#topology", Readout).show(lambda: topology_view(s, self.palette), (s.topo, self.palette))

    def _banner(self, s: Snapshot) -> Text:
        t = Text()
        if s.simulated:
            t.append(f" SIMULATED: {s.source.split(':', 1)[-1]} ", style="bold reverse yellow")
            t.append(" memory and worker figures are computed, not measured ", style="yellow")
        elif s.source == "replay":
            t.append(" REPLAY ", style="bold reverse magenta")
        else:
            t.append(" LIVE ", style="bold reverse green")
        if s.model:
            p = s.placement
            t.append(f" {s.model} · weights {p.get('weights')} · KV {p.get('kv')} · "
                     f"{p.get('threads')} threads ({p.get('policy')})")
        else:
            t.append(" no model loaded", style="dim")
        for note in s.notes:
            if not note.startswith("SIMULATED"):
                t.append(f"\n⚠ {note}", style="yellow")
        return t

    def _workers(self, s: Snapshot) -> None:
        """One row per worker, showing where its share actually runs: worker 0's runs on the
        thread that calls the engine ("caller"), the others on their pinned pool threads."""
        rows: list[tuple[RenderableType, ...]] = []
        host = None
        for w in s.workers:
            if s.hosts and w.host != host:  # a pipeline: a heading row per host, its workers under it
                host = w.host
                heading = next((h for h in s.hosts if h.split(" ", 2)[1] == host), f"host {host}")
                rows.append((Text(heading.split(" · ")[0], style="bold underline"), "", "", "", "", "", ""))
            node = w.actual_node if w.actual_node is not None else None
            where = Text("-", style="dim") if node is None else Text(f"● {node}", style=self.palette.node(node))
            if w.actual_cpu is None:
                state = Text("no pass yet", style="dim")
            elif w.misplaced:
                meant = f"meant: node {w.node}" if w.thread == "caller" else f"pinned: cpu {w.cpu}"
                state = Text("⚠ misplaced", style="bold red")
                state.append(f" ({meant})")
            else:
                state = Text("ok", style="green")
            rows.append((str(w.index), w.thread, "-" if w.actual_cpu is None else str(w.actual_cpu), where,
                         w.uses, f"{100 * w.busy:5.1f}%", state))
        fill_table(self.query_one("#workers", DataTable), rows)

    def _requests(self, s: Snapshot) -> None:
        """The in-process server's active requests (``numawb --serve``); hidden when not serving."""
        panel = self.query_one("#serving-panel")
        panel.display = bool(s.serving or s.requests)
        if not panel.display:
            return
        running = [q for q in s.requests if q.state != "queued"]
        agg = sum(q.tps for q in running)
        self.query_one("#serving-text", Readout).show(
            Text(f"{s.serving} · {len(running)} running, {len(s.requests) - len(running)} queued · "
                 f"{agg:,.1f} t/s together", style="bold"))
        rows: list[tuple[RenderableType, ...]] = []
        for q in s.requests:
            if q.kv_bytes:  # measured: each node's share of its slot's KV cache
                kv = Text()
                for i, (n, b) in enumerate(q.kv_bytes):
                    kv.append(("," if i else "") + f"{n}:{b / 2**20:,.1f}M", style=self.palette.node(n))
            else:
                kv = Text("-", style="dim") if not q.kv_nodes else Text(
                    ",".join(str(n) for n in q.kv_nodes), style=self.palette.node(q.kv_nodes[0]))
            rows.append((q.id, q.state, "-" if q.slot < 0 else str(q.slot),
                         str(q.prompt_tokens) + (f" ({q.reused_tokens} reused)" if q.reused_tokens else ""),
                         str(q.tokens), f"{q.tps:,.1f}" if q.tps else "-", kv, f"{q.age:,.1f} s"))
        fill_table(self.query_one("#requests", DataTable), rows)

"""`numawb probe` and `numawb advise`: arguments and commands (registered by workbench/cli.py; the
model and huge-page flags from workbench/options.py, as every model command's)."""
from __future__ import annotations

import argparse
import json
import sys

from ..numa.modes import WEIGHT_MODE_HELP, parse_kv, parse_weights_list
from ..options import add_hugepages, add_model_path, hugepages_kb


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--refresh", action="store_true", help="probe again even if this machine has a cached probe")
    p.add_argument("--topology", metavar="FIXTURE", help="show a fixture machine's published (or assumed) figures")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def add_advise_arguments(p: argparse.ArgumentParser) -> None:
    add_model_path(p, "GGUF file (only its header is read; a split file's first part or a partial "
                      "download will do; default: Gemma 3 270M Q4_K_M)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size in tokens (KV cache memory)")
    p.add_argument("-d", "--depth", type=int, default=0, help="cached positions when decoding (KV reads)")
    p.add_argument("-t", "--threads", metavar="N[,N...]", help="thread counts (default: all cores; "
                   "on one node 1 and all, like bench)")
    p.add_argument("--weights", default="all", metavar="MODES|all", help=f"weights modes ({WEIGHT_MODE_HELP})")
    p.add_argument("--kv", default=None, metavar="MODES|all",
                   help="KV modes (default: first-touch, interleave and node:N of memory-only nodes)")
    p.add_argument("--topology", metavar="FIXTURE", help="predict for a fixture machine (simulated)")
    p.add_argument("--refresh", action="store_true", help="probe this machine again first")
    add_hugepages(p, "warn when a node has too few free explicit huge pages of this size for the "
                     "recommended placement (what run --hugepages would need)")
    p.add_argument("--no-measure", action="store_true",
                   help="do not measure the engine's overhead and kernels (memory traffic only)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


class _Progress:
    def __init__(self, quiet: bool):
        self.on = not quiet
        self.tty = sys.stderr.isatty()

    def __call__(self, msg: str) -> None:
        if self.on:
            sys.stderr.write(("\r\033[K" + msg) if self.tty else msg + "\n")
            sys.stderr.flush()

    def end(self) -> None:
        if self.on and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def run_probe(args: argparse.Namespace) -> int:
    """Raises ValueError (one line) on a user mistake."""
    from .advise import resolve_topology
    from .checks import format_warnings, machine_warnings
    from .probe import cache_path, format_profile, machine_profile
    topo = resolve_topology(args.topology)
    prog = _Progress(args.quiet or args.json)
    prof, cached = machine_profile(topo, refresh=args.refresh,
                                   progress=lambda d, t, m: prog(f"probing [{d}/{t}] {m}"))
    prog.end()
    warns = machine_warnings(topo, prof)
    if args.json:
        d = prof.to_json()
        d["cached"] = cached
        d["cache_file"] = str(cache_path(topo)) if topo.root == "/" else None
        d["warnings"] = [w.to_json() for w in warns]
        print(json.dumps(d, indent=2))
    else:
        print(format_profile(prof))
        if warns:
            print(format_warnings(warns))
        if topo.root == "/":
            print(f"{'cached' if cached else 'saved'}: {cache_path(topo)}"
                  + (" (--refresh probes again)" if cached else ""))
    return 0


def _ints(spec: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {spec!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{what}: expected integers >= 1, got {spec!r}")
    return vals


def run_advise(args: argparse.Namespace) -> int:
    """Raises ValueError (one line) on a user mistake."""
    from .advise import advise, resolve_topology
    topo = resolve_topology(args.topology)
    weights = parse_weights_list(args.weights)
    kvs = None
    if args.kv:
        from ..numa.modes import parse_kv_list
        kvs = parse_kv_list(args.kv, topo.node_ids)
        for k in kvs:
            parse_kv(k, topo.node_ids)
    threads = _ints(args.threads, "-t") if args.threads else None
    prog = _Progress(args.quiet or args.json)
    adv = advise(args.model, topo, args.ctx_size, depth=args.depth, threads=threads, weights=weights, kvs=kvs,
                 measure=not args.no_measure, refresh=args.refresh, progress=prog,
                 hugepages_kb=hugepages_kb(args.hugepages))
    prog.end()
    print(json.dumps(adv.to_json(), indent=2) if args.json else adv.format_table())
    return 0

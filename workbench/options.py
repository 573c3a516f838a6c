"""The model, placement and sampling options, and what they lead to: a checked `Placement`, a
loaded `Engine`, validated `SamplingParams`, and a completion printed as ``numawb generate``
prints it.

One module for them, below the front door and the services (docs/architecture.md): the command
line (``workbench.cli``), the server (``workbench.server``), the cluster (``workbench.cluster.cli``),
the advisor (``workbench.advisor.cli``) and bench take their flags from here and load through it,
so a flag reads the same and a mistake ends with the same one line (``UserError``) everywhere.

Imports nothing heavy at module level (no NumPy, Numba or Textual): building the parser for
``--help`` or ``topo`` stays light; the engine is imported by the functions that load it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Iterable

from .errors import UserError
from .numa.modes import KV_MODE_HELP, WEIGHT_MODE_HELP

#: ``--hugepages`` sizes, in KiB (the engine's ``Placement.hugepages_kb``)
HUGEPAGE_KB = {"2M": 2048, "1G": 1 << 20}
DEFAULT_MODEL_HELP = "GGUF model file (default: Gemma 3 270M Q4_K_M)"


def add_model_path(p: argparse.ArgumentParser, help: str = DEFAULT_MODEL_HELP) -> None:
    """-m/--model: the GGUF file (None: the default model)."""
    p.add_argument("-m", "--model", metavar="PATH", help=help)


def add_hugepages(p: argparse.ArgumentParser, help: str) -> None:
    """--hugepages 2M|1G (see `hugepages_kb`)."""
    p.add_argument("--hugepages", choices=list(HUGEPAGE_KB), help=help)


def hugepages_kb(size: str | None) -> int | None:
    """A ``--hugepages`` value in KiB (None: transparent huge pages)."""
    return HUGEPAGE_KB.get(size or "")


def add_model(p: argparse.ArgumentParser) -> None:
    """The model and placement options, shared by the app, the model commands and serve."""
    add_model_path(p)
    p.add_argument("-t", "--threads", metavar="N", help="worker threads (default: all cores given)")
    p.add_argument("--weights", default="none", metavar="MODE",
                   help="weight placement: " + WEIGHT_MODE_HELP + " (default: none)")
    p.add_argument("--kv", default="first-touch", metavar="MODE",
                   help="KV cache placement: " + KV_MODE_HELP + " (default: first-touch)")
    p.add_argument("--numa", default="distribute", choices=["distribute", "isolate"],
                   help="worker spread: over all nodes, or on one node (default: distribute)")
    p.add_argument("--cpus", metavar="LIST", help="pin workers to these CPUs, e.g. 0-7,16-23")
    p.add_argument("--smt", action="store_true", help="use SMT siblings too (default: physical cores only)")
    add_hugepages(p, "explicit hugetlbfs pages for weights and KV (checked per node before allocating; "
                     "released at exit). Default: transparent huge pages")
    p.add_argument("--no-numa-balancing", action="store_true",
                   help="turn the kernel's automatic NUMA balancing off for this run (root; restored at exit)")
    p.add_argument("--drop-caches", action="store_true",
                   help="drop the page cache before loading, for a cold load (root)")


def add_sampling(p: argparse.ArgumentParser) -> None:
    """The sampling options and the reply length of ``generate`` (see `sampling_params`)."""
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size in tokens")


def count(text: Any, flag: str) -> int | None:
    """A positive whole number given as ``flag`` (None when not given)."""
    if text is None:
        return None
    try:
        n = int(str(text).strip())
    except ValueError:
        raise UserError(f"{flag} must be a whole number >= 1 (got {text!r})") from None
    if n < 1:
        raise UserError(f"{flag} must be >= 1 (got {n})")
    return n


def build_placement(args: argparse.Namespace):
    """The Placement the engine and the app receive, checked: mode names, threads, CPU list."""
    from .engine.engine import Placement
    from .numa.modes import parse_kv, parse_weights
    from .numa.topology import parse_cpulist
    weights = parse_weights(args.weights)
    kv = parse_kv(args.kv)
    if kv.startswith("node:"):
        from .numa.topology import load_topology
        parse_kv(kv, load_topology().node_ids)
    threads = count(args.threads, "-t")
    try:
        cpus = parse_cpulist(args.cpus) if args.cpus else None
    except ValueError:
        raise UserError(f"--cpus {args.cpus!r} is not a CPU list like 0-7,16") from None
    return Placement(weights=weights, kv=kv, threads=threads, policy=args.numa, cpus=cpus, smt=args.smt,
                     hugepages_kb=hugepages_kb(args.hugepages))


_guards: list = []  # kept alive for the process: restore system settings at exit


def system_knobs(args: argparse.Namespace) -> None:
    """--no-numa-balancing and --drop-caches (root), before anything is loaded."""
    if not (getattr(args, "no_numa_balancing", False) or getattr(args, "drop_caches", False)):
        return
    from .numa.system import disable_numa_balancing, drop_page_cache
    try:
        if getattr(args, "no_numa_balancing", False):
            _guards.append(disable_numa_balancing())
        if getattr(args, "drop_caches", False):
            drop_page_cache()
    except (PermissionError, FileNotFoundError) as e:
        raise UserError(str(e)) from None


def load_engine(args: argparse.Namespace, quiet: bool = False):
    """The Engine the model and placement options ask for (progress on a terminal's stderr unless
    ``quiet``); a file or a placement it cannot load is a UserError."""
    from .engine import Engine
    from .engine.gguf_file import ModelLoadError

    placement = build_placement(args)
    system_knobs(args)

    def progress(ev) -> None:
        if not quiet and ev.stage == "load" and ev.total and sys.stderr.isatty():
            print(f"\rloading {ev.done / 2**20:8.1f} / {ev.total / 2**20:.1f} MiB "
                  f"({ev.bytes_per_s / 2**20:.0f} MiB/s)", end="", file=sys.stderr)

    try:
        eng = Engine.load(args.model, placement=placement, progress=progress)
    except (ModelLoadError, ValueError) as e:  # ValueError: a placement the machine cannot do
        raise UserError(str(e)) from None
    if not quiet and sys.stderr.isatty():
        print(file=sys.stderr)
    return eng


def sampling_params(args: argparse.Namespace):
    """The SamplingParams of the sampling options (`add_sampling`), checked with -n."""
    from .engine.sampling import SamplingParams
    if args.n_predict < 0:
        raise UserError(f"-n must be >= 0 (got {args.n_predict})")
    params = SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repeat_penalty=args.repeat_penalty, seed=args.seed)
    try:
        params.validate()
    except ValueError as e:
        raise UserError(str(e)) from None
    return params


def print_completion(args: argparse.Namespace, ids: list[int], events: Iterable[Any],
                     extra: Callable[[], dict[str, Any]], line_end: Callable[[], str] = lambda: "") -> int:
    """What ``numawb generate`` prints, over one engine or a cluster: the text as it streams, then
    one line of rates (``line_end`` after it), or with --json one object (``extra``'s keys added).
    A prompt that does not fit the context is a UserError."""
    from .engine.events import ContextFullError, DoneEvent, TokenEvent
    done = None
    try:
        for ev in events:
            if isinstance(ev, TokenEvent) and not args.json:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, DoneEvent):
                done = ev
    except ContextFullError as e:
        raise UserError(str(e)) from None
    st = done.stats
    if args.json:
        print(json.dumps({"prompt_tokens": ids, "tokens": done.tokens, "text": done.text,
                          "prompt_tps": st.prompt_tps, "decode_tps": st.decode_tps, "ttft": st.ttft,
                          "stop_reason": st.stop_reason, **extra()}, ensure_ascii=False))
    else:
        print()
        print(f"prompt: {st.prompt_tokens} tokens, {st.prompt_tps:.1f} t/s | "
              f"decode: {st.decode_tokens} tokens, {st.decode_tps:.1f} t/s | ttft {st.ttft * 1000:.0f} ms"
              + line_end())
    return 0


__all__ = ["HUGEPAGE_KB", "add_hugepages", "add_model", "add_model_path", "add_sampling", "build_placement",
           "count", "hugepages_kb", "load_engine", "print_completion", "sampling_params", "system_knobs"]

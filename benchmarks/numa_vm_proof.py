"""Where a decoded token's reads land on a multi-node machine: run inside the 2-node guest of
`scripts/numa_vm_proof.sh` (which also runs it on the host first, with `--warm`, to fill the Numba
cache the guest loads from).

    python3 benchmarks/numa_vm_proof.py attention FILE...        # KV pages and reads per worker
    python3 benchmarks/numa_vm_proof.py experts FILE --modes ... # weights pages, expert reads per worker
    python3 benchmarks/numa_vm_proof.py placement FILE --modes ...   # weights pages only (no decode)

Every figure comes from the kernel: pages per node from move_pages(2) on the buffers, reads per
worker from `engine.chunk_log.ChunkLog` (every crew chunk with the CPU that ran it, the rows it read
and their address; the bytes' nodes again from move_pages). The guest is emulated (QEMU TCG): its
rates mean nothing and none are printed. Output: markdown on stdout (the shell script collects it
into benchmarks/results-numa-vm.md).

--warm (on the one-node host): the host's CPUs seen as the guest's two nodes (`numa_vm_fake.py`: the
same plans, layouts, KV owners and so compiled calls as in the guest go into the cache; before, two
KV owners on one node stood in, and the calls over weights split between two nodes were missing);
nothing is proven then.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workbench.numa import load_topology  # noqa: E402
from workbench.numa import syscalls as sc  # noqa: E402
from workbench.numa.proof import page_nodes  # noqa: E402

OK = 0.99


def out(line: str = "") -> None:
    print(line, flush=True)


def no_backoff() -> None:
    """The crew's back-off off: after passes spent mostly waiting for a worker (a guest's vCPUs
    share one host CPU) the runtime runs passes `solo`, the caller taking every chunk, those of the
    other node's workers included; the proof is of the split the crew runs, so it keeps the crew."""
    from workbench.engine import runtime
    runtime.CREW_STARVED = 1 << 40


def drop_caches() -> None:
    """Drop the page cache (root; the guest's): the last mode's read of the file does not crowd a
    node's free memory, which the plan checks a mirror against."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def fake_nodes() -> None:
    """--warm on a one-node host: its CPUs seen as two nodes (each worker its node's KV owner)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from numa_vm_fake import two_nodes
    two_nodes()


def node_counts(arrays) -> dict[int, int]:
    """Pages per node (move_pages) over the arrays; -1: untouched."""
    counts: dict[int, int] = defaultdict(int)
    for a in arrays:
        if a.nbytes == 0:
            continue
        r = page_nodes(a, max_pages=1 << 16)
        if not r:
            raise OSError(r.reason)
        for s in r.value:
            counts[s if s >= 0 else -1] += 1
    return dict(counts)


def share_line(counts: dict[int, int], node: int | None) -> str:
    present = sum(v for k, v in counts.items() if k >= 0)
    parts = ", ".join(f"node {k}: {v}" for k, v in sorted(counts.items()) if k >= 0)
    absent = counts.get(-1, 0)
    tail = f" ({absent} untouched)" if absent else ""
    if node is None or not present:
        return f"{parts}{tail}"
    return f"{parts} -> {100 * counts.get(node, 0) / present:.2f} % on node {node}{tail}"


def workers_line(pool) -> list[str]:
    return [f"worker {w.index}: cpu {w.actual_cpu} node {w.actual_node} (pinned to cpu {w.cpu}, node {w.node})"
            for w in pool.check()]


def ranges(pos: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    if not pos:
        return "none"
    pos = sorted(pos)
    out_, a = [], pos[0]
    for p, q in zip(pos, pos[1:] + [None]):
        if q != p + 1:
            out_.append(f"{a}-{p}" if p > a else str(a))
            a = q
    return ", ".join(out_)


# ---------------------------------------------------------------------------------------- attention
def attention(path: str, prompt: int, decode: int, warm: bool) -> bool:
    from workbench.engine import Engine
    from workbench.engine.chunk_log import ChunkLog, bytes_by_node, kv_reads
    from workbench.engine.engine import Placement
    t0 = time.time()
    eng = Engine.load(path, placement=Placement(threads=2))
    ok = True
    try:
        cfg, pool = eng.cfg, eng.pool
        s = eng.new_session(512)
        rng = np.random.default_rng(7)
        s.eval([int(t) for t in rng.integers(4, cfg.n_vocab, prompt)])
        kv = s.kv
        no = kv.n_workers
        s.eval([int(rng.integers(4, cfg.n_vocab))])   # the crew starts at the first decoded token
        prompt += 1
        with ChunkLog(eng.rt.crew) as log:
            for i in range(decode):
                s.eval([int(rng.integers(4, cfg.n_vocab))])
        loaded = time.time() - t0
        if warm:
            out(f"warm: {os.path.basename(path)} {len(log.reads)} chunks logged, {loaded:.0f} s")
        n_pos = prompt + decode
        out(f"### {os.path.basename(path)} ({cfg.arch}, {cfg.n_layer} blocks, {type(kv).__name__}, "
            f"{no} owners {kv.owner_workers})")
        out()
        out(f"{prompt}-token prompt, then {decode} decoded tokens logged ({len(log.reads)} crew chunks, "
            f"{log.dropped} dropped); the last token sees positions 0-{n_pos - 1}.")
        out()
        for line in workers_line(pool):
            out(f"- {line}")
        out()
        # KV pages per owner (move_pages over every layer's part of the owner)
        out("| owner | its workers | node | KV pages per node (move_pages) |")
        out("|---|---|---|---|")
        owner_node = []
        for o, ws in enumerate(kv.owner_workers):
            node = pool.workers[ws[0]].node
            owner_node.append(node)
            arrs = [a for il in range(cfg.n_layer) for a in kv.k_bytes[il][o] + kv.v_bytes[il][o]]
            c = node_counts(arrs)
            present = sum(v for k, v in c.items() if k >= 0)
            share = c.get(node, 0) / present if present else 0.0
            ok &= share >= OK
            out(f"| {o} | {ws} | {node} | {share_line(c, node)} |")
        out()
        # reads per CPU: keys (positions) and values (V^T rows over the owner's slots)
        cpu_node = {w.cpu: w.node for w in pool.workers}
        by_cpu = kv_reads(log.reads, kv)
        last_keys: dict[int, set] = {}
        out("| worker cpu (node) | KV positions its key chunks read (all decoded tokens) | owners | "
            "KV bytes read | on its node (move_pages) |")
        out("|---|---|---|---|---|")
        for cpu, (owner_pos, reads) in sorted(by_cpu.items()):
            node = cpu_node.get(cpu)
            by = bytes_by_node(reads)
            tot = sum(by.values())
            share = by.get(node, 0) / tot if tot else 0.0
            owners = sorted({o for o, _ in owner_pos})
            pos = sorted({p for _, p in owner_pos})
            ok &= share >= OK and all(owner_node[o] == node for o in owners)
            # each owner's positions are its node's blocks: the worker reads no other node's position
            foreign = [p for p in pos if owner_node[(p // 32) % no] != node]
            ok &= not foreign
            out(f"| {cpu} ({node}) | {ranges(pos)} ({len(pos)} positions) | {owners} | {tot} | "
                f"{100 * share:.2f} % |")
            last_keys[cpu] = set(pos)
        union = set().union(*last_keys.values()) if last_keys else set()
        ok &= union == set(range(n_pos)) and sum(len(v) for v in last_keys.values()) == n_pos
        out()
        out(f"Every position 0-{n_pos - 1} read by exactly one node's workers: "
            f"{'yes' if union == set(range(n_pos)) and sum(len(v) for v in last_keys.values()) == n_pos else 'NO'}.")
        out()
    finally:
        eng.close()
    return ok


# ---------------------------------------------------------------------------------------- weights
def tensor_class(name: str) -> str:
    if "_exps" in name:
        return "routed experts"
    if "_shexp" in name:
        return "shared expert"
    if re.search(r"attn_(k_b|v_b)", name):
        return "MLA per-head (attn_k_b, attn_v_b)"
    if "attn" in name:
        return "attention"
    if re.search(r"ffn_(gate|up|down)\.", name):
        return "dense FFN"
    if "ffn_gate_inp" in name or "exp_probs" in name:
        return "router"
    if "norm" in name:
        return "norms"
    return "embeddings and output"


def weights_pages(layout) -> list[tuple[str, str, dict[int, int], int | None]]:
    """(class, copy, pages per node, intended node) per tensor class and copy."""
    acc: dict[tuple[str, object], dict[int, int]] = {}
    for name in layout.specs:
        for view, _lo, _g0, node in layout.copies(name):
            key = (tensor_class(name), node)
            c = node_counts([view.reshape(-1)])
            d = acc.setdefault(key, defaultdict(int))
            for k, v in c.items():
                d[k] += v
    return [(cls, "interleaved / OS" if node is None else f"node {node}", dict(c), node)
            for (cls, node), c in sorted(acc.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]


def expert_reads_static(layout, pool) -> dict[int, dict[int, int]]:
    """Per worker: bytes per node of the expert rows it computes (`expert_split`, read through
    `expert_rows`), every expert of every routed tensor: what the engine hands each worker."""
    from workbench.engine.chunk_log import Read, bytes_by_node
    out_: dict[int, dict[int, int]] = {}
    for w in pool.workers:
        reads = []
        for name, spec in layout.specs.items():
            if "_exps" not in name:
                continue
            for e in range(spec.groups):
                lo, hi = layout.expert_split(name, e)[w.index]
                if hi <= lo:
                    continue
                arr, first = layout.expert_rows(name, w.index, e)
                rows = arr[lo - first:hi - first]
                reads.append(Read(w.cpu, 0, rows.ctypes.data, spec.row_bytes, 0, 0, rows.shape[0], 1))
        out_[w.index] = bytes_by_node(reads)
    return out_


def experts(path: str, modes: list[str], decode: int, warm: bool, decode_on: bool = True) -> bool:
    from workbench.engine import Engine
    from workbench.engine.engine import Placement
    ok = True
    for mode in modes:
        if not warm:
            drop_caches()
        t0 = time.time()
        eng = Engine.load(path, placement=Placement(threads=2, weights=mode))
        try:
            layout, pool = eng.layout, eng.pool
            if True:
                out(f"#### {os.path.basename(path)}: weights `{mode}` "
                    f"({len(layout.specs)} tensors, {eng.cfg.n_layer} blocks; loaded in the guest in "
                    f"{time.time() - t0:.0f} s)")
                out()
                for line in workers_line(pool):
                    out(f"- {line}")
                out()
                out("| tensor class | copy | pages per node (move_pages) |")
                out("|---|---|---|")
                for cls, copy, c, node in weights_pages(layout):
                    present = sum(v for k, v in c.items() if k >= 0)
                    if node is not None and present:
                        ok &= c.get(node, 0) / present >= OK
                    out(f"| {cls} | {copy} | {share_line(c, node)} |")
                out()
                out("| worker (node) | routed-expert bytes it is handed (expert_split) per node | local |")
                out("|---|---|---|")
                handed = expert_reads_static(layout, pool)
                for w in pool.workers:
                    by = handed[w.index]
                    tot = sum(by.values())
                    loc = by.get(w.node, 0) / tot if tot else 0.0
                    if mode in ("slice", "experts", "mirror"):
                        ok &= loc >= OK
                    out(f"| {w.index} ({w.node}) | {dict(sorted(by.items()))} | {100 * loc:.2f} % |")
                out()
            if decode_on:
                ok &= expert_decode(eng, decode, mode, warm)
        finally:
            eng.close()
    return ok


def expert_decode(eng, decode: int, mode: str, warm: bool) -> bool:
    """Decode tokens with the chunk log on: per worker, routed-expert bytes read per node."""
    from workbench.engine.chunk_log import ChunkLog, bytes_by_node
    layout, pool = eng.layout, eng.pool
    s = eng.new_session(256)
    rng = np.random.default_rng(3)
    s.eval([int(t) for t in rng.integers(4, eng.cfg.n_vocab, 8)])
    s.eval([int(rng.integers(4, eng.cfg.n_vocab))])   # the crew starts at the first decoded token
    with ChunkLog(eng.rt.crew) as log:
        for i in range(decode):
            s.eval([int(rng.integers(4, eng.cfg.n_vocab))])
    if warm:
        out(f"warm: {mode} {len(log.reads)} chunks")
    spans = []
    for name in layout.specs:
        cls = tensor_class(name)
        for view, _lo, _g0, _node in layout.copies(name):
            spans.append((view.ctypes.data, view.ctypes.data + view.nbytes, cls))
    spans.sort()
    starts = np.array([a for a, _, _ in spans])

    def cls_of(addr: int) -> str:
        i = int(np.searchsorted(starts, addr, side="right")) - 1
        if i >= 0 and addr < spans[i][1]:
            return spans[i][2]
        return "other (KV cache, activations)"
    cpu_node = {w.cpu: w.node for w in pool.workers}
    per: dict[tuple[int, str], list] = defaultdict(list)
    for r in log.reads:
        per[(r.cpu, cls_of(r.addr))].append(r)
    out(f"{decode} decoded tokens with the chunk log: {len(log.reads)} crew chunks ({log.dropped} dropped).")
    out()
    out("| worker cpu (node) | class | bytes read | per node (move_pages) | local |")
    out("|---|---|---|---|---|")
    ok = True
    for (cpu, cls), reads in sorted(per.items()):
        by = bytes_by_node(reads)
        tot = sum(by.values())
        node = cpu_node.get(cpu)
        loc = by.get(node, 0) / tot if tot else 0.0
        if cls == "routed experts" and mode in ("slice", "experts", "mirror"):
            ok &= loc >= OK
        out(f"| {cpu} ({node}) | {cls} | {tot} | {dict(sorted(by.items()))} | {100 * loc:.1f} % |")
    out()
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("attention", "experts", "placement"))
    ap.add_argument("files", nargs="+")
    ap.add_argument("--modes", default="mirror,interleave,slice,experts,none")
    ap.add_argument("--prompt", type=int, default=100)
    ap.add_argument("--decode", type=int, default=4)
    ap.add_argument("--warm", action="store_true", help="on a one-node host: fill the Numba cache only")
    a = ap.parse_args()
    no_backoff()
    if a.warm:
        fake_nodes()
    elif len(load_topology().node_ids) < 2:
        sys.exit("needs a kernel with >= 2 NUMA nodes (or --warm)")
    modes = a.modes.split(",")
    ok = True
    for f in a.files:
        if a.what == "attention":
            ok &= attention(f, a.prompt, a.decode, a.warm)
        else:
            ok &= experts(f, modes, a.decode, a.warm, decode_on=a.what == "experts")
    if a.warm:   # one node: nothing is proven (a worker may take the other's chunks: same node)
        out(f"warm-up done ({a.what})")
        return 0
    out(f"PROOF {'PASSED' if ok else 'FAILED'} ({a.what})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

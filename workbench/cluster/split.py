"""Which layers each host holds: contiguous ranges sized by free memory, or, when every host has
a cached advisor probe, by its measured bandwidth within its free memory; checked per host and
node before anything loads. Pure functions over header facts (no Ray, no engine)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..numa.budget import fmt_bytes
from . import ClusterError


def layer_of(name: str) -> int | None:
    """The block index of a tensor name (``blk.N.*``), None for the model-wide tensors."""
    if not name.startswith("blk."):
        return None
    return int(name.split(".", 2)[1])


def layer_bytes(tensor_bytes: Mapping[str, int], n_layer: int) -> list[int]:
    """Weight bytes of each layer."""
    out = [0] * n_layer
    for name, nb in tensor_bytes.items():
        il = layer_of(name)
        if il is not None and il < n_layer:
            out[il] += nb
    return out


def host_bandwidth(profile: Any, threads_by_node: Mapping[int, int]) -> float:
    """Bytes/s a host's workers can stream from their own nodes' memory: the probe's local
    bandwidth at each node's worker count, summed over the nodes the workers are on. Decoding
    reads every weight once per token, so a stage's time per token is its bytes over this."""
    return float(sum(profile.threads_bw(node, n) for node, n in threads_by_node.items() if n > 0))


def bandwidth_shares(total: float, free: Sequence[float], bandwidth: Sequence[float]) -> list[float]:
    """Bytes of the model for each host: in proportion to its bandwidth (every stage then takes
    the same time per token), but none above its free memory; what a full host cannot take goes
    to the others, again by bandwidth (water-filling)."""
    share = [0.0] * len(free)
    left = [i for i in range(len(free))]
    rest = float(total)
    while left:
        wsum = sum(bandwidth[i] for i in left)
        over = [i for i in left if rest * bandwidth[i] / wsum > free[i]]
        if not over:
            for i in left:
                share[i] = rest * bandwidth[i] / wsum
            break
        for i in over:
            share[i] = float(free[i])
            rest -= free[i]
            left.remove(i)
    return share


def split_layers(per_layer: Sequence[int], capacity: Sequence[int], first_extra: int = 0,
                 last_extra: int = 0, bandwidth: Sequence[float | None] | None = None) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) ranges, one per host in order, each host's share of the weights in
    proportion to its `capacity` (free bytes), or, when every host has a `bandwidth` (a cached
    probe), to its bandwidth within its free memory (`bandwidth_shares`); the first host also
    holds `first_extra` bytes (the embedding) and the last `last_extra` (the output head). Every
    host gets a layer."""
    n, hosts = len(per_layer), len(capacity)
    if hosts == 0:
        raise ClusterError("the Ray cluster has no alive node")
    if n < hosts:
        raise ClusterError(f"the model has {n} layers, fewer than the cluster's {hosts} hosts: "
                           f"use a cluster of at most {n} nodes")
    cap = [max(int(c), 1) for c in capacity]
    total = sum(per_layer) + first_extra + last_extra
    if bandwidth is not None and len(bandwidth) == hosts and all(b and b > 0 for b in bandwidth):
        cap = [max(s, 1e-9) for s in bandwidth_shares(total, cap, [float(b) for b in bandwidth])]
    bounds, lo, acc = [], 0, first_extra
    for h in range(hosts - 1):
        target = total * sum(cap[:h + 1]) / sum(cap)
        hi = lo + 1  # at least one layer here, and leave one for each later host
        acc += per_layer[lo]
        while hi < n - (hosts - 1 - h) and acc + per_layer[hi] / 2 <= target:
            acc += per_layer[hi]
            hi += 1
        bounds.append((lo, hi))
        lo = hi
    bounds.append((lo, n))
    return bounds


@dataclass
class HostNeed:
    """One host's plan for its part: bytes needed and free per NUMA node (from make_plan)."""

    host: str
    layers: tuple[int, int]
    need: dict[int, int]
    free: dict[int, int]
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(v <= self.free.get(k, 0) for k, v in self.need.items() if v > 0)

    def line(self) -> str:
        nodes = ", ".join(f"node {n} need {fmt_bytes(self.need.get(n, 0))} free {fmt_bytes(self.free.get(n, 0))}"
                          for n in sorted(set(self.need) | set(self.free)))
        mark = "" if self.fits else " <- no room"
        return f"host {self.host} layers {self.layers[0]}..{self.layers[1] - 1}: {nodes}{mark}"


def check_room(needs: Sequence[HostNeed]) -> None:
    """Refuse (one line, need and free per host and node) unless every host's part fits."""
    bad = [h for h in needs if not h.fits]
    if bad:
        who = ", ".join(h.host for h in bad)
        raise ClusterError(f"no room for the model's part on host(s) {who} (nothing was loaded): "
                           + "; ".join(h.line() for h in needs))


def check_files(files: Sequence[tuple[str, str, int, str]]) -> None:
    """Refuse by name the hosts whose model file differs from the first host's: `files` holds
    (host, path, size, header digest) per host; a missing file has size -1 and its reason as digest."""
    missing = [(h, p, why) for h, p, size, why in files if size < 0]
    if missing:
        raise ClusterError("; ".join(f"host {h}: {p}: {why}" for h, p, why in missing))
    ref_host, ref_path, ref_size, ref_digest = files[0]
    bad = []
    for host, path, size, digest in files[1:]:
        if size != ref_size:
            bad.append(f"host {host}: {path} is {size} bytes, host {ref_host}'s {ref_path} is {ref_size}")
        elif digest != ref_digest:
            bad.append(f"host {host}: {path} has another GGUF header than host {ref_host}'s {ref_path}")
    if bad:
        raise ClusterError("model file differs between hosts: " + "; ".join(bad))

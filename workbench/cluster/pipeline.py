"""The driver of a model pipelined over the hosts of a Ray cluster.

`RayPipeline.load` starts one `StageHost` actor per alive Ray node (pinned to it), compares the
hosts' model files (size and header), splits the layers by each host's free memory, has each
host plan its part with the placement plan (need and free per node) and refuses before anything
loads if one does not fit; then every host loads its part at once. `generate` streams tokens:
prompt batches and then single tokens go stage to stage (only hidden states between hosts; the
last host samples and sends back a token id). Every remote call has a timeout; a host that dies
or stops answering ends the request with one line naming it, and `reload` makes the pipeline
usable again.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import ClusterError, require_ray
from .host import StageHost
from .split import HostNeed, check_files, check_room, layer_bytes, split_layers

PROMPT_BATCH = 512        # prompt tokens per pipeline message (as Session.eval)
STEP_TIMEOUT = 600.0      # seconds for one pipeline step (a prompt batch through every host)
LOAD_TIMEOUT = 3600.0     # seconds for a host to compile its kernels and read its part
CALL_TIMEOUT = 120.0      # seconds for a small control call (describe, plan, open, proof)


@dataclass
class Host:
    """A Ray node holding one stage."""

    node_id: str
    ip: str
    label: str
    path: str
    actor: Any = None
    layers: tuple[int, int] = (0, 0)
    info: dict = field(default_factory=dict)


def host_label(ip: str, node_id: str) -> str:
    """How a host is named in messages: its address and the start of its Ray node id (several
    Ray nodes on one machine are separate hosts)."""
    return f"{ip}/{node_id[:6]}"


def alive_nodes(ray) -> list[dict]:
    """The cluster's alive nodes, the driver's own node first (its stage embeds the tokens)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    here = ray.get_runtime_context().get_node_id()
    nodes.sort(key=lambda n: (n["NodeID"] != here, n["NodeManagerAddress"], n["NodeID"]))
    return nodes


def reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse in one line, within `timeout`, an address nothing listens on (ray.init itself
    retries for minutes). 'auto' and ray:// addresses are left to Ray."""
    import socket
    if address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--ray {address!r}: give the head's HOST:PORT (e.g. 10.0.0.1:6379) or 'auto'")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


class RayPipeline:
    """A GGUF model split over a Ray cluster's nodes (see module doc)."""

    def __init__(self, address: str, model: str | None = None, placement: Any = None, n_ctx: int = 4096,
                 paths: Mapping[str, str] | None = None, step_timeout: float = STEP_TIMEOUT,
                 load_timeout: float = LOAD_TIMEOUT, call_timeout: float = CALL_TIMEOUT,
                 transport: str = "compiled"):
        from ..engine.engine import Placement, default_model_path
        self.ray = require_ray()
        self.address = address
        self.model = model or default_model_path()
        self.placement = placement or Placement()
        self.n_ctx = n_ctx
        self.paths = dict(paths or {})  # node id (or its first characters) or ip -> the model's path there
        self.step_timeout, self.load_timeout, self.call_timeout = step_timeout, load_timeout, call_timeout
        self.hosts: list[Host] = []
        self.transport = transport  # one-token steps: "compiled" (a compiled graph) or "calls"
        self.transport_note = ""
        self.dag = None
        self.tokenizer = None
        self.n_embd = 0
        self.n_layer = 0
        self.tokens: list[int] = []   # positions every stage's cache holds
        self.broken: str | None = None
        self.lock = threading.RLock()
        self._sid = 0
        self.load_seconds = 0.0

    # -- connecting and loading ----------------------------------------------------
    def connect(self) -> None:
        ray = self.ray
        reachable(self.address)
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False,
                         include_dashboard=False)
            except (ConnectionError, ValueError, RuntimeError) as e:
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ClusterError(f"cannot reach the Ray cluster at {self.address}: {msg}") from None

    def _path_for(self, node_id: str, ip: str) -> str:
        for key, path in self.paths.items():
            if node_id.startswith(key) or key == ip:
                return path
        return self.model

    def _get(self, refs: Any, timeout: float, what: str, hosts: Sequence[Host] | None = None) -> Any:
        """ray.get with a timeout; errors become one line naming the host."""
        ray = self.ray
        single = not isinstance(refs, list)
        lst = [refs] if single else refs
        hosts = list(hosts) if hosts is not None else self.hosts
        try:
            out = ray.get(lst, timeout=timeout)
        except Exception as e:
            raise self._failure(e, lst, hosts, what, timeout) from None
        return out[0] if single else out

    def _failure(self, e: BaseException, refs: list, hosts: Sequence[Host], what: str, timeout: float) -> ClusterError:
        """The one-line error for a failed call over `refs` (one per host, in pipeline order): the
        host whose actor died (its id travels with the error down the chain), the host whose step
        raised (its message starts with the host), or on a timeout the first that has not answered."""
        ray = self.ray
        exc = ray.exceptions
        culprit, reason = None, None
        if isinstance(e, exc.RayActorError):
            aid = getattr(e, "actor_id", None)
            culprit = next((h for h in hosts if h.actor is not None and aid and h.actor._actor_id.hex() == aid), None)
            reason = f"stopped during {what} (its Ray actor died)"
            if culprit is None:  # no id: the first host whose call ended with a death
                for h, r in zip(hosts, refs):
                    if ray.wait([r], timeout=0)[0]:
                        try:
                            ray.get(r, timeout=0)
                        except exc.RayActorError:
                            culprit = h
                            break
                        except Exception:  # noqa: BLE001
                            continue
        elif isinstance(e, exc.RayTaskError):
            cause = e.cause if getattr(e, "cause", None) is not None else e
            text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
            culprit = next((h for h in hosts if text.startswith(f"host {h.label}: ")), None)
            if culprit is not None:
                text = text[len(f"host {culprit.label}: "):]
            reason = f"failed during {what}: {text}"
        elif isinstance(e, exc.GetTimeoutError):
            for h, r in zip(hosts, refs):
                if not ray.wait([r], timeout=0)[0]:
                    culprit = h
                    break
            reason = f"did not answer {what} within {timeout:g} s"
        if culprit is not None:
            self.broken = f"host {culprit.label} {reason}"
        else:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.broken = f"{what} failed: {reason or type(e).__name__}" + (f" ({first})" if first and not reason else "")
        line = self.broken
        if what not in ("describe", "plan", "metadata"):
            line += " -- reload to go on"
        return ClusterError(line)

    def load(self) -> None:
        """Start the stages and load every host's part (see module doc). Raises ClusterError."""
        from ..engine.tokenizer import Tokenizer
        ray = self.ray
        self.connect()
        t0 = time.perf_counter()
        self.close_actors()
        self.broken = None
        Actor = ray.remote(num_cpus=0, max_restarts=0)(StageHost)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        hosts = []
        for n in alive_nodes(ray):
            nid, ip = n["NodeID"], n["NodeManagerAddress"]
            label = host_label(ip, nid)
            actor = Actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
                                  name=None).remote(label)
            hosts.append(Host(nid, ip, label, self._path_for(nid, ip), actor))
        self.hosts = hosts
        try:
            infos = self._get([h.actor.describe.remote(h.path) for h in hosts], self.call_timeout, "describe")
            for h, info in zip(hosts, infos):
                h.info = info
            check_files([(h.label, h.path, h.info["size"], h.info["digest"]) for h in hosts])
            ref = hosts[0].info
            self.n_layer, self.n_embd = ref["n_layer"], ref["n_embd"]
            sizes = ref["tensor_bytes"]
            per_layer = layer_bytes(sizes, self.n_layer)
            first_extra = sizes.get("token_embd.weight", 0)
            last_extra = sizes.get("output.weight", sizes.get("token_embd.weight", 0)) + sizes.get("output_norm.weight", 0)
            # each host's free memory (every node, or the budget) decides its share
            free = self._get([h.actor.plan.remote(h.path, (0, 1), self.placement, 1) for h in hosts],
                             self.call_timeout, "plan")
            capacity = [sum(f["free"].values()) for f in free]
            ranges = split_layers(per_layer, capacity, first_extra, last_extra)
            for h, r in zip(hosts, ranges):
                h.layers = r
            plans = self._get([h.actor.plan.remote(h.path, h.layers, self.placement, self.n_ctx) for h in hosts],
                              self.call_timeout, "plan")
            check_room([HostNeed(h.label, h.layers, p["need"], p["free"], p["notes"]) for h, p in zip(hosts, plans)])
            md = self._get(hosts[0].actor.metadata.remote(hosts[0].path), self.call_timeout, "metadata", hosts[:1])
            try:
                self.tokenizer = Tokenizer.from_metadata(md)
            except ValueError as e:
                raise ClusterError(f"{hosts[0].path}: {e}") from None
            loaded = self._get([h.actor.load.remote(h.path, h.layers, self.placement) for h in hosts],
                               self.load_timeout, "load")
            for h, info in zip(hosts, loaded):
                h.info.update(info)
            self._open()
            self._compile()
        except BaseException:
            self.close_actors()
            raise
        self.load_seconds = time.perf_counter() - t0

    def _open(self) -> None:
        self._sid += 1
        got = self._get([h.actor.open.remote(self._sid, self.n_ctx) for h in self.hosts], self.call_timeout, "open")
        self.n_ctx = min(got)
        self.tokens = []

    def _compile(self) -> None:
        """A compiled graph through every stage for one-token steps (Ray's channels: no task
        submission per token; see benchmarks/cluster_handoff.py); actor calls if it cannot be built."""
        self.dag = None
        if self.transport != "compiled":
            return
        try:
            from ray.dag import InputNode
            with InputNode() as inp:
                out = inp
                for h in self.hosts:
                    out = h.actor.step.bind(out)
            self.dag = out.experimental_compile()
        except Exception as e:  # noqa: BLE001 -- an older Ray, or channels this setup cannot make
            self.dag = None
            self.transport_note = f"compiled graph unavailable ({type(e).__name__}); actor calls per stage"

    def _teardown(self) -> None:
        dag, self.dag = getattr(self, "dag", None), None
        if dag is not None:  # may wait on a dead actor: in the background, bounded
            t = threading.Thread(target=dag.teardown, daemon=True)
            t.start()
            t.join(10)

    def _whodunit(self, e: BaseException, what: str) -> ClusterError:
        """After a compiled step failed: ask every host (short timeout) which one died or is stuck."""
        ray = self.ray
        exc = ray.exceptions
        if isinstance(e, exc.RayTaskError) and not isinstance(e, exc.RayActorError):
            return self._failure(e, [], self.hosts, what, self.step_timeout)
        pings = [h.actor.ping.remote() for h in self.hosts]
        culprit, reason = None, None
        for h, r in zip(self.hosts, pings):
            try:
                _label, busy = ray.get(r, timeout=min(10.0, self.call_timeout))
            except exc.RayActorError:
                culprit, reason = h, f"stopped during {what} (its Ray actor died)"
                break
            except exc.GetTimeoutError:
                culprit, reason = h, f"does not answer (during {what})"
                break
            if busy > 0 and culprit is None and isinstance(e, (exc.GetTimeoutError, TimeoutError)):
                culprit, reason = h, f"did not finish {what} within {self.step_timeout:g} s"
        if culprit is None:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.broken = f"{what} failed: {type(e).__name__}: {first}"
        else:
            self.broken = f"host {culprit.label} {reason}"
        self._teardown()
        return ClusterError(f"{self.broken} -- reload to go on")

    def reload(self) -> None:
        """Start over after a failure: new actors on the nodes alive now, every part loaded again."""
        with self.lock:
            self.load()

    def close_actors(self) -> None:
        self._teardown()
        for h in self.hosts:
            if h.actor is not None:
                try:
                    self.ray.kill(h.actor, no_restart=True)
                except Exception:  # noqa: BLE001 -- already gone
                    pass
                h.actor = None
        self.hosts = []

    def close(self) -> None:
        self.close_actors()

    # -- running -------------------------------------------------------------------
    def _chain(self, msg: dict) -> list:
        """Send msg through every stage; the refs of each stage's output, in order (the hidden
        state goes from one host's actor to the next without waiting on the driver)."""
        refs, cur = [], msg
        for h in self.hosts:
            cur = h.actor.step.remote(cur)
            refs.append(cur)
        return refs

    def _run(self, chains: list[list], what: str) -> dict:
        """Wait for the last message of the last chain (all chains were submitted at once, so the
        stages work on consecutive prompt batches in parallel)."""
        try:
            return self.ray.get(chains[-1][-1], timeout=self.step_timeout)
        except Exception as e:
            # on a timeout, the first chain still waiting tells which host is stuck
            refs = next((c for c in chains if not self.ray.wait([c[-1]], timeout=0)[0]), chains[-1])
            raise self._failure(e, refs, self.hosts, what, self.step_timeout) from None

    def eval(self, ids: Sequence[int], sample: tuple | None) -> int:
        """Append tokens to every stage's cache from the longest cached prefix; the sampled next token."""
        if self.broken:
            raise ClusterError(f"{self.broken} -- reload to go on")
        common = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)
        del self.tokens[common:]
        rest = list(ids[common:])
        if common + len(rest) > self.n_ctx:
            raise ClusterError(f"context full: {common} + {len(rest)} tokens exceed n_ctx {self.n_ctx}")
        chains = []
        n_past = common
        for s in range(0, len(rest), PROMPT_BATCH):
            chunk = np.asarray(rest[s:s + PROMPT_BATCH], dtype=np.int64)
            last = s + PROMPT_BATCH >= len(rest)
            chains.append(self._chain({"sid": self._sid, "n_past": n_past, "x": chunk,
                                       "sample": sample if s == 0 else None, "want": last}))
            n_past += len(chunk)
        out = self._run(chains, "prompt" if len(rest) > 1 else "token")
        self.tokens.extend(rest)
        return int(out["token"])

    def next_token(self, token: int) -> int:
        """Run one generated token through every stage; the next sampled token."""
        if self.broken:
            raise ClusterError(f"{self.broken} -- reload to go on")
        msg = {"sid": self._sid, "n_past": len(self.tokens), "x": np.asarray([token], dtype=np.int64),
               "sample": None, "want": True}
        if self.dag is not None:
            try:
                out = self.ray.get(self.dag.execute(msg), timeout=self.step_timeout)
            except Exception as e:
                raise self._whodunit(e, "token") from None
        else:
            out = self._run([self._chain(msg)], "token")
        self.tokens.append(int(token))
        return int(out["token"])

    def generate(self, prompt: Sequence[int], params: Any = None, n_predict: int = 128,
                 stop_ids: set[int] | None = None, cancel: threading.Event | None = None) -> Iterator[Any]:
        """Stream a completion of `prompt` like `Session.generate` (TokenEvent..., DoneEvent)."""
        from ..engine.engine import ContextFullError, DoneEvent, Stats, TokenEvent
        from ..engine.sampling import SamplingParams
        from ..engine.tokenizer import StreamDecoder
        params = params or SamplingParams()
        tok = self.tokenizer
        stop_ids = stop_ids if stop_ids is not None else set(tok.eot_ids)
        if not prompt:
            raise ValueError("empty prompt: nothing to continue from")
        if len(prompt) >= self.n_ctx:
            raise ContextFullError(f"prompt of {len(prompt)} tokens does not fit the context of {self.n_ctx}")
        stats = Stats()
        with self.lock:
            t0 = time.perf_counter()
            common = 0
            for a, b in zip(self.tokens, prompt):
                if a != b:
                    break
                common += 1
            stats.prompt_tokens = len(prompt) - min(common, len(prompt) - 1)
            nxt = self.eval(list(prompt), (params, list(prompt)))
            stats.prompt_seconds = time.perf_counter() - t0
            decoder = StreamDecoder(tok)
            out: list[int] = []
            parts: list[str] = []
            t_dec = time.perf_counter()
            stats.stop_reason = "length"
            while len(out) < n_predict:
                if cancel is not None and cancel.is_set():
                    stats.stop_reason = "cancelled"
                    break
                if not out:
                    stats.ttft = time.perf_counter() - t0
                if nxt in stop_ids:
                    stats.stop_reason = "eos"
                    break
                out.append(nxt)
                piece = decoder.feed(nxt)
                parts.append(piece)
                yield TokenEvent(nxt, piece, time.perf_counter())
                if len(self.tokens) >= self.n_ctx:
                    stats.stop_reason = "context"
                    break
                if len(out) >= n_predict:
                    break
                nxt = self.next_token(nxt)
            tail = decoder.flush()
            if tail:
                parts.append(tail)
                yield TokenEvent(-1, tail, time.perf_counter())
            stats.decode_tokens = max(len(out) - 1, 0)
            stats.decode_seconds = time.perf_counter() - t_dec if stats.decode_tokens else 0.0
            yield DoneEvent(stats, out, "".join(parts))

    # -- what each host holds --------------------------------------------------------
    def proofs(self) -> list[dict]:
        """Each host's placement proof (host, then node), in pipeline order."""
        return self._get([h.actor.proof.remote() for h in self.hosts], self.call_timeout, "proof")

    def describe(self) -> list[dict]:
        """Per host: label, layer range, the file read, load figures."""
        return [{"host": h.label, "layers": list(h.layers), "path": h.path,
                 "weight_bytes": h.info.get("weight_bytes"), "load_seconds": h.info.get("load_seconds"),
                 "threads": h.info.get("threads"), "nodes": h.info.get("nodes")} for h in self.hosts]

    def hidden_bytes_per_token(self) -> int:
        """Bytes of hidden state moved per token: one float32 row per stage boundary."""
        return 4 * self.n_embd * max(len(self.hosts) - 1, 0)

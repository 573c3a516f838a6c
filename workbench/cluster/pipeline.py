"""The driver of a model pipelined over the hosts of a Ray cluster.

`RayPipeline.load` starts one `StageHost` actor per alive Ray node (pinned to it), compares the
hosts' model files (size and header), splits the layers by each host's free memory, has each
host plan its part with the placement plan (need and free per node) and refuses before anything
loads if one does not fit (when every host has a cached advisor probe, the split follows each
host's measured bandwidth within its free memory: `split.bandwidth_shares`); then every host loads its part at once. `generate` streams tokens:
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

from ..engine.events import ContextFullError
from ..engine.generation import Generation, reusable_prefix
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


@dataclass
class Stream:
    """One request stream's cache on every host (a scheduler slot, or `generate`'s): `tokens`
    are the positions every stage holds for it."""

    sid: int
    n_ctx: int
    tokens: list[int] = field(default_factory=list)


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


def chat_formatter(md: Mapping[str, Any], arch: str, tok: Any) -> Any:
    """The model's chat format, built as `Engine` builds it (from the file's template)."""
    from ..engine.chat import ChatFormatter
    vocab = tok.vocab if hasattr(tok, "vocab") else set(getattr(tok, "tokens", ()))
    return ChatFormatter(md.get("tokenizer.chat_template"), arch, vocab,
                         tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
                         tok.token_text(tok.eos_id) if tok.eos_id is not None else "")


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
        self.seqs: dict[int, Stream] = {}   # every open request stream (reopened by a reload)
        self._default: Stream | None = None  # generate's / eval's stream
        self.cfg = None
        self.chat_format = None
        self.broken: str | None = None
        self.lock = threading.RLock()
        self._sid = 0
        self.load_seconds = 0.0
        self.split_by = "memory"  # or "bandwidth": every host had a cached advisor probe

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
            self._broke(f"host {culprit.label} {reason}")
        else:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self._broke(f"{what} failed: {reason or type(e).__name__}" + (f" ({first})" if first and not reason else ""))
        line = self.broken
        if what not in ("describe", "plan", "metadata"):
            line += " -- reload to go on"
        return ClusterError(line)

    def load(self) -> None:
        """Start the stages and load every host's part (see module doc). Raises ClusterError."""
        from ..engine.config import config_from_metadata
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
            # and, where every host has a cached probe, its measured bandwidth
            bandwidth = self._get([h.actor.bandwidth.remote(self.placement) for h in hosts], self.call_timeout,
                                  "plan")
            for h, bw in zip(hosts, bandwidth):
                h.info["bandwidth"] = bw
            self.split_by = "bandwidth" if all(bandwidth) else "memory"
            ranges = split_layers(per_layer, capacity, first_extra, last_extra,
                                  bandwidth if self.split_by == "bandwidth" else None)
            for h, r in zip(hosts, ranges):
                h.layers = r
            plans = self._get([h.actor.plan.remote(h.path, h.layers, self.placement, self.n_ctx) for h in hosts],
                              self.call_timeout, "plan")
            check_room([HostNeed(h.label, h.layers, p["need"], p["free"], p["notes"]) for h, p in zip(hosts, plans)])
            md = self._get(hosts[0].actor.metadata.remote(hosts[0].path), self.call_timeout, "metadata", hosts[:1])
            try:
                self.tokenizer = Tokenizer.from_metadata(md)
                self.cfg = config_from_metadata(md, self.tokenizer.n_vocab)
            except ValueError as e:
                raise ClusterError(f"{hosts[0].path}: {e}") from None
            self.chat_format = chat_formatter(md, self.cfg.arch, self.tokenizer)
            loaded = self._get([h.actor.load.remote(h.path, h.layers, self.placement) for h in hosts],
                               self.load_timeout, "load")
            for h, info in zip(hosts, loaded):
                h.info.update(info)
            self._reopen()
            self._compile()
        except BaseException:
            self.close_actors()
            raise
        self.load_seconds = time.perf_counter() - t0

    def _reopen(self) -> None:
        """Open every registered request stream on the (new) hosts, empty."""
        for seq in self.seqs.values():
            got = self._get([h.actor.open.remote(seq.sid, seq.n_ctx) for h in self.hosts], self.call_timeout, "open")
            seq.n_ctx = min(got)
            seq.tokens = []

    def open(self, n_ctx: int) -> Stream:
        """A new request stream: a cache of n_ctx positions for its layers on every host."""
        with self.lock:
            self._sid += 1
            seq = Stream(self._sid, min(n_ctx, self.n_ctx_train))
            if not self.broken:
                got = self._get([h.actor.open.remote(seq.sid, seq.n_ctx) for h in self.hosts],
                                self.call_timeout, "open")
                seq.n_ctx = min(got)
            self.seqs[seq.sid] = seq
            return seq

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
            t.join(60)

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
            self._broke(f"{what} failed: {type(e).__name__}: {first}")
        else:
            self._broke(f"host {culprit.label} {reason}")
        self._teardown()
        return ClusterError(f"{self.broken} -- reload to go on")

    def _broke(self, line: str) -> None:
        """The pipeline cannot go on: remember why; no host's cache can be trusted any more."""
        self.broken = line
        for seq in self.seqs.values():
            seq.tokens = []

    def reload(self, settle: float = 30.0) -> None:
        """Start over after a failure: new actors on the nodes alive now, every part loaded again.
        A host that dies during the reload itself (its node going down with the failure that
        broke the pipeline, before Ray has marked it dead) gets one more try, once the cluster's
        alive nodes have changed or after `settle` seconds."""
        with self.lock:
            before = {n["NodeID"] for n in alive_nodes(self.ray)} if self.ray.is_initialized() else set()
            try:
                self.load()
            except ClusterError as e:
                if "its Ray actor died" not in str(e):
                    raise
                end = time.monotonic() + settle
                while time.monotonic() < end and {n["NodeID"] for n in alive_nodes(self.ray)} == before:
                    time.sleep(0.5)
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

    # -- the scheduler's model (engine.scheduler.LocalModel's methods) ------------------
    @property
    def n_ctx_train(self) -> int:
        return self.cfg.n_ctx_train if self.cfg is not None else self.n_ctx

    def truncate(self, seq: Stream, n: int) -> None:
        """Keep the first n positions of a stream (the hosts forget the rest at its next step)."""
        del seq.tokens[n:]

    def _check(self) -> None:
        if self.broken:
            raise ClusterError(f"{self.broken} -- reload to go on")

    def prefill(self, seq: Stream, piece: Sequence[int], picker: Any, first: bool, last: bool) -> int | None:
        """A piece of a prompt through every host; on its last piece the first token picked. The
        request's picker travels with its first piece to the last host. A pipeline broken by a
        failed host is reloaded first (a new request after a fault starts over on the hosts alive)."""
        with self.lock:
            if self.broken:
                self.reload()
            if len(seq.tokens) + len(piece) > seq.n_ctx:
                raise ClusterError(f"context full: {len(seq.tokens)} + {len(piece)} tokens exceed n_ctx {seq.n_ctx}")
            msg = {"rows": [(seq.sid, len(seq.tokens), len(piece))], "x": np.asarray(piece, dtype=np.int64),
                   "pick": {seq.sid: picker} if first else None, "want": last}
            out = self._run([self._chain(msg)], "prompt" if len(piece) > 1 else "token")
            seq.tokens.extend(int(t) for t in piece)
            return int(out["tokens"][0]) if last else None

    def decode(self, seqs: list[Stream], tokens: list[int], pickers: Any = None) -> list[int]:
        """One token for each stream in one pass through every host (a batched pass on each);
        the next token picked for each (by its picker on the last host)."""
        with self.lock:
            self._check()
            for s in seqs:
                if len(s.tokens) + 1 > s.n_ctx:
                    raise ClusterError(f"context full: {len(s.tokens)} + 1 tokens exceed n_ctx {s.n_ctx}")
            msg = {"rows": [(s.sid, len(s.tokens), 1) for s in seqs], "x": np.asarray(tokens, dtype=np.int64),
                   "pick": None, "want": True}
            if self.dag is not None:
                try:
                    out = self.ray.get(self.dag.execute(msg), timeout=self.step_timeout)
                except Exception as e:
                    raise self._whodunit(e, "token") from None
            else:
                out = self._run([self._chain(msg)], "token")
            for s, t in zip(seqs, tokens):
                s.tokens.append(int(t))
            return [int(t) for t in out["tokens"]]

    def kv_nodes(self, seq: Stream) -> tuple[int, ...]:
        """(The nodes of a stream's caches are per host: see `proofs`.)"""
        return ()

    def close(self, seqs: list[Stream] | None = None) -> None:
        """Release these streams' caches on every host; with no argument, stop the pipeline."""
        if seqs is None:
            self.close_actors()
            return
        with self.lock:
            for seq in seqs:
                self.seqs.pop(seq.sid, None)
            if self.broken or not self.hosts:
                return
            try:
                self._get([h.actor.drop.remote(seq.sid) for h in self.hosts for seq in seqs], self.call_timeout,
                          "close", [h for h in self.hosts for _ in seqs])
            except ClusterError:
                pass  # a host gone: its caches went with it

    # -- one stream, synchronously (generate / bench) -----------------------------------
    @property
    def default(self) -> Stream:
        """The stream `generate`, `eval` and `next_token` use (opened at first use)."""
        if self._default is None or self._default.sid not in self.seqs:
            self._default = self.open(self.n_ctx)
        return self._default

    @property
    def tokens(self) -> list[int]:
        """Positions every host's cache holds for the default stream."""
        return self.default.tokens

    @tokens.setter
    def tokens(self, value: list[int]) -> None:
        self.default.tokens = list(value)

    def eval(self, ids: Sequence[int], picker: Any, stream: Stream | None = None) -> int:
        """Append tokens to every stage's cache (of `stream`, default: the default stream) from the
        longest cached prefix; the token picked next. Prompt batches are submitted at once, so the
        hosts work on consecutive batches in parallel."""
        self._check()
        seq = stream or self.default
        common = reusable_prefix(seq.tokens, list(ids))
        del seq.tokens[common:]
        rest = list(ids[common:])
        if common + len(rest) > seq.n_ctx:
            raise ClusterError(f"context full: {common} + {len(rest)} tokens exceed n_ctx {seq.n_ctx}")
        chains = []
        n_past = common
        for s in range(0, len(rest), PROMPT_BATCH):
            chunk = np.asarray(rest[s:s + PROMPT_BATCH], dtype=np.int64)
            last = s + PROMPT_BATCH >= len(rest)
            chains.append(self._chain({"rows": [(seq.sid, n_past, len(chunk))], "x": chunk,
                                       "pick": {seq.sid: picker} if s == 0 else None, "want": last}))
            n_past += len(chunk)
        out = self._run(chains, "prompt" if len(rest) > 1 else "token")
        seq.tokens.extend(rest)
        return int(out["tokens"][0])

    def next_token(self, token: int, stream: Stream | None = None) -> int:
        """Run one generated token through every stage; the next token picked."""
        return self.decode([stream or self.default], [token])[0]

    def generate(self, prompt: Sequence[int], params: Any = None, n_predict: int = 128,
                 stop_ids: set[int] | None = None, cancel: threading.Event | None = None,
                 stop: Sequence[str] = (), stream: Stream | None = None) -> Iterator[Any]:
        """Stream a completion of `prompt` like `Session.generate` (TokenEvent..., DoneEvent),
        by the same token loop (`engine.generation.Generation`), on `stream` (default: the
        default stream)."""
        if not prompt:
            raise ValueError("empty prompt: nothing to continue from")
        with self.lock:
            seq = stream or self.default
            if len(prompt) >= seq.n_ctx:
                raise ContextFullError(f"prompt of {len(prompt)} tokens does not fit the context of {seq.n_ctx}")
            gen = Generation(self.tokenizer, list(prompt), params, n_predict, seq.n_ctx, stop, stop_ids)
            stats = gen.stats

            def first() -> int:
                stats.prompt_tokens = len(prompt) - reusable_prefix(seq.tokens, list(prompt))
                tok = self.eval(list(prompt), gen.picker, seq)
                stats.prompt_seconds = time.perf_counter() - gen.t0
                return tok

            yield from gen.stream(first, lambda t: self.next_token(t, seq), lambda: len(seq.tokens), cancel)

    def new_session(self, n_ctx: int) -> "PipelineSession":
        """A session over the pipeline, as `Engine.new_session` (so `engine.Chat` runs over it)."""
        return PipelineSession(self, n_ctx)

    @property
    def pool(self) -> Any:
        """The worker threads of every host together (what `Engine.pool.n_threads` tells)."""
        from types import SimpleNamespace
        return SimpleNamespace(n_threads=sum(int(h.info.get("threads") or 0) for h in self.hosts))

    # -- what each host holds --------------------------------------------------------
    def proofs(self) -> list[dict]:
        """Each host's placement proof (host, then node), in pipeline order."""
        return self._get([h.actor.proof.remote() for h in self.hosts], self.call_timeout, "proof")

    def describe(self) -> list[dict]:
        """Per host: label, layer range, the file read, load figures."""
        return [{"host": h.label, "layers": list(h.layers), "path": h.path,
                 "weight_bytes": h.info.get("weight_bytes"), "load_seconds": h.info.get("load_seconds"),
                 "threads": h.info.get("threads"), "nodes": h.info.get("nodes"),
                 "bandwidth": h.info.get("bandwidth"), "split_by": self.split_by} for h in self.hosts]

    @property
    def path(self) -> str:
        """The model file (the first host's path)."""
        return self.hosts[0].path if self.hosts else self.model

    @property
    def weight_bytes(self) -> int:
        return sum(self.hosts[0].info.get("tensor_bytes", {}).values()) if self.hosts else 0

    @property
    def n_params(self) -> int:
        return int(self.hosts[0].info.get("n_params", 0)) if self.hosts else 0

    def hidden_bytes_per_token(self) -> int:
        """Bytes of hidden state moved per token: one float32 row per stage boundary."""
        return 4 * self.n_embd * max(len(self.hosts) - 1, 0)


class PipelineSession:
    """A request stream of a pipeline with `Session`'s interface for a conversation: `generate`,
    `n_ctx`, `tokens`, `reset`, `close` (the workbench app's `Chat` runs over it)."""

    def __init__(self, pipe: RayPipeline, n_ctx: int):
        self.pipe = pipe
        self.stream = pipe.open(n_ctx)

    @property
    def n_ctx(self) -> int:
        return self.stream.n_ctx

    @property
    def tokens(self) -> list[int]:
        return self.stream.tokens

    def generate(self, prompt: list[int], params: Any = None, n_predict: int = 128,
                 cancel: threading.Event | None = None, stop_ids: set[int] | None = None,
                 stop: Sequence[str] = ()) -> Iterator[Any]:
        return self.pipe.generate(prompt, params, n_predict, stop_ids, cancel, stop, stream=self.stream)

    def reset(self) -> None:
        self.stream.tokens = []

    def close(self) -> None:
        self.pipe.close([self.stream])

"""`numawb serve`: load, start the scheduler, run uvicorn; SIGTERM stops it cleanly (exit 0)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from typing import Any, Callable

import uvicorn

from ..engine.engine import DEFAULT_CTX
from ..engine.batch import Scheduler
from .app import ServerState, create_app


class _Server(uvicorn.Server):
    """uvicorn's server, with SIGTERM/SIGINT starting the graceful stop and nothing re-raised
    afterwards (uvicorn re-raises the signal at exit, which would end the process with 143)."""

    state: ServerState | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    banner = ""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.banner:  # only once the port listens
            print(self.banner, file=sys.stderr, flush=True)

    def handle_exit(self, sig, frame) -> None:
        if self.state is not None:  # new requests get 503 from now on; running ones go on
            self.state.shutting_down = True
            self.state.scheduler.stop_accepting()
        super().handle_exit(sig, frame)


def slot_context(total: int, n_parallel: int) -> int:
    """Tokens per slot: llama-server's split of -c among -np slots (0: DEFAULT_CTX per slot)."""
    return DEFAULT_CTX if total <= 0 else total // n_parallel


def serve(args: argparse.Namespace, load: Callable[[int], Any] | None = None) -> int:
    """Serve until SIGTERM/SIGINT. `load(total_ctx)` gives the model to serve (default: an Engine
    from the model flags; `--ray`: a pipeline over a Ray cluster, workbench.cluster.cli)."""
    from ..cli import UserError, _load_engine
    if args.parallel < 1:
        raise UserError(f"-np must be >= 1 (got {args.parallel})")
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be in 1..65535 (got {args.port})")
    n_ctx = slot_context(args.ctx_size, args.parallel)
    if n_ctx < 16:
        raise UserError(f"-c {args.ctx_size} leaves {n_ctx} tokens per slot for {args.parallel} slots")
    if args.max_queue < 0:
        raise UserError(f"--max-queue must be >= 0 (got {args.max_queue})")
    eng = load(n_ctx * args.parallel) if load is not None else _load_engine(args)
    sched = None
    try:
        try:
            sched = Scheduler(eng, args.parallel, n_ctx, args.max_queue)
        except MemoryError as e:
            raise UserError("; ".join(line.strip() for line in str(e).splitlines())) from None
        state = ServerState(eng, sched, args.alias or "", args.api_key)
        config = uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level="warning",
                                timeout_graceful_shutdown=args.shutdown_timeout, lifespan="off",
                                access_log=False)
        server = _Server(config)
        server.state = state
        over = f", over {len(eng.hosts)} Ray hosts" if hasattr(eng, "hosts") else ""
        server.banner = (f"numawb: serving {state.model_id} on http://{args.host}:{args.port} "
                         f"({args.parallel} slots x {sched.n_ctx} tokens{over})")
        try:
            server.run()
        except SystemExit:  # uvicorn exits when it cannot bind
            server.started = False
        if not server.started:
            raise UserError(f"could not listen on {args.host}:{args.port} (in use, or not an address here)")
        print("numawb: stopped", file=sys.stderr, flush=True)
    finally:
        if sched is not None:
            sched.close(timeout=0)
        eng.close()
    return 0


class BackgroundServer:
    """Serve an app from a thread of this process (tests, or the workbench app serving its engine):
    `start()` returns once the port listens; `stop()` asks uvicorn to finish and waits."""

    def __init__(self, state: ServerState, host: str = "127.0.0.1", port: int = 0, shutdown_timeout: float = 5.0):
        import socket
        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.state, self.host, self.port = state, host, port
        config = uvicorn.Config(create_app(state), host=host, port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=shutdown_timeout, access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="numawb-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "BackgroundServer":
        import time
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.state.shutting_down = True
        self.state.scheduler.stop_accepting()
        self.server.should_exit = True
        self.thread.join(timeout=30)

"""The one uvicorn wrapper: a `ServerState`'s app served on host:port, in the foreground
(``numawb serve``: SIGTERM/SIGINT stop it gracefully) or from a thread of this process (tests,
and `AppServer`: the workbench app serving its loaded engine beside its own chat).

Either way new requests get 503 once the stop begins while running ones finish within the
graceful timeout, and a port that cannot be had is an OSError with one line.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Any

import uvicorn

from .app import ServerState, create_app


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, with SIGTERM/SIGINT starting the graceful stop and nothing re-raised
    afterwards (uvicorn re-raises the signal at exit, which would end the process with 143)."""

    state: ServerState | None = None
    banner = ""

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

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.banner:  # only once the port listens
            print(self.banner, file=sys.stderr, flush=True)

    def handle_exit(self, sig, frame) -> None:
        if self.state is not None:  # new requests get 503 from now on; running ones go on
            self.state.shutting_down = True
            self.state.scheduler.stop_accepting()
        super().handle_exit(sig, frame)


class HttpServer:
    """Serve ``state``'s app on ``host:port`` (port 0: a free one, known once started): `run()` in
    the foreground until a signal, or `start()` on a thread and `stop()`. ``banner``: a line
    printed on stderr once the port listens."""

    def __init__(self, state: ServerState, host: str = "127.0.0.1", port: int = 0,
                 shutdown_timeout: float = 5.0, banner: str = "") -> None:
        self.state, self.host, self.port = state, host, port
        config = uvicorn.Config(create_app(state), host=host, port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=shutdown_timeout, access_log=False)
        self.server = _Uvicorn(config)
        self.server.state = state
        self.server.banner = banner
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _unbound(self) -> OSError:
        return OSError(f"could not listen on {self.host}:{self.port} (in use, or not an address here)")

    def _serve(self) -> None:
        try:
            self.server.run()
        except SystemExit:  # uvicorn exits when it cannot bind
            self.server.started = False

    def _bound(self) -> None:
        if self.port == 0:  # an ephemeral port: the one the socket got
            self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def run(self) -> None:
        """Serve in this thread until SIGTERM/SIGINT (or `should_exit`); OSError when the port
        cannot be had."""
        self._serve()
        if not self.server.started:
            raise self._unbound()

    def start(self, timeout: float = 60.0) -> "HttpServer":
        """Serve from a thread; returns once the port listens (OSError when it cannot)."""
        self.thread = threading.Thread(target=self._serve, name="numawb-http", daemon=True)
        self.thread.start()
        end = time.monotonic() + timeout
        while not self.server.started and self.thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        if not self.server.started:
            self.stop(join=5)
            raise self._unbound()
        self._bound()
        return self

    def stop(self, join: float = 30) -> None:
        """New requests get 503, running ones get the graceful timeout; waits for the thread."""
        self.state.shutting_down = True
        self.state.scheduler.stop_accepting()
        self.server.should_exit = True
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout=join)


class AppServer:
    """``numawb --serve``: the OpenAI-compatible server over the workbench app's loaded engine,
    on its own thread: a ``Scheduler`` batches the requests, `HttpServer` serves them. The
    engine's lock interleaves its passes with the app's own chat and placement switches."""

    def __init__(self, engine: Any, port: int, host: str = "127.0.0.1", n_parallel: int = 4,
                 n_ctx: int = 2048) -> None:
        from ..engine.scheduler import Scheduler
        self.scheduler = Scheduler(engine, n_parallel, n_ctx)
        self.state = ServerState(engine, self.scheduler)
        self.http = HttpServer(self.state, host, port, shutdown_timeout=2)

    def start(self, timeout: float = 10.0) -> None:
        """Listen; raises OSError (one line) when the port cannot be had."""
        try:
            self.http.start(timeout)
        except OSError:
            self.scheduler.close(timeout=0)
            raise

    @property
    def host(self) -> str:
        return self.http.host

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def url(self) -> str:
        return self.http.url

    @property
    def label(self) -> str:
        """What the dashboard's serving panel is titled with."""
        s = self.scheduler
        return f"serving {self.state.model_id} on {self.url} · {s.n_parallel} slots × {s.n_ctx} tokens"

    def active(self) -> list:
        """The scheduler's thread-safe snapshot of its requests (``ActiveRequest``)."""
        return self.state.active()

    def stop(self) -> None:
        """Stop listening, cancel what runs (the engine stays loaded)."""
        self.http.stop(join=5)
        self.scheduler.close(timeout=0)


__all__ = ["AppServer", "HttpServer"]

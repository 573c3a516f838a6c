"""`numawb serve`: an OpenAI-compatible HTTP server (llama-server's endpoints) over the engine.

The engine stays free of HTTP: this package builds on its public API and on the batched
scheduler (`workbench.engine.scheduler.Scheduler`). Starlette + uvicorn serve it; metrics are
Prometheus text (prometheus-client).

    from workbench.server import add_arguments, main       # the CLI hook (cli.py)
    from workbench.server.run import serve                 # a loaded model, ServeOptions
    from workbench.server.app import create_app, ServerState  # the ASGI app, for embedding
    from workbench.server.http import HttpServer, AppServer   # uvicorn in this process

`ServerState.active()` is a thread-safe snapshot of the requests being served (id, tokens,
t/s, slot, KV node), for a dashboard.
"""

from __future__ import annotations

import argparse

from ..options import add_model


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `serve` subcommand's flags (model and placement flags as every model command)."""
    add_model(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    p.add_argument("-np", "--parallel", type=int, default=4, metavar="N",
                   help="slots: sequences decoded together (default: 4)")
    p.add_argument("-c", "--ctx-size", type=int, default=0, metavar="N",
                   help="total context in tokens, shared equally by the slots as in llama-server "
                        "(default: 4096 per slot)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument("-a", "--alias", default=None, help="model name shown by /v1/models (default: file name)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests that may wait for a slot; more get 503 with Retry-After (default: 64)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0, metavar="S",
                   help="on SIGTERM, seconds to let running requests finish before cancelling (default: 10)")


def main(args: argparse.Namespace) -> int:
    """Check the flags, load the model, serve until SIGTERM/SIGINT; 0 on a clean stop."""
    from ..models_store import use_default_model
    from ..options import load_engine
    from .config import ServeOptions
    from .run import serve
    opts = ServeOptions.from_args(args).check()
    use_default_model(args)  # no -m: the pulled instruct model, else the base model (one line says which)
    return serve(load_engine(args), opts)

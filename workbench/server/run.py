"""`numawb serve`: start the scheduler over a loaded model, serve until SIGTERM (exit 0)."""

from __future__ import annotations

import sys
from typing import Any

from ..engine.scheduler import Scheduler
from ..errors import UserError
from .app import ServerState
from .config import ServeOptions
from .http import HttpServer


# The scheduler thread takes the GIL back after each of a pass's compiled calls; at Python's 5 ms
# default each take could wait that long behind the event loop thread streaming tokens (the runs:
# benchmarks/HISTORY.md, "The server's switch interval").
SWITCH_INTERVAL = 0.0002


def serve(model: Any, opts: ServeOptions) -> int:
    """Serve ``model`` (an Engine, or a pipeline over a Ray cluster: workbench.cluster.cli) with
    ``opts`` until SIGTERM/SIGINT; closes the model at the end. The caller checks ``opts``
    (`ServeOptions.check`) before it loads the model."""
    sched = None
    try:
        opts.check()
        n_ctx = opts.slot_ctx
        try:
            sched = Scheduler(model, opts.parallel, n_ctx, opts.max_queue)
        except MemoryError as e:
            raise UserError("; ".join(line.strip() for line in str(e).splitlines())) from None
        state = ServerState(model, sched, opts.alias or "", opts.api_key)
        sys.setswitchinterval(SWITCH_INTERVAL)
        over = f", over {len(model.hosts)} Ray hosts" if hasattr(model, "hosts") else ""
        server = HttpServer(state, opts.host, opts.port, opts.shutdown_timeout,
                            banner=f"numawb: serving {state.model_id} on http://{opts.host}:{opts.port} "
                                   f"({opts.parallel} slots x {sched.n_ctx} tokens{over})")
        try:
            server.run()
        except OSError as e:
            raise UserError(str(e)) from None
        print("numawb: stopped", file=sys.stderr, flush=True)
    finally:
        if sched is not None:
            sched.close(timeout=0)
        model.close()
    return 0


__all__ = ["serve"]

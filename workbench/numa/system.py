"""System knobs, opt-in only: automatic NUMA balancing and the page cache.

``disable_numa_balancing()`` writes 0 and restores the previous value at exit,
on SIGTERM and on Ctrl-C (SIGINT); without root it refuses with a clear message.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
DROP_CACHES = "/proc/sys/vm/drop_caches"


def numa_balancing(path: str = NUMA_BALANCING) -> int | None:
    """Current value (0 off, 1 on, 2 memory tiering) or None when the kernel has none."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _need_root(what: str, path: str) -> None:
    if os.geteuid() != 0 or not os.access(path, os.W_OK):
        raise PermissionError(f"{what} needs root (write access to {path}); run as root, or do it "
                              f"yourself before starting: sudo sh -c 'echo ... > {path}'")


class NumaBalancingGuard:
    """Holds numa_balancing at 0 until ``restore()`` (called at exit and on SIGINT/SIGTERM)."""

    def __init__(self, path: str = NUMA_BALANCING):
        self.path = path
        prev = numa_balancing(path)
        if prev is None:
            raise FileNotFoundError(f"{path} does not exist: this kernel has no automatic NUMA balancing")
        _need_root("disabling numa_balancing", path)
        self.previous = prev
        self._restored = False
        self._old_handlers: dict[int, Any] = {}
        Path(path).write_text("0\n")
        atexit.register(self.restore)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.restore()
        old = self._old_handlers.get(signum)
        if callable(old):
            old(signum, frame)
        elif old == signal.SIG_DFL or old is None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def restore(self) -> None:
        """Write back the previous value (idempotent) and put the old signal handlers back."""
        if self._restored:
            return
        self._restored = True
        try:
            Path(self.path).write_text(f"{self.previous}\n")
        except OSError:
            pass
        if threading.current_thread() is threading.main_thread():
            for sig, h in self._old_handlers.items():
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, h)
        atexit.unregister(self.restore)


def disable_numa_balancing(path: str = NUMA_BALANCING) -> NumaBalancingGuard:
    """Opt-in: turn automatic NUMA balancing off for this run (needs root)."""
    return NumaBalancingGuard(path)


def drop_page_cache(path: str = DROP_CACHES) -> None:
    """Opt-in: sync and drop the page cache (echo 1 > drop_caches) before a cold load."""
    _need_root("dropping the page cache", path)
    os.sync()
    Path(path).write_text("1\n")

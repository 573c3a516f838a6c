"""A second process that shares a first start's compile work with the engine, through one task list.

Numba compiles on one core and holds the GIL while it does, so a first start's tens of seconds of
compilation leave every other core idle. When `kernels.precompile` finds the disk cache empty, or
its first task really compiled (not a cache load), it writes its whole task list -- the kernels'
separately compiled parts, the kernels, then the engine's own compiled helpers that a first token
needs (the crew's loop, the prompt's ops) -- to a `Board` folder and starts this helper on it.
Both processes then take, each time, the first task nobody has claimed (a file created with
O_EXCL: exactly one process wins) among those whose inputs are compiled ("done" files), so both
cores stay busy until the list is empty, whatever each task costs. What one process compiled,
the other loads from the shared disk cache in milliseconds. Without a disk cache, on one core, or
with NUMAWB_PARALLEL_COMPILE=0 nothing is started and the engine runs every task itself.

The helper's own entry is `helper_process` (it imports the kernels package, which imports this
module).
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from numba.core import caching

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
POLL_SECONDS = 0.005
#: what `start` runs with `python -m` (named, not imported: it imports the kernels package)
HELPER_MODULE = "workbench.engine.kernels.helper_process"


@dataclass(frozen=True)
class Task:
    """One unit of first-start compile work. `name` says what to run (`kernels.run_task`); `deps`
    are indices of earlier tasks that must be done first (their code is linked into this one's);
    `wait`: the engine needs it before the first token, so it waits for it if the helper took it."""
    name: str
    deps: tuple[int, ...] = ()
    wait: bool = True

    def line(self) -> str:
        return f"{self.name}\t{','.join(map(str, self.deps))}\t{int(self.wait)}"

    @classmethod
    def parse(cls, line: str) -> "Task":
        name, deps, wait = line.rstrip("\n").split("\t")
        return cls(name, tuple(int(d) for d in deps.split(",") if d), wait == "1")


class Board:
    """The task list and who took what, as files in one folder both processes see."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    @classmethod
    def create(cls, tasks: list[Task]) -> "Board":
        board = cls(tempfile.mkdtemp(prefix="numawb-compile-"))
        with open(os.path.join(board.folder, "tasks"), "w") as f:
            f.writelines(t.line() + "\n" for t in tasks)
        return board

    def tasks(self) -> list[Task]:
        with open(os.path.join(self.folder, "tasks")) as f:
            return [Task.parse(line) for line in f if line.strip()]

    def claim(self, i: int) -> bool:
        """True for the one process that claims task i first (False for the other, or once the
        board is gone)."""
        try:
            os.close(os.open(os.path.join(self.folder, f"claim-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except OSError:
            return False

    def is_claimed(self, i: int) -> bool:
        return os.path.exists(os.path.join(self.folder, f"claim-{i}"))

    def finish(self, i: int) -> None:
        try:
            os.close(os.open(os.path.join(self.folder, f"done-{i}"), os.O_CREAT | os.O_WRONLY))
        except OSError:
            pass

    def is_done(self, i: int) -> bool:
        return os.path.exists(os.path.join(self.folder, f"done-{i}"))

    def count_done(self) -> int:
        try:
            return sum(1 for f in os.listdir(self.folder) if f.startswith("done-"))
        except OSError:
            return 0

    def wait(self, i: int, other_alive: Callable[[], bool]) -> bool:
        """Until task i is done (True) or the process that took it is gone (False)."""
        while not self.is_done(i):
            if not other_alive():
                return self.is_done(i)
            time.sleep(POLL_SECONDS)
        return True

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def usable(probe) -> bool:
    """Whether a helper could help: several CPUs, not turned off, and `probe` (a kernel dispatcher
    that has compiled) writes to a disk cache the helper shares."""
    if os.environ.get("NUMAWB_PARALLEL_COMPILE", "1") == "0" or (os.cpu_count() or 1) < 2:
        return False
    return not isinstance(getattr(probe, "_cache", None), caching.NullCache)


def never_compiled(probe) -> bool:
    """Whether `probe`'s disk cache has no index yet (a fresh install: no need to time a first
    compile to know it is a first start)."""
    try:
        return not os.path.exists(probe._cache._cache_file._index_path)
    except AttributeError:
        return False


def start(path: str, board: Board, types: list[int]) -> subprocess.Popen | None:
    """Start a helper on `board` for kernel path `path`; `types` are the engine's active types (the
    crew's compiled loop is keyed by them, so the helper builds the same one)."""
    env = dict(os.environ, NUMAWB_KERNEL_PATH=path, NUMAWB_PARALLEL_COMPILE="0",
               PYTHONPATH=os.pathsep.join(p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")) if p))
    try:
        return subprocess.Popen([sys.executable, "-m", HELPER_MODULE, path, board.folder,
                                 ",".join(map(str, types))],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


def work(board: Board, tasks: list[Task], run: Callable[[int], None], other_alive: Callable[[], bool],
         first: int = 0, swallow: bool = True) -> list[int]:
    """Take tasks from `first` on until none is left: each time the first one nobody has claimed
    whose deps are done (a task whose inputs the other process is still compiling waits, and this
    process takes a later one meanwhile), claim it, run it, mark it done. Returns the indices this
    process ran. With `swallow` (the helper) a task that raises is marked done all the same: the
    engine's own call compiles whatever it could not, and reports it."""
    mine: list[int] = []
    pending = list(range(first, len(tasks)))
    while pending:
        pending = [i for i in pending if not board.is_claimed(i)]
        ready = next((i for i in pending if all(d in mine or board.is_done(d) for d in tasks[i].deps)), None)
        if ready is None:
            if not pending:
                break
            if other_alive():
                time.sleep(POLL_SECONDS)
                continue
            ready = pending[0]  # the other process is gone: its deps are compiled here as callees
        pending.remove(ready)
        if not board.claim(ready):
            continue
        mine.append(ready)
        try:
            run(ready)
        except Exception:  # noqa: BLE001 - the helper's is a warm-up; the real call reports real errors
            if not swallow:
                raise
        finally:
            board.finish(ready)
    return mine


def release(helper: subprocess.Popen, board: Board) -> None:
    """The engine has what it waits for: the helper may still be compiling tasks the engine does
    not wait for (`_running` keeps it referenced until it ends; the last one out removes the board)."""
    _running.append((helper, board))
    for p, b in list(_running):
        if p.poll() is not None:
            b.remove()
            _running.remove((p, b))


_running: list[tuple[subprocess.Popen, Board]] = []


@atexit.register
def _remove_boards() -> None:
    for _p, b in _running:
        b.remove()  # a helper still at work finds no more tasks to claim and ends

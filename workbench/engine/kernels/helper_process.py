"""The compile helper's process: takes tasks from a `compile_helper.Board` until none is left.

Kept apart from `compile_helper` (the board, the tasks, starting a helper), which the kernels
package imports: this entry imports the kernels package to run the tasks, so it lives above it.

    python -m workbench.engine.kernels.helper_process PATH BOARD TYPES
"""
from __future__ import annotations

import os
import sys

from workbench.engine import kernels
from workbench.engine.kernels.compile_helper import Board, work


def main(argv: list[str]) -> int:
    """Run on kernel path PATH for active types TYPES (comma-separated ids) the tasks of the board
    in folder BOARD that the engine has not claimed; ends when the board is empty or gone, or the
    engine that started it is."""
    path, folder, types = argv[:3]
    kernels.set_kernel_path(path)
    kernels.activate(int(t) for t in types.split(",") if t)
    board = Board(folder)
    parent = os.getppid()
    try:
        tasks = board.tasks()
        work(board, tasks, lambda i: kernels.run_task(tasks[i].name), lambda: os.getppid() == parent)
    except OSError:  # the board went away: the engine is done with it
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""User errors: the mistakes a user can make, and the one line every command prints for them.

A user error ends a command with exit status 2 and a single line ``numawb: error: ...`` on
stderr, never a traceback. ``UserError`` is raised by the command line, the options, the
server, the cluster and the app's front door; the NUMA layer's own ``ModeError`` (an unknown or
impossible placement mode) and ``BudgetError`` (a plan that does not fit in free memory) are
subclasses of it.

The bottom layer (docs/architecture.md): imports nothing, not even the rest of ``workbench``,
so every layer, ``--help`` included, can use it.
"""
from __future__ import annotations

#: exit status of a command that ended on a user error (argparse uses the same)
EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake in the user's input: reported as one line, exit status 2."""


#: exception types whose message is meant for the user as it is (ModeError and BudgetError
#: subclass UserError)
USER_ERRORS: tuple[type[BaseException], ...] = (UserError,)


def one_line(text: str) -> str:
    """A message on one line: lines joined with '; ' (a BudgetError lists need and free per node)."""
    parts = [line.strip() for line in str(text).splitlines() if line.strip()]
    return "; ".join(parts)


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a user's mistake (shown as one line) rather than a bug (a traceback)."""
    return isinstance(exc, USER_ERRORS)


def format_error(exc: BaseException | str, prog: str = "numawb") -> str:
    """The line printed for a user error: ``numawb: error: <message on one line>``."""
    text = one_line(str(exc)) or type(exc).__name__
    return f"{prog}: error: {text}"

"""Where reports go: rich at the terminal's width, or full width for a file or a pipe (a log).

A rich table printed to a file or pipe is cut to 80 columns (plan names become ``preset
offlo…``); a console made here is as wide as its content needs there instead.
"""

from __future__ import annotations

import sys

# columns of a console that writes to a file or pipe: wide enough that no table is cut
LOG_WIDTH = 10_000


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def console(stderr: bool = False):
    """A ``rich.console.Console`` on stdout (or stderr): the terminal's width there, else
    :data:`LOG_WIDTH` columns, so tables in logs keep every name whole.

    >>> import contextlib, io
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     width = console().width
    >>> width
    10000
    """
    from rich.console import Console

    if is_terminal(sys.stderr if stderr else sys.stdout):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=LOG_WIDTH)

"""Notices: one-line messages that jaxoff says once and a user can silence.

A notice is a record on one of the loggers of :data:`LOGGERS`; in a library they go where
the application's logging sends them. The ``jaxoff`` command prints them as the lines they are
(``jaxoff: note: ...`` on stderr) rather than through the root logger's format
(``WARNING:jaxoff....:``), which a library such as absl may have set up.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator

# the loggers that carry notices: the I/O engine's fallback to POSIX (jaxoff.aio._backend),
# a policy preset that names none of a model's residuals (jaxoff.policy._resolve)
LOGGERS = ("jaxoff.aio.backend", "jaxoff.policy")


class _Lines(logging.Handler):
    """Writes each record's message as one line to the current ``sys.stderr``."""

    def __init__(self, level: int, say: Callable[[str], str]) -> None:
        super().__init__(level)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.say(self.format(record)), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - logging's own convention
            self.handleError(record)


@contextlib.contextmanager
def as_lines(say: Callable[[str], str] = str) -> Iterator[None]:
    """While it is open, notices (at WARNING and above) print as plain lines on stderr, each
    through ``say`` (the command's: options as its flags), and no longer reach the root
    logger: the ``jaxoff`` command runs inside it. On exit the loggers are as they were (an
    in-process command leaves no handler behind); nested, it does nothing more."""
    saved = []
    for name in LOGGERS:
        log = logging.getLogger(name)
        if any(isinstance(h, _Lines) for h in log.handlers):
            continue
        handler = _Lines(logging.WARNING, say)
        handler.setFormatter(logging.Formatter("%(message)s"))
        saved.append((log, handler, log.propagate))
        log.addHandler(handler)
        log.propagate = False
    try:
        yield
    finally:
        for log, handler, propagate in saved:
            log.removeHandler(handler)
            log.propagate = propagate

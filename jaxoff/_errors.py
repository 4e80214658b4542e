"""Errors jaxoff raises for bad input: each message says what happened and what to do.

A message names the options to change as Python writes them, in backticks: `` `page_params` ``
or `` `clip_norm=0` `` (a ``TrainConfig`` option or a keyword argument; `JaxoffError.options`
lists them). The ``jaxoff`` command says them as its flags, from one table
(``jaxoff.cli.flag_table``): ``--page-params``, ``--clip-norm 0``.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable

# an option in a message: `name` or `name=value` (a Python identifier, lower case)
OPTION = re.compile(r"`([a-z_][a-z0-9_]*)(?:=([^`]*))?`")


class JaxoffError(Exception):
    """Base class of jaxoff's own errors."""

    @property
    def options(self) -> tuple[str, ...]:
        """The options the message names (`` `name` `` or `` `name=value` ``), in order.

        >>> OptionError("`page_params=True` needs `fuyou=True`").options
        ('page_params', 'fuyou')
        """
        return tuple(dict.fromkeys(m.group(1) for m in OPTION.finditer(str(self))))


def say_options(message: str, flag_of: Callable[[str, str | None], str | None]) -> str:
    """``message`` with each option `` `name` `` or `` `name=value` `` replaced by
    ``flag_of(name, value)`` (``value``: None, or what follows ``=``) where that is not None.

    >>> message = "`fuyou=True` cannot clip: pass `clip_norm=0`"
    >>> say_options(message, lambda n, v: f"--{n}" if v == "True" else f"--{n} {v}")
    '--fuyou cannot clip: pass --clip_norm 0'
    """

    def say(m: re.Match) -> str:
        flag = flag_of(m.group(1), m.group(2))
        return m.group(0) if flag is None else flag

    return OPTION.sub(say, message)


class ConfigError(JaxoffError, ValueError):
    """A configuration value is wrong; the message names the option and the fix."""


class OptionError(ConfigError):
    """An option's value is wrong, or options do not go together: raised by the packages
    below the commands (the engine, the optimizer, the placements, the strategies, the
    models), whose message names Python options only (`` `name=value` ``, see the module),
    never a command's flag."""


class UsageError(ConfigError):
    """The command line itself is wrong: an unknown option, a value of the wrong type, a
    choice that is not offered. The message names the option and where the help is."""


# errno -> what to do about it (the message names the path and the errno's meaning first)
_OS_ADVICE = {
    errno.ENOSPC: "the disk is full: free space there, or point the run at another disk",
    errno.EDQUOT: "the disk quota is used up: free space, or point the run at another disk",
    errno.EFBIG: (
        "a file grew past what this filesystem or `ulimit -f` allows: use a directory on "
        "another filesystem (not FAT32), or raise the limit"
    ),
    errno.EACCES: "permission denied: choose a directory you can write, or fix its permissions",
    errno.EPERM: "not permitted: choose a directory you can write, or fix its permissions",
    errno.ENOENT: "no such file or directory: check the path (its parent folders must exist)",
    errno.EROFS: "the filesystem is read-only: choose a directory on a writable filesystem",
    errno.ENOTDIR: "a part of the path is a file, not a directory: check the path",
    errno.EISDIR: "the path is a directory where a file was expected: check the path",
    errno.EMFILE: "too many open files: raise the limit (`ulimit -n`)",
    errno.EIO: "the device reported an I/O error: check the disk (dmesg) and retry",
}


def describe_os_error(e: OSError) -> str:
    """One line for an ``OSError``: the path, the errno's name and meaning, and advice.

    >>> print(describe_os_error(OSError(21, "Is a directory", "/x")))
    /x: Is a directory (EISDIR): the path is a directory where a file was expected: check the path
    """
    where = ": ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    name = errno.errorcode.get(e.errno, "") if e.errno is not None else ""
    what = e.strerror or str(e)
    line = f"{where}: {what}" if where else what
    if name:
        line += f" ({name})"
    advice = _OS_ADVICE.get(e.errno) if e.errno is not None else None
    return f"{line}: {advice}" if advice else line

"""Errors jaxoff raises for bad input: each message says what happened and what to do."""

from __future__ import annotations

import errno


class JaxoffError(Exception):
    """Base class of jaxoff's own errors."""


class ConfigError(JaxoffError, ValueError):
    """A configuration value is wrong; the message names the option and the fix."""


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

"""This process's peak resident set size, as the kernel keeps it for its own address space.

``getrusage(RUSAGE_SELF).ru_maxrss`` is not that: on Linux it also holds the high-water mark
of the address space the process had before its ``exec`` — with ``vfork`` (how Python's
``subprocess`` starts a child), the parent's. A ``jaxoff train`` started by a 3 GiB process
would report a peak of at least 3 GiB. ``VmHWM`` in ``/proc/self/status`` starts afresh at
``exec``: measured, a child of a process holding 2 GiB reports ``ru_maxrss`` 2061 MiB and
``VmHWM`` 13.7 MiB.
"""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """Peak RSS of this process's own address space (``VmHWM``); ``ru_maxrss`` where
    ``/proc`` has no such line."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

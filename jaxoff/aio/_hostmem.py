"""Host RAM a paged GPU run needs, worked out before anything is allocated.

A GPU pager holds four kinds of host memory: a pinned arena of chunk slots that NVMe reads land
in (and H2D copies leave from), the host side of each device's write ring (pinned slots the D2H
copies land in before the checksum and the O_DIRECT write), an optional RAM tier (chunks kept
in pinned RAM up to a budget, NVMe beyond it) and pageable buffers (the engine's staging pool
and whatever else the caller names). `host_mem_need` adds them up; `check_host_mem` compares the
sum with what the machine can give: ``MemAvailable`` from ``/proc/meminfo`` and, inside a
container, the cgroup's limit less its usage. Pinned memory cannot be swapped or reclaimed, so a
run that does not fit must stop before it pins anything, with one line naming the numbers.

>>> need = host_mem_need(chunk_bytes=64 << 20, read_slots=16, write_slots=8, devices=1,
...                      ram_tier_bytes=8 << 30, pageable_bytes=16 << 20)
>>> need.total / 2**30
9.515625
>>> check_host_mem(need, HostMemLimits(mem_available=8 << 30)) is not None
True
"""

from __future__ import annotations

import dataclasses
import os

_ALIGN = 4096
_GIB = 1 << 30


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _gib(n: int) -> str:
    return f"{n / _GIB:.2f} GiB"


def _check_count(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name}={v!r} must be a non-negative int")
    return v


@dataclasses.dataclass(frozen=True)
class HostMemNeed:
    """Host bytes a GPU pager needs, by kind (`host_mem_need` fills it)."""

    pinned_arena: int
    ring_host: int
    ram_tier: int
    pageable: int

    @property
    def pinned(self) -> int:
        """Bytes that will be page-locked (``cudaHostAlloc``): arena, rings and RAM tier."""
        return self.pinned_arena + self.ring_host + self.ram_tier

    @property
    def total(self) -> int:
        return self.pinned + self.pageable

    def describe(self) -> str:
        return (
            f"{_gib(self.total)} (pinned arena {_gib(self.pinned_arena)} + write rings "
            f"{_gib(self.ring_host)} + RAM tier {_gib(self.ram_tier)} + pageable "
            f"{_gib(self.pageable)})"
        )


def host_mem_need(
    *,
    chunk_bytes: int,
    read_slots: int,
    write_slots: int,
    devices: int = 1,
    ram_tier_bytes: int = 0,
    pageable_bytes: int = 0,
) -> HostMemNeed:
    """The host RAM of a GPU pager with the given budgets.

    Args:
      chunk_bytes: bytes of the largest chunk moved at once (a slot holds one, rounded up to
        4 KiB for O_DIRECT).
      read_slots: slots of the pinned read arena (read-ahead depth plus the chunks in flight
        to the device), shared by all devices.
      write_slots: pinned slots per device write ring (D2H copies land there before the write).
      devices: GPUs this process drives (one write ring each).
      ram_tier_bytes: the pinned RAM tier's budget (``--host-mem``); 0 keeps every chunk on NVMe.
      pageable_bytes: pageable buffers (the engine's ``pool_bytes`` and the caller's own).
    """
    for name, v in dict(
        chunk_bytes=chunk_bytes,
        read_slots=read_slots,
        write_slots=write_slots,
        devices=devices,
        ram_tier_bytes=ram_tier_bytes,
        pageable_bytes=pageable_bytes,
    ).items():
        _check_count(name, v)
    slot = _round_up(chunk_bytes)
    return HostMemNeed(
        pinned_arena=read_slots * slot,
        ring_host=devices * write_slots * slot,
        ram_tier=ram_tier_bytes,
        pageable=pageable_bytes,
    )


@dataclasses.dataclass(frozen=True)
class HostMemLimits:
    """What the host can give: ``MemAvailable`` and, in a container, the cgroup's limit and
    usage (None where there is no limit). `read_host_mem_limits` fills it from this machine."""

    mem_available: int
    cgroup_limit: int | None = None
    cgroup_usage: int = 0

    @property
    def available(self) -> int:
        """The smaller of ``MemAvailable`` and the cgroup's headroom (limit less usage)."""
        if self.cgroup_limit is None:
            return self.mem_available
        return max(0, min(self.mem_available, self.cgroup_limit - self.cgroup_usage))


def parse_meminfo(text: str) -> int:
    """``MemAvailable`` in bytes from the text of ``/proc/meminfo``."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            return int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    raise ValueError("/proc/meminfo has no MemAvailable line (Linux 3.14 or later has one)")


def parse_cgroup_limit(text: str) -> int | None:
    """A cgroup memory limit file's value (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``);
    None for ``max`` or v1's "unlimited" (a value near 2**63)."""
    text = text.strip()
    if text == "max":
        return None
    v = int(text)
    return None if v >= 1 << 60 else v


def read_host_mem_limits(root: str = "/") -> HostMemLimits:
    """`HostMemLimits` of this machine (``root`` lets a test point at a fake tree)."""

    with open(os.path.join(root, "proc/meminfo")) as f:
        mem_available = parse_meminfo(f.read())
    for limit_file, usage_file in (
        ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),
        (
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(os.path.join(root, limit_file)) as f:
                limit = parse_cgroup_limit(f.read())
        except (OSError, ValueError):
            continue
        usage = 0
        try:
            with open(os.path.join(root, usage_file)) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            pass
        return HostMemLimits(mem_available, limit, usage)
    return HostMemLimits(mem_available)


def check_host_mem(need: HostMemNeed, limits: HostMemLimits, *, headroom: int = 0) -> str | None:
    """None when ``need`` fits in ``limits`` with ``headroom`` bytes to spare, else one line
    naming the numbers and the largest RAM tier that would fit."""
    _check_count("headroom", headroom)
    avail = limits.available
    if need.total + headroom <= avail:
        return None
    where = f"MemAvailable {_gib(limits.mem_available)}"
    if limits.cgroup_limit is not None:
        where += (
            f", cgroup limit {_gib(limits.cgroup_limit)} with {_gib(limits.cgroup_usage)} in use"
        )
    fit_tier = avail - headroom - (need.total - need.ram_tier)
    if fit_tier > 0 and need.ram_tier:
        what = f"lower `host_mem` to at most {_gib(fit_tier)}"
    elif fit_tier > 0:
        what = "free host memory"
    else:
        what = "shrink the read-ahead or ring budgets (or chunk size), or free host memory"
    return (
        f"host memory: this run needs {need.describe()}"
        + (f" plus {_gib(headroom)} headroom" if headroom else "")
        + f" but only {_gib(avail)} is available ({where}); {what}"
    )

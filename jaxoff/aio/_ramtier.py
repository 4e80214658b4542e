"""The page store's RAM tier (``--host-mem``): entries up to a budget kept in host memory, the
rest on disk, in one store with the same checksums and commits.

A RAM entry's page files live on a RAM filesystem (tmpfs: ``/dev/shm`` by default, or
``$JAXOFF_HOST_MEM_DIR``), in a folder named after the store (``jaxoff-<hash of its path>``),
so the engine and the pager move them as any page file, at memory speed, and a commit makes
them current with the rest. They do not outlive a reboot: the store then misses them and
``--resume`` rebuilds it from the last checkpoint, as for any lost page file. On CUDA they are
read into the pager's pinned arena like the disk's files (they are not pinned themselves).

Before anything is written, `check_ram_tier` compares what the tier will add with what the
machine can give (``MemAvailable`` and the cgroup's headroom, `jaxoff.aio._hostmem`) and with
the RAM filesystem's free space, and refuses in one line naming the numbers.

>>> from jaxoff.aio._layout import plan_layout
>>> layout = plan_layout({"a": ((1024,), "float32"), "b": ((4096,), "float32")},
...                      chunk_bytes=4096, ram_bytes=8192, ram_dir="/dev/shm/jaxoff-x")
>>> [(e.name, e.ram) for e in layout.entries], layout.ram_bytes
([('a', True), ('b', False)], 8192)
"""

from __future__ import annotations

import errno
import hashlib
import os

from jaxoff.aio._hostmem import read_host_mem_limits
from jaxoff.aio._layout import Layout
from jaxoff.aio._store_errors import PageStoreError, PageStoreFullError
from jaxoff.aio._store_files import FileTable

ENV_DIR = "JAXOFF_HOST_MEM_DIR"
RAM_FILESYSTEMS = ("tmpfs", "ramfs")
# host memory left to the rest of the run (its arrays, the engine's buffers) beyond the tier
HEADROOM_BYTES = 1 << 30


def ram_tier_dir(root: str | os.PathLike, base: str | None = None) -> str:
    """The RAM tier folder of the store at ``root``: ``<base>/jaxoff-<16 hex digits of its
    real path's sha1>`` (``base``: ``$JAXOFF_HOST_MEM_DIR``, else ``/dev/shm``)."""
    base = base or os.environ.get(ENV_DIR) or "/dev/shm"
    real = os.path.realpath(os.fspath(root))
    return os.path.join(
        os.path.abspath(base), "jaxoff-" + hashlib.sha1(real.encode()).hexdigest()[:16]
    )


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem holding ``path`` (its nearest existing ancestor), from the
    mount table; None when it cannot be told."""
    path = os.path.realpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best, kind = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0] if right.split() else None
    return kind


def _allocated(layout: Layout, table) -> int:
    """Bytes of the tier's files that already exist (a reopened store's); ``table``: the
    layout's `FileTable`."""
    total = 0
    for path, size in zip(table.paths, table.sizes, strict=True):
        if layout.ram_dir is not None and path.startswith(layout.ram_dir + os.sep):
            try:
                total += min(size, os.stat(path).st_blocks * 512)
            except OSError:
                pass
    return total


def check_ram_tier(layout: Layout, root: str, *, limits=None) -> None:
    """Refuses, before anything is written, a RAM tier that is not on a RAM filesystem, that
    shares its folder with files of others, or that does not fit in host memory or in the
    filesystem; one line naming the numbers. Nothing to check without a tier."""
    if layout.ram_dir is None:
        return
    where = layout.ram_dir
    kind = filesystem_type(where)
    if kind not in RAM_FILESYSTEMS:
        raise PageStoreError(
            f"the RAM tier's folder {where} is on {kind or 'an unknown filesystem'}, not in "
            f"host memory (tmpfs); set {ENV_DIR} to a folder on a tmpfs (such as /dev/shm), "
            "or drop `host_mem`"
        )
    table = FileTable(root, layout)
    if os.path.isdir(where):
        ours = {os.path.basename(p) for p in table.paths}
        others = sorted(n for n in os.listdir(where) if n not in ours)
        if others:
            raise PageStoreError(
                f"the RAM tier's folder {where} holds files this store did not write "
                f"({', '.join(others[:3])}); remove them or set {ENV_DIR} elsewhere"
            )
    need = layout.ram_bytes - _allocated(layout, table)
    if need <= 0:
        return
    limits = limits if limits is not None else read_host_mem_limits()
    avail = limits.available
    if need + HEADROOM_BYTES > avail:
        where_from = f"MemAvailable {_size(limits.mem_available)}"
        if limits.cgroup_limit is not None:
            where_from += (
                f", cgroup limit {_size(limits.cgroup_limit)} with "
                f"{_size(limits.cgroup_usage)} in use"
            )
        fit = max(0, avail - HEADROOM_BYTES)
        raise PageStoreFullError(
            f"host memory: the RAM tier (`host_mem`) needs {_size(need)} more, plus "
            f"{_size(HEADROOM_BYTES)} left to the run, but only {_size(avail)} is available "
            f"({where_from}); lower `host_mem` to at most {_size(fit)}",
            path=where,
            needed_bytes=need,
            errno=errno.ENOMEM,
        )
    probe = where
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise PageStoreFullError(
            f"the RAM tier (`host_mem`) needs {_size(need)} more in {where} but its tmpfs has "
            f"{_size(free)} free; lower `host_mem` to at most {_size(free)} (or grow the tmpfs)",
            path=where,
            needed_bytes=need,
            errno=errno.ENOSPC,
        )


def _size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"

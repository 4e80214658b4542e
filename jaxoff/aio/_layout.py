"""Page store layout: how named tensors are cut into aligned chunks inside stable page files.

The layout is a pure function of the entries (names, shapes, dtypes, in the given order), the
chunk size and the data directories, so it can be planned without touching the disk and the
same model always maps to the same files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from jaxoff.aio._store_errors import PageStoreLayoutError

ALIGN = 4096
"""Offsets and padded chunk sizes are multiples of this, so O_DIRECT can move whole chunks."""

# The largest chunk: a paged optimizer stages a few chunks of every tensor of a leaf in RAM, and
# indexes elements with int32 (a chunk of 1 GiB is 2**28 float32 elements).
MAX_CHUNK_BYTES = 1 << 30

SLOTS = ("A", "B")
DEFAULT_DIRS = ("data",)
_MAX_STEM = 100  # Leaves room for ".A.page" and a hash within any filesystem's 255-byte limit.
_HASH_LEN = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclasses.dataclass(frozen=True)
class ChunkInfo:
    """One chunk: ``elem_count`` consecutive elements of an entry's flattened tensor.

    Attributes:
      index: position of the chunk within its entry.
      stripe: which of the entry's files (one per data directory used) holds it.
      offset: byte offset inside that file, a multiple of ``ALIGN``.
      nbytes: bytes of data (what the checksum covers).
      padded_nbytes: ``nbytes`` rounded up to ``ALIGN`` (what an O_DIRECT engine moves).
      elem_start: index of the chunk's first element in the flattened tensor.
      elem_count: number of elements; only the last chunk of an entry may be short.
    """

    index: int
    stripe: int
    offset: int
    nbytes: int
    padded_nbytes: int
    elem_start: int
    elem_count: int


@dataclasses.dataclass(frozen=True)
class EntryLayout:
    """One named tensor of the store.

    Attributes:
      name: the entry's name, e.g. ``opt.mu.blocks.attn.q.kernel``.
      shape: the tensor's shape.
      dtype: the tensor's numpy dtype (ml_dtypes types such as bfloat16 included).
      stem: file-name stem; slot ``s`` stripe ``k`` lives in ``dirs[k]/<stem>.<s>.page``.
      chunks: the chunks, in element order.
      file_sizes: size in bytes of each stripe file (one per data directory used).
      ram: the entry lives in the RAM tier (one file per slot in the layout's ``ram_dir``).
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    stem: str
    chunks: tuple[ChunkInfo, ...]
    file_sizes: tuple[int, ...]
    ram: bool = False

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of data (unpadded)."""
        return self.size * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where every chunk of every entry lives. Build it with `plan_layout`.

    Attributes:
      chunk_bytes: bytes per full chunk (a multiple of ``ALIGN`` and of every itemsize).
      dirs: data directories, absolute or relative to the store root; chunk ``i`` of an entry
        goes to directory ``i % len(dirs)`` (round robin), one file per (entry, slot, dir).
      entries: the entries, in order; "entry index" everywhere means a position here.
      align: alignment of offsets and padded sizes.
      slots: page files per entry and directory. 2 (the default): slots A and B are separate
        files and a commit is atomic. 1: both slot names address the one ``.A.page`` file,
        so new versions are written in place; half the disk, no rollback (see `PageStore`).
      ram_dir: the RAM tier's directory (absolute, on a RAM filesystem: tmpfs), holding the
        entries marked ``ram``; None when the store has no RAM tier.
    """

    chunk_bytes: int
    dirs: tuple[str, ...]
    entries: tuple[EntryLayout, ...]
    align: int = ALIGN
    slots: int = 2
    ram_dir: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    @property
    def num_chunks(self) -> int:
        """Total number of chunks over all entries (one slot)."""
        return sum(len(e.chunks) for e in self.entries)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot of all entries (disk and RAM tier), padding included."""
        return sum(sum(e.file_sizes) for e in self.entries)

    @property
    def ram_bytes(self) -> int:
        """Bytes the RAM tier holds: its entries' files, every slot."""
        return self.slots * sum(sum(e.file_sizes) for e in self.entries if e.ram)

    def index(self, name: str) -> int:
        """The entry index of ``name``."""
        try:
            return self._index_map()[name]
        except KeyError:
            raise PageStoreLayoutError(_unknown_entry(name, self.names)) from None

    def entry(self, name: str) -> EntryLayout:
        """The `EntryLayout` of ``name``."""
        return self.entries[self.index(name)]

    def relpath(self, name: str, slot: str, stripe: int) -> str:
        """Path of a page file, relative to the store root unless its directory is absolute.

        With ``slots == 1`` both slots name the slot-A file. An entry of the RAM tier has
        one file per slot, in ``ram_dir``."""
        check_slot(slot)
        slot = slot if self.slots == 2 else SLOTS[0]
        e = self.entry(name)
        where = self.ram_dir if e.ram and self.ram_dir is not None else self.dirs[stripe]
        return os.path.join(where, f"{e.stem}.{slot}.page")

    def _index_map(self) -> dict[str, int]:
        # Cached on the instance without breaking frozenness: it is derived data.
        cache = self.__dict__.get("_index_cache")
        if cache is None:
            cache = {e.name: i for i, e in enumerate(self.entries)}
            object.__setattr__(self, "_index_cache", cache)
        return cache


def check_slot(slot: str) -> str:
    if slot not in SLOTS:
        raise PageStoreLayoutError(f"slot must be 'A' or 'B', got {slot!r}")
    return slot


def _unknown_entry(name: str, names: tuple[str, ...]) -> str:
    shown = ", ".join(repr(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")
    return f"the page store has no entry named {name!r}; its {len(names)} entries are: {shown}"


def parse_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a dtype-like or a name such as ``"bfloat16"``."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        try:
            dt = np.dtype(getattr(ml_dtypes, str(dtype)))
        except AttributeError:
            raise PageStoreLayoutError(f"unknown dtype {dtype!r}") from None
    if dt.hasobject or dt.fields is not None or dt.itemsize == 0:
        raise PageStoreLayoutError(
            f"dtype {dt} cannot be paged: use a plain numeric dtype (float32, bfloat16, int8, ...)"
        )
    return dt


def _shape_dtype(name: str, spec: Any) -> tuple[tuple[int, ...], np.dtype]:
    # Accepts jax.ShapeDtypeStruct, numpy/jax arrays (anything with .shape and .dtype) or a
    # (shape, dtype) pair, so callers can pass `jax.eval_shape` output directly.
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):
        shape, dtype = spec.shape, spec.dtype
    elif isinstance(spec, tuple | list) and len(spec) == 2:
        shape, dtype = spec
    else:
        raise PageStoreLayoutError(
            f"entry {name!r}: expected a jax.ShapeDtypeStruct or a (shape, dtype) pair, "
            f"got {type(spec).__name__}"
        )
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise PageStoreLayoutError(f"entry {name!r}: shape {shape!r} is not a tuple") from None
    if any(d < 0 for d in shape):
        raise PageStoreLayoutError(f"entry {name!r}: shape {shape} has a negative dimension")
    return shape, parse_dtype(dtype)


def check_chunk_bytes(chunk_bytes: Any) -> int:
    """Validates a chunk size: a positive multiple of ``ALIGN``."""
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int | np.integer):
        raise PageStoreLayoutError(
            f"`chunk_bytes` must be an int (bytes per chunk, e.g. 16 << 20), got {chunk_bytes!r}"
        )
    chunk_bytes = int(chunk_bytes)
    valid = (
        f"valid chunk sizes are multiples of {ALIGN} from {ALIGN} (4 KiB) to "
        f"{MAX_CHUNK_BYTES} (1 GiB)"
    )
    if chunk_bytes > MAX_CHUNK_BYTES:
        raise PageStoreLayoutError(
            f"`chunk_bytes={chunk_bytes}` ({chunk_bytes / 2**20:g} MiB) is larger than the page "
            f"store supports: {valid}; the default, {16 << 20} (16 MiB), suits most models"
        )
    if chunk_bytes <= 0 or chunk_bytes % ALIGN:
        up = min(MAX_CHUNK_BYTES, max(ALIGN, -(-chunk_bytes // ALIGN) * ALIGN))
        raise PageStoreLayoutError(
            f"`chunk_bytes={chunk_bytes}` is not a positive multiple of {ALIGN} (needed for "
            f"O_DIRECT I/O): {valid}; use {up} or a power of two such as {16 << 20} (16 MiB)"
        )
    return chunk_bytes


def stable_stems(names: list[str]) -> dict[str, str]:
    """File-name stems for entry names: sanitised to ``[A-Za-z0-9._-]``, stable across runs.

    A short hash of the original name is appended only when the sanitised name is too long
    or collides (case-insensitively, for case-insensitive filesystems) with another one.
    """
    base = {}
    for n in names:
        s = _UNSAFE.sub("_", n)
        if not s or s[0] in ".-":  # no hidden files, no "..", nothing that looks like a flag
            s = "_" + s
        base[n] = s
    counts: dict[str, int] = {}
    for s in base.values():
        counts[s.lower()] = counts.get(s.lower(), 0) + 1
    stems = {}
    for n, s in base.items():
        if len(s) > _MAX_STEM or counts[s.lower()] > 1:
            digest = hashlib.sha1(n.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LEN]
            s = f"{s[: _MAX_STEM - _HASH_LEN - 1]}-{digest}"
        stems[n] = s
    seen: dict[str, str] = {}
    for n, s in stems.items():
        if s.lower() in seen:  # only if a name literally ends in another's hash: refuse
            raise PageStoreLayoutError(
                f"entries {seen[s.lower()]!r} and {n!r} map to the same page file name {s!r}; "
                "rename one of them"
            )
        seen[s.lower()] = n
    return stems


def plan_entry(
    name: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    stem: str,
    chunk_bytes: int,
    num_dirs: int,
    ram: bool = False,
) -> EntryLayout:
    """Cuts one entry into chunks and stripes them over ``num_dirs`` directories (one file
    per slot for an entry of the RAM tier, ``ram``)."""
    if ram:
        num_dirs = 1
    if chunk_bytes % dtype.itemsize:
        raise PageStoreLayoutError(
            f"entry {name!r}: chunk_bytes={chunk_bytes} is not a multiple of the itemsize "
            f"{dtype.itemsize} of {dtype}; use a multiple of {math.lcm(ALIGN, dtype.itemsize)}"
        )
    per_chunk = chunk_bytes // dtype.itemsize
    size = math.prod(shape)
    num_chunks = -(-size // per_chunk)
    # An entry with fewer chunks than directories only uses as many files as it has chunks; an
    # empty entry still gets one (empty) file so every entry has a file per slot.
    stripes = max(1, min(num_dirs, num_chunks))
    chunks = []
    sizes = [0] * stripes
    for i in range(num_chunks):
        start = i * per_chunk
        count = min(per_chunk, size - start)
        nbytes = count * dtype.itemsize
        padded = -(-nbytes // ALIGN) * ALIGN
        stripe = i % stripes
        # All chunks but the last are exactly chunk_bytes, so offsets stay aligned.
        chunks.append(ChunkInfo(i, stripe, sizes[stripe], nbytes, padded, start, count))
        sizes[stripe] += padded
    return EntryLayout(name, shape, dtype, stem, tuple(chunks), tuple(sizes), ram=ram)


def plan_layout(
    entries: Mapping[str, Any] | Layout,
    chunk_bytes: int | None = None,
    dirs: list[str] | tuple[str, ...] | None = None,
    slots: int | None = None,
    *,
    ram_bytes: int = 0,
    ram_dir: str | os.PathLike | None = None,
) -> Layout:
    """Plans a page store layout without creating anything.

    Args:
      entries: ``{name: jax.ShapeDtypeStruct | (shape, dtype)}``; the order is kept and
        defines the entry indices. A `Layout` is returned as is (after checking that
        ``chunk_bytes`` and ``dirs``, when given, agree with it).
      chunk_bytes: bytes per chunk, a positive multiple of 4096 (e.g. ``16 << 20``).
      dirs: data directories (absolute, or relative to the store root) over which chunks are
        striped round robin; default ``("data",)``.
      slots: 2 (default; crash-consistent commits) or 1 (in place, half the disk).
      ram_bytes: the RAM tier's budget: entries, in order, go to ``ram_dir`` while their
        files (every slot) fit in it; the rest to ``dirs``. 0: no RAM tier.
      ram_dir: the RAM tier's directory, absolute (required with ``ram_bytes``).

    Returns:
      The `Layout`.

    Raises:
      PageStoreLayoutError: on a bad chunk size, shape, dtype or directory list.

    >>> layout = plan_layout({"w": ((3000,), "float32")}, chunk_bytes=4096)
    >>> [(c.offset, c.nbytes, c.elem_start, c.elem_count) for c in layout.entry("w").chunks]
    [(0, 4096, 0, 1024), (4096, 4096, 1024, 1024), (8192, 3808, 2048, 952)]
    """
    if isinstance(entries, Layout):
        if chunk_bytes is not None and chunk_bytes != entries.chunk_bytes:
            raise PageStoreLayoutError(
                f"chunk_bytes={chunk_bytes} disagrees with the layout's {entries.chunk_bytes}"
            )
        if dirs is not None and tuple(os.fspath(d) for d in dirs) != entries.dirs:
            raise PageStoreLayoutError(f"dirs={dirs!r} disagree with the layout's {entries.dirs}")
        if slots is not None and check_slots(slots) != entries.slots:
            raise PageStoreLayoutError(f"slots={slots} disagrees with the layout's {entries.slots}")
        return entries
    if chunk_bytes is None:
        raise PageStoreLayoutError("chunk_bytes is required (bytes per chunk, e.g. 16 << 20)")
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    dirs = check_dirs(dirs)
    if not isinstance(entries, Mapping):
        raise PageStoreLayoutError(
            f"entries must be a dict {{name: ShapeDtypeStruct | (shape, dtype)}}, "
            f"got {type(entries).__name__}"
        )
    for name in entries:
        if not isinstance(name, str) or not name:
            raise PageStoreLayoutError(f"entry names must be non-empty strings, got {name!r}")
    stems = stable_stems(list(entries))
    slots = check_slots(2 if slots is None else slots)
    ram_left, ram_dir = _check_ram_tier(ram_bytes, ram_dir)
    planned = []
    for name, spec in entries.items():
        shape, dtype = _shape_dtype(name, spec)
        e = plan_entry(name, shape, dtype, stems[name], chunk_bytes, len(dirs), ram=True)
        if slots * sum(e.file_sizes) <= ram_left:
            ram_left -= slots * sum(e.file_sizes)
        else:
            e = plan_entry(name, shape, dtype, stems[name], chunk_bytes, len(dirs))
        planned.append(e)
    if not any(e.ram for e in planned):
        ram_dir = None
    return Layout(chunk_bytes, dirs, tuple(planned), slots=slots, ram_dir=ram_dir)


def _check_ram_tier(ram_bytes: Any, ram_dir: Any) -> tuple[int, str | None]:
    if isinstance(ram_bytes, bool) or not isinstance(ram_bytes, int | np.integer) or ram_bytes < 0:
        raise PageStoreLayoutError(
            f"ram_bytes must be a non-negative int (bytes of the RAM tier), got {ram_bytes!r}"
        )
    if not ram_bytes:
        return 0, None
    if ram_dir is None or not os.path.isabs(os.fspath(ram_dir)):
        raise PageStoreLayoutError(
            f"a RAM tier of {int(ram_bytes)} bytes needs ram_dir, an absolute directory on a "
            f"RAM filesystem (tmpfs), got {ram_dir!r}"
        )
    return int(ram_bytes), os.path.normpath(os.fspath(ram_dir))


def check_slots(slots: Any) -> int:
    if isinstance(slots, bool) or slots not in (1, 2):
        raise PageStoreLayoutError(
            f"slots must be 2 (every commit atomic: a crash leaves the previous version) or 1 "
            f"(updates in place: half the disk, but a crash mid-update loses the store and "
            f"training resumes from a checkpoint), got {slots!r}"
        )
    return int(slots)


def check_dirs(dirs: Any) -> tuple[str, ...]:
    if dirs is None:
        return DEFAULT_DIRS
    if isinstance(dirs, str | os.PathLike):
        dirs = [dirs]  # A single directory is a common slip; it is unambiguous.
    dirs = tuple(os.fspath(d) for d in dirs)
    if not dirs or any(not d for d in dirs):
        raise PageStoreLayoutError(f"dirs must be a non-empty list of directories, got {dirs!r}")
    if len({os.path.normpath(d) for d in dirs}) != len(dirs):
        raise PageStoreLayoutError(f"dirs lists a directory twice: {dirs!r}")
    return dirs


def ram_tier_differences(have: Layout, want: Layout) -> list[str]:
    """What `layout_differences` says of the RAM tier alone (where pages live, not what)."""
    if have.ram_dir == want.ram_dir and [e.ram for e in have.entries] == [
        e.ram for e in want.entries
    ]:
        return []
    return [
        f"RAM tier: store keeps {have.ram_bytes} bytes in {have.ram_dir}, requested "
        f"{want.ram_bytes} bytes in {want.ram_dir} (`host_mem`)"
    ]


def layout_differences(have: Layout, want: Layout) -> list[str]:
    """Human-readable differences between a store's layout and a requested one."""
    diffs = []
    if have.chunk_bytes != want.chunk_bytes:
        diffs.append(f"chunk_bytes: store has {have.chunk_bytes}, requested {want.chunk_bytes}")
    if have.slots != want.slots:
        diffs.append(f"slots: store has {have.slots}, requested {want.slots}")
    if tuple(map(os.path.normpath, have.dirs)) != tuple(map(os.path.normpath, want.dirs)):
        diffs.append(f"dirs: store has {list(have.dirs)}, requested {list(want.dirs)}")
    diffs += ram_tier_differences(have, want)
    have_e = {e.name: e for e in have.entries}
    want_e = {e.name: e for e in want.entries}
    for name in want_e.keys() - have_e.keys():
        diffs.append(f"entry {name!r}: requested but not in the store")
    for name in have_e.keys() - want_e.keys():
        diffs.append(f"entry {name!r}: in the store but not requested")
    for name in [n for n in want.names if n in have_e]:
        h, w = have_e[name], want_e[name]
        if h.shape != w.shape or h.dtype != w.dtype:
            diffs.append(
                f"entry {name!r}: store has {h.dtype}{list(h.shape)}, "
                f"requested {w.dtype}{list(w.shape)}"
            )
    if not diffs and have.names != want.names:
        diffs.append("the same entries are requested in a different order")
    return diffs

"""``manifest.json``: the page store's layout, version and checksums, replaced atomically."""

from __future__ import annotations

import errno
import json
import os
from typing import Any

import crc32c

from jaxoff.aio._layout import (
    ALIGN,
    SLOTS,
    ChunkInfo,
    Layout,
    check_chunk_bytes,
    check_dirs,
    check_slots,
    parse_dtype,
    plan_entry,
)
from jaxoff.aio._pageio import fsync_dir
from jaxoff.aio._store_errors import (
    PageStoreError,
    PageStoreFormatError,
    PageStoreFullError,
    PageStoreLayoutError,
    PageStoreManifestError,
    PageStoreNotFoundError,
)

FORMAT = "jaxoff-pagestore"
# 2: the manifest carries a crc32c of its own content ("manifest_crc32c"). Version 1 (no such
# field) is still read, unverified, and rewritten as version 2 at the next commit.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
CHECKSUM_KEY = "manifest_crc32c"
MANIFEST = "manifest.json"
MANIFEST_TMP = "manifest.json.tmp"

# Crc lists per slot: {slot: {entry name: [crc32c or None per chunk]}}; None = never written.
Crcs = dict[str, dict[str, list[int | None]]]

# Indirection so a crash test can stop a child process exactly between the fsync of the new
# manifest and its rename.
_replace = os.replace

_CHUNK_KEYS = ("offset", "nbytes", "elem_start", "elem_count")


def content_crc(doc: dict[str, Any]) -> int:
    """crc32c of the manifest's canonical JSON (sorted keys, no spaces), its checksum left out."""
    rest = {k: v for k, v in doc.items() if k != CHECKSUM_KEY}
    return crc32c.crc32c(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())


def to_json(layout: Layout, version: int, crcs: Crcs) -> dict[str, Any]:
    """The manifest document of ``version`` (its checksum included). Its entries share the
    layout's parts that never change (shapes, files, chunk tables) with every other document
    of the layout: read it, do not modify it."""
    static = _static_entries(layout)
    entries = {
        e.name: {**static[e.name], "crc": {s: list(crcs[s][e.name]) for s in SLOTS}}
        for e in layout.entries
    }
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "version": version,
        "chunk_bytes": layout.chunk_bytes,
        "align": ALIGN,
        "entries": entries,
        "dirs": list(layout.dirs),
        "slots": layout.slots,
    }
    if layout.ram_dir is not None:
        doc["ram_dir"] = layout.ram_dir
    doc[CHECKSUM_KEY] = content_crc(doc)
    return doc


def encode(layout: Layout, version: int, crcs: Crcs) -> bytes:
    """``to_json`` as the bytes written: compact JSON, the entries in the layout's order (the
    order a reopened store lays them out in)."""
    return json.dumps(to_json(layout, version, crcs), separators=(",", ":")).encode()


def _static_entries(layout: Layout) -> dict[str, dict[str, Any]]:
    """Per entry, the manifest fields that the layout fixes, built once per layout (cached on
    the frozen instance, as derived data)."""
    cache = layout.__dict__.get("_manifest_static")
    if cache is None:
        cache = {}
        for e in layout.entries:
            files = {
                s: [layout.relpath(e.name, s, k) for k in range(len(e.file_sizes))] for s in SLOTS
            }
            cache[e.name] = {
                "shape": list(e.shape),
                "dtype": e.dtype.name,
                "nbytes": e.nbytes,
                # One directory: a plain relpath. Striped: one path per directory used; chunk
                # i lives in file[slot][i % len(file[slot])].
                "file": {s: f[0] if len(layout.dirs) == 1 else f for s, f in files.items()},
                "chunks": [_chunk_json(c) for c in e.chunks],
            }
            if e.ram:
                cache[e.name]["ram"] = True
        object.__setattr__(layout, "_manifest_static", cache)
    return cache


def _chunk_json(c: ChunkInfo) -> dict[str, int]:
    return {
        "offset": c.offset,
        "nbytes": c.nbytes,
        "elem_start": c.elem_start,
        "elem_count": c.elem_count,
    }


def read(root: str) -> tuple[Layout, int, Crcs]:
    """Reads and validates ``<root>/manifest.json``."""
    path = os.path.join(root, MANIFEST)
    if not os.path.isdir(root):
        raise PageStoreNotFoundError(
            f"page store {root} does not exist; create it with PageStore.create (or "
            "PageStore.open_or_create), or check the path"
        )
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise PageStoreNotFoundError(
            f"{root} is not a page store: it has no {MANIFEST} (a store whose creation was "
            "interrupted has none either); create it with PageStore.create(..., exist_ok=True) "
            "or PageStore.open_or_create"
        ) from None
    except OSError as e:
        raise PageStoreFormatError(f"cannot read {path}: {e}") from e
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PageStoreFormatError(
            f"{path} is not valid JSON ({e}); the manifest is damaged: " + _RESTORE
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PageStoreFormatError(
            f'{path} is not a jaxoff page store manifest (no "format": "{FORMAT}"); '
            "point the store at its own directory"
        )
    fv = doc.get("format_version")
    if fv not in READABLE_VERSIONS:
        raise PageStoreFormatError(
            f"{path} has format_version {fv!r}, but this jaxoff reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}; use the jaxoff release that wrote it, or "
            "delete the store and resume from a checkpoint"
        )
    if fv >= 2:
        _check_checksum(path, doc)
    try:
        layout, version, crcs = _parse(doc)
    except _MALFORMED as e:
        raise PageStoreFormatError(f"{path} is malformed ({e!r}); " + _RESTORE) from None
    _check_version_has_pages(path, layout, version, crcs)
    return layout, version, crcs


def _check_checksum(path: str, doc: dict[str, Any]) -> None:
    recorded = doc.get(CHECKSUM_KEY)
    got = content_crc(doc)
    if recorded == got:
        return
    what = (
        f"has no {CHECKSUM_KEY} field"
        if recorded is None
        else f"fails its checksum (recorded {CHECKSUM_KEY} {recorded!r}, content has 0x{got:08x})"
    )
    raise PageStoreManifestError(
        f"{path} {what}: it was edited or damaged after jaxoff wrote it, so its shapes, "
        "version and chunk checksums cannot be trusted. Undo the edit (jaxoff rewrites the "
        "manifest itself; never edit it by hand), or " + _RESTORE
    )


def _check_version_has_pages(path: str, layout: Layout, version: int, crcs: Crcs) -> None:
    """A committed version must have a checksum for every chunk of its slot.

    Version ``V`` lives in slot ``V % 2``; a manifest whose version points at a slot that was
    never written (its version was edited, or it was copied from another state of the store)
    would otherwise only fail later, at a read, as a chunk "never written".
    """
    if version == 0:
        return
    slot = SLOTS[version % 2]
    missing = [(n, i) for n, vs in crcs[slot].items() for i, v in enumerate(vs) if v is None]
    if not missing:
        return
    total = sum(len(e.chunks) for e in layout.entries)
    name, index = missing[0]
    raise PageStoreManifestError(
        f"{path} says the committed version is {version}, which lives in slot {slot}, but it "
        f"records no checksum for {len(missing)} of the {total} chunks of slot {slot} (e.g. "
        f"chunk {index} of {name!r}): the version does not match the pages the manifest "
        "describes (the manifest's version was changed, or the manifest comes from another "
        "copy of this store). Put back the manifest.json written with these page files, or "
        + _RESTORE
    )


# What a hand-edited or damaged manifest raises while being parsed.
_MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError, PageStoreLayoutError)
_RESTORE = "restore from the last checkpoint with `resume=True` (or delete the store directory)"


def _parse(doc: dict[str, Any]) -> tuple[Layout, int, Crcs]:
    version = doc["version"]
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"bad version {version!r}")
    if doc["align"] != ALIGN:
        raise ValueError(f"align is {doc['align']}, expected {ALIGN}")
    chunk_bytes = check_chunk_bytes(doc["chunk_bytes"])
    dirs = check_dirs(doc["dirs"])
    slots = check_slots(doc.get("slots", 2))  # stores written before single-slot had two
    ram_dir = doc.get("ram_dir")
    if ram_dir is not None and (not isinstance(ram_dir, str) or not os.path.isabs(ram_dir)):
        raise ValueError(f"bad ram_dir {ram_dir!r}")
    entries = []
    crcs: Crcs = {s: {} for s in SLOTS}
    for name, rec in doc["entries"].items():
        files = rec["file"]["A"]
        first = files if isinstance(files, str) else files[0]
        stem = os.path.basename(first).removesuffix(".A.page")
        shape = tuple(int(d) for d in rec["shape"])
        ram = rec.get("ram", False)
        if ram not in (False, True) or (ram and ram_dir is None):
            raise ValueError(f"entry {name!r}: bad RAM tier mark {ram!r}")
        e = plan_entry(
            name, shape, parse_dtype(rec["dtype"]), stem, chunk_bytes, len(dirs), ram=ram
        )
        # The manifest repeats what the plan implies; a disagreement means it was edited or
        # damaged, and trusting either side could read the wrong bytes.
        want_chunks = [(c.offset, c.nbytes, c.elem_start, c.elem_count) for c in e.chunks]
        got_chunks = [tuple(c[k] for k in _CHUNK_KEYS) for c in rec["chunks"]]
        if got_chunks != want_chunks:
            raise ValueError(f"entry {name!r}: chunk table disagrees with shape/dtype/chunk_bytes")
        if rec["nbytes"] != e.nbytes:
            raise ValueError(f"entry {name!r}: nbytes {rec['nbytes']} != {e.nbytes}")
        for s in SLOTS:
            phys = s if slots == 2 else SLOTS[0]
            want = [
                os.path.join(ram_dir if ram and ram_dir else dirs[k], f"{stem}.{phys}.page")
                for k in range(len(e.file_sizes))
            ]
            got = rec["file"][s]
            if (got if isinstance(got, list) else [got]) != want:
                raise ValueError(f"entry {name!r}: files {got!r}, expected {want!r}")
            crc = rec["crc"][s]
            if len(crc) != len(e.chunks) or not all(
                c is None or (isinstance(c, int) and 0 <= c < 2**32) for c in crc
            ):
                raise ValueError(f"entry {name!r}: bad crc list for slot {s}")
            crcs[s][name] = list(crc)
        entries.append(e)
    if len({e.stem.lower() for e in entries}) != len(entries):
        raise ValueError("two entries share a page file")
    if ram_dir is not None and not any(e.ram for e in entries):
        raise ValueError("ram_dir without an entry in the RAM tier")
    layout = Layout(chunk_bytes, dirs, tuple(entries), slots=slots, ram_dir=ram_dir)
    return layout, version, crcs


def write(root: str, layout: Layout, version: int, crcs: Crcs) -> None:
    """Atomically replaces ``<root>/manifest.json``: write temp, fsync, rename, fsync dir."""
    # compact: the C encoder (an indented dump runs the pure-Python one, ~5x slower)
    data = encode(layout, version, crcs)
    tmp = os.path.join(root, MANIFEST_TMP)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise PageStoreFullError(
                f"no space to write {tmp} ({len(data)} bytes needed, {os.strerror(e.errno)}); "
                "the previous version is intact. Free disk space (or raise the file size "
                "limit) and retry the commit",
                path=tmp,
                needed_bytes=len(data),
                errno=e.errno,
            ) from None
        raise PageStoreError(f"cannot write {tmp}: {e}") from e
    _replace(tmp, os.path.join(root, MANIFEST))
    fsync_dir(root)


def check_crc_list(values: Any, n: int, name: str) -> list[int | None]:
    """Validates crcs handed to `PageStore.commit`: ``n`` uint32 values (or None) per entry."""
    if hasattr(values, "dtype") and hasattr(values, "tolist"):
        if values.dtype == "int32":  # a C++ side may hand back uint32 bits as int32
            values = values.view("uint32")
        values = values.tolist()
    values = list(values)
    if len(values) != n:
        raise PageStoreLayoutError(f"entry {name!r} has {n} chunks, got {len(values)} crcs")
    for v in values:
        if v is not None and (isinstance(v, bool) or not 0 <= int(v) < 2**32):
            raise PageStoreLayoutError(f"entry {name!r}: crc {v!r} is not a uint32")
    return [None if v is None else int(v) for v in values]

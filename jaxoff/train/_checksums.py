"""Checksums of a checkpoint's files: written last, so their presence means "saved".

orbax verifies nothing it reads back, so a flipped bit in the parameters would be restored
without a word. After both writers of a step have finished, every file of
``checkpoints/<step>`` and the paged checkpoint's manifest (``checkpoints_paged/<step>/
paged.json``, which holds the crc32c of every chunk and is verified chunk by chunk on
restore) gets its crc32c in ``checkpoints/<step>/checksums.json``, written atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import crc32c

from .._errors import JaxoffError
from ..aio import fsync_dir

FORMAT = "jaxoff.checkpoint-checksums/1"
CHECKSUMS = "checksums.json"
_BLOCK = 1 << 22


class CheckpointDamagedError(JaxoffError):
    """A checkpoint's file is missing, short or fails its checksum."""


def file_crc(path: Path) -> tuple[int, int]:
    """``(bytes, crc32c)`` of ``path``, read in 4 MiB blocks."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            crc = crc32c.crc32c(block, crc)
            size += len(block)
    return size, crc


def write_checksums(out_dir: Path, step_dir: Path, extra: list[Path]) -> None:
    """Records the crc32c of every file under ``step_dir`` and of ``extra`` (paths relative to
    ``out_dir``, so a moved run still verifies), atomically: a crash leaves no file or a
    whole one."""
    files = sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != CHECKSUMS)
    files += [p for p in extra if p.is_file()]
    table = {}
    for p in files:
        size, crc = file_crc(p)
        table[p.relative_to(out_dir).as_posix()] = {"bytes": size, "crc32c": crc}
    tmp = step_dir / (CHECKSUMS + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "files": table}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(step_dir / CHECKSUMS)
    fsync_dir(str(step_dir))  # the rename is what makes the step count as saved


def has_checksums(step_dir: Path) -> bool:
    return (step_dir / CHECKSUMS).is_file()


def verify_checksums(out_dir: Path, step_dir: Path) -> None:
    """Raises :class:`CheckpointDamagedError` naming the first file that does not match."""
    path = step_dir / CHECKSUMS
    try:
        meta = json.loads(path.read_text())
        table = meta["files"] if meta.get("format") == FORMAT else None
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise CheckpointDamagedError(f"{path} is unreadable ({e})") from None
    if not isinstance(table, dict):
        raise CheckpointDamagedError(f"{path} is not a {FORMAT} file")
    for rel, want in table.items():
        p = out_dir / rel
        try:
            size, crc = file_crc(p)
        except OSError as e:
            raise CheckpointDamagedError(f"{p} is unreadable ({e.strerror})") from None
        if size != want["bytes"]:
            raise CheckpointDamagedError(f"{p} has {size} bytes, {want['bytes']} were saved")
        if crc != want["crc32c"]:
            raise CheckpointDamagedError(f"{p} fails its checksum (its contents changed)")

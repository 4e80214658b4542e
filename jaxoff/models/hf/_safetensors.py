"""The safetensors format, read with positioned reads and written in a stream: no mmap and no
dependency on the ``safetensors`` package.

A file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON (``{name: {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, offsets relative to the end
of the header), then the raw little-endian tensor bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import ml_dtypes
import numpy as np

from ._errors import PretrainedError

DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
"""The safetensors dtypes a checkpoint's weights may have (floating point only)."""

NAMES = {v: k for k, v in DTYPES.items()}

_HEADER_LIMIT = 100 * 2**20  # the safetensors library's own bound on a header

# Every read of tensor bytes goes through this name (tests wrap it to record the ranges).
_pread = os.pread


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: ``file``, absolute byte ``offset`` and ``nbytes``, ``shape``
    and the safetensors ``dtype`` name."""

    name: str
    file: Path
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of the safetensors file ``path``, checked against its size.

    Raises:
      PretrainedError: the file is not a whole safetensors file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
            if not 0 < n <= min(_HEADER_LIMIT, size - 8):
                raise PretrainedError(
                    f"{path} is not a safetensors file (header length {n}, file {size} bytes): "
                    "replace it with the checkpoint's original file"
                )
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PretrainedError(
            f"{path}: cannot read its safetensors header ({e}): replace it with the "
            "checkpoint's original file"
        ) from None
    base, out = 8 + n, {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        shape = tuple(int(s) for s in meta["shape"])
        dtype = meta["dtype"]
        if base + end > size or end < begin:
            raise PretrainedError(
                f"{path}: tensor {name!r} lies at bytes {base + begin}..{base + end} but the "
                f"file has {size}: the file is truncated; download it again"
            )
        width = DTYPES[dtype].itemsize if dtype in DTYPES else None
        if width is not None and end - begin != math.prod(shape) * width:
            raise PretrainedError(
                f"{path}: tensor {name!r} of shape {list(shape)} {dtype} has {end - begin} "
                "bytes: the file is damaged; download it again"
            )
        out[name] = TensorInfo(name, path, base + begin, end - begin, shape, dtype)
    return out


class TensorReader:
    """Reads tensors by positioned reads (``os.pread``) on files it opens once and closes in
    `close` (or at the end of a ``with``); it holds no mapping and no tensor."""

    def __init__(self):
        self._fds: dict[Path, int] = {}

    def read(self, info: TensorInfo) -> np.ndarray:
        """``info``'s tensor: exactly its byte range, read into a new array."""
        fd = self._fds.get(info.file)
        if fd is None:
            fd = self._fds[info.file] = os.open(info.file, os.O_RDONLY)
        buf = bytearray(info.nbytes)
        view, done = memoryview(buf), 0
        while done < info.nbytes:  # pread may return fewer bytes than asked
            chunk = _pread(fd, info.nbytes - done, info.offset + done)
            if not chunk:
                raise PretrainedError(
                    f"{info.file}: tensor {info.name!r} ends past the end of the file: the "
                    "file was truncated while being read; download it again"
                )
            view[done : done + len(chunk)] = chunk
            done += len(chunk)
        return np.frombuffer(buf, DTYPES[info.dtype]).reshape(info.shape)

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclasses.dataclass(frozen=True)
class Planned:
    """A tensor to write: its ``name``, ``shape`` and numpy ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def header_bytes(tensors: Iterable[Planned], metadata: dict[str, str]) -> bytes:
    """The length prefix and JSON header of a file holding ``tensors`` in this order, padded
    with spaces to 8 bytes as the safetensors library pads it."""
    header: dict = {"__metadata__": metadata}
    at = 0
    for t in tensors:
        header[t.name] = {
            "dtype": NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [at, at + t.nbytes],
        }
        at += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text

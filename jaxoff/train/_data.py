"""Byte-level corpus and deterministic, seeded batches.

The default corpus is the Python standard library's source of the running
interpreter: real text present on every machine, nothing to download.
"""

from __future__ import annotations

import dataclasses
import sysconfig
from pathlib import Path

import numpy as np

from .._errors import ConfigError

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".json", ".toml", ".cfg", ".c", ".h")
DEFAULT_CORPUS_BYTES = 24 * 2**20  # plenty for CPU runs; keeps loading under a second


def default_corpus_dir() -> Path:
    """The standard-library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def _text_files(root: Path) -> list[Path]:
    files = [
        p
        for p in root.rglob("*")
        if p.is_file() and p.suffix in TEXT_SUFFIXES and "site-packages" not in p.parts
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(
    path: Path | str | None = None, max_bytes: int = DEFAULT_CORPUS_BYTES
) -> np.ndarray:
    """Reads a text file or a directory of text files as a ``uint8`` token array.

    Files are concatenated in sorted path order (deterministic on one machine),
    separated by a NUL byte, up to ``max_bytes``.

    Args:
        path: a file or directory; ``None`` for the standard-library source.
        max_bytes: stop after this many bytes.

    Raises:
        ConfigError: the path is missing or holds no text.
    """
    root = default_corpus_dir() if path is None else Path(path)
    if not root.exists():
        raise ConfigError(f"--data {root}: no such file or directory; pass a text file or a folder")
    files = [root] if root.is_file() else _text_files(root)
    chunks, total = [], 0
    for f in files:
        data = f.read_bytes()[: max_bytes - total]
        chunks.append(data + b"\0")
        total += len(data) + 1
        if total >= max_bytes:
            break
    tokens = np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)
    if tokens.size < 1024:
        raise ConfigError(
            f"--data {root}: only {tokens.size} bytes of text (need at least 1024); "
            f"pass a larger file or folder"
        )
    return tokens


@dataclasses.dataclass(frozen=True)
class Batches:
    """Random windows of a token array; batch ``i`` depends only on ``(seed, i)``.

    That makes a resumed run see exactly the batches an uninterrupted one would.
    """

    tokens: np.ndarray
    batch_size: int
    seq_len: int
    seed: int

    def __post_init__(self):
        if self.tokens.size <= self.seq_len + 1:
            raise ConfigError(
                f"corpus split of {self.tokens.size} bytes is shorter than seq_len+1="
                f"{self.seq_len + 1}; use a smaller --seq or more data"
            )

    def __call__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, index])
        starts = rng.integers(0, self.tokens.size - self.seq_len - 1, size=self.batch_size)
        window = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        chunk = self.tokens[window].astype(np.int32)
        return chunk[:, :-1], chunk[:, 1:]


def split(tokens: np.ndarray, val_fraction: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Train/validation split: the last ``val_fraction`` of the corpus is held out."""
    cut = int(tokens.size * (1.0 - val_fraction))
    return tokens[:cut], tokens[cut:]

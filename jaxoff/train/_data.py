"""Training data: a byte-level corpus, token files a user already has, text through a
tokenizer of theirs; and deterministic, seeded batches.

The default corpus is the Python standard library's source of the running
interpreter: real text present on every machine, nothing to download.

:func:`load_tokens` is the one entry point; it returns the tokens (memory-mapped when they
come from a token file, so never read whole) and the vocabulary size the model needs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sysconfig
from pathlib import Path

import numpy as np

from .._errors import ConfigError
from ._options import TOKEN_DTYPES, TOKEN_FILE_SUFFIXES, DataOptions

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".json", ".toml", ".cfg", ".c", ".h")
DEFAULT_CORPUS_BYTES = 24 * 2**20  # plenty for CPU runs; keeps loading under a second


def default_corpus_dir() -> Path:
    """The standard-library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def _text_files(root: Path) -> list[Path]:
    """The text files under ``root`` in sorted relative-path order; ``site-packages`` folders
    are not entered (the installed packages there are most of the files below a stdlib)."""
    files = []
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "site-packages"]
        for name in names:
            p = Path(top, name)
            if p.suffix in TEXT_SUFFIXES and p.is_file():
                files.append(p)
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

    That makes a resumed run see exactly the batches an uninterrupted one would. ``tokens`` may
    be a memory-mapped ``uint8``/``uint16``/``uint32`` array: a batch reads its windows only.
    """

    tokens: np.ndarray
    batch_size: int
    seq_len: int
    seed: int

    def __post_init__(self):
        if self.tokens.size <= self.seq_len + 1:
            raise ConfigError(
                f"corpus split of {self.tokens.size} tokens is shorter than seq_len+1="
                f"{self.seq_len + 1}; use a smaller --seq-len or more data"
            )

    def __call__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, index])
        starts = rng.integers(0, self.tokens.size - self.seq_len - 1, size=self.batch_size)
        window = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        chunk = self.tokens[window].astype(np.int32)
        return chunk[:, :-1], chunk[:, 1:]


def data_batches(
    data: DataOptions, seed: int, model_vocab: int, model: str
) -> tuple[Batches, Batches]:
    """``(training batches, validation batches)`` of the corpus ``data`` names: its tokens
    loaded (`load_tokens`), checked against the model's vocabulary (``model_vocab``; ``model``
    names the model in the message), split (``data.val_fraction`` held out) and cut into
    batches of ``data``'s shape, seeded ``seed`` and ``seed + 1``: a training batch is one
    optimizer step's, ``grad_accum`` micro-batches of ``batch_size`` rows (the step splits
    it, see ``jaxoff.step._accum.micro_batches``), a validation batch ``batch_size`` rows.
    Raises ConfigError."""
    tokens, vocab = load_tokens(data.data, data.tokenizer, data.token_dtype)
    check_vocab(vocab, model_vocab, model)
    train_tokens, val_tokens = split(tokens, data.val_fraction)
    return (
        Batches(train_tokens, data.batch_size * data.grad_accum, data.seq_len, seed),
        Batches(val_tokens, data.batch_size, data.seq_len, seed + 1),
    )


def split(tokens: np.ndarray, val_fraction: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Train/validation split: the last ``val_fraction`` of the corpus is held out."""
    cut = int(tokens.size * (1.0 - val_fraction))
    return tokens[:cut], tokens[cut:]


_SCAN_CHUNK = 1 << 24  # tokens per pass of the id-range check (bounded memory)


def load_tokens(
    data: Path | str | None = None,
    tokenizer: Path | str | None = None,
    token_dtype: str | None = None,
    max_bytes: int = DEFAULT_CORPUS_BYTES,
) -> tuple[np.ndarray, int]:
    """The training tokens and the vocabulary size a model needs for them.

    ``data`` is one of:

    * ``None``, a text file or a folder of text files: bytes (vocabulary 256) read by
      :func:`load_corpus`, or, with ``tokenizer``, the text encoded by that Hugging Face
      ``tokenizers`` JSON file (vocabulary: the tokenizer's, added tokens included);
    * a ``.bin`` token file: a raw little-endian array of ``uint16`` (nanoGPT's ``prepare.py``)
      or ``uint32`` ids. The element type is ``token_dtype``, else the ``"dtype"`` of a JSON
      sidecar (``<file>.json``, e.g. ``train.bin.json``, or ``meta.json`` beside it), else
      ``uint16``. The vocabulary is the sidecar's ``"vocab_size"``, else the largest id + 1;
    * a ``.npy`` token file (1-D ``uint8``/``uint16``/``uint32``/``int32``).

    Token files are memory-mapped, never read whole (one bounded pass checks the ids);
    ``max_bytes`` bounds the text read for bytes or a tokenizer.

    Raises:
        ConfigError: a missing file, an element type or size that does not fit the file, an
            id outside the vocabulary, or ``tokenizer`` without the ``tokenizers`` package.

    Example:
        >>> from jaxoff.train._data import load_tokens
        >>> tokens, vocab = load_tokens(max_bytes=4096)
        >>> tokens.dtype, vocab
        (dtype('uint8'), 256)
    """
    path = None if data is None else Path(data)
    if path is not None and not path.exists():
        raise ConfigError(
            f"--data {path}: no such file or directory; pass a text file, a folder, "
            f"or a .bin/.npy token file"
        )
    is_token_file = path is not None and path.is_file() and path.suffix in TOKEN_FILE_SUFFIXES
    if token_dtype in (None, "auto"):
        token_dtype = None
    elif token_dtype not in TOKEN_DTYPES:
        raise ConfigError(
            f"--token-dtype {token_dtype!r} is not a token type; choose auto or one of "
            f"{', '.join(TOKEN_DTYPES)}"
        )
    elif not (is_token_file and path is not None and path.suffix == ".bin"):
        raise ConfigError(
            f"--token-dtype {token_dtype} applies to .bin token files, not to --data "
            f"{path or 'default (text)'}; leave it at auto"
        )
    if is_token_file:
        assert path is not None  # a token file is a path
        if tokenizer is not None:
            raise ConfigError(
                f"--data {path} is already tokens; --tokenizer encodes text files: leave it out"
            )
        if path.suffix == ".npy":
            return _npy_tokens(path)
        return _bin_tokens(path, token_dtype)
    if tokenizer is not None:
        return _encode_text(path, Path(tokenizer), max_bytes)
    return load_corpus(path, max_bytes), 256


def check_vocab(vocab_size: int, model_vocab: int, model: str = "the model") -> None:
    """Raises :class:`ConfigError` when token ids ``[0, vocab_size)`` do not all fit a model
    whose embedding has ``model_vocab`` rows.

    Example:
        >>> from jaxoff.train._data import check_vocab
        >>> check_vocab(256, 256)
    """
    if vocab_size > model_vocab and " hf:" in f" {model}":  # a pretrained --init-from model
        raise ConfigError(
            f"the data has token ids up to {vocab_size - 1} (vocabulary {vocab_size}) but "
            f"{model} has vocab_size {model_vocab}: the checkpoint's embedding is fixed; use "
            f"data tokenized by its tokenizer (a text --data with its tokenizer.json as "
            f"--tokenizer, or a token file of its ids)"
        )
    if vocab_size > model_vocab:
        raise ConfigError(
            f"the data has token ids up to {vocab_size - 1} (vocabulary {vocab_size}) but "
            f"{model} has vocab_size {model_vocab}; use a model config with vocab_size >= "
            f"{vocab_size} (e.g. dataclasses.replace(cfg, vocab_size={vocab_size}) in your "
            f"--model factory), or data tokenized for {model_vocab} tokens"
        )


def _sidecar(path: Path) -> tuple[dict, Path | None]:
    """The JSON sidecar of a token file: ``<file>.json``, else ``meta.json`` beside it."""
    for side in (path.with_name(path.name + ".json"), path.with_name("meta.json")):
        if side.is_file():
            try:
                meta = json.loads(side.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ConfigError(f"token sidecar {side}: not valid JSON ({e})") from None
            if not isinstance(meta, dict):
                raise ConfigError(
                    f"token sidecar {side}: expected an object such as "
                    f'{{"dtype": "uint16", "vocab_size": 50257}}'
                )
            return meta, side
    return {}, None


def _bin_tokens(path: Path, token_dtype: str | None) -> tuple[np.ndarray, int]:
    meta, side = _sidecar(path)
    side_dtype = meta.get("dtype")
    if side_dtype is not None and side_dtype not in TOKEN_DTYPES:
        raise ConfigError(
            f"token sidecar {side}: dtype {side_dtype!r} is not one of {', '.join(TOKEN_DTYPES)}"
        )
    if token_dtype and side_dtype and token_dtype != side_dtype:
        raise ConfigError(
            f"--token-dtype {token_dtype} contradicts {side} (dtype {side_dtype}); "
            f"leave --token-dtype at auto or fix the sidecar"
        )
    dtype = np.dtype(token_dtype or side_dtype or "uint16").newbyteorder("<")
    size = path.stat().st_size
    if size == 0 or size % dtype.itemsize:
        raise ConfigError(
            f"--data {path}: {size} bytes is not a whole number of {dtype.name} tokens "
            f"({dtype.itemsize} bytes each); is it a token file of another --token-dtype?"
        )
    tokens = np.memmap(path, dtype=dtype, mode="r")
    return tokens, _vocab(tokens, path, meta.get("vocab_size"), side)


def _npy_tokens(path: Path) -> tuple[np.ndarray, int]:
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ConfigError(f"--data {path}: not a readable .npy array ({e})") from None
    if tokens.ndim != 1 or tokens.dtype.name not in (*TOKEN_DTYPES, "int32") or not tokens.size:
        raise ConfigError(
            f"--data {path}: a .npy token file must be a non-empty 1-D array of "
            f"{', '.join(TOKEN_DTYPES)} or int32, got shape {tokens.shape} {tokens.dtype}"
        )
    meta, side = _sidecar(path)
    return tokens, _vocab(tokens, path, meta.get("vocab_size"), side)


def _vocab(tokens: np.ndarray, path: Path, declared, side: Path | None) -> int:
    """The vocabulary size of a token file: checked in one bounded pass over the ids."""
    lo, hi = 0, 0
    for start in range(0, tokens.size, _SCAN_CHUNK):
        chunk = np.asarray(tokens[start : start + _SCAN_CHUNK])
        lo, hi = min(lo, int(chunk.min())), max(hi, int(chunk.max()))
    if lo < 0:
        raise ConfigError(f"--data {path}: holds a negative token id ({lo})")
    if declared is None:
        return hi + 1
    if not isinstance(declared, int) or declared < 1:
        raise ConfigError(f"token sidecar {side}: vocab_size must be a positive integer")
    if hi >= declared:
        raise ConfigError(
            f"--data {path} holds token id {hi} but {side} declares vocab_size {declared}; "
            f"fix the sidecar's vocab_size (at least {hi + 1}) or re-tokenize"
        )
    return declared


def _load_tokenizer(path: Path):
    try:
        import tokenizers  # optional: pip install 'jaxoff[data]'
    except ImportError:
        raise ConfigError(
            "--tokenizer needs the tokenizers package: pip install 'jaxoff[data]'"
        ) from None
    if not path.is_file():
        raise ConfigError(f"--tokenizer {path}: no such file (a tokenizers JSON file)")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises plain Exceptions on bad JSON
        raise ConfigError(f"--tokenizer {path}: not a tokenizers JSON file ({e})") from None


def _encode_text(path: Path | None, tokenizer_path: Path, max_bytes: int):
    """Text files (each decoded as UTF-8) encoded one after another by the tokenizer."""
    tok = _load_tokenizer(tokenizer_path)
    root = default_corpus_dir() if path is None else path
    files = [root] if root.is_file() else _text_files(root)
    texts, total = [], 0
    for f in files:
        data = f.read_bytes()[: max_bytes - total]
        texts.append(data.decode("utf-8", errors="replace"))
        total += len(data)
        if total >= max_bytes:
            break
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    ids = [np.asarray(e.ids, dtype) for e in tok.encode_batch(texts, add_special_tokens=False)]
    tokens = np.concatenate(ids) if ids else np.zeros(0, dtype)
    if not tokens.size:
        raise ConfigError(f"--data {root}: no text to encode; pass a text file or a folder")
    return tokens, vocab

"""A training run's checkpoint as a ``jaxoff.models.hf.LayerSource``: the parameters outside
the blocks from its orbax part, the blocks one layer at a time from wherever the run kept
them (orbax, or the paged part of a Fuyou ``--page-params`` run, verified chunk by chunk).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path
from typing import Any

import crc32c
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from .._errors import ConfigError
from ..aio import PageStore
from ._checksums import CheckpointDamagedError, verify_checksums

_KEY = re.compile(r"\['([^']*)'\]")
MANIFEST = "paged.json"  # what `jaxoff.optim`'s copy_out writes last in a paged part
FORMAT = "jaxoff.paged-checkpoint/1"


def _path(keys) -> tuple[str, ...]:
    return tuple(str(k) for k in keys if k != "value")


def _keys(path) -> list:
    """A tree path's keys (a dict key, an attribute name or an index)."""
    return [getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path]


def _orbax_params(step_dir: Path) -> dict[tuple[str, ...], np.ndarray]:
    """``{parameter path: array}`` of the ``params`` of an orbax checkpoint's state (read
    alone: the optimizer state it holds beside them is left on disk)."""

    item = (step_dir / "default").absolute()
    absl = logging.getLogger("absl")  # orbax warns of a metadata file its manager never wrote
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        checkpointer = ocp.PyTreeCheckpointer()
        meta = checkpointer.metadata(item)
        tree = getattr(meta, "item_metadata", meta)
        tree: Any = getattr(tree, "tree", tree)  # the saved tree's {key: array metadata}
        sub = {"params": tree["params"]}
        abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), sub)
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), sub)
        got = checkpointer.restore(
            item,
            args=ocp.args.PyTreeRestore(item=abstract, restore_args=args, partial_restore=True),
        )["params"]
    finally:
        absl.setLevel(level)
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(got)[0]:
        keys = _keys(path)
        if len(keys) == 1 and isinstance(keys[0], str) and keys[0].startswith("["):
            keys = _KEY.findall(keys[0])  # a Fuyou run saves {keystr(path): leaf}
        if np.size(x):  # a paged block's empty placeholder holds nothing
            out[_path(keys)] = np.asarray(x)
    return out


class PagedPart:
    """The entries of a paged checkpoint part (``checkpoints_paged/<step>``), each read
    whole and checked chunk by chunk against the crc32c its manifest records."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        path = self.directory / MANIFEST
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointDamagedError(f"{path} is unreadable ({e})") from None
        if meta.get("format") != FORMAT:
            raise CheckpointDamagedError(f"{path} is not a {FORMAT} manifest")
        self.entries: dict = meta["entries"]
        self.chunk_bytes = int(meta["chunk_bytes"])
        self.extra: dict = meta.get("extra", {})
        self._store = None
        if "in_store" in meta:  # the pages stayed in the run's store (--paged-checkpoint store)
            self._store = _in_store(meta, self.directory)

    def read(self, name: str) -> np.ndarray:
        info = self.entries.get(name)
        if info is None:
            raise CheckpointDamagedError(
                f"{self.directory / MANIFEST} has no entry {name!r}: the run's model and its "
                f"checkpoint disagree"
            )
        dtype = np.dtype(jnp.dtype(info["dtype"]))
        shape = tuple(info["shape"])
        if self._store is not None:
            return np.asarray(self._store.read(name)).reshape(shape)  # verified by the store
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        per = max(1, self.chunk_bytes // dtype.itemsize) * dtype.itemsize
        crcs = info["crcs"]
        file = self.directory / info["file"]
        out = bytearray()
        with open(file, "rb") as f:
            for c, want in enumerate(crcs):
                raw = f.read(min(per, size - c * per))
                if crc32c.crc32c(raw) != want:
                    raise CheckpointDamagedError(
                        f"chunk {c} of {name!r} in {file} fails its checksum (short, or its "
                        f"contents changed): export an older --step"
                    )
                out += raw
        if len(out) != size:
            raise CheckpointDamagedError(f"{file} holds {len(out)} bytes of {name!r}, not {size}")
        return np.frombuffer(bytes(out), dtype).reshape(shape)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def _in_store(meta: dict, directory: Path):
    """The page store an in-store checkpoint names, checked to hold that version still."""

    root, version = meta["in_store"], int(meta["store_version"])
    try:
        store = PageStore.open(root)
    except Exception as e:  # noqa: BLE001 - the store is gone or unreadable: one line
        raise CheckpointDamagedError(
            f"checkpoint {directory} keeps its paged part in the store {root}, which cannot be "
            f"opened ({e}): export an older --step with a copied paged part"
        ) from None
    held = {n: list(e["crcs"]) for n, e in meta["entries"].items()}
    if store.version != version or any(store.crcs(n) != c for n, c in held.items()):
        store.close()
        raise CheckpointDamagedError(
            f"checkpoint {directory} keeps its paged part in the store {root}, which has moved "
            f"on from version {version}: export an older --step"
        )
    return store


class RunSource:
    """A ``LayerSource`` (``jaxoff.models.hf``) over checkpoint ``step`` of the run in
    ``run_dir`` of the model ``model_cfg``: the parameters outside the blocks from orbax;
    layer ``j`` of the blocks from orbax, or, where the run paged them (``page_params``) or
    kept them as the 16-bit casts of their fp32 masters, from the paged part, one layer at
    a time, every chunk checked against its checksum.
    """

    def __init__(self, run_dir: Path, step: int, model_cfg, page_params: bool):
        self.config = model_cfg
        run_dir = Path(run_dir).absolute()
        step_dir = run_dir / "checkpoints" / str(step)
        verify_checksums(run_dir, step_dir)  # the orbax files and the paged manifest
        self._params = _orbax_params(step_dir)
        abstract = nnx.split(nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0))), nnx.Param)[1]
        self._shapes = {
            _path(_keys(p)): x for p, x in jax.tree_util.tree_flatten_with_path(abstract)[0]
        }
        self._paged: PagedPart | None = None
        self._prefix = "param."
        paged_dir = run_dir / "checkpoints_paged" / str(step)
        masters = False
        if (paged_dir / MANIFEST).is_file():
            part = PagedPart(paged_dir)
            masters = part.extra.get("blocks") == "masters"
            if page_params or masters:
                self._paged, self._prefix = part, "master." if masters else "param."
            else:
                part.close()
        elif page_params:
            raise CheckpointDamagedError(f"checkpoint {step} has no paged part in {paged_dir}")
        missing = [p for p in self._shapes if p not in self._params and not self._paged_block(p)]
        if missing:
            raise ConfigError(
                f"checkpoint {step} of {run_dir} holds no parameter {'.'.join(missing[0])}: it "
                f"is not a checkpoint of the model its config.json names"
            )

    def _paged_block(self, path) -> bool:
        return self._paged is not None and path[0] == "blocks"

    def outside(self) -> dict[tuple[str, ...], np.ndarray]:
        return {p: self._params[p] for p in self._shapes if p[0] != "blocks"}

    def layer(self, j: int) -> dict[tuple[str, ...], np.ndarray]:
        out = {}
        for p, sds in self._shapes.items():
            if p[0] != "blocks":
                continue
            if self._paged is None:
                out[p] = self._params[p][j]
                continue
            x = self._paged.read(f"{self._prefix}{'.'.join(p)}@{j}")
            if x.dtype != sds.dtype:  # a master: the step's own cast gives the parameter
                x = np.asarray(jnp.asarray(x).astype(sds.dtype))
            out[p] = x.reshape(sds.shape[1:])
        return out

    def close(self) -> None:
        if self._paged is not None:
            self._paged.close()

    def __enter__(self) -> RunSource:
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            self.close()

"""A jaxoff model out to a Hugging Face checkpoint folder, one layer at a time."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from jaxoff.models.gpt import GPTConfig
from jaxoff.models.llama import LlamaConfig

from . import _mapping
from ._config import hf_config, infer_model_type
from ._errors import PretrainedError
from ._load import INDEX, TOKENIZER_FILES, abstract_params
from ._safetensors import Planned, header_bytes

EXPORT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

DEFAULT_SHARD_BYTES = 5 * 2**30  # transformers' own default max_shard_size ("5GB")


@runtime_checkable
class LayerSource(Protocol):
    """Where an export reads a model: its config, the parameters outside the blocks, and
    the blocks one layer at a time (in order, each asked for once). A paged checkpoint
    implements it by reading layer ``j`` from its store.

    Paths are those of the model's ``nnx.Param`` state (``("blocks", "attn", "q",
    "kernel")``); a layer's arrays have no layer axis.
    """

    config: LlamaConfig | GPTConfig

    def outside(self) -> dict[tuple[str, ...], np.ndarray]: ...

    def layer(self, j: int) -> dict[tuple[str, ...], np.ndarray]: ...


class ParamsSource:
    """A `LayerSource` over a model's ``nnx.Param`` state (``cfg``, ``params``); a stacked
    leaf is indexed ``leaf[j]``, so it may be an array or a lazy leaf
    (``jaxoff.nn.LayerLeaf``, a pretrained checkpoint's ``PretrainedLeaf``)."""

    def __init__(self, cfg: LlamaConfig | GPTConfig, params):
        self.config = cfg
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        self._leaves = {
            tuple(k for k in (getattr(x, "key", None) for x in p) if k is not None): v
            for p, v in flat
        }

    @classmethod
    def of_model(cls, model: nnx.Module) -> ParamsSource:
        """The source of a built model (its config is ``model.cfg``)."""
        return cls(model.cfg, nnx.state(model, nnx.Param))

    def outside(self):
        return {p: np.asarray(v) for p, v in self._leaves.items() if p[0] != "blocks"}

    def layer(self, j: int):
        return {p: np.asarray(v[j]) for p, v in self._leaves.items() if p[0] == "blocks"}


def _shard_names(n: int) -> list[str]:
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]


def _plan(rules, cfg, dtype) -> list[tuple[_mapping.Rule, int | None, Planned]]:
    """Every tensor in the order they are written: outside the blocks, then layer by layer."""
    _, shapes, _ = abstract_params(cfg)
    out = []
    for rule in (r for r in rules if not r.is_block):
        shape = rule.hf_shape(tuple(shapes[p].shape for p in rule.paths))
        out.append((rule, None, Planned(rule.name(), shape, dtype)))
    block = [r for r in rules if r.is_block]
    per_layer = [r.hf_shape(tuple(shapes[p].shape[1:] for p in r.paths)) for r in block]
    for j in range(cfg.num_layers):
        for rule, shape in zip(block, per_layer, strict=True):
            out.append((rule, j, Planned(rule.name(j), shape, dtype)))
    return out


def _shards(plan, max_bytes: int) -> list[list]:
    shards: list[list] = [[]]
    size = 0
    for item in plan:
        if shards[-1] and size + item[2].nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item[2].nbytes
    return shards


def _check_target(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PretrainedError(
            f"{out} exists and is not an empty folder: export into a new folder (jaxoff never "
            "overwrites a checkpoint)"
        )
    if not out.parent.is_dir():
        raise PretrainedError(f"{out.parent} does not exist: create it, or export elsewhere")


def export_pretrained(
    source: nnx.Module | LayerSource,
    out_dir,
    *,
    dtype: str = "float32",
    model_type: str | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    tokenizer_dir=None,
    extra_config: dict | None = None,
) -> Path:
    """Writes a model as a Hugging Face checkpoint folder that transformers loads: sharded
    safetensors (``{"format": "pt"}`` metadata, ``model.safetensors.index.json`` when there
    are several shards, written last), a ``config.json`` with both rotary schemas (v4's
    ``rope_theta``/``rope_scaling``, v5's ``rope_parameters``) and both dtype keys
    (``torch_dtype``, ``dtype``), and the tokenizer files of ``tokenizer_dir``.

    The blocks are read from ``source`` one layer at a time and written as they come, so a
    model larger than memory exports from a source that reads its layers from disk. The
    folder is written beside ``out_dir`` and renamed into place at the end: a failed export
    leaves nothing.

    Args:
      source: a built model (its ``cfg`` says what it is), or a `LayerSource`.
      out_dir: the new folder (absent or empty).
      dtype: the tensors' dtype, ``"float32"`` (the values exactly) or ``"bfloat16"``.
      model_type: the Hugging Face ``model_type``; by default the one that holds the
        model (``gpt2``, or ``llama``, ``mistral``, ``qwen2``, ``qwen3`` by its options).
      max_shard_bytes: the most bytes of tensors in one file (a larger tensor gets a file
        of its own).
      tokenizer_dir: a folder whose tokenizer files are copied (a checkpoint folder).
      extra_config: more ``config.json`` keys that are not the model's shape, e.g. the
        tokenizer's ``bos_token_id`` and ``eos_token_id`` (a shape key here is refused).

    Returns:
      ``out_dir``.

    Raises:
      PretrainedError: the model cannot be written as asked (the message says why);
        nothing has been written.

    Example:
        >>> export_pretrained(model, "/tmp/my-llama", dtype="bfloat16")  # doctest: +SKIP
    """
    if not isinstance(source, LayerSource):
        source = ParamsSource.of_model(source)
    cfg = source.config
    out = Path(out_dir)
    if dtype not in EXPORT_DTYPES:
        raise PretrainedError(f"dtype={dtype!r} is not one of {', '.join(EXPORT_DTYPES)}")
    if max_shard_bytes < 1:
        raise PretrainedError(f"max_shard_bytes={max_shard_bytes} must be positive")
    model_type = model_type or infer_model_type(cfg)
    config = hf_config(cfg, model_type, dtype)
    clash = sorted(set(extra_config or {}) & set(config))
    if clash:
        raise PretrainedError(
            f"extra_config sets {clash[0]!r}, which the model decides: leave it out"
        )
    config.update(extra_config or {})
    tokenizer = [Path(tokenizer_dir) / n for n in TOKENIZER_FILES] if tokenizer_dir else []
    if tokenizer_dir is not None and not Path(tokenizer_dir).is_dir():
        raise PretrainedError(f"tokenizer_dir {tokenizer_dir} is not a folder")
    _check_target(out)
    rules = _mapping.rules(cfg)
    shards = _shards(_plan(rules, cfg, EXPORT_DTYPES[dtype]), max_bytes=max_shard_bytes)
    names = _shard_names(len(shards))

    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        tensors = _tensors(source, rules, cfg)
        for name, shard in zip(names, shards, strict=True):
            with open(partial / name, "wb") as f:
                f.write(header_bytes([t for _, _, t in shard], {"format": "pt"}))
                for _, _, planned in shard:
                    got_name, array = next(tensors)
                    assert got_name == planned.name, (got_name, planned.name)
                    array = np.ascontiguousarray(array.astype(planned.dtype))
                    if array.shape != planned.shape:
                        raise PretrainedError(
                            f"the source's {planned.name!r} has shape {list(array.shape)}, the "
                            f"config implies {list(planned.shape)}: the source and its config "
                            "disagree"
                        )
                    f.write(array.reshape(-1).view(np.uint8).data)
                f.flush()
                os.fsync(f.fileno())
        (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for path in tokenizer:
            if path.is_file():
                shutil.copyfile(path, partial / path.name)
        if len(names) > 1:  # last: the index names a complete set of shards
            weight_map = {t.name: n for n, s in zip(names, shards, strict=True) for _, _, t in s}
            total = sum(t.nbytes for s in shards for _, _, t in s)
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (partial / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out


def _tensors(source: LayerSource, rules, cfg) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, array)`` in `_plan`'s order, one layer of the source at a time."""
    outside = source.outside()
    for rule in (r for r in rules if not r.is_block):
        yield rule.name(), np.asarray(rule.to_hf(*(outside[p] for p in rule.paths)))
    del outside
    block = [r for r in rules if r.is_block]
    for j in range(cfg.num_layers):
        layer = source.layer(j)
        for rule in block:
            yield rule.name(j), np.asarray(rule.to_hf(*(layer[p] for p in rule.paths)))
        del layer

"""A Hugging Face checkpoint as the initial parameters of a training run
(``jaxoff train --init-from DIR``): a ``jaxoff.step.Initializer``."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ._config import model_config, read_config
from ._load import PretrainedLeaf, open_pretrained


def pretrained_config(directory, **fields):
    """The jaxoff model config of the checkpoint folder ``directory`` from its
    ``config.json`` alone (no tensor is opened; `open_pretrained` checks them). ``fields``
    are more config fields (``dtype``, ``param_dtype``, ``name``; default name
    ``hf:<folder name>``).

    Raises:
      PretrainedError: no ``config.json``, or one jaxoff cannot read (the message says why).

    Example:
        >>> folder = f"{REPO}/tests/fixtures/hf/llama"  # a tiny Llama checkpoint of the tests
        >>> pretrained_config(folder).num_layers
        2
    """
    directory = Path(directory)
    fields.setdefault("name", f"hf:{directory.name}")
    return model_config(read_config(directory), **fields)


@dataclasses.dataclass(frozen=True)
class PretrainedInit:
    """The parameters of the checkpoint folder ``directory`` for a model config of its
    architecture (the run's: its stack, dtypes and name may differ from the folder's).

    ``model(cfg)`` loads the whole model (``Pretrained.load``); ``layerwise(cfg)`` keeps the
    folder open and gives ``(graphdef, params)`` whose stacked block leaves are
    `PretrainedLeaf` s, read one layer at a time while the context lasts (the other leaves
    are arrays): ``fuyou_init(..., page_params=True)`` then writes the store without the
    model ever being whole in memory.

    Example:
        >>> from jaxoff.models.hf import PretrainedInit, pretrained_config
        >>> folder = f"{REPO}/tests/fixtures/hf/llama"  # a tiny Llama checkpoint of the tests
        >>> cfg = pretrained_config(folder)
        >>> PretrainedInit(folder).model(cfg).cfg.d_model
        32
    """

    directory: Path

    def model(self, model_cfg) -> nnx.Module:
        with open_pretrained(self.directory) as ckpt:
            return ckpt.load(model_cfg)

    @contextlib.contextmanager
    def layerwise(self, model_cfg) -> Iterator[tuple[Any, Any]]:
        with open_pretrained(self.directory) as ckpt:
            graphdef, params = ckpt.params(model_cfg)
            yield graphdef, jax.tree.map(_device_unless_lazy, params)


def _device_unless_lazy(x):
    return x if isinstance(x, PretrainedLeaf) else jnp.asarray(x)

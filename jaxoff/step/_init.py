"""Where a new run's parameters come from: a random init from the run's seed, or anything
else with the same two ways of making them (a pretrained checkpoint:
``jaxoff.models.hf.PretrainedInit``)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from flax import nnx

from ..nn import layerwise_params


@runtime_checkable
class Initializer(Protocol):
    """The parameters of a new run, made two ways.

    ``model(model_cfg)`` builds the whole model in memory (the plain and the FSDP step);
    ``layerwise(model_cfg)`` is a context giving ``(graphdef, params)`` whose stacked block
    leaves make one layer when indexed (``leaf[j]``), valid until the context ends: what
    ``fuyou_init(..., page_params=True)`` writes to a page store, one layer in memory at a
    time.
    """

    def model(self, model_cfg) -> nnx.Module: ...

    def layerwise(self, model_cfg) -> contextlib.AbstractContextManager[tuple[Any, Any]]: ...


@dataclasses.dataclass(frozen=True)
class RandomInit:
    """The model's own random init from ``seed`` (``model_cfg.build(nnx.Rngs(seed))``); its
    layerwise form is ``jaxoff.nn.layerwise_params``, bitwise the same values.

    Example:
        >>> from jaxoff.models.gpt import CONFIGS
        >>> from jaxoff.step import RandomInit
        >>> RandomInit(0).model(CONFIGS["tiny"]).cfg.num_layers
        5
    """

    seed: int = 0

    def model(self, model_cfg) -> nnx.Module:
        return model_cfg.build(nnx.Rngs(self.seed))

    @contextlib.contextmanager
    def layerwise(self, model_cfg) -> Iterator[tuple[Any, Any]]:

        yield layerwise_params(lambda: self.model(model_cfg))

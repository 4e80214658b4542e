"""jaxoff: train JAX/Flax models larger than the memory that holds them.

This module holds the names a user needs: `train` with its `TrainConfig` (or a `Step` in a
loop of one's own), the paged optimizer (`paged` and its checkpointing), the model protocol
(`LayeredModel`, `Stack`, `run_stack`, `load_model`), `Policy` and `Placement`, and the errors
to catch. Everything else public lives in a subpackage's ``__all__``: `jaxoff.aio` (page
stores and the I/O engine), `jaxoff.policy` (presets), `jaxoff.placement`, `jaxoff.step`,
`jaxoff.strategies`, `jaxoff.plan`, `jaxoff.compare`, `jaxoff.optim` (the optimizer's whole
surface) and `jaxoff.optim.chunks` (for strategy authors). Modules and names that start with
an underscore are private.

Names are imported on first use, so ``import jaxoff`` (and ``jaxoff --help``) does not
import JAX:

>>> import jaxoff
>>> len(jaxoff.__all__)
22
>>> issubclass(jaxoff.PageStoreError, jaxoff.JaxoffError)  # catch one, or all of jaxoff's
True
>>> from jaxoff.aio import PageStore  # a name that lives in its subpackage
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> (module, attribute); every other name lives in its subpackage (`jaxoff.aio`,
# `jaxoff.policy`, `jaxoff.step`, `jaxoff.optim.chunks`, ...)
_EXPORTS = {
    # train a model: jaxoff.train(TrainConfig(...)), or your loop around a Step
    "train": (".train", None),  # the package, which is also callable: jaxoff.train(cfg)
    "TrainConfig": (".train", "TrainConfig"),
    "TrainResult": (".train", "TrainResult"),
    "Step": (".step", "Step"),
    # the paged optimizer: an optax transformation whose state lives in a page store
    "paged": (".optim", "paged"),
    "update_and_apply": (".optim", "update_and_apply"),
    "PagedState": (".optim", "PagedState"),
    "fused_adamw": (".optim", "fused_adamw"),
    "save_paged": (".optim", "save_paged"),
    "restore_paged": (".optim", "restore_paged"),
    "PagedSave": (".optim", "PagedSave"),
    "PagedRestore": (".optim", "PagedRestore"),
    # your model: a layer stack, and where its tensors live
    "LayeredModel": (".nn", "LayeredModel"),
    "Stack": (".nn", "Stack"),
    "run_stack": (".nn", "run_stack"),
    "load_model": (".models", "load_model"),
    "Policy": (".policy", "Policy"),
    "Placement": (".placement", "Placement"),
    "compiler_options": ("._xla", "compiler_options"),
    # the errors to catch: every jaxoff error is a JaxoffError
    "JaxoffError": ("._errors", "JaxoffError"),
    "ConfigError": ("._errors", "ConfigError"),
    "PageStoreError": (".aio", "PageStoreError"),
}

__all__ = [  # the keys of _EXPORTS, spelled out for tools
    "train",
    "TrainConfig",
    "TrainResult",
    "Step",
    "paged",
    "update_and_apply",
    "PagedState",
    "fused_adamw",
    "save_paged",
    "restore_paged",
    "PagedSave",
    "PagedRestore",
    "LayeredModel",
    "Stack",
    "run_stack",
    "load_model",
    "Policy",
    "Placement",
    "compiler_options",
    "JaxoffError",
    "ConfigError",
    "PageStoreError",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jaxoff' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = importlib.import_module(module, __name__)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from ._errors import ConfigError as ConfigError
    from ._errors import JaxoffError as JaxoffError
    from ._xla import compiler_options as compiler_options
    from .aio import PageStoreError as PageStoreError
    from .models import load_model as load_model  # pyright: ignore[reportMissingImports]
    from .nn import LayeredModel as LayeredModel
    from .nn import Stack as Stack
    from .nn import run_stack as run_stack
    from .optim import PagedRestore as PagedRestore
    from .optim import PagedSave as PagedSave
    from .optim import PagedState as PagedState
    from .optim import fused_adamw as fused_adamw
    from .optim import paged as paged
    from .optim import restore_paged as restore_paged
    from .optim import save_paged as save_paged
    from .optim import update_and_apply as update_and_apply
    from .placement import Placement as Placement
    from .policy import Policy as Policy
    from .step import Step as Step
    from .train import TrainConfig as TrainConfig
    from .train import TrainResult as TrainResult
    from .train import train as train

"""jaxoff: train JAX/Flax models larger than the memory that holds them.

The public API is what this module re-exports; everything else is private. Names are imported
on first use, so ``import jaxoff`` (and ``jaxoff --help``) does not import JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS = {
    "ConfigError": ("._errors", "ConfigError"),
    "JaxoffError": ("._errors", "JaxoffError"),
    "PageStore": (".aio", "PageStore"),
    "PageStoreError": (".aio", "PageStoreError"),
    "plan_layout": (".aio", "plan_layout"),
    "PRESETS": (".policy", "PRESETS"),
    "Policy": (".policy", "Policy"),
    "resolve_policy": (".policy", "resolve_policy"),
    "Placement": (".placement", "Placement"),
    "paged": (".optim", "paged"),
    "update_and_apply": (".optim", "update_and_apply"),
    "fused_adamw": (".optim", "fused_adamw"),
    "save_paged": (".optim", "save_paged"),
    "PagedSave": (".optim", "PagedSave"),
    "PagedRestore": (".optim", "PagedRestore"),
    "PagedState": (".optim", "PagedState"),
    "restore_paged": (".optim", "restore_paged"),
    "Stack": (".nn", "Stack"),
    "LayeredModel": (".nn", "LayeredModel"),
    "load_model": (".nn", "load_model"),
    "run_stack": (".nn", "run_stack"),
    "TrainConfig": (".train", "TrainConfig"),
    "TrainResult": (".train", "TrainResult"),
    "TrainState": (".train", "TrainState"),
    "train": (".train", None),  # the package, which is also callable: jaxoff.train(cfg)
    "compiler_options": ("._xla", "compiler_options"),
}

__all__ = sorted(_EXPORTS)


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
    from .aio import PageStore as PageStore
    from .aio import PageStoreError as PageStoreError
    from .aio import plan_layout as plan_layout
    from .nn import LayeredModel as LayeredModel
    from .nn import Stack as Stack
    from .nn import load_model as load_model
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
    from .policy import PRESETS as PRESETS
    from .policy import Policy as Policy
    from .policy import resolve_policy as resolve_policy
    from .train import TrainConfig as TrainConfig
    from .train import TrainResult as TrainResult
    from .train import TrainState as TrainState
    from .train import train as train

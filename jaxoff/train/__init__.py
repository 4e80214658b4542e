"""Training: config, data, the jitted step, the loop with metrics and checkpoints."""

import sys as _sys
import types as _types

from ..step import TrainState as TrainState
from ..step import abstract_state as abstract_state
from ..step import init_state as init_state
from ..step import make_loss_fn as make_loss_fn
from ..step import make_train_step as make_train_step
from ._config import TrainConfig as TrainConfig
from ._config_file import load_config_file as load_config_file
from ._data import Batches as Batches
from ._data import load_corpus as load_corpus
from ._data import load_tokens as load_tokens
from ._data import split as split
from ._export import ExportConfig as ExportConfig
from ._export import export_run as export_run
from ._export import run_config as run_config
from ._loop import TrainResult as TrainResult
from ._loop import train as train
from ._metrics import read_metrics as read_metrics
from ._options import FLAT_NAMES as FLAT_NAMES
from ._options import DataOptions as DataOptions
from ._options import ModelOptions as ModelOptions
from ._options import OptimOptions as OptimOptions
from ._options import RunOptions as RunOptions
from ._options import StoreOptions as StoreOptions
from ._options import StrategyOptions as StrategyOptions

__all__ = [
    "Batches",
    "DataOptions",
    "ExportConfig",
    "FLAT_NAMES",
    "ModelOptions",
    "OptimOptions",
    "RunOptions",
    "StoreOptions",
    "StrategyOptions",
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "abstract_state",
    "export_run",
    "init_state",
    "load_config_file",
    "load_corpus",
    "load_tokens",
    "make_loss_fn",
    "make_train_step",
    "read_metrics",
    "run_config",
    "split",
    "train",
]


class _CallableTrainPackage(_types.ModuleType):
    """``jaxoff.train`` is this package and, called, :func:`train`: ``jaxoff.train(cfg)``.

    ``jaxoff`` imports its names lazily, and importing a subpackage binds its name in the parent
    (``jaxoff.train``, the package) after the package has run, so the function cannot take
    the name; the package answers the call instead.
    """

    def __call__(self, cfg, model=None):
        return train(cfg, model)


_sys.modules[__name__].__class__ = _CallableTrainPackage

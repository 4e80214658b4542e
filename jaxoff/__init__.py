"""jaxoff: train JAX/Flax models larger than the memory that holds them.

The public API is what this module re-exports; everything else is private.
"""

from ._errors import ConfigError as ConfigError
from ._errors import JaxoffError as JaxoffError
from .aio import PageStore as PageStore
from .aio import PageStoreError as PageStoreError
from .aio import plan_layout as plan_layout
from .policy import PRESETS as PRESETS
from .policy import Policy as Policy
from .policy import resolve_policy as resolve_policy
from .train import TrainConfig as TrainConfig
from .train import TrainResult as TrainResult
from .train import TrainState as TrainState
from .train import train as train

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "JaxoffError",
    "PageStore",
    "PRESETS",
    "PageStoreError",
    "Policy",
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "plan_layout",
    "resolve_policy",
    "train",
]

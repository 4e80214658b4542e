"""The research systems as named strategies, each a small composition of jaxoff's parts.

A strategy is a function ``Context -> Recipe`` registered by name (:func:`register`); a
:class:`Recipe` is data (policy spelling, placement, paged optimizer, model overrides,
update in backward). ``jaxoff compare --strategies all`` measures every registered
strategy; :func:`strategy_overrides` gives the ``TrainConfig`` values that run one;
:func:`prepare` builds its jitted step. See ``docs/guide/porting.md``.

Example:
    >>> from jaxoff.models.gpt import CONFIGS
    >>> from jaxoff.strategies import Context, get_strategy
    >>> get_strategy("l2l").recipe(Context(CONFIGS["tiny"], 4, 32)).placement
    'host_params_stream1'
"""

from . import _builtin  # noqa: F401  (registers the built-in strategies)
from ._build import STEP_BUILDERS as STEP_BUILDERS
from ._build import Prepared as Prepared
from ._build import accumulates as accumulates
from ._build import build_step as build_step
from ._build import model_config as model_config
from ._build import placement as placement
from ._build import prepare as prepare
from ._recipe import STRATEGIES as STRATEGIES
from ._recipe import Context as Context
from ._recipe import Recipe as Recipe
from ._recipe import Strategy as Strategy
from ._recipe import StrategyUnavailable as StrategyUnavailable
from ._recipe import build_recipe as build_recipe
from ._recipe import get_strategy as get_strategy
from ._recipe import register as register
from ._recipe import strategy_overrides as strategy_overrides

__all__ = [
    "Context",
    "Prepared",
    "Recipe",
    "STEP_BUILDERS",
    "STRATEGIES",
    "Strategy",
    "StrategyUnavailable",
    "accumulates",
    "build_recipe",
    "build_step",
    "get_strategy",
    "model_config",
    "placement",
    "prepare",
    "register",
    "strategy_overrides",
]

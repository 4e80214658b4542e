"""The former home of Fuyou's step, now the package ``jaxoff.strategies.fuyou``: its names,
re-exported for modules not yet moved to it (``strategies._builtin``'s availability check,
the trainer's model check). New code imports ``jaxoff.strategies.fuyou``."""

from .fuyou import *  # noqa: F403
from .fuyou import __all__ as __all__
from .fuyou._layout import _check_model as _check_model

"""``TrainState`` lives in :mod:`jaxoff.step` (``jaxoff/step/_state.py``); this name stays for
the modules below the step (placement) that import it from here."""

from .step._state import TrainState as TrainState

__all__ = ["TrainState"]

"""The shipped model families, installed as ``jaxoff.models``: ``jaxoff.models.gpt`` (GPT-2
shapes) and ``jaxoff.models.llama`` (Llama shapes), both implementations of the model protocol
of :mod:`jaxoff.nn`; models by name (`load_model`: a size name or ``package.module:factory``,
as ``--model`` takes it; `sizes`); and Hugging Face checkpoints into and out of them
(``jaxoff.models.hf``: `from_pretrained`, `open_pretrained`, `export_pretrained`).

These functions are imported when first used, so ``import jaxoff.models.gpt`` stays as light
as it was.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    "load_model": "._names",
    "sizes": "._names",
    "from_pretrained": ".hf",
    "open_pretrained": ".hf",
    "export_pretrained": ".hf",
    "PretrainedError": ".hf",
}

__all__ = [
    "PretrainedError",
    "export_pretrained",
    "from_pretrained",
    "load_model",
    "open_pretrained",
    "sizes",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from ._names import load_model as load_model
    from ._names import sizes as sizes
    from .hf import PretrainedError as PretrainedError
    from .hf import export_pretrained as export_pretrained
    from .hf import from_pretrained as from_pretrained
    from .hf import open_pretrained as open_pretrained

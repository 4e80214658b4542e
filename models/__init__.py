"""The shipped model families, installed as ``jaxoff.models``: ``jaxoff.models.gpt`` (GPT-2
shapes) and ``jaxoff.models.llama`` (Llama shapes), both implementations of the model protocol
of :mod:`jaxoff.nn`; and Hugging Face checkpoints into and out of them (``jaxoff.models.hf``:
`from_pretrained`, `open_pretrained`, `export_pretrained`).

The checkpoint functions are imported when first used, so ``import jaxoff.models.gpt`` stays
as light as it was.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    "from_pretrained": ".hf",
    "open_pretrained": ".hf",
    "export_pretrained": ".hf",
    "PretrainedError": ".hf",
}

__all__ = ["PretrainedError", "export_pretrained", "from_pretrained", "open_pretrained"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from .hf import PretrainedError as PretrainedError
    from .hf import export_pretrained as export_pretrained
    from .hf import from_pretrained as from_pretrained
    from .hf import open_pretrained as open_pretrained

"""Models by name: the shipped sizes (``tiny``, ``llama-mini``, ...) and a user's own
``package.module:factory``, as ``--model`` names them."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Any

from jaxoff._errors import OptionError
from jaxoff.nn import check_model

from .gpt import CONFIGS as _GPT
from .llama import CONFIGS as _LLAMA


def sizes() -> dict[str, Any]:
    """Every named size of the shipped model families (GPT sizes keep their plain names)."""

    return {**_GPT, **_LLAMA}


def _import(module_name: str):
    """Imports ``module_name``; like ``python -m``, the working directory is importable
    (the ``jaxoff`` script's own ``sys.path`` does not hold it)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return importlib.import_module(module_name)


def load_model(spec: Any) -> Any:
    """The model config named by ``spec``: a config itself, a size name, or
    ``package.module:factory`` (``factory()`` returns a config, or the attribute is one).

    Example:
        >>> from jaxoff.models import load_model
        >>> load_model("tiny").num_layers
        5
    """
    if not isinstance(spec, str):
        return check_model(spec)
    spec = spec.strip()
    if ":" not in spec:
        known = sizes()
        if spec not in known:
            raise OptionError(
                f"`model={spec!r}` is not a known size; choose one of {', '.join(known)}, or "
                f"name your own as package.module:factory"
            )
        return known[spec]
    module_name, _, attr = spec.partition(":")
    try:
        module = _import(module_name)
    except ImportError as e:
        raise OptionError(
            f"`model={spec!r}`: cannot import {module_name!r} ({e}); is it on PYTHONPATH?"
        ) from None
    if not hasattr(module, attr):
        raise OptionError(f"`model={spec!r}`: module {module_name!r} has no {attr!r}")
    obj = getattr(module, attr)
    if isinstance(obj, type) or (callable(obj) and not dataclasses.is_dataclass(obj)):
        try:
            obj = obj()
        except TypeError as e:
            raise OptionError(
                f"`model={spec!r}`: {attr}() must take no arguments and return a model config ({e})"
            ) from None
    cfg = check_model(obj)
    if not getattr(cfg, "name", None) and "name" in {f.name for f in dataclasses.fields(cfg)}:
        cfg = dataclasses.replace(cfg, name=spec)
    return cfg

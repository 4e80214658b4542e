"""``--config FILE.toml``: a TOML file of ``TrainConfig`` options, checked against their types."""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path
from typing import Literal

from .._errors import ConfigError
from ._options import GROUPS, nest


def _type_error(value, hint) -> str | None:
    """What is wrong with a TOML ``value`` for a field annotated ``hint``; None if it fits."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        return None if value in args else f"one of {', '.join(map(repr, args))}"
    if args:  # a union, e.g. Path | None (TOML has no null: the value is one of the others)
        errors = [_type_error(value, a) for a in args if a is not type(None)]
        return None if None in errors else " or ".join(e for e in errors if e is not None)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
        Path: isinstance(value, str),
    }
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return None if ok.get(hint, True) else names.get(hint, "a path string")


def load_config_file(path: Path | str) -> dict:
    """Reads a TOML config file into ``TrainConfig`` keyword arguments, by group: its
    ``[train]`` table names options flat (``lr = 3e-4``) or by group
    (``[train.optim_options]``); unknown keys and values of the wrong type are refused."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML ({e})") from None
    values = nest(values.get("train", values), where=f"--config {path}")
    for name, group in GROUPS.items():
        hints = typing.get_type_hints(group)
        for key, value in values[name].items():
            expected = _type_error(value, hints[key])
            if expected is not None:
                raise ConfigError(
                    f"--config {path}: {key} must be {expected}, got {value!r} "
                    f"({type(value).__name__}); fix that line or leave it out"
                )
            if hints[key] in (Path, Path | None) and value is not None:
                values[name][key] = Path(value)
    return values

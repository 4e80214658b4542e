"""``--config FILE.toml``: a TOML file of ``TrainConfig`` options, checked against their types."""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path
from typing import Literal

from .._errors import ConfigError
from ._options import FLAT_NAMES, GROUPS


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
    """Reads a TOML config file into ``TrainConfig`` keyword arguments (unknown keys refused)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML ({e})") from None
    values = values.get("train", values)
    unknown = sorted(set(values) - set(FLAT_NAMES))
    if unknown:
        raise ConfigError(
            f"--config {path}: unknown keys {unknown}; valid keys are {', '.join(FLAT_NAMES)}"
        )
    hints = {k: v for group in GROUPS.values() for k, v in typing.get_type_hints(group).items()}
    for key, value in values.items():
        expected = _type_error(value, hints[key])
        if expected is not None:
            raise ConfigError(
                f"--config {path}: {key} must be {expected}, got {value!r} "
                f"({type(value).__name__}); fix that line or leave it out"
            )
    for key in ("data", "tokenizer", "out_dir", "plan"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    return values

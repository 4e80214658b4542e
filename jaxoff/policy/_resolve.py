"""Turns a policy spelling into what ``models.gpt.GPTConfig.policy`` accepts."""

from __future__ import annotations

import jax

from .._errors import ConfigError

_JAX_POLICIES = tuple(
    name
    for name in dir(jax.checkpoint_policies)
    if not name.startswith("_") and name.endswith(("saveable", "saveable_only"))
)


def resolve_policy(spec: str | None):
    """``"none"`` -> ``None`` (no remat); a ``jax.checkpoint_policies`` name -> that policy."""
    if spec is None or spec == "none":
        return None
    if spec in _JAX_POLICIES:
        return getattr(jax.checkpoint_policies, spec)
    raise ConfigError(
        f"--policy {spec!r} is not a known policy; choose one of none, {', '.join(_JAX_POLICIES)}"
    )

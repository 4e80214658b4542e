"""Remat / offload policies: which named residuals are kept, offloaded or recomputed."""

from ._resolve import resolve_policy as resolve_policy

__all__ = ["resolve_policy"]

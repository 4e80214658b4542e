"""Remat / offload policies: which named residuals are kept, offloaded or recomputed."""

from ._policy import Action as Action
from ._policy import Policy as Policy
from ._policy import Segments as Segments
from ._policy import Untagged as Untagged
from ._policy import sqrt_segment as sqrt_segment
from ._policy import to_jax_policy as to_jax_policy
from ._presets import PRESETS as PRESETS
from ._presets import Preset as Preset
from ._resolve import JAX_POLICIES as JAX_POLICIES
from ._resolve import apply_policy as apply_policy
from ._resolve import get_policy as get_policy
from ._resolve import load_policy_file as load_policy_file
from ._resolve import resolve_policy as resolve_policy

__all__ = [
    "JAX_POLICIES",
    "PRESETS",
    "Action",
    "Policy",
    "Preset",
    "Segments",
    "Untagged",
    "apply_policy",
    "get_policy",
    "load_policy_file",
    "resolve_policy",
    "sqrt_segment",
    "to_jax_policy",
]

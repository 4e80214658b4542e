"""Remat / offload policies: which named residuals are kept, offloaded or recomputed.

A policy is over one model's residual names (its config's ``residual_names``); every function
that makes one takes them as ``names=`` (default: the GPT's). Presets are rules evaluated over
any model's names (:func:`preset`), and :func:`apply_policy` sets any model config's stack.
"""

from ._policy import Action as Action
from ._policy import Policy as Policy
from ._policy import Segments as Segments
from ._policy import Untagged as Untagged
from ._policy import default_names as default_names
from ._policy import to_jax_policy as to_jax_policy
from ._presets import ATTENTION_CORE as ATTENTION_CORE
from ._presets import PRESETS as PRESETS
from ._presets import PROJECTIONS as PROJECTIONS
from ._presets import Preset as Preset
from ._presets import preset as preset
from ._resolve import JAX_POLICIES as JAX_POLICIES
from ._resolve import apply_policy as apply_policy
from ._resolve import get_policy as get_policy
from ._resolve import load_policy_file as load_policy_file
from ._resolve import resolve_policy as resolve_policy

__all__ = [
    "ATTENTION_CORE",
    "JAX_POLICIES",
    "PRESETS",
    "PROJECTIONS",
    "Action",
    "Policy",
    "Preset",
    "Segments",
    "Untagged",
    "apply_policy",
    "default_names",
    "get_policy",
    "load_policy_file",
    "preset",
    "resolve_policy",
    "to_jax_policy",
]

"""Combinations of a placement with a model, a policy and a mesh that cannot work."""

from __future__ import annotations

import jax

from .._errors import ConfigError, OptionError
from ..nn import check_model
from ._placement import Placement, get_placement
from ._shardings import is_stacked


def check_placement(
    placement: Placement | str | None,
    model_cfg,
    *,
    policy: str | None = None,
    params=None,
    devices: int = 1,
    batch_size: int | None = None,
) -> Placement:
    """Raises :class:`ConfigError` (saying what to change) for a combination that cannot
    work; returns the :class:`Placement`.

    Args:
        placement: a placement or its name.
        model_cfg: the model config to train (a :class:`jaxoff.nn.LayeredModel`).
        policy: the remat policy's spelling, as given to ``--policy``.
        params: the parameter tree (or its shapes), to check there are stacked layers.
        devices: devices on the FSDP axis.
        batch_size: sequences per step (must split over the devices).
    """
    placement = get_placement(placement)
    if placement.streams:
        check_model(model_cfg, needs=["streaming"])
        stack = model_cfg.stack
        if stack.remat_every != 1:
            raise OptionError(
                f"layer streaming fetches one block per loop step, but the policy runs "
                f"segments of several blocks (remat_every={stack.remat_every!r}); use "
                f"`policy='full'` with a host_params_stream<N> placement"
            )
        if stack.scan_unroll != 1:
            raise ConfigError(
                f"layer streaming needs the layer loop (scan_unroll=1), got "
                f"scan_unroll={stack.scan_unroll}"
            )
        if policy is not None and policy.strip() not in ("full", "nothing_saveable"):
            raise OptionError(
                f"`policy={policy!r}` cannot apply to streamed layers: the streamed loop saves "
                f"each block's input and recomputes the block in backward (its parameters are "
                f"fetched again anyway); pass `policy='full'`"
            )
        if params is not None and not any(
            is_stacked(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)
        ):
            raise ConfigError(
                "layer streaming needs scanned layers (parameters stacked under 'blocks'); "
                "this model has none: use host_params (whole-model copy) instead"
            )
    if devices > 1 and batch_size is not None and batch_size % devices:
        raise OptionError(
            f"`batch_size={batch_size}` does not split over `fsdp={devices}` devices; "
            f"use a multiple of {devices}"
        )
    return placement

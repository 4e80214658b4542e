"""Proof of host placement without a GPU: the step exported for ``cuda`` and ``tpu``.

On CPU, XLA drops offload annotations (see JAX-ON-CPU.md), so we export the real train
step for an accelerator platform, which lowers every offloaded residual to a
``stablehlo.custom_call @annotate_device_placement`` with
``_xla_buffer_placement = "pinned_host"`` (and one back to ``"device"`` for backward),
and count those.

Mapping placements to names: several names share a shape (``layer_input``,
``attn_norm``, ``attn_out`` ... are all ``[B, T, D]``), so shapes alone cannot name a
placement. We *probe* each name alone, with JAX's own
``save_and_offload_only_these_names`` (not our translation) on the loss gradient, and
record the placements it produces: one per name that is a residual, none for a name
the backward pass never reads (``mlp_down``: only added to the residual stream). A
policy's placements are correct when their shapes, as a multiset, equal the union of
its offloaded names' probes: every offloaded residual is on host, nothing else is.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from typing import Any

import jax
import jax.numpy as jnp

from ..models import load_model  # pyright: ignore[reportMissingImports]
from ..nn import Stack
from ..policy import JAX_POLICIES, get_policy
from ..step import abstract_state, make_loss_fn, make_train_step
from ._measure import model_config, optimizer

PLATFORMS = ("cuda", "tpu")

_PLACEMENT = re.compile(
    r"annotate_device_placement.*?_xla_buffer_placement\s*=\s*\"(\w+)\".*?->\s*tensor<([^>]*)>"
)


def placements(mlir_text: str) -> list[tuple[str, str]]:
    """``(memory kind, tensor type)`` of every ``annotate_device_placement``."""
    return [
        (m.group(1), m.group(2))
        for line in mlir_text.splitlines()
        if "annotate_device_placement" in line
        for m in [_PLACEMENT.search(line)]
        if m
    ]


def export_text(fn, args, platform: str) -> str:
    """StableHLO of ``jax.jit(fn)`` exported for ``platform`` (works on a CPU host)."""
    return jax.export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()


def host_shapes(mlir_text: str) -> list[str]:
    """Tensor types placed in ``pinned_host``."""
    return [t for kind, t in placements(mlir_text) if kind == "pinned_host"]


@functools.cache
def probe_name(model: str, batch: int, seq: int, name: str, platform: str) -> tuple[str, ...]:
    """Host placements produced by offloading ``name`` alone (JAX's own policy)."""

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=(),
        names_which_can_be_offloaded=(name,),
        offload_src="device",
        offload_dst="pinned_host",
    )
    cfg = dataclasses.replace(load_model(model), stack=Stack(policy=policy))
    graphdef, state = abstract_state(cfg, optimizer())
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    text = export_text(jax.grad(make_loss_fn(graphdef)), (state.params, tok, tok), platform)
    return tuple(host_shapes(text))


def check_export(
    model: str, spec: str, batch: int, seq: int, platforms: tuple[str, ...] = PLATFORMS
) -> dict:
    """Exports the policy's train step per platform and checks its host placements.

    Returns a JSON-able dict: per platform the host/device placement counts, the
    names found on host, the residual-free names, and ``ok``.
    """

    cfg = model_config(model, spec)
    offloaded = () if spec in JAX_POLICIES else get_policy(spec, cfg.residual_names).offloaded()
    graphdef, state = abstract_state(cfg, optimizer())
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    step = make_train_step(graphdef, optimizer())
    result: dict[str, Any] = {"offloaded": list(offloaded)}
    for platform in platforms:
        found = placements(export_text(step, (state, tok, tok), platform))
        host = collections.Counter(t for kind, t in found if kind == "pinned_host")
        probes = {n: probe_name(model, batch, seq, n, platform) for n in offloaded}
        expected = collections.Counter(t for shapes in probes.values() for t in shapes)
        result[platform] = {
            "host_placements": sum(host.values()),
            "device_placements": sum(1 for kind, _ in found if kind == "device"),
            "host_names": [n for n, shapes in probes.items() if shapes],
            "not_residuals": [n for n, shapes in probes.items() if not shapes],
            "ok": host == expected,
            "unexpected": sorted((host - expected).elements()),
            "missing": sorted((expected - host).elements()),
        }
    result["ok"] = all(result[p]["ok"] for p in platforms)
    return result

"""A placement as shardings: memory kinds, on one device or FSDP-sharded over a mesh."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from .._errors import OptionError
from ..nn import BLOCKS
from ._placement import Placement

FSDP_AXIS = "fsdp"
STACKED_KEY = BLOCKS
"""Name of the scanned (stacked) layers in the parameter tree (``jaxoff.nn.BLOCKS``):
their leading axis is the layer axis, never sharded, and the one that streams."""


def make_mesh(devices: int) -> Mesh | None:
    """A 1-D mesh over the first ``devices`` devices (axis ``fsdp``); ``None`` for 1."""
    if devices == 1:
        return None
    available = jax.devices()
    if devices < 1 or devices > len(available):
        raise OptionError(
            f"`fsdp={devices}`: this process sees {len(available)} device(s); choose 1 to "
            f"{len(available)} (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
            f"makes N devices)"
        )
    return jax.make_mesh(
        (devices,),
        (FSDP_AXIS,),
        axis_types=(jax.sharding.AxisType.Auto,),
        devices=available[:devices],
    )


def is_stacked(path) -> bool:
    """Whether a tree path goes through the stacked layers."""
    return any(getattr(k, "key", getattr(k, "name", None)) == STACKED_KEY for k in path)


def fsdp_spec(shape: tuple[int, ...], size: int, stacked: bool) -> PartitionSpec:
    """Shards the largest dimension divisible by ``size`` (never a stacked layer axis)."""
    dims = [d for d in range(1 if stacked else 0, len(shape)) if shape[d] % size == 0]
    if size == 1 or not dims:
        return PartitionSpec()
    best = max(dims, key=lambda d: (shape[d], -d))
    return PartitionSpec(*(FSDP_AXIS if d == best else None for d in range(len(shape))))


def single_device_mesh() -> Mesh:
    """One device as a mesh: a ``NamedSharding`` on it puts its memory kind into the
    traced type (``f32<host>``) even for abstract arguments, which a
    ``SingleDeviceSharding`` does not (jax 0.10.2), so exports see what runs."""
    return Mesh(np.array(jax.devices()[:1]), (FSDP_AXIS,))


def leaf_sharding(path, leaf, memory_kind: str, mesh: Mesh | None):
    if mesh is None:
        return NamedSharding(single_device_mesh(), PartitionSpec(), memory_kind=memory_kind)
    spec = fsdp_spec(tuple(np.shape(leaf)), mesh.size, is_stacked(path))
    return NamedSharding(mesh, spec, memory_kind=memory_kind)


def tree_shardings(tree, memory_kind: str, mesh: Mesh | None):
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: leaf_sharding(path, leaf, memory_kind, mesh), tree
    )


def state_shardings(placement: Placement, state, mesh: Mesh | None = None):
    """Shardings of a ``jaxoff.step.TrainState`` (or its abstract shapes): params and
    optimizer states in their placement's memory kind, FSDP-sharded on ``mesh`` when given
    (fields after the third, a model's rest, are left as they are)."""
    device = placement.memory_kind("device")
    step = leaf_sharding((), state.step, device, None if mesh is None else mesh)  # pyright: ignore[reportArgumentType]
    params = tree_shardings(state.params, placement.memory_kind(placement.params), mesh)
    opt_state = tree_shardings(state.opt_state, placement.memory_kind(placement.opt_state), mesh)
    # the state's own tree (a TrainState, or one with a rest, left as it is here), of shardings
    return type(state)(step, params, opt_state, *tuple(state)[3:])


def from_host(x, sharding) -> jax.Array:
    """A global array from a host array every process holds whole (the same everywhere)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def batch_sharding(mesh: Mesh | None):
    """Token batches: on the device, split on the batch axis over the mesh (data parallel)."""
    if mesh is None:
        return SingleDeviceSharding(jax.devices()[0])
    return NamedSharding(mesh, PartitionSpec(FSDP_AXIS, None))


def replicated(mesh: Mesh | None):
    """Device memory, whole on every device (what a streamed layer is gathered to)."""
    if mesh is None:
        return None
    return NamedSharding(mesh, PartitionSpec(), memory_kind="device")


def bytes_by_kind(state, shardings) -> dict[str, int]:
    """Bytes of ``state`` per memory kind (``device`` / ``pinned_host`` ...), whole arrays."""
    out: dict[str, int] = {}
    for leaf, sh in zip(jax.tree.leaves(state), jax.tree.leaves(shardings), strict=True):
        kind = sh.memory_kind or "device"
        out[kind] = out.get(kind, 0) + int(np.prod(np.shape(leaf))) * np.dtype(leaf.dtype).itemsize
    return out

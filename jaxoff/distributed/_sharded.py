"""FSDP training with a paged optimizer: each process pages the blocks it owns. This module
holds the layout (which block of each global array a process holds, and the copies between
them); the step itself is ``jaxoff.step.ShardedPagedStep``.

Parameters and gradients are global arrays, sharded over a 1-D ``fsdp`` mesh that may span
processes. A process's devices hold one contiguous block of every sharded leaf (the mesh
lists devices process by process), so its page store holds the optimizer state and master
weights of that block only: optax's element-wise update of a block is the update of the
whole leaf restricted to it.

A step's store versions are each process's own; what every process agrees on is the
checkpoint (see ``jaxoff.train``): it counts once every process wrote its part of it.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ..placement import from_host, get_placement, tree_shardings
from ..step import RandomInit, TrainState


def local_box(shape: tuple[int, ...], sharding) -> tuple[slice, ...]:
    """The block of a global array of ``shape`` that this process's devices hold.

    Raises:
      ValueError: their shards do not tile one block.
    """
    indices = list(sharding.addressable_devices_indices_map(shape).values())
    box = []
    for d, n in enumerate(shape):
        spans = [_span(index[d], n) for index in indices]
        box.append(slice(min(s[0] for s in spans), max(s[1] for s in spans)))
    blocks = {tuple(_span(s, n) for s, n in zip(index, shape, strict=True)) for index in indices}
    covered = sum(int(np.prod([b - a for a, b in block])) for block in blocks)
    size = int(np.prod([b.stop - b.start for b in box]))
    if covered != size:
        raise ValueError(
            f"the shards of an array of shape {shape} on this process do not tile one block "
            f"({covered} of {size} elements): jaxoff pages FSDP blocks of a 1-D mesh "
            f"whose devices are listed process by process"
        )
    return tuple(box)


def _span(s: slice, n: int) -> tuple[int, int]:
    start, stop, _ = s.indices(n)
    return start, stop


def _relative(index: tuple[slice, ...], box: tuple[slice, ...], shape) -> tuple[slice, ...]:
    out = []
    for s, b, n in zip(index, box, shape, strict=True):
        start, stop = _span(s, n)
        out.append(slice(start - b.start, stop - b.start))
    return tuple(out)


def to_local(x: jax.Array, box: tuple[slice, ...]) -> np.ndarray:
    """This process's block ``box`` of global array ``x`` (see `local_box`), as one host
    array."""
    shape = tuple(x.shape)
    out = np.empty(tuple(b.stop - b.start for b in box), x.dtype)
    # replicas of a block are copied once (by position: replica ids are global, and a
    # process need not hold replica 0)
    copied = set()
    for shard in x.addressable_shards:
        block = _relative(shard.index, box, shape)
        key = tuple((s.start, s.stop) for s in block)
        if key not in copied:
            copied.add(key)
            out[block] = np.asarray(shard.data)
    return out


def to_global(local, shape: tuple[int, ...], sharding, box: tuple[slice, ...]) -> jax.Array:
    """The global array of ``shape`` whose block ``box`` on this process is ``local``."""
    local = np.asarray(local)
    return jax.make_array_from_callback(
        shape,
        sharding,
        # jax passes each shard's index, a tuple of slices (its stubs say Index | None)
        lambda index: local[_relative(index, box, shape)],  # pyright: ignore[reportArgumentType]
    )


class ShardedParams:
    """Where each parameter leaf lives: its global shape, sharding and this process's block."""

    def __init__(self, params, shardings):
        self.treedef = jax.tree.structure(params)
        leaves = jax.tree.leaves(params)
        self.shapes = [tuple(np.shape(x)) for x in leaves]
        self.shardings = jax.tree.leaves(shardings)
        self.boxes = [local_box(s, sh) for s, sh in zip(self.shapes, self.shardings, strict=True)]

    def to_local(self, tree):
        leaves = jax.tree.leaves(tree)
        return self.treedef.unflatten(
            [to_local(x, b) for x, b in zip(leaves, self.boxes, strict=True)]
        )

    def to_global(self, tree):
        leaves = self.treedef.flatten_up_to(tree)
        return self.treedef.unflatten(
            [
                to_global(x, s, sh, b)
                for x, s, sh, b in zip(leaves, self.shapes, self.shardings, self.boxes, strict=True)
            ]
        )


def init_sharded(
    model_cfg, tx, seed: int, mesh, init_opt: bool = True, placement=None, initializer=None
):
    """``(graphdef, TrainState, shardings)``: the model built from ``seed`` (the same in
    every process), its parameters as global arrays FSDP-sharded on ``mesh``, and ``tx``'s
    state of this process's blocks (``tx.init`` pages them into its store; ``None`` without
    ``init_opt``, for a restore that writes the store from a checkpoint). ``placement``:
    where the parameters live (their memory kind); ``initializer``: where they come from (a
    ``jaxoff.step.Initializer``; default: the random init from ``seed``)."""

    placement = get_placement(placement)

    model = (initializer or RandomInit(seed)).model(model_cfg)
    graphdef, params = nnx.split(model, nnx.Param)
    shardings = tree_shardings(params, placement.memory_kind(placement.params), mesh)
    params = jax.tree.map(from_host, params, shardings)
    layout = ShardedParams(params, shardings)
    rep = NamedSharding(mesh, PartitionSpec())
    step = from_host(np.zeros((), np.int32), rep)
    opt_state = tx.init(layout.to_local(params)) if init_opt else None
    return graphdef, TrainState(step, params, opt_state), shardings

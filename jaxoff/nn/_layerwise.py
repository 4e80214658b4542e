"""A model's parameters with its stacked blocks made one layer at a time: for a model larger
than memory, whose blocks go straight to a page store (Fuyou's ``page_params``)."""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

_recording: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "jaxoff_layerwise", default=None
)


class _LayerMaker:
    """One stack of a model under `layerwise_params`: ``num_layers`` blocks of
    ``make_block``, with the split RNG streams that ``stacked`` would give them. The layer
    last made is kept, so the leaves of one layer share one build."""

    def __init__(self, make_block, num_layers: int, rngs: nnx.Rngs):
        # the same split as stacked's (one draw of each stream, split num_layers ways), so
        # the streams of the rest of the model advance as in a whole build
        @nnx.split_rngs(splits=num_layers)
        def split(r):
            graphdef, state = nnx.split(r)
            # the values, not the variables: split_rngs puts the unsplit keys back in them
            return graphdef, jax.tree.map(lambda x: x, state)

        self._rngs_def, self._rngs = split(rngs)
        self._make = nnx.vmap(make_block, in_axes=(0,), out_axes=0)
        self.num_layers = num_layers
        self.abstract = nnx.eval_shape(self._make, nnx.merge(self._rngs_def, self._rngs))
        self._layer: tuple[int, dict] | None = None

    def layer(self, j: int) -> dict:
        """Layer ``j``'s parameters, ``{path within the block: array}``."""
        if not 0 <= j < self.num_layers:
            raise IndexError(f"layer {j} of a stack of {self.num_layers}")
        if self._layer is None or self._layer[0] != j:
            self._layer = None  # the previous layer is freed before the next is made
            rngs = nnx.merge(self._rngs_def, jax.tree.map(lambda x: x[j : j + 1], self._rngs))
            state = nnx.state(self._make(rngs), nnx.Param)
            flat = jax.tree_util.tree_flatten_with_path(state)[0]
            self._layer = (j, {path: x[0] for path, x in flat})
        return self._layer[1]


class LayerLeaf:
    """A stacked parameter leaf made one layer at a time: ``leaf[j]`` is layer ``j``'s array
    (bitwise the whole build's ``leaf[j]``); the whole leaf never exists. It has the whole
    leaf's ``shape``, ``dtype``, ``ndim`` and ``size``."""

    def __init__(self, maker: _LayerMaker, path: tuple, sds):
        self._maker, self._path = maker, path
        self.shape, self.dtype = tuple(sds.shape), np.dtype(sds.dtype)
        self.ndim, self.size = len(self.shape), math.prod(self.shape)

    def __getitem__(self, j: int) -> jax.Array:
        return self._maker.layer(int(j))[self._path]

    def __array__(self, *args, **kwargs):
        raise TypeError(
            f"a layerwise parameter leaf of shape {self.shape} is made one layer at a time: "
            "index it (leaf[j]); it cannot be made whole"
        )

    def __repr__(self) -> str:
        return f"LayerLeaf(shape={self.shape}, dtype={self.dtype})"


def recording() -> list | None:
    """The stacks `layerwise_params` is collecting (``stacked`` adds to it), or None."""
    return _recording.get()


def lazy_stack(make_block, num_layers: int, rngs: nnx.Rngs) -> nnx.Module:
    """``stacked`` under `layerwise_params`: the stack's abstract module, its layers made
    later on demand."""
    maker = _LayerMaker(make_block, num_layers, rngs)
    recorded = _recording.get()
    if recorded is None:
        raise RuntimeError("lazy_stack runs only inside layerwise_params (stacked calls it)")
    recorded.append(maker)
    return maker.abstract


def layerwise_params(build: Callable[[], nnx.Module]):
    """``(graphdef, params)`` of the model ``build()`` makes, each stacked block leaf a
    `LayerLeaf` made one layer at a time when indexed.

    The rest of the model (embeddings, head, norms) is built as ``build()`` builds it; the
    blocks of each :func:`jaxoff.nn.stacked` are not built, only their RNG streams split as
    ``stacked`` splits them. So ``params`` equals ``nnx.split(build(), nnx.Param)[1]``
    bitwise, leaf by leaf and layer by layer, while at most one layer of blocks exists at a
    time: a model larger than memory can be written to a page store layer by layer
    (``jaxoff.strategies.fuyou.fuyou_init(..., page_params=True)``).

    Example:
        >>> from flax import nnx
        >>> from jaxoff.nn import layerwise_params
        >>> from jaxoff.models.gpt import CONFIGS
        >>> cfg = CONFIGS["tiny"]
        >>> graphdef, params = layerwise_params(lambda: cfg.build(nnx.Rngs(0)))
        >>> params["blocks"]["mlp"]["up"]["kernel"][1].shape
        (128, 512)
    """
    stacks: list[_LayerMaker] = []
    token = _recording.set(stacks)
    try:
        model = build()
    finally:
        _recording.reset(token)
    graphdef, params = nnx.split(model, nnx.Param)
    homes = {id(m.abstract): m for m in stacks}
    where = {}  # path prefix of each stack in the model
    for path, node in nnx.iter_graph(model):
        if id(node) in homes:
            where[tuple(path)] = homes[id(node)]

    def leaf(path, x):
        keys = tuple(_key(k) for k in path)
        for prefix, maker in where.items():
            if keys[: len(prefix)] == prefix:
                # the leaf's path in the block's own state
                return LayerLeaf(maker, tuple(path[len(prefix) :]), x)
        return x

    return graphdef, jax.tree_util.tree_map_with_path(leaf, params)


def _key(k):
    """A tree path key as `nnx.iter_graph` spells it."""
    return getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))

"""Fuyou's step as the trainer runs it (``jaxoff train --strategy fuyou``): a
:class:`jaxoff.step.Step` over ``jaxoff.strategies.fuyou``'s public functions.

The optimizer state lives in the page store (and with ``page_params`` the stacked block
parameters too); a checkpoint's paged part is the store's committed version (``fuyou_save``,
from which ``fuyou_restore`` rebuilds the whole ``FuyouState``), and its orbax part holds the
step and the parameters the state keeps: without the empty placeholders of paged blocks, and
without blocks held as bits, which the store's fp32 masters make again (``fuyou_master_bits``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jaxoff._xla import is_half_float
from jaxoff.aio import PageStoreCorruptError
from jaxoff.optim import paged_checkpoint_extra
from jaxoff.optim.chunks import as_bits
from jaxoff.placement import abstract_with, get_placement, state_shardings
from jaxoff.step import RandomInit, TrainState, cross_entropy, loss_of_params

from ._bits import _block_fn, _layer, blocks_to_bits, put_bits
from ._checkpoint import (
    fuyou_init,
    fuyou_master_bits,
    fuyou_resident,
    fuyou_restore,
    fuyou_save,
)
from ._layout import _is_block_path, fuyou_table
from ._loss import make_fuyou_loss
from ._step import make_fuyou_step

MASTERS = "masters"
"""A checkpoint's paged part records ``{"blocks": MASTERS}`` when its orbax part holds no
block parameters: they are the 16-bit casts of the fp32 masters in the paged part."""


class FuyouStep:
    """Fuyou's step (``make_fuyou_step``: each layer's paged update inside the backward layer
    scan) as a :class:`jaxoff.step.Step`, on one device.

    ``tx``: the paged optimizer (``jaxoff.paged``); ``page_params``: the stacked block
    parameters live in the store too (ZeRO-Infinity's parameter offload); ``read_ahead_bytes``:
    optimizer state read ahead of each layer's update (None: Fuyou's default);
    ``initializer``: where a new state's parameters come from (a
    :class:`jaxoff.step.Initializer`, e.g. a pretrained checkpoint read layer by layer;
    default: the random init from ``seed``).

    ``blocks_as_bits`` (set from the model, see `bits_apply`): the state holds the stacked
    block leaves as their bits and the step updates them in place.
    """

    def __init__(
        self,
        model_cfg,
        tx,
        *,
        placement=None,
        seed: int = 0,
        page_params: bool = False,
        read_ahead_bytes: int | None = None,
        initializer=None,
    ):

        self.model_cfg, self.tx, self.seed = model_cfg, tx, seed
        self.initializer = initializer or RandomInit(seed)
        self.placement = get_placement(placement)
        self.page_params, self.read_ahead_bytes = page_params, read_ahead_bytes
        self.blocks_as_bits = bits_apply(model_cfg, page_params)
        self.graphdef: Any = None  # set by init() or restore()
        self._step: Any = None  # set by compile()
        self._loss = None

    def init(self) -> TrainState:
        """A new state: the optimizer state (and with ``page_params`` the block parameters)
        written to the store."""

        with contextlib.ExitStack() as stack:
            if self.page_params or self.blocks_as_bits:
                # the blocks made (or read) one layer at a time, straight into the store (or
                # into their bits): a model larger than memory is never whole in it
                made = stack.enter_context(self.initializer.layerwise(self.model_cfg))
                self.graphdef, params = made
            else:
                model = self.initializer.model(self.model_cfg)
                self.graphdef, params = nnx.split(model, nnx.Param)
            if self.blocks_as_bits:
                params = _map_blocks(params, _IntoBits)  # filled as fuyou_init reads the layers
            opt = fuyou_init(
                self.model_cfg,
                self.tx,
                params,
                page_params=self.page_params,
                read_ahead_bytes=self.read_ahead_bytes,
            )
        if self.page_params:
            params = fuyou_resident(params)  # the blocks now live in the store only
        if self.blocks_as_bits:
            params = _map_blocks(params, _IntoBits.bits)
        return TrainState(jnp.zeros((), jnp.int32), params, opt)

    def restore(self, reader, step: int, fall_back):
        """Checkpoint ``step``: its store part into the store, then its parameters from
        orbax, and blocks saved as their masters (`save`) made again from the store."""

        model = nnx.eval_shape(lambda: self.model_cfg.build(nnx.Rngs(0)))
        self.graphdef, params = nnx.split(model, nnx.Param)
        while True:
            paged = reader.paged_dir(step)
            try:
                opt = fuyou_restore(
                    self.model_cfg,
                    self.tx,
                    paged,
                    page_params=self.page_params,
                    read_ahead_bytes=self.read_ahead_bytes,
                )
            except PageStoreCorruptError as e:
                step = fall_back(step, e, [0])
                continue
            from_masters = paged_checkpoint_extra(paged).get("blocks") == MASTERS
            held = params
            if self.page_params or from_masters:  # no blocks in the orbax part
                held = jax.eval_shape(fuyou_resident, params)
            abstract = TrainState(jax.ShapeDtypeStruct((), jnp.int32), held, None)  # pyright: ignore[reportArgumentType] (an abstract state)
            abstract = abstract_with(abstract, state_shardings(self.placement, abstract))
            state = self._restore_tree(reader, step, abstract)
            if from_masters:  # the blocks: their masters' casts, as bits
                state = state._replace(params=fuyou_master_bits(self.tx, state.params))
            elif self.blocks_as_bits:  # saved as floats: their bits, in place
                state = state._replace(params=blocks_to_bits(state.params))
            return step, state._replace(opt_state=opt)

    def _restore_tree(self, reader, step: int, abstract: TrainState) -> TrainState:
        if not any(np.prod(x.shape) == 0 for x in jax.tree.leaves(abstract.params)):
            return reader.restore(step, abstract)
        # paged block parameters: their empty placeholders are not in the checkpoint
        params = abstract.params
        state = reader.restore(step, abstract._replace(params=_nonempty(params)))
        return state._replace(params=_with_empty(params, state.params))

    def save(self, writer, step: int, state: TrainState) -> None:
        """The store's committed version (the paged part), then the step and the resident
        parameters (orbax). Blocks held as bits are the 16-bit casts of the fp32 masters the
        paged part holds: they are not saved again (`restore` makes them from the store),
        so a checkpoint costs neither their RAM (orbax copies what it writes) nor their
        disk."""

        fuyou_save(
            self.tx,
            state.opt_state,
            writer.paged_part(step),
            in_store=writer.paged_in_store,
            extra={"blocks": MASTERS} if self.blocks_as_bits else None,
        )
        state = state._replace(opt_state=None)  # the store's: in the paged part
        if self.blocks_as_bits:
            state = state._replace(params=fuyou_resident(state.params))
        if self.page_params or self.blocks_as_bits:
            state = state._replace(params=_nonempty(state.params))
        writer.save_tree(step, state)

    def step_fn(self):
        """The step function, not jitted: ``make_fuyou_step`` in this step's form (paged
        parameters, bits form), the one `compile` compiles and `jaxoff compare` runs."""
        return make_fuyou_step(
            self.graphdef,
            self.model_cfg,
            self.tx,
            page_params=self.page_params,
            blocks_as_bits=self.blocks_as_bits,
        )

    def compile(self, state: TrainState, inputs, targets) -> TrainState:
        """Compiles `step_fn` (the state donated)."""
        step = jax.jit(self.step_fn(), donate_argnums=0)
        self._step = step.lower(state, inputs, targets).compile()
        return state

    def __call__(self, state: TrainState, inputs, targets):
        return self._step(state, inputs, targets)

    def evaluate(self, state: TrainState, inputs, targets):
        """The loss, with ``page_params`` the block parameters read from the store as the
        step reads them (``make_fuyou_loss``), else of ``state.params``."""
        if self._loss is None:
            self._loss = self._make_loss()
        return self._loss(state, inputs, targets)

    def _make_loss(self):
        if not self.page_params:
            if self.blocks_as_bits:
                loss = jax.jit(_bits_loss(self.graphdef, self.param_dtype))
            else:
                loss = loss_of_params(self.graphdef, self.placement)
            return lambda state, x, y: loss(state.params, x, y)

        loss = jax.jit(make_fuyou_loss(self.graphdef, self.model_cfg, self.tx))
        return lambda state, x, y: loss(state.params, state.opt_state, x, y)

    @property
    def param_dtype(self) -> np.dtype:
        return np.dtype(jnp.dtype(self.model_cfg.param_dtype))

    def io_table(self) -> str | None:

        return fuyou_table(self.tx)

    def phase_times(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self.tx.close()


def _nonempty(params) -> dict:
    """``params`` as ``{path: leaf}`` without its empty leaves (the placeholders of block
    parameters paged by Fuyou's step): orbax refuses to save zero-size arrays."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(p): x for p, x in flat if np.prod(x.shape) != 0}


def _with_empty(like, restored: dict):
    """The inverse of `_nonempty`: ``like``'s tree with its leaves from ``restored`` and
    empty arrays where ``like`` has empty ones."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(like)
    return jax.tree.unflatten(
        treedef,
        [
            restored[jax.tree_util.keystr(p)]
            if np.prod(x.shape) != 0
            else jnp.zeros(x.shape, x.dtype)
            for p, x in flat
        ],
    )


def bits_apply(model_cfg, page_params: bool) -> bool:
    """Whether Fuyou's step runs over the blocks' bits (``blocks_as_bits``): the block
    parameters are in RAM (not ``page_params``) and every float leaf of the blocks is the
    model's 16-bit ``param_dtype``. float32 blocks are sliced and updated in place as they
    are (their bits would gain nothing)."""

    param_dtype = getattr(model_cfg, "param_dtype", None)
    if page_params or param_dtype is None or not is_half_float(param_dtype):
        return False
    model = nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0)))
    flat = jax.tree_util.tree_flatten_with_path(nnx.split(model, nnx.Param)[1])[0]
    dtype = jnp.dtype(param_dtype)
    blocks = [x.dtype for p, x in flat if _is_block_path(p)]
    return bool(blocks) and all(d == dtype for d in blocks if jnp.issubdtype(d, jnp.floating))


def _map_blocks(params, fn):
    """``params`` with ``fn`` applied to each stacked block leaf."""

    return jax.tree_util.tree_map_with_path(
        lambda p, x: fn(x) if _is_block_path(p) else x,
        params,
        is_leaf=lambda x: isinstance(x, _IntoBits),
    )


class _IntoBits:
    """A stacked block leaf made one layer at a time (``jaxoff.nn.layerwise_params``) whose
    layers, as ``fuyou_init`` reads them, are also written into a stack of their bits, in
    place (`bits`): the blocks never exist as floats whole."""

    def __init__(self, leaf):
        self._leaf = leaf
        self.shape, self.dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
        self.ndim, self.size = len(self.shape), math.prod(self.shape)
        self._stack = jnp.zeros(self.shape, as_bits(jnp.zeros((), self.dtype)).dtype)
        self._written: set[int] = set()

    def __getitem__(self, j: int) -> jax.Array:
        x = self._leaf[j]
        self._stack = put_bits(self._stack, x, j)
        self._written.add(j)
        return x

    def bits(self) -> jax.Array:
        """The stack of the layers' bits (every layer read once)."""
        assert self._written == set(range(self.shape[0])), "fuyou_init reads every layer"
        return self._stack


def _bits_loss(graphdef, dtype):
    """``loss(params, inputs, targets)`` of a state whose blocks are their bits: the forward
    pass of Fuyou's step, each layer sliced out of the bits as floats (`_layer`), so that
    evaluation makes no float copy of the blocks."""

    def loss(params, inputs, targets):
        model = nnx.merge(graphdef, params)  # the blocks as bits: read through `_layer` only
        block = _block_fn(model.blocks)
        stacked = jax.tree.leaves(nnx.split(model.blocks)[1])
        dtypes = [dtype if jnp.issubdtype(x.dtype, jnp.unsignedinteger) else x.dtype
                  for x in stacked]  # fmt: skip

        def body(h, j):
            return block(_layer(stacked, j, dtypes), h), None

        h = model.embed_tokens(inputs)
        h, _ = lax.scan(body, h, jnp.arange(stacked[0].shape[0]))
        return cross_entropy(model.logits(h), targets)

    return loss

"""Fuyou's step as the trainer runs it (``jaxoff train --strategy fuyou``): a
:class:`jaxoff.step.Step` over ``jaxoff.strategies.fuyou``'s public functions.

The optimizer state lives in the page store (and with ``page_params`` the stacked block
parameters too); a checkpoint's paged part is the store's committed version (``fuyou_save``,
from which ``fuyou_restore`` rebuilds the whole ``FuyouState``), and its orbax part holds the
step and the parameters the state keeps (without the empty placeholders of paged blocks).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..step import TrainState


class FuyouStep:
    """Fuyou's step (``make_fuyou_step``: each layer's paged update inside the backward layer
    scan) as a :class:`jaxoff.step.Step`, on one device.

    ``tx``: the paged optimizer (``jaxoff.paged``); ``page_params``: the stacked block
    parameters live in the store too (ZeRO-Infinity's parameter offload); ``read_ahead_bytes``:
    optimizer state read ahead of each layer's update (None: Fuyou's default).
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
    ):
        from ..placement import get_placement

        self.model_cfg, self.tx, self.seed = model_cfg, tx, seed
        self.placement = get_placement(placement)
        self.page_params, self.read_ahead_bytes = page_params, read_ahead_bytes
        self.graphdef: Any = None  # set by init() or restore()
        self._step: Any = None  # set by compile()
        self._loss = None

    def init(self) -> TrainState:
        """A new state: the optimizer state (and with ``page_params`` the block parameters)
        written to the store."""
        from flax import nnx

        from ..nn import layerwise_params
        from .fuyou import fuyou_init, fuyou_resident

        def build():
            return self.model_cfg.build(nnx.Rngs(self.seed))

        if self.page_params:
            # the blocks made one layer at a time, straight into the store: a model larger
            # than memory is never whole in it
            self.graphdef, params = layerwise_params(build)
        else:
            self.graphdef, params = nnx.split(build(), nnx.Param)
        opt = fuyou_init(
            self.model_cfg,
            self.tx,
            params,
            page_params=self.page_params,
            read_ahead_bytes=self.read_ahead_bytes,
        )
        if self.page_params:
            params = fuyou_resident(params)  # the blocks now live in the store only
        return TrainState(jnp.zeros((), jnp.int32), params, opt)

    def restore(self, reader, step: int, fall_back):
        """Checkpoint ``step``: its parameters from orbax, its store part into the store."""
        from flax import nnx

        from ..aio import PageStoreCorruptError
        from ..placement import abstract_with, state_shardings
        from .fuyou import fuyou_resident, fuyou_restore

        model = nnx.eval_shape(lambda: self.model_cfg.build(nnx.Rngs(0)))
        self.graphdef, params = nnx.split(model, nnx.Param)
        if self.page_params:
            params = jax.eval_shape(fuyou_resident, params)
        abstract = TrainState(jax.ShapeDtypeStruct((), jnp.int32), params, None)  # pyright: ignore[reportArgumentType] (an abstract state)
        abstract = abstract_with(abstract, state_shardings(self.placement, abstract))
        while True:
            state = self._restore_tree(reader, step, abstract)
            try:
                opt = fuyou_restore(
                    self.model_cfg,
                    self.tx,
                    reader.paged_dir(step),
                    page_params=self.page_params,
                    read_ahead_bytes=self.read_ahead_bytes,
                )
                return step, state._replace(opt_state=opt)
            except PageStoreCorruptError as e:
                step = fall_back(step, e, [0])

    def _restore_tree(self, reader, step: int, abstract: TrainState) -> TrainState:
        if not self.page_params:
            return reader.restore(step, abstract)
        # paged block parameters: their empty placeholders are not in the checkpoint
        params = abstract.params
        state = reader.restore(step, abstract._replace(params=_nonempty(params)))
        return state._replace(params=_with_empty(params, state.params))

    def save(self, writer, step: int, state: TrainState) -> None:
        """The store's committed version (the paged part), then the step and the resident
        parameters (orbax)."""
        from .fuyou import fuyou_save

        fuyou_save(self.tx, state.opt_state, writer.paged_part(step))
        state = state._replace(opt_state=None)  # the store's: in the paged part
        if self.page_params:
            state = state._replace(params=_nonempty(state.params))
        writer.save_tree(step, state)

    def compile(self, state: TrainState, inputs, targets) -> TrainState:
        """Compiles ``make_fuyou_step`` (the state donated)."""
        from .fuyou import make_fuyou_step

        step = make_fuyou_step(self.graphdef, self.model_cfg, self.tx, page_params=self.page_params)
        self._step = jax.jit(step, donate_argnums=0).lower(state, inputs, targets).compile()
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
            from ..step._plain import loss_of_params

            loss = loss_of_params(self.graphdef, self.placement)
            return lambda state, x, y: loss(state.params, x, y)
        from .fuyou import make_fuyou_loss

        loss = jax.jit(make_fuyou_loss(self.graphdef, self.model_cfg, self.tx))
        return lambda state, x, y: loss(state.params, state.opt_state, x, y)

    def io_table(self) -> str | None:
        from .fuyou import fuyou_table

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

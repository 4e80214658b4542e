"""Paged optimizer states in orbax checkpoints: `PagedSave` / `PagedRestore`.

A paged state is mostly on disk: the `PagedState` in RAM only names a version of the page
store. Saving the tree with ``ocp.args.StandardSave`` alone keeps that name and loses the
contents (the store moves on at the next step). `PagedSave` saves the tree as
``StandardSave`` does and streams the store's committed version into the same checkpoint,
chunk by chunk; `PagedRestore` restores the tree as ``StandardRestore`` does and writes the
pages back into the transformation's store (any directory) so that the restored state reads
them. Both are ordinary ``CheckpointArgs`` registered with `PagedCheckpointHandler`, so a
``CheckpointManager`` takes them alone or inside ``ocp.args.Composite``.

>>> import tempfile, jax.numpy as jnp, optax, orbax.checkpoint as ocp
>>> from jaxoff.optim import PagedRestore, PagedSave, paged
>>> tmp = tempfile.mkdtemp()
>>> tx = paged(optax.adam(1e-3), tmp + "/store", chunk_bytes=4096)
>>> params = {"w": jnp.ones((3, 5))}
>>> opt_state = tx.init(params)
>>> updates, opt_state = tx.update(params, opt_state, params)
>>> mngr = ocp.CheckpointManager(tmp + "/checkpoints")
>>> mngr.save(1, args=PagedSave(tx, {"params": params, "opt_state": opt_state}))
True
>>> mngr.wait_until_finished()
>>> abstract_tree = {"params": params, "opt_state": opt_state}  # or its shapes
>>> restored = mngr.restore(1, args=PagedRestore(tx, abstract_tree))
>>> int(restored["opt_state"].inner_state[0].count)
1
>>> mngr.close(); tx.close()
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from jaxoff.aio import PageStoreError
from jaxoff.optim._checkpoint import copy_in, copy_out
from jaxoff.optim._checks import chain_members
from jaxoff.optim._paged import PagedTransformation, Pager, canonical
from jaxoff.optim._state import PagedState

STATE_DIR = "state"  # the tree, as StandardSave writes it
PAGES_DIR = "pages"  # the store's committed version, as save_paged writes it


def find_pager(tx: Any) -> Pager:
    """The `Pager` of ``tx``: a `paged` transformation, a chain holding one, or an object with
    a ``tx`` attribute holding one (``nnx.Optimizer``, ``flax.training.train_state.TrainState``).
    """
    if isinstance(tx, PagedTransformation):
        return tx.pager
    for m in chain_members(tx) or ():
        owner = getattr(m.update, "__self__", None)
        if isinstance(owner, Pager):
            return owner
    inner = getattr(tx, "tx", None)
    if inner is not None and inner is not tx:
        return find_pager(inner)
    raise TypeError(
        f"expected a transformation made by jaxoff.paged (or a chain or optimizer "
        f"holding one), got {type(tx).__name__}"
    )


@dataclasses.dataclass
class PagedSave(ocp.args.CheckpointArgs):
    """Saves ``item`` (any tree holding the state of ``tx``) and ``tx``'s page store.

    Attributes:
      tx: the `jaxoff.paged` transformation (or a chain, ``nnx.Optimizer`` or ``TrainState``
        holding it).
      item: the tree to save, as for ``ocp.args.StandardSave``: e.g. ``{"params": ...,
        "opt_state": ...}``, a ``TrainState``, ``nnx.state(optimizer)``. Its optimizer state
        must be the one returned by the last step (the store holds only that version).
    """

    tx: Any
    item: Any


@dataclasses.dataclass
class PagedRestore(ocp.args.CheckpointArgs):
    """Restores what `PagedSave` saved: the tree, and the pages into ``tx``'s store.

    Attributes:
      tx: the `jaxoff.paged` transformation to restore into (its store may be another
        directory than the saved one's; it becomes a new committed version there).
      item: the abstract tree, as for ``ocp.args.StandardRestore`` (e.g.
        ``jax.eval_shape(lambda: {"params": params, "opt_state": tx.init(params)})``), or None.
      params: the parameters or their shapes, to plan the store; may be left out once
        ``tx.init`` (or ``jax.eval_shape(tx.init, ...)``) has seen them.
    """

    tx: Any
    item: Any = None
    params: Any = None


def _plan(pager: Pager, params):
    if params is not None:
        return pager.plan(canonical(params))
    plans = list(pager._plans.values())
    if len(plans) != 1:
        raise ValueError(
            "PagedRestore: pass params= (the parameters or their shapes): the "
            "paged transformation has not yet planned a store for one parameter "
            "tree (call jax.eval_shape(tx.init, params) or pass params)"
        )
    return plans[0]


def _paged_states(tree) -> list[PagedState]:
    is_state = lambda x: isinstance(x, PagedState)  # noqa: E731
    return [x for x in jax.tree.leaves(tree, is_leaf=is_state) if is_state(x)]


class PagedCheckpointHandler(ocp.CheckpointHandler):
    """Saves a tree with ``StandardCheckpointHandler`` and a page store with `copy_out`."""

    def save(self, directory: epath.Path, args: PagedSave) -> None:
        pager = find_pager(args.tx)
        txn = pager.txn
        if txn is None or txn.closed:
            raise PageStoreError(
                "PagedSave: the paged optimizer's store is not open; call "
                "tx.init(params) (or restore) first"
            )
        jax.block_until_ready(args.item)
        txn.settle()  # the step that made the state has committed
        store = txn.store
        for st in _paged_states(args.item):
            try:
                txn.check_version(jax.device_get(st.version))
            except PageStoreError as e:
                raise PageStoreError(
                    f"PagedSave: {e}; save the state returned by the last step"
                ) from None
        directory = epath.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        handler = ocp.StandardCheckpointHandler()
        handler.save(directory / STATE_DIR, args=ocp.args.StandardSave(args.item))
        handler.finalize(directory / STATE_DIR)
        copy_out(store, directory / PAGES_DIR)

    def restore(self, directory: epath.Path, args: PagedRestore) -> Any:
        directory = epath.Path(directory)
        pages = directory / PAGES_DIR
        if not (pages / "paged.json").exists():
            raise PageStoreError(
                f"PagedRestore: {directory} holds no page store contents; "
                "was it saved with jaxoff.optim.PagedSave?"
            )
        tree = ocp.StandardCheckpointHandler().restore(
            directory / STATE_DIR, args=ocp.args.StandardRestore(args.item)
        )
        pager = find_pager(args.tx)
        plan = _plan(pager, args.params)
        txn = pager.transaction(plan, discard_torn=True)  # every chunk is rewritten
        copy_in(txn, plan, pages)  # under its own version: the restored state describes it
        return tree

    def metadata(self, directory: epath.Path) -> Any:
        return ocp.StandardCheckpointHandler().metadata(epath.Path(directory) / STATE_DIR)


ocp.args.register_with_handler(PagedCheckpointHandler, for_save=True)(PagedSave)
ocp.args.register_with_handler(PagedCheckpointHandler, for_restore=True)(PagedRestore)

"""FSDP training with a paged optimizer as a :class:`jaxoff.step.Step`: each process pages the
blocks it owns (see `_sharded` for the layout).

Parameters and gradients are global arrays, sharded over a 1-D ``fsdp`` mesh that may span
processes; a process's page store holds the optimizer state and master weights of its blocks
only. One step is:

1. gradients of the global batch (one jitted SPMD program over the mesh; collectives cross
   processes), then the global ops of the chain (``clip_by_global_norm``) on the global
   gradients, and their norm;
2. per process, its blocks of the gradients and parameters (a host copy of its shards), the
   paged update of those blocks from its own store (``jaxoff.paged``'s pipeline, on one local
   device), and its new parameter blocks put back as shards of the global parameters.

A checkpoint holds the step and the global parameters (orbax, every process together) and each
process's paged part; it counts once every process wrote its part (the trainer's checksums).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..aio import PageStoreCorruptError
from ..nn import check_model
from ..optim import restore_paged, save_paged, update_and_apply
from ..placement import batch_sharding, fetch_params, global_norm, move
from ..step import OptaxStepBase, TrainState, accumulate, grad_fn_of, make_loss_fn
from ._runtime import allgather_ints
from ._sharded import ShardedParams, init_sharded


class ShardedPagedStep(OptaxStepBase):
    """``step(state, inputs, targets) -> (state, metrics)`` for FSDP with a paged optimizer.

    ``state.params`` are global arrays with the shardings of ``placement`` on ``mesh``;
    ``state.opt_state`` is this process's `jaxoff.paged` state (of its blocks, in its own
    store); ``inputs``/``targets`` are global token arrays. ``pre``: the chain's global ops
    (``clip_by_global_norm``), run on the global gradients; ``tx``: the paged element-wise
    rest. The model is built from ``seed``, the same in every process. ``grad_accum``:
    micro-batches per step, their gradients accumulated inside the gradient program
    (`jaxoff.step._accum.accumulate`), so the paged update still runs once per step.
    """

    def __init__(
        self,
        model_cfg,
        pre,
        tx,
        mesh,
        placement=None,
        seed: int = 0,
        initializer=None,
        grad_accum: int = 1,
    ):

        check_model(model_cfg, needs=["sharded"])  # nnx.Param state only: one line if not
        self.model_cfg, self.pre, self.tx, self.mesh = model_cfg, pre, tx, mesh
        self.placement, self.seed = placement, seed
        self.grad_accum = grad_accum
        self.initializer = initializer  # a new state's parameters (None: random from seed)
        self.graphdef: Any = None  # set by init() or restore()
        self.layout = None  # a jaxoff.distributed.ShardedParams, at the first step
        self.split: dict[str, float] = {}
        self._loss = None

    def _start(self, init_opt: bool) -> TrainState:
        """The model built from the seed, its parameters sharded (and ``tx``'s state of this
        process's blocks with ``init_opt``); builds the two programs of a step."""

        self.graphdef, state, shardings = init_sharded(
            self.model_cfg,
            self.tx,
            self.seed,
            self.mesh,
            init_opt=init_opt,
            placement=self.placement,
            # a restore overwrites the parameters: the random init is enough there
            initializer=self.initializer if init_opt else None,
        )
        self._build(shardings)
        return state

    def _build(self, shardings) -> None:

        # host parameters are fetched (or streamed layer by layer) as in the one-device step
        loss_fn = make_loss_fn(self.graphdef, fetch_params(self.placement))
        pre = self.pre
        self._shardings = shardings
        rep = NamedSharding(self.mesh, PartitionSpec())
        tokens = batch_sharding(self.mesh)
        grad_shardings = jax.tree.map(lambda sh: sh.with_memory_kind("device"), shardings)

        n, mesh = self.grad_accum, self.mesh
        grad_fn = grad_fn_of(loss_fn, with_rest=False)

        def grads(step, params, inputs, targets):
            if n == 1:
                loss, g = jax.value_and_grad(loss_fn)(params, inputs, targets)
            else:
                loss, g, _ = accumulate(grad_fn, n, params, None, inputs, targets, mesh)
            g = move(g, "device")  # streamed layers' gradients come back in host memory
            norm = global_norm(g)
            if pre is not None:
                g, _ = pre.update(g, pre.init(move(params, "device")), params)
            return step + 1, loss, g, norm

        self._grads: Any = jax.jit(
            grads,
            in_shardings=(rep, shardings, tokens, tokens),
            out_shardings=(rep, rep, grad_shardings, rep),
        )
        self._update = jax.jit(functools.partial(update_and_apply, self.tx), donate_argnums=(1, 2))
        self._device = jax.local_devices()[0]

    def init(self) -> TrainState:
        return self._start(init_opt=True)

    def restore(self, reader, step: int, fall_back):
        """Checkpoint ``step``: its parameters from orbax (every process together), this
        process's paged part into its store. When any process finds its part damaged, every
        process falls back together."""

        state = self._start(init_opt=False)
        while True:
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                state._replace(opt_state=None),
            )
            restored = reader.restore(step, abstract)  # every process: orbax restores together
            local = ShardedParams(restored.params, self._shardings).to_local(restored.params)
            error = None
            try:
                opt_state = restore_paged(self.tx, reader.paged_dir(step), local)
            except PageStoreCorruptError as e:
                error = e
            damaged = _damaged_processes(error is not None)
            if not damaged:
                return step, restored._replace(opt_state=opt_state)
            step = fall_back(step, error, damaged)

    def save(self, writer, step: int, state: TrainState) -> None:
        """This process's paged part, then orbax's (the step and the global parameters: the
        optimizer state is each process's own)."""

        save_paged(
            self.tx, state.opt_state, writer.paged_part(step), in_store=writer.paged_in_store
        )
        writer.save_tree(step, state._replace(opt_state=None))

    def compile(self, state: TrainState, inputs, targets) -> TrainState:
        """Compiles the gradient program (the local update compiles at its first call)."""
        self._grads = self._grads.lower(state.step, state.params, inputs, targets).compile()
        return state

    def __call__(self, state: TrainState, inputs, targets):
        """One step; `phase_times` then gives its phases' wall times in seconds: the
        gradient program (``grads_s``, collectives included), copying this process's blocks
        out (``blocks_out_s``), the paged update (``local_update_s``, its disk I/O included)
        and the new blocks back into global arrays (``blocks_in_s``)."""
        if self.layout is None:
            self.layout = ShardedParams(state.params, self._shardings)
        t0 = time.perf_counter()
        step, loss, grads, norm = self._grads(state.step, state.params, inputs, targets)
        jax.block_until_ready(grads)
        t1 = time.perf_counter()
        local_g = jax.device_put(self.layout.to_local(grads), self._device)
        local_p = jax.device_put(self.layout.to_local(state.params), self._device)
        del grads
        t2 = time.perf_counter()
        new_p, opt_state = self._update(local_g, state.opt_state, local_p)
        jax.block_until_ready((new_p, opt_state))
        t3 = time.perf_counter()
        params = self.layout.to_global(new_p)
        t4 = time.perf_counter()
        self.split = {
            "grads_s": t1 - t0,
            "blocks_out_s": t2 - t1,
            "local_update_s": t3 - t2,
            "blocks_in_s": t4 - t3,
        }
        return TrainState(step, params, opt_state), {"loss": loss, "grad_norm": norm}

    def phase_times(self) -> dict[str, float]:
        return self.split


def _damaged_processes(mine: bool) -> list[int]:
    """The processes whose paged part of the checkpoint being restored is damaged."""

    flags = allgather_ints([int(mine)])[:, 0]
    return [p for p, bad in enumerate(flags) if bad]

"""Building a training step: loss, gradients, optimizer update; its state; compiling and exporting
it; and `PlainStep`, that step as the trainer runs it (a `jaxoff.step.Step`). Above placement
(which the step composes) and below the planner, ``compare`` and the trainer, which all build
steps from here. Offload lives elsewhere (``jaxoff.placement``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ._state import TrainState


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make_loss_fn(graphdef: nnx.GraphDef, fetch=None):
    """``loss(params, inputs, targets)`` of the model described by ``graphdef``.

    ``fetch`` (see ``jaxoff.placement.fetch_params``) brings host parameters to the device.
    """

    def loss_fn(params, inputs, targets):
        params = params if fetch is None else fetch(params)
        return cross_entropy(nnx.merge(graphdef, params)(inputs), targets)

    return loss_fn


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, placement=None):
    """Returns ``train_step(state, inputs, targets) -> (state, metrics)``, not yet jitted.

    The caller jits it with ``donate_argnums=0`` so parameters and optimizer state are
    updated in place. ``placement`` (a ``jaxoff.placement.Placement`` or its name) says
    where the state lives; the caller also gives the jit its ``state_shardings``.
    """
    from ..placement import fetch_params, make_update

    loss_fn = make_loss_fn(graphdef, fetch_params(placement))
    update = make_update(tx, placement)

    def train_step(state: TrainState, inputs: jax.Array, targets: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, inputs, targets)
        params, opt_state, grad_norm = update(grads, state.opt_state, state.params)
        metrics = {"loss": loss, "grad_norm": grad_norm}
        return TrainState(state.step + 1, params, opt_state), metrics

    return train_step


def init_state(model_cfg, tx: optax.GradientTransformation, seed: int):
    """Builds the model and its optimizer state; returns ``(graphdef, TrainState)``."""
    model = model_cfg.build(nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    return graphdef, state


def abstract_state(model_cfg, tx: optax.GradientTransformation):
    """Shapes and dtypes of the TrainState, without allocating it."""

    def build():
        model = model_cfg.build(nnx.Rngs(0))
        graphdef, params = nnx.split(model, nnx.Param)
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

    graphdef = nnx.graphdef(nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0))))
    return graphdef, jax.eval_shape(build)


class _OptaxStep:
    """What the plain and the sharded step share: the loss of ``state.params`` for
    validation, the paged optimizer's file table and its close."""

    tx: Any
    graphdef: Any
    placement: Any
    _loss: Any

    def evaluate(self, state: TrainState, inputs, targets):
        if self._loss is None:
            self._loss = loss_of_params(self.graphdef, self.placement)
        return self._loss(state.params, inputs, targets)

    def io_table(self) -> str | None:
        return paged_table(self.tx)

    def close(self) -> None:
        close_optimizer(self.tx)


class PlainStep(_OptaxStep):
    """`make_train_step` as a :class:`jaxoff.step.Step`: one device or an FSDP ``mesh`` (the
    optimizer state sharded with the parameters), the state placed by ``placement``, the
    optimizer paged or not (``tx`` from ``jaxoff.paged``: its state is checkpointed by
    ``save_paged``, the rest by orbax).

    Example:
        >>> import optax
        >>> from jaxoff.models.gpt import CONFIGS
        >>> from jaxoff.step import PlainStep, Step
        >>> step = PlainStep(CONFIGS["tiny"], optax.adam(1e-3))
        >>> isinstance(step, Step), int(step.init().step)
        (True, 0)
    """

    def __init__(
        self, model_cfg, tx: optax.GradientTransformation, placement=None, mesh=None, seed: int = 0
    ):
        from ..placement import get_placement

        self.model_cfg, self.tx, self.mesh, self.seed = model_cfg, tx, mesh, seed
        self.placement = get_placement(placement)
        self.graphdef: Any = None  # set by init() or restore()
        self._step: Any = None  # set by compile()
        self._loss = None

    @property
    def paged(self) -> bool:
        """Whether the optimizer state lives in a page store (``tx`` from ``jaxoff.paged``)."""
        from ..optim import PagedTransformation

        return isinstance(self.tx, PagedTransformation)

    def init(self) -> TrainState:
        self.graphdef, state = init_state(self.model_cfg, self.tx, self.seed)
        return state

    def restore(self, reader, step: int, fall_back):
        from ..aio import PageStoreCorruptError
        from ..optim import restore_paged
        from ..placement import abstract_with, state_shardings

        self.graphdef, abstract = abstract_state(self.model_cfg, self.tx)
        shardings = state_shardings(self.placement, abstract, self.mesh)
        while True:
            state = reader.restore(step, abstract_with(abstract, shardings))
            if not self.paged:
                return step, state
            try:
                # the store may be ahead of (or elsewhere than) the checkpoint: write it back
                opt_state = restore_paged(self.tx, reader.paged_dir(step), state.params)  # pyright: ignore[reportArgumentType] (paged: checked above)
                return step, state._replace(opt_state=opt_state)
            except PageStoreCorruptError as e:
                step = fall_back(step, e, [0])

    def save(self, writer, step: int, state: TrainState) -> None:
        if self.paged:
            from ..optim import save_paged

            save_paged(self.tx, state.opt_state, writer.paged_part(step))  # pyright: ignore[reportArgumentType] (paged: checked above)
        writer.save_tree(step, state)

    def compile(self, state: TrainState, inputs, targets) -> TrainState:
        from ..placement import compile_placed, jit_step

        train_step = make_train_step(self.graphdef, self.tx, self.placement)
        jitted, shardings = jit_step(train_step, self.placement, state, self.mesh)
        if jax.process_count() > 1:
            from ..distributed._sharded import from_host

            state = jax.tree.map(from_host, state, shardings)
        else:
            state = jax.device_put(state, shardings)
        # jit_step compiles with jaxoff.compiler_options (on CPU with 16-bit parameters: no
        # float32 copy of the stacked blocks)
        self._step = compile_placed(jitted.lower(state, inputs, targets), self.placement)
        return state

    def __call__(self, state: TrainState, inputs, targets):
        return self._step(state, inputs, targets)

    def phase_times(self) -> dict[str, float]:
        return {}


def loss_of_params(graphdef: nnx.GraphDef, placement=None):
    """``loss(params, inputs, targets)`` jitted: the evaluation of a step whose state holds
    its parameters (placed by ``placement``)."""
    from ..placement import fetch_params

    return jax.jit(make_loss_fn(graphdef, fetch_params(placement)))


def paged_table(tx) -> str | None:
    """The file table of ``tx``'s page store (``jaxoff.paged``), or None when not paged."""
    return getattr(getattr(tx, "pager", None), "table", None)


def close_optimizer(tx) -> None:
    """Closes ``tx``'s page store (releases its lock), if it has one."""
    if hasattr(tx, "close"):
        tx.close()


def optimizer() -> optax.GradientTransformation:
    """The optimizer of every compared step (AdamW, as ``jaxoff train``'s default)."""
    return optax.adamw(1e-4, b1=0.9, b2=0.95, weight_decay=0.1)


def tokens(batch: int, seq: int):
    return jax.ShapeDtypeStruct((batch, seq), jnp.int32)


def compile_step(model_cfg, batch: int, seq: int, placement: str = "device"):
    """``(compiled, jitted, abstract_state)`` of the real train step, state donated and
    placed (``placement``: a ``jaxoff.placement`` preset; the state carries its shardings),
    compiled as ``jaxoff train`` compiles it (``jit_step``: with `jaxoff.compiler_options`),
    so that what ``jaxoff plan`` and ``jaxoff compare`` measure is the program that trains."""
    from ..placement import abstract_with, compile_placed, jit_step, streamed_model

    tx = optimizer()
    graphdef, state = abstract_state(streamed_model(model_cfg, placement), tx)
    jitted, shardings = jit_step(make_train_step(graphdef, tx, placement), placement, state)
    state = abstract_with(state, shardings)
    tok = tokens(batch, seq)
    return compile_placed(jitted.lower(state, tok, tok), placement), jitted, state


def export_step(model_cfg, placement, tx, batch: int, seq: int, platform: str, mesh=None) -> str:
    """StableHLO text of the real train step under ``placement``, exported for ``platform``."""
    from ..placement import (
        abstract_with,
        batch_sharding,
        get_placement,
        jit_step,
        streamed_model,
    )

    placement = get_placement(placement)
    model_cfg = streamed_model(model_cfg, placement, mesh)
    graphdef, state = abstract_state(model_cfg, tx)
    jitted, shardings = jit_step(make_train_step(graphdef, tx, placement), placement, state, mesh)
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=batch_sharding(mesh))
    exported = jax.export.export(jitted, platforms=[platform])
    return exported(abstract_with(state, shardings), tok, tok).mlir_module()


def check_placement_export(
    model_cfg, placement, tx, batch: int, seq: int, platform: str, mesh=None
):
    """:class:`ExportReport` of the exported step, and the list of what is wrong with it."""
    from ..placement import analyze_export, get_placement

    placement = get_placement(placement)
    report = analyze_export(
        export_step(model_cfg, placement, tx, batch, seq, platform, mesh), platform
    )
    problems = []
    wants_host = placement.params == "host" or placement.opt_state == "host"
    if wants_host and not report.arg_kinds.get(placement.host_memory_kind):
        problems.append(f"no argument in {placement.host_memory_kind}")
    if not wants_host and set(report.arg_kinds) != {"device"}:
        problems.append(f"arguments outside device memory: {report.arg_kinds}")
    if placement.streams:
        if not report.placements_in_loops.get("device"):
            problems.append("no host-to-device parameter copy inside the layer loop")
        if not report.placements_in_loops.get(placement.host_memory_kind):
            problems.append("no device-to-host gradient copy inside the layer loop")
    elif report.placements_in_loops:
        problems.append(f"copies inside loops without streaming: {report.placements_in_loops}")
    return report, problems

"""Building a training step: loss, gradients, optimizer update; its state; compiling and exporting
it; and `PlainStep`, that step as the trainer runs it (a `jaxoff.step.Step`). Above placement
(which the step composes) and below the planner, ``compare`` and the trainer, which all build
steps from here. Offload lives elsewhere (``jaxoff.placement``)."""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from .._xla import compiler_options
from ..aio import PageStoreCorruptError
from ..nn import model_state
from ..optim import PagedTransformation, restore_paged, save_paged
from ..placement import (
    abstract_with,
    analyze_export,
    batch_sharding,
    compile_placed,
    fetch_params,
    from_host,
    get_placement,
    jit_step,
    make_update,
    state_shardings,
    streamed_model,
)
from ._accum import accumulate, grad_fn_of
from ._init import RandomInit
from ._state import TrainState, TrainStateWithRest


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def split_model(model: nnx.Module):
    """``(graphdef, params, rest)`` of ``model``: its ``nnx.Param`` state, what the optimizer
    sees, and the rest of its state (RNG stream keys and counts, batch statistics), which a
    step carries and updates but never differentiates; ``rest`` is ``None`` when the model
    has no state besides ``nnx.Param``."""

    if not jax.tree.leaves(model_state(model)):
        graphdef, params = nnx.split(model, nnx.Param)
        return graphdef, params, None
    return nnx.split(model, nnx.Param, ...)


def call_flags(model, training: bool) -> dict[str, bool]:
    """The train/evaluation flag ``model.__call__`` asks for: ``deterministic=not training``
    or ``train=training`` when it has a parameter of that name, else nothing."""

    try:
        names = inspect.signature(type(model).__call__).parameters
    except (TypeError, ValueError):  # a builtin or a C callable: no named flag
        return {}
    if "deterministic" in names:
        return {"deterministic": not training}
    if "train" in names:
        return {"train": training}
    return {}


def _run(model, inputs, training: bool):
    """The model's float32 logits, called in training or evaluation mode: the flag its
    ``__call__`` asks for (:func:`call_flags`), and in evaluation ``model.eval()`` (NNX's
    ``deterministic=True`` on ``nnx.Dropout``, ``use_running_average=True`` on
    ``nnx.BatchNorm``; nothing on a model without them)."""
    if not training and isinstance(model, nnx.Module):
        model.eval()
    return model(inputs, **call_flags(model, training))


def make_loss_fn(graphdef: nnx.GraphDef, fetch=None, *, training: bool = True):
    """``loss(params, inputs, targets)`` of the model described by ``graphdef``.

    ``fetch`` (see ``jaxoff.placement.fetch_params``) brings host parameters to the device.
    ``training``: the model runs in training mode (``deterministic=False`` where it asks for
    the flag), else in evaluation mode (see :func:`_run`).
    """

    def loss_fn(params, inputs, targets):
        params = params if fetch is None else fetch(params)
        return cross_entropy(_run(nnx.merge(graphdef, params), inputs, training), targets)

    return loss_fn


def make_stateful_loss_fn(graphdef: nnx.GraphDef, fetch=None, *, training: bool = True):
    """``loss(params, rest, inputs, targets) -> (loss, rest)`` of a model with state besides
    ``nnx.Param`` (see :func:`split_model`): ``rest`` as the call left it (RNG counts
    advanced, batch statistics updated), for ``jax.value_and_grad(..., has_aux=True)``."""

    def loss_fn(params, rest, inputs, targets):
        params = params if fetch is None else fetch(params)
        # copy=True: the merged variables belong to this trace (the rest is not
        # differentiated, and NNX refuses to update variables of an outer trace)
        model = nnx.merge(graphdef, params, rest, copy=True)
        loss = cross_entropy(_run(model, inputs, training), targets)
        return loss, nnx.split(model, nnx.Param, ...)[2]

    return loss_fn


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    placement=None,
    grad_accum: int = 1,
    mesh=None,
):
    """Returns ``train_step(state, inputs, targets) -> (state, metrics)``, not yet jitted.

    The caller jits it with ``donate_argnums=0`` so parameters and optimizer state are
    updated in place. ``placement`` (a ``jaxoff.placement.Placement`` or its name) says
    where the state lives; the caller also gives the jit its ``state_shardings``. A
    :class:`TrainStateWithRest` (a model with state besides ``nnx.Param``) gets its rest
    back as the model's call left it; the optimizer sees the parameters only.

    ``grad_accum`` > 1: ``inputs``/``targets`` hold ``grad_accum`` micro-batches, whose
    gradients are accumulated in a ``lax.scan`` (`jaxoff.step._accum.accumulate`; ``mesh``,
    the FSDP mesh, keeps each micro-batch's rows where the batch sharding put them) before
    the one update; the loss is the micro-batches' mean. With 1 the step is the plain one.
    """

    fetch = fetch_params(placement)
    loss_fn = make_loss_fn(graphdef, fetch)
    stateful_loss = make_stateful_loss_fn(graphdef, fetch)
    update = make_update(tx, placement)
    if grad_accum > 1:
        return _accumulating_step(loss_fn, stateful_loss, update, grad_accum, mesh)

    def train_step(state: Any, inputs: jax.Array, targets: jax.Array):
        if not isinstance(state, TrainStateWithRest):
            loss, grads = jax.value_and_grad(loss_fn)(state.params, inputs, targets)
            params, opt_state, grad_norm = update(grads, state.opt_state, state.params)
            metrics = {"loss": loss, "grad_norm": grad_norm}
            return TrainState(state.step + 1, params, opt_state), metrics
        (loss, rest), grads = jax.value_and_grad(stateful_loss, has_aux=True)(
            state.params, state.rest, inputs, targets
        )
        params, opt_state, grad_norm = update(grads, state.opt_state, state.params)
        metrics = {"loss": loss, "grad_norm": grad_norm}
        return TrainStateWithRest(state.step + 1, params, opt_state, rest), metrics

    return train_step


def _accumulating_step(loss_fn, stateful_loss, update, n: int, mesh):
    """`make_train_step`'s step over ``n`` micro-batches: their gradients accumulated
    (`jaxoff.step._accum.accumulate`), then ``update`` once."""

    stateless = grad_fn_of(loss_fn, with_rest=False)
    stateful = grad_fn_of(stateful_loss, with_rest=True)

    def train_step(state: Any, inputs: jax.Array, targets: jax.Array):
        with_rest = isinstance(state, TrainStateWithRest)
        grad_fn = stateful if with_rest else stateless
        rest = state.rest if with_rest else None
        loss, grads, rest = accumulate(grad_fn, n, state.params, rest, inputs, targets, mesh)
        params, opt_state, grad_norm = update(grads, state.opt_state, state.params)
        metrics = {"loss": loss, "grad_norm": grad_norm}
        return new_state(state.step + 1, params, opt_state, rest), metrics

    return train_step


def new_state(step, params, opt_state, rest=None):
    """A :class:`TrainState`, or a :class:`TrainStateWithRest` when ``rest`` is not None."""
    if rest is None:
        return TrainState(step, params, opt_state)
    return TrainStateWithRest(step, params, opt_state, rest)


def init_state(model_cfg, tx: optax.GradientTransformation, seed: int, initializer=None):
    """Builds the model and its optimizer state; returns ``(graphdef, TrainState)`` (a
    :class:`TrainStateWithRest` for a model with state besides ``nnx.Param``).
    ``initializer``: where the parameters come from (a :class:`jaxoff.step.Initializer`;
    default: the random init from ``seed``)."""

    model = (initializer or RandomInit(seed)).model(model_cfg)
    graphdef, params, rest = split_model(model)
    state = new_state(jnp.zeros((), jnp.int32), params, tx.init(params), rest)
    return graphdef, state


def abstract_state(model_cfg, tx: optax.GradientTransformation):
    """Shapes and dtypes of the TrainState, without allocating it."""

    def build():
        model = model_cfg.build(nnx.Rngs(0))
        _, params, rest = split_model(model)
        return new_state(jnp.zeros((), jnp.int32), params, tx.init(params), rest)

    graphdef = nnx.graphdef(nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0))))
    return graphdef, jax.eval_shape(build)


def with_rest_shardings(shardings: TrainState, state: Any, mesh=None) -> Any:
    """``shardings`` (a ``jaxoff.placement.state_shardings`` tree) as the tree of ``state``:
    for a :class:`TrainStateWithRest`, its rest on the device too (whole on one device,
    replicated on ``mesh``)."""
    if not isinstance(state, TrainStateWithRest):
        return shardings

    if mesh is None:
        where = SingleDeviceSharding(jax.devices()[0])
    else:
        where = NamedSharding(mesh, PartitionSpec())
    rest = jax.tree.map(lambda _: where, state.rest)
    if isinstance(shardings, TrainStateWithRest):
        return shardings._replace(rest=rest)
    return TrainStateWithRest(*shardings, rest)  # pyright: ignore[reportCallIssue] (3 + 1 fields)


def jit_train_step(train_step, placement, state: Any, mesh=None):
    """``jaxoff.placement.jit_step`` of ``train_step``; a :class:`TrainStateWithRest`'s rest
    on the device beside the placed parameters and optimizer state."""

    if not isinstance(state, TrainStateWithRest):
        return jit_step(train_step, placement, state, mesh)

    shardings = state_shardings(get_placement(placement), state, mesh)
    shardings = with_rest_shardings(shardings, state, mesh)
    tokens = batch_sharding(mesh)
    jitted = jax.jit(
        train_step,
        donate_argnums=0,
        in_shardings=(shardings, tokens, tokens),
        out_shardings=(shardings, None),
        compiler_options=compiler_options(state.params) or None,
    )
    return jitted, shardings


class OptaxStepBase:
    """What the plain and the sharded step share: the loss of ``state.params`` for
    validation, the paged optimizer's file table and its close."""

    tx: Any
    graphdef: Any
    placement: Any
    _loss: Any

    def evaluate(self, state: TrainState, inputs, targets):
        stateful = isinstance(state, TrainStateWithRest)
        if self._loss is None:
            self._loss = loss_of_params(self.graphdef, self.placement, stateful=stateful)
        if stateful:
            return self._loss(state.params, state.rest, inputs, targets)
        return self._loss(state.params, inputs, targets)

    def io_table(self) -> str | None:
        return paged_table(self.tx)

    def close(self) -> None:
        close_optimizer(self.tx)


class PlainStep(OptaxStepBase):
    """`make_train_step` as a :class:`jaxoff.step.Step`: one device or an FSDP ``mesh`` (the
    optimizer state sharded with the parameters), the state placed by ``placement``, the
    optimizer paged or not (``tx`` from ``jaxoff.paged``: its state is checkpointed by
    ``save_paged``, the rest by orbax). A new state's parameters come from ``initializer``
    (a :class:`jaxoff.step.Initializer`, e.g. a pretrained checkpoint; default: the random
    init from ``seed``). ``grad_accum``: micro-batches per step (see `make_train_step`);
    a step then takes ``grad_accum`` times as many rows.

    Example:
        >>> import optax
        >>> from jaxoff.models.gpt import CONFIGS
        >>> from jaxoff.step import PlainStep, Step
        >>> step = PlainStep(CONFIGS["tiny"], optax.adam(1e-3))
        >>> isinstance(step, Step), int(step.init().step)
        (True, 0)
    """

    def __init__(
        self,
        model_cfg,
        tx: optax.GradientTransformation,
        placement=None,
        mesh=None,
        seed: int = 0,
        initializer=None,
        grad_accum: int = 1,
    ):

        self.model_cfg, self.tx, self.mesh, self.seed = model_cfg, tx, mesh, seed
        self.grad_accum = grad_accum
        self.initializer = initializer  # None: the random init from seed
        self.placement = get_placement(placement)
        self.graphdef: Any = None  # set by init() or restore()
        self._step: Any = None  # set by compile()
        self._loss = None

    @property
    def paged(self) -> bool:
        """Whether the optimizer state lives in a page store (``tx`` from ``jaxoff.paged``)."""

        return isinstance(self.tx, PagedTransformation)

    def init(self) -> Any:  # a TrainState, or a TrainStateWithRest
        self.graphdef, state = init_state(self.model_cfg, self.tx, self.seed, self.initializer)
        return state

    def restore(self, reader, step: int, fall_back):
        self.graphdef, abstract = abstract_state(self.model_cfg, self.tx)
        shardings = state_shardings(self.placement, abstract, self.mesh)
        shardings = with_rest_shardings(shardings, abstract, self.mesh)
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
            save_paged(
                self.tx, state.opt_state, writer.paged_part(step), in_store=writer.paged_in_store
            )
        writer.save_tree(step, state)

    def compile(self, state: TrainState, inputs, targets) -> TrainState:

        train_step = make_train_step(
            self.graphdef, self.tx, self.placement, self.grad_accum, self.mesh
        )
        jitted, shardings = jit_train_step(train_step, self.placement, state, self.mesh)
        if jax.process_count() > 1:
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


def loss_of_params(graphdef: nnx.GraphDef, placement=None, *, stateful: bool = False):
    """``loss(params, inputs, targets)`` jitted: the evaluation of a step whose state holds
    its parameters (placed by ``placement``), the model in evaluation mode (see
    :func:`make_loss_fn`). ``stateful``: ``loss(params, rest, inputs, targets)`` of a model
    with state besides ``nnx.Param``; evaluation leaves that state as it was."""

    if not stateful:
        return jax.jit(make_loss_fn(graphdef, fetch_params(placement), training=False))
    loss_fn = make_stateful_loss_fn(graphdef, fetch_params(placement), training=False)
    return jax.jit(lambda params, rest, inputs, targets: loss_fn(params, rest, inputs, targets)[0])


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


def compile_step(model_cfg, batch: int, seq: int, placement: str = "device", grad_accum: int = 1):
    """``(compiled, jitted, abstract_state)`` of the real train step, state donated and
    placed (``placement``: a ``jaxoff.placement`` preset; the state carries its shardings),
    compiled as ``jaxoff train`` compiles it (``jit_step``: with `jaxoff.compiler_options`),
    so that what ``jaxoff plan`` and ``jaxoff compare`` measure is the program that trains.
    ``grad_accum`` > 1: the step over that many micro-batches of ``batch`` rows (its
    gradient accumulator among the compiled program's temporaries)."""

    tx = optimizer()
    graphdef, state = abstract_state(streamed_model(model_cfg, placement), tx)
    step_fn = make_train_step(graphdef, tx, placement, grad_accum)
    jitted, shardings = jit_train_step(step_fn, placement, state)
    state = abstract_with(state, shardings)
    tok = tokens(grad_accum * batch, seq)
    return compile_placed(jitted.lower(state, tok, tok), placement), jitted, state


def export_step(model_cfg, placement, tx, batch: int, seq: int, platform: str, mesh=None) -> str:
    """StableHLO text of the real train step under ``placement``, exported for ``platform``."""

    placement = get_placement(placement)
    model_cfg = streamed_model(model_cfg, placement, mesh)
    graphdef, state = abstract_state(model_cfg, tx)
    step_fn = make_train_step(graphdef, tx, placement)
    jitted, shardings = jit_train_step(step_fn, placement, state, mesh)
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=batch_sharding(mesh))
    exported = jax.export.export(jitted, platforms=[platform])
    return exported(abstract_with(state, shardings), tok, tok).mlir_module()


def check_placement_export(
    model_cfg, placement, tx, batch: int, seq: int, platform: str, mesh=None
):
    """:class:`ExportReport` of the exported step, and the list of what is wrong with it."""

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

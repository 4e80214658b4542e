"""The placement inside the step: fetch parameters, place gradients, run the update."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import optax
from jax.experimental.compute_on import compute_on

from .._errors import OptionError
from ..nn import with_stack
from ..optim import update_and_apply
from ._placement import Placement, get_placement
from ._shardings import is_stacked, replicated

_SPACE = {"device": jax.memory.Space.Device, "host": jax.memory.Space.Host}


# jax <= 0.10: compute_on(compute_type) is a context manager; jax >= 0.11: it wraps a function,
# compute_on(f, compute_type=..., out_memory_spaces=...), and the outputs' memory spaces are named.
_COMPUTE_ON_WRAPS = "out_memory_spaces" in inspect.signature(compute_on).parameters


def on_host(f, *args):
    """``f(*args)`` traced as host computation (``compute_on("device_host")``), its outputs in
    host memory, under either form of JAX's ``compute_on``."""
    if _COMPUTE_ON_WRAPS:
        wrap = compute_on(f, compute_type="device_host", out_memory_spaces=_SPACE["host"])  # pyright: ignore[reportCallIssue]  # jax >= 0.11's form; the checker reads the installed jax
        return wrap(*args)
    with compute_on("device_host"):
        return f(*args)


def move(tree, kind):
    """``device_put`` every leaf to memory space ``kind`` (``device``/``host``), in jit.

    A leaf already there is left alone (a no-op, no copy)."""
    space = _SPACE[kind]
    return jax.tree.map(
        lambda a: a if jax.typeof(a).memory_space == space else jax.device_put(a, space), tree
    )


def fetch_params(placement: Placement | str | None):
    """``fetch(params)`` giving the parameters the model computes with.

    Host parameters are copied to device memory, except the stacked layers when they
    stream (the model copies those in one layer at a time). ``None`` when there is
    nothing to do.
    """
    placement = get_placement(placement)
    if placement.params == "device":
        return None

    def fetch(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, a: a if placement.streams and is_stacked(path) else move(a, "device"),
            params,
        )

    return fetch


def global_norm(tree) -> jax.Array:
    """``optax.global_norm`` for real leaves, without its ``leaf.imag`` (in jax 0.10.2 the
    imaginary part of a real array is a zero made in *device* memory, which cannot meet a
    host operand). Bitwise equal: optax adds that zero to each square."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def make_update(tx: optax.GradientTransformation, placement: Placement | str | None):
    """``update(grads, opt_state, params) -> (params, opt_state, grad_norm)``.

    All on device: the plain optax update. Otherwise gradients are first placed
    (``placement.grads``), the operands are moved to where the update runs
    (``placement.update_kind``), the update runs there (on host under
    ``compute_on("device_host")``) and the results go to their homes.
    """
    placement = get_placement(placement)

    def plain(grads, opt_state, params):
        # a paged optimizer computes and writes the new parameters chunk by chunk;
        # for any other tx this is tx.update + optax.apply_updates
        params_new, opt_state = update_and_apply(tx, grads, opt_state, params)
        return params_new, opt_state, global_norm(grads)

    if placement.all_on_device:
        return plain

    def run_on(where, grads, opt_state, params):
        operands = move((grads, opt_state, params), where)
        if where == "device":
            return plain(*operands)
        return on_host(plain, *operands)

    def update(grads, opt_state, params):
        if placement.grads is not None:
            grads = move(grads, placement.grads)
        where = placement.update_kind
        try:
            new_params, new_state, norm = run_on(where, grads, opt_state, params)
        except ValueError as e:
            # jax 0.10.2: an op that makes a constant (optax's tree norm takes ``.imag`` of a
            # real array: a zero in *device* space) cannot mix with host operands. The
            # half-traced host ops are dead code; fall back to explicit transfers.
            if where != "host" or "memory_space" not in str(e):
                raise
            if placement.update_on == "host":
                raise OptionError(
                    f"the optimizer update cannot run on host operands under "
                    f"compute_on('device_host') in this JAX ({e}); use update_on='device' "
                    f"(explicit transfers) or an optimizer without global-norm clipping "
                    f"(`clip_norm=0`)"
                ) from None
            where = "device"
            new_params, new_state, norm = run_on(where, grads, opt_state, params)
        update.ran_on = where
        return move(new_params, placement.params), move(new_state, placement.opt_state), norm

    update.ran_on = None
    return update


def streamed_model(model_cfg, placement: Placement | str | None, mesh=None):
    """``model_cfg`` (a model config) with the placement's layer streaming switched on."""

    placement = get_placement(placement)
    if not placement.streams:
        return model_cfg
    return with_stack(model_cfg, stream_window=placement.stream_window, stream_to=replicated(mesh))

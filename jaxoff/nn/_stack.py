"""The layer-stack primitive: stacked blocks run under a remat policy, in segments, split in
two policies, or streamed a window of layers ahead.

This module (with ``_segments``, Chen et al.'s segments) is the one place jaxoff's layer-level
execution lives. A model builds its blocks stacked on a leading layer axis (:func:`stacked`)
and runs them with :func:`run_stack` (or :meth:`Stack.__call__`); *how* they run is a
:class:`Stack`, which jaxoff's commands set and models only carry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from .._errors import ConfigError
from ._layerwise import lazy_stack, recording
from ._segments import AUTO, chen_blocks, plan_segments, record

PolicySpec = str | Callable[..., Any] | None
"""A JAX checkpoint policy: ``None`` (no remat), a ``jax.checkpoint_policies`` attribute name,
or a policy callable."""


def resolve_jax_policy(policy: PolicySpec):
    """``policy`` as a JAX checkpoint policy callable (or ``None``)."""
    if policy is None or callable(policy):
        return policy
    return getattr(jax.checkpoint_policies, policy)


def recomputes_everything(policy: PolicySpec) -> bool:
    """Whether ``policy`` is ``nothing_saveable`` (by name or the callable itself)."""
    return resolve_jax_policy(policy) is jax.checkpoint_policies.nothing_saveable


@dataclasses.dataclass(frozen=True)
class Stack:
    """How a stack of layers runs: the execution knobs, kept out of the model's own config.

    Attributes:
        policy: remat policy of each remat unit: ``None`` (no remat), the name of a
            ``jax.checkpoint_policies`` attribute, or a policy callable.
        scan_unroll: ``unroll`` of the layer scan (1 keeps one compiled block).
        remat_every: layers per remat segment. ``1`` puts each block under
            ``nnx.remat(policy)``. ``k > 1`` runs Chen et al.'s (2016) segments of ``k`` blocks
            (the last one shorter when ``k`` does not divide the depth; see
            :func:`chen_blocks`): only segment inputs are kept between forward and backward,
            and backward runs each segment's forward once more, keeping everything inside it,
            before back-propagating through it. ``"auto"`` chooses ``k`` when the stack is
            traced, from the block's bytes at the traced shapes (:class:`SegmentPlan`); ``k``
            may come out ``1`` (then the stack runs exactly as ``remat_every=1``). Segments
            recompute everything inside them, so ``k != 1`` needs ``policy`` to be
            ``nothing_saveable``.
        stream_window: ``0`` runs the blocks' parameters where they are. ``w >= 1`` streams
            them: the stacked parameters stay where the caller put them (typically host
            memory) and each layer's slice is copied to ``stream_to`` ``w`` layers ahead of the
            one computing, in forward and again, in reverse, in backward (at most ``w + 1``
            layers' parameters in device memory); see :func:`stream_blocks`.
        stream_to: where a streamed layer's parameters go: ``None`` is device memory;
            otherwise anything ``jax.device_put`` accepts (e.g. a replicated
            ``NamedSharding`` with ``memory_kind="device"``).
        split_layers: ``0`` runs every layer under ``policy``. ``n >= 1`` runs the first
            ``n`` layers under ``split_policy`` and the rest under ``policy``, each part a
            scan of its own (TransformerEngine-style offload of the first layers).
        split_policy: the remat policy of the first ``split_layers`` layers.

    Example:
        >>> from jaxoff.nn import Stack
        >>> Stack(policy="nothing_saveable", remat_every=4).remat_every
        4
    """

    policy: PolicySpec = None
    scan_unroll: int = 1
    remat_every: int | Literal["auto"] = 1
    stream_window: int = 0
    stream_to: Any = None
    split_layers: int = 0
    split_policy: PolicySpec = None

    def __post_init__(self):
        if self.remat_every != AUTO and (
            not isinstance(self.remat_every, int) or self.remat_every < 1
        ):
            raise ValueError(f"remat_every must be at least 1 or 'auto', got {self}")
        if self.scan_unroll < 1:
            raise ValueError(f"scan_unroll must be at least 1, got {self}")
        if self.stream_window < 0:
            raise ValueError(f"stream_window must be 0 (off) or at least 1, got {self}")
        if self.split_layers < 0:
            raise ValueError(f"split_layers must be 0 (off) or at least 1, got {self}")
        if self.stream_window and self.remat_every != 1:
            raise ValueError(
                f"stream_window={self.stream_window} streams one block per layer step and "
                f"cannot be combined with remat_every={self.remat_every}"
            )
        if self.split_layers and (self.stream_window or self.remat_every != 1):
            raise ValueError(
                f"split_layers={self.split_layers} runs two scans of one block per remat "
                f"unit; it cannot be combined with stream_window={self.stream_window} or "
                f"remat_every={self.remat_every}"
            )
        for field in ("policy", "split_policy"):
            value = getattr(self, field)
            if isinstance(value, str) and not hasattr(jax.checkpoint_policies, value):
                raise ValueError(
                    f"{field}={value!r} is not an attribute of jax.checkpoint_policies"
                )
        if self.remat_every != 1 and not recomputes_everything(self.policy):
            raise ValueError(
                f"remat_every={self.remat_every!r} runs Chen segments, which keep only segment "
                f"inputs and recompute everything inside a segment, but policy={self.policy!r} "
                f"{'is no remat' if self.policy is None else 'keeps or offloads residuals'}: "
                f"set policy='nothing_saveable', or remat_every=1 to remat block by block"
            )

    def check_depth(self, num_layers: int) -> None:
        """Raises ``ValueError`` when the knobs do not fit a stack of ``num_layers``."""
        if self.split_layers > num_layers:
            raise ValueError(
                f"split_layers={self.split_layers} must be between 0 (off) and the "
                f"stack's {num_layers} layers"
            )

    def __call__(self, blocks: nnx.Module, x: jax.Array, **inputs: Any) -> jax.Array:
        return run_stack(blocks, x, self, **inputs)


def stacked(make_block: Callable[[nnx.Rngs], nnx.Module], num_layers: int, rngs: nnx.Rngs):
    """``num_layers`` blocks made by ``make_block(rngs)``, parameters stacked on axis 0.

    Example:
        >>> from flax import nnx
        >>> from jaxoff.nn import stacked
        >>> blocks = stacked(lambda r: nnx.Linear(4, 4, rngs=r), 3, nnx.Rngs(0))
        >>> blocks.kernel.shape
        (3, 4, 4)

    Under :func:`jaxoff.nn.layerwise_params` the blocks are not made here: their RNG streams
    are split the same way, and each layer is made when asked for.
    """
    if recording() is not None:
        return lazy_stack(make_block, num_layers, rngs)

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs: nnx.Rngs):
        return make_block(rngs)

    return make(rngs)


def num_layers_of(blocks: nnx.Module) -> int:
    """The depth of a stack made by :func:`stacked` (its parameters' leading axis)."""
    leaves = jax.tree.leaves(nnx.state(blocks))
    if not leaves or not getattr(leaves[0], "ndim", 0):
        raise ValueError("blocks have no stacked parameters (make them with jaxoff.nn.stacked)")
    return leaves[0].shape[0]


def run_stack(
    blocks: nnx.Module, x: jax.Array, stack: Stack | None = None, **inputs: Any
) -> jax.Array:
    """Runs the stacked ``blocks`` over the carry ``x`` as ``stack`` says.

    Each block is called as ``block(h, **inputs) -> h`` with ``h`` of ``x``'s shape.
    ``inputs`` are the call's per-call inputs, the same for every layer: an attention mask or
    segment ids, positions, a ``deterministic`` flag. Arrays among them are scan-invariant
    (closed over by the layer loop, never sliced per layer, never differentiated); other
    values (a Python ``bool``) are static. Without ``inputs`` a block is called with ``h``
    alone, as before. The result is the same for every :class:`Stack` (bitwise where XLA
    compiles the same arithmetic); what differs is what is kept, offloaded or recomputed
    between forward and backward, and where the parameters are while a layer computes.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from jaxoff.nn import run_stack, stacked
        >>> class Masked(nnx.Module):
        ...     def __init__(self, rngs):
        ...         self.lin = nnx.Linear(4, 4, rngs=rngs)
        ...     def __call__(self, h, *, mask, deterministic=True):
        ...         return h + self.lin(h) * mask[..., None]
        >>> blocks = stacked(Masked, 2, nnx.Rngs(0))
        >>> h = run_stack(blocks, jnp.ones((1, 3, 4)), mask=jnp.array([[1.0, 1.0, 0.0]]))
        >>> h[0, 2].tolist()  # the masked position passes through every layer unchanged
        [1.0, 1.0, 1.0, 1.0]
    """
    stack = Stack() if stack is None else stack
    if stack.stream_window:
        refuse_model_state(blocks, f"streamed blocks (stream_window={stack.stream_window})")
        return stream_blocks(
            blocks, x, window=stack.stream_window, to=stack.stream_to, inputs=inputs
        )
    if stack.split_layers:
        stack.check_depth(num_layers_of(blocks))
        head, tail = split_blocks(blocks, stack.split_layers)
        x = scan_blocks(head, x, policy=stack.split_policy, unroll=stack.scan_unroll, inputs=inputs)
        if tail is not None:
            x = scan_blocks(tail, x, policy=stack.policy, unroll=stack.scan_unroll, inputs=inputs)
        return x
    return scan_blocks(
        blocks,
        x,
        policy=stack.policy,
        unroll=stack.scan_unroll,
        remat_every=stack.remat_every,
        inputs=inputs,
    )


def model_state(module: nnx.Module):
    """The state of ``module`` besides its ``nnx.Param``: RNG stream keys and counts (e.g.
    of ``nnx.Dropout``), batch statistics (``nnx.BatchNorm``), any other ``nnx.Variable``."""
    return nnx.state(module, nnx.Not(nnx.Param))


def refuse_model_state(blocks: nnx.Module, where: str) -> None:
    """Raises :class:`jaxoff.ConfigError` when ``blocks`` hold state besides ``nnx.Param``
    (RNG streams, batch statistics), which ``where`` (a layer loop with a custom VJP) cannot
    carry."""
    rest = model_state(blocks)
    if jax.tree.leaves(rest):
        kinds = sorted({type(v).__name__ for v in jax.tree.leaves(rest, is_leaf=_is_variable)})
        raise ConfigError(
            f"the blocks hold state besides nnx.Param ({', '.join(kinds)}: dropout RNG "
            f"streams or batch statistics), which {where} cannot carry; run them block by "
            f"block (remat_every=1, no streaming), or keep that state out of the blocks"
        )


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def split_blocks(blocks: nnx.Module, n: int) -> tuple[nnx.Module, nnx.Module | None]:
    """The stacked ``blocks`` as two stacks: layers ``[0, n)`` and ``[n, L)`` (``None`` when
    ``n == L``). Slices of the parameters, so gradients flow back to the stack."""
    graphdef, state = nnx.split(blocks)
    num_layers = jax.tree.leaves(state)[0].shape[0]
    head = nnx.merge(graphdef, jax.tree.map(lambda a: a[:n], state))
    if n == num_layers:
        return head, None
    return head, nnx.merge(graphdef, jax.tree.map(lambda a: a[n:], state))


def scan_blocks(
    blocks: nnx.Module,
    x: jax.Array,
    *,
    policy: PolicySpec,
    unroll: int = 1,
    remat_every: int | Literal["auto"] = 1,
    inputs: dict[str, Any] | None = None,
) -> jax.Array:
    """Runs stacked ``blocks`` over ``x``; the remat unit is one block or one segment.

    ``remat_every == 1``: ``nnx.scan`` over blocks, the body under ``nnx.remat(policy)``.
    ``remat_every == k > 1``: Chen et al.'s segments of ``k`` blocks (:func:`chen_blocks`).
    ``remat_every == "auto"``: ``k`` from :func:`plan_segments` at the traced shapes, and
    the per-block path when it comes out ``1``. Every loop uses ``unroll``. ``inputs``:
    each block's per-call keyword inputs (see :func:`run_stack`), closed over by the loop.
    The blocks' state besides ``nnx.Param`` (RNG counts, batch statistics) is updated
    layer by layer on the per-block path; segments refuse it.
    """
    inputs = dict(inputs or {})
    if remat_every == AUTO:
        refuse_model_state(blocks, "remat_every='auto' (Chen segments)")
        remat_every = record(plan_segments(blocks, x, inputs=inputs)).size
    if remat_every != 1 and policy is not None:
        refuse_model_state(blocks, f"Chen segments (remat_every={remat_every})")
        return chen_blocks(blocks, x, size=remat_every, unroll=unroll, inputs=inputs)

    if inputs:

        def body(block: nnx.Module, h: jax.Array) -> jax.Array:
            return block(h, **inputs)

    else:

        def body(block: nnx.Module, h: jax.Array) -> jax.Array:
            return block(h)

    if policy is not None:
        body = nnx.remat(body, policy=resolve_jax_policy(policy))

    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry, unroll=unroll)
    def run(block: nnx.Module, h: jax.Array) -> jax.Array:
        return body(block, h)

    return run(blocks, x)


def stream_blocks(
    blocks: nnx.Module,
    x: jax.Array,
    *,
    window: int,
    to: Any = None,
    inputs: dict[str, Any] | None = None,
) -> jax.Array:
    """Runs stacked ``blocks`` over ``x``, copying each layer's parameters in as it is needed.

    The stacked parameters stay where they are (host memory, typically); inside the layer
    loop the parameters of layer ``i + window`` are copied to ``to`` (default: device memory)
    while layer ``i`` computes, into a ring of ``window + 1`` device slots, so at most
    ``window + 1`` layers' parameters are on the device at once (``window = 1``: L2L,
    Pudipeddi et al. 2020; ``window > 1``: a STRONGHOLD-style working window, Sun et al.
    2022). The copy and the compute have no data dependency, so an accelerator's scheduler
    can overlap them.

    Autodiff cannot see that a prefetched copy may be fetched again (a copy carried from one
    loop step to the next would be saved for backward, every layer's weights on device), so
    the loop has a custom VJP: forward saves each block's input only; backward walks the
    layers in reverse with the same ring (prefetching ``window`` layers below), recomputes the
    block, and sends each layer's parameter gradient back to the parameters' own memory space
    inside the loop. The arithmetic is the block's own forward and VJP, as under
    ``nothing_saveable`` remat. ``inputs``: each block's per-call keyword inputs (see
    :func:`run_stack`), closed over (never differentiated).
    """
    graphdef, state = nnx.split(blocks)
    inputs = dict(inputs or {})

    def block(layer_state, h):
        return nnx.merge(graphdef, layer_state)(h, **inputs)

    # where the parameters live, read here: inside the custom VJP's backward its residuals no
    # longer carry their memory space
    homes = jax.tree.map(lambda a: jax.typeof(a).memory_space, state)
    to = jax.memory.Space.Device if to is None else to
    return _streamed(block, window, to, homes)(state, x)


def _streamed(block: Callable, window: int, to: Any, homes: Any) -> Callable:
    """``run(stacked, x)`` of :func:`stream_blocks`, with its custom VJP."""

    def fetch(stacked, i):
        n = jax.tree.leaves(stacked)[0].shape[0]
        i = jnp.clip(i, 0, n - 1)  # the last `window` steps re-fetch an end layer (unused)
        return jax.tree.map(
            lambda a: jax.device_put(jax.lax.dynamic_index_in_dim(a, i, 0, False), to), stacked
        )

    def ring_init(stacked, first, step):
        # slots 0..w-1 hold layers first, first+step, ...; slot w is free
        layers = [fetch(stacked, first + step * k) for k in range(window)]
        return jax.tree.map(lambda *a: jnp.stack([*a, jnp.zeros_like(a[0])]), *layers)

    def slot(ring, j):
        j = j % (window + 1)
        return jax.tree.map(lambda r: jax.lax.dynamic_index_in_dim(r, j, 0, False), ring)

    def put(ring, j, layer):
        return jax.tree.map(
            lambda r, v: jax.lax.dynamic_update_index_in_dim(r, v, j % (window + 1), 0), ring, layer
        )

    def forward(stacked, x, save: bool):
        n = jax.tree.leaves(stacked)[0].shape[0]

        def body(carry, j):
            h, ring = carry
            ahead = fetch(stacked, j + window)  # prefetch; independent of this layer
            out = block(slot(ring, j), h)
            return (out, put(ring, j + window, ahead)), (h if save else None)

        (h, _), saved = jax.lax.scan(body, (x, ring_init(stacked, 0, 1)), jnp.arange(n))
        return h, saved

    @jax.custom_vjp
    def run(stacked, x):
        return forward(stacked, x, save=False)[0]

    def run_fwd(stacked, x):
        h, saved = forward(stacked, x, save=True)
        return h, (stacked, saved)

    def run_bwd(res, g):
        stacked, saved = res
        n = jax.tree.leaves(stacked)[0].shape[0]

        def body(carry, i):  # i runs n-1 .. 0 (reverse scan); j counts steps from 0
            gh, ring = carry
            j = n - 1 - i
            ahead = fetch(stacked, i - window)
            h = jax.lax.dynamic_index_in_dim(saved, i, 0, False)
            _, vjp = jax.vjp(block, slot(ring, j), h)
            g_layer, gh = vjp(gh)
            g_layer = jax.tree.map(jax.device_put, g_layer, homes)  # back to the params' home
            return (gh, put(ring, j + window, ahead)), g_layer

        init = (g, ring_init(stacked, n - 1, -1))
        (gx, _), g_stacked = jax.lax.scan(body, init, jnp.arange(n), reverse=True)
        return g_stacked, gx

    run.defvjp(run_fwd, run_bwd)
    return run

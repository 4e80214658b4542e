"""Chen et al.'s (2016) segments for the layer stack: the segment size from a traced block's
bytes (:class:`SegmentPlan`, :func:`plan_segments`) and the segmented run with one
recomputation per segment (:func:`chen_blocks`). :func:`jaxoff.nn.run_stack` uses them when a
:class:`jaxoff.nn.Stack` has ``remat_every != 1``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.extend import core as jex_core

AUTO = "auto"
"""``Stack.remat_every`` that sizes Chen et al.'s segments from the traced block's bytes
(:meth:`SegmentPlan.choose`)."""


def sqrt_segment_size(num_layers: int) -> int:
    """Chen et al.'s (2016) segment size for ``num_layers`` blocks: ``round(sqrt(L))`` (at
    least 1), so that ``L / k`` kept boundaries and one segment's ``k`` interiors both grow
    as ``sqrt(L)``, whatever the block's bytes (the ``sqrt`` policy preset; ``sqrt_bytes``
    sizes them by the bytes instead, :meth:`SegmentPlan.choose`).

    >>> [sqrt_segment_size(n) for n in (1, 2, 9, 12, 64, 128)]
    [1, 1, 3, 3, 8, 11]
    """
    if num_layers < 1:
        raise ValueError(f"a stack has at least 1 block, got {num_layers}")
    return max(1, round(math.sqrt(num_layers)))


@dataclasses.dataclass(frozen=True)
class SegmentPlan:
    """Chen et al.'s segment size for one stack, from the bytes of its traced block.

    Backward holds every kept boundary (one block input per segment, ``b`` bytes each) and,
    while it recomputes and back-propagates one segment, that segment's interior (``i``
    bytes per block). The memory of segments of ``k`` is ``ceil(L / k) b + k i``
    (:meth:`memory`), and :meth:`choose` takes the ``k`` in ``1..L`` that minimises it: Chen's
    ``k = sqrt(L)`` rule, generalised to a block whose interior is not the size of its
    boundary. ``k = 1`` is per-block remat (``full``); a transformer block's interior is
    many times its input, so ``k`` only passes 1 in deep stacks.

    Attributes:
        num_layers: blocks in the stack (``L``).
        boundary_bytes: ``b``, one kept boundary: a block's input.
        interior_bytes: ``i``, what one block holds while its segment is back-propagated:
            the residuals its backward reads with nothing rematted (its parameters aside),
            plus its own input.
        size: blocks per segment (``k``), the last segment shorter when ``k`` does not
            divide ``L``.

    Example:
        >>> from jaxoff.nn import SegmentPlan
        >>> plan = SegmentPlan.choose(64, boundary_bytes=1, interior_bytes=1)
        >>> plan.size, plan.memory(), plan.memory(1)
        (8, 16, 65)
    """

    num_layers: int
    boundary_bytes: int
    interior_bytes: int
    size: int

    @classmethod
    def choose(cls, num_layers: int, boundary_bytes: int, interior_bytes: int) -> SegmentPlan:
        """The plan with the ``k`` of least :meth:`memory` (the smaller ``k`` on a tie: fewer
        recomputed FLOPs are never worse at equal memory)."""
        plan = cls(num_layers, boundary_bytes, interior_bytes, 1)
        size = min(range(1, num_layers + 1), key=lambda k: (plan.memory(k), k))
        return dataclasses.replace(plan, size=size)

    def memory(self, size: int | None = None) -> int:
        """Modelled activation bytes of segments of ``size`` (default: :attr:`size`)."""
        k = self.size if size is None else size
        return math.ceil(self.num_layers / k) * self.boundary_bytes + k * self.interior_bytes

    def pays_from(self) -> int:
        """The least depth at which segments of more than one block need less memory than
        per-block remat (:meth:`memory`), for this plan's ``b`` and ``i``."""
        depth = 2
        while SegmentPlan.choose(depth, self.boundary_bytes, self.interior_bytes).size == 1:
            depth += 1
        return depth

    @property
    def lengths(self) -> tuple[int, ...]:
        """Blocks in each segment, in order: ``size`` each, the last one shorter."""
        full, rest = divmod(self.num_layers, self.size)
        return (self.size,) * full + ((rest,) if rest else ())

    @property
    def recomputed_layers(self) -> int:
        """Blocks whose forward backward runs a second time: every block under per-block
        remat (``size == 1``); all but the last segment's under segments (its forward
        keeps its residuals, as backward starts there)."""
        return self.num_layers if self.size == 1 else self.num_layers - self.lengths[-1]


_RECORDED: contextvars.ContextVar[list[SegmentPlan] | None] = contextvars.ContextVar(
    "jaxoff_recorded_segments", default=None
)


@contextlib.contextmanager
def recorded_segments() -> Iterator[list[SegmentPlan]]:
    """Collects the :class:`SegmentPlan` of every ``remat_every="auto"`` stack traced inside
    the ``with`` block (a jitted function already traced for these shapes is not traced
    again, and records nothing).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> from jaxoff.nn import Stack, recorded_segments, run_stack, stacked
        >>> blocks = stacked(lambda r: nnx.Linear(4, 4, rngs=r), 3, nnx.Rngs(0))
        >>> graphdef, state = nnx.split(blocks)
        >>> stack = Stack(policy="nothing_saveable", remat_every="auto")
        >>> def run(state, x):
        ...     return run_stack(nnx.merge(graphdef, state), x, stack)
        >>> with recorded_segments() as plans:
        ...     _ = jax.eval_shape(run, state, jnp.zeros((2, 4)))
        >>> [p.size for p in plans]
        [1]
    """
    plans: list[SegmentPlan] = []
    token = _RECORDED.set(plans)
    try:
        yield plans
    finally:
        _RECORDED.reset(token)


def record(plan: SegmentPlan) -> SegmentPlan:
    """``plan``, appended to the list of an enclosing :func:`recorded_segments` if any."""
    recorded = _RECORDED.get()
    if recorded is not None:
        recorded.append(plan)
    return plan


def plan_segments(
    blocks: nnx.Module, x: jax.Array, inputs: dict[str, Any] | None = None
) -> SegmentPlan:
    """The :class:`SegmentPlan` of stacked ``blocks`` run over ``x``, from one traced block.

    ``b`` is the bytes of ``x``. ``i`` is the bytes of the residuals one block's VJP keeps
    with nothing rematted, its arguments (the layer's parameters and input) and constants
    not counted, plus ``b`` for the block's input, which backward also holds. Only shapes
    are traced; nothing runs. ``inputs``: the blocks' per-call keyword inputs (arrays are
    traced as shapes, like ``x``).
    """
    graphdef, state = nnx.split(blocks)
    layer = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), state)
    h = jax.ShapeDtypeStruct(x.shape, x.dtype)
    arrays = {k: v for k, v in (inputs or {}).items() if isinstance(v, jax.Array)}
    static = {k: v for k, v in (inputs or {}).items() if k not in arrays}
    arrays = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in arrays.items()}

    def residuals(layer_state, h, arrays):
        return jax.vjp(lambda s, h: nnx.merge(graphdef, s)(h, **arrays, **static), layer_state, h)[
            1
        ]

    jaxpr = jax.make_jaxpr(residuals)(layer, h, arrays).jaxpr
    given = set(jaxpr.invars) | set(jaxpr.constvars)
    kept = {v for v in jaxpr.outvars if not isinstance(v, jex_core.Literal) and v not in given}
    boundary = math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
    interior = boundary + sum(math.prod(v.aval.shape) * v.aval.dtype.itemsize for v in kept)
    return SegmentPlan.choose(jax.tree.leaves(state)[0].shape[0], boundary, interior)


def chen_blocks(
    blocks: nnx.Module,
    x: jax.Array,
    *,
    size: int,
    unroll: int = 1,
    inputs: dict[str, Any] | None = None,
) -> jax.Array:
    """Runs stacked ``blocks`` over ``x`` in Chen et al.'s (2016) segments of ``size`` blocks.

    Segments are ``size`` consecutive blocks, the last one shorter when ``size`` does not
    divide the depth. Forward keeps each segment's input only (no residual inside a
    segment), except for the last segment, whose residuals are kept as without remat:
    backward starts there (as ``torch.utils.checkpoint.checkpoint_sequential`` runs its last
    segment). Backward walks the other segments in reverse; for each it runs the segment's
    forward once, keeping every residual inside it, and applies that forward's VJP. So each
    block before the last segment is recomputed exactly once, with no nested remat, and the
    arithmetic is the plain stack's forward and VJP (the gradients are no remat's, to the
    few ulps by which XLA's fusion of the recomputed forward into backward may round).

    Backward is written out as a custom VJP rather than left to ``jax.checkpoint`` around
    each segment: the recomputation is then exactly the segment's forward, once; the last
    segment can skip it; and a segment's blocks can run unrolled (see ``segment`` below)
    with an ``optimization_barrier`` between blocks, so XLA fuses each block as it does in
    the plain layer loop (the forward stays bitwise the plain one, bfloat16 included). The
    stacked parameters are the VJP's residual as they are (no copy), each segment sliced
    from them inside the loops, and the parameter gradient is one buffer written segment by
    segment. ``inputs``: each block's per-call keyword inputs (see
    :func:`jaxoff.nn.run_stack`), closed over (never differentiated).
    """
    graphdef, state = nnx.split(blocks)
    inputs = dict(inputs or {})
    num_layers = jax.tree.leaves(state)[0].shape[0]
    recomputed = (num_layers - 1) // size  # segments before the last

    def segment(seg_state, h: jax.Array) -> jax.Array:
        def layer(h, layer_state):
            out = nnx.merge(graphdef, layer_state)(h, **inputs)
            return jax.lax.optimization_barrier(out), None

        # unrolled: in straight-line code XLA frees each block's residuals as soon as its
        # backward is done; inside a loop it keeps stacked residual buffers whole (on CPU,
        # ~0.75 of a block's interior above the byte model, more than segments save at
        # the depths where they first pay)
        n = jax.tree.leaves(seg_state)[0].shape[0]
        return jax.lax.scan(layer, h, seg_state, unroll=n)[0]

    if not recomputed:  # one segment: nothing to recompute, plain autodiff
        return segment(state, x)
    return _chen(segment, size, recomputed, unroll)(state, x)


def _chen(segment: Callable, size: int, recomputed: int, unroll: int) -> Callable:
    """``run(stacked, x)`` of :func:`chen_blocks`, with its custom VJP."""
    start = recomputed * size  # first layer of the last segment
    unroll = min(unroll, recomputed)

    def take(stacked, j):
        return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, j * size, size), stacked)

    def last(stacked):
        return jax.tree.map(lambda a: a[start:], stacked)

    def head(stacked, x, keep: bool):
        """The segments before the last; their inputs when ``keep``."""

        def body(h, j):
            return segment(take(stacked, j), h), (h if keep else None)

        return jax.lax.scan(body, x, jnp.arange(recomputed), unroll=unroll)

    @jax.custom_vjp
    def run(stacked, x):
        return segment(last(stacked), head(stacked, x, keep=False)[0])

    def run_fwd(stacked, x):
        h, inputs = head(stacked, x, keep=True)
        out, last_vjp = jax.vjp(segment, last(stacked), h)
        return out, (stacked, inputs, last_vjp)

    def run_bwd(res, g):
        stacked, inputs, last_vjp = res
        g_last, gh = last_vjp(g)
        grads = jax.tree.map(
            lambda a, gl: jax.lax.dynamic_update_slice_in_dim(jnp.zeros_like(a), gl, start, 0),
            stacked,
            g_last,
        )

        def body(carry, j):  # j runs recomputed-1 .. 0 (reverse scan)
            gh, grads = carry
            h = jax.lax.dynamic_index_in_dim(inputs, j, 0, False)
            _, vjp = jax.vjp(segment, take(stacked, j), h)  # the one recomputation
            g_seg, gh = vjp(gh)
            grads = jax.tree.map(
                lambda a, gs: jax.lax.dynamic_update_slice_in_dim(a, gs, j * size, 0),
                grads,
                g_seg,
            )
            return (gh, grads), None

        (gx, grads), _ = jax.lax.scan(
            body, (gh, grads), jnp.arange(recomputed), reverse=True, unroll=unroll
        )
        return grads, gx

    run.defvjp(run_fwd, run_bwd)
    return run

"""Fuyou's step: the paged optimizer update inside the backward layer scan (see the package
docstring): `make_fuyou_step` builds it from `_train_step` over a `StepContext`, the view of
the model, the layout and the state that its parts (`_forward`, `_backward` and its scan's
body `_backward_body`, `_tail_update`, `_commit`) share.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jaxoff._errors import ConfigError
from jaxoff.optim.chunks import ChunkUpdater, Plan, StepRecorder
from jaxoff.step import TrainState, cross_entropy

from . import _params as fp
from ._bits import _block_fn, _layer, _like, _put_layer, _stack_form, _unbits
from ._layout import FuyouState, _abstract_params, _check_model, _Layout, _layout, _updater


def _used_inputs(fn, *args) -> list[bool]:
    """Per flat input of ``fn(*args)``: whether its jaxpr reads it."""
    closed = jax.make_jaxpr(fn)(*args)
    used = {id(v) for eqn in closed.jaxpr.eqns for v in eqn.invars}
    used |= {id(v) for v in closed.jaxpr.outvars}
    return [id(v) in used for v in closed.jaxpr.invars]


def make_fuyou_step(
    graphdef: nnx.GraphDef,
    model_cfg,
    tx,
    *,
    blocks_as_bits: bool = False,
    page_params: bool = False,
):
    """``train_step(state, inputs, targets) -> (state, metrics)`` with the update in backward.

    Same contract as ``jaxoff.train.make_train_step`` (the caller jits it with
    ``donate_argnums=0``); ``state.opt_state`` comes from `fuyou_init`.

    ``blocks_as_bits``: the stacked block leaves of ``state.params`` come (and go back) as
    their raw bits (`blocks_to_bits`). XLA's CPU backend computes 16-bit floats in float32,
    slicing and updating included, so the scans run over the bits of 16-bit floats either
    way; given such floats, the step converts them to bits and back (a second copy of the
    blocks while it runs), given bits it updates them in place. Use it when a 16-bit model
    nearly fills RAM. float32 blocks are updated in place as they are.

    ``page_params``: the stacked block parameters live in the page store
    (``fuyou_init(..., page_params=True)``; ``state.params`` is `fuyou_resident` of them).
    Each layer's parameters are read one layer ahead in forward and again in backward, and
    its new ones written by its update (see `_params`); `fuyou_params` reads them
    back. The arithmetic is unchanged: the step is bitwise the one without paging.

    Raises:
      ConfigError: ``tx`` is not a paged optimizer, or holds a global operation (clipping).
    """
    _check_model(model_cfg)
    updater = _updater(tx)
    if page_params and blocks_as_bits:
        raise ConfigError(
            "page_params keeps the block parameters in the page store, not in the state: "
            "blocks_as_bits does not apply (drop it)"
        )
    abstract = _abstract_params(model_cfg) if page_params else None
    options = _Options(graphdef, tx, updater, blocks_as_bits, page_params, abstract)
    return functools.partial(_train_step, options, jnp.dtype(model_cfg.param_dtype))


@dataclasses.dataclass(frozen=True)
class _Options:
    """What `make_fuyou_step` fixed: the model's graph, the optimizer, the step's form."""

    graphdef: nnx.GraphDef
    tx: Any
    updater: ChunkUpdater
    blocks_as_bits: bool
    page_params: bool
    abstract: Any  # the parameters' shapes, with page_params


@dataclasses.dataclass
class StepContext:
    """One traced step's view of the model, its layout and its state: what the forward pass,
    the backward scan's body and the tail update share (built by `_context`)."""

    opts: _Options
    lay: _Layout
    plan: Plan
    opt: FuyouState
    leaves: list  # the state's parameter leaves, in plan order
    bidx: list[int]  # the stacked block leaves' indices
    ridx: list[int]  # the other leaves'
    rest: list  # the other leaves
    stacked: list  # the block leaves as the scans hold them (`_stack_form`)
    dtypes: list  # the block leaves' dtypes
    block: Any  # block(layer, h) (`_block_fn`)
    rec: StepRecorder  # the step's paging calls (begun with the state's version)
    inner_ram: list

    @property
    def bleaves(self) -> list:
        return [self.plan.leaves[i] for i in self.bidx]

    @property
    def rleaves(self) -> list:
        return [self.plan.leaves[i] for i in self.ridx]

    def update_leaf(self, leaf, g, p, layer_of=None):
        """One leaf's paged update (`ChunkUpdater.update_leaf`): its new parameters. With
        ``layer_of``, ``p`` is layer ``layer_of(env)`` of a stacked block leaf."""
        names = self.lay.names(leaf, layer_of)
        return self.opts.updater.update_leaf(self.rec, self.plan, leaf, g, p, self.inner_ram, names)

    def vjp_layer(self, layer, h_in, gh):
        """The gradients of a layer's parameters (flat) and of its input.

        Flat: a gradient is carried to the next scan step, whose update reads it as a flat
        array. Carried in its own shape, XLA's CPU layout assignment gave a 2-D gradient a
        column-major layout, and transposed it into row-major order twice (for the squares
        and for the update), ~3x the time of that layer's matmuls at d = 2048.
        """
        _, vjp = jax.vjp(self.block, layer, h_in)
        g_layer, gh = vjp(gh)
        return [g.reshape(-1) for g in g_layer], gh

    def update_layer(self, g_layer, layer, layer_of):
        """Layer ``layer_of(env)``'s paged update: its new parameters and squares."""
        new_layer, sq = [], []
        for leaf, g, p in zip(self.bleaves, g_layer, layer, strict=True):
            new_layer.append(self.update_leaf(leaf, g, p, layer_of))
            sq.append(jnp.sum(jnp.square(g.astype(jnp.float32))))
        return new_layer, jnp.stack(sq)


def _context(opts: _Options, param_dtype, state) -> StepContext:
    if opts.blocks_as_bits:
        as_floats = jax.tree.map(
            lambda x: (
                jax.ShapeDtypeStruct(x.shape, param_dtype)
                if jnp.issubdtype(x.dtype, jnp.unsignedinteger)
                else x
            ),
            state.params,
        )
    else:
        as_floats = state.params
    lay = _layout(opts.tx, opts.abstract if opts.page_params else as_floats, opts.page_params)
    plan, opt = lay.plan, state.opt_state
    leaves = plan.params_def.flatten_up_to(state.params)
    bidx = [i for i, b in enumerate(lay.blocks) if b]
    ridx = [i for i, b in enumerate(lay.blocks) if not b]
    if opts.page_params:
        fp.check_placeholders(leaves, bidx)
    # the step reads the store version the state describes (the pager refuses a stale one)
    # and pages on one token chain from here; the pager reads ahead from now on
    rec = lay.txn.begin(opt.version)
    rest = [leaves[i] for i in ridx]
    stacked = [leaves[i] if opts.blocks_as_bits else _stack_form(leaves[i]) for i in bidx]
    ctx = StepContext(
        opts, lay, plan, opt, leaves, bidx, ridx, rest, stacked,
        [plan.leaves[i].dtype for i in bidx], None, rec, list(opt.ram),
    )  # fmt: skip
    ctx.block = _block_fn(_merged(ctx, rest, stacked).blocks)
    return ctx


def _merged(ctx: StepContext, rest, blocks) -> Any:
    """The model with ``rest`` as its other leaves and ``blocks`` as its block leaves (an
    ``nnx.Module`` with the model protocol's ``embed_tokens``, ``blocks`` and ``logits``)."""
    full = [None] * len(ctx.leaves)
    for i, x in zip(ctx.ridx, rest, strict=True):
        full[i] = x
    for i, x in zip(ctx.bidx, blocks, strict=True):
        full[i] = x
    return nnx.merge(ctx.opts.graphdef, jax.tree.unflatten(ctx.plan.params_def, full))


# the model protocol's two ends (jaxoff.nn): the blocks in between are run here
def _front(ctx: StepContext, rest, tokens):
    return _merged(ctx, rest, ctx.stacked).embed_tokens(tokens)


def _back(ctx: StepContext, rest, h, targets):
    return cross_entropy(_merged(ctx, rest, ctx.stacked).logits(h), targets)


def _train_step(opts: _Options, param_dtype, state, inputs, targets):
    """Fuyou's step (`make_fuyou_step`): forward, the backward scan with the update of the
    layer above inside it, the tail update of the other leaves, the commit."""
    ctx = _context(opts, param_dtype, state)
    # forward: each block's input is saved, nothing else (the block is recomputed)
    x0, front_vjp = jax.vjp(lambda r: _front(ctx, r, inputs), ctx.rest)
    h, saved, top_params = _forward(ctx, x0)
    loss, back_vjp = jax.vjp(lambda r, h: _back(ctx, r, h, targets), ctx.rest, h)
    g_back, gh = back_vjp(jnp.ones((), loss.dtype))
    new_ram = ctx.opts.updater.ram_update(ctx.plan, ctx.inner_ram, {})
    if ctx.opts.page_params:
        sq_b, gh = fp.backward(ctx, saved, top_params, gh)
        new_stacked = [ctx.leaves[i] for i in ctx.bidx]  # the placeholders, as they came
    else:
        sq_b, gh, new_stacked = _backward(ctx, saved, gh)
    (g_front,) = front_vjp(gh)

    # the embeddings, final norm and head: after the scan
    used_front = _used_inputs(lambda r: _front(ctx, r, inputs), ctx.rest)
    used_back = _used_inputs(lambda r: _back(ctx, r, h, targets), ctx.rest)
    new_leaves: list = [None] * len(ctx.leaves)
    for i, ni in zip(ctx.bidx, new_stacked, strict=True):
        new_leaves[i] = ni
    grads = [(gf, gb, uf, ub) for gf, gb, uf, ub in
             zip(g_front, g_back, used_front, used_back, strict=True)]  # fmt: skip
    sq_r = _tail_update(ctx, grads, new_leaves)
    version = _commit(ctx, new_ram)
    params = jax.tree.unflatten(ctx.plan.params_def, new_leaves)
    grad_norm = jnp.sqrt(jnp.sum(sq_b) + sum(sq_r))
    new_opt = FuyouState(version, tuple(new_ram))
    return (TrainState(state.step + 1, params, new_opt), {"loss": loss, "grad_norm": grad_norm})


def _forward(ctx: StepContext, x0):
    """``(h, saved, top_params)``: the blocks' output, each block's input (stacked) and,
    with paged parameters, the top layer's (kept for the backward scan, which
    differentiates it first; else None).

    Both scans slice layer j out of a 16-bit float stacked leaf's bits: XLA's CPU backend
    computes 16-bit floats in float32, dynamic slices and updates included, and would make
    a float32 copy of every such leaf (twice its bytes) and rewrite it whole at every layer.
    Wider floats are sliced as they are (`_stack_form`).
    """
    if ctx.opts.page_params:
        # the pager reads layer j + 1 while layer j computes
        return fp.forward(ctx.rec, ctx.lay, ctx.block, x0)
    h, saved = lax.scan(functools.partial(_forward_body, ctx), x0, jnp.arange(ctx.lay.num_layers))
    return h, saved, None


def _forward_body(ctx: StepContext, h, j):
    return ctx.block(_layer(ctx.stacked, j, ctx.dtypes), h), h


def _backward_layer(ctx: StepContext, blocks, j, h_in, gh):
    """Layer ``j``'s parameters, their gradients, and the gradient of its input."""
    layer = _layer(blocks, j, ctx.dtypes)
    g_layer, gh = ctx.vjp_layer(layer, h_in, gh)
    return layer, g_layer, gh


def _backward(ctx: StepContext, saved, gh):
    """The backward pass over resident blocks: ``(squares, gh, new stack)``.

    Software-pipelined: the scan step of layer j differentiates layer j and updates layer
    j + 1 (whose gradients the previous step computed and carried). The two have no data
    path between them, so the update's takes, arithmetic and puts run while layer j's
    matmuls do. The stacked parameters are the loop's carry, updated in place (with the
    state donated, in the parameters' own buffers: no second copy of the model): layer
    j + 1's new values are written into the stack one step later, at the top of layer
    j - 1's step, before that step slices its layers (j - 1 to differentiate, j to update:
    its old parameters are still in the stack), so every read of the stack follows every
    write and XLA needs no copy of it to keep an old value. The top layer is differentiated
    before the scan, layer 0 updated after it.
    """
    stacked, last = ctx.stacked, ctx.lay.num_layers - 1
    layer, g_layer, gh = _backward_layer(ctx, stacked, last, saved[last], gh)
    top = _like(layer, stacked)  # first written: the top layer, unchanged
    xs = (jnp.arange(last), saved[:last])
    carry = (gh, stacked, g_layer, top, jnp.asarray(last))
    body = functools.partial(_backward_body, ctx)
    carry, sq_up = ctx.rec.scan(body, carry, xs, values=range(last), reverse=True)
    gh, new_stacked, g_layer, pending, pending_j = carry
    layer = _layer(new_stacked, 0, ctx.dtypes)
    new_0, sq_0 = ctx.update_layer(g_layer, layer, lambda env: 0)
    # layer 0 first: its update reads and writes slot 0 of the same stack, in place; written
    # after layer 1's, XLA would read slot 0 from the stack before that write and copy the
    # whole stack to keep it
    new_stacked = _put_layer(new_stacked, _like(new_0, new_stacked), 0)
    new_stacked = _put_layer(new_stacked, pending, pending_j)
    sq_b = jnp.concatenate([sq_0[None], sq_up])
    if not ctx.opts.blocks_as_bits:
        new_stacked = [_unbits(b, d) for b, d in zip(new_stacked, ctx.dtypes, strict=True)]
    return sq_b, gh, new_stacked


def _backward_body(ctx: StepContext, carry, xs, loop):
    """The backward scan's step for layer ``j``: differentiates layer j, updates layer
    j + 1 (see `_backward`)."""
    gh, blocks, g_up, pending, pending_j = carry
    j, h_in = xs
    blocks = _put_layer(blocks, pending, pending_j)
    _, g_layer, gh = _backward_layer(ctx, blocks, j, h_in, gh)
    # layer j + 1's parameters, still the old ones (sliced again, not carried: a carried
    # slice is copied into the loop's buffer at every step)
    p_up = _layer(blocks, j + 1, ctx.dtypes)
    new_up, sq_up = ctx.update_layer(g_up, p_up, lambda env: env[loop] + 1)
    carry = (gh, blocks, g_layer, _like(new_up, blocks), j + 1)
    return carry, sq_up


def _tail_update(ctx: StepContext, grads, new_leaves):
    """The other leaves' updates (embeddings, final norm, head), after the backward scan:
    their gradients ``grads`` per leaf ``(front, back, front used, back used)``. Fills
    ``new_leaves``; returns the squares."""
    sq_r = []
    for i, (gf, gb, uf, ub) in zip(ctx.ridx, grads, strict=True):
        g = gf + gb if uf and ub else (gf if uf else gb)
        sq_r.append(jnp.sum(jnp.square(g.astype(jnp.float32))))
        new_leaves[i] = ctx.update_leaf(ctx.plan.leaves[i], g, ctx.leaves[i])
    return sq_r


def _commit(ctx: StepContext, new_ram) -> jax.Array:
    """Puts the RAM leaves and ends the step (the pager commits it once its writes are
    durable): the new version."""
    ctx.opts.updater.put_ram(ctx.rec, ctx.plan, new_ram)
    ctx.rec.commit()
    return ctx.opt.version + 1

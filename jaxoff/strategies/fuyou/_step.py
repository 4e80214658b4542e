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
from jaxoff.aio import (
    new_token,
    page_flush,
    page_out,
)
from jaxoff.optim.chunks import (
    ChunkUpdater,
    EntryIO,
    Plan,
    commit_gate,
    ram_bytes,
)
from jaxoff.step import cross_entropy

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
    read_slot: jax.Array
    checked: jax.Array  # token: the state checked against the store (`StepCommit.check`)
    inner_ram: list

    @property
    def bleaves(self) -> list:
        return [self.plan.leaves[i] for i in self.bidx]

    @property
    def rleaves(self) -> list:
        return [self.plan.leaves[i] for i in self.ridx]


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
    read_slot = (opt.version % 2).astype(jnp.int32)
    # the state is the store's committed version (`jaxoff.optim.chunks.StepCommit`): every read of
    # the optimizer state follows this check
    assert lay.commits is not None  # `_layout` sets it on every layout it returns
    checked = new_token() + lay.commits.check(opt.version, [*opt.crcs, *opt.params])
    rest = [leaves[i] for i in ridx]
    stacked = [leaves[i] if opts.blocks_as_bits else _stack_form(leaves[i]) for i in bidx]
    ctx = StepContext(
        opts, lay, plan, opt, leaves, bidx, ridx, rest, stacked,
        [plan.leaves[i].dtype for i in bidx], None, read_slot, checked, list(opt.ram),
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
    lay, opt = ctx.lay, ctx.opt
    # forward: each block's input is saved, nothing else (the block is recomputed)
    x0, front_vjp = jax.vjp(lambda r: _front(ctx, r, inputs), ctx.rest)
    h, saved, top_params = _forward(ctx, x0)
    loss, back_vjp = jax.vjp(lambda r, h: _back(ctx, r, h, targets), ctx.rest, h)
    # The last step's commit runs in the background (its cache flush behind this step's
    # forward pass); the first write of this step overwrites the slot of the version before
    # it, so every write follows this gate, which waits for that commit to be durable (and
    # raises its error) once the loss exists.
    gated = commit_gate(lambda: lay.store, lay.store.root, ctx.checked, loss, calls=lay.calls)
    g_back, gh = back_vjp(jnp.ones((), loss.dtype))
    new_ram = ctx.opts.updater.ram_update(ctx.plan, ctx.inner_ram, {})
    new_crcs: list = [None] * (len(ctx.plan.entries) + 1)

    # Reads a layer ahead: the leading chunks (`_read_ahead`: all of them when the layer's
    # state fits the read-ahead budget) of every paged tensor of the layer updated next are
    # prefetched one scan step before its update (in the step that differentiates it), so
    # the update takes chunks already in staging; the top layer's and the other leaves' are
    # prefetched now, before the backward pass.
    tables = (_per_leaf(opt.crcs, ctx.bleaves), _per_leaf(lay.fids, ctx.bleaves),
              _per_leaf(lay.offs, ctx.bleaves))  # fmt: skip
    rest_tables = [_per_leaf(t, ctx.rleaves) for t in (opt.crcs, lay.fids, lay.offs)]
    rest_heads = _prefetch_heads(ctx, ctx.rleaves, *rest_tables)
    last = lay.num_layers - 1
    top_heads = _layer_heads(ctx, *jax.tree.map(lambda t: t[last], tables))
    pcrcs_b: list = []
    if ctx.opts.page_params:
        crcs_b, sq_b, pcrcs_b, gh, tok = fp.backward(
            lay, opt.params, ctx.read_slot, 1 - ctx.read_slot, tables, saved, top_params, gh,
            functools.partial(_vjp_layer, ctx), functools.partial(_update_layer, ctx),
            functools.partial(_layer_heads, ctx), top_heads, gated,
        )  # fmt: skip
        new_stacked = [ctx.leaves[i] for i in ctx.bidx]  # the placeholders, as they came
    else:
        crcs_b, sq_b, gh, tok, new_stacked = _backward(ctx, tables, saved, gh, top_heads, gated)
    for leaf, cs in zip(ctx.bleaves, crcs_b, strict=True):
        for k, c in zip(leaf.entries, cs, strict=True):
            new_crcs[k] = c
    (g_front,) = front_vjp(gh)

    # the embeddings, final norm and head: after the scan
    used_front = _used_inputs(lambda r: _front(ctx, r, inputs), ctx.rest)
    used_back = _used_inputs(lambda r: _back(ctx, r, h, targets), ctx.rest)
    new_leaves: list = [None] * len(ctx.leaves)
    for i, ni in zip(ctx.bidx, new_stacked, strict=True):
        new_leaves[i] = ni
    grads = [(gf, gb, uf, ub) for gf, gb, uf, ub in
             zip(g_front, g_back, used_front, used_back, strict=True)]  # fmt: skip
    sq_r, tok = _tail_update(ctx, grads, rest_heads, rest_tables, tok, new_leaves, new_crcs)
    version = _commit(ctx, new_crcs, new_ram, pcrcs_b, tok, gated)
    params = jax.tree.unflatten(ctx.plan.params_def, new_leaves)
    grad_norm = jnp.sqrt(jnp.sum(sq_b) + sum(sq_r))
    new_opt = FuyouState(version, tuple(new_crcs), tuple(new_ram), tuple(pcrcs_b))
    from jaxoff.step import TrainState

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
        # layer j + 1's reads run while layer j computes
        return fp.forward(ctx.lay, ctx.opt.params, ctx.read_slot, ctx.block, x0)
    h, saved = lax.scan(functools.partial(_forward_body, ctx), x0, jnp.arange(ctx.lay.num_layers))
    return h, saved, None


def _forward_body(ctx: StepContext, h, j):
    return ctx.block(_layer(ctx.stacked, j, ctx.dtypes), h), h


def _per_leaf(table, leaves) -> list:
    """``table`` (per plan entry) grouped per leaf of ``leaves``."""
    return [[table[k] for k in leaf.entries] for leaf in leaves]


def _leaf_ios(ctx: StepContext, leaf, fids, offs) -> list:
    return [
        EntryIO(f, o, ctx.plan.entries[k].storage)
        for k, f, o in zip(leaf.entries, fids, offs, strict=True)
    ]


def _update_leaf(ctx: StepContext, leaf, g, p, heads, crcs, fids, offs, tok):
    """One leaf's paged update (`ChunkUpdater.update_leaf`): ``(new, crcs, token)``."""
    return ctx.opts.updater.update_leaf(
        ctx.lay.table, ctx.plan, leaf, g, p, ctx.inner_ram, _leaf_ios(ctx, leaf, fids, offs),
        crcs, ctx.read_slot, tok, extra={}, heads=heads,
    )  # fmt: skip


def _prefetch_heads(ctx: StepContext, leaves, crcs, fids, offs) -> list:
    """Tickets of the leading chunks (`_read_ahead`) of every entry of ``leaves`` (of one
    layer, for block leaves), for `_update_leaf`'s ``heads``: issued a layer ahead of the
    update, so that its reads are not waited for (in order, after the state's check and no
    write of this step: nothing reads what this step writes)."""
    tok, heads = ctx.checked, []
    for leaf, c, f, o in zip(leaves, crcs, fids, offs, strict=True):
        sizes = ctx.lay.head_sizes.get(leaf.index)
        if not sizes:
            heads.append(None)
            continue
        ios = _leaf_ios(ctx, leaf, f, o)
        t = ctx.opts.updater.prefetch_chunks(ctx.lay.table, ios, c, ctx.read_slot, sizes, tok)
        heads.append(t)
        tok = t[-1][-1]
    return heads


def _layer_heads(ctx: StepContext, crcs, fids, offs) -> list:
    """`_prefetch_heads` of one layer's block leaves (tables indexed by that layer)."""
    return _prefetch_heads(ctx, ctx.bleaves, crcs, fids, offs)


def _vjp_layer(ctx: StepContext, layer, h_in, gh):
    """The gradients of a layer's parameters (flat) and of its input.

    Flat: a gradient is carried to the next scan step, whose update reads it as a flat array.
    Carried in its own shape, XLA's CPU layout assignment gave a 2-D gradient a column-major
    layout, and transposed it into row-major order twice (for the squares and for the
    update), ~3x the time of that layer's matmuls at d = 2048.
    """
    _, vjp = jax.vjp(ctx.block, layer, h_in)
    g_layer, gh = vjp(gh)
    return [g.reshape(-1) for g in g_layer], gh


def _backward_layer(ctx: StepContext, blocks, j, h_in, gh):
    """Layer ``j``'s parameters, their gradients, and the gradient of its input."""
    layer = _layer(blocks, j, ctx.dtypes)
    g_layer, gh = _vjp_layer(ctx, layer, h_in, gh)
    return layer, g_layer, gh


def _update_layer(ctx: StepContext, g_layer, layer, heads, crcs, fids, offs, tok):
    """One layer's paged update: its new parameters, crcs and squares."""
    new_layer, out_crcs, sq = [], [], []
    for leaf, g, p, hd, c, f, o in zip(
        ctx.bleaves, g_layer, layer, heads, crcs, fids, offs, strict=True
    ):
        p_new, c_new, tok = _update_leaf(ctx, leaf, g, p, hd, c, f, o, tok)
        new_layer.append(p_new)
        out_crcs.append(c_new)
        sq.append(jnp.sum(jnp.square(g.astype(jnp.float32))))
    return new_layer, out_crcs, jnp.stack(sq), tok


def _backward(ctx: StepContext, tables, saved, gh, top_heads, gated):
    """The backward pass over resident blocks: ``(crcs, squares, gh, token, new stack)``.

    Software-pipelined: the scan step of layer j differentiates layer j and updates layer
    j + 1 (whose gradients the previous step computed and carried). The two have no data
    path between them, so the update's page reads, arithmetic and writes run while layer
    j's matmuls do. The stacked parameters are the loop's carry, updated in place (with the
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
    xs = (
        jnp.arange(last),
        saved[:last],
        jax.tree.map(lambda t: t[1:], tables),
        jax.tree.map(lambda t: t[:last], tables),
    )
    carry = (gh, gated, stacked, g_layer, top_heads, top, jnp.asarray(last))
    body = functools.partial(_backward_body, ctx)
    carry, (crcs_up, sq_up) = lax.scan(body, carry, xs, reverse=True)
    gh, tok, new_stacked, g_layer, heads_0, pending, pending_j = carry
    first = jax.tree.map(lambda t: t[0], tables)
    layer = _layer(new_stacked, 0, ctx.dtypes)
    new_0, crcs_0, sq_0, tok = _update_layer(ctx, g_layer, layer, heads_0, *first, tok=tok)
    # layer 0 first: its update reads and writes slot 0 of the same stack, in place; written
    # after layer 1's, XLA would read slot 0 from the stack before that write and copy the
    # whole stack to keep it
    new_stacked = _put_layer(new_stacked, _like(new_0, new_stacked), 0)
    new_stacked = _put_layer(new_stacked, pending, pending_j)
    crcs_b = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), crcs_0, crcs_up)
    sq_b = jnp.concatenate([sq_0[None], sq_up])
    if not ctx.opts.blocks_as_bits:
        new_stacked = [_unbits(b, d) for b, d in zip(new_stacked, ctx.dtypes, strict=True)]
    return crcs_b, sq_b, gh, tok, new_stacked


def _backward_body(ctx: StepContext, carry, xs):
    """The backward scan's step for layer ``j``: differentiates layer j, updates layer
    j + 1 (see `_backward`)."""
    gh, tok, blocks, g_up, heads_up, pending, pending_j = carry
    j, h_in, up_tables, tables_j = xs  # layer j + 1's tables, layer j's
    heads_j = _layer_heads(ctx, *tables_j)  # for the next step's update of layer j
    blocks = _put_layer(blocks, pending, pending_j)
    _, g_layer, gh = _backward_layer(ctx, blocks, j, h_in, gh)
    # layer j + 1's parameters, still the old ones (sliced again, not carried: a carried
    # slice is copied into the loop's buffer at every step)
    p_up = _layer(blocks, j + 1, ctx.dtypes)
    new_up, crcs_up, sq_up, tok = _update_layer(ctx, g_up, p_up, heads_up, *up_tables, tok=tok)
    carry = (gh, tok, blocks, g_layer, heads_j, _like(new_up, blocks), j + 1)
    return carry, (crcs_up, sq_up)


def _tail_update(ctx: StepContext, grads, heads, tables, tok, new_leaves, new_crcs):
    """The other leaves' updates (embeddings, final norm, head), after the backward scan:
    their gradients ``grads`` per leaf ``(front, back, front used, back used)``. Fills
    ``new_leaves`` and ``new_crcs``; returns ``(squares, token)``."""
    sq_r = []
    for i, (gf, gb, uf, ub), hd, c, f, o in zip(ctx.ridx, grads, heads, *tables, strict=True):
        g = gf + gb if uf and ub else (gf if uf else gb)
        g = lax.optimization_barrier(g)
        sq_r.append(jnp.sum(jnp.square(g.astype(jnp.float32))))
        leaf = ctx.plan.leaves[i]
        p_new, cs, tok = _update_leaf(ctx, leaf, g, ctx.leaves[i], hd, c, f, o, tok)
        new_leaves[i] = p_new
        for k, c in zip(leaf.entries, cs, strict=True):
            new_crcs[k] = c
    return sq_r, tok


def _commit(ctx: StepContext, new_crcs, new_ram, pcrcs, tok, gated) -> jax.Array:
    """Writes the RAM leaves, flushes every write of the step and commits (`StepCommit`):
    the new version. Fills ``new_crcs``' last (the ``ram`` entry's)."""
    lay = ctx.lay
    crc, tok_ram = page_out(
        lay.table,
        jnp.asarray(lay.fids[-1])[1 - ctx.read_slot, 0],
        jnp.asarray(lay.offs[-1])[0],
        ram_bytes(ctx.plan, new_ram),
        gated,
    )
    new_crcs[-1] = crc.reshape(1)
    # every write of the step is durable before the commit (write-behind ones included)
    flushed = page_flush(lay.table, tok + tok_ram)
    opt = ctx.opt
    assert lay.commits is not None  # `_layout` sets it on every layout it returns
    return lay.commits.commit(opt.version, [*opt.crcs, *opt.params], [*new_crcs, *pcrcs], flushed)

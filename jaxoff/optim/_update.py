"""The traced update of a `paged` optimizer: every leaf, chunk by chunk, through the step's
paging transaction (`jaxoff.optim.chunks.PageTransaction`): begin (the state's version),
each leaf's takes and puts, the RAM leaves' entry, commit."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxoff.optim import _chunk
from jaxoff.optim._codec import ram_bytes
from jaxoff.optim._pipeline import fixed_names, page_leaf
from jaxoff.optim._plan import RAM_ENTRY, canonical, check_index_range
from jaxoff.optim._state import PagedState, make_state


def paged_update(pager, grads, state: PagedState, params, *, apply: bool, extra: dict):
    """`Pager.update` and `Pager.apply`: the traced update of every leaf, chunk by chunk, in
    one paging transaction."""
    if params is None:
        raise ValueError("jaxoff.paged needs the parameters: call tx.update(grads, state, params)")
    out_def = jax.tree.structure(params)  # the result keeps the caller's wrappers
    params, grads = canonical(params), canonical(grads)
    plan = pager.plan(params)
    txn = pager.transaction(plan)
    ram = list(state.ram)
    if len(ram) != len(plan.ram_avals):
        raise ValueError(
            "jaxoff.paged: this optimizer state does not belong to these parameters (it "
            f"holds {len(ram)} RAM leaves, the plan {len(plan.ram_avals)}); make it with "
            "tx.init(params)"
        )
    pre_ram, inner_ram = ram[: plan.num_pre], ram[plan.num_pre :]
    if pager.pre is not None:
        pre_state = jax.tree.unflatten(plan.pre_def, pre_ram)
        grads, pre_state = pager.pre.update(grads, pre_state, params, **extra)
        pre_ram = jax.tree.leaves(pre_state)
    new_inner_ram = _chunk.ram_update(plan, pager.inner, pager.master_dtype, inner_ram, extra)
    g_leaves = plan.params_def.flatten_up_to(grads)
    p_leaves = plan.params_def.flatten_up_to(params)
    # The step reads the version the state describes (the pager refuses a stale state) and
    # writes the next one; the pager reads ahead in the plan's order from here on.
    rec = txn.begin(state.version)
    outs = []
    for leaf, g, p in zip(plan.leaves, g_leaves, p_leaves, strict=True):
        names = fixed_names([plan.entries[k].name for k in leaf.entries])
        outs.append(
            update_leaf(pager, rec, plan, leaf, g, p, inner_ram, names, extra=extra, apply=apply)
        )
    new_ram = tuple(pre_ram) + tuple(new_inner_ram)
    rec.put(lambda env: (RAM_ENTRY, 0), ram_bytes(plan, new_ram))
    rec.commit()
    out_tree = jax.tree.unflatten(out_def, outs)
    return out_tree, make_state(plan, pager.root, state.version + 1, new_ram)


def update_leaf(pager, rec, plan, leaf, grads, params, ram, names, *, extra, apply):
    """Pages ``params`` (leaf ``leaf`` of ``plan``, or a contiguous part of it that the store
    entries ``names`` hold, e.g. one layer of a stacked leaf) through the update in the step
    ``rec``: chunk by chunk, `_LeafUpdate.chunk` between each chunk's takes and puts, inside
    a `one_trip` scan. Returns the new parameters (``apply``) or float32 updates, shaped as
    ``params``."""
    check_index_range(leaf.name, params.size, leaf.chunk_elems)
    n_full, tail = divmod(params.size, leaf.chunk_elems)
    storages = [plan.entries[k].storage for k in leaf.entries]
    g_flat, p_flat = grads.reshape(-1), params.reshape(-1)
    update = _LeafUpdate(pager, plan, leaf, g_flat, p_flat, ram, extra, apply)

    def pipeline(out):
        return page_leaf(rec, names, storages, leaf.chunk_elems, n_full, tail, out, update.chunk)

    out = update.p_flat if apply else jnp.zeros((params.size,), pager.master_dtype)
    # The pipeline reads materialised gradients (see `one_trip`): fused into some chunks'
    # updates and not others, the last ops of the gradient (or of clipping, or of a sum of
    # gradient contributions) would change FMA contraction and hence the last bit.
    return one_trip(rec, pipeline, out).reshape(params.shape)


@dataclasses.dataclass(frozen=True)
class _LeafUpdate:
    """One leaf's update, chunk by chunk: its flat gradients and parameters, the inner
    optimizer's RAM leaves, the extra arguments of its update, and whether the result is
    the new parameters (``apply``) or float32 updates."""

    pager: Any
    plan: Any
    leaf: Any
    g_flat: jax.Array
    p_flat: jax.Array
    inner_ram: Any
    extra: dict
    apply: bool

    def chunk(self, i, n, chunks):
        """Chunk ``i`` (``n`` elements) of the leaf updated from its paged ``chunks``:
        ``(the chunk's result, the chunks to write)``."""
        leaf, plan = self.leaf, self.plan
        start = i * leaf.chunk_elems
        g = _slice_bits(self.g_flat, start, n)
        p_ram = _slice_bits(self.p_flat, start, n)
        entries = [plan.entries[k] for k in leaf.entries]
        chunks = [x.astype(e.dtype) for e, x in zip(entries, chunks, strict=True)]
        p_in, states = (chunks[0], chunks[1:]) if leaf.master else (p_ram, chunks)
        u, new_states = chunk_update(
            self.pager, plan, leaf.index, g, p_in, states, self.inner_ram, self.extra
        )
        # The new parameters are computed here, fused with the update as plain optax fuses
        # them (XLA contracts a*b+c to FMA inside a fusion); the returned updates are then
        # the exact difference, so that optax.apply_updates(params, updates) reproduces them.
        new_p = cast(jax.Array, optax.apply_updates(p_in, u))  # a chunk in, an array out
        if leaf.master:
            writes = [new_p, *new_states]
            new_param = new_p.astype(leaf.dtype)
        else:
            writes = list(new_states)
            new_param = new_p
        out = new_param if self.apply else exact_delta(new_param, p_ram)
        return out, [w.astype(e.storage) for e, w in zip(entries, writes, strict=True)]


def chunk_update(pager, plan, j, g, p, states, inner_ram, extra):
    """`_chunk.chunk_update` of leaf ``j``, traced once per leaf and chunk shape
    (`_chunk.traced_once`). Extra arguments (a user's ``value=`` and the like) are passed
    as they are, untraced, by the plain call."""
    args = (g, p, states, inner_ram)
    if extra or not all(isinstance(x, jax.Array) for x in jax.tree.leaves(args)):
        return _chunk.chunk_update(
            plan, pager.inner, pager.master_dtype, j, g, p, states, inner_ram, extra=extra
        )
    key = (id(plan), j)
    if key not in pager._chunk_fns:  # the plan kept alive with it: its id stays its own
        pager._chunk_fns[key] = (
            plan,
            _chunk.traced_once(plan, pager.inner, pager.master_dtype, j),
        )
    return pager._chunk_fns[key][1](*args)


def one_trip(rec, fn, carry):
    """``fn(carry)``, run as the body of a one-trip scan of the step ``rec``.

    XLA:CPU removes optimization barriers before fusion, so a barrier does not keep the
    last ops of a leaf's gradient (clipping's ``g / norm * max_norm``, a sum of gradient
    contributions, ...) out of the fused chunk updates; fused, they change how LLVM contracts
    the update's multiply-adds to FMA, hence its last bit (and only in the chunks outside the
    pipeline's scan, which reads the gradient as a loop operand). A loop's operands are
    materialised buffers: every chunk reads the gradient from memory, as plain optax reads
    a jitted update's argument. The body's paging calls have side effects, so XLA keeps the
    loop although it runs once.
    """
    carry, _ = rec.scan(lambda c, x, loop: (fn(c), None), carry, None, values=(0,), length=1)
    return carry


def _slice_bits(flat: jax.Array, start, n: int) -> jax.Array:
    """``flat[start:start + n]``, sliced as raw bits for 16-bit floats.

    XLA's CPU backend upcasts bfloat16 ops to float32; a bfloat16 slice inside the chunk
    loop becomes a slice of the whole leaf converted to float32, which loop-invariant code
    motion then hoists out of the loop: a float32 copy of every gradient leaf at once.
    Slicing the bits as uint16 keeps the loop's temporaries at chunk size.
    """
    if flat.dtype.itemsize != 2 or not jnp.issubdtype(flat.dtype, jnp.floating):
        return lax.dynamic_slice(flat, (start,), (n,))
    bits = lax.bitcast_convert_type(flat, jnp.uint16)
    return lax.bitcast_convert_type(lax.dynamic_slice(bits, (start,), (n,)), flat.dtype)


def exact_delta(new: jax.Array, old: jax.Array) -> jax.Array:
    """float32 ``u`` with ``old + u == new`` exactly (in float32) wherever one exists.

    ``new - old`` is exact when the two are within a factor of two (Sterbenz); otherwise it
    can be one ulp off, which a nudge towards the target repairs.
    """
    new, old = new.astype(jnp.float32), old.astype(jnp.float32)
    u = new - old
    for _ in range(2):
        # The barrier keeps XLA from simplifying old + (new - old) to new.
        r = old + lax.optimization_barrier(u)
        u = jnp.where(r == new, u, jnp.nextafter(u, jnp.where(new > r, jnp.inf, -jnp.inf)))
    return u

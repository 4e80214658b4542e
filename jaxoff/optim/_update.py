"""The traced update of a `paged` optimizer: every leaf, chunk by chunk, through the split-phase
paging pipeline, between the state's check and the commit (`jaxoff.optim.chunks.StepCommit`)."""

from __future__ import annotations

import functools
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxoff import _faults
from jaxoff.aio._ffi_calls import new_token, page_flush, page_out
from jaxoff.aio._host_call import HostCalls, host_call
from jaxoff.optim import _chunk
from jaxoff.optim._codec import ram_bytes
from jaxoff.optim._commit import commit_gate
from jaxoff.optim._pipeline import page_leaf, prefetch_chunk
from jaxoff.optim._plan import canonical
from jaxoff.optim._state import PagedState, make_state


def paged_update(pager, grads, state: PagedState, params, *, apply: bool, extra: dict):
    """`Pager.update` and `Pager.apply`: the traced update of every leaf, chunk by chunk,
    between the state's check and the commit (`StepCommit`)."""
    if params is None:
        raise ValueError("jaxoff.paged needs the parameters: call tx.update(grads, state, params)")
    out_def = jax.tree.structure(params)  # the result keeps the caller's wrappers
    params, grads = canonical(params), canonical(grads)
    plan = pager.plan(params)
    pager.open_store(plan)
    ios = pager._ios
    ram = list(state.ram)
    if len(ram) != len(plan.ram_avals) or len(state.crcs) != len(ios):
        raise ValueError(
            "jaxoff.paged: this optimizer state does not belong to these parameters (it "
            f"holds {len(ram)} RAM leaves and {len(state.crcs)} store entries, the plan "
            f"{len(plan.ram_avals)} and {len(ios)}); make it with tx.init(params)"
        )
    pre_ram, inner_ram = ram[: plan.num_pre], ram[plan.num_pre :]
    if pager.pre is not None:
        pre_state = jax.tree.unflatten(plan.pre_def, pre_ram)
        grads, pre_state = pager.pre.update(grads, pre_state, params, **extra)
        pre_ram = jax.tree.leaves(pre_state)
    new_inner_ram = _chunk.ram_update(plan, pager.inner, pager.master_dtype, inner_ram, extra)
    read_slot = (state.version % 2).astype(jnp.int32)
    g_leaves = plan.params_def.flatten_up_to(grads)
    p_leaves = plan.params_def.flatten_up_to(params)
    outs, tokens = [], []
    new_crcs: list[Any] = [None] * len(ios)  # each entry's checksums, all filled below
    # One token runs through all leaves: leaf k+1's first read waits for leaf k's last
    # write, so XLA cannot schedule every leaf's prologue at once (bounded buffers).
    # The first read waits for the check that the state describes the store's committed
    # version: a stale state (e.g. restored without its pages) is refused with its cause.
    tok = new_token() + pager.commits.check(state.version, state.crcs)
    split = pager.engine.pool_bytes >= pager.split_phase_bytes(plan)
    # Head start: the first chunks of the step (in paging order, as many as the staging
    # left over by the pipeline holds) are prefetched now. Nothing here depends on the
    # gradients, so their reads run during the forward and backward passes.
    heads = pager._head_chunks(plan) if split else [0] * len(plan.leaves)
    head_tickets = []
    for leaf, h in zip(plan.leaves, heads, strict=True):
        leaf_ios = [ios[k] for k in leaf.entries]
        leaf_crcs = [state.crcs[k] for k in leaf.entries]
        tickets = []
        for i in range(h):
            tickets.append(
                prefetch_chunk(
                    pager.table, leaf_ios, leaf_crcs, read_slot, i, leaf.chunk_size(i), tok
                )
            )
            tok = tickets[-1][-1]
        head_tickets.append(tickets)
    # The previous step's commit runs in the background (its cache flush behind this
    # step's forward and backward passes); this step's first write overwrites the slot
    # of the version before it, so every write waits for it to be durable. The gate
    # reads a gradient, so it runs once backward has produced one, by when the commit
    # is long done.
    tok = tok + commit_gate(lambda: pager.store, pager.root, tok, g_leaves[0], calls=pager.calls)
    gated = tok
    for leaf, g, p, head in zip(plan.leaves, g_leaves, p_leaves, head_tickets, strict=True):
        compute = functools.partial(
            pager._compute, plan, leaf, g.reshape(-1), p.reshape(-1), inner_ram, extra, apply
        )
        pipeline = functools.partial(
            page_leaf,
            pager.table,
            [ios[k] for k in leaf.entries],
            [state.crcs[k] for k in leaf.entries],
            read_slot,
            leaf.chunk_elems,
            leaf.n_full,
            leaf.tail,
        )
        out = p.reshape(-1) if apply else jnp.zeros((leaf.size,), pager.master_dtype)
        # The pipeline reads materialised gradients (see _one_trip): fused into some
        # chunks' updates and not others, the last ops of the gradient (or of clipping)
        # would change FMA contraction and hence the last bit.
        out, crcs, tok = _one_trip(pipeline, out, compute, tok, split_phase=split, head=head)
        for k, c in zip(leaf.entries, crcs, strict=True):
            new_crcs[k] = c
        outs.append(out.reshape(leaf.shape))
        if leaf.index == 0 and _faults.armed("store.write"):
            tok = tok + _write_fault_point(tok)
        tokens.append(tok)
    new_ram = tuple(pre_ram) + tuple(new_inner_ram)
    ram_io = ios[-1]
    crc, tok = page_out(
        pager.table,
        jnp.asarray(ram_io.file_ids)[1 - read_slot, 0],
        jnp.asarray(ram_io.offsets)[0],
        ram_bytes(plan, new_ram),
        gated,
    )
    new_crcs[-1] = crc.reshape(1)
    tokens.append(tok)
    # The commit follows every write of the step onto disk: write-behind writes included.
    # Its order is data: it waits for the flush token, and the next step reads the
    # version it returns. (ordered=True would add an effect token, which jax 0.10.2
    # cannot lower next to outputs placed in host memory.)
    tokens = [page_flush(pager.table, functools.reduce(jnp.add, tokens))]
    version = pager.commits.commit(state.version, state.crcs, new_crcs, tuple(tokens))
    out_tree = jax.tree.unflatten(out_def, outs)
    return out_tree, make_state(plan, pager.root, version, new_crcs, new_ram)


def compute_chunk(pager, plan, leaf, g_flat, p_flat, inner_ram, extra, apply, i, n, chunks):
    start = i * leaf.chunk_elems
    g = _slice_bits(g_flat, start, n)
    p_ram = _slice_bits(p_flat, start, n)
    entries = [plan.entries[k] for k in leaf.entries]
    chunks = [x.astype(e.dtype) for e, x in zip(entries, chunks, strict=True)]
    p_in, states = (chunks[0], chunks[1:]) if leaf.master else (p_ram, chunks)
    u, new_states = chunk_update(pager, plan, leaf.index, g, p_in, states, inner_ram, extra)
    # The new parameters are computed here, fused with the update as plain optax fuses
    # them (XLA contracts a*b+c to FMA inside a fusion); the returned updates are then the
    # exact difference, so that optax.apply_updates(params, updates) reproduces them.
    new_p = cast(jax.Array, optax.apply_updates(p_in, u))  # a chunk in, an array out
    if leaf.master:
        writes = [new_p, *new_states]
        new_param = new_p.astype(leaf.dtype)
    else:
        writes = list(new_states)
        new_param = new_p
    out = new_param if apply else exact_delta(new_param, p_ram)
    return out, [w.astype(e.storage) for e, w in zip(entries, writes, strict=True)]


def chunk_update(pager, plan, j, g, p, states, inner_ram, extra):
    """`_chunk.chunk_update` of leaf ``j``, traced once per leaf and chunk shape
    (`_chunk.traced_once`). Extra arguments (a user's ``value=`` and the like) are passed
    as they are, untraced, by the plain call."""
    args = (g, p, states, inner_ram)
    if extra or not all(isinstance(x, jax.Array) for x in jax.tree.leaves(args)):
        return _chunk.chunk_update(
            plan, pager.inner, pager.master_dtype, j, g, p, states, inner_ram, extra
        )
    key = (id(plan), j)
    if key not in pager._chunk_fns:  # the plan kept alive with it: its id stays its own
        pager._chunk_fns[key] = (
            plan,
            _chunk.traced_once(plan, pager.inner, pager.master_dtype, j),
        )
    return pager._chunk_fns[key][1](*args)


_FAULT_CALLS = HostCalls("jaxoff.fault")


def _write_fault_point(tok: jax.Array) -> jax.Array:
    """Fault point ``store.write`` as a host callback between the first leaf's page writes and
    the next leaf's (and the commit): the writes happen inside FFI calls of the jitted step,
    so a callback ordered by the paging token is the one Python-level place between chunk
    writes of a step. Only traced when ``JAXOFF_FAULT`` arms it: a plain step has none."""

    def visit(t):
        del t
        _faults.point("store.write")
        return np.zeros((), np.int32)

    return host_call(
        visit, jax.ShapeDtypeStruct((), jnp.int32), tok, name=_FAULT_CALLS.name("write")
    )


def _one_trip(fn, carry, *args, **kwargs):
    """``fn(carry, *args, **kwargs)`` (a tuple, carry first), run as the body of a one-trip loop.

    XLA:CPU removes optimization barriers before fusion, so a barrier does not keep the
    last ops of a leaf's gradient (clipping's ``g / norm * max_norm``, a sum of gradient
    contributions, ...) out of the fused chunk updates; fused, they change how LLVM contracts
    the update's multiply-adds to FMA, hence its last bit (and only in the chunks outside the
    pipeline's scan, which reads the gradient as a loop operand). A loop's operands are
    materialised buffers: every chunk reads the gradient from memory, as plain optax reads
    a jitted update's argument. The body's paging calls have side effects, so XLA keeps the
    loop although it runs once.
    """

    def body(c, _):
        c, *rest = fn(c, *args, **kwargs)
        return c, tuple(rest)

    carry, rest = lax.scan(body, carry, None, length=1)
    return (carry, *(jax.tree.map(lambda x: x[0], r) for r in rest))


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

"""The plan of a paged optimizer: which tensors go to the page store, and under which names.

For each parameter leaf: an fp32 master copy (only when the parameter's dtype is not the master
dtype) and every per-parameter tensor of the inner optimizer state (Adam's ``mu`` and ``nu``,
...). Everything else of the state (step counts, the state of global operations run before the
pipeline) stays in RAM and is also written, as raw bytes, to the store entry ``ram`` so that
every committed version of the store is a complete optimizer state.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxoff.optim._checks import NotElementwiseError

RAM_ENTRY = "ram"
STORAGE_ITEMSIZE = 4  # every paged entry is stored with 4-byte elements: chunks line up


@dataclasses.dataclass(frozen=True)
class EntryPlan:
    """One page store entry: a master copy or one state tensor of one parameter leaf."""

    name: str
    leaf: int  # index of the parameter leaf
    node: int  # -1 for the master copy, else index of the per-parameter state subtree
    dtype: np.dtype  # dtype the optimizer sees
    storage: np.dtype  # dtype on disk (4-byte; float16/bfloat16 widen exactly to float32)


@dataclasses.dataclass(frozen=True)
class LeafPlan:
    """One parameter leaf and how it is cut into chunks."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype  # the parameter's dtype
    master: bool  # whether an fp32 master copy is paged (params are not the master)
    chunk_elems: int
    entries: tuple[int, ...]  # indices into Plan.entries, master (if any) first

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def n_full(self) -> int:
        return self.size // self.chunk_elems

    @property
    def tail(self) -> int:
        return self.size % self.chunk_elems

    @property
    def num_chunks(self) -> int:
        return self.n_full + (1 if self.tail else 0)

    def chunk_size(self, i: int) -> int:
        return self.chunk_elems if i < self.n_full else self.tail

    def chunk_shape(self, n: int) -> tuple[int, ...]:
        # A chunk keeps the leaf's rank, so masks such as ``lambda p: p.ndim > 1`` still work.
        return (1,) * (len(self.shape) - 1) + (n,) if self.shape else ()

    def empty_shape(self) -> tuple[int, ...]:
        return (0,) * len(self.shape)

    def one_shape(self) -> tuple[int, ...]:
        return (1,) * len(self.shape)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a paged optimizer's state for one parameter tree is cut into store entries and
    chunks (`make_plan`; ``ChunkUpdater.plan``): per parameter leaf a `LeafPlan`, the store
    entries (`EntryPlan`: masters and state tensors), the inner state's tree with its RAM
    leaves, and `store_entries`, the page store layout it needs."""

    params_def: Any
    leaves: tuple[LeafPlan, ...]
    entries: tuple[EntryPlan, ...]
    state_def: Any  # treedef of the inner state's nodes (per-parameter subtrees or RAM leaves)
    nodes: tuple[tuple[str, int], ...]  # per node: ("paged", subtree index) | ("ram", index)
    # per paged subtree: dtype per parameter leaf, None where the subtree holds an
    # ``optax.MaskedNode`` (masked, multi_transform: that leaf has no such state)
    node_dtypes: tuple[tuple[np.dtype | None, ...], ...]
    pre_def: Any  # treedef of the state of the global ops run before the pipeline
    ram_avals: tuple[jax.ShapeDtypeStruct, ...]  # pre-state leaves, then inner RAM leaves
    num_pre: int
    # chunk updates see leaf j alone (other leaves optax.MaskedNode); False where the inner
    # transformation cannot take such trees (see `_chunk.one_leaf_plan`)
    one_leaf: bool = True

    @property
    def ram_nbytes(self) -> int:
        n = sum(math.prod(a.shape) * _byte_width(a.dtype) for a in self.ram_avals)
        return max(4, -(-n // 4) * 4)

    def ram_entry(self) -> tuple[str, tuple[tuple[int, ...], np.dtype]]:
        """``(name, (shape, dtype))`` of the store entry holding the RAM leaves' bytes: the
        last entry of `store_entries`, and of a strategy's own layout."""
        return RAM_ENTRY, ((self.ram_nbytes,), np.dtype(np.uint8))

    def store_entries(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        out = {e.name: (self.leaves[e.leaf].shape, e.storage) for e in self.entries}
        name, spec = self.ram_entry()
        out[name] = spec
        return out


def canonical(tree):
    """``tree`` with Flax ``nnx.Variable`` wrappers replaced by their values.

    ``nnx.Optimizer`` calls ``init`` on ``nnx.state(model, wrt)`` (leaves wrapped in
    Variables, whose value adds a level to every path) and ``update`` on the pure arrays;
    both must plan the same store entries.
    """
    nnx = sys.modules.get("flax.nnx")
    if nnx is None:
        return tree
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    if not any(is_var(x) for x in jax.tree.leaves(tree, is_leaf=is_var)):
        return tree
    return jax.tree.map(lambda x: x.get_value() if is_var(x) else x, tree, is_leaf=is_var)


def _byte_width(dtype) -> int:
    return 1 if np.dtype(dtype) == np.bool_ else np.dtype(dtype).itemsize


def path_name(path) -> str:
    """A parameter path as store entry names spell it (``blocks.attn.q.kernel``)."""
    name = jax.tree_util.keystr(tuple(path), simple=True, separator=".")
    return name or "root"


def param_tree_matcher(params_def, params_leaves):
    """``is_leaf`` for state trees: true on subtrees shaped like the parameters.

    Such a subtree may hold ``optax.MaskedNode()`` in place of some leaves (the state of
    ``optax.masked`` and of each group of ``optax.multi_transform``).
    """
    shapes = [tuple(np.shape(x)) for x in params_leaves]
    if params_def.num_nodes == 1:  # parameters are a bare array: match arrays of its shape
        return lambda x: hasattr(x, "shape") and tuple(x.shape) == shapes[0] and len(shapes[0]) > 0

    def match(x) -> bool:
        if x is None or isinstance(x, optax.MaskedNode) or hasattr(x, "shape"):
            return False
        try:
            items = params_def.flatten_up_to(x)
        except (ValueError, TypeError):
            return False
        present = [i for i in items if not isinstance(i, optax.MaskedNode)]
        return bool(present) and all(
            isinstance(i, optax.MaskedNode)
            or (hasattr(i, "shape") and hasattr(i, "dtype") and tuple(i.shape) == s)
            for i, s in zip(items, shapes, strict=True)
        )

    return match


def storage_dtype(dtype: np.dtype, what: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.itemsize == STORAGE_ITEMSIZE:
        return dtype
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < STORAGE_ITEMSIZE:
        return np.dtype(np.float32)  # exact both ways
    raise NotElementwiseError(
        f"jaxoff.paged cannot page {what} of dtype {dtype}: paged tensors must have 4-byte "
        "elements (or 2-byte floats, stored widened)"
    )


def check_index_range(name: str, size: int, chunk_elems: int) -> None:
    """Refuses paging ``size`` elements of parameter ``name`` in one pass: its chunks are
    indexed with int32 (``chunk * chunk_elems``), so the part must hold fewer than
    ``2**31 - chunk_elems`` elements."""
    if size >= 2**31 - chunk_elems:
        raise NotElementwiseError(
            f"parameter {name!r} is paged {size} elements at a time; with chunks of "
            f"{chunk_elems * STORAGE_ITEMSIZE} bytes ({chunk_elems} elements) jaxoff.paged "
            f"pages fewer than 2**31 - {chunk_elems} elements at a time (int32 indices): split "
            "the parameter into several, or, for stacked layers, page them a layer at a "
            "time (`strategy='fuyou'`, jaxoff.strategies.fuyou)"
        )


def make_plan(
    pre: optax.GradientTransformation | None,
    inner: optax.GradientTransformation,
    params: Any,
    chunk_bytes: int,
    master_dtype: Any,
    *,
    check_ram: bool = True,
    parts: tuple[int, ...] | None = None,
) -> Plan:
    """Plans the store entries for ``params`` (arrays or ShapeDtypeStructs).

    ``check_ram``: refuse a RAM state larger than one chunk (the store's ``ram`` entry is
    written as one chunk); the element-wise probe plans tiny chunks and skips it.

    ``parts``: per leaf, how many equal parts it is paged in (e.g. the layers of a stacked
    leaf that Fuyou pages one layer at a time; default 1, the whole leaf). The chunk indices
    of one part must fit int32 (`check_index_range`).
    """
    master_dtype = np.dtype(master_dtype)
    path_leaves, params_def = jax.tree_util.tree_flatten_with_path(params)
    leaves_abs = [jax.ShapeDtypeStruct(np.shape(x), np.dtype(x.dtype)) for _, x in path_leaves]
    # Entry names come from the paths without Flax Variable wrappers: the same store for
    # nnx.state(model) and for its pure arrays.
    names = [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(canonical(params))[0]]
    masters = [np.dtype(a.dtype) != master_dtype for a in leaves_abs]
    for a, name, m in zip(leaves_abs, names, masters, strict=True):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise NotElementwiseError(
                f"parameter {name!r} has dtype {a.dtype}: only floating "
                "parameters can be optimized by jaxoff.paged"
            )
        if m and master_dtype.itemsize != STORAGE_ITEMSIZE:
            raise NotElementwiseError(f"master_dtype must have 4-byte elements, got {master_dtype}")
    master_abs = jax.tree.unflatten(
        params_def, [jax.ShapeDtypeStruct(a.shape, master_dtype) for a in leaves_abs]
    )
    state_abs = jax.eval_shape(inner.init, master_abs)
    matcher = param_tree_matcher(params_def, leaves_abs)
    node_paths, state_def = jax.tree_util.tree_flatten_with_path(state_abs, is_leaf=matcher)
    nodes, node_dtypes, node_names, ram_avals, ram_paths = [], [], [], [], []
    for path, node in node_paths:
        if matcher(node):
            sub = params_def.flatten_up_to(node) if params_def.num_nodes > 1 else [node]
            for s, a, name in zip(sub, leaves_abs, names, strict=True):
                if not isinstance(s, optax.MaskedNode) and tuple(s.shape) != tuple(a.shape):
                    raise NotElementwiseError(
                        f"jaxoff.paged cannot page this optimizer: its state {path_name(path)} "
                        f"holds a tensor of shape {tuple(s.shape)} for parameter {name!r} of shape "
                        f"{tuple(a.shape)}, so it is not element-wise"
                    )
            nodes.append(("paged", len(node_dtypes)))
            node_dtypes.append(
                tuple(None if isinstance(s, optax.MaskedNode) else np.dtype(s.dtype) for s in sub)
            )
            node_names.append(path_name(path))
        else:
            nodes.append(("ram", len(ram_avals)))
            ram_avals.append(jax.ShapeDtypeStruct(node.shape, node.dtype))
            ram_paths.append(path_name(path))
    pre_avals, pre_def = [], jax.tree.structure(None)
    if pre is not None:
        pre_state = jax.eval_shape(pre.init, jax.tree.unflatten(params_def, leaves_abs))
        pre_leaves, pre_def = jax.tree.flatten(pre_state)
        pre_avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in pre_leaves]
    chunk_elems = chunk_bytes // STORAGE_ITEMSIZE
    entries, leaves = [], []
    for i, (a, name, m) in enumerate(zip(leaves_abs, names, masters, strict=True)):
        mine = []
        if m:
            mine.append(len(entries))
            entries.append(EntryPlan(f"master.{name}", i, -1, master_dtype, master_dtype))
        for k, (nname, dts) in enumerate(zip(node_names, node_dtypes, strict=True)):
            if dts[i] is None:  # masked out for this parameter: no such state
                continue
            mine.append(len(entries))
            st = storage_dtype(dts[i], f"optimizer state {nname} of {name!r}")
            entries.append(EntryPlan(f"opt.{nname}.{name}", i, k, dts[i], st))
        leaves.append(
            LeafPlan(i, name, tuple(a.shape), np.dtype(a.dtype), m, chunk_elems, tuple(mine))
        )
        check_index_range(name, leaves[-1].size // (parts[i] if parts else 1), chunk_elems)
    plan = Plan(
        params_def,
        tuple(leaves),
        tuple(entries),
        state_def,
        tuple(nodes),
        tuple(node_dtypes),
        pre_def,
        tuple(pre_avals) + tuple(ram_avals),
        len(pre_avals),
    )
    if check_ram and plan.ram_nbytes > chunk_bytes:
        big = sorted(
            zip(ram_avals, ram_paths, strict=True),
            key=lambda t: -math.prod(t[0].shape) * _byte_width(t[0].dtype),
        )[:3]
        shown = ", ".join(f"{p} {tuple(a.shape)} {np.dtype(a.dtype)}" for a, p in big)
        need = -(-plan.ram_nbytes // 4096) * 4096
        raise NotElementwiseError(
            f"jaxoff.paged: the optimizer state that is not shaped like the parameters (kept in "
            f"RAM and written to the store as one chunk at every step) takes {plan.ram_nbytes} "
            f"bytes, more than one chunk of {chunk_bytes} bytes (largest: {shown}); pass "
            f"`chunk_bytes={need}` or more, or, if these are "
            "per-parameter tensors in a container that is not shaped like the parameters, "
            "keep this optimizer in RAM (plain optax): it is not element-wise"
        )
    return plan

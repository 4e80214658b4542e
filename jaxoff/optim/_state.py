"""The state of a paged optimizer as a user and optax's tools see it.

`PagedState` keeps the inner optax state's own structure (``inner_state``), so that
``optax.tree_utils.tree_get(state, "count")``, ``tree_set`` of injected hyperparameters,
logging and checkpoint code find what they would find in plain optax. Its per-parameter
tensors (moments, ...) are not in RAM: each such subtree is a `PagedTensors` node, a pytree
node without leaves that names the page store entries holding it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxoff.optim._plan import Plan


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class PagedTensors:
    """A per-parameter part of the optimizer state (or the master weights) kept on disk.

    A pytree node with no leaves: jit, orbax and ``jax.tree`` functions pass it through.

    Attributes:
      store: the page store directory.
      entries: the store entries holding it, one per parameter leaf that has it.
      nbytes: bytes of one version of these entries on disk (without padding).
    """

    store: str
    entries: tuple[str, ...]
    nbytes: int

    def __repr__(self) -> str:
        return (
            f"<paged: {len(self.entries)} tensors, {human_bytes(self.nbytes)} in page store "
            f"{self.store}>"
        )


class PagedState(NamedTuple):
    """The state of a `jaxoff.paged` transformation: what stays in RAM, and where the rest is.

    Attributes:
      version: the page store version this state describes (int32); a step reads that
        version and the pager refuses a state whose version is not the store's (a stale
        state). An operand, so a new version never recompiles the step. Everything else of
        the pages (where each chunk lives, its crc32c) is the pager's, on the host.
      master: the fp32 master weights (`PagedTensors`), or None when the parameters are
        the master dtype.
      pre_state: the state of global operations run on the gradients before the pipeline
        (e.g. ``clip_by_global_norm``), or None.
      inner_state: the inner optimizer's state, as optax builds it, with every per-parameter
        subtree replaced by a `PagedTensors` node: step counts, injected hyperparameters
        and other small leaves are here, in RAM.
    """

    version: Any
    master: PagedTensors | None
    pre_state: Any
    inner_state: Any

    @property
    def ram(self) -> tuple:
        """The RAM leaves: global operations' state, then the inner state's leaves."""
        return tuple(jax.tree.leaves(self.pre_state)) + tuple(jax.tree.leaves(self.inner_state))

    def __repr__(self) -> str:
        try:
            version = int(self.version)
        except Exception:  # a tracer or an abstract shape
            version = self.version
        nodes = [self.master] if self.master is not None else []
        nodes += [
            x
            for x in jax.tree.leaves(self.inner_state, is_leaf=_is_paged)
            if isinstance(x, PagedTensors)
        ]
        where = nodes[0].store if nodes else "?"
        total = sum(n.nbytes for n in nodes)
        parts = [
            f"version={version}",
            f"on disk: {human_bytes(total)} per version in page store {where}",
        ]
        if self.master is not None:
            parts.append(f"master={self.master!r}")
        if self.pre_state is not None:
            parts.append(f"pre_state={self.pre_state!r}")
        parts.append(f"inner_state={self.inner_state!r}")
        return "PagedState(" + ", ".join(parts) + ")"


def _is_paged(x) -> bool:
    return isinstance(x, PagedTensors)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def paged_nodes(plan: Plan, root: str) -> tuple[PagedTensors | None, list[PagedTensors]]:
    """``(master node or None, node per paged subtree of the inner state)``."""

    def node(entries) -> PagedTensors:
        nbytes = sum(plan.leaves[e.leaf].size * np.dtype(e.storage).itemsize for e in entries)
        return PagedTensors(root, tuple(e.name for e in entries), int(nbytes))

    masters = [e for e in plan.entries if e.node < 0]
    subtrees = [
        node([e for e in plan.entries if e.node == k]) for k in range(len(plan.node_dtypes))
    ]
    return (node(masters) if masters else None), subtrees


def make_state(plan: Plan, root: str, version, ram) -> PagedState:
    """The `PagedState` of ``plan`` from its version and RAM leaves (plan order)."""
    ram = list(ram)
    master, subtrees = paged_nodes(plan, root)
    pre = jax.tree.unflatten(plan.pre_def, ram[: plan.num_pre])
    inner_ram = ram[plan.num_pre :]
    nodes = [inner_ram[k] if kind == "ram" else subtrees[k] for kind, k in plan.nodes]
    return PagedState(version, master, pre, jax.tree.unflatten(plan.state_def, nodes))

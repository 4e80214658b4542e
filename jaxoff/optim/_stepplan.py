"""The step plan: the (entry, chunk) reads and writes a paged step makes, in order, known at
trace time; and what of them is read ahead.

A chunk `Plan` says how each parameter leaf's optimizer state is cut into store entries and
chunks. A paged step walks it: per leaf, per part (the whole leaf for `paged`; one layer of
a stacked block leaf for Fuyou, whose store holds an entry per layer), per chunk, it reads
that chunk of every entry of the leaf, updates it, and writes it back. `StepPlan` is that
walk as data:

- `StepPlan.ios` lists it, read by read and write by write (what a GPU paging engine
  consumes as its per-call-site schedule);
- `StepPlan.read_ahead` chooses the leading chunks that a step reads ahead of its update
  within a staging budget. `paged`'s head start (``order="sequential"``: the longest prefix
  of the step's chunks, leaf by leaf) and Fuyou's read-ahead of a layer
  (``order="round_robin"``: every tensor's first chunk, then each tensor's next one in turn)
  are the same question asked in two orders, answered here for both.

>>> import optax, tempfile, jax.numpy as jnp
>>> from jaxoff.optim import paged
>>> from jaxoff.optim.chunks import chunk_updater
>>> tx = paged(optax.adam(1e-3), tempfile.mkdtemp() + "/s", chunk_bytes=4096)
>>> plan = chunk_updater(tx).plan({"w": jnp.ones((2, 1500), jnp.float32)})
>>> sp = StepPlan(plan)
>>> sp.chunks(plan.leaves[0])  # 3000 elements in chunks of 1024
[1024, 1024, 952]
>>> [(io.kind, plan.entries[io.entry].name, io.chunk) for io in sp.ios()][:3]
[('read', 'opt.0.mu.w', 0), ('read', 'opt.0.nu.w', 0), ('write', 'opt.0.mu.w', 0)]
>>> cost = lambda leaf, n: 8 * n  # two float32 tensors
>>> sp.read_ahead(plan.leaves, 20000, cost)  # 8192 + 8192 fit, 7616 more do not
{0: [1024, 1024]}
>>> StepPlan(plan, parts=(2,)).chunks(plan.leaves[0])  # one of two layers: 1500 elements
[1024, 476]
>>> tx.close()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Literal

from jaxoff.optim._plan import LeafPlan, Plan


@dataclasses.dataclass(frozen=True)
class ChunkIO:
    """One read or write of a step: chunk ``chunk`` (of ``elems`` elements) of plan entry
    ``entry`` (of leaf ``leaf``), in part ``part`` of the leaf (a layer; 0 when whole)."""

    kind: Literal["read", "write"]
    leaf: int
    entry: int
    part: int
    chunk: int
    elems: int


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The chunks a paged step moves, over a chunk `Plan`.

    Args:
      plan: the chunk plan (`jaxoff.optim.chunks.chunk_updater(tx).plan(params)`).
      parts: per leaf, the equal parts it is paged in (1: whole; a stacked block leaf of
        ``L`` layers paged a layer at a time: ``L``); default all 1.
    """

    plan: Plan
    parts: tuple[int, ...] | None = None

    def parts_of(self, leaf: LeafPlan) -> int:
        return 1 if self.parts is None else self.parts[leaf.index]

    def chunks(self, leaf: LeafPlan) -> list[int]:
        """The sizes (elements) of the chunks of one part of ``leaf``."""
        n_full, tail = divmod(leaf.size // self.parts_of(leaf), leaf.chunk_elems)
        return [leaf.chunk_elems] * n_full + ([tail] if tail else [])

    def ios(self, leaves: Iterable[LeafPlan] | None = None) -> list[ChunkIO]:
        """The step's reads and writes in order: per leaf (``leaves``, default the plan's),
        per part, per chunk, that chunk of each of the leaf's entries read, then written."""
        out = []
        for leaf in self.plan.leaves if leaves is None else leaves:
            for part in range(self.parts_of(leaf)):
                for c, n in enumerate(self.chunks(leaf)):
                    for kind in ("read", "write"):
                        out += [ChunkIO(kind, leaf.index, k, part, c, n) for k in leaf.entries]
        return out

    def read_ahead(
        self,
        leaves: Iterable[LeafPlan],
        budget: int,
        cost: Callable[[LeafPlan, int], int],
        order: Literal["sequential", "round_robin"] = "sequential",
    ) -> dict[int, list[int]]:
        """The leading chunks of one part of each of ``leaves`` (those with paged tensors)
        read ahead within ``budget`` bytes, ``cost(leaf, elems)`` each: ``{leaf index:
        their sizes}``.

        ``sequential``: the longest prefix of the leaves' chunks, leaf by leaf, whose costs
        fit (a leaf none of whose chunks fit is left out). ``round_robin``: every leaf's
        first chunk, whatever its cost, then each leaf's next chunk in turn while the total
        stays within ``budget``.
        """
        chunks = {leaf.index: self.chunks(leaf) for leaf in leaves if leaf.entries}
        leaf_of = {leaf.index: leaf for leaf in self.plan.leaves}
        if order == "sequential":
            taken: dict[int, list[int]] = {}
            used = 0
            for k, sizes in chunks.items():
                for n in sizes:
                    need = cost(leaf_of[k], n)
                    if used + need > budget:
                        return taken
                    taken.setdefault(k, []).append(n)
                    used += need
            return taken
        if order != "round_robin":
            raise ValueError(f"order={order!r}: use 'sequential' or 'round_robin'")
        taken = {k: c[:1] for k, c in chunks.items()}
        used = sum(cost(leaf_of[k], n) for k, c in taken.items() for n in c)
        while True:
            grew = False
            for k, c in chunks.items():
                i = len(taken[k])
                if i < len(c):
                    need = cost(leaf_of[k], c[i])
                    if used + need > budget:
                        return taken
                    taken[k].append(c[i])
                    used += need
                    grew = True
            if not grew:
                return taken

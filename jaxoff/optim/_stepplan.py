"""The step plan: the reads and writes of one traced paged step, in the order they run.

A paged step pages through one `StepRecorder` (`jaxoff.optim.chunks.PageTransaction.begin`):
every ``take`` and ``put`` it lowers is a *site* (one paging call of the program) whose
address, the store entry and chunk it moves, may depend on the static index of each scan it
runs in (`StepRecorder.scan`: a chunk index, a layer). The recorder keeps the program's shape,
sites in call order and scans with the values of their trips, and `StepPlan` is that shape as
data: `StepPlan.ios` expands it into every read and write in the order the calls run (one
token chain orders them all), which is the plan the pager is given for the step, and
`StepPlan.trips` says how often each site runs. The lowering and the pager's plan come from
the same record, so they cannot disagree.

>>> loop = Loop((2, 1, 0))  # a reverse scan over three layers
>>> take = Site(0, "read", lambda env: (f"w@{env[loop]}", 0), 4096, (loop,))
>>> put = Site(1, "write", lambda env: ("ram", 0), 64, ())
>>> loop.body.append(take)
>>> plan = StepPlan((loop, put), (take, put))
>>> [(io.kind, io.entry) for io in plan.ios()]
[('read', 'w@2'), ('read', 'w@1'), ('read', 'w@0'), ('write', 'ram')]
>>> plan.trips()
{0: 3, 1: 1}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Literal


class Loop:
    """A scan that paging calls run in: the static value of each trip, in the order the trips
    run (a reverse scan's last element first), and the sites and scans of its body."""

    def __init__(self, values: Sequence[int]):
        self.values = tuple(int(v) for v in values)
        self.body: list[Site | Loop] = []

    def __repr__(self) -> str:
        return f"Loop({len(self.values)} trips, {len(self.body)} nodes)"


# where a site's call moves bytes, given the value of each scan it runs in
Address = Callable[[Mapping[Loop, int]], tuple[str, int]]


@dataclasses.dataclass(frozen=True, eq=False)
class Site:
    """One paging call of a traced step: ``kind`` ``read`` (``page_take``) or ``write``
    (``page_out``) of ``nbytes``; ``address(env)`` is the ``(entry name, chunk index)`` it moves
    when the scans ``loops`` (outermost first) are at the values ``env`` gives them."""

    index: int
    kind: Literal["read", "write"]
    address: Address
    nbytes: int
    loops: tuple[Loop, ...]


@dataclasses.dataclass(frozen=True)
class ChunkIO:
    """One read or write of a step: ``nbytes`` of chunk ``chunk`` of store entry ``entry``,
    moved by site ``site``."""

    kind: Literal["read", "write"]
    site: int
    entry: str
    chunk: int
    nbytes: int


Node = Site | Loop


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """A traced step's sites (``sites``, by index) and its shape (``root``: sites and scans
    in call order)."""

    root: tuple[Node, ...]
    sites: tuple[Site, ...]

    def ios(self) -> list[ChunkIO]:
        """Every read and write of the step, in the order the calls run."""
        out: list[ChunkIO] = []

        def walk(nodes: Sequence[Node], env: dict) -> None:
            for node in nodes:
                if isinstance(node, Loop):
                    for v in node.values:
                        walk(node.body, {**env, node: v})
                else:
                    entry, chunk = node.address(env)
                    out.append(ChunkIO(node.kind, node.index, str(entry), int(chunk), node.nbytes))

        walk(self.root, {})
        return out

    def trips(self) -> dict[int, int]:
        """How often each site of the plan runs in one step: the product of the trip counts
        of the scans around it."""
        out: dict[int, int] = {}

        def walk(nodes: Sequence[Node], n: int) -> None:
            for node in nodes:
                if isinstance(node, Loop):
                    walk(node.body, n * len(node.values))
                else:
                    out[node.index] = n

        walk(self.root, 1)
        return out

    def counts(self) -> dict[str, int]:
        """``{"read": n, "write": m}``: the step's reads and writes."""
        trips = self.trips()
        by_site = {s.index: s for s in self.sites}
        out = {"read": 0, "write": 0}
        for i, n in trips.items():
            out[by_site[i].kind] += n
        return out

    def nbytes(self) -> dict[str, int]:
        """Bytes the step reads and writes."""
        trips = self.trips()
        out = {"read": 0, "write": 0}
        for s in self.sites:
            out[s.kind] += trips.get(s.index, 0) * s.nbytes
        return out

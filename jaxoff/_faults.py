"""Fault points: named places where a crash-consistency test can make the process die.

``JAXOFF_FAULT="name:n"`` kills this process with SIGKILL the ``n``-th time (1-based)
:func:`point` is reached with that name (the ``pager.*`` points are reached in the paging
calls' C++ handlers, ``ffi/src/pager_registry.cc``, which read the same variable); several
such items may be given, separated by commas (``"store.commit:3,checkpoint.orbax:1"``).
Without the variable, :func:`point` is one dictionary lookup. Under several processes
(``jaxoff launch``), ``JAXOFF_FAULT_PROCESS=i`` arms the faults in process ``i`` only
(its ``JAX_PROCESS_ID``); the others run untouched. The suite in ``tests/test_faults.py``
uses these points to kill ``jaxoff train`` inside each writer (paging calls, store commits,
both checkpoint writers, the metrics log) and checks that ``--resume`` then finishes bitwise
equal to an uninterrupted run.

Points (see ``POINTS``) are reached in this order within a training step: the step's paging
calls (begin, takes and puts, commit) and the store's commit, the metrics line, then the
checkpoint writers.

An I/O error instead of a kill: ``JAXOFF_IO_FAULT="read:n"`` makes the ``n``-th chunk read of
the pager in this process (1-based, counted in ``ffi/engine/gpu_pager.cc``) fail with EIO, as
a failing device reports it; the step that takes that chunk fails with the engine's message
(``tests/test_one_line_failures.py``).
"""

from __future__ import annotations

import os
import signal

# name -> where it is reached (kept in step with the calls; tests assert each is reachable)
POINTS: dict[str, str] = {
    "train.init": "after the run directory is prepared, before the first state exists",
    "train.step": "after a step has run, before its metrics line is written",
    "train.metrics": "after a step's metrics line is written, before its checkpoint",
    "pager.begin": "in a paged step's page_begin, before the pager starts the step",
    "pager.take": "in a paged step's page_take, before the chunk is taken",
    "pager.put": "in a paged step's page_out, before the chunk is handed to the pager (earlier "
    "puts of the step may be on disk: writes to the next version's slot)",
    "pager.commit": "in a paged step's page_commit, once the step ended (its writes and commit "
    "may still be in flight)",
    "store.commit": "inside a page store commit, before the new manifest replaces the old",
    "checkpoint.paged": "between chunks of a paged checkpoint being written",
    "checkpoint.orbax": "after the paged checkpoint, before the orbax checkpoint is written",
    "checkpoint.done": "after both checkpoint writers, before old checkpoints are removed",
}
# reached only when training runs in several processes (``jaxoff launch``)
PROCESS_POINTS: dict[str, str] = {
    "checkpoint.parts": "after this process wrote its parts of a checkpoint (its paged state, "
    "its orbax shards), before process 0 records the checkpoint as complete",
}

_armed: dict[str, int] | None = None
_counts: dict[str, int] = {}


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, n = item.partition(":")
        if name not in POINTS and name not in PROCESS_POINTS:
            known = sorted({**POINTS, **PROCESS_POINTS})
            raise ValueError(f"JAXOFF_FAULT: unknown fault point {name!r}; known: {known}")
        armed[name] = int(n or 1)
    return armed


def _points() -> dict[str, int]:
    global _armed
    if _armed is None:
        only = os.environ.get("JAXOFF_FAULT_PROCESS")
        mine = only is None or only == os.environ.get("JAX_PROCESS_ID", "0")
        _armed = _parse(os.environ.get("JAXOFF_FAULT", "") if mine else "")
    return _armed


def armed(name: str) -> bool:
    """Whether ``JAXOFF_FAULT`` arms point ``name`` (for code that adds a point only then)."""
    return name in _points()


def point(name: str) -> None:
    """Dies with SIGKILL here if ``JAXOFF_FAULT`` arms ``name`` for this visit."""
    armed_points = _points()
    if not armed_points:
        return
    n = armed_points.get(name)
    if n is None:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == n:
        os.kill(os.getpid(), signal.SIGKILL)

"""``Step``: what the trainer asks of every way to train (the plain step, FSDP with a paged
optimizer, Fuyou), and what it hands a step to checkpoint with.

A step owns its optimizer (and so its page store) and knows where its state lives: it makes
a new state (`Step.init`), restores one from a checkpoint (`Step.restore`) and writes its
part of one (`Step.save`). The trainer owns the run directory, the checksums, the retention
of old checkpoints and the decision to fall back to an older checkpoint: it hands the step a
`CheckpointReader` / `CheckpointWriter` over its checkpoints and a `FallBack` callback, so
that no step imports the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ._state import TrainState


class CheckpointReader(Protocol):
    """The trainer's checkpoints, as a step restores from them."""

    def restore(self, step: int, abstract_state: Any) -> Any:
        """The orbax part of checkpoint ``step``, restored as ``abstract_state`` (a tree of
        ``jax.ShapeDtypeStruct`` with their shardings) describes it."""
        ...

    def paged_dir(self, step: int) -> Path:
        """The directory of this process's paged part of checkpoint ``step``.

        Raises:
          ConfigError: the checkpoint has no paged part (it was written without a store).
        """
        ...


class CheckpointWriter(Protocol):
    """The trainer's checkpoints, as a step writes its part of one.

    Attributes:
      paged_in_store: the paged part records the store's committed version (its checksums)
        instead of copying it (``jaxoff.optim.save_paged``'s ``in_store``).
    """

    paged_in_store: bool

    def paged_part(self, step: int) -> Path:
        """Where this process writes the paged part of checkpoint ``step``."""
        ...

    def save_tree(self, step: int, tree: Any) -> None:
        """Writes ``tree`` (the arrays the page store does not hold) as the orbax part of
        checkpoint ``step``; written after the paged part."""
        ...


FallBack = Callable[[int, Exception | None, list[int]], int]
"""``fall_back(step, error, damaged) -> step``: checkpoint ``step`` has a damaged paged
part in processes ``damaged`` (``error``: this process's damage, a
``jaxoff.aio.PageStoreCorruptError``, or None when only other processes found theirs
damaged). The trainer refuses it (raises) or removes it and answers the step to restore
instead, the same in every process."""


@runtime_checkable
class Step(Protocol):
    """One way to train: ``state, metrics = step(state, inputs, targets)``.

    The trainer calls, in order: `init` (a new run) or `restore` (a resumed one), `compile`
    once, then the step itself for each batch, `evaluate` for validation losses, `save` at
    each checkpoint, and `close` at the end. ``metrics`` holds ``loss`` and ``grad_norm``.
    """

    def init(self) -> TrainState:
        """A new state from the run's seed (a paged step writes its store)."""
        ...

    def restore(
        self, reader: CheckpointReader, step: int, fall_back: FallBack
    ) -> tuple[int, TrainState]:
        """``(step, state)`` of checkpoint ``step``, its paged part written back into the
        store; a damaged paged part goes to ``fall_back``, and the checkpoint it answers is
        restored instead (hence the step returned)."""
        ...

    def save(self, writer: CheckpointWriter, step: int, state: TrainState) -> None:
        """Writes ``state`` as checkpoint ``step``: its paged part, then the orbax part
        (`CheckpointWriter.save_tree`)."""
        ...

    def compile(self, state: TrainState, inputs: Any, targets: Any) -> TrainState:
        """Compiles the step for these shapes; returns ``state`` placed as the step takes
        it (the step then donates it)."""
        ...

    def __call__(self, state: TrainState, inputs: Any, targets: Any) -> tuple[TrainState, dict]:
        """One training step: ``(state, {"loss", "grad_norm"})``."""
        ...

    def evaluate(self, state: TrainState, inputs: Any, targets: Any) -> Any:
        """The loss of ``state``'s parameters on one batch (no update)."""
        ...

    def io_table(self) -> str | None:
        """The file table the step pages through (for ``jaxoff.aio.io_stats``), or
        None when it pages nothing."""
        ...

    def phase_times(self) -> dict[str, float]:
        """Wall times of the last step's phases in seconds, by name (empty: one program)."""
        ...

    def close(self) -> None:
        """Releases the optimizer's page store (its lock)."""
        ...

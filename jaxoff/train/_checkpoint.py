"""orbax checkpoints of the TrainState, plus the run's config to refuse a mismatched resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orbax.checkpoint as ocp

from .._errors import ConfigError


class Checkpoints:
    """Saves and restores TrainStates under ``<out_dir>/checkpoints``.

    With a paged optimizer (``tx`` from ``jaxoff.paged``) the page store's committed version
    is streamed chunk by chunk into ``<out_dir>/checkpoints_paged/<step>`` first; the orbax
    checkpoint of the same step, written second, is what makes the step count as saved.
    """

    def __init__(self, out_dir: Path, keep: int, tx=None):
        self.directory = (Path(out_dir) / "checkpoints").absolute()
        self.paged_directory = (Path(out_dir) / "checkpoints_paged").absolute()
        self._tx = tx if _is_paged(tx) else None
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=True, enable_async_checkpointing=False
            ),
        )

    @property
    def paged(self) -> bool:
        return self._tx is not None

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state) -> None:
        if self.paged:
            from ..optim import save_paged

            save_paged(self._tx, state.opt_state, self.paged_directory / str(step))
        self._manager.save(step, args=ocp.args.StandardSave(state))
        self._manager.wait_until_finished()
        if self.paged:
            kept = {str(s) for s in self._manager.all_steps()}
            for d in self.paged_directory.iterdir():
                if d.name not in kept:
                    shutil.rmtree(d, ignore_errors=True)

    def restore(self, step: int, abstract_state):
        return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

    def restore_paged(self, tx, step: int, params):
        """Writes the paged state of checkpoint ``step`` into ``tx``'s store; its opt_state."""
        from ..optim import restore_paged

        directory = self.paged_directory / str(step)
        if not directory.is_dir():
            raise ConfigError(
                f"--resume: checkpoint {step} has no paged optimizer state in {directory}; "
                f"it was written without --store (resume without --store)"
            )
        return restore_paged(tx, directory, params)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _is_paged(tx) -> bool:
    from ..optim import PagedTransformation

    return isinstance(tx, PagedTransformation)


def check_resumable(out_dir: Path, config: dict, allowed_changes: frozenset[str]) -> None:
    """Refuses to resume a run whose result-changing options differ from the saved ones."""
    saved_path = Path(out_dir) / "config.json"
    if not saved_path.exists():
        raise ConfigError(
            f"--resume: {saved_path} not found; {out_dir} holds no run to resume "
            f"(drop --resume to start a new run)"
        )
    saved = json.loads(saved_path.read_text())
    changed = sorted(
        k
        for k in set(saved) | set(config)
        if k not in allowed_changes and saved.get(k) != config.get(k)
    )
    if changed:
        diffs = ", ".join(f"{k}: {saved.get(k)!r} -> {config.get(k)!r}" for k in changed)
        raise ConfigError(
            f"--resume: options differ from the run in {out_dir} ({diffs}); "
            f"resume with the same options or use a new --out-dir"
        )

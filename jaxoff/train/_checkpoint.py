"""orbax checkpoints of the TrainState, plus the run's config to refuse a mismatched resume."""

from __future__ import annotations

import json
from pathlib import Path

import orbax.checkpoint as ocp

from .._errors import ConfigError


class Checkpoints:
    """Saves and restores TrainStates under ``<out_dir>/checkpoints`` (async, atomic)."""

    def __init__(self, out_dir: Path, keep: int):
        self.directory = (Path(out_dir) / "checkpoints").absolute()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state) -> None:
        self._manager.save(step, args=ocp.args.StandardSave(state))

    def restore(self, step: int, abstract_state):
        return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


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

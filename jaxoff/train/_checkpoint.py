"""orbax checkpoints of the TrainState, checksummed, plus the run's config to refuse a
mismatched resume."""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from .. import _faults
from .._errors import ConfigError, JaxoffError
from ..distributed import barrier
from ._checksums import has_checksums, write_checksums
from ._options import flat_options

_FULL = {
    errno.ENOSPC: "no space left on the disk",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file size limit reached",
}


class Checkpoints:
    """Saves and restores TrainStates under ``<out_dir>/checkpoints``.

    What a checkpoint holds is the step's to say (``step``, a :class:`jaxoff.step.Step`:
    ``step.save(self, ...)``, ``step.restore(self, ...)``): its paged part, the page store's
    committed version streamed chunk by chunk into ``<out_dir>/checkpoints_paged/<step>``
    (`paged_part`; with ``paged_in_store``, a manifest naming that version of the store
    instead), first, then the orbax checkpoint of the same step (`save_tree`: what the
    store does not hold). The step counts as saved once ``checksums.json`` is in its orbax
    directory (see ``_checksums``), and only then are old checkpoints removed.

    Under several processes every process writes its paged state to
    ``checkpoints_paged/<step>/process-<i>`` and its shards of the orbax checkpoint (orbax's
    multi-process save); once all have (a barrier), process 0 alone records the checksums of
    every part: the step counts as saved for all processes or for none.
    """

    def __init__(self, out_dir: Path, keep: int, step=None, paged_in_store: bool = False):
        self.out_dir = Path(out_dir).absolute()
        self.directory = self.out_dir / "checkpoints"
        self.paged_directory = self.out_dir / "checkpoints_paged"
        self.keep = keep
        self.step: Any = step  # the jaxoff.step.Step whose states these are
        # the paged part names the store's committed version instead of copying it
        self.paged_in_store = paged_in_store
        self.process, self.processes = jax.process_index(), jax.process_count()
        _quiet_orbax_disk_full()
        # retention is ours (max_to_keep=None): orbax would delete the previous checkpoint
        # before this one has its checksums, i.e. before it counts as saved
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=None,
                create=True,
                enable_async_checkpointing=False,
                cleanup_tmp_directories=True,
            ),
        )

    def paged_part(self, step: int, process: int | None = None) -> Path:
        """Where the paged optimizer state of ``step`` (of ``process``: default this one)
        is saved."""
        if self.processes == 1:
            return self.paged_directory / str(step)
        process = self.process if process is None else process
        return self.paged_directory / str(step) / f"process-{process}"

    def save(self, step: int, state) -> None:
        """Writes checkpoint ``step``; a full disk raises a one-line :class:`JaxoffError`."""

        try:
            self.step.save(self, step, state)  # its paged part, then save_tree
            if self.processes > 1:
                _faults.point("checkpoint.parts")
                barrier(f"jaxoff-checkpoint-{step}-parts")
            if self.process == 0:
                parts = [self.paged_part(step, p) / "paged.json" for p in range(self.processes)]
                write_checksums(self.out_dir, self.directory / str(step), parts)
        except (OSError, ValueError, JaxoffError) as e:
            full = disk_full_error(e, step, self.directory / str(step))
            if full is None:
                raise
            raise full from None
        if self.process != 0:
            barrier(f"jaxoff-checkpoint-{step}-done")
            return
        _faults.point("checkpoint.done")
        self._remove_old()
        barrier(f"jaxoff-checkpoint-{step}-done")

    def _remove_old(self) -> None:
        complete = complete_steps(self.directory)
        for old in complete[: -self.keep]:
            self.discard(old)
        kept = {str(s) for s in complete[-self.keep :]}
        # a step's paged folder left by a failed save, or by an old run; only the step
        # folders this class writes (a name of digits), never another file put there
        for d in self.paged_directory.glob("*"):
            if d.is_dir() and d.name.isdigit() and d.name not in kept:
                shutil.rmtree(d, ignore_errors=True)

    def discard(self, step: int) -> None:
        """Deletes checkpoint ``step`` (both parts)."""
        remove_step(self.out_dir, step)
        self.reload()

    def reload(self) -> None:
        """Re-reads which steps exist (after a removal, here or by another process)."""
        self._manager.reload()

    def save_tree(self, step: int, tree) -> None:
        """Writes ``tree`` as the orbax part of checkpoint ``step`` (`jaxoff.step.Step.save`
        calls it after writing the paged part)."""
        _faults.point("checkpoint.orbax")
        self._manager.save(step, args=ocp.args.StandardSave(tree))
        self._manager.wait_until_finished()

    def restore(self, step: int, abstract_state):
        """The orbax part of checkpoint ``step``, as ``abstract_state`` describes it."""
        return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

    def paged_dir(self, step: int) -> Path:
        """This process's paged part of checkpoint ``step``, to restore from; a checkpoint
        without one is refused in one line."""
        directory = self.paged_part(step)
        if not directory.is_dir():
            raise ConfigError(
                f"--resume: checkpoint {step} has no paged optimizer state in {directory}; "
                f"it was written without --store (resume with --store none)"
            )
        return directory

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


# orbax logs a failed write, with its traceback, before raising it; a full disk is then said
# once, in one line, by `disk_full_error`
# (and asyncio logs each failed write task that nobody awaited, when it is collected)
_QUIET_LOGS = (logging.getLogger("absl"), logging.getLogger("asyncio"))


def _drop_disk_full_records(record: logging.LogRecord) -> bool:
    text = record.getMessage().replace("\\'", "'")  # a task's repr escapes the quotes
    if record.exc_info and record.exc_info[1] is not None:
        text += str(record.exc_info[1])
    return not any(f"os_error_code='{code}'" in text for code in _FULL)


def _quiet_orbax_disk_full() -> None:
    """After a failed orbax write, tensorstore's pending callbacks find their event loop
    closed and each prints a traceback (an "unraisable" error) around the error that matters;
    those, and only those, are dropped, as are orbax's log records of a full disk."""
    for log in _QUIET_LOGS:
        log.addFilter(_drop_disk_full_records)  # a no-op when already there
    previous = sys.unraisablehook
    if getattr(previous, "_jaxoff_quiet", False):
        return

    def hook(unraisable):
        e = unraisable.exc_value
        if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
            previous(unraisable)

    hook._jaxoff_quiet = True
    sys.unraisablehook = hook


def step_dirs(directory: Path) -> list[int]:
    """Steps that have a directory under ``directory``, saved or not, in ascending order."""
    if not directory.is_dir():
        return []
    return sorted(int(d.name) for d in directory.iterdir() if d.name.isdigit() and d.is_dir())


def remove_step(out_dir: Path, step: int) -> None:
    """Deletes checkpoint ``step`` of the run in ``out_dir``: its orbax and paged parts."""
    shutil.rmtree(Path(out_dir) / "checkpoints" / str(step), ignore_errors=True)
    shutil.rmtree(Path(out_dir) / "checkpoints_paged" / str(step), ignore_errors=True)


def complete_steps(directory: Path) -> list[int]:
    """Steps whose checkpoint was saved completely (it has its checksums), ascending."""
    return [s for s in step_dirs(directory) if has_checksums(directory / str(s))]


def disk_full_error(e: BaseException, step: int, default_path: Path) -> JaxoffError | None:
    """A one-line error for a checkpoint write that failed for lack of disk (or file size
    limit); ``None`` for any other failure.

    The paged writer raises ``OSError`` or ``PageStoreFullError``; orbax (tensorstore) raises
    ``ValueError("... Failed writing: "<path>" ... [os_error_code='27']")``.
    """
    code = getattr(e, "errno", None)
    path = getattr(e, "path", None) or getattr(e, "filename", None)
    if isinstance(e, ValueError) and (m := re.search(r"os_error_code='?(\d+)", str(e))):
        code = int(m[1])
        where = re.search(r'Failed writing: "([^"]+)"', str(e))
        path = where[1] if where else None
    if code not in _FULL:
        return None
    return JaxoffError(
        f"checkpoint {step}: cannot write {path or default_path} ({_FULL[code]}); free space "
        f"there, lower --keep-checkpoints or raise the file size limit (ulimit -f), then "
        f"continue the run with --resume"
    )


def check_resumable(out_dir: Path, config: dict, allowed_changes: frozenset[str]) -> None:
    """Refuses to resume a run whose result-changing options differ from the saved ones."""
    saved_path = Path(out_dir) / "config.json"
    if not saved_path.exists():
        raise ConfigError(
            f"--resume: {saved_path} not found; {out_dir} holds no run to resume "
            f"(drop --resume to start a new run)"
        )
    try:
        saved = json.loads(saved_path.read_text())
    except ValueError as e:
        raise ConfigError(
            f"--resume: {saved_path} is unreadable ({e}); restore it or start again with "
            f"--overwrite"
        ) from None
    saved = flat_options(saved)  # by group, or flat (written before the options had groups)
    config = flat_options(config)
    saved.setdefault("processes", 1)  # written before runs spanned processes
    saved.setdefault("strategy", "fuyou" if saved.get("fuyou") else "plain")  # before --strategy
    saved.setdefault("grad_accum", 1)  # written before --grad-accum
    if saved["grad_accum"] != config.get("grad_accum", 1):
        n = saved["grad_accum"]
        raise ConfigError(
            f"--resume --grad-accum {config.get('grad_accum', 1)}: the run in {out_dir} was "
            f"started with --grad-accum {n}, and a step of it is {n} micro-batch"
            f"{'' if n == 1 else 'es'}: its checkpoints, schedule and batch order count "
            f"those steps; resume with --grad-accum {n}, or start a new run in another "
            f"--out-dir"
        )
    if saved["processes"] != config.get("processes", 1):
        n = saved["processes"]
        raise ConfigError(
            f"--resume: the run in {out_dir} was trained by {n} process(es), this is "
            f"{config.get('processes', 1)}: each process's page store and checkpoint part "
            f"hold its own FSDP blocks, which another process count would cut differently; "
            + (
                f"resume it with jaxoff launch --processes {n} -- train ..."
                if n > 1
                else "resume it in one process (without jaxoff launch)"
            )
        )
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

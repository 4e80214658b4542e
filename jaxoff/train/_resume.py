"""What a run directory holds and where training starts: a new run, an overwritten one, or a
resumed one (from which checkpoint, with its working page store rebuilt if damaged)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .._errors import ConfigError, JaxoffError
from ._checkpoint import check_resumable, complete_steps, remove_step, step_dirs
from ._checksums import CheckpointDamagedError, verify_checksums, write_checksums
from ._config import RESUMABLE_CHANGES, TrainConfig


def say(message: str) -> None:
    """One line for the user, on stderr (whether or not the progress display is on)."""
    import jax

    who = f"jaxoff train [process {jax.process_index()}]" if jax.process_count() > 1 else ""
    print(f"{who or 'jaxoff train'}: {message}", file=sys.stderr, flush=True)


def prepare_out_dir(cfg: TrainConfig) -> int | None:
    """Readies ``cfg.out_dir`` (the caller holds its lock); returns the checkpoint step a
    resume starts from (verified, see :func:`pick_step`), or ``None`` to start at step 0."""
    out = Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    config_path = out / "config.json"
    if cfg.resume:
        check_resumable(out, cfg.to_json(), RESUMABLE_CHANGES)
        _adopt_unchecksummed(out)
        complete = complete_steps(ckpt_dir)
        for s in step_dirs(ckpt_dir):
            if s not in complete:  # a save cut short: it never counted
                if s > max(complete, default=0):
                    say(
                        f"checkpoint {s} in {ckpt_dir} was not finished (the run stopped while "
                        f"saving it); removed it"
                    )
                remove_step(out, s)
        if not complete:
            say(
                f"no checkpoint in {ckpt_dir} yet (the run stopped before its first); "
                f"starting from step 0"
            )
            return None
        return pick_step(cfg)
    if config_path.exists() or (out / "metrics.jsonl").exists():
        if not cfg.overwrite:
            raise ConfigError(
                f"--out-dir {out} already holds a run; pass --resume to continue it, "
                f"--overwrite to replace it, or choose another --out-dir"
            )
        for name in ("metrics.jsonl", "config.json"):
            (out / name).unlink(missing_ok=True)
        for path in out.glob("metrics.process-*.jsonl"):  # of a run over several processes
            path.unlink()
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        shutil.rmtree(out / "checkpoints_paged", ignore_errors=True)
        if cfg.store == "auto":  # the run's own store (all processes' stores) goes with it
            shutil.rmtree(out / "store", ignore_errors=True)
    config_path.write_text(json.dumps(cfg.to_json(), indent=2, sort_keys=True))
    return None


def _adopt_unchecksummed(out: Path) -> None:
    """Records checksums for checkpoints of a run that has none at all: written by a jaxoff
    that did not checksum them, or the run stopped between orbax finishing its first
    checkpoint and its checksums. Both are whole (each writer renames its directory into
    place), so they are kept, unverified, rather than thrown away."""
    ckpt_dir = out / "checkpoints"
    steps = step_dirs(ckpt_dir)
    if not steps or complete_steps(ckpt_dir):
        return
    for s in steps:
        write_checksums(out, ckpt_dir / str(s), [out / "checkpoints_paged" / str(s) / "paged.json"])
    say(
        f"checkpoints {', '.join(map(str, steps))} in {ckpt_dir} had no checksums (an older "
        f"jaxoff, or a stop while saving the first); recorded them now, unverified"
    )


def pick_step(cfg: TrainConfig) -> int:
    """The newest checkpoint whose files match their checksums.

    A damaged newest checkpoint is an error, unless ``cfg.resume_fallback``: then it is
    removed (said in one line) and the one before is tried.
    """
    out = Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    for step in reversed(complete_steps(ckpt_dir)):
        try:
            verify_checksums(out, ckpt_dir / str(step))
            return step
        except CheckpointDamagedError as e:
            reject(cfg, step, e)
            remove_step(out, step)
    raise JaxoffError(
        f"--resume: no intact checkpoint left in {ckpt_dir}; start again with --overwrite"
    )


def reject(cfg: TrainConfig, step: int, error: Exception) -> None:
    """Refuses damaged checkpoint ``step``, or, with ``--resume-fallback``, says it is
    dropped (the caller removes it and tries the one before)."""
    where = Path(cfg.out_dir) / "checkpoints"
    if not cfg.resume_fallback:
        raise CheckpointDamagedError(
            f"--resume: checkpoint {step} in {where} is damaged: {error}; pass "
            f"--resume-fallback to continue from the newest intact checkpoint instead"
        ) from None
    say(f"checkpoint {step} is damaged ({error}); removed it, falling back to the one before")


def heal_store(cfg: TrainConfig, step: int | None) -> None:
    """Empties the working page store of a resumed run if it is damaged.

    The store (``<out_dir>/store`` or ``--store``) only ever runs ahead of the last checkpoint,
    so a store whose page files are damaged, short or missing is emptied here (its ``LOCK``
    kept: unlinking a lock file races) and refilled by the restore of checkpoint ``step``
    (or by the optimizer's init when there is no checkpoint: ``None``).
    """
    from ..aio import (
        PageStore,
        PageStoreCorruptError,
        PageStoreFormatError,
        PageStoreNotFoundError,
    )

    root = cfg.store_dir()
    try:
        PageStore.open(root).close()
        return
    except PageStoreNotFoundError:
        return  # a new store directory: the restore creates it
    except (PageStoreCorruptError, PageStoreFormatError) as e:
        reason = str(e).split(": the store was damaged", 1)[0].split("; restore from", 1)[0]
    for child in Path(root).iterdir():
        if child.name == "LOCK":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    source = "the optimizer's init (step 0)" if step is None else f"checkpoint {step}"
    say(f"the page store {root} was damaged ({reason}); rebuilt it from {source}")

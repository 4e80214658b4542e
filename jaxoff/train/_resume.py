"""What a run directory holds and where training starts: a new run, an overwritten one, or a
resumed one (from which checkpoint, with its working page store rebuilt if damaged)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import jax

from .._errors import ConfigError, JaxoffError
from ..aio import (
    PageStore,
    PageStoreCorruptError,
    PageStoreError,
    PageStoreFormatError,
    PageStoreNotFoundError,
    is_store,
    owned_files,
    read_manifest,
    remove_owned,
)
from ._checkpoint import check_resumable, complete_steps, remove_step, step_dirs
from ._checksums import CheckpointDamagedError, verify_checksums, write_checksums
from ._config import RESUMABLE_CHANGES, TrainConfig
from ._options import flat_options


def say(message: str) -> None:
    """One line for the user, on stderr (whether or not the progress display is on)."""

    who = f"jaxoff train [process {jax.process_index()}]" if jax.process_count() > 1 else ""
    print(f"{who or 'jaxoff train'}: {message}", file=sys.stderr, flush=True)


def check_out_dir(cfg: TrainConfig) -> None:
    """Refuses what `prepare_out_dir` would refuse, reading only (run before the run's lock
    is taken and before anything is written)."""
    out = Path(cfg.out_dir)
    if cfg.resume:
        if not (out / "config.json").exists() and stopped_before_config(out):
            return  # started by --resume: see prepare_out_dir
        check_resumable(out, cfg.to_json(), RESUMABLE_CHANGES)
        _check_unchecksummed(cfg)
        return
    if holds_run(out) and not cfg.overwrite:
        raise ConfigError(
            f"--out-dir {out} already holds a run; pass --resume to continue it, "
            f"--overwrite to replace it, or choose another --out-dir"
        )


def holds_run(out: Path) -> bool:
    return (out / "config.json").exists() or (out / "metrics.jsonl").exists()


def stopped_before_config(out: Path) -> bool:
    """Whether ``out`` holds a run that was stopped before it wrote its ``config.json``: its
    lock is there, and nothing a run writes after the config (metrics, checkpoints)."""
    return (
        (out / "run.lock").is_file()
        and not holds_run(out)
        and not step_dirs(out / "checkpoints")
        and not step_dirs(out / "checkpoints_paged")
    )


def prepare_out_dir(cfg: TrainConfig) -> int | None:
    """Readies ``cfg.out_dir`` (the caller holds its lock); returns the checkpoint step a
    resume starts from (verified, see :func:`pick_step`), or ``None`` to start at step 0."""
    out = Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    config_path = out / "config.json"
    check_out_dir(cfg)
    if cfg.resume and not config_path.exists():  # check_out_dir let it through: see there
        say(
            f"the run in {out} stopped before it saved its options (config.json); starting "
            f"it from step 0"
        )
    elif cfg.resume:
        _adopt_unchecksummed(cfg)
        grow_run(cfg, max(complete_steps(ckpt_dir), default=0))
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
            warn_torn_metrics(out / "metrics.jsonl", 0)
            return None
        step = pick_step(cfg)
        warn_torn_metrics(out / "metrics.jsonl", step)
        return step
    elif holds_run(out):  # with --overwrite (check_out_dir refused it otherwise)
        remove_run(cfg)
    config_path.write_text(json.dumps(cfg.to_json(), indent=2, sort_keys=True))
    return None


def grow_run(cfg: TrainConfig, done: int) -> None:
    """``--resume --steps N`` with another N than the run's: a run may grow (or shrink to no
    fewer steps than its newest checkpoint, ``done``). Its learning-rate schedule follows the
    new total from the resumed step on, and its ``config.json`` records it, so a stop in the
    grown part resumes bitwise; said in one line."""
    path = Path(cfg.out_dir) / "config.json"
    saved = json.loads(path.read_text())
    before = flat_options(saved).get("steps")
    if before == cfg.steps:
        return
    if cfg.steps < done:
        raise ConfigError(
            f"--resume --steps {cfg.steps}: the run in {cfg.out_dir} has a checkpoint at step "
            f"{done} already; pass --steps {done} or more (or --steps {before}, its own)"
        )
    say(
        f"the run grows from {before} to {cfg.steps} steps: its learning-rate schedule warms "
        f"up and decays over {cfg.steps} steps from here on (steps before {done + 1} were "
        f"trained under the {before}-step schedule)"
    )
    tmp = path.with_suffix(".json.tmp")
    if "optim_options" in saved:  # by group (older ones were flat)
        saved["optim_options"]["steps"] = cfg.steps
    else:
        saved["steps"] = cfg.steps
    tmp.write_text(json.dumps(saved, indent=2, sort_keys=True))
    os.replace(tmp, path)


def warn_torn_metrics(path: Path, start: int) -> None:
    """Says so when the log's last line is torn (cut short by a stop, or damaged), which
    resume drops: whose step it was, and whether that step is trained again (after
    checkpoint ``start``) or its line is lost (a checkpointed step is not run again)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (1 << 16)))
            tail = f.read()
    except OSError:
        return
    lines = tail.split(b"\n")
    last = lines[-1] if tail and not tail.endswith(b"\n") else None
    if last is None:
        try:
            json.loads(lines[-2]) if len(lines) > 1 else None
            return
        except ValueError:
            last = lines[-2]
    step = None
    for line in reversed(lines[:-1]):  # the torn line fails to parse: skipped
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            step = record["step"] + 1
            break
    if step is None:
        step = 1
    if step <= start:
        say(
            f"the last line of {path} (step {step}'s, torn) is dropped; step {step} is in "
            f"checkpoint {start}, so it is not trained again and its metrics line is lost"
        )
    else:
        say(
            f"the last line of {path} (step {step}'s, torn by the stop) is dropped; step "
            f"{step} is trained again from checkpoint {start} and logged anew"
        )


def remove_run(cfg: TrainConfig) -> None:
    """Deletes what a run wrote in ``cfg.out_dir``, by name: its config, metrics logs,
    checkpoints (step folders) and, with the run's own store, that store's files. Anything
    else in the folder, or in those subfolders, is kept."""

    out = Path(cfg.out_dir)
    for name in ("metrics.jsonl", "config.json"):
        (out / name).unlink(missing_ok=True)
    for path in out.glob("metrics.process-*.jsonl"):  # of a run over several processes
        path.unlink()
    for sub in ("checkpoints", "checkpoints_paged"):
        for s in step_dirs(out / sub):
            shutil.rmtree(out / sub / str(s))
        if (out / sub).is_dir():  # orbax's unfinished saves, then the folder if left empty
            for tmp in (out / sub).glob("*.orbax-checkpoint-tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
            _rmdir_if_empty(out / sub)
    if cfg.store != "auto":
        return
    store = out / "store"  # the run's own store (all processes' stores) goes with it
    roots = [store, *sorted(store.glob("process-*"))] if store.is_dir() else []
    for root in roots:
        if not is_store(root):
            continue
        try:
            layout = read_manifest(str(root))[0]
        except PageStoreError:
            layout = None
        files = owned_files(str(root), layout)
        if files is not None:
            remove_owned(str(root), files)


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


UNVERIFIED_FLAG = "--resume-unverified"


def _unverified_allowed(cfg: TrainConfig) -> bool:
    return cfg.resume_unverified


def _unchecksummed(out: Path) -> list[int]:
    """The steps of a run none of whose checkpoints has checksums (else [])."""
    ckpt_dir = out / "checkpoints"
    steps = step_dirs(ckpt_dir)
    return [] if complete_steps(ckpt_dir) else steps


def _check_unchecksummed(cfg: TrainConfig) -> None:
    """Refuses to admit several checkpoints that have no checksums at all (every
    ``checksums.json`` deleted, or an older jaxoff) without an explicit flag. One such
    checkpoint is the first save cut short: it never counted (prepare_out_dir removes it)."""
    out = Path(cfg.out_dir)
    steps = _unchecksummed(out)
    if len(steps) < 2 or _unverified_allowed(cfg):
        return
    how = f"pass {UNVERIFIED_FLAG}"
    raise ConfigError(
        f"--resume: checkpoints {', '.join(map(str, steps))} in {out / 'checkpoints'} have no "
        f"checksums.json (deleted, or written by a jaxoff that did not checksum), so nothing "
        f"they hold can be verified; to resume from them unverified {how}, or start again "
        f"with --overwrite"
    )


def _adopt_unchecksummed(cfg: TrainConfig) -> None:
    """Records checksums for checkpoints of a run that has none at all, when the user asked
    for it (`_check_unchecksummed`): written by a jaxoff that did not checksum them, or with
    their checksums deleted. Each writer renames its directory into place, so they are whole;
    they are kept, unverified. A lone one without the flag is a first save cut short."""
    out = Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    steps = _unchecksummed(out)
    if not steps or (len(steps) < 2 and not _unverified_allowed(cfg)):
        return
    for s in steps:
        write_checksums(out, ckpt_dir / str(s), [out / "checkpoints_paged" / str(s) / "paged.json"])
    say(
        f"checkpoints {', '.join(map(str, steps))} in {ckpt_dir} had no checksums; recorded "
        f"them now, unverified, as asked"
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
    """Empties the working page store of a resumed run of its own files if it is damaged.

    The store (``<out_dir>/store`` or ``--store``) only ever runs ahead of the last checkpoint,
    so a store whose page files are damaged, short or missing is emptied here and refilled by
    the restore of checkpoint ``step`` (or by the optimizer's init when there is no
    checkpoint: ``None``). Only the files the store's marker or its layout name are deleted
    (its ``LOCK`` and marker kept): anything else in the folder is not jaxoff's.
    """

    root = cfg.store_dir()
    assert root is not None  # called for runs with a store only
    try:
        PageStore.open(root).close()
        return
    except PageStoreNotFoundError:
        return  # a new store directory: the restore creates it
    except (PageStoreCorruptError, PageStoreFormatError) as e:
        reason = str(e).split(": the store was damaged", 1)[0].split("; restore from", 1)[0]
    try:
        layout = read_manifest(str(root))[0]
    except PageStoreError:
        layout = None  # the manifest is what is damaged: the marker names the files
    files = owned_files(str(root), layout)
    if files is None:
        raise JaxoffError(
            f"the page store {root} is damaged ({reason}) and has neither a readable "
            f"manifest nor a jaxoff-store.json naming its files, so jaxoff deletes nothing "
            f"there; delete that folder yourself (or pass another --store), then --resume"
        )
    remove_owned(str(root), files)
    source = "the optimizer's init (step 0)" if step is None else f"checkpoint {step}"
    say(f"the page store {root} was damaged ({reason}); rebuilt it from {source}")

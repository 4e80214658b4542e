"""What ``jaxoff train`` checks before it creates a file or touches a lock: the data, the
places it writes (the page store owns its folder and never nests with a run), the run
directory (resume, overwrite) and a lower bound of the memory the shapes need.

Every check only reads; a refused invocation leaves the file system as it found it
(`train` also removes the empty folders that option validation made for it).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from .._errors import ConfigError
from ..aio import strangers
from ._config import TrainConfig
from ._data import data_batches
from ._resume import check_out_dir
from ._rundir import check_free

GIB = 1 << 30
RUN_MARKERS = ("run.lock", "config.json")  # what makes a folder a run directory


def preflight(cfg: TrainConfig) -> None:
    """All checks of a validated ``cfg`` that need no lock; raises :class:`ConfigError`."""

    check_store_place(cfg)
    if jax.process_index() == 0:  # the one that locks and prepares the run directory
        check_free(cfg.out_dir)
        check_out_dir(cfg)
    check_data(cfg)
    check_memory(cfg)


def missing_dirs(cfg: TrainConfig) -> list[Path]:
    """The folders `TrainConfig.validate` may create (the out-dir, the store, the compile
    cache, and their missing parents), those that do not exist yet, deepest first."""
    paths = [Path(cfg.out_dir)]
    try:
        store = cfg.store_dir()
        if store is not None:  # None exactly when cfg.store is "none"
            paths.append(store)
    except Exception:  # noqa: BLE001 - validate names a bad value
        pass
    if isinstance(cfg.compile_cache, str) and cfg.compile_cache not in ("auto", "none", ""):
        paths.append(Path(cfg.compile_cache).expanduser())
    missing = set()
    for p in paths:
        p = Path(os.path.abspath(p))
        while not p.exists() and p != p.parent:
            missing.add(p)
            p = p.parent
    return sorted(missing, key=lambda p: len(p.parts), reverse=True)


def remove_if_empty(dirs: list[Path]) -> None:
    """Removes those of ``dirs`` (deepest first) that are empty folders: the ones a refused
    invocation made. A folder holding anything is kept."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            pass


def _run_dir_above(path: Path) -> Path | None:
    for a in path.parents:
        if any((a / m).is_file() for m in RUN_MARKERS):
            return a
    return None


def check_store_place(cfg: TrainConfig) -> None:
    """``--store`` names a folder of its own: not the run directory, not above or inside it
    (other than the run's own ``<out-dir>/store``), not inside another run, and empty unless
    it is a jaxoff page store."""

    root = cfg.store_dir()
    if root is None:
        return
    out = Path(os.path.abspath(cfg.out_dir)).resolve()
    if cfg.store != "auto":
        given = Path(os.path.abspath(Path(cfg.store).expanduser())).resolve()
        if given == out:
            raise ConfigError(
                f"--store {cfg.store} is the --out-dir itself; the page store needs a folder "
                f"of its own: leave --store out (the run's store is then {out / 'store'}) or "
                f"name an empty folder outside the run"
            )
        if given in out.parents:
            raise ConfigError(
                f"--store {cfg.store} holds --out-dir {cfg.out_dir}; the page store needs a "
                f"folder of its own: leave --store out (the run's store is then "
                f"{out / 'store'}) or name an empty folder outside the run"
            )
        if out in given.parents and given != out / "store":
            raise ConfigError(
                f"--store {cfg.store} lies inside --out-dir {cfg.out_dir}; leave --store out "
                f"(the run's store is then {out / 'store'}) or name a folder outside the run"
            )
        other = _run_dir_above(given)
        if other is not None and other != out:
            raise ConfigError(
                f"--store {cfg.store} lies inside the run directory {other} (another run); "
                f"name a folder outside every run directory"
            )
    found = strangers(root)
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        what = "--store " + str(cfg.store) if cfg.store != "auto" else f"the run's store {root}"
        raise ConfigError(
            f"{what} is not empty and holds no jaxoff page store (it has {shown}); a store "
            f"needs an empty or new folder of its own (jaxoff writes and deletes only its own "
            f"files there)"
        )


def check_data(cfg: TrainConfig) -> None:
    """The tokens of ``cfg.data_options`` load, fit the model's vocabulary, and make batches
    of this size (the training loop's own `data_batches`)."""

    data_batches(
        cfg.data_options, cfg.seed, cfg.model_config().vocab_size, f"model {cfg.model_label()}"
    )


def param_bytes(model_cfg) -> tuple[int, int] | None:
    """``(parameters, bytes)`` of ``model_cfg``'s parameters, from shapes alone; None when
    the model cannot be traced abstractly."""

    try:
        abstract = nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0)))
        leaves = jax.tree.leaves(nnx.split(abstract, nnx.Param)[1])
    except Exception:  # noqa: BLE001 - a model that only builds for real: no estimate
        return None
    count = size = 0
    for x in leaves:
        n = 1
        for d in x.shape:
            n *= int(d)  # Python ints: 10**12 layers do not overflow
        count += n
        size += n * np.dtype(x.dtype).itemsize
    return count, size


def memory_bytes() -> int:
    """This machine's RAM plus the memory of its accelerators (0 each when unknown)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 0
    device = 0
    for d in jax.local_devices():
        if d.platform == "cpu":
            continue
        try:
            device += int((d.memory_stats() or {}).get("bytes_limit", 0))
        except Exception:  # noqa: BLE001 - a backend without memory stats
            pass
    return ram + device


def needed_bytes(cfg: TrainConfig) -> tuple[int, str] | None:
    """A lower bound of the memory one step needs, and what it is made of: the batch's
    tokens and a micro-batch's logits, the parameters (unless Fuyou pages them), with
    --grad-accum the float32 gradient accumulator and, without a page store, one float32
    of optimizer state per parameter."""
    model = cfg.model_config()
    params = param_bytes(model)
    if params is None:
        return None
    count, size = params
    tokens = cfg.batch_size * cfg.seq_len
    parts = {
        "the batch": cfg.grad_accum * tokens * 2 * 4,
        "its logits": tokens * model.vocab_size * 2,
        "the parameters": 0 if cfg.page_params else size,
        "the gradient accumulator": 4 * count if cfg.grad_accum > 1 else 0,
        "the optimizer state": 4 * count if cfg.store_dir() is None else 0,
    }
    listed = ", ".join(f"{k} {v / GIB:,.1f} GiB" for k, v in parts.items() if v)
    return sum(parts.values()), listed


def check_memory(cfg: TrainConfig) -> None:
    """Refuses shapes whose lower bound of memory exceeds everything this machine has."""
    have = memory_bytes()
    need = needed_bytes(cfg)
    if not have or need is None or need[0] <= have:
        return
    raise ConfigError(
        f"model {cfg.model_label()} with --batch-size {cfg.batch_size} x --seq-len "
        f"{cfg.seq_len} needs at least {need[0] / GIB:,.0f} GiB ({need[1]}), more than this "
        f"machine's {have / GIB:,.0f} GiB of RAM and device memory; choose a smaller model, "
        f"--batch-size or --seq-len"
    )

"""Fault injection: `jaxoff train` killed, starved of disk and corrupted, as a user's run is.

Every scenario runs real ``jaxoff train`` processes on the ``tiny`` model with a paged
optimizer, and every scenario that can finish ends bitwise equal to one uninterrupted run of
the same options: each step's loss and gradient norm logged exactly once, the final
parameters, and the final paged optimizer state (its checkpoint's page files byte for byte).

- SIGKILL at the fault points of :mod:`jaxoff._faults` (init, steps, metrics line, page
  writes, store commits, the paged and the orbax checkpoint writers), in chains of 10 kills
  for a 2-slot and a 1-slot store, each kill followed by ``--resume``; and SIGKILL at random
  times.
- Corruption of every kind of file jaxoff writes: the working store (pages and manifest) is
  rebuilt from the checkpoint by ``--resume``; a damaged checkpoint (paged or orbax), config
  or manifest is refused with one line naming the file, and ``--resume-fallback`` then
  resumes from the previous checkpoint.
- ENOSPC on a small tmpfs at the store, the paged checkpoint and the orbax checkpoint, and
  RLIMIT_FSIZE at the store and the orbax checkpoint: one line, then ``--resume`` with room.
- Two processes on one run directory and on one store, with ``--resume`` and ``--overwrite``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from _limits import HANG_S

from jaxoff._faults import POINTS
from jaxoff.train import read_metrics
from jaxoff.train._options import flat_options

pytestmark = [pytest.mark.faults, pytest.mark.subprocess]

STEPS = 24
ARGS = [
    "--model", "tiny", "--batch-size", "2", "--seq-len", "32", "--eval-every", "0",
    "--ckpt-every", "2", "--keep-checkpoints", "2", "--no-progress", "--chunk-mib", "1",
]  # fmt: skip
FALLBACK = "--resume-fallback"


def _env(cache: Path | None, fault: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("JAXOFF_FAULT", None)
    if fault:
        env["JAXOFF_FAULT"] = fault
    if cache is not None:  # the children share compiled programs (tracing still runs)
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    else:  # nor the suite's cache (conftest.py): no cache write meets a file size limit
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


# sets the file size limit, then becomes the command (no fork of this multithreaded process
# with a preexec_fn); Python ignores SIGXFSZ, so a write past the limit fails with EFBIG
_WITH_FSIZE = (
    "import os, resource, sys; limit = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); os.execv(sys.argv[2], sys.argv[2:])"
)


@dataclasses.dataclass
class Jaxoff:
    """Runs ``jaxoff train`` children with the suite's options and a shared compile cache."""

    cache: Path

    def cmd(self, run: Path, *extra: str, steps: int = STEPS) -> list[str]:
        return [
            sys.executable, "-m", "jaxoff.cli", "train", *ARGS,
            "--steps", str(steps), "--out-dir", str(run), *extra,
        ]  # fmt: skip

    def train(
        self, run: Path, *extra: str, fault=None, rlimit=None, steps=STEPS
    ) -> subprocess.CompletedProcess:
        try:
            cmd = self.cmd(run, *extra, steps=steps)
            if rlimit:
                cmd = [sys.executable, "-c", _WITH_FSIZE, str(rlimit), *cmd]
            return subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=HANG_S,
                env=_env(None if rlimit else self.cache, fault),
            )
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"jaxoff train hung (no exit in {HANG_S:.0f} s): {e.cmd}")

    def start(self, run: Path, *extra: str, steps=STEPS) -> subprocess.Popen:
        return subprocess.Popen(
            self.cmd(run, *extra, steps=steps),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(self.cache),
        )


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stderr


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The failure is one line ``jaxoff train: error: ...`` and no traceback; returns it."""
    assert proc.returncode not in (0, -9), f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("jaxoff train: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    return errors[0]


def _latest(run: Path) -> int:
    return max(int(d.name) for d in (run / "checkpoints").iterdir() if d.name.isdigit())


@dataclasses.dataclass
class Record:
    """What must be bitwise equal between two runs of the same options."""

    steps: list[int]
    losses: list[float]
    grad_norms: list[float]
    params: list[np.ndarray]
    step: int
    paged: dict[str, bytes]

    @classmethod
    def of(cls, run: Path) -> Record:
        metrics = read_metrics(run / "metrics.jsonl")
        last = _latest(run)
        with ocp.StandardCheckpointer() as ckpt:
            saved = ckpt.restore(run / "checkpoints" / str(last) / "default")
        paged = run / "checkpoints_paged" / str(last)
        return cls(
            steps=[r["step"] for r in metrics],
            losses=[r["loss"] for r in metrics],
            grad_norms=[r["grad_norm"] for r in metrics],
            params=[np.asarray(x) for x in jax.tree.leaves(saved["params"])],
            step=int(np.asarray(saved["step"]).reshape(-1)[0]),
            paged={p.name: p.read_bytes() for p in sorted(paged.glob("*.page"))},
        )

    def assert_equals(self, want: Record) -> None:
        assert self.steps == list(range(1, STEPS + 1)), f"steps logged: {self.steps}"
        assert self.losses == want.losses
        assert self.grad_norms == want.grad_norms
        assert self.step == want.step == STEPS
        assert len(self.params) == len(want.params)
        for a, b in zip(self.params, want.params, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        assert self.paged.keys() == want.paged.keys() and self.paged, sorted(self.paged)
        differing = [name for name in want.paged if self.paged[name] != want.paged[name]]
        assert not differing, f"paged optimizer state differs in {differing}"


@dataclasses.dataclass
class Baseline:
    run: Path
    record: Record
    wall_s: float

    def bytes_of(self, sub: str) -> int:
        return sum(f.stat().st_size for f in (self.run / sub).rglob("*") if f.is_file())

    def largest(self, sub: str) -> int:
        return max(f.stat().st_size for f in (self.run / sub).rglob("*") if f.is_file())


@pytest.fixture(scope="session")
def jaxoff(tmp_path_factory) -> Jaxoff:
    # shared by xdist workers: the parent of a worker's base temp is the session's
    cache = tmp_path_factory.getbasetemp().parent / "jaxoff-faults-jax-cache"
    cache.mkdir(exist_ok=True)
    return Jaxoff(cache)


def _train_baseline(jaxoff: Jaxoff, run: Path) -> float:
    t = time.perf_counter()
    _ok(jaxoff.train(run, "--store", "auto", "--store-slots", "2"))
    return time.perf_counter() - t


@pytest.fixture(scope="session")
def baseline(jaxoff, tmp_path_factory) -> Baseline:
    """The uninterrupted run, trained once per session: under xdist the workers share it (the
    first to take the lock trains it, the others read it; no test writes to it)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        run = tmp_path_factory.mktemp("baseline") / "run"
        wall = _train_baseline(jaxoff, run)
    else:
        shared = tmp_path_factory.getbasetemp().parent / "jaxoff-faults-baseline"  # the session's
        run, wall_file = shared / "run", shared / "wall_s"
        with open(f"{shared}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not wall_file.exists():
                shutil.rmtree(shared, ignore_errors=True)
                shared.mkdir()
                wall_file.write_text(repr(_train_baseline(jaxoff, run)))
        wall = float(wall_file.read_text())
    record = Record.of(run)
    assert record.losses[-1] < record.losses[0]  # it trains
    return Baseline(run, record, wall)


# --- SIGKILL at fault points -------------------------------------------------------------------

# points reached at most once before the run's next checkpoint completes: a kill there costs at
# most one checkpoint interval, so 10 kills fit in the run
_ONCE = ["train.init", "checkpoint.paged", "checkpoint.orbax", "checkpoint.done"]
_PER_STEP = [
    "train.step", "train.metrics", "pager.begin", "pager.take", "pager.put", "pager.commit",
    "store.commit",
]  # fmt: skip


def _kill_plan(seed: int, kills: int = 12) -> list[str]:
    """Every fault point at least once, the rest drawn at random, in a random order."""
    rng = random.Random(seed)
    names = list(POINTS) + [rng.choice(list(POINTS)) for _ in range(kills - len(POINTS))]
    rng.shuffle(names)
    return [f"{n}:1" if n in _ONCE else f"{n}:{rng.randint(1, 2)}" for n in names]


def test_kill_plan_covers_every_fault_point():
    assert set(_ONCE + _PER_STEP) == set(POINTS)
    for seed in (1, 2):
        plan = _kill_plan(seed)
        assert len(plan) == 12 and {p.split(":")[0] for p in plan} == set(POINTS)


@pytest.mark.slow
@pytest.mark.parametrize("slots,seed", [(2, 1), (1, 2)])
def test_sigkill_at_ten_fault_points_then_resume_is_bitwise(
    jaxoff, baseline, tmp_path, slots, seed
):
    run = tmp_path / "run"
    opts = ("--store", "auto", "--store-slots", str(slots))
    for i, fault in enumerate(_kill_plan(seed)):
        proc = jaxoff.train(run, *opts, *(("--resume",) if i else ()), fault=fault)
        assert proc.returncode == -signal.SIGKILL, (
            f"kill {i} at {fault} (seed {seed}) was not reached: exit {proc.returncode}\n"
            f"{proc.stderr}"
        )
    _ok(jaxoff.train(run, *opts, "--resume"))
    Record.of(run).assert_equals(baseline.record)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_a_random_time_then_resume_is_bitwise(jaxoff, baseline, tmp_path, seed):
    run = tmp_path / "run"
    opts = ("--store", "auto", "--store-slots", str(1 + seed % 2))
    delay = random.Random(seed).uniform(0.2, 1.0) * baseline.wall_s
    child = jaxoff.start(run, *opts)
    try:
        child.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGKILL)
    child.communicate(timeout=HANG_S)
    # killed before the run directory existed: there is nothing to resume, start it
    resume = ("--resume",) if (run / "config.json").exists() else ()
    _ok(jaxoff.train(run, *opts, *resume))
    Record.of(run).assert_equals(baseline.record)


# --- corrupted files ---------------------------------------------------------------------------


def _flip(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _largest_file(directory: Path) -> Path:
    return max((f for f in directory.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)


def _store_pages(run: Path) -> list[Path]:
    return sorted((run / "store" / "data").glob("*.page"))


def _manifest_shape_swap(run: Path) -> None:
    """Edits a shape in the store manifest, keeping its byte count ([5, 4, 32] -> [5, 32, 4])."""
    path = run / "store" / "manifest.json"
    manifest = json.loads(path.read_text())
    entry = next(e for e in manifest["entries"].values() if e["shape"] == [5, 4, 32])
    entry["shape"] = [5, 32, 4]
    path.write_text(json.dumps(manifest, indent=1))


def _lr_in_config(run: Path) -> None:
    path = run / "config.json"
    text = path.read_text()
    assert '"lr": 0.003' in text
    path.write_text(text.replace('"lr": 0.003', '"lr": 0.002'))


def _torn_metrics(run: Path) -> None:
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "loss": 2.')


# working-store damage: --resume rebuilds the store from the checkpoint and says so
HEALED = {
    "store page flipped": lambda run: [_flip(p) for p in _store_pages(run)[:4]],
    "store page truncated": lambda run: os.truncate(_store_pages(run)[0], 100),
    "store page missing": lambda run: _store_pages(run)[-1].unlink(),
    "store manifest shape edited": _manifest_shape_swap,
    "store manifest truncated": lambda run: os.truncate(run / "store" / "manifest.json", 50),
    "metrics line torn": _torn_metrics,
}

# checkpoint damage: refused with the file named; --resume-fallback resumes from the previous
REFUSED = {
    "paged checkpoint page": lambda run: _flip(_largest_file(run / "checkpoints_paged" / "12")),
    "paged checkpoint page deleted": lambda run: _largest_file(
        run / "checkpoints_paged" / "12"
    ).unlink(),
    "paged checkpoint json": lambda run: _flip(run / "checkpoints_paged" / "12" / "paged.json", 60),
    "orbax checkpoint data": lambda run: _flip(_largest_file(run / "checkpoints" / "12")),
    "orbax checkpoint metadata": lambda run: _flip(
        run / "checkpoints" / "12" / "default" / "_METADATA", 40
    ),
}


def _plant(*folders: Path) -> dict[Path, bytes]:
    """A file of the user's in each of ``folders`` (created if missing); returns them with
    their bytes for `_untouched`."""
    planted = {}
    for i, d in enumerate(folders):
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"users-file-{i}.txt"
        path.write_bytes(f"the user's own file {i}, not jaxoff's\n".encode())
        planted[path] = path.read_bytes()
    return planted


def _untouched(planted: dict[Path, bytes]) -> None:
    for path, data in planted.items():
        assert path.is_file() and path.read_bytes() == data, f"{path} was changed or deleted"


def _tree(root: Path, but: str | None = None) -> dict[str, bytes | None]:
    """Every file under ``root`` with its bytes, every folder (None); without the folder
    ``but`` (relative to ``root``)."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
        if but is None or not p.relative_to(root).parts[:1] == (but,)
    }


@pytest.fixture(scope="session")
def stopped_run(jaxoff, tmp_path_factory) -> Path:
    """A run stopped at step 12 (checkpoints 10 and 12), copied by each corruption test."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    _ok(jaxoff.train(run, "--store", "auto", "--stop-at", "12"))
    assert _latest(run) == 12
    return run


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(HEALED))
def test_damaged_working_files_are_healed_by_resume(jaxoff, baseline, stopped_run, tmp_path, kind):
    run = tmp_path / "moved-run"  # also resumes where the run directory now lies
    shutil.copytree(stopped_run, run)
    HEALED[kind](run)
    # the user's files beside the run's, in its checkpoints folder and in its store's folder
    planted = _plant(run, run / "checkpoints", run / "store", run / "store" / "data")
    err = _ok(jaxoff.train(run, "--store", "auto", "--resume"))
    _untouched(planted)
    for path in planted:
        path.unlink()  # (not part of the record)
    if kind in ("store page missing", "store manifest shape edited", "store manifest truncated"):
        assert "rebuil" in err.lower(), err  # the store did not open: says it rebuilt it
    # (a flipped or truncated page is overwritten unread: --resume rewrites every chunk of the
    # working store from the checkpoint before the first step reads it)
    Record.of(run).assert_equals(baseline.record)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_damaged_checkpoints_are_refused_then_fall_back(
    jaxoff, baseline, stopped_run, tmp_path, kind
):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    REFUSED[kind](run)
    before = _tree(run, but="store")
    error = _one_line_error(jaxoff.train(run, "--store", "auto", "--resume"))
    assert "checkpoint 12" in error and FALLBACK in error, error  # the checkpoint, the way out
    # nothing trained, nothing lost, run.lock as it was; only the working store may differ
    # (a paged checkpoint is verified as it is copied into it; --resume rewrites it anyway)
    assert _tree(run, but="store") == before
    _ok(jaxoff.train(run, "--store", "auto", "--resume", FALLBACK))
    Record.of(run).assert_equals(baseline.record)


@pytest.mark.slow
def test_a_rebuilt_store_keeps_the_users_files(jaxoff, baseline, tmp_path):
    """Issue 46: a single-slot --store left mid-update by a crash, its manifest damaged, is
    rebuilt by --resume, deleting only the files its marker names: the user's own files in
    that folder stay."""
    run, store = tmp_path / "run", tmp_path / "opt-store"
    opts = ("--store", str(store), "--store-slots", "1")
    proc = jaxoff.train(run, *opts, fault="pager.put:300")  # mid-update, after a checkpoint
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (store / "IN_PLACE_OPEN").exists() and (store / "jaxoff-store.json").exists()
    planted = _plant(store, store / "data", tmp_path)
    os.truncate(store / "manifest.json", 50)  # and its manifest damaged: the marker names files
    err = _ok(jaxoff.train(run, *opts, "--resume"))
    assert "rebuil" in err.lower(), err
    _untouched(planted)
    Record.of(run).assert_equals(baseline.record)


@pytest.mark.slow
def test_overwrite_removes_only_what_the_run_wrote(jaxoff, stopped_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    planted = _plant(run, run / "checkpoints", run / "store", run / "store" / "data")
    planted |= _plant(run / "notes", run / "checkpoints" / "mine")
    _ok(jaxoff.train(run, "--store", "auto", "--overwrite", steps=2))
    _untouched(planted)
    assert read_metrics(run / "metrics.jsonl")[-1]["step"] == 2  # and it trained anew


def test_store_above_the_run_is_refused_and_nothing_changes(jaxoff, stopped_run, tmp_path):
    """Issue 46: --store runs --out-dir runs/exp1, with another run under runs/: one line,
    before anything is written (it used to delete every run under runs/)."""
    runs = tmp_path / "runs"
    shutil.copytree(stopped_run, runs / "exp0")
    before = _tree(tmp_path)
    for store, out in [(runs, runs / "exp1"), (runs / "exp0", runs / "exp1"), (runs, runs)]:
        error = _one_line_error(jaxoff.train(out, "--store", str(store), "--resume"))
        assert "--store" in error, error
        error = _one_line_error(jaxoff.train(out, "--store", str(store), "--overwrite"))
        assert "--store" in error, error
        assert _tree(tmp_path) == before


def test_a_config_edited_by_hand_is_refused(jaxoff, stopped_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    _lr_in_config(run)
    error = _one_line_error(jaxoff.train(run, "--store", "auto", "--resume"))
    assert "lr: 0.002 -> 0.003" in error, error


def test_a_truncated_config_is_refused(jaxoff, stopped_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    os.truncate(run / "config.json", 30)
    error = _one_line_error(jaxoff.train(run, "--store", "auto", "--resume"))
    assert "config.json" in error, error


# --- full disks and file size limits ------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(path: Path, size: int):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    mounted = subprocess.run(mount, capture_output=True, text=True)
    if mounted.returncode != 0:  # root without the right to mount (a restricted container)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield lambda new: subprocess.run(
            ["mount", "-o", f"remount,size={new}", str(path)], check=True
        )
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _page_round(n: int) -> int:
    return -(-n // 4096) * 4096


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["store", "paged checkpoint", "orbax checkpoint"])
def test_disk_full_at_each_writer_then_resume_is_bitwise(jaxoff, baseline, tmp_path, writer):
    store_bytes = baseline.bytes_of("store")
    paged = baseline.bytes_of("checkpoints_paged") // 2  # two checkpoints are kept
    orbax = baseline.bytes_of("checkpoints") // 2
    slack = 1 << 20  # config, metrics, orbax's small files, tmpfs bookkeeping
    if writer == "store":  # the store is on the small disk, the run directory is not
        disk, run, opts = tmp_path / "disk", tmp_path / "run", ("--store", str(tmp_path / "disk"))
        size = store_bytes // 2
    else:  # the run directory with its checkpoints is on the small disk, the store is not
        disk, run = tmp_path / "disk", tmp_path / "disk" / "run"
        opts = ("--store", str(tmp_path / "store"))
        one = orbax + paged  # checkpoint 2 fits; checkpoint 4 fails in its first or second writer
        size = one + slack + (paged // 2 if writer == "paged checkpoint" else paged + orbax // 2)
    with _tmpfs(disk, _page_round(size)) as resize:
        error = _one_line_error(jaxoff.train(run, *opts))
        assert "space" in error.lower(), error
        resize(_page_round(4 * (store_bytes + paged + orbax)))
        # a run that failed before its first checkpoint resumes from the start
        _ok(jaxoff.train(run, *opts, *(("--resume",) if (run / "config.json").exists() else ())))
        Record.of(run).assert_equals(baseline.record)


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["store", "orbax checkpoint"])
def test_file_size_limit_at_a_writer_then_resume_is_bitwise(jaxoff, baseline, tmp_path, writer):
    store_file = baseline.largest("store")
    orbax_file = baseline.largest("checkpoints")
    assert orbax_file > store_file  # the orbax checkpoint writes the run's largest file
    limit = store_file // 2 if writer == "store" else (store_file + orbax_file) // 2
    run = tmp_path / "run"
    error = _one_line_error(jaxoff.train(run, "--store", "auto", rlimit=limit))
    assert "size limit" in error.lower() or "too large" in error.lower(), error
    _ok(jaxoff.train(run, "--store", "auto", "--resume"))
    Record.of(run).assert_equals(baseline.record)


# --- two processes ------------------------------------------------------------------------------


@pytest.mark.slow
def test_second_process_on_a_live_run_or_its_store_is_refused(jaxoff, tmp_path):
    run, store = tmp_path / "run", tmp_path / "store"
    live = jaxoff.start(run, "--store", str(store), "--ckpt-every", "50", steps=10**6)
    try:
        deadline = time.monotonic() + HANG_S
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            assert live.poll() is None, live.communicate()[1]
            assert time.monotonic() < deadline, "the first run never logged a step"
            time.sleep(0.5)
        others = {
            "overwrite": jaxoff.train(run, "--store", str(store), "--overwrite", steps=10**6),
            "resume": jaxoff.train(run, "--store", str(store), "--resume", steps=10**6),
            "plain": jaxoff.train(run, "--store", str(store), steps=10**6),
            "same store": jaxoff.train(tmp_path / "other", "--store", str(store)),
        }
        for what, proc in others.items():
            error = _one_line_error(proc)
            assert "pid" in error.lower() or "in use" in error.lower() or "lock" in error.lower(), (
                what,
                error,
            )
        assert live.poll() is None, "the live run died"
        lines = len(read_metrics(run / "metrics.jsonl"))
        assert (run / "config.json").exists() and (store / "manifest.json").exists()
        assert flat_options(json.loads((run / "config.json").read_text()))["steps"] == 10**6
        assert not (tmp_path / "other" / "metrics.jsonl").exists()
        time.sleep(1.0)
        assert len(read_metrics(run / "metrics.jsonl")) >= lines  # still training, log intact
    finally:
        live.send_signal(signal.SIGKILL)
        live.communicate(timeout=HANG_S)
    # the killed run resumes (its checkpoint or, before one, from the start)
    latest = (
        _latest(run)
        if (run / "checkpoints").exists()
        and any(d.name.isdigit() for d in (run / "checkpoints").iterdir())
        else 0
    )
    proc = jaxoff.train(
        run, "--store", str(store), "--resume", "--stop-at", str(latest + 2), steps=10**6
    )
    _ok(proc)
    assert read_metrics(run / "metrics.jsonl")[-1]["step"] == latest + 2


# --- the user's files are never touched: random sequences --------------------------------------

_USERS = [  # the user's own files, relative to the home folder
    "notes.txt",
    "data/corpus-notes.md",
    "runs/README",
    "runs/exp1/mine.txt",  # beside a run's files
    "runs/exp1/checkpoints/keep.txt",  # in a folder jaxoff writes into
    "runs/exp2/notes/a.txt",
]


def _bad_invocations(home: Path) -> list[list[str]]:
    runs = home / "runs"
    out1, out2 = ["--out-dir", str(runs / "exp1")], ["--out-dir", str(runs / "exp2")]
    return [
        [*out1, "--store", str(runs)],  # a folder above the run (and other runs)
        [*out1, "--store", str(home), "--overwrite"],
        [*out2, "--store", str(runs / "exp1"), "--resume"],  # another run's directory
        [*out2, "--store", str(runs / "exp1" / "checkpoints")],  # a run's folder
        [*out1, "--store", str(home / "data"), "--resume"],  # the user's folder
        [*out1, "--store", str(runs / "exp1")],  # the out-dir itself
        [*out2, "--batch-size", "0", "--overwrite"],
        [*out1, "--data", str(home / "notes.txt"), "--overwrite"],  # too short to train on
    ]


@pytest.mark.slow
def test_random_sequences_never_touch_the_users_files(jaxoff, tmp_path):
    """Train, kill, resume, overwrite, damage and bad invocations in a random (seeded) order
    over a folder that holds the user's own files: those are never changed or deleted, and a
    refused invocation leaves the whole folder as it was (run.lock included)."""
    from jaxoff.cli import main

    home = tmp_path / "home"
    planted = {}
    for rel in _USERS:
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"the user's own {rel}\n".encode())
        planted[path] = path.read_bytes()
    runs = {
        "exp1": (home / "runs" / "exp1", ("--store", "auto")),
        "exp2": (home / "runs" / "exp2", ("--store", str(home / "stores" / "exp2"))),
    }
    rng = random.Random(46)
    actions = ["train", "kill", "resume", "overwrite", "damage", "bad"]
    plan = actions + [rng.choice(actions + ["bad", "kill", "resume"]) for _ in range(8)]
    rng.shuffle(plan)  # every action at least once, 14 in all
    seen = []
    for action in plan:
        name = rng.choice(sorted(runs))
        run, opts = runs[name]
        seen.append(f"{action} {name}")
        steps = 6
        if action == "train":
            jaxoff.train(run, *opts, steps=steps)
        elif action == "kill":
            point = rng.choice(list(POINTS))
            resume = ("--resume",) if (run / "config.json").exists() else ()
            jaxoff.train(run, *opts, *resume, fault=f"{point}:1", steps=steps)
        elif action == "resume":
            jaxoff.train(run, *opts, "--resume", steps=steps)
        elif action == "overwrite":
            jaxoff.train(run, *opts, "--overwrite", steps=steps)
        elif action == "damage":  # the working store's manifest: --resume rebuilds it
            store = run / "store" if opts[1] == "auto" else Path(opts[1])
            if (store / "manifest.json").exists():
                os.truncate(store / "manifest.json", 40)
        else:
            argv = rng.choice(_bad_invocations(home))
            before = _tree(home)
            code = main(["train", *ARGS, "--steps", str(steps), *argv])
            assert code == 2, (seen, argv)
            assert _tree(home) == before, (seen, argv)
        _untouched(planted)
    assert {a.split()[0] for a in seen} >= {"train", "kill", "resume", "overwrite", "bad"}, seen

"""Training across processes: ``jaxoff launch --processes 2 -- train --fsdp 4 --store auto``.

Two processes × two CPU devices, FSDP over the four, a paged optimizer whose store is one per
process, holding that process's blocks. Against the same mesh in one process, and against
the in-RAM optimizer on the same two processes; then SIGKILL of one process at ten fault
points, each followed by ``--resume`` of both, ending bitwise equal to an uninterrupted run;
a damaged part of one process's checkpoint, and another process count, refused.
"""

from __future__ import annotations

import dataclasses
import fcntl
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

from jaxoff import _faults
from jaxoff.distributed import ShardedParams, from_host, initialize_from_env, local_box
from jaxoff.train import read_metrics

# a sitecustomize that lets every process write its compiled programs to the cache (see there)
_EVERY_PROCESS_CACHES = str(Path(__file__).parent / "_every_process_caches")

STEPS = 10
ARGS = [
    "--model", "tiny", "--batch-size", "4", "--seq-len", "32", "--eval-every", "0",
    "--ckpt-every", "2", "--keep-checkpoints", "2", "--no-progress", "--chunk-mib", "1",
    "--fsdp", "4", "--steps", str(STEPS),
]  # fmt: skip


@dataclasses.dataclass
class Runner:
    cache: Path

    def env(self, fault: str | None = None, process: int | None = None) -> dict:
        env = dict(os.environ)
        for k in ("JAXOFF_FAULT", "JAXOFF_FAULT_PROCESS", "JAX_NUM_PROCESSES"):
            env.pop(k, None)
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"  # one process: 4 devices
        env["JAX_COMPILATION_CACHE_DIR"] = str(self.cache)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
        # jax caches process 0's programs only; on CPU process 1's have keys of their own,
        # which it would compile again in every run (~20 s under load, a timeout for gloo's
        # 30 s handshake with a process 0 that has long finished its cached compiles)
        paths = [_EVERY_PROCESS_CACHES, env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
        if fault:
            env["JAXOFF_FAULT"], env["JAXOFF_FAULT_PROCESS"] = fault, str(process)
        return env

    def cmd(self, run: Path, *extra, processes=2) -> list[str]:
        train = ["train", *ARGS, "--out-dir", str(run), *extra]
        if processes > 1:
            launch = ["launch", "--processes", str(processes), "--devices-per-process"]
            train = [*launch, str(4 // processes), "--grace", "2", "--", *train]
        return [sys.executable, "-m", "jaxoff", *train]

    def start(self, run: Path, *extra) -> subprocess.Popen:
        return subprocess.Popen(
            self.cmd(run, *extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(),
        )

    def run(self, run: Path, *extra, processes=2, fault=None, process=None):
        try:
            return subprocess.run(
                self.cmd(run, *extra, processes=processes),
                capture_output=True,
                text=True,
                timeout=HANG_S,
                env=self.env(fault, process),
            )
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"jaxoff hung (no exit in {HANG_S:.0f} s): {e.cmd}")


def _ok(proc) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stderr


@dataclasses.dataclass
class Record:
    losses: list[float]
    grad_norms: list[float]
    params: list[np.ndarray]
    paged: dict[str, bytes]

    @classmethod
    def of_step(cls, run: Path, step: int) -> Record:
        """The parameters of checkpoint ``step`` (0: the initial ones, re-built)."""
        from flax import nnx

        from jaxoff.models import load_model

        model = load_model("tiny").build(nnx.Rngs(0))  # the trainer's --seed default
        params = [np.asarray(x) for x in jax.tree.leaves(nnx.split(model, nnx.Param)[1])]
        return cls([], [], params, {})

    @classmethod
    def of(cls, run: Path) -> Record:
        metrics = read_metrics(run / "metrics.jsonl")
        assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))
        path = run / "checkpoints" / str(STEPS) / "default"
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # saved by 2 processes
        with ocp.StandardCheckpointer() as ckpt:
            meta = ckpt.metadata(path).item_metadata
            target = jax.tree.map(
                lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), meta
            )
            saved = ckpt.restore(path, target)
        assert int(np.asarray(saved["step"]).reshape(-1)[0]) == STEPS
        paged = run / "checkpoints_paged" / str(STEPS)
        return cls(
            losses=[r["loss"] for r in metrics],
            grad_norms=[r["grad_norm"] for r in metrics],
            params=[np.asarray(x) for x in jax.tree.leaves(saved["params"])],
            paged={
                p.relative_to(paged).as_posix(): p.read_bytes()
                for p in sorted(paged.rglob("*.page"))
            },
        )

    def assert_equals(self, want: Record, paged: bool = True) -> None:
        assert self.losses == want.losses
        assert self.grad_norms == want.grad_norms
        for a, b in zip(self.params, want.params, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        if paged:
            assert self.paged.keys() == want.paged.keys() and self.paged
            differing = [n for n in want.paged if self.paged[n] != want.paged[n]]
            assert not differing, f"paged optimizer state differs in {differing}"


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Runner:
    cache = tmp_path_factory.getbasetemp().parent / "jaxoff-distributed-jax-cache"
    cache.mkdir(exist_ok=True)
    return Runner(cache)


@pytest.fixture(scope="module")
def two(runner, tmp_path_factory) -> tuple[Path, Record]:
    """The uninterrupted two-process run, trained once per session: under xdist the workers
    share it (the first to take the lock trains it, the others read it; no test writes to
    it), since xdist may hand this module's tests to both workers."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        run = tmp_path_factory.mktemp("two") / "run"
        _ok(runner.run(run, "--store", "auto"))
        return run, Record.of(run)
    shared = tmp_path_factory.getbasetemp().parent / "jaxoff-distributed-two"  # this session's
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        run, done = shared / "run", shared / "done"
        if not done.exists():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            _ok(runner.run(run, "--store", "auto"))
            done.touch()
    return run, Record.of(run)


# --- one process's blocks, as host arrays and back ---------------------------------------------


def test_blocks_of_a_sharded_array_go_to_the_host_and_back():
    mesh = jax.make_mesh((4,), ("fsdp",), devices=jax.devices()[:4])
    full = {"w": np.arange(8 * 8, dtype=np.float32).reshape(8, 8), "b": np.arange(3.0)}
    specs = {"w": jax.sharding.PartitionSpec(None, "fsdp"), "b": jax.sharding.PartitionSpec()}
    shardings = {k: jax.sharding.NamedSharding(mesh, s) for k, s in specs.items()}
    arrays = {k: from_host(full[k], shardings[k]) for k in full}
    assert local_box((8, 8), shardings["w"]) == (slice(0, 8), slice(0, 8))  # one process
    layout = ShardedParams(arrays, shardings)
    local = layout.to_local(arrays)
    assert all(np.array_equal(local[k], full[k]) for k in full)
    back = layout.to_global({k: v + 1 for k, v in local.items()})
    assert back["w"].sharding == shardings["w"]
    assert np.array_equal(np.asarray(back["w"]), full["w"] + 1)
    # every device holds its column block of w
    for shard in back["w"].addressable_shards:
        assert np.array_equal(np.asarray(shard.data), (full["w"] + 1)[shard.index])


def test_fault_points_arm_in_the_named_process_only(monkeypatch):
    monkeypatch.setenv("JAXOFF_FAULT", "train.step:3")
    for pid, fault_process, armed in [("0", "1", False), ("1", "1", True), (None, "0", True)]:
        monkeypatch.setattr(_faults, "_armed", None)
        if pid is None:
            monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
        else:
            monkeypatch.setenv("JAX_PROCESS_ID", pid)
        monkeypatch.setenv("JAXOFF_FAULT_PROCESS", fault_process)
        assert _faults.armed("train.step") is armed
    monkeypatch.setattr(_faults, "_armed", None)


@pytest.mark.parametrize(
    "env, words",
    [
        ({"JAX_NUM_PROCESSES": "2"}, ["JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID not set"]),
        ({"JAX_NUM_PROCESSES": "two"}, ["JAX_NUM_PROCESSES='two'", "integer"]),
        (
            {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2", "JAX_COORDINATOR_ADDRESS": "h:1"},
            ["JAX_PROCESS_ID=2 must be less than JAX_NUM_PROCESSES=2"],
        ),
        (
            {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "-1", "JAX_COORDINATOR_ADDRESS": "h:1"},
            ["JAX_PROCESS_ID='-1'", "at least 0"],
        ),
    ],
)
def test_a_malformed_environment_is_refused_before_joining(env, words):
    from jaxoff._errors import ConfigError

    with pytest.raises(ConfigError) as e:
        initialize_from_env(env)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_one_process_needs_no_coordinator():
    assert initialize_from_env({}) is False
    assert initialize_from_env({"JAX_NUM_PROCESSES": "1"}) is False


# --- two processes against one ----------------------------------------------------------------


@pytest.mark.subprocess
def test_two_processes_train_as_the_same_mesh_does(runner, two, tmp_path):
    """Two processes with the paged optimizer (a store each) against: the in-RAM optimizer on
    the same two processes, the paged optimizer on the same 4-device mesh in one process, and
    two processes with host parameters streamed a layer ahead. Within a bound, not bitwise:
    the cross-process all-reduce (gloo) sums the gradients in another order than XLA's
    in-process one, and the paged update runs apart from the gradient program instead of
    fused into it (FMA contraction), so losses differ in their last bits from step 2 on."""
    run, record = two
    assert record.losses[-1] < record.losses[0]  # it trains
    stores = [run / "store" / f"process-{p}" for p in range(2)]
    assert all((s / "manifest.json").is_file() for s in stores)
    assert {k.split("/")[0] for k in record.paged} == {"process-0", "process-1"}

    plain = tmp_path / "plain"
    _ok(runner.run(plain, "--store", "none"))
    one = tmp_path / "one"
    _ok(runner.run(one, "--store", "auto", processes=1))
    # host parameters, streamed a layer ahead (L2L), each process paging its blocks
    streamed = tmp_path / "streamed"
    placement = ("--placement", "host_params_stream1", "--policy", "full")
    _ok(runner.run(streamed, "--store", "auto", *placement))
    init, single = Record.of_step(one, 0), Record.of(one)
    for other in (Record.of(plain), single, Record.of(streamed)):
        assert other.losses[0] == record.losses[0]  # the same initial model and batch
        # the weights move by up to ~1e-2 in 10 AdamW steps; the runs agree to within 1% of
        # that (measured after 4 steps: 1.7e-6 for a move of 6.5e-3, see docs/guide/distributed.md)
        moved = max(np.abs(b - a).max() for a, b in zip(init.params, record.params, strict=True))
        worst = max(np.abs(a - b).max() for a, b in zip(other.params, record.params, strict=True))
        assert worst <= 0.01 * moved, (worst, moved)
        np.testing.assert_allclose(other.losses, record.losses, rtol=1e-5, atol=0)
        np.testing.assert_allclose(other.grad_norms, record.grad_norms, rtol=1e-4, atol=0)
    # each process pages its own half of every sharded tensor: the two stores together hold
    # what the one store holds
    one_bytes = sum(len(v) for v in single.paged.values())
    two_bytes = sum(len(v) for v in record.paged.values())
    assert abs(two_bytes - one_bytes) <= 0.05 * one_bytes, (two_bytes, one_bytes)
    for p in range(2):
        part = sum(len(v) for k, v in record.paged.items() if k.startswith(f"process-{p}/"))
        assert part < 0.6 * one_bytes, (p, part, one_bytes)


# --- SIGKILL of one process, resume of both ----------------------------------------------------

# (point, processes that reach it): checkpoint.done is process 0's (it records the checkpoint)
_POINTS = {
    "train.init": (0, 1),
    "train.step": (0, 1),
    "train.metrics": (0, 1),
    "pager.begin": (0, 1),
    "pager.take": (0, 1),
    "pager.put": (0, 1),
    "pager.commit": (0, 1),
    "store.commit": (0, 1),
    "checkpoint.paged": (0, 1),
    "checkpoint.orbax": (0, 1),
    "checkpoint.parts": (0, 1),
    "checkpoint.done": (0,),
}
_ONCE = {"train.init", "checkpoint.paged", "checkpoint.orbax", "checkpoint.parts"}
_ONCE |= {"checkpoint.done"}


def _kill_plan(seed: int, kills: int = 12) -> list[tuple[str, int]]:
    """Every point at least once, the rest drawn at random; each in a random process."""
    rng = random.Random(seed)
    names = list(_POINTS) + [rng.choice(list(_POINTS)) for _ in range(kills - len(_POINTS))]
    rng.shuffle(names)
    return [
        (f"{n}:1" if n in _ONCE else f"{n}:{rng.randint(1, 2)}", rng.choice(_POINTS[n]))
        for n in names
    ]


def test_kill_plan_covers_every_point_of_a_multi_process_step():
    assert set(_POINTS) == set(_faults.POINTS) | set(_faults.PROCESS_POINTS)
    plan = _kill_plan(3)
    assert len(plan) >= 12 and {f.split(":")[0] for f, _ in plan} == set(_POINTS)


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigkill_of_one_process_at_every_point_then_resume_is_bitwise(runner, two, tmp_path):
    _, want = two
    run = tmp_path / "run"
    for i, (fault, process) in enumerate(_kill_plan(3)):
        proc = runner.run(
            run, "--store", "auto", *(("--resume",) if i else ()), fault=fault, process=process
        )
        assert proc.returncode == 128 + signal.SIGKILL, (
            f"kill {i} at {fault} in process {process} was not reached: exit "
            f"{proc.returncode}\n{proc.stderr}"
        )
        assert f"process {process} was killed by SIGKILL" in proc.stderr, proc.stderr
    _ok(runner.run(run, "--store", "auto", "--resume"))
    Record.of(run).assert_equals(want)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("seed", [0, 1])
def test_sigkill_of_one_process_at_a_random_time_then_resume_is_bitwise(
    runner, two, tmp_path, seed
):
    """One of the two training processes killed at a random moment after a random number
    of steps (its pid found among the launcher's children), then ``--resume``."""
    _, want = two
    run, rng = tmp_path / "run", random.Random(seed)
    after, delay = rng.randint(1, STEPS // 2), rng.uniform(0.0, 0.3)
    launcher = runner.start(run, "--store", "auto")
    metrics = run / "metrics.jsonl"
    while launcher.poll() is None and (
        not metrics.exists() or len(metrics.read_text().splitlines()) < after
    ):
        time.sleep(0.05)
    time.sleep(delay)
    children = _children(launcher.pid)
    assert len(children) == 2 and launcher.poll() is None, "the run ended before the kill"
    victim = rng.choice(children)
    os.kill(victim, signal.SIGKILL)
    _, err = launcher.communicate(timeout=HANG_S)
    assert launcher.returncode == 128 + signal.SIGKILL, err
    assert "was killed by SIGKILL" in err, err
    _ok(runner.run(run, "--store", "auto", "--resume"))
    Record.of(run).assert_equals(want)


# --- refused: a damaged part of one process, another process count ----------------------------


@pytest.mark.subprocess
def test_a_damaged_part_and_another_process_count_are_refused(runner, two, tmp_path):
    src, want = two
    run = tmp_path / "run"
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("run.lock", "LOCK"))
    proc = runner.run(run, "--store", "auto", "--resume", processes=1)
    assert proc.returncode == 2, proc.stderr
    assert "trained by 2 process(es), this is 1" in proc.stderr
    assert "jaxoff launch --processes 2" in proc.stderr

    # process 1's paged part of the newest checkpoint damaged: refused, never mixed. A run
    # stopped at step 6 that keeps three checkpoints (2, 4, 6): steps left, one to fall to.
    run = tmp_path / "stopped"
    _ok(runner.run(run, "--store", "auto", "--stop-at", "6", "--keep-checkpoints", "3"))
    newest = 6
    page = max((run / "checkpoints_paged" / str(newest) / "process-1").glob("*.page"),
               key=lambda p: p.stat().st_size)  # fmt: skip
    data = bytearray(page.read_bytes())
    data[len(data) // 2] ^= 1
    page.write_bytes(bytes(data))
    proc = runner.run(run, "--store", "auto", "--resume")
    assert proc.returncode == 2, proc.stderr  # the damaged process's one line, at once
    assert f"checkpoint {newest}" in proc.stderr and "damaged" in proc.stderr, proc.stderr
    assert "process-1" in proc.stderr, proc.stderr
    assert (run / "checkpoints" / str(newest)).is_dir()  # refused: nothing removed

    # --resume-fallback: every process goes back to the checkpoint before, together
    err = _ok(runner.run(run, "--store", "auto", "--resume", "--resume-fallback"))
    assert f"checkpoint {newest}: the paged part of process(es) 1 is damaged" in err, err
    Record.of(run).assert_equals(want)

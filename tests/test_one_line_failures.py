"""A failure inside a dispatched step says what happened once: in ``jaxoff train`` exactly one
line on stderr, in a user's own loop an exception whose first words are the reason; no
tracebacks from JAX's exit handlers re-raising the step's error from its runtime tokens."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from _limits import HANG_S

TESTS = os.path.dirname(os.path.abspath(__file__))

# flips a bit in every 4 KiB of every page file of the run's store once step ``AT`` ended:
# the next step reads a chunk whose checksum fails, inside the compiled step
LIVE_CORRUPTION = """
import glob, sys
import jaxoff._faults as faults
run, at = sys.argv[1], int(sys.argv[2])
seen = [0]
point = faults.point
def corrupting(name):
    if name == "train.metrics":
        seen[0] += 1
        if seen[0] == at:
            for path in sorted(glob.glob(run + "/store/data/*.page")):
                data = bytearray(open(path, "rb").read())
                for i in range(0, len(data), 4096):
                    data[i] ^= 1
                open(path, "wb").write(bytes(data))
    return point(name)
faults.point = corrupting
from jaxoff.cli import main
sys.exit(main(["train", "--model", "tiny", "--steps", "6", "--batch-size", "2", "--seq-len",
               "16", "--eval-every", "0", "--ckpt-every", "0", "--no-progress",
               "--chunk-mib", "1", "--out-dir", run]))
"""


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


@pytest.mark.subprocess
def test_a_store_corrupted_during_training_is_one_line(tmp_path):
    run = tmp_path / "run"
    proc = _child(LIVE_CORRUPTION, str(run), "2")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr  # no "Exception ignored in atexit callback" after it
    assert lines[0].startswith("jaxoff train: error: step 3: page file ")
    assert "fails its checksum" in lines[0] and "--resume" in lines[0]


@pytest.mark.subprocess
def test_in_a_users_loop_the_reason_comes_first_and_nothing_follows(tmp_path):
    code = f"""
        import glob, sys
        sys.path.insert(0, {TESTS!r})
        import jax, jax.numpy as jnp
        from jaxoff.optim import paged
        from test_paged import OPTIMIZERS, batch, make_step, mlp_params
        root = sys.argv[1]
        tx = paged(OPTIMIZERS["adamw"](), root, chunk_bytes=4096)
        params = mlp_params(jnp.bfloat16)
        state = tx.init(params)
        step = make_step(tx, jnp.bfloat16, fused=True)
        params, state = step(params, state, *batch(0))
        jax.block_until_ready(params)
        tx.pager.txn.settle()  # the step's commit made: its version is the store's
        slot = tx.store.active_slot
        path = sorted(glob.glob(root + "/data/*." + slot + ".page"))[3]
        data = bytearray(open(path, "rb").read()); data[5] ^= 1
        open(path, "wb").write(bytes(data))
        try:
            params, state = step(params, state, *batch(1))
            jax.block_until_ready(params)
        except Exception as e:
            print(str(e).splitlines()[0])
    """
    proc = _child(code, str(tmp_path / "store"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("DATA_LOSS: jaxoff_pager_take: checksum mismatch in "), (
        proc.stdout
    )
    assert proc.stdout.count("Error dispatching computation") == 0
    assert proc.stderr.strip() == "", proc.stderr  # JAX's exit handlers say nothing more


# a read that fails with EIO inside a step (``JAXOFF_IO_FAULT``, ffi/engine/gpu_pager.cc): the
# n-th chunk read of the process, after the first steps' reads
INJECTED_EIO = """
import sys
from jaxoff.cli import main
sys.exit(main(["train", "--model", "tiny", "--steps", "6", "--batch-size", "2", "--seq-len",
               "16", "--eval-every", "0", "--ckpt-every", "0", "--no-progress",
               "--chunk-mib", "1", "--out-dir", sys.argv[1]]))
"""


@pytest.mark.subprocess
def test_an_io_error_inside_a_step_is_one_line(tmp_path):
    """An injected EIO on a chunk read of step 3 or later (a step of the tiny model reads
    about 45 chunks of its store: read 100 is past the first two steps, which were
    dispatched and ran): one line naming the page file and the device error, nothing after
    it."""
    run = tmp_path / "run"
    env = {**os.environ, "JAXOFF_IO_FAULT": "read:100"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(INJECTED_EIO), str(run)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=env,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr  # no atexit tracebacks, no runtime prefix
    line = lines[0]
    assert line.startswith("jaxoff train: error: step "), line
    assert f"{run}/store/data/" in line and "EIO" in line, line
    assert int(line.split("step ", 1)[1].split(":", 1)[0]) >= 3, line


@pytest.mark.subprocess
def test_in_a_users_loop_a_stale_state_is_refused_reason_first(tmp_path):
    """A user's loop steps with the state of step 1 after the store moved on to step 2 (as a
    state restored by plain orbax from an older save would be): the exception's first line
    is the reason, with no dispatch prefix repeated and no traceback inside it."""
    code = f"""
        import sys
        sys.path.insert(0, {TESTS!r})
        import jax, jax.numpy as jnp
        from jaxoff.optim import paged
        from test_paged import OPTIMIZERS, batch, make_step, mlp_params
        tx = paged(OPTIMIZERS["adamw"](), sys.argv[1], chunk_bytes=4096)
        params = mlp_params()
        state = tx.init(params)
        step = jax.jit(make_step(tx, fused=True).__wrapped__)  # no donation: keep the old state
        params1, state1 = step(params, state, *batch(0))
        params2, state2 = step(params1, state1, *batch(1))
        jax.block_until_ready(params2)
        try:
            jax.block_until_ready(step(params1, state1, *batch(2)))  # the state of step 1
        except Exception as e:
            text = str(e)
            print(type(e).__name__)
            print(text.splitlines()[0])
            print("dispatch prefixes:", text.count("Error dispatching computation"))
            print("tracebacks:", text.count("Traceback"))
    """
    proc = _child(code, str(tmp_path / "store"))
    assert proc.returncode == 0, proc.stderr
    kind, first, prefixes, tracebacks = proc.stdout.splitlines()[:4]
    assert "stale" in first or "version" in first, proc.stdout
    assert not first.startswith(("INTERNAL", "Error dispatching")), proc.stdout
    assert prefixes == "dispatch prefixes: 0" and tracebacks == "tracebacks: 0", proc.stdout
    assert proc.stderr.strip() == "", proc.stderr

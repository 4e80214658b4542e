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

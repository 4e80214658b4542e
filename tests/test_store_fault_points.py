"""The page store's fault points are reached by ``jaxoff train --store auto``: armed with
``JAXOFF_FAULT``, each kills the run (SIGKILL) where it says, and the store and the paged
checkpoints are left as a crash there leaves them."""

import os
import signal
import subprocess
import sys

import pytest

from jaxoff.aio import PageStore

pytestmark = [pytest.mark.faults, pytest.mark.subprocess]

CHILD_TIMEOUT = 600 * float(os.environ.get("JAXOFF_TEST_TIMEOUT_SCALE", "1"))
TRAIN = "--model tiny --store auto --batch-size 2 --seq-len 32 --steps 3 --ckpt-every 1"
TRAIN += " --no-progress --eval-every 0"


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """Shared by the children: the programs of two of them are the same."""
    return tmp_path_factory.mktemp("jax_cache")


def _train_killed_at(fault: str, out, cache) -> None:
    env = {
        **os.environ,
        "JAXOFF_FAULT": fault,
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from jaxoff.cli import main; sys.exit(main(sys.argv[1:]))",
            "train",
            *TRAIN.split(),
            "--out-dir",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-3000:])


@pytest.mark.parametrize(
    "fault, store_version",
    [
        ("pager.put:2", 1),  # the first step: after its first chunk's put, before the rest
        ("pager.commit:1", 1),  # the first step ended, before its commit is requested
        ("store.commit:2", 1),  # step 1's commit (the 1st is tx.init's), before the manifest
        ("checkpoint.paged:1", 2),  # step 1's paged checkpoint, after its first chunk
    ],
)
def test_fault_point_is_reached_by_train(tmp_path, compile_cache, fault, store_version):
    out = tmp_path / "run"
    _train_killed_at(fault, out, compile_cache)
    with PageStore.open(out / "store") as store:  # the last commit before the kill
        assert store.version == store_version and store.verify() > 0
    assert not (out / "store" / "manifest.json.tmp").exists()
    paged = out / "checkpoints_paged"
    if fault.startswith("checkpoint.paged"):
        assert (paged / "1.tmp").is_dir() and not (paged / "1").exists()
        assert not (paged / "1.tmp" / "paged.json").exists()  # incomplete: never restored
    else:
        assert not paged.exists() or not any(paged.iterdir())

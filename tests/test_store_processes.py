"""PageStore across processes: lock refusal, SIGKILL mid-write and mid-commit, disk full."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from _limits import HANG_S

import jaxoff.aio._store
from jaxoff.aio._store import PageStore
from jaxoff.aio._store_errors import PageStoreLockedError

pytestmark = pytest.mark.subprocess

CHUNK = 64 << 10
ENTRIES = {"opt.mu.w": ((1 << 20,), "float32"), "opt.nu.b": ((1000,), "float32")}  # 64 + 1 chunks
# Children import the same jaxoff as this test, whatever the install.
_SRC = str(pathlib.Path(jaxoff.aio._store.__file__).parents[2])


def _spawn(code: str, *args: str, stdin=None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_SRC, os.environ.get("PYTHONPATH", "")])}
    prelude = "import sys, os, json, time, signal\nimport numpy as np\n"
    prelude += "from jaxoff.aio import _manifest\nfrom jaxoff.aio._store import PageStore\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_line(proc: subprocess.Popen, timeout: float = HANG_S) -> str:
    line = proc.stdout.readline()  # the child prints before it blocks, so this returns
    if not line:
        proc.wait(timeout)
        raise AssertionError(f"child exited {proc.returncode}: {proc.stderr.read()}")
    return line.strip()


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def _spawn_rewriter(root) -> subprocess.Popen:
    """A child rewriting chunks of ``opt.mu.w`` (7.0s) without committing, until killed."""
    child = _spawn(
        """
        store = PageStore.open(sys.argv[1])
        new = np.full(16384, 7.0, np.float32)
        i = 0
        while True:
            store.write_chunk("opt.mu.w", i % 64, new)
            if i == 3:
                print("writing", flush=True)
            i += 1
        """,
        str(root),
    )
    assert _wait_line(child) == "writing"
    return child


def _v1(root) -> dict[str, np.ndarray]:
    data = {
        "opt.mu.w": np.arange(1 << 20, dtype=np.float32),
        "opt.nu.b": np.linspace(-1, 1, 1000, dtype=np.float32),
    }
    with PageStore.create(root, ENTRIES, chunk_bytes=CHUNK) as store:
        for n, a in data.items():
            store.write(n, a)
        assert store.commit() == 1
    return data


def _assert_v1_intact(root, data) -> None:
    with PageStore.open(root) as store:
        assert store.version == 1 and store.active_slot == "B"
        assert store.verify() == 65
        for n, a in data.items():
            assert np.array_equal(store.read(n), a)


def test_lock_refuses_a_second_process(tmp_path):
    root = tmp_path / "s"
    _v1(root)
    child = _spawn(
        """
        store = PageStore.open(sys.argv[1])
        print("locked", os.getpid(), flush=True)
        sys.stdin.readline()
        store.close()
        """,
        str(root),
        stdin=subprocess.PIPE,
    )
    _, pid = _wait_line(child).split()
    with pytest.raises(PageStoreLockedError) as err:
        PageStore.open(root)
    assert f"locked by another process (pid {pid} on host" in str(err.value)
    assert "different store directory" in str(err.value)
    child.communicate("\n", timeout=HANG_S)
    assert child.returncode == 0
    with PageStore.open(root) as store:  # released when the holder closed
        assert store.version == 1
        child = _spawn(
            """
            try:
                PageStore.open(sys.argv[1])
            except Exception as e:
                print(type(e).__name__, str(e))
            """,
            str(root),
        )
        out, err = child.communicate(timeout=HANG_S)
    assert out.startswith("PageStoreLockedError") and f"pid {os.getpid()} " in out, err


def test_forked_child_does_not_keep_the_lock(tmp_path):
    root = tmp_path / "s"
    _v1(root)
    child = _spawn(
        """
        store = PageStore.open(sys.argv[1])
        pid = os.fork()
        if pid == 0:  # e.g. a data-loader worker that outlives the store's owner
            time.sleep(600)
            os._exit(0)
        print(pid, flush=True)
        time.sleep(600)
        """,
        str(root),
    )
    grandchild = int(_wait_line(child))
    try:
        with pytest.raises(PageStoreLockedError):  # the fork did not unlock the owner's lock
            PageStore.open(root)
        _kill(child)
        with PageStore.open(root) as store:  # the orphaned worker does not hold it either
            assert store.version == 1
    finally:
        os.kill(grandchild, signal.SIGKILL)


def test_lock_is_released_when_the_holder_dies(tmp_path):
    root = tmp_path / "s"
    data = _v1(root)
    child = _spawn(
        "s = PageStore.open(sys.argv[1]); print('ok', flush=True); time.sleep(600)", str(root)
    )
    assert _wait_line(child) == "ok"
    _kill(child)
    _assert_v1_intact(root, data)


def test_sigkill_while_writing_the_inactive_slot_keeps_the_last_version(tmp_path):
    root = tmp_path / "s"
    data = _v1(root)
    child = _spawn_rewriter(root)
    time.sleep(0.2)
    _kill(child)
    # The kill really hit a store with new data in its inactive slot (A) ...
    raw = np.fromfile(root / "data" / "opt.mu.w.A.page", np.float32, count=16384)
    assert np.all(raw == 7.0)
    # ... and the committed version is whole.
    _assert_v1_intact(root, data)


def test_sigkill_between_data_fsync_and_manifest_replace(tmp_path):
    root = tmp_path / "s"
    data = _v1(root)
    child = _spawn(
        """
        def stop(*args):
            print("replacing", flush=True)
            time.sleep(600)
        store = PageStore.open(sys.argv[1])
        store.write("opt.mu.w", np.full(1 << 20, 2.0, np.float32))
        store.write("opt.nu.b", np.full(1000, 2.0, np.float32))
        _manifest._replace = stop
        store.commit()
        """,
        str(root),
    )
    assert _wait_line(child) == "replacing"
    _kill(child)
    tmp = json.loads((root / "manifest.json.tmp").read_text())
    assert tmp["version"] == 2  # the new manifest was fully written, just not renamed
    _assert_v1_intact(root, data)
    with PageStore.open(root) as store:  # and the store goes on normally
        for n, a in data.items():
            store.write(n, a + 1)
        assert store.commit() == 2
    assert not (root / "manifest.json.tmp").exists()
    with PageStore.open(root) as store:
        assert np.array_equal(store.read("opt.nu.b"), data["opt.nu.b"] + 1)


def test_disk_full_raises_and_keeps_the_last_version(tmp_path):
    root = tmp_path / "s"
    data = _v1(root)
    limit = 5 * CHUNK + 1000  # chunk 5 of opt.mu.w crosses the limit
    child = _spawn(
        """
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us
        limit = int(sys.argv[2])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(
            resource.RLIMIT_FSIZE)[1]))
        out = {}
        with PageStore.open(sys.argv[1]) as store:
            try:
                store.write("opt.mu.w", np.zeros(1 << 20, np.float32))
            except Exception as e:
                out["write"] = [type(e).__name__, str(e), e.path, e.needed_bytes]
            try:
                store.commit()
            except Exception as e:
                out["commit"] = [type(e).__name__, str(e)]
        try:
            PageStore.create(sys.argv[1] + "2", {"x": ((limit,), "int8")}, chunk_bytes=4096)
        except Exception as e:
            out["create"] = [type(e).__name__, str(e), e.path, e.needed_bytes]
        print(json.dumps(out))
        """,
        str(root),
        str(limit),
    )
    out, err = child.communicate(timeout=HANG_S)
    assert child.returncode == 0, err
    out = json.loads(out)
    name, msg, path, needed = out["write"]
    assert name == "PageStoreFullError" and path == str(root / "data" / "opt.mu.w.A.page")
    assert needed > 0 and path in msg and "committed version is intact" in msg
    assert "file size limit" in msg and "Free space" in msg
    assert out["commit"][0] == "PageStoreError" and "not written" in out["commit"][1]
    name, msg, path, needed = out["create"]
    assert name == "PageStoreFullError" and needed == -(-limit // 4096) * 4096
    _assert_v1_intact(root, data)


def _v1_single(root) -> dict[str, np.ndarray]:
    data = {
        "opt.mu.w": np.arange(1 << 20, dtype=np.float32),
        "opt.nu.b": np.linspace(-1, 1, 1000, dtype=np.float32),
    }
    with PageStore.create(root, ENTRIES, chunk_bytes=CHUNK, slots=1) as store:
        for n, a in data.items():
            store.write(n, a)
        assert store.commit() == 1
    return data


def test_single_slot_sigkill_mid_update_is_detected_as_torn(tmp_path):
    from jaxoff.aio import PageStoreTornError

    root = tmp_path / "s"
    _v1_single(root)
    child = _spawn_rewriter(root)  # in place: the store has one slot
    _kill(child)
    for _ in range(2):  # the store stays refused: the mark is kept until it is re-created
        with pytest.raises(
            PageStoreTornError,
            match="single-slot .* stopped during an update.*restore from the last checkpoint",
        ):
            PageStore.open(root)
    with PageStore.create(root, ENTRIES, chunk_bytes=CHUNK, slots=1, exist_ok=True) as store:
        assert store.version == 0  # re-created: a restore writes it whole


def test_single_slot_sigkill_between_steps_loses_nothing(tmp_path):
    root = tmp_path / "s"
    _v1_single(root)
    child = _spawn(
        """
        store = PageStore.open(sys.argv[1])
        store.write("opt.mu.w", np.full(1 << 20, 2.0, np.float32))
        store.write("opt.nu.b", np.full(1000, 3.0, np.float32))
        store.commit()
        print("committed", flush=True)
        time.sleep(600)
        """,
        str(root),
    )
    assert _wait_line(child) == "committed"
    _kill(child)
    assert os.path.exists(root / "IN_PLACE_OPEN")  # its user died: the open checks the chunks
    with PageStore.open(root) as store:
        assert store.version == 2
        assert np.all(store.read("opt.mu.w") == 2.0) and np.all(store.read("opt.nu.b") == 3.0)

"""A full disk or a file size limit under a paged optimizer: at the commit the pager makes
behind a jitted step (its manifest), at a page write behind a step (raised by
``PageTransaction.settle()`` or the next step's ``jaxoff_pager_begin``; the store's error is
recovered from either), and while writing a paged checkpoint (a one-line error, nothing left
that looks saved). Real small filesystems (tmpfs), and RLIMIT_FSIZE in a child process."""

import doctest
import errno
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import optax
import pytest

from jaxoff.aio import PageStore, PageStoreError, PageStoreFullError, _error_from, store_error_from
from jaxoff.optim import paged, restore_paged, save_paged

sys.path.insert(0, os.path.dirname(__file__))
from test_paged import batch, make_step, mlp_params  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD_TIMEOUT = 600 * float(os.environ.get("JAXOFF_TEST_TIMEOUT_SCALE", "1"))


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs (needs root); unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=False)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(root):
    """Fills the filesystem of ``root`` to the last byte; returns the filler file."""
    path = root / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (64 << 10, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return path


def _one_step(root):
    tx = paged(optax.adam(1e-2), root / "s", chunk_bytes=4096)
    step = make_step(tx)
    params, state = step(mlp_params(), tx.init(mlp_params()), *batch(0))
    out = jax.block_until_ready((params, state))
    tx.store.wait_committed()  # the pager commits behind the step: durable before a disk fills
    return tx, step, out


def test_full_disk_at_commit_is_recoverable_from_the_runtime_error(small_fs):
    tx, step, (params, state) = _one_step(small_fs)
    version = tx.store.version
    filler = _fill(small_fs)
    # the pager commits a step (PageStore.commit of its manifest) on its thread once the
    # step's writes are durable: the step returns, and the next one's page_begin raises the
    # commit's error before it reads or writes a page
    params, state = jax.block_until_ready(step(params, state, *batch(1)))
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(step(params, state, *batch(2)))
    err = store_error_from(info.value)
    assert isinstance(err, PageStoreFullError) and err.errno == errno.ENOSPC
    assert err is tx.store.last_error  # the very exception the commit raised
    assert err.path == str(small_fs / "s" / "manifest.json.tmp") and err.needed_bytes > 0
    assert str(err).startswith(f"no space to write {err.path}")
    assert "previous version is intact" in str(err)
    assert str(err) in str(info.value)  # what the runtime error carries, after a traceback
    assert store_error_from(ValueError("unrelated")) is None
    assert tx.store.version == version  # nothing committed
    filler.unlink()
    tx.close()
    with PageStore.open(small_fs / "s") as store:
        assert store.version == version and store.verify() > 0


ENGINE_EFBIG = (
    "write /d/s/data/opt.mu.w.B.page at offset 8192 (4096 bytes) failed: File too large "
    "(EFBIG, errno 27): the file would exceed the maximum file size allowed for this process "
    "(ulimit -f / RLIMIT_FSIZE) or filesystem; raise the limit or use smaller files "
    "[engine.cc:302]"
)


def test_store_error_from_a_paging_call_that_hit_a_full_disk():
    """The engine's own message (a page write behind a step, reported by the next step's
    page_begin) becomes PageStoreFullError."""
    wrapped = jax.errors.JaxRuntimeError(f"RESOURCE_EXHAUSTED: jaxoff_pager_begin: {ENGINE_EFBIG}")
    err = store_error_from(wrapped)
    assert isinstance(err, PageStoreFullError) and err.errno == errno.EFBIG
    assert err.path == "/d/s/data/opt.mu.w.B.page" and err.needed_bytes == 4096
    assert "file size limit" in str(err) and "`resume=True`" in str(err)
    chained = RuntimeError("step 3 failed")
    chained.__cause__ = err
    assert store_error_from(chained) is err


def test_store_error_from_what_settle_raised_for_a_full_disk():
    """PageTransaction.settle() raises a PageStoreError with the engine's message: it is a
    PageStoreFullError with the page file's path; another store error is itself."""
    settled = PageStoreError(
        f"page store /d/s: a step's write or commit failed: {ENGINE_EFBIG}; the store keeps "
        "its last committed version"
    )
    err = store_error_from(settled)
    assert isinstance(err, PageStoreFullError) and err.errno == errno.EFBIG
    assert err.path == "/d/s/data/opt.mu.w.B.page" and err.needed_bytes == 4096
    other = PageStoreError("page store /d/s: a step's write or commit failed: injected")
    assert store_error_from(other) is other


def test_full_disk_at_a_page_write_is_raised_by_settle_and_by_the_next_step(small_fs):
    """Page files are allocated when the store is made; here the slot the next step writes
    has lost its blocks (truncated) and the filesystem is full: the step's page writes fail
    behind it. settle() raises that (the page file, ENOSPC), and so does the next step's
    page_begin when nobody settled; the store keeps its version, and once space is back the
    same state steps on."""
    tx, step, (params, state) = _one_step(small_fs)
    store, version = tx.store, tx.store.version
    slot = store.inactive_slot
    pages = [p for p in store.file_table() if p.endswith(f".{slot}.page")]
    for p in pages:
        os.truncate(p, 0)
    keep = jax.tree.map(jnp.copy, (params, state))  # the step donates its inputs
    filler = _fill(small_fs)

    def copies():
        return jax.tree.map(jnp.copy, keep)

    def run_behind():  # the step returns; a write that failed before its commit call fails it
        try:
            jax.block_until_ready(step(*copies(), *batch(1)))
        except jax.errors.JaxRuntimeError as e:
            assert "not committed" in str(e)

    run_behind()
    with pytest.raises(PageStoreFullError) as info:
        tx.pager.txn.settle()
    err = info.value
    assert store_error_from(err) is err and err.errno == errno.ENOSPC
    assert err.path in pages and err.needed_bytes > 0
    assert f"page file {err.path}: write of" in str(err) and "(ENOSPC)" in str(err)
    assert "last committed version is intact" in str(err)
    assert store.version == version

    run_behind()
    with pytest.raises(jax.errors.JaxRuntimeError) as info:  # not settled: the next step
        jax.block_until_ready(step(*copies(), *batch(1)))
    assert "jaxoff_pager_begin: write " in str(info.value)
    err = store_error_from(info.value)
    assert isinstance(err, PageStoreFullError) and err.errno == errno.ENOSPC
    assert err.path in pages
    assert store.version == version

    filler.unlink()
    new_params, new_state = step(*copies(), *batch(1))
    tx.pager.txn.settle()
    assert store.version == int(new_state.version) == version + 1
    tx.close()
    with PageStore.open(small_fs / "s") as reopened:
        assert reopened.version == version + 1 and reopened.verify() > 0


def test_store_error_from_docstring_runs():
    result = doctest.testmod(_error_from)  # the fallback: a message with no recorded error
    assert result.attempted > 0 and result.failed == 0


def test_full_disk_while_saving_a_paged_checkpoint(small_fs):
    tx, _, (_, state) = _one_step(small_fs)
    needed = sum(e.nbytes for e in tx.store.entries.values())
    ckpt = small_fs / "ckpt"
    filler = _fill(small_fs)
    with pytest.raises(PageStoreFullError) as info:
        save_paged(tx, state, ckpt)
    err = info.value
    assert err.errno == errno.ENOSPC and err.needed_bytes == needed
    assert err.path.startswith(str(ckpt) + ".tmp" + os.sep)
    assert f"cannot write the paged checkpoint {ckpt}: the disk is full" in str(err)
    assert "another directory" in str(err)
    assert not os.path.exists(ckpt) and not os.path.exists(f"{ckpt}.tmp")  # nothing half-saved
    filler.unlink()
    assert save_paged(tx, state, ckpt) == needed  # space back: the same save works
    tx.close()


def test_incomplete_paged_checkpoint_is_refused(tmp_path):
    tx, _, (params, state) = _one_step(tmp_path)
    ckpt = tmp_path / "ckpt"
    save_paged(tx, state, ckpt)
    os.rename(ckpt, f"{ckpt}.tmp")  # as a writer killed before its rename leaves it
    with pytest.raises(PageStoreError, match=r"does not exist \(only .*ckpt.tmp, an incomplete"):
        restore_paged(tx, ckpt, params)
    with pytest.raises(PageStoreError, match="ckpt.tmp is an incomplete paged checkpoint"):
        restore_paged(tx, f"{ckpt}.tmp", params)
    os.rename(f"{ckpt}.tmp", ckpt)
    os.remove(ckpt / "paged.json")  # written last: without it the copy is incomplete
    with pytest.raises(PageStoreError, match="incomplete paged checkpoint.*no paged.json"):
        restore_paged(tx, ckpt, params)
    tx.close()


@pytest.mark.subprocess
def test_file_size_limit_while_saving_a_paged_checkpoint(tmp_path):
    """RLIMIT_FSIZE below the largest checkpoint file: EFBIG (SIGXFSZ ignored)."""
    code = textwrap.dedent(
        """
        import os, resource, signal, sys
        sys.path.insert(0, sys.argv[2])
        from pathlib import Path
        from test_store_full import _one_step
        from jaxoff.aio import PageStoreFullError
        from jaxoff.optim import save_paged
        root = Path(sys.argv[1])
        tx, _, (_, state) = _one_step(root)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.RLIM_INFINITY))
        try:
            save_paged(tx, state, root / "ckpt")
        except PageStoreFullError as e:
            print("ERRNO", e.errno, e.needed_bytes > 0, os.path.exists(root / "ckpt.tmp"))
            print("MESSAGE", e)
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), HERE],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"ERRNO {errno.EFBIG} True False" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "the file size limit was reached" in r.stdout and "(`out_dir`)" in r.stdout

"""How a PageStore commit makes a slot durable: one syncfs per filesystem, or an fsync of each
page file where syncfs cannot be trusted; a failure of either fails the commit, which leaves
the previous version current. And the manifest a commit writes: read back verified, its
entries in the layout's order."""

from __future__ import annotations

import ctypes
import errno
import json
import os

import numpy as np
import pytest

from jaxoff.aio import _manifest, _pageio, _store_files
from jaxoff.aio._store import PageStore
from jaxoff.aio._store_errors import PageStoreError

KB4 = 4096
ENTRIES = {f"e{i}": ((3, 700), "float32") for i in range(5)}  # 3 chunks of 4 KiB each


def _fill(store, value: float) -> dict[str, np.ndarray]:
    data = {
        n: np.full(e.shape, value + i, e.dtype) for i, (n, e) in enumerate(store.entries.items())
    }
    for n, a in data.items():
        store.write(n, a)
    return data


class _Spy:
    """A stand-in for libc's syncfs or for fsync_file that records its calls."""

    def __init__(self, fail_errno: int = 0):
        self.calls: list = []
        self.fail_errno = fail_errno

    def syncfs(self, fd: int) -> int:
        self.calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        if self.fail_errno:
            ctypes.set_errno(self.fail_errno)
            return -1
        return 0

    def fsync(self, path: str) -> None:
        self.calls.append(path)


@pytest.mark.parametrize("background", [False, True])
def test_a_commit_syncs_each_filesystem_once_and_fsyncs_no_file(tmp_path, monkeypatch, background):
    spy, fsyncs = _Spy(), _Spy()
    monkeypatch.setattr(_pageio, "_syncfs", lambda: spy.syncfs)
    monkeypatch.setattr(_store_files, "fsync_file", fsyncs.fsync)
    with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4) as store:
        data = _fill(store, 1.0)
        store.commit(background=background)
        store.wait_committed()
        assert len(spy.calls) == 1  # ten page files, one filesystem
        assert spy.calls[0] == os.path.realpath(os.path.dirname(store.file_table()[0]))
        assert fsyncs.calls == []
        for n, a in data.items():
            np.testing.assert_array_equal(store.read(n), a)
    with PageStore.open(tmp_path / "s") as store:
        assert store.version == 1
        assert store.verify() == 15


def test_without_a_trusted_syncfs_each_page_file_of_the_slot_is_fsynced(tmp_path, monkeypatch):
    fsyncs = _Spy()
    monkeypatch.setattr(_pageio, "_syncfs", lambda: None)  # not Linux, or a kernel < 5.8
    monkeypatch.setattr(_store_files, "fsync_file", fsyncs.fsync)
    with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4) as store:
        _fill(store, 1.0)
        slot = store.inactive_slot
        store.commit()
        files = set(store.file_table())
        want = {p for p in files if p.endswith(f".{slot}.page")}
        assert len(want) == len(ENTRIES)
        assert sorted(fsyncs.calls) == sorted(want)


@pytest.mark.parametrize("background", [False, True])
def test_a_failed_syncfs_fails_the_commit_and_keeps_the_previous_version(
    tmp_path, monkeypatch, background
):
    with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4) as store:
        first = _fill(store, 1.0)
        store.commit()
        monkeypatch.setattr(_pageio, "_syncfs", lambda: _Spy(fail_errno=errno.EIO).syncfs)
        _fill(store, 2.0)
        with pytest.raises(PageStoreError, match="durable failed.*previous version is still"):
            store.commit(background=background)
            store.wait_committed()
        assert store.version == 1
        for n, a in first.items():
            np.testing.assert_array_equal(store.read(n), a)
    with PageStore.open(tmp_path / "s") as store:  # the manifest on disk: version 1
        assert store.version == 1
        for n, a in first.items():
            np.testing.assert_array_equal(store.read(n), a)


def test_this_machine_commits_through_syncfs(tmp_path, monkeypatch):
    """The real syncfs on a kernel that reports writeback errors through it (5.8 and later);
    elsewhere the fsync fallback, which the test above covers."""
    release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    real = _pageio._syncfs()
    assert (real is not None) == (os.uname().sysname == "Linux" and release >= (5, 8))
    if real is None:
        return
    fsyncs = _Spy()
    monkeypatch.setattr(_store_files, "fsync_file", fsyncs.fsync)
    with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4) as store:
        _fill(store, 3.0)
        assert store.commit() == 1
    assert fsyncs.calls == []


def test_the_manifest_reads_back_verified_with_the_entries_in_their_order(tmp_path):
    entries = {name: ((3, 700), "float32") for name in ORDER}
    with PageStore.create(tmp_path / "s", entries, chunk_bytes=KB4) as store:
        for v in (1.0, 2.0, 3.0):
            _fill(store, v)
            store.commit()
        layout, version, crcs = store.layout, store.version, store._crcs
        raw = (tmp_path / "s" / "manifest.json").read_bytes()
        assert raw == _manifest.encode(layout, version, crcs)
        doc = json.loads(raw)
        assert doc == _manifest.to_json(layout, version, crcs)
        assert doc["manifest_crc32c"] == _manifest.content_crc(doc)
        # the parts cached per layout are shared, not rebuilt, and never carry a version's crcs
        static = _manifest._static_entries(layout)
        assert _manifest._static_entries(layout) is static
        assert all("crc" not in e for e in static.values())
        # versions differ only in their version and crcs
        older = json.loads(_manifest.encode(layout, 2, crcs))
        assert older["version"] == 2 and older["entries"] == doc["entries"]
    read_layout, read_version, read_crcs = _manifest.read(str(tmp_path / "s"))
    assert read_version == 3 and read_crcs == crcs
    assert read_layout == layout  # the entries in the order they were created in
    assert [e.name for e in read_layout.entries] == list(ORDER)


ORDER = ["zeta", "alpha", "mid", "beta"]  # not sorted: the layout's order is kept


def test_a_store_striped_over_two_filesystems_syncs_each_once(tmp_path, monkeypatch):
    """Three stripe directories, two on the store's filesystem and one on another (the tmpfs of
    /dev/shm): two syncfs calls, one per filesystem."""
    import shutil
    import tempfile

    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    other = tempfile.mkdtemp(dir="/dev/shm", prefix="jaxoff-test-")
    try:
        spy = _Spy()
        monkeypatch.setattr(_pageio, "_syncfs", lambda: spy.syncfs)
        dirs = ["d0", "d1", other]
        with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4, dirs=dirs) as store:
            data = _fill(store, 4.0)
            store.commit()
            devices = {os.stat(p).st_dev for p in spy.calls}
            assert len(spy.calls) == 2 and len(devices) == 2
            for n, a in data.items():
                np.testing.assert_array_equal(store.read(n), a)
    finally:
        shutil.rmtree(other, ignore_errors=True)

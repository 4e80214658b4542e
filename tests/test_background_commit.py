"""PageStore.commit(background=True): the new version is current at once and durable behind
the caller; writes, the next commit and close wait for it; a failure surfaces and loses
nothing."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from jaxoff.aio import _manifest, _store
from jaxoff.aio._store import PageStore
from jaxoff.aio._store_errors import PageStoreError, PageStoreFullError

KB4 = 4096
ENTRIES = {"opt.mu.w": ((3, 1500), "float32"), "opt.nu.b": ((5,), "float32")}


def _data(seed):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(d) for n, (s, d) in ENTRIES.items()}


def _write(store, data):
    for n, a in data.items():
        store.write(n, a)


def _on_disk_version(root) -> int:
    return json.loads((root / "manifest.json").read_text())["version"]


@pytest.mark.parametrize("slots", [2, 1])
def test_background_commit_is_current_at_once_and_durable_after_wait(tmp_path, slots):
    root = tmp_path / "s"
    d1, d2 = _data(1), _data(2)
    with PageStore.create(root, ENTRIES, chunk_bytes=KB4, slots=slots) as store:
        _write(store, d1)
        assert store.commit(background=True) == 1
        assert store.version == 1  # this process reads the new version at once
        assert np.array_equal(store.read("opt.mu.w"), d1["opt.mu.w"])
        store.wait_committed()
        assert _on_disk_version(root) == 1
        _write(store, d2)  # waits for nothing now
        assert store.commit(background=True) == 2
    # close waited for the second one
    assert _on_disk_version(root) == 2
    with PageStore.open(root) as store:
        assert store.version == 2
        for n, a in d2.items():
            assert np.array_equal(store.read(n), a)


def test_a_write_waits_until_the_background_commit_is_durable(tmp_path, monkeypatch):
    """The slot a write goes to holds the last durable version until the commit is done:
    the write must not start before (a crash would leave no version intact)."""
    root = tmp_path / "s"
    events: list[str] = []
    release = threading.Event()
    store = PageStore.create(root, ENTRIES, chunk_bytes=KB4)
    _write(store, _data(1))
    store.commit()
    _write(store, _data(2))
    fsync = store._files.fsync_slot

    def slow_fsync(slot):
        release.wait()
        fsync(slot)
        events.append("durable")

    monkeypatch.setattr(store._files, "fsync_slot", slow_fsync)
    real_write = _store._io_write
    monkeypatch.setattr(_store, "_io_write", lambda *a: (events.append("write"), real_write(*a))[1])
    assert store.commit(background=True) == 2
    writer = threading.Thread(target=_write, args=(store, _data(3)))
    writer.start()
    time.sleep(0.2)  # time for an unguarded write to go first (the guard waits regardless)
    assert writer.is_alive() and events == []
    release.set()
    writer.join()
    assert events[0] == "durable" and events[1:] == ["write"] * (len(events) - 1)
    assert _on_disk_version(root) == 2
    store.close()


def _failing_manifest(monkeypatch):
    def full(root, layout, version, crcs):
        raise PageStoreFullError(
            "no space to write the manifest; the previous version is intact. Free disk space",
            path=str(root),
            needed_bytes=1,
            errno=28,
        )

    monkeypatch.setattr(_manifest, "write", full)


def test_a_failed_background_commit_is_raised_by_the_next_write_and_loses_nothing(
    tmp_path, monkeypatch
):
    root = tmp_path / "s"
    d1 = _data(1)
    store = PageStore.create(root, ENTRIES, chunk_bytes=KB4)
    _write(store, d1)
    store.commit()
    _write(store, _data(2))
    with monkeypatch.context() as m:
        _failing_manifest(m)
        assert store.commit(background=True) == 2
        with pytest.raises(PageStoreFullError, match="Free disk space"):
            store.write("opt.nu.b", d1["opt.nu.b"])
    assert store.version == 1 and store.last_error is not None
    assert np.array_equal(store.read("opt.mu.w"), d1["opt.mu.w"])  # the previous version
    assert store.commit_failed() is None  # raised once
    store.close()
    with PageStore.open(root) as again:
        assert again.version == 1
        assert np.array_equal(again.read("opt.mu.w"), d1["opt.mu.w"])


def test_close_raises_a_failed_background_commit_and_releases_the_store(tmp_path, monkeypatch):
    root = tmp_path / "s"
    store = PageStore.create(root, ENTRIES, chunk_bytes=KB4)
    _write(store, _data(1))
    store.commit()
    _write(store, _data(2))
    with monkeypatch.context() as m:
        _failing_manifest(m)
        store.commit(background=True)
        with pytest.raises(PageStoreError, match="no space"):
            store.close()
    assert store.closed
    with PageStore.open(root) as again:  # not left locked
        assert again.version == 1


def test_close_from_another_thread_waits_for_a_commit_being_decided(tmp_path, monkeypatch):
    """A pager commits from its thread while the caller may close the store: the close
    waits for the commit (and its background thread), never joins a thread not yet started,
    and the new version is durable afterwards."""
    root = tmp_path / "s"
    d1 = _data(1)
    store = PageStore.create(root, ENTRIES, chunk_bytes=KB4)
    _write(store, d1)
    deciding = threading.Event()
    real = PageStore._commit

    def slow_commit(self, crcs, *args):
        deciding.set()
        time.sleep(0.3)  # the close below arrives while the version is being decided
        return real(self, crcs, *args)

    monkeypatch.setattr(PageStore, "_commit", slow_commit)
    versions = []
    committer = threading.Thread(target=lambda: versions.append(store.commit(background=True)))
    committer.start()
    assert deciding.wait(10)
    store.close()
    committer.join()
    assert versions == [1] and store.closed
    assert _on_disk_version(root) == 1
    with PageStore.open(root) as again:
        for n, a in d1.items():
            assert np.array_equal(again.read(n), a)

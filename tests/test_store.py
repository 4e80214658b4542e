"""PageStore: layout, names, round trips, versions, checksums, errors (single process)."""

from __future__ import annotations

import doctest
import json
import os

import crc32c
import ml_dtypes
import numpy as np
import pytest

from jaxoff.aio import _layout, _manifest, _store
from jaxoff.aio._layout import ALIGN, plan_layout, stable_stems
from jaxoff.aio._store import PageStore
from jaxoff.aio._store_errors import (
    PageStoreCorruptError,
    PageStoreError,
    PageStoreFormatError,
    PageStoreLayoutError,
    PageStoreLockedError,
    PageStoreManifestError,
    PageStoreNotFoundError,
)

KB4 = 4096


def _rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)  # random bits: NaN payloads and all


def _same_bits(a, b):
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    )


def _write_all(store, seed):
    data = {n: _rand(e.shape, e.dtype, seed + i) for i, (n, e) in enumerate(store.entries.items())}
    for n, a in data.items():
        store.write(n, a)
    return data


ENTRIES = {
    "opt.mu.w": ((7, 1301), "float32"),  # 9 chunks of 1024 elems at 4 KiB, the last short
    "opt.nu.b": ((5,), "float32"),  # smaller than a chunk
}


# ------------------------------------------------------------------------------------ layout


def test_layout_chunks_split_a_leaf_and_stay_aligned():
    layout = plan_layout(
        {
            "big": ((10_000,), np.float32),
            "small": ((3,), np.int8),
            "empty": ((0, 4), "float32"),
            "scalar": ((), "bfloat16"),
        },
        chunk_bytes=8192,
    )
    big = layout.entry("big")
    assert [c.elem_count for c in big.chunks] == [2048, 2048, 2048, 2048, 1808]
    assert [c.elem_start for c in big.chunks] == [0, 2048, 4096, 6144, 8192]
    assert [c.offset for c in big.chunks] == [0, 8192, 16384, 24576, 32768]
    assert big.chunks[-1].nbytes == 1808 * 4 and big.chunks[-1].padded_nbytes == 8192
    assert all(c.offset % ALIGN == 0 and c.padded_nbytes % ALIGN == 0 for c in big.chunks)
    assert big.file_sizes == (40960,)
    small = layout.entry("small")
    assert [(c.offset, c.nbytes, c.padded_nbytes, c.elem_count) for c in small.chunks] == [
        (0, 3, 4096, 3)
    ]
    assert layout.entry("empty").chunks == () and layout.entry("empty").file_sizes == (0,)
    scalar = layout.entry("scalar")
    assert scalar.dtype == np.dtype(ml_dtypes.bfloat16) and scalar.chunks[0].nbytes == 2
    assert layout.num_chunks == 7 and layout.names == ("big", "small", "empty", "scalar")
    assert layout.slot_bytes == 40960 + 4096 + 0 + 4096


def test_layout_stripes_round_robin_over_dirs():
    layout = plan_layout(
        {"w": ((5 * 1024,), "float32"), "b": ((4,), "float32")}, 4096, dirs=["d0", "/abs/d1", "d2"]
    )
    w = layout.entry("w")
    assert [(c.stripe, c.offset) for c in w.chunks] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (0, 4096),
        (1, 4096),
    ]
    assert w.file_sizes == (8192, 8192, 4096)
    assert layout.relpath("w", "B", 1) == "/abs/d1/w.B.page"
    assert layout.entry("b").file_sizes == (4096,)  # one chunk: one file per slot


def test_layout_accepts_shape_dtype_structs():
    jax = pytest.importorskip("jax")
    spec = jax.ShapeDtypeStruct((4, 4), jax.numpy.bfloat16)
    layout = plan_layout({"w": spec}, chunk_bytes=4096)
    assert layout.entry("w").shape == (4, 4) and layout.entry("w").nbytes == 32
    assert layout.entry("w").dtype == np.dtype(ml_dtypes.bfloat16)


def test_stable_names_sanitise_and_hash_only_on_need():
    names = [
        "opt.mu.blocks.attn.q.kernel",
        "opt/mu/x['y']",
        "a/b",
        "a_b",
        "W",
        "w",
        "x" * 300,
        "..",
        "-rf",
    ]
    stems = stable_stems(names)
    assert stems["opt.mu.blocks.attn.q.kernel"] == "opt.mu.blocks.attn.q.kernel"
    assert stems["opt/mu/x['y']"] == "opt_mu_x__y__"
    assert stems["a/b"] != stems["a_b"] and stems["a/b"].startswith("a_b-")
    assert stems["W"].lower() != stems["w"].lower()  # safe on case-insensitive filesystems
    assert len(stems["x" * 300]) <= 100 and stems["x" * 300].startswith("xxxx")
    assert stems[".."] == "_.." and stems["-rf"] == "_-rf"
    assert all(all(ch.isalnum() or ch in "._-" for ch in s) for s in stems.values())
    assert stable_stems(list(reversed(names))) == stems  # independent of order and process


def test_file_names_are_stable_across_reopen(tmp_path):
    with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4) as store:
        files = store.file_table()
    assert [os.path.basename(f) for f in files] == [
        "opt.mu.w.A.page",
        "opt.mu.w.B.page",
        "opt.nu.b.A.page",
        "opt.nu.b.B.page",
    ]
    with PageStore.open(tmp_path / "s") as store:
        assert store.file_table() == files
    assert sorted(os.listdir(tmp_path / "s" / "data")) == sorted(map(os.path.basename, files))


# ------------------------------------------------------------------------------------ data


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int8, np.float64])
@pytest.mark.parametrize("shape", [(), (1,), (3, 1001), (4097,)])
def test_round_trip_is_bitwise(tmp_path, dtype, shape):
    entries = {"x": (shape, dtype), "y": ((13,), dtype)}
    with PageStore.create(tmp_path / "s", entries, chunk_bytes=KB4) as store:
        data = _write_all(store, seed=1)
        assert store.commit() == 1
        for n, a in data.items():
            assert _same_bits(store.read(n), a)
    with PageStore.open(tmp_path / "s") as store:
        for n, a in data.items():
            assert _same_bits(store.read(n), a)
        assert store.verify() == store.layout.num_chunks


def test_versions_flip_between_slots(tmp_path):
    root = tmp_path / "s"
    with PageStore.create(root, ENTRIES, chunk_bytes=KB4) as store:
        assert (store.version, store.active_slot, store.inactive_slot) == (0, "A", "B")
        v1 = _write_all(store, seed=1)
        store.commit()
        assert (store.version, store.active_slot, store.inactive_slot) == (1, "B", "A")
        v2 = _write_all(store, seed=2)
        assert _same_bits(store.read("opt.mu.w"), v1["opt.mu.w"])  # uncommitted: invisible
        assert _same_bits(store.read("opt.mu.w", slot="A"), v2["opt.mu.w"])  # read back
        assert store.commit() == 2 and store.active_slot == "A"
        assert _same_bits(store.read("opt.mu.w"), v2["opt.mu.w"])
        assert _same_bits(store.read("opt.mu.w", slot="B"), v1["opt.mu.w"])  # previous version
    doc = json.loads((root / "manifest.json").read_text())
    assert doc["version"] == 2 and doc["format"] == "jaxoff-pagestore"
    assert doc["format_version"] == 2 and doc["align"] == 4096 and doc["chunk_bytes"] == KB4
    assert doc["manifest_crc32c"] == _manifest.content_crc(doc)
    e = doc["entries"]["opt.mu.w"]
    assert e["file"] == {"A": "data/opt.mu.w.A.page", "B": "data/opt.mu.w.B.page"}
    assert e["shape"] == [7, 1301] and e["dtype"] == "float32" and e["nbytes"] == 7 * 1301 * 4
    raw = v2["opt.mu.w"].reshape(-1).view(np.uint8)
    assert e["crc"]["A"][0] == crc32c.crc32c(raw[:KB4].tobytes())
    assert e["crc"]["B"][0] == crc32c.crc32c(v1["opt.mu.w"].reshape(-1).view(np.uint8)[:KB4])
    assert e["chunks"][-1] == {
        "offset": 8 * KB4,
        "nbytes": (7 * 1301 - 8 * 1024) * 4,
        "elem_start": 8 * 1024,
        "elem_count": 7 * 1301 - 8 * 1024,
    }


def test_a_commit_of_writes_made_durable_elsewhere_syncs_no_page_file(tmp_path, monkeypatch):
    """``commit(durable=True)``: the caller made the slot's writes durable (the pager syncs
    what a step wrote before it commits it); the commit only writes the manifest. Without it
    the commit syncs the slot."""
    from jaxoff.aio import _pageio, _store_files

    root = tmp_path / "s"
    with PageStore.create(root, ENTRIES, chunk_bytes=KB4) as store:
        syncs: list = []
        monkeypatch.setattr(_pageio, "_syncfs", lambda: lambda fd: syncs.append(fd) or 0)
        monkeypatch.setattr(_store_files, "fsync_file", syncs.append)
        v1 = _write_all(store, seed=1)
        assert store.commit(durable=True) == 1
        assert syncs == []
    with PageStore.open(root) as store:
        assert store.version == 1 and store.verify() == store.layout.num_chunks
        for n, a in v1.items():
            assert _same_bits(store.read(n), a)
        _write_all(store, seed=2)
        assert store.commit() == 2
        assert len(syncs) == 1  # one syncfs: the slot's files are on one filesystem


def test_abort_and_reopen_discard_uncommitted_writes(tmp_path):
    root = tmp_path / "s"
    with PageStore.create(root, ENTRIES, chunk_bytes=KB4) as store:
        v1 = _write_all(store, seed=1)
        store.commit()
        _write_all(store, seed=2)
        store.abort()
        with pytest.raises(PageStoreError, match="were not written"):
            store.commit()
        assert store.version == 1
        store.write("opt.mu.w", v1["opt.mu.w"])  # one entry only
    with PageStore.open(root) as store:
        assert store.version == 1 and _same_bits(store.read("opt.nu.b"), v1["opt.nu.b"])
        store.write("opt.nu.b", v1["opt.nu.b"])
        with pytest.raises(PageStoreError, match=r"9 chunks of 1 entries.*'opt.mu.w'"):
            store.commit()  # the write before reopening does not count


def test_read_before_any_commit_says_so(tmp_path):
    with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4) as store:
        with pytest.raises(PageStoreError, match="nothing is committed yet"):
            store.read("opt.nu.b")
        assert store.verify() == 0


def test_chunk_io_and_external_writes_via_tables(tmp_path):
    """What the pager does for a step: it writes chunks at the table's positions, then its
    commit hands the store their crcs (PageStore.commit(crcs))."""
    with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4, dirs=["d0", "d1"]) as store:
        files = store.file_table()
        table = store.chunk_table(store.inactive_slot)
        assert set(table) == {
            "file_id",
            "offset",
            "nbytes",
            "padded_nbytes",
            "entry",
            "chunk",
            "elem_start",
            "elem_count",
        }
        assert all(v.dtype == np.int64 and v.shape == (10,) for v in table.values())
        data = {n: _rand(e.shape, e.dtype, 7) for n, e in store.entries.items()}
        names = list(store.entries)
        crcs = {n: [] for n in names}
        for g in range(len(table["file_id"])):
            name, i = names[table["entry"][g]], int(table["chunk"][g])
            assert table["file_id"][g] == store.file_id(name, store.inactive_slot, i)
            flat = data[name].reshape(-1)
            piece = flat[table["elem_start"][g] : table["elem_start"][g] + table["elem_count"][g]]
            assert piece.nbytes == table["nbytes"][g]
            fd = os.open(files[table["file_id"][g]], os.O_WRONLY)
            os.pwrite(fd, piece.tobytes(), int(table["offset"][g]))
            os.close(fd)
            crcs[name].append(np.uint32(crc32c.crc32c(piece.tobytes())))
        assert store.commit({n: np.array(c, np.uint32) for n, c in crcs.items()}) == 1
        for n in names:
            assert _same_bits(store.read(n), data[n])
        assert _same_bits(store.read_chunk("opt.mu.w", 8), data["opt.mu.w"].reshape(-1)[8192:])
        new = np.full(1024, 3.5, np.float32)
        for n, e in store.entries.items():
            for i, c in enumerate(e.chunks):
                store.write_chunk(n, i, new[: c.elem_count])
        store.commit()
        assert np.all(store.read("opt.mu.w") == 3.5)
        # chunk i of an entry is in the stripe file i % 2: odd chunks in d1
        assert files[store.file_id("opt.mu.w", "A", 3)].endswith("d1/opt.mu.w.A.page")
        assert files[store.file_id("opt.mu.w", "B", 4)].endswith("d0/opt.mu.w.B.page")


def test_wrong_external_crc_is_caught_on_read(tmp_path):
    with PageStore.create(tmp_path / "s", {"b": ((5,), "float32")}, chunk_bytes=KB4) as store:
        store.write("b", np.arange(5, dtype=np.float32))
        store.commit({"b": [12345]})  # overrides the recorded crc, as an FFI result would
        with pytest.raises(PageStoreCorruptError, match="expected crc32c 0x00003039"):
            store.read("b")


# ------------------------------------------------------------------------------------ damage


def _committed(tmp_path, seed=1):
    root = tmp_path / "s"
    with PageStore.create(root, ENTRIES, chunk_bytes=KB4) as store:
        data = _write_all(store, seed)
        store.commit()
        path = store.file_table()[store.file_id("opt.mu.w", store.active_slot, 2)]
    return root, data, path


def test_checksum_detects_a_flipped_byte(tmp_path):
    root, data, path = _committed(tmp_path)
    with open(path, "r+b") as f:
        f.seek(2 * KB4 + 100)
        b = f.read(1)
        f.seek(2 * KB4 + 100)
        f.write(bytes([b[0] ^ 0x01]))
    with PageStore.open(root) as store:
        assert _same_bits(store.read("opt.nu.b"), data["opt.nu.b"])
        with pytest.raises(PageStoreCorruptError) as err:
            store.read("opt.mu.w")
        msg = str(err.value)
        assert path in msg and f"offset {2 * KB4}" in msg and "`resume=True`" in msg
        want = crc32c.crc32c(data["opt.mu.w"].reshape(-1).view(np.uint8)[2 * KB4 : 3 * KB4])
        assert f"expected crc32c 0x{want:08x}" in msg
        with pytest.raises(PageStoreCorruptError, match="1 chunks .* are damaged"):
            store.verify()


def test_truncated_file_is_reported(tmp_path):
    root, _, path = _committed(tmp_path)
    with PageStore.open(root) as store:
        os.truncate(path, 3 * KB4 + 10)
        with pytest.raises(PageStoreCorruptError, match=r"is \d+ bytes short.*`resume=True`"):
            store.read("opt.mu.w")
    with pytest.raises(PageStoreCorruptError, match=f"{path} is {9 * KB4 - 3 * KB4 - 10} bytes"):
        PageStore.open(root)
    os.remove(path)
    with pytest.raises(PageStoreCorruptError, match="is missing"):
        PageStore.open(root)


def test_inactive_files_are_recreated_on_open(tmp_path):
    root, data, _ = _committed(tmp_path)
    inactive = root / "data" / "opt.mu.w.A.page"
    os.remove(inactive)
    with PageStore.open(root) as store:
        assert inactive.stat().st_size == 9 * KB4
        assert _same_bits(store.read("opt.mu.w"), data["opt.mu.w"])


# ------------------------------------------------------------------------------------ disk use


def test_disk_usage_constant_over_commits_and_reopens(tmp_path):
    root = tmp_path / "s"
    store = PageStore.create(root, ENTRIES, chunk_bytes=KB4, dirs=["data", str(tmp_path / "x")])
    start = store.disk_bytes()
    assert start >= 2 * store.layout.slot_bytes
    listing = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for step in range(20):
        data = _write_all(store, seed=step)
        assert store.commit() == step + 1
        assert store.disk_bytes() == start
        if step % 4 == 3:
            store.close()
            store = PageStore.open_or_create(
                root, ENTRIES, chunk_bytes=KB4, dirs=["data", str(tmp_path / "x")]
            )
            assert store.version == step + 1
    assert _same_bits(store.read("opt.mu.w"), data["opt.mu.w"])
    store.close()
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == listing


def test_recreate_with_new_layout_removes_old_files(tmp_path):
    root = tmp_path / "s"
    PageStore.create(root, ENTRIES, chunk_bytes=KB4).close()
    with PageStore.create(root, {"z": ((4,), "int8")}, chunk_bytes=KB4, exist_ok=True) as s:
        assert s.version == 0
    assert sorted(os.listdir(root / "data")) == ["z.A.page", "z.B.page"]


# ------------------------------------------------------------------------------------ errors


def test_open_or_create_reuses_or_lists_differences(tmp_path):
    root = tmp_path / "s"
    with PageStore.open_or_create(root, ENTRIES, chunk_bytes=KB4) as store:
        _write_all(store, 0)
        store.commit()
    with PageStore.open_or_create(root, plan_layout(ENTRIES, KB4)) as store:
        assert store.version == 1
    other = {"opt.mu.w": ((7, 1302), "float32"), "opt.new": ((1,), "int8")}
    with pytest.raises(PageStoreLayoutError) as err:
        PageStore.open_or_create(root, other, chunk_bytes=2 * KB4)
    msg = str(err.value)
    assert "chunk_bytes: store has 4096, requested 8192" in msg
    assert "'opt.mu.w': store has float32[7, 1301], requested float32[7, 1302]" in msg
    assert "'opt.new': requested but not in the store" in msg
    assert "'opt.nu.b': in the store but not requested" in msg
    with PageStore.open(root) as store:  # the failed call released the lock
        assert store.version == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(chunk_bytes=1000), "not a positive multiple of 4096.*; use 4096"),
        (dict(chunk_bytes=0), "positive multiple of 4096"),
        (dict(chunk_bytes=4 << 30), "larger than the page store supports.*4096 .* 1073741824"),
        (dict(chunk_bytes="16M"), "must be an int"),
        (dict(chunk_bytes=True), "must be an int"),
        (dict(chunk_bytes=None), "chunk_bytes is required"),
        (dict(chunk_bytes=KB4, dirs=[]), "non-empty list"),
        (dict(chunk_bytes=KB4, dirs=["a", "a/"]), "twice"),
    ],
)
def test_bad_layout_arguments(tmp_path, kwargs, match):
    with pytest.raises(PageStoreLayoutError, match=match):
        PageStore.create(tmp_path / "s", ENTRIES, **kwargs)


@pytest.mark.parametrize(
    "entries, match",
    [
        ({"x": ((-1,), "float32")}, "negative"),
        ({"x": ((2,), object)}, "cannot be paged"),
        ({"x": ((2,), "notatype")}, "unknown dtype"),
        ({"x": 3}, "ShapeDtypeStruct"),
        ({"": ((1,), "int8")}, "non-empty strings"),
        ([("x", ((1,), "int8"))], "must be a dict"),
    ],
)
def test_bad_entries(entries, match):
    with pytest.raises(PageStoreLayoutError, match=match):
        plan_layout(entries, chunk_bytes=KB4)


def test_bad_calls_on_an_open_store(tmp_path):
    root = tmp_path / "s"
    store = PageStore.create(root, ENTRIES, chunk_bytes=KB4)
    with pytest.raises(PageStoreLayoutError, match="no entry named 'nope'.*'opt.mu.w'"):
        store.read("nope")
    with pytest.raises(PageStoreLayoutError, match="dtype float32, got float64"):
        store.write("opt.nu.b", np.zeros(5))
    with pytest.raises(PageStoreLayoutError, match=r"shape \(5,\), got \(6,\)"):
        store.write("opt.nu.b", np.zeros(6, np.float32))
    with pytest.raises(PageStoreLayoutError, match="slot must be 'A' or 'B'"):
        store.read("opt.nu.b", slot="C")
    with pytest.raises(PageStoreLayoutError, match="has 9 chunks; chunk index 9"):
        store.write_chunk("opt.mu.w", 9, np.zeros(1, np.float32))
    with pytest.raises(PageStoreLayoutError, match="holds 1024 elements, got 3"):
        store.write_chunk("opt.mu.w", 0, np.zeros(3, np.float32))
    with pytest.raises(PageStoreLayoutError, match="has 1 chunks, got 2 crcs"):
        store.commit({"opt.nu.b": [1, 2]})
    with pytest.raises(PageStoreLayoutError, match="not a uint32"):
        store.commit({"opt.nu.b": [2**32]})
    with pytest.raises(PageStoreLockedError, match="already open in this process"):
        PageStore.create(root, ENTRIES, chunk_bytes=KB4)
    with pytest.raises(PageStoreLockedError, match="already open in this process"):
        PageStore.open(root)
    store.close()
    store.close()  # idempotent
    with pytest.raises(PageStoreError, match="is closed"):
        store.read("opt.nu.b")
    with pytest.raises(PageStoreError, match="already exists"):
        PageStore.create(root, ENTRIES, chunk_bytes=KB4)


def test_missing_and_foreign_stores(tmp_path):
    with pytest.raises(PageStoreNotFoundError, match="does not exist"):
        PageStore.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PageStoreNotFoundError, match="has no manifest.json"):
        PageStore.open(tmp_path / "empty")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(PageStoreError, match="not empty and holds no page store.*notes.txt"):
        PageStore.create(tmp_path / "busy", ENTRIES, chunk_bytes=KB4)
    # open_or_create refuses it too, before anything is written there (not even its LOCK)
    with pytest.raises(PageStoreError, match="not empty and holds no page store.*notes.txt"):
        PageStore.open_or_create(tmp_path / "busy", ENTRIES, chunk_bytes=KB4)
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]


def test_a_store_is_marked_with_its_id_and_files(tmp_path):
    from jaxoff.aio._store_files import MARKER, owned_files, read_marker, remove_owned

    root = tmp_path / "s"
    with PageStore.create(root, ENTRIES, chunk_bytes=KB4) as store:
        files = store.file_table()
    marker = read_marker(str(root))
    assert len(marker["id"]) == 32
    assert sorted(str(root / f) for f in marker["files"]) == sorted(files)
    (root / "mine.txt").write_text("the user's")  # added to a store's folder later
    owned = owned_files(str(root))
    assert str(root / "mine.txt") not in owned and set(files) <= set(owned)
    remove_owned(str(root), owned)  # what a rebuild of the store deletes
    assert sorted(p.name for p in root.iterdir()) == ["LOCK", MARKER, "mine.txt"]
    # re-created (the marker tells it is ours): same id
    with PageStore.open_or_create(root, ENTRIES, chunk_bytes=KB4) as store:
        assert store.version == 0
    assert read_marker(str(root))["id"] == marker["id"]


def _signed(doc):
    """``doc`` as jaxoff would write it: with the checksum of its (edited) content."""
    return json.dumps({**doc, "manifest_crc32c": _manifest.content_crc(doc)})


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: "{not json", "not valid JSON"),
        (lambda d: json.dumps({**d, "format": "zarr"}), "not a jaxoff page store manifest"),
        (lambda d: json.dumps({**d, "format_version": 3}), "format_version 3.*reads versions 1, 2"),
        (lambda d: _signed({**d, "chunk_bytes": 8192}), "malformed.*chunk table disagrees"),
        (lambda d: _signed({**d, "entries": 5}), "malformed"),
    ],
)
def test_bad_manifest(tmp_path, edit, match):
    root, _, _ = _committed(tmp_path)
    doc = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(edit(doc))
    with pytest.raises(PageStoreFormatError, match=match):
        PageStore.open(root)
    with pytest.raises(PageStoreFormatError):
        PageStore.open(root)  # the failed open released the lock (else: PageStoreLockedError)


def test_docstring_examples_run():
    for module in (_store, _layout):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0


def test_crcs_are_those_of_the_committed_chunks(tmp_path):
    with PageStore.create(tmp_path / "s", ENTRIES, chunk_bytes=KB4) as store:
        data = _write_all(store, 3)
        store.commit()
        raw = data["opt.mu.w"].reshape(-1).view(np.uint8)
        want = [crc32c.crc32c(raw[i : i + KB4].tobytes()) for i in range(0, raw.size, KB4)]
        assert store.crcs("opt.mu.w") == want
        assert store.crcs("opt.mu.w", store.active_slot) == want
        with pytest.raises(KeyError, match="no entry 'opt.v'"):
            store.crcs("opt.v")


# ----------------------------------------------------------------------------- single slot

ENTRIES_1 = {"opt.mu.w": ((3000,), "float32"), "opt.nu.w": ((3000,), "bfloat16")}


def test_single_slot_writes_in_place_with_half_the_disk(tmp_path):
    two = PageStore.create(tmp_path / "two", ENTRIES_1, chunk_bytes=KB4)
    one = PageStore.create(tmp_path / "one", ENTRIES_1, chunk_bytes=KB4, slots=1)
    assert len(two.file_table()) == 4 and len(one.file_table()) == 2
    assert all(p.endswith(".A.page") for p in one.file_table())
    for name in ENTRIES_1:  # both slot names address the one file
        for c in range(len(one.entries[name].chunks)):
            assert one.file_id(name, "A", c) == one.file_id(name, "B", c)
    assert one.layout.slot_bytes == two.layout.slot_bytes
    assert one._files.disk_bytes() * 2 == two._files.disk_bytes()
    for v in range(1, 5):
        data = {n: _rand(s, d, seed=v) for n, (s, d) in ENTRIES_1.items()}
        for store in (one, two):
            for n, a in data.items():
                store.write(n, a)
            assert store.commit() == v
            for n, a in data.items():
                assert _same_bits(store.read(n), a)
    two.close()
    one.close()
    assert not os.path.exists(tmp_path / "one" / _store.IN_PLACE_MARK)  # clean close
    with PageStore.open(tmp_path / "one") as store:
        assert store.layout.slots == 1 and store.version == 4 and store.verify() == 5
        for n, a in data.items():
            assert _same_bits(store.read(n), a)
        assert os.path.exists(tmp_path / "one" / _store.IN_PLACE_MARK)  # marked while open
    manifest = json.loads((tmp_path / "one" / "manifest.json").read_text())
    assert manifest["slots"] == 1
    assert manifest["entries"]["opt.mu.w"]["file"] == {
        "A": "data/opt.mu.w.A.page",
        "B": "data/opt.mu.w.A.page",
    }


def test_single_slot_reading_an_overwritten_chunk_says_why(tmp_path):
    with PageStore.create(tmp_path / "s", ENTRIES_1, chunk_bytes=KB4, slots=1) as store:
        store.write("opt.mu.w", _rand((3000,), "float32"))
        store.write("opt.nu.w", _rand((3000,), "bfloat16"))
        store.commit()
        store.write_chunk("opt.mu.w", 1, np.zeros(1024, np.float32))
        with pytest.raises(PageStoreError, match="overwritten in place by an uncommitted"):
            store.read("opt.mu.w")
        assert _same_bits(store.read("opt.nu.w"), _rand((3000,), "bfloat16"))


def test_slots_must_match_and_be_valid(tmp_path):
    PageStore.create(tmp_path / "s", ENTRIES_1, chunk_bytes=KB4, slots=1).close()
    with pytest.raises(PageStoreLayoutError, match="slots: store has 1, requested 2"):
        PageStore.open_or_create(tmp_path / "s", ENTRIES_1, chunk_bytes=KB4)
    with PageStore.open_or_create(tmp_path / "s", ENTRIES_1, chunk_bytes=KB4, slots=1) as s:
        assert s.layout.slots == 1
    for bad in (0, 3, "1", True):
        with pytest.raises(PageStoreLayoutError, match="slots must be 2 .* or 1"):
            PageStore.create(tmp_path / "t", ENTRIES_1, chunk_bytes=KB4, slots=bad)


def test_manifest_without_slots_reads_as_two(tmp_path):
    _committed(tmp_path)
    path = tmp_path / "s" / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["slots"]  # as written before single-slot stores existed
    path.write_text(_signed(doc))
    with PageStore.open(tmp_path / "s") as store:
        assert store.layout.slots == 2 and store.verify() > 0


# ------------------------------------------------------------------------- manifest checksum


def test_manifest_edit_keeping_the_byte_count_is_refused(tmp_path):
    """A shape edited to another with the same element count passes every structural check
    (chunk table, nbytes): only the manifest's own checksum can tell."""
    root, _, _ = _committed(tmp_path)
    path = root / "manifest.json"
    doc = json.loads(path.read_text())
    doc["entries"]["opt.mu.w"]["shape"] = [1301, 7]
    path.write_text(json.dumps(doc))
    with pytest.raises(PageStoreManifestError, match=f"{path} fails its checksum.*never edit") as e:
        PageStore.open(root)
    assert isinstance(e.value, PageStoreFormatError | PageStoreCorruptError)
    del doc["manifest_crc32c"]
    path.write_text(json.dumps(doc))  # a format-2 manifest must carry its checksum
    with pytest.raises(PageStoreManifestError, match="has no manifest_crc32c field"):
        PageStore.open(root)
    path.write_text(_signed(doc))  # the same edit, as if jaxoff had written it: accepted
    with PageStore.open(root) as store:
        assert store.read("opt.mu.w").shape == (1301, 7)


def test_format_1_manifest_is_read_and_rewritten_with_a_checksum(tmp_path):
    root, data, _ = _committed(tmp_path)
    path = root / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["manifest_crc32c"]
    path.write_text(json.dumps({**doc, "format_version": 1}))  # as the previous release wrote
    with PageStore.open(root) as store:
        assert _same_bits(store.read("opt.mu.w"), data["opt.mu.w"])
        _write_all(store, 5)
        store.commit()
    doc = json.loads(path.read_text())
    assert doc["format_version"] == 2 and doc["manifest_crc32c"] == _manifest.content_crc(doc)


def test_manifest_version_that_does_not_match_its_pages_says_so(tmp_path):
    """Version 1 lives in slot B; a manifest saying version 2 points at slot A, never written.
    That is a manifest/pages mismatch, not a chunk "never written"."""
    root, _, _ = _committed(tmp_path)
    path = root / "manifest.json"
    doc = json.loads(path.read_text())
    path.write_text(_signed({**doc, "version": 2}))
    with pytest.raises(
        PageStoreManifestError, match="committed version is 2, which lives in slot A"
    ):
        PageStore.open(root)
    path.write_text(json.dumps({**doc, "version": 2}))  # edited without re-signing
    with pytest.raises(PageStoreManifestError, match="fails its checksum"):
        PageStore.open(root)


# ------------------------------------------------------------------------- store paths


@pytest.mark.parametrize("make", ["create", "open_or_create"])
def test_create_on_a_regular_file_is_one_line(tmp_path, make):
    target = tmp_path / "store"
    target.write_text("not a store")
    with pytest.raises(PageStoreError, match=f"{target}: it is a file, not a directory; remove"):
        getattr(PageStore, make)(target, ENTRIES, chunk_bytes=KB4)
    with pytest.raises(PageStoreError, match=f"cannot create the page store directory {target}/s"):
        PageStore.create(target / "s", ENTRIES, chunk_bytes=KB4)  # a file as a parent
    with pytest.raises(PageStoreNotFoundError, match="is a file, not a store directory"):
        PageStore.open(target)
    assert target.read_text() == "not a store"

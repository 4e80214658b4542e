"""The bytes a paged step moves: through `PageTransaction` / `StepRecorder` (the path every
paged step takes) and, where a test needs files and offsets of its own, through
``jaxoff.aio.page_*`` and `Pager` directly; for both engine backends.

Bitwise round trips of every dtype and chunk shape a store has, takes and puts inside
``lax.scan`` at per-trip addresses, checksums verified on every read (also across the engine's
blocks), one-line errors for a table with no pager, a full disk and the file size limit
surfacing at ``settle()`` or the next ``page_begin`` while the store keeps its version, the
backend env var, the I/O counters, and owners of one table name closing late.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import time

import crc32c as crc32c_pkg
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _limits import HANG_S

from jaxoff import _ffi
from jaxoff.aio import (
    PageStore,
    PageStoreCorruptError,
    PageStoreError,
    PageStoreFullError,
    store_error_from,
)
from jaxoff.aio._engine import EngineConfig
from jaxoff.aio._ffi_calls import (
    file_table_backend,
    register_file_table,
    unregister_file_table,
)
from jaxoff.aio._pager import (
    WAIT_COUNTERS,
    Pager,
    PagerConfig,
    io_stats,
    owner_name,
    page_begin,
    page_commit,
    page_out,
    page_take,
)
from jaxoff.optim._transaction import PagedTable, PageTransaction

BACKENDS = ["posix"] + (["io_uring"] if _ffi.uring_compiled_in() else [])
BLOCK = 256 << 10  # the engine's block size in these tests: crcs are taken block by block


def engine(backend: str) -> EngineConfig:
    return EngineConfig(block_size=BLOCK, queue_depth=8, pool_bytes=2 << 20, backend=backend)


def open_txn(root, entries, backend, *, chunk_bytes=4096, **kw) -> PageTransaction:
    txn = PageTransaction.open(
        root, entries, chunk_bytes=chunk_bytes, table=PagedTable("test.pager_io"),
        engine=engine(backend), **kw,
    )  # fmt: skip
    assert file_table_backend(txn.table) == backend
    return txn


def random_array(shape, dtype, seed) -> np.ndarray:
    """Random bytes (any bit pattern, NaNs included) viewed as ``dtype``."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def chunks_of(store, name: str, x: np.ndarray) -> list[np.ndarray]:
    flat = np.asarray(x).reshape(-1)
    return [flat[c.elem_start : c.elem_start + c.elem_count] for c in store.entries[name].chunks]


def initial(txn, arrays: dict) -> int:
    return txn.write_initial(
        [(n, i, c) for n, x in arrays.items() for i, c in enumerate(chunks_of(txn.store, n, x))]
    )


def chunk_place(store, name: str, chunk: int, slot: str | None = None) -> tuple[str, int, int]:
    """The page file, byte offset and length of chunk ``chunk`` of ``name`` in ``slot``."""
    table = store.chunk_table(slot or store.active_slot)
    e = list(store.entries).index(name)
    row = int(np.flatnonzero((table["entry"] == e) & (table["chunk"] == chunk))[0])
    return (store.file_table()[int(table["file_id"][row])], int(table["offset"][row]),
            int(table["nbytes"][row]))  # fmt: skip


def flip_byte(path: str, at: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


def swap_step(txn):
    """A step that takes every chunk of every entry (store order) and puts the chunks of
    ``new`` in their place: ``step(version, new) -> (version + 1, {name: what was read})``."""
    entries = txn.store.entries

    @jax.jit
    def step(version, new):
        rec = txn.begin(version)
        got = {}
        for name, e in entries.items():
            flat = new[name].reshape(-1)
            parts = []
            for c in e.chunks:

                def at(env, name=name, i=c.index):
                    return name, i

                parts.append(rec.take(at, (c.elem_count,), e.dtype))
                rec.put(at, flat[c.elem_start : c.elem_start + c.elem_count])
            got[name] = jnp.concatenate(parts).reshape(e.shape)
        rec.commit()
        return version + 1, got

    return step


def assert_store_holds(txn, arrays: dict) -> None:
    """The committed version is ``arrays``: read back verified, each chunk's recorded crc32c
    that of its bytes, and the bytes at the chunk's place in its page file."""
    store = txn.store
    for name, x in arrays.items():
        assert np.asarray(store.read(name)).tobytes() == x.tobytes(), name
        chunks = chunks_of(store, name, x)
        assert store.crcs(name) == [crc32c_pkg.crc32c(c.tobytes()) for c in chunks], name
        for i, c in enumerate(chunks):
            path, offset, nbytes = chunk_place(store, name, i)
            assert nbytes == c.nbytes
            with open(path, "rb") as f:
                f.seek(offset)
                assert f.read(nbytes) == c.tobytes(), (name, i)


# ---- round trips -------------------------------------------------------------------------------

ROUND_TRIP = {
    "f32_one": ((1,), np.float32),  # a 4-byte chunk
    "f32_short": ((1023,), np.float32),  # 4092 bytes: not a multiple of 4096
    "i8_tail": ((4097,), np.int8),  # a full chunk and a 1-byte one
    "bf16": ((77, 13), ml_dtypes.bfloat16),  # 2002 bytes
    "f32_multi": ((10003,), np.float32),  # 10 chunks, the last one 3148 bytes
    "i32": ((5,), np.int32),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_round_trips_every_dtype_and_chunk_shape_bitwise(tmp_path, backend):
    txn = open_txn(tmp_path / "s", ROUND_TRIP, backend)
    x0 = {n: random_array(s, d, i) for i, (n, (s, d)) in enumerate(ROUND_TRIP.items())}
    x1 = {n: random_array(s, d, 100 + i) for i, (n, (s, d)) in enumerate(ROUND_TRIP.items())}
    assert initial(txn, x0) == 1
    n_chunks = sum(len(e.chunks) for e in txn.store.entries.values())
    before = txn.stats()
    step = swap_step(txn)
    version, got = step(jnp.int32(1), x1)  # reads slot A, writes slot B
    for n, x in x0.items():
        assert np.asarray(got[n]).tobytes() == x.tobytes(), n
    txn.settle()
    assert txn.store.version == int(version) == 2
    assert_store_holds(txn, x1)
    version, got = step(version, x0)  # the plan's other variant: reads B, writes A
    for n, x in x1.items():
        assert np.asarray(got[n]).tobytes() == x.tobytes(), n
    txn.settle()
    assert txn.store.version == int(version) == 3
    assert_store_holds(txn, x0)
    after = txn.stats()
    assert after["takes"] - before["takes"] == after["puts"] - before["puts"] == 2 * n_chunks
    assert after["commits"] - before["commits"] == 2
    assert step._cache_size() == 1
    txn.close()


# ---- inside lax.scan ---------------------------------------------------------------------------

ROWS, ROW = 6, 1001  # six entries of one 4004-byte chunk


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_a_scan_takes_and_puts_at_per_trip_addresses(tmp_path, backend, reverse):
    """One take and one put site inside ``StepRecorder.scan``: each trip pages the entry its
    static value names, in the order the trips run (a reverse scan's last value first)."""
    entries = {f"x{i}": ((ROW,), np.float32) for i in range(ROWS)}
    txn = open_txn(tmp_path / "s", entries, backend)
    x0 = {n: random_array((ROW,), np.float32, i) for i, n in enumerate(entries)}
    initial(txn, x0)
    order = (3, 1, 5, 0, 2, 4)  # the entry each element of xs pages
    new = random_array((ROWS, ROW), np.float32, 7)
    recs = []

    @jax.jit
    def step(version, new):
        rec = txn.begin(version)
        recs.append(rec)

        def body(trips, row, loop):
            def at(env):
                return f"x{env[loop]}", 0

            y = rec.take(at, (ROW,), jnp.float32)
            rec.put(at, row)
            return trips + 1, y

        trips, ys = rec.scan(body, jnp.int32(0), new, values=order, reverse=reverse)
        rec.commit()
        return version + 1, trips, ys

    before = txn.stats()
    version, trips, ys = step(jnp.int32(1), new)
    assert int(trips) == ROWS
    # ys line up with xs whatever the direction: element i read entry order[i]
    assert np.asarray(ys).tobytes() == np.stack([x0[f"x{i}"] for i in order]).tobytes()
    txn.settle()
    assert txn.store.version == int(version) == 2
    assert_store_holds(txn, {f"x{e}": new[i] for i, e in enumerate(order)})
    plan = recs[-1].plan
    run = order[::-1] if reverse else order
    assert [(io.kind, io.entry) for io in plan.ios()] == [
        (kind, f"x{e}") for e in run for kind in ("read", "write")
    ]
    assert plan.trips() == {0: ROWS, 1: ROWS}
    after = txn.stats()
    assert (after["takes"] - before["takes"], after["puts"] - before["puts"]) == (ROWS, ROWS)
    # one call per site in the program: the addresses come from the plan, not the program
    text = step.lower(jnp.int32(1), new).as_text()
    assert text.count("@jaxoff_pager_take(") == text.count("@jaxoff_pager_out(") == 1
    txn.close()


def test_nested_scans_address_a_layer_and_a_chunk_per_trip(tmp_path):
    layers, elems = 3, 2048  # each layer 2 chunks of 1024 float32
    entries = {f"L{j}": ((elems,), np.float32) for j in range(layers)}
    txn = open_txn(tmp_path / "s", entries, BACKENDS[-1])
    rng = np.random.default_rng(0)  # numbers, not bytes: the step negates them
    x0 = {n: rng.standard_normal(elems).astype(np.float32) for n in entries}
    initial(txn, x0)

    @jax.jit
    def step(version):
        rec = txn.begin(version)

        def layer(carry, _, outer):
            def chunk(carry, _, inner):
                def at(env):
                    return f"L{env[outer]}", env[inner]

                y = rec.take(at, (1024,), jnp.float32)
                rec.put(at, -y)  # a sign flip: exact
                return carry, y

            return rec.scan(chunk, carry, None, values=(0, 1), length=2)

        _, ys = rec.scan(layer, jnp.int32(0), None, values=range(layers), length=layers,
                         reverse=True)  # fmt: skip
        rec.commit()
        return version + 1, ys

    version, ys = step(jnp.int32(1))
    want = np.stack([x0[f"L{j}"].reshape(2, 1024) for j in range(layers)])
    assert np.asarray(ys).tobytes() == want.tobytes()
    txn.settle()
    assert_store_holds(txn, {n: -x for n, x in x0.items()})
    txn.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pager_pages_a_scan_at_any_file_and_offset(tmp_path, backend):
    """`Pager` with a plan of its own: six chunks over three files, the last beyond 4 GiB (a
    sparse file), written in a scan; the commit is handed the crc32c of each write; a second
    plan reads them back in another order, verified."""
    table = owner_name("test.pager_io")
    paths = [str(tmp_path / f"f{i}.page") for i in range(3)]
    registration = register_file_table(table, paths, config=engine(backend))
    commits = []
    pager = Pager(table, version=0, crcs=[], commit=lambda v, rows: commits.append((v, rows)),
                  config=PagerConfig(slot_bytes=4096))  # fmt: skip
    try:
        nbytes = ROW * 4
        places = [(i % 3, 4096 * i) for i in range(ROWS - 1)] + [(2, (5 << 30) + 4096)]
        writes = [(0, f, o, nbytes) for f, o in places]
        pager.register_plan(1, ([], writes), ([], writes))
        perm = [3, 1, 5, 0, 2, 4]
        reads = [(0, *places[i], nbytes) for i in perm]
        pager.register_plan(2, (reads, []), (reads, []))
        x = random_array((ROWS, ROW), np.float32, 2)

        @jax.jit
        def write_all(version, x):
            tok = page_begin(table, 1, version)
            tok, _ = jax.lax.scan(lambda t, row: (page_out(table, 1, 0, row, t), None), tok, x)
            return page_commit(table, 1, tok)

        @jax.jit
        def read_all(version):
            tok = page_begin(table, 2, version)

            def body(t, _):
                y, t = page_take(table, 2, 0, t, shape=(ROW,), dtype=jnp.float32)
                return t, y

            tok, ys = jax.lax.scan(body, tok, None, length=ROWS)
            return ys, page_commit(table, 2, tok)

        jax.block_until_ready(write_all(jnp.int32(0), x))
        pager.settle()
        assert [v for v, _ in commits] == [1]
        want = {(f, o): crc32c_pkg.crc32c(x[i].tobytes()) for i, (f, o) in enumerate(places)}
        assert {(f, o): c for f, o, c in commits[0][1]} == want
        assert {(f, o): c for f, o, c in pager.checksums()} == want
        for i, (f, o) in enumerate(places):
            with open(paths[f], "rb") as fh:
                fh.seek(o)
                assert fh.read(nbytes) == x[i].tobytes(), i
        assert os.path.getsize(paths[2]) > 5 << 30  # the offset's high word was used
        ys, _ = read_all(jnp.int32(1))
        assert np.asarray(ys).tobytes() == x[perm].tobytes()
        pager.settle()
        stats = pager.stats()
        assert (stats["version"], stats["commits"], stats["read_only_steps"]) == (1, 1, 1)
        assert (stats["takes"], stats["puts"]) == (ROWS, ROWS)
    finally:
        pager.close()
        unregister_file_table(table, registration)


# ---- checksums ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_flipped_byte_fails_the_take_naming_file_offset_and_crc(tmp_path, backend):
    entries = {"w": ((5000,), np.float32)}  # one chunk of 20000 bytes
    txn = open_txn(tmp_path / "s", entries, backend, chunk_bytes=32 << 10)
    x0 = {"w": random_array((5000,), np.float32, 3)}
    initial(txn, x0)
    path, offset, _ = chunk_place(txn.store, "w", 0)
    crc = txn.store.crcs("w")[0]
    before = txn.stats()
    flip_byte(path, offset + 12345, 0x10)
    step = swap_step(txn)
    new = {"w": random_array((5000,), np.float32, 4)}
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(step(jnp.int32(1), new))
    msg = str(info.value)
    assert f"jaxoff_pager_take: checksum mismatch in {path} at offset {offset}" in msg
    assert "DATA_LOSS" in msg and f"expected crc32c {crc:#010x}" in msg and "restore" in msg
    err = store_error_from(info.value)
    assert isinstance(err, PageStoreCorruptError) and path in str(err)
    # the step wrote and committed nothing
    assert txn.store.version == 1 and txn.stats()["commits"] == before["commits"]
    assert txn.stats()["puts"] == before["puts"]
    flip_byte(path, offset + 12345, 0x10)  # repaired: the same program reads it again
    version, got = step(jnp.int32(1), new)
    assert np.asarray(got["w"]).tobytes() == x0["w"].tobytes()
    txn.settle()
    assert txn.store.version == int(version) == 2
    txn.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "nbytes", [BLOCK - 4, BLOCK, BLOCK + 4, (3 << 20) + 12, (5 << 20) + 4092]
)  # fmt: skip
def test_a_multi_block_crc_is_combined_exactly(tmp_path, backend, nbytes):
    """A chunk of several engine blocks: its write's crc32c (taken block by block and
    combined) is that of the whole chunk, its read verifies against the crc Python took, and
    a flip in its last block is still caught."""
    n = nbytes // 4
    txn = open_txn(tmp_path / "s", {"w": ((n,), np.float32)}, backend, chunk_bytes=6 << 20)
    assert len(txn.store.entries["w"].chunks) == 1
    x0, x1 = random_array((n,), np.float32, nbytes), random_array((n,), np.float32, nbytes + 1)
    initial(txn, {"w": x0})
    step = swap_step(txn)
    version, got = step(jnp.int32(1), {"w": x1})  # verified against Python's crc32c
    assert np.asarray(got["w"]).tobytes() == x0.tobytes()
    txn.settle()
    assert txn.store.crcs("w") == [crc32c_pkg.crc32c(x1.tobytes())]  # the engine's
    version, got = step(version, {"w": x0})  # verified against the engine's crc32c
    assert np.asarray(got["w"]).tobytes() == x1.tobytes()
    txn.settle()
    assert txn.store.crcs("w") == [crc32c_pkg.crc32c(x0.tobytes())]
    path, offset, _ = chunk_place(txn.store, "w", 0)
    flip_byte(path, offset + nbytes - 3, 0x01)
    with pytest.raises(jax.errors.JaxRuntimeError, match=f"checksum mismatch in {path}"):
        jax.block_until_ready(step(version, {"w": x1}))
    txn.close()


# ---- one-line errors ---------------------------------------------------------------------------

NO_TABLE = "test-pager-io-no-such-table"
CALLS = {
    "jaxoff_pager_begin": lambda t: page_begin(NO_TABLE, 1, jnp.int32(0)),
    "jaxoff_pager_take": lambda t: page_take(NO_TABLE, 1, 0, t, shape=(4,), dtype=jnp.float32)[1],
    "jaxoff_pager_out": lambda t: page_out(NO_TABLE, 1, 0, jnp.ones(4), t),
    "jaxoff_pager_commit": lambda t: page_commit(NO_TABLE, 1, t),
}


@pytest.mark.parametrize("target", sorted(CALLS))
def test_a_call_naming_a_table_with_no_pager_is_a_one_line_error(target):
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(jax.jit(CALLS[target])(jnp.zeros((), jnp.int32)))
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert f"{target}: no pager is open for file table '{NO_TABLE}'" in msg
    assert "open it again" in msg


def test_a_pager_of_an_unregistered_table_is_refused_in_one_line():
    with pytest.raises(RuntimeError) as info:
        Pager(NO_TABLE, version=0, crcs=[], commit=lambda v, rows: None,
              config=PagerConfig(slot_bytes=4096))  # fmt: skip
    msg = str(info.value)
    assert "\n" not in msg
    assert f"cannot open the pager of file table '{NO_TABLE}'" in msg
    assert "is not registered (jaxoff.aio.register_file_table)" in msg


def test_a_step_of_a_closed_store_names_its_table(tmp_path):
    txn = open_txn(tmp_path / "s", {"w": ((1024,), np.float32)}, BACKENDS[0])
    initial(txn, {"w": np.ones(1024, np.float32)})
    step = swap_step(txn)
    version, _ = step(jnp.int32(1), {"w": np.zeros(1024, np.float32)})
    txn.close()
    assert io_stats(txn.table) is None and file_table_backend(txn.table) is None
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(step(version, {"w": np.ones(1024, np.float32)}))
    msg = str(info.value)
    assert "\n" not in msg
    assert f"jaxoff_pager_begin: no pager is open for file table '{txn.table}'" in msg
    assert "open it again" in msg


def test_a_read_past_the_end_of_a_page_file_names_it(tmp_path):
    table = owner_name("test.pager_io")
    paths = [str(tmp_path / f"f{i}.page") for i in range(2)]
    registration = register_file_table(table, paths, config=engine(BACKENDS[0]))
    pager = Pager(table, version=0, crcs=[], commit=lambda v, rows: None,
                  config=PagerConfig(slot_bytes=4096))  # fmt: skip
    try:
        reads = [(0, 1, 1 << 30, 4096)]
        pager.register_plan(1, (reads, []), (reads, []))

        @jax.jit
        def read():
            tok = page_begin(table, 1, jnp.int32(0))
            y, tok = page_take(table, 1, 0, tok, shape=(1024,), dtype=jnp.float32)
            return y, page_commit(table, 1, tok)

        with pytest.raises(jax.errors.JaxRuntimeError) as info:
            jax.block_until_ready(read())
        msg = str(info.value)
        assert f"jaxoff_pager_take: read {paths[1]} at offset 1073741824 (4096 bytes)" in msg
        assert "read past the end of the file" in msg
        err = store_error_from(info.value)
        assert isinstance(err, PageStoreCorruptError) and "truncated" in str(err)
    finally:
        pager.close()
        unregister_file_table(table, registration)


_BAD_FILE_ID = """
import jax, jax.numpy as jnp
from jaxoff.aio._ffi_calls import register_file_table
from jaxoff.aio._pager import Pager, PagerConfig, page_begin, page_commit, page_take
register_file_table("bad", [{path!r}])
pager = Pager("bad", version=0, crcs=[], commit=lambda v, r: None,
              config=PagerConfig(slot_bytes=4096))
try:
    pager.register_plan(1, ([(0, 7, 0, 16)], []), ([(0, 7, 0, 16)], []))
    def read():
        tok = page_begin("bad", 1, jnp.int32(0))
        y, tok = page_take("bad", 1, 0, tok, shape=(4,), dtype=jnp.float32)
        return y, page_commit("bad", 1, tok)
    jax.block_until_ready(jax.jit(read)())
    print("NO ERROR")
except Exception as e:
    print("ERROR", type(e).__name__, str(e).replace(chr(10), " "))
"""


@pytest.mark.subprocess
def test_a_plan_naming_a_file_the_table_lacks_is_an_error_not_a_crash(tmp_path):
    code = _BAD_FILE_ID.format(path=str(tmp_path / "f0.page"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=HANG_S)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ERROR") and "file 7" in out.stdout, out.stdout


# ---- a full disk, the file size limit ------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs (needs root); unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                       check=False, capture_output=True)  # fmt: skip
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(root) -> str:
    """Fills the filesystem of ``root`` to the last byte; returns the filler file."""
    path = os.path.join(root, "filler")
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


CHUNKS, CHUNK_ELEMS = 4, 16 << 10  # 4 chunks of 64 KiB


def scan_step(txn):
    """A step adding 1 to every chunk of entry ``w``, chunk by chunk in a scan."""

    @jax.jit
    def step(version):
        rec = txn.begin(version)

        def body(total, _, loop):
            def at(env):
                return "w", env[loop]

            x = rec.take(at, (CHUNK_ELEMS,), jnp.float32)
            rec.put(at, x + 1)
            return total + x.sum(), None

        total, _ = rec.scan(body, jnp.float32(0), None, values=range(CHUNKS), length=CHUNKS)
        rec.commit()
        return version + 1, total

    return step


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_disk_fails_the_writes_behind_a_step_and_the_store_keeps_its_version(
    small_fs, backend
):
    """Page files are allocated when the store is made; here the slot the next step writes
    has lost its blocks (truncated) and the filesystem is full. The step returns (its writes
    run behind it); the write's error, naming the page file, its offset and ENOSPC, comes
    from ``settle()`` and, unsettled, from the next ``page_begin``; the store stays at its
    version until space is back."""
    txn = open_txn(small_fs / "s", {"w": ((CHUNKS * CHUNK_ELEMS,), np.float32)}, backend,
                   chunk_bytes=CHUNK_ELEMS * 4)  # fmt: skip
    x0 = np.arange(CHUNKS * CHUNK_ELEMS, dtype=np.float32)
    initial(txn, {"w": x0})
    step = scan_step(txn)
    version, _ = step(jnp.int32(1))
    txn.settle()
    assert txn.store.version == int(version) == 2
    target = chunk_place(txn.store, "w", 0, txn.store.inactive_slot)[0]
    os.truncate(target, 0)
    filler = fill(small_fs)
    written = rf"write {target} at offset \d+ \(65536 bytes\) failed: .*\(ENOSPC, errno 28\)"

    failed, _ = step(version)  # runs; its writes fail behind it
    try:
        jax.block_until_ready(failed)
    except jax.errors.JaxRuntimeError as e:  # the write failed before the step's commit call
        assert "not committed" in str(e)
    with pytest.raises(PageStoreFullError) as info:  # the store's own error, from the engine's
        txn.settle()
    full = info.value
    assert f"page file {target}: write of 65536 bytes at offset" in str(full)
    assert "the disk is full (ENOSPC)" in str(full) and "last committed version is intact" in str(
        full
    )
    assert (full.errno, full.path, full.needed_bytes) == (errno.ENOSPC, target, 65536)
    assert store_error_from(full) is full
    assert txn.store.version == 2

    failed, _ = step(version)  # again, unsettled: the next step's page_begin raises it
    try:
        jax.block_until_ready(failed)
    except jax.errors.JaxRuntimeError as e:
        assert "not committed" in str(e)
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(step(version))
    msg = str(info.value)
    assert "RESOURCE_EXHAUSTED: jaxoff_pager_begin: " in msg
    assert re.search(written, msg), msg
    full = store_error_from(info.value)
    assert isinstance(full, PageStoreFullError) and full.errno == errno.ENOSPC
    assert full.path == target
    assert txn.store.version == 2
    assert np.asarray(txn.store.read("w")).tobytes() == (x0 + 1).tobytes()

    os.unlink(filler)  # space back: the same state steps on
    version, _ = step(version)
    txn.settle()
    assert txn.store.version == int(version) == 3
    txn.close()
    with PageStore.open(small_fs / "s") as store:
        assert store.version == 3 and store.verify() == CHUNKS
        assert np.asarray(store.read("w")).tobytes() == (x0 + 2).tobytes()


_FILE_SIZE_LIMIT = """
import resource, signal, sys
sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp, numpy as np
from test_pager_io import CHUNK_ELEMS, CHUNKS, initial, open_txn, scan_step
from jaxoff.aio import PageStoreError, store_error_from
txn = open_txn({root!r}, {{"w": ((CHUNKS * CHUNK_ELEMS,), np.float32)}}, {backend!r},
               chunk_bytes=CHUNK_ELEMS * 4)
initial(txn, {{"w": np.zeros(CHUNKS * CHUNK_ELEMS, np.float32)}})
step = scan_step(txn)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (2 * CHUNK_ELEMS * 4, resource.RLIM_INFINITY))
try:
    jax.block_until_ready(step(jnp.int32(1)))
except jax.errors.JaxRuntimeError:
    pass
try:
    txn.settle()
    print("NO ERROR")
except PageStoreError as e:
    full = store_error_from(e)
    print("FULL", type(full).__name__, full.errno, full.path, txn.store.version)
    print("MESSAGE", e)
txn.close()
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_file_size_limit_fails_the_writes_behind_a_step(tmp_path, backend):
    """RLIMIT_FSIZE below the page file's size (SIGXFSZ ignored): the writes past it fail
    with EFBIG, reported by ``settle()`` with the file and offset; the store keeps version 1."""
    code = _FILE_SIZE_LIMIT.format(
        tests=os.path.dirname(os.path.abspath(__file__)), root=str(tmp_path / "s"),
        backend=backend,
    )  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=HANG_S)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    page = str(tmp_path / "s" / "data" / "w.A.page")  # version 1 is slot B: the step writes A
    assert f"FULL PageStoreFullError {errno.EFBIG} {page} 1" in out.stdout, out.stdout
    assert f"page file {page}: write of" in out.stdout and "(EFBIG)" in out.stdout
    assert "the file size limit was reached" in out.stdout and "ulimit -f" in out.stdout


# ---- the backend -------------------------------------------------------------------------------

_ENV_BACKEND = """
import sys
sys.path.insert(0, {tests!r})
import jax.numpy as jnp, numpy as np
from jaxoff.aio._ffi_calls import file_table_backend
from jaxoff.optim._transaction import PagedTable, PageTransaction
from test_pager_io import initial, swap_step
txn = PageTransaction.open({root!r}, {{"w": ((12345,), np.float32)}}, chunk_bytes=4096,
                           table=PagedTable("env"))
x = np.arange(12345, dtype=np.float32)
initial(txn, {{"w": x}})
_, got = swap_step(txn)(jnp.int32(1), {{"w": -x}})
txn.settle()
print(file_table_backend(txn.table), np.asarray(got["w"]).tobytes() == x.tobytes(),
      txn.store.read("w").tobytes() == (-x).tobytes())
txn.close()
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_backend_env_var_selects_the_engine_of_a_stores_table(tmp_path, backend):
    code = _ENV_BACKEND.format(
        tests=os.path.dirname(os.path.abspath(__file__)), root=str(tmp_path / "s")
    )
    env = dict(os.environ, JAXOFF_AIO_BACKEND=backend, JAXOFF_QUIET_BACKEND="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=HANG_S)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [backend, "True", "True"]


# ---- counters ----------------------------------------------------------------------------------

MIB = 1 << 20


@pytest.mark.parametrize("backend", BACKENDS)
def test_io_stats_count_a_steps_bytes_busy_time_and_waits(tmp_path, backend, monkeypatch):
    """The counters behind ``jaxoff train``'s I/O split (`io_stats` of the store's table):
    the bytes the engine moved, the time it had I/O in flight, and the time the step's calls
    waited. A commit held up for 0.3 s makes the next step's begin wait."""
    txn = open_txn(tmp_path / "s", {"w": ((MIB,), np.float32)}, backend, chunk_bytes=MIB)
    x0 = random_array((MIB,), np.float32, 5)  # 4 chunks of 1 MiB
    initial(txn, {"w": x0})
    step = swap_step(txn)
    version, _ = step(jnp.int32(1), {"w": x0})  # compiled
    txn.settle()
    before = io_stats(txn.table)
    t0 = time.perf_counter()
    version, got = step(version, {"w": -x0})
    jax.block_until_ready(got)
    txn.settle()
    wall_ns = (time.perf_counter() - t0) * 1e9
    after = io_stats(txn.table)
    assert after["read_bytes"] - before["read_bytes"] == 4 * MIB
    assert after["write_bytes"] - before["write_bytes"] == 4 * MIB
    assert 0 < after["io_busy_ns"] - before["io_busy_ns"] <= wall_ns
    waited = sum(after[k] - before[k] for k in WAIT_COUNTERS)
    assert 0 <= waited <= wall_ns
    delta = {k: after[k] - before[k] for k in ("steps_begun", "takes", "puts", "commits", "syncs")}
    assert delta == {"steps_begun": 1, "takes": 4, "puts": 4, "commits": 1, "syncs": 1}
    assert after["version"] == txn.store.version == int(version) == 3

    commit = PageStore.commit

    def slow_commit(self, *args, **kw):
        time.sleep(0.3)
        return commit(self, *args, **kw)

    monkeypatch.setattr(PageStore, "commit", slow_commit)
    before = io_stats(txn.table)
    version, _ = step(version, {"w": x0})
    version, _ = step(version, {"w": -x0})  # its begin waits for the previous commit
    txn.settle()
    after = io_stats(txn.table)
    assert after["begin_wait_ns"] - before["begin_wait_ns"] > 0
    assert after["commits"] - before["commits"] == 2 and txn.store.version == 5
    txn.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_takes_and_puts_wait_when_the_pager_has_one_slot_each(tmp_path, backend):
    """One arena slot and one write slot: the second take waits for a read that could start
    only after the first take, the second put for the first put's write."""
    table = owner_name("test.pager_io")
    registration = register_file_table(table, [str(tmp_path / "f.page")], config=engine(backend))
    pager = Pager(table, version=0, crcs=[], commit=lambda v, rows: None,
                  config=PagerConfig(slot_bytes=4 * MIB, arena_slots=1, write_slots=1))  # fmt: skip
    try:
        ios = [(0, 0, i * 4 * MIB, 4 * MIB) for i in range(3)]
        pager.register_plan(1, ([], ios), ([], ios))
        pager.register_plan(2, (ios, []), (ios, []))
        x = random_array((3, MIB), np.float32, 6)

        @jax.jit
        def write(x):
            tok = page_begin(table, 1, jnp.int32(0))
            for i in range(3):
                tok = page_out(table, 1, 0, x[i], tok)
            return page_commit(table, 1, tok)

        @jax.jit
        def read():
            tok = page_begin(table, 2, jnp.int32(1))
            ys = []
            for _ in range(3):
                y, tok = page_take(table, 2, 0, tok, shape=(MIB,), dtype=jnp.float32)
                ys.append(y)
            return jnp.stack(ys), page_commit(table, 2, tok)

        before = io_stats(table)
        jax.block_until_ready(write(x))
        pager.settle()
        ys, _ = read()
        assert np.asarray(ys).tobytes() == x.tobytes()
        pager.settle()
        after = io_stats(table)
        assert after["put_wait_ns"] > before["put_wait_ns"]
        assert after["take_wait_ns"] > before["take_wait_ns"]
        assert after["write_bytes"] - before["write_bytes"] == 12 * MIB
        assert after["read_bytes"] - before["read_bytes"] == 12 * MIB
    finally:
        pager.close()
        unregister_file_table(table, registration)


# ---- owners of one table name ------------------------------------------------------------------


def test_a_late_unregister_does_not_drop_the_table_that_replaced_it(tmp_path):
    """Two owners register the same table name one after the other; the first one forgetting
    its registration late leaves the second one's table in place, and it pages."""
    table = owner_name("test.pager_io")
    path = str(tmp_path / "a.page")
    first = register_file_table(table, [path])
    second = register_file_table(table, [path])
    assert first != second
    pager = None
    try:
        assert not unregister_file_table(table, first)
        assert file_table_backend(table) is not None  # still registered
        pager = Pager(table, version=0, crcs=[], commit=lambda v, rows: None,
                      config=PagerConfig(slot_bytes=4096))  # fmt: skip
        ios = [(0, 0, 0, 4096)]
        pager.register_plan(1, ([], ios), (ios, []))
        x = jnp.arange(1024, dtype=jnp.float32)

        @jax.jit
        def write(x):
            return page_commit(table, 1, page_out(table, 1, 0, x, page_begin(table, 1, 0)))

        @jax.jit
        def read():
            y, tok = page_take(table, 1, 0, page_begin(table, 1, 1), shape=(1024,),
                               dtype=jnp.float32)  # fmt: skip
            return y, page_commit(table, 1, tok)

        jax.block_until_ready(write(x))
        pager.settle()
        y, _ = read()
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
        pager.settle()
        pager.close()
        assert unregister_file_table(table, second)
        assert file_table_backend(table) is None
    finally:
        if pager is not None:
            pager.close()
        unregister_file_table(table)


def test_a_late_close_does_not_drop_the_pager_of_the_transaction_that_replaced_it(tmp_path):
    """Two transactions on one `PagedTable` (an owner whose store was opened again while an
    old transaction lingered): closing the old one late leaves the new one paging."""
    owner = PagedTable("test.pager_io")
    entries = {"w": ((1024,), np.float32)}
    old = PageTransaction.open(tmp_path / "old", entries, chunk_bytes=4096, table=owner)
    initial(old, {"w": np.ones(1024, np.float32)})
    new = PageTransaction.open(tmp_path / "new", entries, chunk_bytes=4096, table=owner)
    try:
        initial(new, {"w": np.full(1024, 2, np.float32)})
        old.close()
        assert file_table_backend(owner.name) is not None  # the file table stays
        assert io_stats(owner.name) is not None  # and so must the pager
        version, got = swap_step(new)(jnp.int32(1), {"w": np.full(1024, 3, np.float32)})
        np.testing.assert_array_equal(np.asarray(got["w"]), 2)
        new.settle()
        assert new.store.version == int(version) == 2
    finally:
        for txn in (old, new):
            try:
                txn.close()
            except (PageStoreError, ValueError):  # its pager is gone: release the rest
                txn.store.settle_hook = None
                txn.store.close()
                unregister_file_table(txn.table, txn._registration)

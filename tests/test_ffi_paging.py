"""jaxoff_page_in / page_out / page_prefetch / page_take / page_flush inside jit and lax.scan,
for both engine backends."""

import os
import subprocess
import sys
import textwrap
import time

import crc32c as crc32c_pkg
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _limits import HANG_S

from jaxoff import _ffi
from jaxoff.aio._engine import EngineConfig
from jaxoff.aio._ffi_calls import (
    drain_prefetches,
    encode_offsets,
    file_table_backend,
    file_table_stats,
    flush_file_table,
    new_token,
    page_flush,
    page_in,
    page_out,
    page_prefetch,
    page_take,
    register_file_table,
    unregister_file_table,
)

BACKENDS = ["posix"] + (["io_uring"] if _ffi.uring_compiled_in() else [])


@pytest.fixture(params=BACKENDS)
def table(request, tmp_path):
    """A registered table of three files, one engine of the parametrized backend."""
    name = f"t_{request.param}_{os.getpid()}_{id(tmp_path)}"
    paths = [tmp_path / f"f{i}.page" for i in range(3)]
    cfg = EngineConfig(
        block_size=256 << 10, queue_depth=8, pool_bytes=2 << 20, backend=request.param
    )
    register_file_table(name, paths, config=cfg)
    assert file_table_backend(name) == request.param
    yield name, paths
    unregister_file_table(name)


def random_array(shape, dtype, seed):
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    return (
        np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).view(dtype).reshape(shape)
    )


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((1,), np.float32),
        ((1023,), np.float32),
        ((4097,), np.int8),
        ((3, 1001), np.int8),
        ((1000003,), np.float32),
        ((77, 13), ml_dtypes.bfloat16),
        ((5,), np.int32),
    ],
    ids=str,
)
def test_roundtrip_in_jit_is_bitwise(table, shape, dtype):
    name, paths = table
    x = random_array(shape, dtype, 1)

    @jax.jit
    def roundtrip(x, file_id, offset):
        crc, tok = page_out(name, file_id, offset, x, new_token())
        y, tok = page_in(name, file_id, offset, crc, tok, shape=x.shape, dtype=x.dtype)
        return y, crc

    y, crc = roundtrip(x, 1, encode_offsets(8192))
    assert np.asarray(y).tobytes() == x.tobytes()
    assert int(crc) == crc32c_pkg.crc32c(x.tobytes())
    with open(paths[1], "rb") as f:
        f.seek(8192)
        assert f.read(x.nbytes) == x.tobytes()


def test_scan_pages_chunks_with_offsets_as_operands(table):
    name, _ = table
    chunks, elems = 6, 1001  # 4004-byte chunks in 4096-byte slots
    x = random_array((chunks, elems), np.float32, 2)
    # Chunk i goes to file i % 3; the last one beyond 4 GiB (a sparse file: uses the high word).
    file_ids = np.arange(chunks, dtype=np.int32) % 3
    offsets = encode_offsets([4096 * i for i in range(chunks - 1)] + [(5 << 30) + 4096])

    @jax.jit
    def write_all(x, file_ids, offsets):
        def body(tok, xs):
            chunk, fid, off = xs
            crc, tok = page_out(name, fid, off, chunk, tok)
            return tok, crc

        return jax.lax.scan(body, new_token(), (x, file_ids, offsets))

    @jax.jit
    def read_all(crcs, file_ids, offsets, tok):
        def body(tok, xs):
            crc, fid, off = xs
            y, tok = page_in(name, fid, off, crc, tok, shape=(elems,), dtype=jnp.float32)
            return tok, y

        return jax.lax.scan(body, tok, (crcs, file_ids, offsets))[1]

    tok, crcs = write_all(x, file_ids, offsets)
    y = read_all(crcs, file_ids, offsets, tok)
    assert np.asarray(y).tobytes() == x.tobytes()
    assert [int(c) for c in crcs] == [crc32c_pkg.crc32c(r.tobytes()) for r in x]
    # Reading in another order with other offsets reuses the compiled program.
    perm = np.array([3, 1, 5, 0, 2, 4])
    y2 = read_all(crcs[perm], file_ids[perm], offsets[perm], tok)
    assert np.asarray(y2).tobytes() == x[perm].tobytes()
    assert read_all._cache_size() == 1


def test_flipped_byte_is_detected(table):
    name, paths = table
    x = random_array((5000,), np.float32, 3)
    off = encode_offsets(4096)
    crc, tok = jax.jit(lambda x: page_out(name, 2, off, x, new_token()))(x)
    jax.block_until_ready(crc)
    with open(paths[2], "r+b") as f:
        f.seek(4096 + 12345)
        b = f.read(1)
        f.seek(4096 + 12345)
        f.write(bytes([b[0] ^ 0x10]))

    read = jax.jit(
        lambda crc, verify: page_in(
            name, 2, off, crc, new_token(), shape=x.shape, dtype=x.dtype, verify=verify
        )[0],
        static_argnums=1,
    )
    with pytest.raises(jax.errors.JaxRuntimeError) as e:
        jax.block_until_ready(read(crc, True))
    msg = str(e.value)
    assert "checksum mismatch" in msg and str(paths[2]) in msg and "offset 4096" in msg
    assert f"{int(crc):#x}" in msg and "restore" in msg
    # Without verification the corrupted bytes come through, differing in exactly one byte.
    got = np.asarray(read(crc, False)).view(np.uint8)
    assert np.count_nonzero(got != x.view(np.uint8)) == 1


@pytest.mark.parametrize(
    "nbytes", [(256 << 10) - 4, 256 << 10, (256 << 10) + 4, (3 << 20) + 12, (5 << 20) + 4092]
)
def test_multi_block_crc_is_combined_exactly(table, nbytes):
    """page_out's crc and page_in's verification are taken block by block (256 KiB blocks here,
    through 64-byte-aligned XLA buffers, so every block is staged) and combined: they must
    equal the crc32c of the whole tensor, and a flip in the last block must still be caught."""
    name, paths = table
    x = random_array((nbytes // 4,), np.float32, nbytes)
    off = encode_offsets(4096)

    @jax.jit
    def roundtrip(x):
        crc, tok = page_out(name, 0, off, x, new_token())
        y, tok = page_in(name, 0, off, crc, tok, shape=x.shape, dtype=x.dtype)
        return y, crc

    y, crc = roundtrip(x)
    assert int(crc) == crc32c_pkg.crc32c(x.tobytes())
    assert np.asarray(y).tobytes() == x.tobytes()
    with open(paths[0], "r+b") as f:
        f.seek(4096 + nbytes - 3)
        b = f.read(1)
        f.seek(4096 + nbytes - 3)
        f.write(bytes([b[0] ^ 0x01]))
    read = jax.jit(
        lambda crc: page_in(name, 0, off, crc, new_token(), shape=x.shape, dtype=x.dtype)[0]
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match="checksum mismatch"):
        jax.block_until_ready(read(crc))


def test_unregistered_table_and_bad_file_id_are_clear_errors(table):
    name, _ = table
    with pytest.raises(Exception, match="not registered"):
        jax.block_until_ready(
            jax.jit(
                lambda: page_in(
                    "no_such_table", 0, 0, 0, new_token(), shape=(4,), dtype=jnp.float32
                )
            )()
        )
    with pytest.raises(jax.errors.JaxRuntimeError, match="file_id 7 is out of range"):
        jax.block_until_ready(
            jax.jit(
                lambda: page_in(
                    name, 7, 0, 0, new_token(), shape=(4,), dtype=jnp.float32, verify=False
                )
            )()
        )


def test_read_past_end_is_a_clear_error(table):
    name, paths = table
    with pytest.raises(jax.errors.JaxRuntimeError, match="past the end") as e:
        jax.block_until_ready(
            jax.jit(
                lambda: page_in(
                    name, 0, 1 << 20, 0, new_token(), shape=(4,), dtype=jnp.float32, verify=False
                )
            )()
        )
    assert str(paths[0]) in str(e.value)


def _run(script, env_extra=None, timeout=HANG_S):
    env = os.environ.copy()
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", BACKENDS)
def test_disk_full_gives_clear_error(tmp_path, backend):
    out = _run(f"""
        import resource, signal, jax, jax.numpy as jnp
        from jaxoff.aio._engine import EngineConfig
        from jaxoff.aio._ffi_calls import register_file_table, page_out, new_token
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        register_file_table("full", [{str(tmp_path / "full.page")!r}],
                            config=EngineConfig(backend={backend!r}))
        try:
            jax.block_until_ready(jax.jit(lambda x: page_out("full", 0, 0, x, new_token()))(
                jnp.ones(1 << 20, jnp.float32)))
            print("NO ERROR")
        except Exception as e:
            print(type(e).__name__, e)
    """)
    assert out.returncode == 0, out.stderr
    assert "JaxRuntimeError" in out.stdout and "EFBIG" in out.stdout, out.stdout
    assert str(tmp_path / "full.page") in out.stdout and "RLIMIT_FSIZE" in out.stdout


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_env_var_selects_backend(tmp_path, backend):
    out = _run(
        f"""
        import numpy as np, jax, jax.numpy as jnp
        from jaxoff.aio._ffi_calls import (register_file_table, file_table_backend, page_in,
                                           page_out, new_token)
        register_file_table("env", [{str(tmp_path / "e.page")!r}])
        x = jnp.arange(12345, dtype=jnp.float32)
        @jax.jit
        def f(x):
            crc, tok = page_out("env", 0, 0, x, new_token())
            return page_in("env", 0, 0, crc, tok, shape=x.shape, dtype=x.dtype)[0]
        print(file_table_backend("env"), bool((np.asarray(f(x)) == np.asarray(x)).all()))
    """,
        {"JAXOFF_AIO_BACKEND": backend},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [backend, "True"]


# ---- split phase: page_prefetch / page_take, write-behind page_out, page_flush -------------


def assert_no_staging_held(name):
    s = file_table_stats(name)
    assert (s["tickets"], s["reads_in_flight"], s["writes_in_flight"], s["staging_in_use"]) == (
        0,
        0,
        0,
        0,
    ), s
    assert s["staging_allocated"] <= s["budget"]


@pytest.mark.parametrize(
    "shape, dtype",
    [((1,), np.float32), ((4097,), np.int8), ((77, 13), ml_dtypes.bfloat16), ((100003,), np.int32)],
    ids=str,
)
def test_prefetch_take_roundtrip_in_jit_is_bitwise(table, shape, dtype):
    name, paths = table
    x = random_array(shape, dtype, 2)

    @jax.jit
    def roundtrip(x, offset):
        crc, tok = page_out(name, 2, offset, x, new_token(), write_behind=True)
        ticket = page_prefetch(name, 2, offset, crc, tok, shape=x.shape, dtype=x.dtype)
        y, tok = page_take(name, ticket, tok, shape=x.shape, dtype=x.dtype)
        return y, crc, page_flush(name, tok)

    y, crc, _ = jax.block_until_ready(roundtrip(x, encode_offsets(4096)))
    assert np.asarray(y).tobytes() == x.tobytes()
    assert int(crc) == crc32c_pkg.crc32c(x.tobytes())
    with open(paths[2], "rb") as f:  # after the flush, other readers see the write
        f.seek(4096)
        assert f.read(x.nbytes) == x.tobytes()
    assert_no_staging_held(name)


def test_prefetch_in_scan_with_ticket_in_carry_and_several_outstanding(table):
    name, _ = table
    n, size = 9, 3001  # odd chunk: 4 KiB slots, unaligned tails
    data = random_array((n, size), np.float32, 3)
    slot = 16384
    offs = encode_offsets([i * slot for i in range(n)])

    @jax.jit
    def write_all(data):
        def body(tok, xs):
            x, off = xs
            crc, tok = page_out(name, 0, off, x, tok, write_behind=True)
            return tok, crc

        tok, crcs = jax.lax.scan(body, new_token(), (data, offs))
        return crcs, page_flush(name, tok, fsync=True)

    crcs, _ = jax.block_until_ready(write_all(data))

    @jax.jit
    def read_all(crcs):
        def take(t, tok):
            return page_take(name, t, tok, shape=(size,), dtype=jnp.float32)

        # Three tickets outstanding at once: the prologue prefetches chunks 0 and 1.
        t0 = page_prefetch(name, 0, offs[0], crcs[0], new_token(), shape=(size,), dtype=jnp.float32)
        t1 = page_prefetch(name, 0, offs[1], crcs[1], t0, shape=(size,), dtype=jnp.float32)

        def body(carry, xs):
            ta, tb = carry
            tc = page_prefetch(name, 0, xs[1], xs[0], tb, shape=(size,), dtype=jnp.float32)
            x, _ = take(ta, tc)  # the new ticket is take's token: prefetch, then take
            return (tb, tc), x

        (ta, tb), ys = jax.lax.scan(body, (t0, t1), (crcs[2:], offs[2:]))
        ya, tok = take(ta, new_token())
        yb, _ = take(tb, tok)
        return jnp.concatenate([ys, ya[None], yb[None]])

    got = read_all(crcs)
    assert np.asarray(got).tobytes() == data.tobytes()
    assert_no_staging_held(name)


def test_take_detects_checksum_mismatch(table):
    name, paths = table
    x = random_array((5000,), np.uint8, 4)
    with open(paths[0], "wb") as f:
        f.write(x.tobytes())
    bad = np.uint32(crc32c_pkg.crc32c(x.tobytes()) ^ 1)

    @jax.jit
    def read(crc):
        t = page_prefetch(name, 0, 0, crc, new_token(), shape=x.shape, dtype=x.dtype)
        return page_take(name, t, new_token(), shape=x.shape, dtype=x.dtype)[0]

    with pytest.raises(Exception, match=r"(?s)DATA_LOSS.*checksum mismatch.*f0\.page.*offset 0"):
        jax.block_until_ready(read(bad))
    assert_no_staging_held(name)
    assert np.asarray(read(np.uint32(crc32c_pkg.crc32c(x.tobytes())))).tobytes() == x.tobytes()


def test_read_error_is_reported_at_take_with_path_and_offset(table):
    name, paths = table

    @jax.jit
    def read():
        t = page_prefetch(
            name, 1, 1 << 30, 0, new_token(), shape=(1024,), dtype=jnp.float32, verify=False
        )
        return page_take(name, t, new_token(), shape=(1024,), dtype=jnp.float32)[0]

    with pytest.raises(Exception, match=r"(?s)jaxoff_page_take.*f1\.page.*1073741824"):
        jax.block_until_ready(read())
    assert_no_staging_held(name)


def test_pool_exhaustion_names_pool_bytes_and_drain_reclaims(table):
    name, paths = table  # pool_bytes = 2 MiB
    with open(paths[0], "wb") as f:
        f.write(bytes(4 << 20))
    n = (1536 << 10) // 4

    @jax.jit
    def leak():  # a ticket nobody takes
        return page_prefetch(
            name, 0, 0, 0, new_token(), shape=(n,), dtype=jnp.float32, verify=False
        )

    jax.block_until_ready(leak())
    assert file_table_stats(name)["tickets"] == 1
    with pytest.raises(
        Exception,
        match=r"(?s)RESOURCE_EXHAUSTED.*pool_bytes = 2097152.*"
        r"1 prefetched chunks not yet taken.*drain_prefetches",
    ):
        jax.block_until_ready(leak())
    assert drain_prefetches(name) == 1
    assert_no_staging_held(name)
    assert file_table_stats(name)["reclaimed"] == 1


def test_write_behind_then_flush_then_read_sees_the_data(table):
    name, paths = table
    xs = [random_array((200_001,), np.float32, 10 + i) for i in range(4)]
    slot = 1 << 20

    @jax.jit
    def write(xs):
        tok = new_token()
        crcs = []
        for i, x in enumerate(xs):
            crc, tok = page_out(name, 1, i * slot, x, tok, write_behind=True)
            crcs.append(crc)
        return crcs, page_flush(name, tok)

    @jax.jit
    def overwrite_then_read(x, y):
        # Same slot twice, then a read, all write-behind and ordered by tokens only.
        _, tok = page_out(name, 1, 0, x, new_token(), write_behind=True)
        crc, tok = page_out(name, 1, 0, y, tok, write_behind=True)
        t = page_prefetch(name, 1, 0, crc, tok, shape=y.shape, dtype=y.dtype)
        z, tok = page_take(name, t, tok, shape=y.shape, dtype=y.dtype)
        w, tok = page_in(name, 1, 0, crc, tok, shape=y.shape, dtype=y.dtype)
        return z, w, page_flush(name, tok)

    crcs, _ = jax.block_until_ready(write(xs))
    with open(paths[1], "rb") as f:
        for i, x in enumerate(xs):
            f.seek(i * slot)
            assert f.read(x.nbytes) == x.tobytes()
    assert [int(c) for c in crcs] == [crc32c_pkg.crc32c(x.tobytes()) for x in xs]
    z, w, _ = jax.block_until_ready(overwrite_then_read(xs[2], xs[3]))
    assert np.asarray(z).tobytes() == xs[3].tobytes() == np.asarray(w).tobytes()
    flush_file_table(name)
    assert_no_staging_held(name)


def test_failed_write_behind_fails_the_flush(tmp_path):
    import resource
    import signal

    name = f"wb_fail_{os.getpid()}"
    path = tmp_path / "small.page"
    register_file_table(name, [path], config=EngineConfig(pool_bytes=1 << 20, o_direct=False))

    @jax.jit
    def write(x):  # past RLIMIT_FSIZE: the write fails (EFBIG) after page_out returned
        _, tok = page_out(name, 0, 4 << 20, x, new_token(), write_behind=True)
        return page_flush(name, tok)

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        with pytest.raises(Exception, match=r"(?s)page_flush.*write-behind.*small\.page"):
            jax.block_until_ready(write(jnp.ones((1000,), jnp.float32)))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
        unregister_file_table(name)


def test_table_counts_bytes_busy_time_and_blocked_time(table):
    """The counters behind ``jaxoff train``'s I/O split: bytes the engine moved, the wall
    time it had I/O in flight, and the time takes and flushes spent blocked on it."""
    name, _ = table
    x = random_array((300_001,), np.float32, 5)  # 1.2 MB: several 256 KiB blocks
    before = file_table_stats(name)

    @jax.jit
    def roundtrip(x):
        crc, tok = page_out(name, 1, encode_offsets(0), x, new_token(), write_behind=True)
        ticket = page_prefetch(name, 1, encode_offsets(0), crc, tok, shape=x.shape, dtype=x.dtype)
        y, tok = page_take(name, ticket, tok, shape=x.shape, dtype=x.dtype)
        return y, page_flush(name, tok)

    t0 = time.perf_counter()
    y, _ = jax.block_until_ready(roundtrip(x))
    wall_ns = (time.perf_counter() - t0) * 1e9
    after = file_table_stats(name)
    assert np.asarray(y).tobytes() == x.tobytes()
    assert after["write_bytes"] - before["write_bytes"] == x.nbytes
    assert after["read_bytes"] - before["read_bytes"] == x.nbytes
    busy = after["io_busy_ns"] - before["io_busy_ns"]
    assert 0 < busy <= wall_ns
    blocked = sum(
        after[k] - before[k]
        for k in ("take_wait_ns", "prefetch_wait_ns", "write_wait_ns", "flush_wait_ns")
    )
    assert 0 <= blocked <= wall_ns
    # each of the four blocking calls (write-behind, prefetch, take, flush) fed its counter
    for k in ("take_wait_ns", "prefetch_wait_ns", "write_wait_ns", "flush_wait_ns"):
        assert after[k] > before[k], k


def test_a_late_unregister_does_not_drop_the_table_that_replaced_it(tmp_path):
    """Two owners register the same table name one after the other; the first one forgetting
    its registration late leaves the second one's table in place."""
    path = str(tmp_path / "a.bin")
    first = register_file_table("late_owner", [path])
    second = register_file_table("late_owner", [path])
    assert first != second
    try:
        assert not unregister_file_table("late_owner", first)
        assert file_table_backend("late_owner") is not None  # still registered
        x = jnp.arange(1024, dtype=jnp.float32)
        crc, tok = page_out("late_owner", 0, 0, x, new_token())
        y, _ = page_in("late_owner", 0, 0, crc, tok, shape=(1024,), dtype=jnp.float32)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
        assert unregister_file_table("late_owner", second)
        assert file_table_backend("late_owner") is None
    finally:
        unregister_file_table("late_owner")

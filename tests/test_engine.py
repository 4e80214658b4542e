"""The C++ I/O engine through its Python face: config, numpy futures, crc32c, errors."""

import doctest
import errno
import os
import subprocess
import sys
import textwrap

import crc32c as crc32c_pkg
import ml_dtypes
import numpy as np
import pytest
from _limits import HANG_S

from jaxoff import _ffi
from jaxoff.aio._engine import Engine, EngineConfig, crc32c

BACKENDS = ["posix"] + (["io_uring"] if _ffi.uring_compiled_in() else [])


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def small_config(backend, **kw):
    base = dict(
        block_size=64 << 10, queue_depth=4, threads=2, pool_bytes=256 << 10, backend=backend
    )
    base.update(kw)
    return EngineConfig(**base)


@pytest.mark.parametrize(
    "kw, word",
    [
        (dict(block_size=1000), "block_size"),
        (dict(block_size=0), "block_size"),
        (dict(queue_depth=0), "queue_depth"),
        (dict(threads=0), "threads"),
        (dict(pool_bytes=4096), "pool_bytes"),
        (dict(backend="spdk"), "backend"),
        (dict(o_direct=1), "o_direct"),
        (dict(block_size=True), "block_size"),
    ],
)
def test_config_rejects_bad_knobs(kw, word):
    with pytest.raises(ValueError, match=word):
        EngineConfig(**kw)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_config_save_load_roundtrip(tmp_path, suffix):
    cfg = EngineConfig(
        block_size=8 << 20,
        queue_depth=32,
        threads=3,
        o_direct=False,
        pool_bytes=64 << 20,
        backend="posix",
    )
    path = tmp_path / f"engine{suffix}"
    cfg.save(path)
    assert EngineConfig.load(path) == cfg
    assert EngineConfig.load(path) != EngineConfig()


def test_config_load_rejects_unknown_keys(tmp_path):
    path = tmp_path / "e.json"
    path.write_text('{"engine": {"block_size": 4096, "queue_depht": 3}}')
    with pytest.raises(ValueError, match="queue_depht"):
        EngineConfig.load(path)


def test_backend_is_the_one_asked_for(backend):
    assert Engine(small_config(backend)).backend == backend


DTYPES = [np.float32, ml_dtypes.bfloat16, np.int8, np.float64]
SIZES = [1, 4095, 4097, (1 << 20) + 3]


@pytest.mark.parametrize("o_direct", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", SIZES)
def test_numpy_roundtrip(tmp_path, backend, o_direct, dtype, n):
    eng = Engine(small_config(backend, o_direct=o_direct))
    rng = np.random.default_rng(n)
    x = rng.integers(0, 255, size=n * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)
    path = tmp_path / "x.bin"
    eng.write(path, 8192, x).result()
    # Unaligned destination memory: a view one byte into a bigger buffer.
    raw = np.zeros(x.nbytes + 1, np.uint8)
    out = raw[1:].view(dtype)
    fut = eng.read_into(path, 8192, out)
    assert fut.wait() and fut.done()
    fut.result()
    assert out.tobytes() == x.tobytes()


def test_many_futures_in_flight(tmp_path, backend):
    eng = Engine(small_config(backend, pool_bytes=128 << 10))
    slot = 303104
    xs = [np.random.default_rng(i).random(300000 // 8) for i in range(10)]
    futs = [eng.write(tmp_path / "m.bin", i * slot, x) for i, x in enumerate(xs)]
    for f in futs:
        f.result()
    outs = [np.empty_like(x) for x in xs]
    futs = [eng.read_into(tmp_path / "m.bin", i * slot, o) for i, o in enumerate(outs)]
    for f in futs:
        f.result()
    for x, o in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(o, x)


def test_read_past_eof_names_path_and_offset(tmp_path, backend):
    eng = Engine(small_config(backend))
    path = tmp_path / "short.bin"
    eng.write(path, 0, np.zeros(1000, np.uint8)).result()
    with pytest.raises(OSError, match="past the end") as e:
        eng.read_into(path, 0, np.zeros(100000, np.uint8)).result()
    assert str(path) in str(e.value) and "at offset" in str(e.value)


def test_missing_directory_is_enoent(tmp_path, backend):
    eng = Engine(small_config(backend))
    path = tmp_path / "nope" / "x.bin"
    with pytest.raises(OSError) as e:
        eng.write(path, 0, np.zeros(10, np.uint8))
    assert e.value.errno == errno.ENOENT
    assert str(path) in str(e.value) and "does not exist" in str(e.value)


def test_rejects_non_contiguous_and_readonly(tmp_path):
    eng = Engine(small_config("posix"))
    with pytest.raises(ValueError, match="contiguous"):
        eng.write(tmp_path / "x", 0, np.zeros((4, 4))[:, 1])
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        eng.read_into(tmp_path / "x", 0, ro)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 4096, 100003])
def test_crc32c_matches_pypi_package(n):
    data = np.random.default_rng(n).integers(0, 256, n + 3, dtype=np.uint8)
    for start in (0, 1, 3):
        chunk = data[start : start + n]
        assert crc32c(chunk) == crc32c_pkg.crc32c(chunk.tobytes())
    assert crc32c(data[n:], crc32c(data[:n])) == crc32c_pkg.crc32c(data.tobytes())


@pytest.mark.subprocess
def test_file_size_limit_gives_clear_efbig(tmp_path, backend):
    script = textwrap.dedent(f"""
        import resource, signal, numpy as np
        from jaxoff.aio._engine import Engine, EngineConfig
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        eng = Engine(EngineConfig(block_size=256 << 10, backend={backend!r}))
        try:
            eng.write({str(tmp_path / "big.bin")!r}, 0, np.ones(4 << 20, np.uint8)).result()
        except OSError as e:
            print("ERRNO", e.errno)
            print(e)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=os.environ.copy(),
    )
    assert out.returncode == 0, out.stderr
    assert f"ERRNO {errno.EFBIG}" in out.stdout
    assert "EFBIG" in out.stdout and "RLIMIT_FSIZE" in out.stdout
    assert str(tmp_path / "big.bin") in out.stdout


# ------------------------------------------------------------------ why auto gave which backend


@pytest.mark.subprocess
def test_auto_backend_says_why_io_uring_setup_failed():
    """A process with no file descriptor left cannot set up a ring: ``auto`` falls back to
    POSIX, and the reason (the errno of io_uring_setup) is exposed and logged once."""
    if not _ffi.uring_compiled_in():
        pytest.skip("this build has no io_uring backend")
    code = textwrap.dedent(
        """
        import logging, os, resource
        logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s")
        import jaxoff.aio as aio
        from jaxoff.aio._engine import Engine, EngineConfig
        low = os.open("/dev/null", os.O_RDONLY)  # the lowest free descriptor
        os.close(low)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        status = aio.backend_status()
        print("STATUS", status.backend, status.errno, status.reason)
        cfg = EngineConfig(block_size=4096, queue_depth=1, threads=1, pool_bytes=4096)
        engines = [Engine(cfg) for _ in range(2)]
        print("ENGINE", engines[0].backend, engines[0].backend_reason == status.reason)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "JAXOFF_AIO_BACKEND"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert f"STATUS posix {errno.EMFILE} io_uring_setup failed with EMFILE (errno 24)" in out
    assert "ulimit -n" in out and "ENGINE posix True" in out
    logged = [line for line in out.splitlines() if line.startswith("LOG jaxoff.aio")]
    assert len(logged) == 1 and "using the POSIX thread-pool backend" in logged[0], out


def test_auto_backend_reason_when_not_compiled_in_or_asked(monkeypatch):
    from jaxoff.aio import _backend, backend_status

    monkeypatch.delenv("JAXOFF_AIO_BACKEND", raising=False)
    _backend._status.cache_clear()
    monkeypatch.setattr(_backend._ffi, "uring_compiled_in", lambda: False)
    status = backend_status()
    assert status.backend == "posix" and not status.compiled_in
    assert "not compiled into this build" in status.reason and "liburing-dev" in status.reason
    _backend._status.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("JAXOFF_AIO_BACKEND", "posix")
    assert backend_status().reason == "JAXOFF_AIO_BACKEND=posix asks for it"
    assert Engine(small_config("posix")).backend_reason == "backend='posix' was requested"
    monkeypatch.delenv("JAXOFF_AIO_BACKEND")
    _backend._status.cache_clear()
    assert doctest.testmod(_backend).failed == 0
    if _ffi.uring_compiled_in():
        assert str(backend_status()) == "io_uring (io_uring initialised)"
        assert Engine(small_config("auto")).backend_reason == "io_uring initialised"

"""The CUDA build of the paging calls, checked without a GPU: the module is built wherever a
CUDA toolkit is, names the four pager targets (``jaxoff_pager_begin/take/out/commit``), loads
with no driver, and a GPU backend without it fails a paging call with one line. Also the other
bad inputs of GPU paging that need no GPU."""

import os
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _limits import HANG_S

from jaxoff import JaxoffError, _ffi
from jaxoff.aio import _cuda, _ffi_calls, cuda_status
from jaxoff.aio._engine import EngineConfig
from jaxoff.aio._ffi_calls import file_table_backend
from jaxoff.aio._pager import PAGER_TARGETS, page_begin, page_commit, page_out, page_take
from jaxoff.optim._transaction import PagedTable, PageTransaction

FFI_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ffi")


def toolkit_on_this_machine() -> str | None:
    """Where the build would find a CUDA toolkit, as CMake's FindCUDAToolkit looks."""
    for env in ("CUDAToolkit_ROOT", "CUDA_PATH"):
        if os.environ.get(env) and os.path.isdir(os.environ[env]):
            return os.environ[env]
    return shutil.which("nvcc") or (
        "/usr/local/cuda" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )


def test_cuda_module_built_wherever_a_toolkit_is():
    """CI has nvcc: a broken CUDA build must fail here, not on a GPU machine later."""
    info = _cuda.build_info()
    if info["cuda_mode"] == "off":
        pytest.skip(f"built with JAXOFF_CUDA=off: {info['cuda_reason']}")
    where = toolkit_on_this_machine()
    if where is None:
        assert not info["cuda"] and "no CUDA toolkit" in info["cuda_reason"]
        pytest.skip(f"no CUDA toolkit on this machine; build says: {info['cuda_reason']}")
    assert info["cuda"], f"a CUDA toolkit is at {where} but the build says: {info['cuda_reason']}"
    assert info["cuda_toolkit"]
    assert _cuda.module() is not None, _cuda.missing_reason()


def cuda_module():
    mod = _cuda.module()
    if mod is None:
        pytest.skip(_cuda.missing_reason())
    return mod


def test_cuda_registrations_name_every_paging_target():
    mod = cuda_module()
    regs = mod.registrations()
    assert sorted(regs) == sorted(_cuda.PAGING_TARGETS) == sorted(PAGER_TARGETS)
    for name, capsule in regs.items():  # one stateless execute handler each
        assert type(capsule).__name__ == "PyCapsule", name
    # Same names as the CPU targets: one Python wrapper serves both platforms.
    assert set(regs) <= set(_ffi.registrations())
    assert not hasattr(mod, "state_types")  # no XLA FFI state types: the pager is the state


def test_cuda_module_loads_with_no_driver_and_binds_the_host_half():
    """cudart is linked statically: the module loads wherever libc does; with no driver it
    reports why, instead of failing the import."""
    mod = cuda_module()
    rt = mod.runtime()
    assert rt["runtime_version"] >= 12000
    assert rt["device_count"] >= 0
    if rt["device_count"] == 0:
        assert rt["error"]  # e.g. cudaErrorInsufficientDriver / cudaErrorNoDevice
    with pytest.raises(TypeError, match="host_paging_api"):
        mod.bind_host_api(_ffi.registrations()["jaxoff_copy"])
    mod.bind_host_api(_ffi.host_paging_api())
    assert mod.host_api_bound()
    if rt["device_count"] == 0:  # no GPU pager can have opened without a device
        assert mod.pager_tables() == []


def test_cuda_status_is_consistent():
    _ffi_calls.register_targets()
    s = cuda_status()
    assert s.built == bool(_cuda.build_info()["cuda"])
    assert s.mode in ("auto", "on", "off")
    assert s.reason and "\n" not in s.reason
    # Registered exactly when JAX has a GPU and the module loads (CPU under conftest's default).
    assert s.registered == (s.gpu_backend and s.importable)
    if s.importable:
        assert s.targets == tuple(sorted(_cuda.PAGING_TARGETS))
        assert s.runtime is not None
    else:
        assert s.targets == () and s.runtime is None


def simulate_gpu_without_cuda_module(monkeypatch, default_is_gpu=True):
    """What register_targets sees on a GPU machine whose jaxoff was built without CUDA."""
    monkeypatch.setattr(_cuda, "gpu_backend_present", lambda: True)
    monkeypatch.setattr(_cuda, "module", lambda: None)
    monkeypatch.setattr(
        _cuda, "missing_reason", lambda: "jaxoff was built without CUDA (JAXOFF_CUDA=off)"
    )
    monkeypatch.setattr(_cuda, "default_is_gpu", lambda: default_is_gpu)
    monkeypatch.setattr(_cuda, "_checked", False)
    monkeypatch.setattr(_cuda, "_missing", "")
    # On a GPU machine an earlier test of this process may have registered the real targets.
    monkeypatch.setattr(_cuda, "_registered", False)


def _token():
    return jnp.zeros((), jnp.int32)


CALLS = {
    "jaxoff_pager_begin": lambda x: page_begin("nt", 1, jnp.int32(0)),
    "jaxoff_pager_take": lambda x: page_take("nt", 1, 0, _token(), shape=x.shape, dtype=x.dtype),
    "jaxoff_pager_out": lambda x: page_out("nt", 1, 0, x, _token()),
    "jaxoff_pager_commit": lambda x: page_commit("nt", 1, _token()),
}


@pytest.mark.parametrize("target", sorted(CALLS))
def test_gpu_backend_without_cuda_module_is_one_line_error(monkeypatch, target):
    simulate_gpu_without_cuda_module(monkeypatch)
    x = jnp.zeros(8, jnp.float32)
    with pytest.raises(JaxoffError) as e:
        jax.jit(CALLS[target]).lower(x)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{target} cannot run on the GPU: jaxoff was built without CUDA")
    assert "JAXOFF_CUDA=on pip install --no-build-isolation --no-deps ." in msg
    assert "jax.default_device(jax.devices('cpu')[0])" in msg  # or run the step on the CPU
    assert not _ffi_calls.cuda_registered()


def test_gpu_backend_without_cuda_module_still_pages_on_cpu(monkeypatch):
    """A step placed on the CPU of a GPU machine keeps working without the CUDA module."""
    simulate_gpu_without_cuda_module(monkeypatch, default_is_gpu=False)
    x = jnp.zeros(8, jnp.float32)

    def step(x):
        tok = page_begin("nt", 1, jnp.int32(0))
        y, tok = page_take("nt", 1, 0, tok, shape=x.shape, dtype=x.dtype)
        return page_commit("nt", 1, page_out("nt", 1, 1, y + x, tok))

    text = jax.jit(step).lower(x).as_text()
    for target in PAGER_TARGETS:
        assert f"@{target}(" in text, target


def test_store_on_a_filesystem_without_o_direct_falls_back_to_buffered(tmp_path):
    """tmpfs refuses O_DIRECT (EINVAL): the engine opens the store's page files buffered
    instead (documented in EngineConfig.o_direct) and a step's chunks round-trip through the
    pager with their checksums."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm (tmpfs) here")
    d = os.path.join(shm, f"jaxoff-test-{os.getpid()}-{tmp_path.name}")
    txn = None
    try:
        txn = PageTransaction.open(
            d, {"w": ((3000,), np.float32)}, chunk_bytes=4096, table=PagedTable("test.shm"),
            engine=EngineConfig(o_direct=True, pool_bytes=1 << 20),
        )  # fmt: skip
        assert file_table_backend(txn.table) in ("io_uring", "posix")
        x = np.arange(3000, dtype=np.float32)
        chunks = txn.store.entries["w"].chunks
        txn.write_initial([("w", c.index, x[c.elem_start : c.elem_start + c.elem_count])
                           for c in chunks])  # fmt: skip

        @jax.jit
        def step(version):
            rec = txn.begin(version)
            parts = []
            for c in chunks:
                at = lambda env, i=c.index: ("w", i)  # noqa: E731
                y = rec.take(at, (c.elem_count,), jnp.float32)
                rec.put(at, -y)
                parts.append(y)
            rec.commit()
            return version + 1, jnp.concatenate(parts)

        version, got = step(jnp.int32(1))
        assert np.asarray(got).tobytes() == x.tobytes()
        txn.settle()
        assert txn.store.version == int(version) == 2
        assert np.asarray(txn.store.read("w")).tobytes() == (-x).tobytes()
    finally:
        if txn is not None:
            txn.close()
        shutil.rmtree(d, ignore_errors=True)


def configure(tmp_path, mode, *extra):
    """Configures ffi/ without the Python module (fast, no nanobind) under JAXOFF_CUDA=mode."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake on PATH")
    env = dict(os.environ, JAXOFF_CUDA=mode)
    build = tmp_path / f"b-{mode}-{len(extra)}"
    return subprocess.run(
        [cmake, "-S", FFI_DIR, "-B", str(build), "-DJAXOFF_BUILD_PYTHON=OFF", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


@pytest.mark.subprocess
def test_cmake_reads_jaxoff_cuda_from_the_environment(tmp_path):
    off = configure(tmp_path, "off")
    assert off.returncode == 0, off.stderr
    assert "jaxoff: JAXOFF_CUDA=off: jaxoff._ffi_cuda JAXOFF_CUDA=off" in off.stdout
    info = (tmp_path / "b-off-0" / "generated" / "build_info.h").read_text()
    assert "#define JAXOFF_CUDA_BUILT 0" in info
    bad = configure(tmp_path, "maybe")
    assert bad.returncode != 0
    assert "JAXOFF_CUDA must be auto, on or off (got 'maybe')" in bad.stderr


@pytest.mark.subprocess
def test_cmake_without_a_toolkit_builds_cpu_only_unless_cuda_is_required(tmp_path):
    """A machine without nvcc, simulated by hiding FindCUDAToolkit: auto configures the CPU
    build (and says why); on fails at configure time with what to do."""
    hide = "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON"
    auto = configure(tmp_path, "auto", hide)
    assert auto.returncode == 0, auto.stderr
    assert "jaxoff._ffi_cuda no CUDA toolkit found at build time" in auto.stdout
    on = configure(tmp_path, "on", hide)
    assert on.returncode != 0
    assert "JAXOFF_CUDA=on but no CUDA toolkit found" in on.stderr

"""The CUDA build of the paging calls, checked without a GPU: the module is built wherever a
CUDA toolkit is, names every paging target, loads with no driver, and a GPU backend without it
fails a paging call with one line. Also the other bad inputs of GPU paging that need no GPU."""

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
from jaxoff.aio._ffi_calls import (
    new_token,
    page_flush,
    page_in,
    page_out,
    page_prefetch,
    page_take,
    register_file_table,
    unregister_file_table,
)

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
    assert sorted(regs) == sorted(_cuda.PAGING_TARGETS)
    for name, stages in regs.items():
        assert sorted(stages) == ["execute", "instantiate"], name
        assert all(type(c).__name__ == "PyCapsule" for c in stages.values()), name
    # Same names as the CPU targets: one Python wrapper serves both platforms.
    assert set(regs) <= set(_ffi.registrations())
    assert sorted(mod.state_types()) == ["jaxoff_cuda_page_state"]
    assert sorted(mod.state_types()["jaxoff_cuda_page_state"]) == ["type_id", "type_info"]


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
    pinned = mod.pinned_bytes()
    assert sorted(pinned) == ["cap", "held"] and pinned["held"] >= 0 and pinned["cap"] >= 0
    if rt["device_count"] == 0:  # nothing can be pinned without a device
        assert pinned["held"] == 0


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


CALLS = {
    "jaxoff_page_in": lambda x, t: page_in("nt", 0, 0, 0, t, shape=x.shape, dtype=x.dtype),
    "jaxoff_page_out": lambda x, t: page_out("nt", 0, 0, x, t),
    "jaxoff_page_prefetch": lambda x, t: page_prefetch(
        "nt", 0, 0, 0, t, shape=x.shape, dtype=x.dtype
    ),
    "jaxoff_page_take": lambda x, t: page_take("nt", jnp.int32(1), t, shape=x.shape, dtype=x.dtype),
    "jaxoff_page_flush": lambda x, t: page_flush("nt", t),
}


@pytest.mark.parametrize("target", sorted(CALLS))
def test_gpu_backend_without_cuda_module_is_one_line_error(monkeypatch, target):
    simulate_gpu_without_cuda_module(monkeypatch)
    x = jnp.zeros(8, jnp.float32)
    with pytest.raises(JaxoffError) as e:
        jax.jit(lambda x: CALLS[target](x, new_token())).lower(x)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{target} cannot run on the GPU: jaxoff was built without CUDA")
    assert "JAXOFF_CUDA=on pip install --no-build-isolation --no-deps ." in msg
    assert not _ffi_calls.cuda_registered()


def test_gpu_backend_without_cuda_module_still_pages_on_cpu(monkeypatch):
    """A step placed on the CPU of a GPU machine keeps working without the CUDA module."""
    simulate_gpu_without_cuda_module(monkeypatch, default_is_gpu=False)
    x = jnp.zeros(8, jnp.float32)
    text = jax.jit(lambda x: page_out("nt", 0, 0, x, new_token())).lower(x).as_text()
    assert "jaxoff_page_out" in text


def test_store_on_a_filesystem_without_o_direct_falls_back_to_buffered(tmp_path):
    """tmpfs refuses O_DIRECT (EINVAL): the engine opens the file buffered instead (documented
    in EngineConfig.o_direct) and the bytes round-trip with their checksum."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm (tmpfs) here")
    d = os.path.join(shm, f"jaxoff-test-{os.getpid()}")
    os.makedirs(d, exist_ok=True)
    name = f"shm_{os.getpid()}"
    try:
        register_file_table(
            name,
            [os.path.join(d, "a.page")],
            config=EngineConfig(o_direct=True, pool_bytes=1 << 20),
        )
        x = jnp.asarray(np.arange(3000, dtype=np.float32))

        @jax.jit
        def roundtrip(x):
            crc, tok = page_out(name, 0, 0, x, new_token())
            y, tok = page_in(name, 0, 0, crc, tok, shape=x.shape, dtype=x.dtype)
            return y

        assert np.asarray(roundtrip(x)).tobytes() == np.asarray(x).tobytes()
    finally:
        unregister_file_table(name)
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

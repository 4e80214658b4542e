"""The vendored liburing (ffi/third_party/liburing): with no system liburing, or with
``-DJAXOFF_URING_VENDORED=ON`` as here, the engine links it statically and its io_uring
backend passes the C++ engine's own tests."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from _limits import HANG_S

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.subprocess
def test_engine_builds_and_runs_io_uring_on_the_vendored_liburing(tmp_path):
    from jaxoff.aio._backend import backend_status

    if shutil.which("cmake") is None:
        pytest.fail("cmake is needed to build the C++ tests: pip install cmake")
    status = backend_status()
    if status.errno is not None:
        pytest.skip(f"io_uring is refused here: {status.reason}")
    build = tmp_path / "build"
    steps = [
        ["cmake", "-S", "ffi", "-B", str(build), "-DJAXOFF_BUILD_TESTS=ON"]
        + ["-DJAXOFF_URING_VENDORED=ON", "-DJAXOFF_CUDA=off"],
        ["cmake", "--build", str(build), "-j2", "--target", "jaxoff_engine_tests"],
        [str(build / "jaxoff_engine_tests"), "--backend", "io_uring"],
    ]
    outs = []
    for cmd in steps:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
        assert out.returncode == 0, f"{' '.join(cmd)}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
        outs.append(out.stdout)
    assert "io_uring backend enabled (vendored liburing, static)" in outs[0]
    summary = outs[2].rstrip().splitlines()[-1]
    assert re.fullmatch(r"\d+ tests, 0 failed checks, 0 skipped", summary), outs[2][-2000:]
    assert "(io_uring)" in outs[2]
    if shutil.which("ldd"):  # static: the binary needs no liburing.so
        ldd = subprocess.run(["ldd", str(build / "jaxoff_engine_tests")], capture_output=True)
        assert b"liburing" not in ldd.stdout

"""Runs the C++ engine's own test suite (ffi/tests, CTest) for every backend."""

import shutil
import subprocess
from pathlib import Path

import pytest
from _limits import HANG_S

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "ctest"


@pytest.mark.slow
def test_cpp_engine_suite():
    if shutil.which("cmake") is None:
        pytest.fail("cmake is needed to build the C++ tests: pip install cmake")
    steps = [
        ["cmake", "-S", "ffi", "-B", str(BUILD), "-DJAXOFF_BUILD_TESTS=ON"],
        ["cmake", "--build", str(BUILD), "-j2"],
        ["ctest", "--test-dir", str(BUILD), "--output-on-failure"],
    ]
    for cmd in steps:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
        assert out.returncode == 0, (
            f"{' '.join(cmd)} failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
        )
    assert "100% tests passed" in out.stdout

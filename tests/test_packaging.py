"""What the package installs and what `import jaxoff` costs."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_only_the_jaxoff_package():
    """The models ship as jaxoff.models (jaxoff/models; models/ at the top links to it): a
    top-level package named plainly `models` would clash with the PyPI distribution of that
    name and with users' own models/ folders. jaxoff/ is force-included, not listed as a
    package: an editable install puts the parent directory of every listed package on
    sys.path (the repository root here)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = cfg["tool"]["scikit-build"]["wheel"]
    assert wheel["packages"] == []
    assert wheel["force-include"] == {"jaxoff": "jaxoff"}
    assert (ROOT / "models").is_symlink() and (ROOT / "models").resolve() == ROOT / "jaxoff/models"


def test_the_package_path_holds_only_the_package():
    """jaxoff.__path__ is jaxoff/ (and, editable, the installed stub): never the repository
    root, which made jaxoff.tests, jaxoff.bench and jaxoff.jaxoff importable."""
    import importlib.util

    import jaxoff

    assert str(ROOT) not in jaxoff.__path__, jaxoff.__path__
    for name in ("jaxoff.tests", "jaxoff.bench", "jaxoff.jaxoff"):
        assert importlib.util.find_spec(name) is None, name


def test_the_install_puts_no_top_level_models_on_the_path(tmp_path):
    """From any directory, with no PYTHONPATH, the installed jaxoff imports jaxoff.models
    and nothing of the repository's root: not `models`, not `tests`."""
    code = (
        "import importlib.util, sys\n"
        "import jaxoff.models.gpt\n"
        f"root = {str(ROOT)!r}\n"
        "assert root not in sys.path, sys.path\n"
        "for name in ('models', 'tests', 'bench'):\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env=env)


def test_dependencies_are_ranges_with_the_tested_lower_bounds():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps: dict[str, str] = {}
    for d in cfg["project"]["dependencies"]:  # a name with markers: its entries, joined
        name = d.split(">")[0].split("=")[0].split("<")[0]
        deps[name] = deps.get(name, "") + d + " | "
    lower = dict(
        line.split("==")
        for line in (ROOT / ".ci" / "constraints-lower.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for name, version in lower.items():
        assert f">={version}" in deps[name] and "<" in deps[name], deps[name]
        assert "==" not in deps[name]
    # where the newer jax can be had (Python >= 3.12), a flax that imports beside it
    assert "flax>=0.12.10,<0.14; python_version >= '3.12'" in deps["flax"]


def _header_api_version(c_api: Path) -> tuple[int, int]:
    import re

    text = c_api.read_text()
    return tuple(
        int(re.search(rf"#define XLA_FFI_API_{part} (\d+)", text)[1]) for part in ("MAJOR", "MINOR")
    )  # type: ignore[return-value]


def test_the_ffi_handlers_are_built_for_the_oldest_supported_jaxlib():
    """A jaxlib registers FFI handlers of its own API version or older: the build requires
    the oldest supported jaxlib (its headers, API 0.3), so one build loads beside every
    jaxlib of the range. Built against jaxlib 0.12's headers (API 0.5), jaxlib 0.11.1 (API
    0.4) refused every target. The check: the handlers' version is at most the installed
    jaxlib's (the API its headers declare), and the build pins the oldest jaxlib."""
    import jax.ffi

    from jaxoff import _ffi

    built = tuple(_ffi.ffi_api_version())
    installed = _header_api_version(Path(jax.ffi.include_dir()) / "xla/ffi/api/c_api.h")
    assert built <= installed, (built, installed)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    lower = (ROOT / ".ci" / "constraints-lower.txt").read_text()
    for pkg in ("jax", "jaxlib"):
        pinned = [r for r in requires if r.startswith(f"{pkg}==")]
        assert pinned and all(f"{r.split(';')[0]}\n" in lower for r in pinned), (pkg, requires)


def test_import_jaxoff_does_not_import_jax():
    code = "import sys, jaxoff; assert 'jax' not in sys.modules, 'jax imported'; jaxoff.__version__"
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import jaxoff; assert jaxoff.paged.__module__ == 'jaxoff.optim._paged'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_jaxoff_help_imports_no_jax():
    code = (
        "import sys, contextlib, io\n"
        "from jaxoff.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert main(['--help']) == 0\n"
        "assert 'jax' not in sys.modules and 'train' in out.getvalue()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_jaxoff_train_is_callable_however_it_was_imported():
    code = (
        "import jaxoff\n"
        "from jaxoff.train import TrainConfig\n"  # binds jaxoff.train to the package first
        "assert callable(jaxoff.train) and jaxoff.train.TrainConfig is TrainConfig\n"
        "jaxoff.train.train = lambda cfg, model=None: ('trained', cfg, model)\n"
        "assert jaxoff.train('cfg', model='m') == ('trained', 'cfg', 'm')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# What a module's dynamic symbol table may define: its entry point, and C++ that the compiler
# emits with default visibility whatever the flags (instantiations of libstdc++'s templates,
# typeinfo of exceptions that cross modules). Never the C++ runtime itself, the CUDA runtime,
# or jaxoff's own C++.
_FOREIGN = (
    "__cxa_",  # C++ runtime (libstdc++ / libsupc++)
    "__gxx_",
    "_Unwind_",
    "_ZNSt6locale",  # libstdc++'s locales and streams
    "_ZNKSt6locale",
    "_ZNSt8ios_base",
    "_ZSt4cout",
    "_ZNKSt7codecvt",
    "cuda",  # CUDA runtime (cudart_static)
    "__cuda",
    "_ZN6jaxoff",  # jaxoff's own C++
    "_ZNK6jaxoff",
)


@pytest.mark.parametrize("name", ["_ffi", "_ffi_cuda"])
def test_modules_export_no_runtime_or_jaxoff_symbols(name):
    """On a GPU machine whose toolchain linked libstdc++ statically, jaxoff._ffi exported all of
    it (4,711 symbols); with that module loaded, `import jax` crashed in ml_dtypes (in
    std::ostream << double) and so did registering a file table. The modules now hide what
    static libraries bring (--exclude-libs) and their own C++ (hidden visibility)."""
    import importlib
    import shutil

    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    try:
        mod = importlib.import_module(f"jaxoff.{name}")
    except ImportError as e:
        if name == "_ffi_cuda":
            pytest.skip(f"jaxoff._ffi_cuda is not built here: {e}")
        raise
    out = subprocess.run(
        ["nm", "-D", "--defined-only", mod.__file__], capture_output=True, text=True, check=True
    ).stdout
    symbols = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert f"PyInit_{name}" in symbols
    foreign = [s for s in symbols if s.startswith(_FOREIGN)]
    assert not foreign, f"{len(foreign)} symbols leak out of jaxoff.{name}: {foreign[:10]}"
    assert len(symbols) < 200, len(symbols)  # was 246 (_ffi) and 58 (_ffi_cuda) before

"""The packages of jaxoff/ import downward only, keep their private modules to themselves and
have no import cycle: `lint-imports` checks the contracts of pyproject.toml's
``[tool.importlinter]`` (layers, private modules, acyclic siblings), counting imports inside
functions and under ``TYPE_CHECKING``. And an import inside a function is kept for an
optional or heavy dependency only, each saying why in a comment."""

from __future__ import annotations

import ast
import shutil
import subprocess
import tomllib
from pathlib import Path

from _limits import HANG_S

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_IMPORTS = 60


def test_the_import_contracts_hold():
    exe = shutil.which("lint-imports")
    assert exe is not None, "import-linter is part of the test extra: pip install -e '.[test]'"
    proc = subprocess.run(
        [exe, "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    kinds = {c["type"] for c in contracts["contracts"]}
    assert kinds == {"layers", "private_modules", "acyclic_siblings"}
    assert f"Contracts: {len(contracts['contracts'])} kept, 0 broken" in proc.stdout


def test_every_package_of_jaxoff_is_in_a_layer():
    """A package left out of the layers would be free to import anything."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in contracts["contracts"] if c["type"] == "layers"]
    named = {m.strip() for layer in layers["layers"] for m in layer.split("|")}
    packages = {
        f"jaxoff.{p.name}" for p in (ROOT / "jaxoff").iterdir() if (p / "__init__.py").exists()
    }
    assert packages <= named, sorted(packages - named)


def _function_imports() -> list[tuple[str, int, str]]:
    """``(file, line, source line)`` of every import inside a function of jaxoff/."""
    out = []
    for path in sorted((ROOT / "jaxoff").rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        rel = str(path.relative_to(ROOT))
                        out.append((rel, inner.lineno, lines[inner.lineno - 1]))
    return sorted(set(out))


def test_imports_inside_functions_are_few_and_each_says_why():
    found = _function_imports()
    assert len(found) < MAX_FUNCTION_IMPORTS, len(found)
    for path, line, text in found:
        above = Path(ROOT / path).read_text().splitlines()[line - 2].strip()
        said = "#" in text or above.startswith("#") or above == "try:"
        assert said, f"{path}:{line}: an import inside a function says why ({text.strip()})"

"""The suite fails when a test writes into the working tree or runs/ (tests/conftest.py).

Each case copies tests/conftest.py into a fresh git repository and runs pytest there on one
tiny test, in a child process: the guard then watches that repository, never this one.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

CONFTEST = Path(__file__).with_name("conftest.py")


def _repo(tmp_path: Path, body: str) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    shutil.copy(CONFTEST, repo / "tests" / "conftest.py")
    (repo / "tracked.txt").write_text("kept\n")
    (repo / ".gitignore").write_text("runs/\n")
    (repo / "tests" / "test_one.py").write_text(
        f"import os\nROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n\n\n"
        f"def test_one(tmp_path):\n{body}"
    )
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    return repo


def _pytest(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JAXOFF_TEST_TREE_GUARD"}
    env["JAXOFF_TEST_COMPILE_CACHE"] = "0"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "tests"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "body, line",
    [
        ("    open(os.path.join(ROOT, 'stray.json'), 'w').write('{}')\n", "created: stray.json"),
        (
            "    os.makedirs(os.path.join(ROOT, 'runs', 'default'))\n"
            "    open(os.path.join(ROOT, 'runs', 'default', 'm.jsonl'), 'w').write('')\n",
            "created: runs/default/m.jsonl",
        ),
        ("    open(os.path.join(ROOT, 'tracked.txt'), 'a').write('x')\n", "changed: tracked.txt"),
    ],
    ids=["untracked file", "under runs/", "tracked file"],
)
def test_a_test_that_writes_into_the_tree_fails_the_suite(tmp_path, body, line):
    p = _pytest(_repo(tmp_path, body))
    assert p.returncode == pytest.ExitCode.TESTS_FAILED, p.stdout + p.stderr
    assert "1 passed" in p.stdout and "tests wrote into the working tree" in p.stdout, p.stdout
    assert f"  {line}" in p.stdout.splitlines(), p.stdout


def test_a_test_that_writes_under_tmp_path_passes(tmp_path):
    p = _pytest(_repo(tmp_path, "    (tmp_path / 'out.json').write_text('{}')\n"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "working tree" not in p.stdout


def test_the_guard_runs_once_under_xdist(tmp_path):
    pytest.importorskip("xdist")
    body = "    open(os.path.join(ROOT, 'stray.json'), 'w').write('{}')\n"
    p = _pytest(_repo(tmp_path, body), "-n", "2")
    assert p.returncode == pytest.ExitCode.TESTS_FAILED, p.stdout + p.stderr
    assert p.stdout.count("created: stray.json") == 1, p.stdout


def test_the_guard_can_be_turned_off(tmp_path):
    repo = _repo(tmp_path, "    open(os.path.join(ROOT, 'stray.json'), 'w').write('{}')\n")
    env = {**os.environ, "JAXOFF_TEST_TREE_GUARD": "0", "JAXOFF_TEST_COMPILE_CACHE": "0"}
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr

"""A strict test environment: 4 fake CPU devices and warnings as errors (pyproject.toml).

Strict dtype promotion is not enabled: flax.nnx.LayerNorm itself promotes bfloat16
with float32 (flax 0.12.8), so bfloat16 models cannot run under it.
"""

import os
import sys

# tests.byom_model (a model outside models/) is imported as a user's package would be: from
# the repository root, in xdist workers and child processes too
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole run, shared by the xdist workers and every
# child process the tests start: most tests compile the same few train steps of the same tiny
# models, and a cached executable is the one XLA would compile again (the key covers the
# program, the jax/jaxlib versions and the XLA flags). JAXOFF_TEST_COMPILE_CACHE=0 turns it off.
if os.environ.get("JAXOFF_TEST_COMPILE_CACHE", "1") != "0":
    os.environ.setdefault(
        "JAX_COMPILATION_CACHE_DIR", os.path.join(ROOT, ".pytest_cache", "jax-compile")
    )
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _doctest_namespace(request):
    """The docstring examples of jaxoff/ (``pytest -p tests.conftest --doctest-modules jaxoff``)
    see ``tmp_path`` and run in it: an example that writes a file writes it there, never into
    the working tree."""
    if isinstance(request.node, pytest.DoctestItem):
        tmp_path = request.getfixturevalue("tmp_path")
        request.getfixturevalue("doctest_namespace")["tmp_path"] = tmp_path
        request.getfixturevalue("monkeypatch").chdir(tmp_path)


@pytest.fixture
def tiny_train_args(tmp_path):
    """Keyword arguments of a TrainConfig that trains in a couple of seconds."""
    return dict(
        model="tiny",
        batch_size=4,
        seq_len=32,
        steps=12,
        eval_every=0,
        ckpt_every=0,
        progress=False,
        store="none",
        out_dir=tmp_path / "run",
    )


# --- The working tree is the user's: a test writes only under its own tmp_path --------------
#
# The controller (the only process without xdist's ``workerinput``) lists the repository's
# untracked and modified files, and every file under runs/, before the session and after it; a
# file created, changed or removed in between fails the suite, named. Build outputs and caches
# are left out. JAXOFF_TEST_TREE_GUARD=0 turns the check off (e.g. while editing the tree
# during a run).
_TREE_SKIP_DIRS = {"build", "__pycache__", ".pytest_cache", ".ruff_cache"}


def _tree_skipped(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in _TREE_SKIP_DIRS or p.endswith(".egg-info") for p in parts)


def tree_listing(root: str) -> dict[str, tuple[str, int, int]] | None:
    """``{path: (git status, size, mtime_ns)}`` of the untracked and modified files under
    ``root`` (a git work tree) and of every file under ``root/runs``; None where git cannot
    list ``root``."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "-C", root, "status", "--porcelain=v1", "-z", "--untracked-files=all"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode(errors="surrogateescape")
    except (OSError, subprocess.SubprocessError):
        return None
    entries = out.split("\0")
    paths, i = [], 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.append((entry[3:], entry[:2]))
        if entry[0] in "RC":  # a rename's source follows as its own entry
            i += 1
    runs = os.path.join(root, "runs")
    for dirpath, _, files in os.walk(runs):
        paths += [(os.path.relpath(os.path.join(dirpath, f), root), "??") for f in files]
    listing = {}
    for rel, status in paths:
        rel = rel.replace(os.sep, "/")
        if _tree_skipped(rel):
            continue
        try:
            st = os.stat(os.path.join(root, rel))
        except OSError:  # deleted from the index or the tree: its absence is what is listed
            listing[rel] = (status, -1, -1)
            continue
        listing[rel] = (status, st.st_size, st.st_mtime_ns)
    return listing


def tree_changes(before: dict, after: dict) -> list[str]:
    """``created: path`` / ``changed: path`` / ``removed: path`` lines, sorted by path (a
    tracked file that turns up modified is ``changed``, an untracked one ``created``)."""
    new = after.keys() - before.keys()
    lines = [f"{'created' if after[p][0] == '??' else 'changed'}: {p}" for p in new]
    lines += [f"removed: {p}" for p in before.keys() - after.keys()]
    lines += [f"changed: {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(lines, key=lambda s: s.split(": ", 1)[1])


def _guards_tree(config) -> bool:
    return not hasattr(config, "workerinput") and os.environ.get("JAXOFF_TEST_TREE_GUARD") != "0"


def pytest_configure(config):
    if _guards_tree(config):
        config._jaxoff_tree_before = tree_listing(ROOT)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    before = getattr(config, "_jaxoff_tree_before", None)
    if not _guards_tree(config) or before is None:
        return
    after = tree_listing(ROOT)
    changes = tree_changes(before, after or {})
    if not changes:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    message = (
        f"tests wrote into the working tree ({ROOT}); a test must write only under its "
        "tmp_path (JAXOFF_TEST_TREE_GUARD=0 skips this check):"
    )
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "working tree changed", red=True)
        reporter.write_line(message)
        for line in changes[:50]:
            reporter.write_line(f"  {line}")
    else:
        print(message, *changes, sep="\n  ", file=sys.stderr)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

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
    the working tree. ``REPO`` is the repository's root, for an example that reads one of the
    test fixtures (``tests/fixtures/hf``)."""
    if isinstance(request.node, pytest.DoctestItem):
        tmp_path = request.getfixturevalue("tmp_path")
        request.getfixturevalue("doctest_namespace")["tmp_path"] = tmp_path
        request.getfixturevalue("doctest_namespace")["REPO"] = ROOT  # its test fixtures
        request.getfixturevalue("monkeypatch").chdir(tmp_path)


# set by pytest per phase, and by a dependency as it is first imported
_ENV_OF_OTHERS = frozenset({"PYTEST_CURRENT_TEST", "CRC32C_SW_MODE"})


def _global_state() -> dict[str, object]:
    """What one test can change for every later test in its process: JAX's configuration,
    the environment, the working directory, and the logging of jaxoff's loggers and the root
    (pytest's own capture handlers aside)."""
    import logging

    import jax

    def log_state(log: logging.Logger):
        own = [h for h in log.handlers if not type(h).__module__.startswith("_pytest")]
        return (log.level, log.propagate, log.disabled, tuple(own))

    loggers = [logging.getLogger(), logging.getLogger("jaxoff")]
    loggers += [
        logging.getLogger(n) for n in sorted(logging.root.manager.loggerDict)
        if n.startswith("jaxoff.")
    ]  # fmt: skip
    return {
        "jax.config": dict(jax.config.values),
        "os.environ": {k: v for k, v in os.environ.items() if k not in _ENV_OF_OTHERS},
        "cwd": os.getcwd(),
        "logging": {log.name: log_state(log) for log in loggers},
        "logging.disable": logging.root.manager.disable,
    }


def _restore(before: dict[str, object]) -> None:
    import logging

    import jax

    for name, value in before["jax.config"].items():
        if jax.config.values.get(name) != value:
            jax.config.update(name, value)
    for name in [k for k in os.environ if k not in before["os.environ"]]:
        if name not in _ENV_OF_OTHERS:
            del os.environ[name]
    os.environ.update(before["os.environ"])
    os.chdir(before["cwd"])
    for name, (level, propagate, disabled, handlers) in before["logging"].items():
        log = logging.getLogger(None if name == "root" else name)
        log.setLevel(level)
        log.propagate, log.disabled = propagate, disabled
        for h in [h for h in log.handlers if not type(h).__module__.startswith("_pytest")]:
            if h not in handlers:
                log.removeHandler(h)
    logging.disable(before["logging.disable"])


def _changes(before: dict, after: dict) -> list[str]:
    out = []
    for kind in before:
        b, a = before[kind], after[kind]
        if isinstance(b, dict):
            fresh = (0, True, False, ()) if kind == "logging" else None  # a new logger's
            keys = sorted(k for k in b.keys() | a.keys() if b.get(k, fresh) != a.get(k, fresh))
            out += [f"{kind}[{k!r}]: {b.get(k, fresh)!r} -> {a.get(k, fresh)!r}" for k in keys]
        elif b != a:
            out.append(f"{kind}: {b!r} -> {a!r}")
    return out


@pytest.fixture(autouse=True)
def _leaves_no_global_state(request):
    """A test that leaves JAX's configuration, the environment, the working directory or
    jaxoff's logging changed fails, naming the change, and the change is undone: a test
    passes or fails on its own, in whatever order the suite runs (monkeypatch undoes its
    changes before this check)."""
    before = _global_state()
    yield
    after = _global_state()
    changes = _changes(before, after)
    if changes:
        _restore(before)
        pytest.fail(
            f"{request.node.nodeid} left global state changed (undo it, e.g. with "
            f"monkeypatch): {'; '.join(changes)[:600]}",
            pytrace=False,
        )


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

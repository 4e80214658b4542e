"""The I/O engine's fallback to POSIX is one ``jaxoff: note:`` line, said once per process,
and ``JAXOFF_QUIET_BACKEND=1`` silences it (jaxoff.aio._backend, jaxoff._notices)."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest
from _limits import HANG_S

# a process whose build "has no io_uring", whose root logger is set up as absl sets it up,
# and which asks for the backend three times (two engines and a store, say)
CHILD = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig()  # WARNING:name:message, as the jaxoff command finds it set up
    from jaxoff import _notices
    from jaxoff.aio import _backend
    _backend._ffi = type("NoUring", (), {"uring_compiled_in": staticmethod(lambda: False)})
    def ask():
        for _ in range(3):
            _backend.note_backend("auto", "posix")
    if sys.argv[1] == "cli":
        with _notices.as_lines():  # what `jaxoff <command>` runs inside
            ask()
    else:
        ask()
    print("DONE")
    """
)


def _child(mode: str, **env) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXOFF_")} | env
    return subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=env,
    )


@pytest.mark.subprocess
def test_the_command_prints_the_fallback_once_as_one_jaxoff_line():
    r = _child("cli")
    assert r.returncode == 0 and "DONE" in r.stdout, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("jaxoff: note: the I/O engine is using the POSIX thread-pool")
    assert "liburing-dev" in lines[0] and "(JAXOFF_QUIET_BACKEND=1 hides this note)" in lines[0]


@pytest.mark.subprocess
def test_a_library_user_gets_it_once_through_logging():
    r = _child("library")
    assert r.returncode == 0 and "DONE" in r.stdout, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("WARNING:jaxoff.aio.backend:jaxoff: note:")


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["cli", "library"])
def test_jaxoff_quiet_backend_silences_it(mode):
    r = _child(mode, JAXOFF_QUIET_BACKEND="1")
    assert r.returncode == 0 and "DONE" in r.stdout, r.stderr
    assert r.stderr == ""
    loud = _child(mode, JAXOFF_QUIET_BACKEND="0")  # 0 is not quiet
    assert "JAXOFF_QUIET_BACKEND=1 hides this note" in loud.stderr


def test_quiet_keeps_the_record_at_debug(monkeypatch, caplog):
    from jaxoff.aio import _backend

    monkeypatch.setattr(_backend, "_noticed", False)
    monkeypatch.setenv("JAXOFF_QUIET_BACKEND", "1")
    with caplog.at_level(logging.DEBUG, logger="jaxoff.aio.backend"):
        _backend._notice_once("a reason")
        _backend._notice_once("another reason")
    records = [r for r in caplog.records if r.name == "jaxoff.aio.backend"]
    assert [(r.levelno, "a reason" in r.getMessage()) for r in records] == [(logging.DEBUG, True)]


def test_an_in_process_command_leaves_the_loggers_as_they_were(capsys):
    """`jaxoff.cli.main` routes notices to its own lines only while the command runs: a
    library user's logging (and a later test's caplog) still gets them afterwards."""
    from jaxoff import _notices, cli

    def state():
        logs = [logging.getLogger(n) for n in _notices.LOGGERS]
        return [(log.propagate, list(log.handlers)) for log in logs]

    before = state()
    with _notices.as_lines():
        inside = state()
        with _notices.as_lines():  # nested: nothing more
            assert state() == inside
    assert [p for p, _ in inside] == [False] * len(_notices.LOGGERS)
    assert all(len(h) == len(b) + 1 for (_, h), (_, b) in zip(inside, before, strict=True))
    assert state() == before
    assert cli.main(["plan", "--no-such-option"]) == 2  # a command that fails: still undone
    assert state() == before
    capsys.readouterr()

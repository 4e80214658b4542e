"""``jaxoff launch``: parsing, the children's environment, and supervision (a failure stops
the others, signals are passed on, children die with the launcher).

The children are small Python programs (``launch(spec, argv=[python, "-c", ...])``), so no
test needs JAX in a child.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from _limits import HANG_S

from jaxoff._errors import ConfigError, UsageError
from jaxoff.distributed._launch import (
    LaunchSpec,
    _supervise,
    child_argv,
    child_env,
    launch,
    parse_launch_args,
)

DEVICE_COUNT = "--xla_force_host_platform_device_count"

# the start of every child program: its id, its folder (argv[1]), files written whole, and a
# wait for another child's file bounded only to catch a hang
PRELUDE = f"""
import os, signal, sys, time
me = int(os.environ["JAX_PROCESS_ID"])
d = sys.argv[1]

def write(name, text):
    path = os.path.join(d, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)

def wait_for(name):
    deadline = time.monotonic() + {HANG_S}
    while not os.path.exists(os.path.join(d, name)):
        if time.monotonic() > deadline:
            sys.exit(99)
        time.sleep(0.02)

def sleep_then_mark():
    write(f"pid.{{me}}", str(os.getpid()))
    time.sleep(60)
    write(f"woke.{{me}}", "")  # the launcher failed to stop this process
"""


def program(body: str) -> str:
    return PRELUDE + body


def run(spec: LaunchSpec, body: str, tmp_path) -> int:
    return launch(spec, argv=[sys.executable, "-c", program(body), str(tmp_path)])


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie no one has reaped yet counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for_files(paths, launcher: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + HANG_S
    while not all(p.exists() for p in paths):
        if launcher is not None and launcher.poll() is not None:
            pytest.fail(f"the launcher exited early with {launcher.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"no {[str(p) for p in paths]} after {HANG_S:.0f} s (a bound on hangs only; "
                f"JAXOFF_TEST_TIMEOUT_SCALE scales it)"
            )
        time.sleep(0.02)


# --- parse_launch_args -------------------------------------------------------------------


def test_parse_defaults():
    assert parse_launch_args(["--", "train"]) == LaunchSpec(
        processes=2, devices_per_process=1, command=("train",), port=0, grace_s=10.0
    )


def test_parse_every_option_and_leaves_what_follows_the_dashes_to_the_command():
    spec = parse_launch_args(
        ["--processes", "4", "--devices-per-process=2", "--port", "1234", "--grace", "0.5"]
        + ["--", "train", "--processes", "5", "--help", "--", "x"]
    )
    assert spec == LaunchSpec(4, 2, ("train", "--processes", "5", "--help", "--", "x"), 1234, 0.5)


def test_parse_a_repeated_option_takes_the_last_value():
    assert parse_launch_args(["--processes", "3", "--processes", "5", "--", "t"]).processes == 5


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--processes", "0", "--", "train"], "--processes must be at least 1, got 0"),
        (["--devices-per-process", "0", "--", "t"], "--devices-per-process must be at least 1"),
        (["--processes", "two", "--", "train"], "--processes must be a whole number, got 'two'"),
        (["--processes=", "--", "train"], "--processes must be a whole number, got ''"),
        (["--port", "70000", "--", "train"], "--port must be 0 (pick a free one) to 65535"),
        (["--port", "-1", "--", "train"], "--port must be 0 (pick a free one) to 65535"),
        (["--grace", "-1", "--", "train"], "--grace must be a number of seconds >= 0, got -1"),
        (["--grace", "inf", "--", "train"], "--grace must be a number of seconds >= 0"),
        (["--grace", "soon", "--", "train"], "--grace must be a number of seconds, got 'soon'"),
        (["--processes"], "--processes needs a value, e.g. --processes 2"),
        (["--processes", "--", "train"], "--processes needs a value"),
        ([], "nothing to launch: give the jaxoff command after --, e.g. jaxoff launch"),
        (["--processes", "2"], "nothing to launch: give the jaxoff command after --"),
        (["--processes", "2", "--"], "nothing to launch: give the jaxoff command after --"),
        (
            ["--foo", "--", "train"],
            "unknown option --foo for launch; the options are --processes, "
            "--devices-per-process, --port, --grace",
        ),
        (["--foo=3", "--", "train"], "unknown option --foo for launch"),
        (["train", "--model", "tiny"], "'train' is not an option of launch: put -- before"),
        (["--", "launch", "--", "train"], "jaxoff launch cannot launch itself"),
    ],
)
def test_parse_errors_name_the_option_and_the_fix(argv, words):
    with pytest.raises(UsageError) as e:
        parse_launch_args(argv)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--processes", "3", "--help", "--", "t"]])
def test_parse_help_prints_usage_and_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_launch_args(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: jaxoff launch")
    for option in ("--processes", "--devices-per-process", "--port", "--grace", "--"):
        assert option in out


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(processes=0), "LaunchSpec.processes must be at least 1"),
        (dict(devices_per_process=0), "LaunchSpec.devices_per_process must be at least 1"),
        (dict(command=()), "LaunchSpec.command is empty"),
        (dict(port=65536), "LaunchSpec.port must be"),
        (dict(grace_s=-1.0), "LaunchSpec.grace_s must be"),
    ],
)
def test_launch_spec_refuses_bad_values(kwargs, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        LaunchSpec(**{**dict(processes=1, devices_per_process=1, command=("t",)), **kwargs})


# --- child_argv, child_env ---------------------------------------------------------------


def test_child_argv_runs_jaxoff_with_this_python():
    spec = LaunchSpec(2, 1, ("train", "--model", "tiny"))
    assert child_argv(spec) == [sys.executable, "-m", "jaxoff", "train", "--model", "tiny"]


def test_child_env_replaces_the_device_count_and_keeps_other_xla_flags():
    base = {
        "XLA_FLAGS": f"--xla_cpu_a=1 {DEVICE_COUNT}=8  --xla_b",
        "PATH": "/somewhere",
    }
    env = child_env(LaunchSpec(3, 2, ("train",)), 2, 4321, base)
    assert env["XLA_FLAGS"].split() == ["--xla_cpu_a=1", "--xla_b", f"{DEVICE_COUNT}=2"]
    assert env["PATH"] == "/somewhere"
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:4321"
    assert (env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]) == ("3", "2")
    assert env["JAXOFF_LAUNCHED"] == "1"
    assert base["XLA_FLAGS"] == f"--xla_cpu_a=1 {DEVICE_COUNT}=8  --xla_b"  # a copy


def test_child_env_without_xla_flags_and_from_os_environ(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("JAXOFF_TEST_MARK", "kept")
    env = child_env(LaunchSpec(1, 4, ("train",)), 0, 1)
    assert env["XLA_FLAGS"] == f"{DEVICE_COUNT}=4"
    assert env["JAXOFF_TEST_MARK"] == "kept"
    assert "JAX_PROCESS_ID" not in os.environ


def test_child_env_refuses_a_process_id_out_of_range():
    with pytest.raises(ConfigError, match="process_id must be 0 to 1, got 2"):
        child_env(LaunchSpec(2, 1, ("train",)), 2, 1, {})


# --- launch ------------------------------------------------------------------------------

ENV_KEYS = ["JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAXOFF_LAUNCHED"]
WRITE_ENV = f"""
import json
write(f"env.{{me}}.json", json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS + ["XLA_FLAGS"]}}}))
"""


@pytest.mark.subprocess
def test_each_child_sees_the_coordinator_the_count_and_its_own_id(tmp_path, capfd):
    assert run(LaunchSpec(3, 2, ("x",)), WRITE_ENV, tmp_path) == 0
    envs = [json.loads((tmp_path / f"env.{i}.json").read_text()) for i in range(3)]
    assert [e["JAX_PROCESS_ID"] for e in envs] == ["0", "1", "2"]
    assert {e["JAX_NUM_PROCESSES"] for e in envs} == {"3"}
    assert {e["JAXOFF_LAUNCHED"] for e in envs} == {"1"}
    (address,) = {e["JAX_COORDINATOR_ADDRESS"] for e in envs}
    host, port = address.split(":")
    assert host == "127.0.0.1" and 0 < int(port) < 65536  # a port picked, not 0
    for e in envs:  # conftest.py's count of 4 is replaced, not added to
        counts = [f for f in e["XLA_FLAGS"].split() if f.startswith(DEVICE_COUNT)]
        assert counts == [f"{DEVICE_COUNT}=2"]
    err = capfd.readouterr().err
    assert f"jaxoff launch: 3 processes × 2 devices, coordinator {address}" in err


@pytest.mark.subprocess
def test_a_given_port_is_the_coordinators(tmp_path):
    assert run(LaunchSpec(1, 1, ("x",), port=23456), WRITE_ENV, tmp_path) == 0
    env = json.loads((tmp_path / "env.0.json").read_text())
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:23456"


@pytest.mark.subprocess
def test_all_children_exit_0_so_launch_returns_0(tmp_path, capfd):
    assert run(LaunchSpec(3, 1, ("x",)), 'write(f"done.{me}", "")', tmp_path) == 0
    assert sorted(p.name for p in tmp_path.glob("done.*")) == ["done.0", "done.1", "done.2"]
    assert "exited with" not in capfd.readouterr().err


@pytest.mark.subprocess
def test_a_failure_returns_its_code_and_stops_the_others(tmp_path, capfd):
    body = """
def stop(signum, frame):
    write("got.0", signal.Signals(signum).name)
    sys.exit(1)  # a failure too, but not the first

if me == 0:
    signal.signal(signal.SIGTERM, stop)
    sleep_then_mark()
else:
    wait_for("pid.0")
    sys.exit(3)
"""
    assert run(LaunchSpec(2, 1, ("x",)), body, tmp_path) == 3
    assert gone(int((tmp_path / "pid.0").read_text()))
    assert (tmp_path / "got.0").read_text() == "SIGTERM"
    assert not (tmp_path / "woke.0").exists()
    err = capfd.readouterr().err
    assert "jaxoff launch: process 1 exited with code 3; stopping the other 1" in err


@pytest.mark.subprocess
def test_a_child_that_ignores_sigterm_gets_sigkill_after_the_grace(tmp_path, capfd):
    body = """
if me == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sleep_then_mark()
else:
    wait_for("pid.0")
    sys.exit(5)
"""
    assert run(LaunchSpec(2, 1, ("x",), grace_s=0.5), body, tmp_path) == 5
    assert gone(int((tmp_path / "pid.0").read_text()))
    assert not (tmp_path / "woke.0").exists()
    err = capfd.readouterr().err
    assert "process 0 still running 0.5 s after SIGTERM: SIGKILL" in err


@pytest.mark.subprocess
def test_a_child_killed_by_a_signal_returns_128_plus_it(tmp_path, capfd):
    body = """
if me == 0:
    os.kill(os.getpid(), signal.SIGKILL)
"""
    assert run(LaunchSpec(2, 1, ("x",)), body, tmp_path) == 128 + signal.SIGKILL
    assert "jaxoff launch: process 0 was killed by SIGKILL" in capfd.readouterr().err


def test_a_signal_death_is_reported_before_its_peers_errors_found_in_the_same_poll(capfd):
    """Process 1 SIGKILLed, process 0 then failing on the broken connection: both found ended
    in one poll, the launcher reports the kill and returns 128 + SIGKILL, whatever the order
    of the processes."""

    class Ended:
        def __init__(self, code):
            self.returncode = code

        def poll(self):
            return self.returncode

        def send_signal(self, signum):
            pass

    for codes, victim in (((1, -signal.SIGKILL), 1), ((-signal.SIGKILL, 1), 0)):
        procs = [Ended(c) for c in codes]
        assert _supervise(procs, 0.1, []) == 128 + signal.SIGKILL
        err = capfd.readouterr().err
        assert f"process {victim} was killed by SIGKILL" in err, err
        assert "exited with code 1" not in err, err


@pytest.mark.subprocess
def test_launch_restores_the_signal_handlers(tmp_path):
    def mine(signum, frame):
        pass

    before_term = signal.signal(signal.SIGTERM, mine)
    before_int = signal.getsignal(signal.SIGINT)
    try:
        assert run(LaunchSpec(1, 1, ("x",)), "pass", tmp_path) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is before_int
    finally:
        signal.signal(signal.SIGTERM, before_term)


@pytest.mark.subprocess
def test_a_failed_start_kills_the_children_already_started(tmp_path, monkeypatch):
    real_popen = subprocess.Popen
    started = []

    def popen(*args, **kwargs):
        if started:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(OSError, match="Resource temporarily unavailable"):
        run(LaunchSpec(2, 1, ("x",)), "sleep_then_mark()", tmp_path)
    assert started[0].returncode == -signal.SIGKILL
    assert not (tmp_path / "woke.0").exists()


@pytest.mark.subprocess
def test_a_missing_program_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        launch(LaunchSpec(2, 1, ("x",)), argv=[str(tmp_path / "no-such-program")])


# the launcher in its own process, so that the test can signal or kill it
LAUNCHER = """
import sys
from jaxoff.distributed._launch import LaunchSpec, launch
argv = [sys.executable, "-c", sys.argv[1], *sys.argv[2:]]
sys.exit(launch(LaunchSpec(2, 1, ("x",)), argv=argv))
"""


def start_launcher(body: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, program(body), *args], text=True, **kwargs
    )


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "signum, child_code, expected",
    [(signal.SIGTERM, 0, 0), (signal.SIGINT, 0, 0), (signal.SIGTERM, 143, 143)],
    ids=["sigterm", "sigint", "sigterm-exit-143"],
)
def test_signals_to_the_launcher_reach_every_child(signum, child_code, expected, tmp_path):
    body = """
def stop(signum, frame):
    write(f"got.{me}", signal.Signals(signum).name)
    sys.exit(int(sys.argv[2]))

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
sleep_then_mark()
"""
    launcher = start_launcher(body, str(tmp_path), str(child_code), stderr=subprocess.PIPE)
    try:
        wait_for_files([tmp_path / "pid.0", tmp_path / "pid.1"], launcher)
        launcher.send_signal(signum)
        _, err = launcher.communicate(timeout=HANG_S)
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == expected, err
    assert [(tmp_path / f"got.{i}").read_text() for i in (0, 1)] == [signum.name] * 2
    assert not list(tmp_path.glob("woke.*"))
    assert f"jaxoff launch: got {signum.name}; passed it on to the running processes" in err


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_children_die_with_the_launcher(tmp_path):
    launcher = start_launcher("sleep_then_mark()", str(tmp_path))
    pids = []
    try:
        wait_for_files([tmp_path / "pid.0", tmp_path / "pid.1"], launcher)
        pids = [int((tmp_path / f"pid.{i}").read_text()) for i in (0, 1)]
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + HANG_S
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert all(gone(pid) for pid in pids), f"children {pids} outlived their launcher"
        assert not list(tmp_path.glob("woke.*")), "the children slept on after the launcher died"
    finally:
        launcher.kill()
        launcher.wait()
        for pid in pids:  # only after a failure: children that outlived the launcher
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.subprocess
def test_a_peers_refusal_is_one_line_for_the_job(tmp_path, capfd):
    """Issue 46: process 0 refuses (one line, exit 2); process 1 then dies on the broken
    connection with an XLA fatal error and a stack trace. The job shows process 0's line,
    not process 1's noise (said as held back, in one launcher line)."""
    body = """
if me == 0:
    wait_for("pid.1")
    time.sleep(1.0)  # process 1's first line is older than the relay's hold: it is shown
    print("jaxoff train: error: --out-dir run is in use by a running `jaxoff train`",
          file=sys.stderr, flush=True)
    write("refused.0", "")
    sys.exit(2)
else:
    print("process 1 starting", file=sys.stderr, flush=True)
    write("pid.1", str(os.getpid()))
    wait_for("refused.0")
    for k in range(20):
        print(f"F0000 fatal: coordination service unreachable, frame {k}", file=sys.stderr)
    sys.stderr.flush()
    time.sleep(60)
"""
    assert run(LaunchSpec(2, 1, ("x",), grace_s=5), body, tmp_path) == 2
    err = capfd.readouterr().err
    assert "jaxoff train: error: --out-dir run is in use" in err
    assert "process 1 starting" in err
    assert "fatal" not in err, err
    assert "not shown: what process 1 printed as it was stopped after process 0 failed" in err

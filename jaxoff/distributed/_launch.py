"""``jaxoff launch``: N local processes that train as one, for development and tests.

``jaxoff launch --processes 2 -- train --model tiny`` starts ``jaxoff train --model tiny``
twice on this machine, each with ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and its
own ``JAX_PROCESS_ID``, and ``--devices-per-process`` fake XLA CPU devices. It supervises
them: the first process to fail stops the others, and its exit status is the launcher's.

It is for one machine only. On a cluster, set the three variables yourself (or let your
launcher set them: SLURM, mpirun) and run ``jaxoff train`` on each host.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from .._errors import ConfigError, UsageError

EXAMPLE = "jaxoff launch --processes 2 -- train --model tiny --fsdp 4"
USAGE = f"""\
usage: jaxoff launch [--processes N] [--devices-per-process D] [--port P] [--grace S]
                     -- COMMAND [OPTIONS...]

Start N jaxoff processes on this machine that train as one (jax.distributed), e.g.
  {EXAMPLE}

options:
  --processes N            processes to start (default 2)
  --devices-per-process D  XLA CPU devices each process sees (default 1)
  --port P                 coordinator port on 127.0.0.1 (default 0: pick a free one)
  --grace S                after a process fails, seconds the others get between SIGTERM
                           and SIGKILL (default 10)
  -h, --help               show this help

Everything after -- is the jaxoff command each process runs, with its options. On a
cluster, set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID on each host
(or let SLURM or mpirun do it) and run that command there instead."""

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
_POLL_S = 0.1  # how often the launcher looks at its children
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """What ``jaxoff launch`` starts.

    Attributes:
        processes: how many processes (at least 1).
        devices_per_process: XLA CPU devices each process sees (at least 1).
        command: the jaxoff command and its options, e.g. ``("train", "--model", "tiny")``.
        port: the coordinator's port on 127.0.0.1; 0 picks a free one.
        grace_s: after a process fails, seconds between SIGTERM and SIGKILL of the others.
    """

    processes: int
    devices_per_process: int
    command: tuple[str, ...]
    port: int = 0
    grace_s: float = 10.0

    def __post_init__(self):
        for name in ("processes", "devices_per_process"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"LaunchSpec.{name} must be at least 1, got {getattr(self, name)}"
                )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"LaunchSpec.port must be 0 (pick one) to 65535, got {self.port}")
        if not (self.grace_s >= 0 and math.isfinite(self.grace_s)):
            raise ConfigError(f"LaunchSpec.grace_s must be a number >= 0, got {self.grace_s}")
        if not self.command:
            raise ConfigError(
                f"LaunchSpec.command is empty: give the jaxoff command, e.g. {EXAMPLE}"
            )


# option -> (LaunchSpec field, type, smallest value)
_OPTIONS: dict[str, tuple[str, type, float]] = {
    "--processes": ("processes", int, 1),
    "--devices-per-process": ("devices_per_process", int, 1),
    "--port": ("port", int, 0),
    "--grace": ("grace_s", float, 0),
}


def parse_launch_args(argv: list[str]) -> LaunchSpec:
    """Parses what follows ``jaxoff launch``: options, then ``--`` and the command.

    Raises:
        UsageError: an unknown option, a bad value, or no command after ``--``.
        SystemExit: ``--help`` (code 0, after printing the usage).

    >>> spec = parse_launch_args(["--processes", "4", "--", "train", "--model", "tiny"])
    >>> spec.processes, spec.devices_per_process, spec.command
    (4, 1, ('train', '--model', 'tiny'))
    """
    values: dict[str, object] = {
        "processes": 2,
        "devices_per_process": 1,
        "port": 0,
        "grace_s": 10.0,
    }
    args = list(argv)
    command: list[str] | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            command = args[i:]
            break
        if arg in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        option, eq, value = arg.partition("=")
        if option not in _OPTIONS:
            if not arg.startswith("-"):
                raise UsageError(
                    f"{arg!r} is not an option of launch: put -- before the command to launch, "
                    f"e.g. {EXAMPLE}"
                )
            raise UsageError(
                f"unknown option {option} for launch; the options are "
                f"{', '.join(_OPTIONS)} (see jaxoff launch --help)"
            )
        field, kind, least = _OPTIONS[option]
        if not eq:
            if i == len(args) or args[i] == "--":
                raise UsageError(f"{option} needs a value, e.g. {option} {values[field]}")
            value = args[i]
            i += 1
        try:
            number = kind(value)
        except ValueError:
            what = "a whole number" if kind is int else "a number of seconds"
            raise UsageError(f"{option} must be {what}, got {value!r}") from None
        if option == "--port" and not 0 <= number <= 65535:
            raise UsageError(f"--port must be 0 (pick a free one) to 65535, got {value}")
        if not (number >= least and math.isfinite(number)):
            what = f"at least {least}" if kind is int else "a number of seconds >= 0"
            raise UsageError(f"{option} must be {what}, got {value}")
        values[field] = number
    if not command:
        raise UsageError(f"nothing to launch: give the jaxoff command after --, e.g. {EXAMPLE}")
    if command[0] == "launch":
        raise UsageError(
            f"jaxoff launch cannot launch itself: after -- give the command each process "
            f"runs, e.g. {EXAMPLE}"
        )
    return LaunchSpec(command=tuple(command), **values)  # type: ignore[arg-type]


def child_argv(spec: LaunchSpec) -> list[str]:
    """The command line of each process: this Python running ``jaxoff <command>``."""
    return [sys.executable, "-m", "jaxoff", *spec.command]


def child_env(
    spec: LaunchSpec, process_id: int, port: int, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of process ``process_id``: ``base`` (default: this process's) plus the
    coordinator's address, the process count and id, and the XLA CPU device count.

    >>> env = child_env(LaunchSpec(2, 3, ("train",)), 1, 1234, {"XLA_FLAGS": "--a --b"})
    >>> env["JAX_COORDINATOR_ADDRESS"], env["JAX_PROCESS_ID"], env["XLA_FLAGS"]
    ('127.0.0.1:1234', '1', '--a --b --xla_force_host_platform_device_count=3')
    """
    if not 0 <= process_id < spec.processes:
        raise ConfigError(f"process_id must be 0 to {spec.processes - 1}, got {process_id}")
    env = dict(os.environ if base is None else base)
    # a device count already there (conftest.py, a user's shell) would win over ours if kept
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT_FLAG)]
    flags.append(f"{_DEVICE_COUNT_FLAG}={spec.devices_per_process}")
    env.update(
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        JAX_NUM_PROCESSES=str(spec.processes),
        JAX_PROCESS_ID=str(process_id),
        JAXOFF_LAUNCHED="1",
        XLA_FLAGS=" ".join(flags),
    )
    return env


def launch(spec: LaunchSpec, argv: list[str] | None = None) -> int:
    """Starts ``spec.processes`` processes and waits for them; returns the exit status.

    0 when every process exits 0; otherwise the first failure decides: its exit code, or
    128 + n for a process killed by signal n. The other processes then get SIGTERM and,
    ``spec.grace_s`` seconds later, SIGKILL. SIGINT and SIGTERM sent to the launcher are
    passed on to the processes, which are still waited for.

    Args:
        spec: what to start.
        argv: the command line of each process, instead of :func:`child_argv` (tests run a
            small Python program).

    Raises:
        OSError: a process could not be started (the ones already started are killed).
    """
    argv = child_argv(spec) if argv is None else list(argv)
    port = spec.port or _free_port()
    devices = f"{spec.devices_per_process} device{'s' if spec.devices_per_process > 1 else ''}"
    _say(f"{spec.processes} processes × {devices}, coordinator 127.0.0.1:{port}")
    procs: list[subprocess.Popen] = []
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        _signal_running(procs, signum)

    previous = _install_handlers(forward)
    try:
        wrapped = _dying_with_parent(argv)
        relay = Relay()
        for i in range(spec.processes):
            # process_group=0: a Ctrl-C at the terminal reaches the launcher alone, which
            # passes it on once; in the terminal's group, each child would get it twice.
            # Process 0 keeps the terminal (its progress display); the others' stderr goes
            # through the relay, which holds back what they print once a peer has failed.
            pipe = subprocess.PIPE if i else None
            procs.append(
                subprocess.Popen(
                    wrapped, env=child_env(spec, i, port), process_group=0, stderr=pipe
                )
            )
            if i:
                relay.watch(i, procs[-1].stderr)
        try:
            return _supervise(procs, spec.grace_s, received, relay)
        finally:
            _signal_running(procs, signal.SIGKILL)
            relay.close()
    finally:
        # a failed start (OSError) or an exception while supervising leaves no child behind
        _signal_running(procs, signal.SIGKILL)
        for p in procs:
            p.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Relay:
    """Copies the stderr of processes 1..N-1 to the launcher's, half a second late: when a
    process fails, what the others print from then on (a refused run's peers die on the
    broken connection with an XLA fatal error and a C++ stack trace) is not shown, except
    jaxoff's own lines (a peer's one-line error that names a file), so that the job says
    what failed in a line or two. A count of what was held back is said once at the end."""

    HOLD_S = 0.5

    def __init__(self):
        self._lock = threading.Lock()
        self._chunks: list[tuple[float, int, bytes]] = []
        self._threads: list[threading.Thread] = []
        self._failed: tuple[int, float] | None = None  # (process, when it was found ended)
        self.dropped: dict[int, int] = {}

    def watch(self, i: int, pipe) -> None:
        def read():
            fd = pipe.fileno()
            while chunk := os.read(fd, 65536):
                with self._lock:
                    self._chunks.append((time.monotonic(), i, chunk))
            pipe.close()

        t = threading.Thread(target=read, daemon=True, name=f"jaxoff-launch-relay-{i}")
        t.start()
        self._threads.append(t)

    def failed(self, i: int) -> None:
        """Process ``i`` failed first: from ``HOLD_S`` before now on, the others are quiet."""
        with self._lock:
            if self._failed is None:
                self._failed = (i, time.monotonic() - self.HOLD_S)

    def flush(self, everything: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            ready = [c for c in self._chunks if everything or now - c[0] >= self.HOLD_S]
            self._chunks = [c for c in self._chunks if c not in ready]
        for t, i, chunk in ready:
            if self._failed is not None and i != self._failed[0] and t >= self._failed[1]:
                # jaxoff's own lines (a process's one-line error) are the job's; the rest is
                # what the runtime prints as the process is cut off
                lines = chunk.splitlines(keepends=True)
                ours = [line for line in lines if line.startswith(b"jaxoff ")]
                self.dropped[i] = self.dropped.get(i, 0) + len(lines) - len(ours)
                chunk = b"".join(ours)
                if not chunk:
                    continue
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), chunk)

    def close(self) -> None:
        for t in self._threads:
            t.join(timeout=5)
        self.flush(everything=True)
        if any(self.dropped.values()) and self._failed is not None:
            who = ", ".join(str(i) for i, n in sorted(self.dropped.items()) if n)
            _say(
                f"not shown: what process {who} printed as it was stopped after process "
                f"{self._failed[0]} failed ({sum(self.dropped.values())} lines)"
            )


def _supervise(
    procs: list[subprocess.Popen],
    grace_s: float,
    received: list[int],
    relay: Relay | None = None,
) -> int:
    status = 0
    done = [False] * len(procs)
    kill_at: float | None = None
    told = 0
    while True:
        for signum in received[told:]:
            _say(f"got {_signal_name(signum)}; passed it on to the running processes")
            told += 1
        ended = [i for i, p in enumerate(procs) if not done[i] and p.poll() is not None]
        # A process killed by a signal first: its peers then fail on their broken connections
        # (a collective's "connection reset"), and may be found ended in the same poll; the
        # signal is the cause to report (and the exit status), not the peers' errors.
        ended.sort(key=lambda i: procs[i].returncode >= 0)
        for i in ended:
            p = procs[i]
            done[i] = True
            if p.returncode != 0 and status == 0:
                if relay is not None:
                    relay.failed(i)
                status = p.returncode if p.returncode > 0 else 128 - p.returncode
                what = (
                    f"exited with code {p.returncode}"
                    if p.returncode > 0
                    else f"was killed by {_signal_name(-p.returncode)}"
                )
                others = sum(q.returncode is None for q in procs)
                if others:
                    what += f"; stopping the other {others} (SIGTERM, SIGKILL after {grace_s:g} s)"
                _say(f"process {i} {what}")
                if signal.SIGTERM not in received:  # a second one could cut a clean exit short
                    _signal_running(procs, signal.SIGTERM)
                kill_at = time.monotonic() + grace_s
        if relay is not None:
            relay.flush()
        if all(done):
            return status
        if kill_at is not None and time.monotonic() >= kill_at:
            late = [str(i) for i, p in enumerate(procs) if p.returncode is None]
            _say(f"process {', '.join(late)} still running {grace_s:g} s after SIGTERM: SIGKILL")
            _signal_running(procs, signal.SIGKILL)
            kill_at = None
        time.sleep(_POLL_S)


def _signal_running(procs: list[subprocess.Popen], signum: int) -> None:
    for p in procs:
        p.send_signal(signum)  # a no-op for a process already reaped


def _install_handlers(
    handler: Callable,
) -> dict[int, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None]:
    """Installs ``handler`` for SIGINT and SIGTERM; returns the handlers it replaced (none
    outside the main thread, where Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


# Each child runs this first, then becomes its command: the kernel SIGKILLs it when the
# launcher dies (Linux PR_SET_PDEATHSIG, kept across exec), so a killed launcher leaves no
# training process behind. An exec wrapper, not a preexec_fn: a preexec_fn forks through
# Python's at-fork hooks, which a multithreaded parent (JAX) warns against, and deadlock-prone.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    f"ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, int(signal.SIGKILL)); "
    "os.getppid() == int(sys.argv[1]) or os.kill(os.getpid(), signal.SIGKILL); "
    "os.execvp(sys.argv[2], sys.argv[2:])"
)


def _dying_with_parent(argv: list[str]) -> list[str]:
    """``argv`` behind `_DIE_WITH_PARENT` (Linux; elsewhere ``argv`` itself). The kernel
    watches the thread that started the child: start children from one that lives as long
    as the launcher.

    Raises:
      FileNotFoundError: ``argv[0]`` is not a program (before anything starts).
    """
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(errno.ENOENT, f"no such program: {argv[0]}", argv[0])
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def _free_port() -> int:
    # another program may take the port before the coordinator binds it: rare on a
    # development machine; pass --port then
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _say(line: str) -> None:
    print(f"jaxoff launch: {line}", file=sys.stderr, flush=True)

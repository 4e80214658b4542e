"""Progress that survives a narrow terminal, a log, a stalled step and SIGTERM."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
from _limits import HANG_S
from rich.console import Console

from jaxoff.train import TrainConfig, _metrics, train
from jaxoff.train._metrics import PlainProgress, ProgressBar
from jaxoff.train._watchdog import StallWatchdog

ETA = re.compile(r"\d+:\d\d:\d\d")  # rich's time remaining
STATS = {
    "loss": "3.412",
    "val": "3.500",
    "tok/s": "12,345",
    "disk r/w": "1,234/1,234 MB/s",
    "io hidden": "97%",
    "rss": "12.34 GiB",
}


def render(width: int) -> str:
    console = Console(width=width, record=True, force_terminal=True, color_system=None)
    bar = ProgressBar(300, 0, True, console=console)
    for step in (36, 37):  # two updates: rich then knows the pace, hence the time remaining
        bar.update(step, STATS)
        time.sleep(0.05)
    console.print(bar._progress.get_renderable())
    return console.export_text()


def test_bar_at_80_columns_keeps_count_and_eta_and_drops_statistics():
    lines = render(80).splitlines()
    assert len(lines) == 1, lines
    (line,) = lines
    assert len(line) <= 80
    assert "37/300" in line and ETA.search(line), line
    assert "loss 3.412" in line  # the first statistics stay
    assert "rss" not in line  # the last go first


def test_wide_bar_has_every_statistic():
    (line,) = render(200).splitlines()
    assert "37/300" in line and ETA.search(line)
    assert all(f"{k} {v}" in line for k, v in STATS.items()), line


def test_log_lines_carry_the_eta(capsys):
    with PlainProgress(total=4, start=0, lines=4) as p:
        for step in range(1, 5):
            p.update(step, {"loss": "1.000"})
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[1] for line in lines] == ["1/4", "2/4", "3/4", "4/4"]
    assert all(re.search(r" elapsed \S+ eta \d", line) for line in lines), lines
    assert lines[-1].endswith("eta 0.0s")


def test_eta_is_the_pace_after_the_first_step(monkeypatch, capsys):
    clock = Clock()
    monkeypatch.setattr(_metrics.time, "monotonic", clock)
    with PlainProgress(total=5, start=0, lines=5) as p:
        clock.now += 10.0  # the first step warms up
        p.update(1, {})
        for step in (2, 3):
            clock.now += 1.0
            p.update(step, {})
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "step 1/5 elapsed 10s eta 40s",
        "step 2/5 elapsed 11s eta 3.0s",
        "step 3/5 elapsed 12s eta 2.0s",
    ]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


COUNTERS = dict(  # what jaxoff.aio.io_stats gives: the pager's and its engine's
    reads_in_flight=0,
    writes_in_flight=0,
    read_bytes=0,
    write_bytes=0,
    take_wait_ns=0,
    put_wait_ns=0,
    begin_wait_ns=0,
)


def test_watchdog_says_what_a_stalled_step_waits_on():
    clock, lines = Clock(), []
    counters = dict(COUNTERS)
    dog = StallWatchdog(lines.append, lambda: dict(counters), clock=clock)
    for step in range(1, 6):  # five 2-second steps: median 2 s, the bound max(30, 10) s
        dog.started(step)
        clock.now += 2.0
        dog.check()
        dog.finished()
    dog.started(6)
    clock.now += 25.0  # 12x the median, but under 30 s
    dog.check()
    assert lines == []
    clock.now += 15.0
    counters.update(reads_in_flight=3, take_wait_ns=5 * 10**9, read_bytes=2 * 10**9)
    dog.check()
    dog.check()  # once per step
    assert lines == [
        "step 6 has run 40s, 20x the median step (2.0s); waiting on paged reads (3 reads, "
        "0 writes in flight; this step so far: take 5.0s, write slots 0.0s, last commit 0.0s "
        "waited, 2000 MB read, 0 MB written)"
    ]
    counters.update(reads_in_flight=0, begin_wait_ns=30 * 10**9, take_wait_ns=40 * 10**9)
    clock.now += 20.0
    dog.finished()
    assert lines[1] == (
        "step 6 took 1m00s, 30x the median step (2.0s); it waited on paged I/O (most: take) "
        "(0 reads, 0 writes in flight; this step so far: take 40s, write slots 0.0s, "
        "last commit 30s waited, 2000 MB read, 0 MB written)"
    )
    dog.started(7)  # the next normal step says nothing
    clock.now += 2.0
    dog.finished()
    assert len(lines) == 2


def test_watchdog_without_paged_io():
    clock, lines = Clock(), []
    dog = StallWatchdog(lines.append, clock=clock, min_s=1.0)
    for step in range(1, 4):
        dog.started(step)
        clock.now += 0.1
        dog.finished()
    dog.started(4)
    clock.now += 5.0
    dog.check()
    assert lines == [
        "step 4 has run 5.0s, 50x the median step (0.1s); waiting on not paged I/O (the "
        "optimizer is not paged): compute or the host"
    ]


def test_slow_step_of_a_paged_run_is_reported(tiny_train_args, monkeypatch, capsys):
    """A step of a real paged run made 100 s slower (the watchdog's clock jumps when step 5
    starts): one line with the I/O counters of that step."""

    class SlowStep5(StallWatchdog):
        def __init__(self, report, counters):
            self.extra = 0.0
            super().__init__(report, counters, clock=lambda: time.monotonic() + self.extra)

        def started(self, step):
            super().started(step)
            if step == 5:
                self.extra += 100.0

    monkeypatch.setattr(_metrics, "StallWatchdog", SlowStep5)
    train(TrainConfig(**{**tiny_train_args, "steps": 6, "store": "auto"}))
    err = capsys.readouterr().err
    found = re.findall(r"jaxoff train: step (\d+) took (\S+), \d+x the median step .*", err)
    assert [s for s, _ in found] == ["5"], err
    (line,) = [x for x in err.splitlines() if "step 5 took" in x]
    assert re.search(
        r"in flight; this step so far: take \S+, write slots \S+, last commit \S+ waited, "
        r"\d+ MB read, \d+ MB written\)$",
        line,
    ), line


def _read_all(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child's side closed
            return
        if not data:
            return
        into.append(data)


@pytest.mark.subprocess
def test_sigterm_restores_the_terminal_and_says_where_the_run_stands(tmp_path):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # 80 columns
    out = tmp_path / "run"
    args = ["train", "--model", "tiny", "--batch-size", "2", "--seq-len", "16"]
    args += ["--steps", "100000", "--eval-every", "0", "--ckpt-every", "2", "--store", "none"]
    args += ["--out-dir", str(out)]
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "80"}
    child = subprocess.Popen(
        [sys.executable, "-m", "jaxoff", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        cwd=tmp_path,
        env=env,
    )
    os.close(slave)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(master, chunks), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + HANG_S
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
            assert child.poll() is None, b"".join(chunks).decode(errors="replace")
            assert time.monotonic() < deadline, "no 5 steps in time"
            time.sleep(0.2)
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=HANG_S)
    finally:
        if child.poll() is None:
            child.kill()
        reader.join(timeout=60)
        os.close(master)
    raw = b"".join(chunks)
    text = raw.decode(errors="replace")
    assert child.returncode == -signal.SIGTERM, text[-2000:]
    # rich hid the cursor for the bar and showed it again after the signal
    assert b"\x1b[?25l" in raw and raw.rindex(b"\x1b[?25h") > raw.rindex(b"\x1b[?25l")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", re.sub(r"\x1b\[[0-9;]*m", "", text))
    frames = re.split(r"[\r\n]", plain)
    assert any(re.search(r"\d+/100000", f) and ETA.search(f) for f in frames), text[-2000:]
    lines = [f for f in frames if "stopped by" in f]
    assert len(lines) == 1, lines
    m = re.fullmatch(
        r"jaxoff train: stopped by SIGTERM after step (\d+) of 100000; last checkpoint: step "
        r"(\d+) \((.*)\); resume with: jaxoff (.*)",
        lines[0],
    )
    assert m, lines[0]
    step, ckpt = int(m[1]), int(m[2])
    assert step >= 4 and ckpt % 2 == 0 and 2 <= ckpt <= step
    assert m[3] == str(out / "checkpoints" / str(ckpt))
    assert m[4] == " ".join([*args, "--resume"])


def test_compare_reports_each_measurement_in_a_log():
    import io

    from jaxoff import _output
    from jaxoff.compare._run import _progress

    log = Console(file=io.StringIO(), width=_output.LOG_WIDTH)
    with _progress(log) as progress:  # compare's own calls, as in jaxoff.compare._run
        task = progress.add_task("compare", total=3)
        for spec in ("none", "full"):
            progress.update(task, description=f"compile + run {spec} (device)")
            progress.advance(task)
        progress.update(task, description="baseline FLOPs (none)")
        progress.advance(task)
        progress.update(task, description="done")
    lines = log.file.getvalue().splitlines()
    assert [re.sub(r"; \S+ so far\)$", ")", line) for line in lines] == [
        "jaxoff compare [1/3] compile + run none (device) (2 more after it)",
        "jaxoff compare [2/3] compile + run full (device) (1 more after it)",
        "jaxoff compare [3/3] baseline FLOPs (none) (0 more after it)",
    ]
    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert not isinstance(_progress(terminal), _output.LogProgress)  # the rich bar there


def test_a_long_part_says_it_is_still_running_in_a_log():
    """compare and plan in a log: a part longer than ``every`` seconds gets a line every
    ``every`` seconds naming it; none after the part ends or the context exits."""
    import io

    from jaxoff import _output

    log = Console(file=io.StringIO(), width=_output.LOG_WIDTH)
    with _output.LogProgress("compare", log, every=0.2) as progress:
        task = progress.add_task("compare", total=2)
        progress.update(task, description="compile + run full (device)")
        time.sleep(0.75)
        progress.advance(task)
        progress.update(task, description="baseline FLOPs (none)")
        time.sleep(0.05)  # shorter than every: no heartbeat for this part
    time.sleep(0.5)  # the thread has stopped: nothing more is written
    lines = log.file.getvalue().splitlines()
    beats = [x for x in lines if "still running" in x]
    assert lines[0].startswith("jaxoff compare [1/2] compile + run full (device) (1 more")
    assert 2 <= len(beats) <= 4, lines
    assert all(
        re.fullmatch(
            r"jaxoff compare \[1/2\] compile \+ run full \(device\): still running, "
            r"\S+ in this part \(\S+ so far\)",
            x,
        )
        for x in beats
    ), beats
    assert lines[-1].startswith("jaxoff compare [2/2] baseline FLOPs (none)")

    steps = _output.Steps("plan", 1, log)
    steps._log.every = 0.2
    log.file.truncate(0), log.file.seek(0)
    with steps.step("profiling"):
        time.sleep(0.5)
    assert any(
        "jaxoff plan [1/1] profiling: still running" in x for x in log.file.getvalue().splitlines()
    )


@pytest.mark.slow
def test_plan_reports_each_part_in_a_log(tmp_path, capsys):
    from jaxoff.cli import main

    args = ["plan", "--model", "tiny", "--hardware", "rtx4090", "--batch", "4", "--seq", "32"]
    assert main([*args, "--no-price", "--out", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    # a part that runs past HEARTBEAT_S adds "still running" lines (a loaded machine)
    lines = [x for x in out if x.startswith("jaxoff plan [") and "still running" not in x]
    assert lines[0].startswith(
        "jaxoff plan [1/8] profiling tiny at batch 4 x seq 32 (7 more after it; "
    )
    assert lines[1].startswith("jaxoff plan [2/8] solving the MILP (6 more after it; ")
    assert lines[2].startswith("jaxoff plan [3/8] the greedy baseline (5 more after it; ")
    assert [x.split(" (")[0] for x in lines[3:]] == [
        f"jaxoff plan [{i}/8] costing preset {name}"
        for i, name in enumerate(
            ("full", "selective", "attention_core", "offload_all", "offload_dots"), 4
        )
    ]

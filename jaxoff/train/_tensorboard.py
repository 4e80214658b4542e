"""TensorBoard event files beside ``metrics.jsonl``: each record's figures under the names
JAX users look for (``learning/loss``, ``perf/step_time_seconds``, ``offload/...``).

Written with tensorboardX's event protos and record framing (no TensorFlow needed);
``tensorboard --logdir <out_dir>/tb`` shows them. Only process 0 writes (its
``metrics.jsonl`` is the run's). TensorBoard keeps scalars as float32: a value there is the
record's value rounded to float32.

The writer is synchronous: each record is on disk (fsync) when :meth:`TensorBoardWriter.write`
returns, and a failure (a full disk) is raised there, in the training loop, where the trainer
turns it into its one-line error. tensorboardX's own ``SummaryWriter`` writes from a thread
and flushes again at exit, so a full disk there ends the process with tracebacks.
"""

from __future__ import annotations

import importlib
import math
import os
import socket
import time
from pathlib import Path

# the run directory's subfolder that holds the event files
TB_DIR = "tb"

# metrics.jsonl key -> TensorBoard tag
TAGS: dict[str, str] = {
    "loss": "learning/loss",
    "grad_norm": "learning/grad_norm",
    "lr": "learning/lr",
    "val_loss": "learning/val_loss",
    "step_time_s": "perf/step_time_seconds",
    "tokens_per_s": "perf/tokens_per_sec",
    "compile_s": "perf/compile_seconds",
    "elapsed_s": "perf/elapsed_seconds",
    "rss_gib": "memory/rss_gib",
    "peak_rss_gib": "memory/peak_rss_gib",
    "disk_read_mbps": "offload/disk_read_mbps",
    "disk_write_mbps": "offload/disk_write_mbps",
    "io_s": "offload/io_seconds",
    "io_wait_s": "offload/io_wait_seconds",
    "compute_s": "offload/compute_seconds",
    "io_hidden": "offload/io_hidden_fraction",
}
# not written: the step is TensorBoard's x axis; GB/s repeat the MB/s figures
SKIPPED = frozenset({"step", "disk_read_gbps", "disk_write_gbps"})


def tag(key: str) -> str | None:
    """The TensorBoard tag of a ``metrics.jsonl`` key (None: not written). Keys not in
    :data:`TAGS` (e.g. FSDP's phase times ``grads_s``) go to ``perf/<name>_seconds`` when
    they end in ``_s``, else ``other/<key>``.

    >>> tag("loss"), tag("grads_s"), tag("step")
    ('learning/loss', 'perf/grads_seconds', None)
    """
    if key in SKIPPED:
        return None
    if key in TAGS:
        return TAGS[key]
    if key.endswith("_s"):
        return f"perf/{key[:-2]}_seconds"
    return f"other/{key}"


def scalars(record: dict) -> dict[str, float]:
    """``{tag: value}`` of a metrics record: its finite numbers (None and text left out)."""
    out = {}
    for key, value in record.items():
        name = tag(key)
        if name is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[name] = float(value)
    return out


class TensorBoardWriter:
    """Appends each metrics record to an event file in ``logdir``, synchronously.

    ``purge_from``: the first step this run writes; on resume, TensorBoard drops what an
    earlier run wrote from that step on (the steps after the checkpoint are re-run).
    """

    def __init__(self, logdir: Path, purge_from: int | None = None):
        from tensorboardX.record_writer import RecordWriter  # heavy (protobuf): a run's events only

        # a generated protobuf module: its classes are made at import time (no stubs)
        events_pb2 = importlib.import_module("tensorboardX.proto.event_pb2")
        Event, SessionLog = events_pb2.Event, events_pb2.SessionLog

        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        # TensorBoard reads every file whose name holds "tfevents"; the pid keeps two
        # writers started in the same second apart
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = self.logdir / name
        self._records = RecordWriter(str(self.path))
        self._event = Event
        events = [Event(wall_time=time.time(), file_version="brain.Event:2")]
        if purge_from is not None:
            start = SessionLog(status=SessionLog.START)
            events.append(Event(wall_time=time.time(), step=purge_from, session_log=start))
        self._append(events)

    def write(self, record: dict) -> None:
        Summary = importlib.import_module("tensorboardX.proto.summary_pb2").Summary

        step, now = int(record["step"]), time.time()
        values = [Summary.Value(tag=k, simple_value=v) for k, v in scalars(record).items()]
        if values:
            self._append([self._event(wall_time=now, step=step, summary=Summary(value=values))])

    def _append(self, events) -> None:
        for event in events:
            self._records.write(event.SerializeToString())
        self._records.flush()  # flush + fsync

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()

"""TensorBoard event files beside ``metrics.jsonl``: each record's figures under the names
JAX users look for (``learning/loss``, ``perf/step_time_seconds``, ``offload/...``).

Written through tensorboardX (no TensorFlow needed); ``tensorboard --logdir <out_dir>/tb``
shows them. Only process 0 writes (its ``metrics.jsonl`` is the run's). TensorBoard keeps
scalars as float32: a value there is the record's value rounded to float32.
"""

from __future__ import annotations

import math
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
    """Appends each metrics record to an event file in ``logdir``.

    ``purge_from``: the first step this run writes; on resume, TensorBoard drops what an
    earlier run wrote from that step on (the steps after the checkpoint are re-run).
    """

    def __init__(self, logdir: Path, purge_from: int | None = None):
        from tensorboardX import SummaryWriter

        self.logdir = Path(logdir)
        self._writer = SummaryWriter(str(self.logdir), purge_step=purge_from, flush_secs=10)

    def write(self, record: dict) -> None:
        step = int(record["step"])
        for name, value in scalars(record).items():
            self._writer.add_scalar(name, value, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

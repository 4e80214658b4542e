"""TensorBoard event files beside metrics.jsonl: read back, same names and values."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from jaxoff.train import TrainConfig, train
from jaxoff.train._metrics import read_metrics
from jaxoff.train._tensorboard import TB_DIR, TensorBoardWriter, scalars, tag

# the names a JAX user looks for (issue 47)
CONVENTIONAL = {
    "learning/loss",
    "learning/grad_norm",
    "learning/lr",
    "learning/val_loss",
    "perf/step_time_seconds",
    "perf/tokens_per_sec",
    "offload/io_wait_seconds",
    "offload/disk_read_mbps",
}


def read_events(logdir) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of every scalar in the event files of ``logdir``, parsed
    as TFRecords (each record's length and data checked against their masked CRC-32C)."""
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c

    out: dict[str, dict[int, float]] = {}
    files = sorted(logdir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {logdir}"
    for path in files:
        data = path.read_bytes()
        i = 0
        while i < len(data):
            header = data[i : i + 8]
            (n,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[i + 8 : i + 12])[0] == masked_crc32c(header)
            body = data[i + 12 : i + 12 + n]
            assert struct.unpack("<I", data[i + 12 + n : i + 16 + n])[0] == masked_crc32c(body)
            i += 16 + n
            event = event_pb2.Event.FromString(body)
            for v in event.summary.value:
                out.setdefault(v.tag, {})[event.step] = v.simple_value
    return out


@pytest.fixture(scope="module")
def paged_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tb") / "run"
    cfg = TrainConfig(
        model="tiny",
        batch_size=2,
        seq_len=32,
        steps=6,
        eval_every=3,
        ckpt_every=0,
        progress=False,
        store="auto",  # paged: the offload/ figures exist
        out_dir=out,
    )
    train(cfg)
    return out


def test_event_file_has_the_metrics_of_metrics_jsonl(paged_run):
    records = read_metrics(paged_run / "metrics.jsonl")
    events = read_events(paged_run / TB_DIR)
    assert [r["step"] for r in records] == list(range(1, 7))
    assert CONVENTIONAL <= set(events), sorted(CONVENTIONAL - set(events))
    want: dict[str, dict[int, float]] = {}
    for r in records:
        for name, value in scalars(r).items():
            want.setdefault(name, {})[r["step"]] = value
    assert set(events) == set(want)
    for name, by_step in want.items():
        # TensorBoard keeps float32: the record's value rounded to float32, exactly
        got = {s: np.float32(v) for s, v in events[name].items()}
        assert got == {s: np.float32(v) for s, v in by_step.items()}, name
    assert set(events["learning/val_loss"]) == {3, 6}
    assert events["learning/loss"][6] == np.float32(records[-1]["loss"])


def test_learning_rate_is_the_schedule_at_the_step(paged_run):
    records = read_metrics(paged_run / "metrics.jsonl")
    cfg = TrainConfig(model="tiny", steps=6)
    assert [r["lr"] for r in records] == [float(cfg.schedule()(s - 1)) for s in range(1, 7)]
    assert records[0]["lr"] == 0.0 and records[-1]["lr"] > 0


def test_names():
    assert tag("step_time_s") == "perf/step_time_seconds"
    assert tag("tokens_per_s") == "perf/tokens_per_sec"
    assert tag("io_wait_s") == "offload/io_wait_seconds"
    assert tag("local_update_s") == "perf/local_update_seconds"
    assert tag("disk_read_gbps") is None and tag("step") is None
    assert scalars({"step": 3, "loss": 2.0, "io_hidden": None, "x": float("nan")}) == {
        "learning/loss": 2.0
    }


def test_resume_purges_the_steps_run_again(tmp_path):
    """A resumed run's writer marks its first step: TensorBoard drops what the earlier run
    wrote from there (the steps after the checkpoint, which run again)."""
    from tensorboardX.proto import event_pb2

    w = TensorBoardWriter(tmp_path, purge_from=5)
    w.write({"step": 5, "loss": 1.0})
    w.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    data = path.read_bytes()
    i, starts = 0, []
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i : i + 8])
        event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
        if event.HasField("session_log"):
            starts.append((event.session_log.status, event.step))
        i += 16 + n
    assert starts == [(event_pb2.SessionLog.START, 5)]


def test_writer_is_synchronous_each_record_on_disk_when_write_returns(tmp_path):
    """No thread and no exit hook (a full disk fails in ``write``, inside the loop, where the
    trainer turns it into its one-line error, not in a flush at exit); each record is in
    the file when ``write`` returns."""
    import threading

    before = threading.active_count()
    w = TensorBoardWriter(tmp_path)
    assert threading.active_count() == before
    w.write({"step": 1, "loss": 2.5})
    assert read_events(tmp_path) == {"learning/loss": {1: 2.5}}
    w.write({"step": 2, "loss": 2.0})
    assert read_events(tmp_path)["learning/loss"] == {1: 2.5, 2: 2.0}
    w.close()

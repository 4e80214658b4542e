"""``jaxoff train``'s per-step split of a paged step into I/O, time blocked on it and compute,
read from the engine's counters."""

from __future__ import annotations

import math

import pytest

from jaxoff.train import TrainConfig, read_metrics, train


@pytest.mark.slow
def test_paged_run_records_io_split(tmp_path, tiny_train_args):
    cfg = TrainConfig(**{**tiny_train_args, "steps": 3, "store": str(tmp_path / "store")})
    result = train(cfg)
    for r in result.records:
        assert 0 < r["io_s"] <= r["step_time_s"], r
        assert 0 <= r["io_wait_s"] <= r["step_time_s"], r
        assert math.isclose(r["compute_s"] + r["io_wait_s"], r["step_time_s"]), r
        assert 0 <= r["io_hidden"] <= 1, r
        assert math.isclose(r["io_hidden"], max(0.0, 1 - r["io_wait_s"] / r["io_s"])), r
    # the same fields reach metrics.jsonl
    lines = read_metrics(cfg.out_dir / "metrics.jsonl")
    assert [line["io_s"] for line in lines] == [r["io_s"] for r in result.records]


def test_in_ram_run_has_no_io_split(tiny_train_args):
    (r,) = train(TrainConfig(**{**tiny_train_args, "steps": 1})).records
    assert not {"io_s", "io_wait_s", "compute_s", "io_hidden"} & set(r)

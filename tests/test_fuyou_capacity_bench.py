"""bench/fuyou_capacity.py: its probes in the instrumented loop (bench/_common/step_loop.py,
each a child process with a memory watchdog), the pure I/O replay of a store, and the bounds
computed from a probe's counters (fake records)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _limits import HANG_S

ROOT = Path(__file__).resolve().parents[1]
RANDOM = {"data": "random", "warmup_steps": 0}  # random bytes at a constant rate


@pytest.fixture
def fc(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import fuyou_capacity

    return fuyou_capacity


def _ok(r: dict) -> str:
    if r.get("why") == "timeout":
        return f"the probe's child process hung: no result after {HANG_S:.0f} s; record: {r}"
    return str(r.get("why"))


def test_fuyou_probe_with_a_single_slot_store(fc, tmp_path):
    r = fc.probe(
        "fuyou", 3, d_model=128, seq_len=32, batch_size=1, steps=2, mem_limit_gib=3,
        store_dir=str(tmp_path), timeout_s=HANG_S, slots=1, pure_io_reps=1, read_ahead_mib=0,
        **RANDOM,
    )  # fmt: skip
    assert r["status"] == "ok", _ok(r)
    assert r["read_ahead_bytes"] == 0  # passed to fuyou_init
    # each step's process CPU time (the CPU bound): the step's own work
    assert len(r["cpu_s"]) == len(r["step_s"]) == 2 and all(c > 0 for c in r["cpu_s"])
    # its store replayed once without compute (the pure I/O bound)
    assert len(r["pure_io_s"]) == 1 and r["pure_io_s"][0] > 0
    assert r["pure_io_read_gb"] * 1e9 >= 12 * r["params"]
    # the engine's counters of each step, and each step sampled second by second (the window
    # bound and the plot): every step reads the optimizer state once (the store less its RAM
    # page and slack) and writes it back, in takes of chunks; the pager writes behind the
    # step, so a step's last writes may land in the next one's window: over the two steps at
    # least the first step's state is written back
    assert len(r["engine"]) == len(r["timelines"]) == 2
    first, second = r["engine"]
    assert first["write_bytes"] + second["write_bytes"] >= first["read_bytes"]
    for e, timeline in zip(r["engine"], r["timelines"], strict=True):
        assert 0 < e["read_bytes"] <= r["pure_io_read_gb"] * 1e9 <= 1.2 * e["read_bytes"]
        assert e["write_bytes"] > 0 and e["takes"] > 0 and e["io_busy_s"] > 0
        assert all(e[k] >= 0 for k in ("take_wait_s", "put_wait_s", "begin_wait_s"))
        # samples relative to the step's start; the last one, at its end, sees all of it
        assert timeline[0]["read_bytes"] == timeline[0]["takes"] == 0
        assert [s["t"] for s in timeline] == sorted(s["t"] for s in timeline)
        assert timeline[-1]["read_bytes"] == e["read_bytes"]
        assert timeline[-1]["takes"] == e["takes"]
    # one slot: chunk-padded, but less than two slots
    assert 12 * r["params"] <= r["store_bytes_on_disk"] < 24 * r["params"]
    assert abs(r["losses"][0] - math.log(256)) < 0.5 and r["losses"][1] < r["losses"][0]
    assert list(tmp_path.iterdir()) == []


def test_compute_only_and_parameters_paged_modes_train_the_same_model(fc, tmp_path):
    """The loop's plain-bf16 (the compute-only baseline: fp32 masters and moments in RAM) and
    fuyou-nvme (the GPU probes' pair) start from the same bf16 model on the same batches: the
    first step's loss is the same forward pass, up to the order of its sums."""
    kw = dict(d_model=64, seq_len=32, batch_size=1, steps=2, mem_limit_gib=3, timeout_s=HANG_S,
              slots=1, **RANDOM)  # fmt: skip
    plain = fc.probe("plain-bf16", 2, store_dir=str(tmp_path / "p"), **kw)
    nvme = fc.probe("fuyou-nvme", 2, store_dir=str(tmp_path / "n"), **kw)
    for r in (plain, nvme):
        assert r["status"] == "ok", _ok(r)
        assert len(r["losses"]) == 2 and r["loss_finite"] and all(c > 0 for c in r["cpu_s"])
    assert math.isclose(plain["losses"][0], nvme["losses"][0], rel_tol=1e-2)
    assert "engine" not in plain and plain["store_bytes_on_disk"] == 0  # all in RAM
    # one slot of fp32 masters and moments (12 B/param) and the bf16 block parameters
    assert len(nvme["engine"]) == 2 and nvme["store_bytes_on_disk"] > 12 * nvme["params"]
    assert nvme["rss_gib_after"].keys() >= {"model init", "optimizer init", "compile"}


def test_the_loop_runs_only_what_jaxoff_train_cannot(fc):
    from _common import step_loop

    assert step_loop.MODES == ("plain-bf16", "fuyou", "fuyou-nvme")
    cfg = fc.model_config(1, 64, 32, "paged")
    with pytest.raises(ValueError, match="instrumented loop runs"):
        step_loop.run_probe("paged", cfg, 32, 1, 1, None)


def test_pure_io_replay_of_a_store_larger_than_its_buffers_keeps_every_chunk(tmp_path, monkeypatch):
    """``replay_io`` reuses 2 * window + 2 chunk buffers (a store larger than RAM replays): a
    single-slot store read and written back in place through them still holds every chunk
    as committed (each verified against its checksum when read)."""
    import numpy as np

    from jaxoff.aio import PageStore

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import paged_step

    data = np.random.default_rng(0).standard_normal(40 * 1024).astype(np.float32)
    with PageStore.create(
        tmp_path / "s", {"w": ((data.size,), np.float32)}, chunk_bytes=4096, slots=1
    ) as store:
        store.write("w", data)
        store.commit()
        assert len(store.chunk_table(store.active_slot)["offset"]) == 40  # > 2 * 2 + 2 buffers
    r = paged_step.replay_io(str(tmp_path / "s"), 2)
    assert r["read_gb"] == r["write_gb"] == 40 * 4096 / 1e9
    with PageStore.open(tmp_path / "s") as store:
        np.testing.assert_array_equal(store.read("w"), data)


def test_fuyou_capacity_sets_each_step_against_its_own_io_window(fc):
    """bench/fuyou_capacity.py's third bound: a step against max(compute-only, its opening
    (time to its first take) + the time its I/O was in flight), from the probe's counters."""

    def timeline(first_take_t, end_t, busy):
        rows = [{"t": 0.0, "cpu_s": 0.0, "takes": 0, "take_wait_s": 0.0, "read_bytes": 0,
                 "write_bytes": 0}]  # fmt: skip
        rows.append(rows[0] | {"t": first_take_t - 1.0, "cpu_s": 2 * (first_take_t - 1.0)})
        rows.append(rows[0] | {"t": first_take_t, "cpu_s": 2 * first_take_t, "takes": 3,
                               "read_bytes": 10**9, "take_wait_s": 0.5})  # fmt: skip
        rows.append(rows[0] | {"t": end_t, "cpu_s": 2 * first_take_t + end_t - first_take_t,
                               "takes": 9, "read_bytes": 4 * 10**9, "write_bytes": 4 * 10**9,
                               "take_wait_s": busy / 4})  # fmt: skip
        return rows

    rec = {
        "step_s": [200.0, 150.0, 100.0],
        "engine": [{"io_busy_s": b, "take_wait_s": b / 4} for b in (90.0, 130.0, 60.0)],
        "timelines": [timeline(15.0, t, b) for t, b in ((200, 90), (150, 130), (100, 60))],
    }
    w = fc.window_bounds(rec, compute_s=110.0)
    assert w["opening_s"] == [15.0, 15.0]  # the steps after the first
    assert w["window_bound_s"] == [145.0, 110.0]  # I/O-bound: 15 + 130; compute-bound: 110
    assert w["step_over_window_bound"] == [150.0 / 145.0, 100.0 / 110.0]
    assert w["take_wait_s"] == [32.5, 15.0] and w["io_busy_s"] == [130.0, 60.0]
    r = fc.timeline_rates(rec["timelines"][1])
    assert r["t"] == [14.0, 15.0, 150.0]
    assert r["cores"] == [2.0, 2.0, 1.0]  # 1 CPU s a second once the paging starts
    assert r["read_gbs"][1] == 1.0 and r["read_gbs"][2] == 3 / 135
    assert r["wait"][2] == (32.5 - 0.5) / 135

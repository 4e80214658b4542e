"""bench/capacity.py: one probe per child process, its record, the memory watchdog."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from _limits import HANG_S

ROOT = Path(__file__).resolve().parents[1]

# A bound that only catches a hung probe child, never a slow one: a probe takes seconds to a
# minute on a loaded 2-core machine (speed is measured in bench/, not here).


def _why(r: dict) -> str:
    """The failure message of a probe record: a timeout is reported as the hang it is."""
    if r.get("why") == "timeout":
        return (
            f"the probe's child process hung: no result after {HANG_S:.0f} s (a bound on "
            f"hangs only, not on speed; JAXOFF_TEST_TIMEOUT_SCALE scales it); record: {r}"
        )
    return str(r.get("why"))


RANDOM = {"data": "random", "warmup_steps": 0}  # random bytes at a constant rate


@pytest.fixture(scope="module")
def capacity():
    spec = importlib.util.spec_from_file_location("capacity", ROOT / "bench" / "capacity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_paged_probe_of_a_tiny_model_reports_its_record(capacity, tmp_path):
    r = capacity.probe(
        "paged",
        2,
        d_model=128,
        seq_len=32,
        steps=2,
        mem_limit_gib=3,
        store_dir=str(tmp_path),
        timeout_s=HANG_S,
        **RANDOM,
    )
    assert r["fits"] is True, _why(r)
    assert r["status"] == "ok" and r["returncode"] == 0
    assert r["params"] == capacity.num_params(2, 128, 32) > 0
    # paged: bf16 params + grads (2 + 2), fp32 masters (4) and moments (8)
    assert r["state_bytes"] == 16 * r["params"]
    assert r["state_bytes_by_part"]["masters"] == 4 * r["params"]
    assert r["store_bytes_needed"] == 24 * r["params"]
    assert r["store_bytes_on_disk"] >= r["store_bytes_needed"]  # both slots, chunk-padded
    assert len(r["losses"]) == len(r["step_s"]) == 2
    assert r["loss_finite"] and all(math.isfinite(x) for x in r["losses"])
    assert abs(r["losses"][0] - math.log(256)) < 0.5  # random bytes, fresh model
    assert all(t > 0 for t in r["step_s"]) and r["compile_s"] > 0
    assert 100 << 20 < r["peak_rss"] < 3 << 30
    assert r["rss_over_state"] == r["peak_rss"] / r["state_bytes"]
    assert list(tmp_path.iterdir()) == []  # store and scratch files removed


def test_fuyou_probe_with_a_single_slot_store(capacity, tmp_path):
    r = capacity.probe(
        "fuyou",
        3,
        d_model=128,
        seq_len=32,
        steps=2,
        mem_limit_gib=3,
        store_dir=str(tmp_path),
        timeout_s=HANG_S,
        slots=1,
        pure_io_reps=1,
        read_ahead_mib=0,
        **RANDOM,
    )
    assert r["fits"] is True, _why(r)
    assert r["read_ahead_bytes"] == 0  # passed to fuyou_init
    # each step's process CPU time (bench/fuyou_capacity.py's CPU bound): the step's own work
    assert len(r["cpu_s"]) == len(r["step_s"]) == 2 and all(c > 0 for c in r["cpu_s"])
    # its store replayed once without compute (bench/fuyou_capacity.py's pure I/O)
    assert len(r["pure_io_s"]) == 1 and r["pure_io_s"][0] > 0
    assert r["pure_io_read_gb"] * 1e9 >= 12 * r["params"]
    # the engine's counters of each step, and each step sampled second by second
    # (bench/fuyou_capacity.py's window bound and plot): every step reads the optimizer state
    # once (the store less its RAM page and slack) and writes it back, in takes of chunks;
    # the pager writes behind the step, so a step's last writes may land in the next one's
    # window: over the two steps at least the first step's state is written back
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
    assert r["slots"] == 1 and r["store_bytes_needed"] == 12 * r["params"]
    # one slot: chunk-padded, but less than the two slots of the paged probe
    assert r["store_bytes_needed"] <= r["store_bytes_on_disk"] < 24 * r["params"]
    assert r["state_bytes"] == 16 * r["params"]
    assert abs(r["losses"][0] - math.log(256)) < 0.5 and r["losses"][1] < r["losses"][0]
    assert list(tmp_path.iterdir()) == []


def test_fuyou_nvme_probe_trains_ten_steps_with_the_parameters_paged(capacity, tmp_path):
    """Ten warmed-up steps on the embedded corpus with the block parameters in the store:
    the loss falls, the store holds parameters too (14 B/param a slot), and the record says
    the model was made layer by layer (RSS after init well under the parameters' bytes
    would not show at this size, so the store size is what is checked)."""
    r = capacity.probe(
        "fuyou-nvme",
        3,
        d_model=64,
        seq_len=32,
        steps=10,
        mem_limit_gib=3,
        store_dir=str(tmp_path),
        timeout_s=HANG_S,
        slots=1,
        lr=3e-3,
        warmup_steps=3,
    )
    assert r["fits"] is True, _why(r)
    assert r["data"] == "corpus" and r["warmup_steps"] == 3 and r["loss_falling"] is True
    assert r["store_bytes_needed"] == 14 * r["params"]
    assert r["store_bytes_needed"] <= r["store_bytes_on_disk"] < 28 * r["params"]
    # two passes over the same 5 windows: the second pass's losses are below the first's
    assert len(r["losses"]) == 10 and r["losses"][5] < r["losses"][0]
    first, second = r["pass_losses"]
    assert second < first and math.isclose(first, sum(r["losses"][:5]) / 5, rel_tol=1e-12)


def test_ten_step_probe_whose_loss_does_not_fall_does_not_fit(capacity, tmp_path):
    r = capacity.probe(
        "plain",
        2,
        d_model=64,
        seq_len=32,
        steps=10,
        mem_limit_gib=3,
        store_dir=str(tmp_path),
        timeout_s=HANG_S,
        lr=-3e-3,  # gradient ascent: the loss rises
        warmup_steps=0,
    )
    assert r["status"] == "ok" and r["loss_finite"], _why(r)
    assert r["loss_falling"] is False and r["pass_losses"][1] > r["pass_losses"][0]
    assert r["fits"] is False and r["why"] == "the loss did not fall"


def test_probe_over_the_memory_limit_is_stopped_and_does_not_fit(capacity, tmp_path):
    r = capacity.probe(
        "plain",
        2,
        d_model=128,
        seq_len=32,
        steps=2,
        mem_limit_gib=0.25,
        store_dir=str(tmp_path),
        timeout_s=HANG_S,
    )
    assert r["why"].startswith("over-limit"), _why(r)
    assert r["fits"] is False
    assert r["status"] == "killed" and r["returncode"] == 3
    assert r["peak_rss"] > 0.25 * (1 << 30)
    assert list(tmp_path.iterdir()) == []


def test_paged_size_beyond_the_free_disk_is_skipped_as_disk_bound(capacity, tmp_path):
    r = capacity.probe("paged", 100_000, d_model=2048, store_dir=str(tmp_path))
    assert r["fits"] is False and r["status"] == "skipped"
    assert r["why"].startswith("disk-bound")
    assert "peak_rss" not in r


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


def test_fuyou_capacity_sets_each_step_against_its_own_io_window(monkeypatch):
    """bench/fuyou_capacity.py's third bound: a step against max(compute-only, its opening
    (time to its first take) + the time its I/O was in flight), from the probe's counters."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import fuyou_capacity as fc

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


def test_fuyou_probe_through_the_trainer_trains_ten_steps(capacity, tmp_path):
    """``--via train`` (the command line's default): the probe is a ``jaxoff train`` run of
    ``--strategy fuyou`` (bf16 blocks as their bits), its losses, validation losses and peak
    RSS from the trainer's records, its store and checkpoint counted toward the disk."""
    r = capacity.probe(
        "fuyou",
        2,
        d_model=128,
        seq_len=32,
        steps=10,
        mem_limit_gib=3,
        store_dir=str(tmp_path),
        timeout_s=HANG_S,
        slots=1,
        lr=3e-3,
        warmup_steps=3,
        via="train",
    )
    assert r["fits"] is True, _why(r)
    assert r["via"] == "train" and r["status"] == "ok" and r["returncode"] == 0
    cfg = r["train_options"]
    assert cfg["strategy"] == "fuyou" and cfg["page_params"] is False and cfg["steps"] == 10
    assert r["params"] == capacity.num_params(2, 128, 32)
    assert len(r["losses"]) == len(r["step_s"]) == 10 and r["loss_finite"]
    # the validation loss at step 5 and 10, on the same held-out batch, fell
    assert len(r["val_losses"]) == 2 and r["val_losses"][1] < r["val_losses"][0]
    assert r["loss_falling"] is True
    assert 100 << 20 < r["peak_rss_steps"] <= r["peak_rss"] < 3 << 30
    assert r["store_bytes_needed"] <= r["store_bytes_on_disk"] < 24 * r["params"]
    assert r["checkpoint_bytes_needed"] == 12 * r["params"]  # the store's version, copied
    assert list(tmp_path.iterdir()) == []
    # a rising loss does not count as falling
    records = [{"loss": 3.0 + i, **({"val_loss": 1.0 + i} if i in (4, 9) else {})}
               for i in range(10)]  # fmt: skip
    assert capacity.train_loss_falling(records) is False
    records = [{**x, "loss": 10.0 - i} for i, x in enumerate(records)]
    assert capacity.train_loss_falling(records) is False  # the validation loss rose
    records = [{**x, "val_loss": -x["val_loss"]} if "val_loss" in x else x for x in records]
    assert capacity.train_loss_falling(records) is True


def test_trainer_probe_disk_cap_counts_the_checkpoint(capacity, tmp_path):
    loop = capacity.disk_cap_layers(str(tmp_path), "fuyou", 1, 2048, 128, 4.0)
    train = capacity.disk_cap_layers(str(tmp_path), "fuyou", 1, 2048, 128, 4.0, via="train")
    assert train < loop  # a copy of the store's version more per parameter
    n = capacity.num_params(train, 2048, 128)
    need = capacity.store_bytes(n, "fuyou", 1) + capacity.checkpoint_bytes(n, "fuyou")
    import shutil

    assert need <= shutil.disk_usage(tmp_path).free - 4 * (1 << 30)
    # --paged-checkpoint store: the checkpoint names the store's version, no copy of it
    in_store = capacity.disk_cap_layers(
        str(tmp_path), "fuyou", 1, 2048, 128, 4.0, via="train", paged_checkpoint="store"
    )
    assert train < in_store == loop  # the store alone
    assert capacity.checkpoint_bytes(n, "fuyou", "store") == 0  # blocks: the masters' casts
    assert capacity.checkpoint_bytes(n, "fuyou-nvme", "store") == 0
    assert capacity.checkpoint_bytes(n, "paged", "store") == 2 * n  # the bf16 parameters
    assert capacity.checkpoint_bytes(n, "plain", "store") == 12 * n  # no store: RAM state
    opts = capacity.train_options("fuyou", 2, 128, 32, 1, 10, tmp_path, tmp_path / "s",
                                  paged_checkpoint="store")  # fmt: skip
    assert opts["paged_checkpoint"] == "store"
    plain = capacity.train_options("plain", 2, 128, 32, 1, 10, tmp_path, None,
                                   paged_checkpoint="store")  # fmt: skip
    assert plain["paged_checkpoint"] == "copy"

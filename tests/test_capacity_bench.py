"""bench/capacity.py: sizes and byte counts, the modes as `jaxoff train` options, the search's
bracketing (fake probes), the verdict on a record, and real probes, each a `jaxoff train` run
in a child process with its memory watchdog (tiny: d_model 64-128, 2 steps where the loss need
not fall, a 3 GiB limit)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
from _limits import HANG_S

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30

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
    """``bench/capacity.py``, the command (it puts ``bench/`` on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location("capacity", ROOT / "bench" / "capacity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sizes(capacity):
    return importlib.import_module("_capacity.sizes")


@pytest.fixture(scope="module")
def probing(capacity):
    return importlib.import_module("_capacity.probe")


# ---------------------------------------------------------------- sizes and bytes


def test_sizes_step_by_one_block(sizes):
    for d in (128, 2048):
        one = sizes.num_params(1, d, 128)
        assert sizes.num_params(5, d, 128) - sizes.num_params(4, d, 128) == 12 * d * d + 13 * d
        assert sizes.num_params(3, d, 128) == one + 2 * (12 * d * d + 13 * d)
    assert sizes.num_params(24, 2048, 128) == 1_211_748_352  # the 1.21B baseline
    for layers in (1, 2, 28, 132):
        n = sizes.num_params(layers, 2048, 128)
        assert sizes.layers_for(n, 2048, 128) == layers  # fewest layers with n parameters
        assert sizes.layers_for(n + 1, 2048, 128) == layers + 1
    assert sizes.layers_for(0, 2048, 128) == 1
    assert sizes.model_config(2, 128, 32, "plain").dtype == "float32"
    assert sizes.model_config(2, 128, 32, "fuyou").param_dtype == "bfloat16"


def test_bytes_of_each_mode(sizes):
    n = 1000
    for mode in sizes.MODES:  # 16 B/param of training state in every mode, by other parts
        assert sum(sizes.state_bytes_per_param(mode).values()) == 16
    assert sizes.state_bytes_per_param("plain")["masters"] == 0
    assert sizes.state_bytes_per_param("paged") == {
        "params": 2, "grads": 2, "moments": 8, "masters": 4
    }  # fmt: skip
    assert sizes.store_bytes(n, "plain") == 0
    assert sizes.store_bytes(n, "paged", 2) == sizes.store_bytes(n, "fuyou", 2) == 24 * n
    assert sizes.store_bytes(n, "fuyou-nvme", 1) == 14 * n  # bf16 block parameters too
    # the last checkpoint: a copy of one slot (none with "store"), plus what orbax holds
    assert sizes.checkpoint_bytes(n, "paged") == 14 * n  # + the bf16 parameters
    assert sizes.checkpoint_bytes(n, "fuyou") == 12 * n  # blocks: the masters' casts
    assert sizes.checkpoint_bytes(n, "fuyou-nvme") == 14 * n
    assert sizes.checkpoint_bytes(n, "fuyou", "store") == 0
    assert sizes.checkpoint_bytes(n, "fuyou-nvme", "store") == 0
    assert sizes.checkpoint_bytes(n, "paged", "store") == 2 * n
    assert sizes.checkpoint_bytes(n, "plain", "store") == 12 * n  # no store: RAM state
    assert sizes.disk_bytes(n, "fuyou", 1, None) == 12 * n  # a run with no checkpoint
    assert sizes.disk_bytes(n, "fuyou", 1, "copy") == 24 * n


def test_disk_cap_counts_the_checkpoint(sizes, tmp_path):
    free = shutil.disk_usage(tmp_path).free - 4 * GIB
    caps = {}
    for ckpt in (None, "copy", "store"):
        cap = sizes.disk_cap_layers(str(tmp_path), "fuyou", 1, 2048, 128, 4.0, ckpt)
        caps[ckpt] = cap
        if cap > 1:  # the largest: it fits, one layer more does not
            fits = sizes.disk_bytes(sizes.num_params(cap, 2048, 128), "fuyou", 1, ckpt)
            over = sizes.disk_bytes(sizes.num_params(cap + 1, 2048, 128), "fuyou", 1, ckpt)
            assert fits <= free < over, (ckpt, cap)
    if caps[None] > 1:
        assert caps["copy"] < caps["store"] == caps[None]  # a copy of the store's version more


# ---------------------------------------------------------------- the modes as trainer options


def test_each_mode_is_a_jaxoff_train_configuration(probing, tmp_path):
    from jaxoff.train import TrainConfig

    expect = {  # mode: (--store, --strategy, --page-params, dtype)
        "plain": ("none", "plain", False, "float32"),
        "paged": (str(tmp_path / "s"), "plain", False, "bfloat16"),
        "fuyou": (str(tmp_path / "s"), "fuyou", False, "bfloat16"),
        "fuyou-nvme": (str(tmp_path / "s"), "fuyou", True, "bfloat16"),
    }
    for mode, (store, strategy, page_params, dtype) in expect.items():
        opts = probing.train_options(
            mode, 2, 128, 32, 1, 10, tmp_path / mode, tmp_path / "s", paged_checkpoint="store"
        )
        cfg = TrainConfig(**opts).validate()  # the trainer accepts it as it is
        assert (cfg.store, cfg.strategy, cfg.page_params) == (store, strategy, page_params)
        assert cfg.model_config().param_dtype == dtype and cfg.clip_norm == 0.0
        assert cfg.eval_every == 5 and cfg.steps == 10  # validation at half and at the end
        assert cfg.paged_checkpoint == ("copy" if mode == "plain" else "store")
    assert probing.train_options("fuyou", 2, 128, 32, 1, 2, tmp_path, None)["eval_every"] == 0
    with pytest.raises(ValueError, match="not a jaxoff train run"):
        probing.train_options("plain-bf16", 2, 128, 32, 1, 2, tmp_path, None)


def test_the_command_has_no_loop_of_its_own(capacity):
    assert "plain-bf16" not in capacity.MODES
    with pytest.raises(SystemExit):
        capacity.parser().parse_args(["--via", "loop"])
    with pytest.raises(SystemExit):
        capacity.parser().parse_args(["--modes", "plain-bf16"])


# ---------------------------------------------------------------- the search, with fake probes


def _fake(largest: int, calls: list[int]):
    def run(layers: int) -> dict:
        calls.append(layers)
        return {"num_layers": layers, "fits": layers <= largest}

    return run


@pytest.mark.parametrize("start", [1, 10, 37, 38, 100])
def test_search_brackets_the_largest_fitting_size(capacity, start):
    calls: list[int] = []
    recs = capacity.search(_fake(37, calls), start, max_probes=20, grow=1.25)
    assert len(calls) == len(set(calls)) <= 20  # each size probed once
    assert [r["num_layers"] for r in recs] == sorted(calls)
    fit = max(r["num_layers"] for r in recs if r["fits"])
    assert fit == 37 and any(r["num_layers"] == 38 and not r["fits"] for r in recs)


def test_search_stops_at_its_probe_budget_and_at_one_layer(capacity):
    calls: list[int] = []
    recs = capacity.search(_fake(1000, calls), 10, max_probes=3, grow=2.0)
    assert calls == [10, 20, 40] and all(r["fits"] for r in recs)  # a lower bound only
    calls = []
    recs = capacity.search(_fake(0, calls), 8, max_probes=20, grow=2.0)
    assert calls == [8, 4, 2, 1] and not any(r["fits"] for r in recs)  # nothing fits


def test_search_never_probes_above_the_disk_cap(capacity):
    calls: list[int] = []

    def run(layers: int) -> dict:  # the disk holds 30 layers; RAM would take 50
        calls.append(layers)
        return {"num_layers": layers, "fits": layers <= 30, "why": "disk-bound" * (layers > 30)}

    recs = capacity.search(run, 10**6, max_probes=10, grow=1.25, cap_layers=30)
    assert calls[:2] == [31, 30]  # the disk-bound record first, then the cap itself
    assert max(calls) == 31 and len(recs) == 2
    assert [r["fits"] for r in recs] == [True, False]


# ---------------------------------------------------------------- verdicts and summaries


def test_a_record_fits_only_when_it_ran_within_the_limit_with_its_loss_falling(probing):
    ok = {"status": "ok", "loss_finite": True, "peak_rss": 2 * GIB, "loss_falling": True}
    assert probing.judge(dict(ok), 10, 3.0)["why"] == "fits"
    cases = {
        "non-finite loss": ({"loss_finite": False}, 2),
        "peak RSS over the limit": ({"peak_rss": 4 * GIB}, 2),
        "the loss did not fall": ({"loss_falling": False}, 10),
        "over-limit (RSS ...)": ({"status": "killed", "why": "over-limit (RSS ...)"}, 2),
    }
    for why, (change, steps) in cases.items():
        r = probing.judge(ok | change, steps, 3.0)
        assert r["fits"] is False and r["why"] == why
    # below FALLING_FROM steps the loss need not fall
    assert probing.judge(ok | {"loss_falling": False}, 9, 3.0)["fits"] is True


def test_a_trainer_probe_loss_falls_on_validation_and_on_the_steps(probing):
    records = [{"loss": 3.0 + i, **({"val_loss": 1.0 + i} if i in (4, 9) else {})}
               for i in range(10)]  # fmt: skip
    assert probing.train_loss_falling(records) is False  # both rose
    records = [{**x, "loss": 10.0 - i} for i, x in enumerate(records)]
    assert probing.train_loss_falling(records) is False  # the validation loss rose
    records = [{**x, "val_loss": -x["val_loss"]} if "val_loss" in x else x for x in records]
    assert probing.train_loss_falling(records) is True
    assert probing.train_loss_falling(records[:4]) is False  # no validation loss at all


def test_summary_gives_each_modes_largest_fit_and_its_ratio_to_plain(capacity):
    summary = importlib.import_module("_capacity.summary")

    def rec(mode, layers, fits, params):
        return {"mode": mode, "num_layers": layers, "fits": fits, "params": params,
                "peak_rss": GIB, "state_bytes": 16 * params, "rss_over_state": 0.5,
                "store_bytes_needed": 0, "why": "fits" if fits else "out of memory"}  # fmt: skip

    records = [rec("plain", 2, True, 100), rec("plain", 3, False, 150),
               rec("paged", 5, True, 250), rec("paged", 6, True, 300),
               rec("paged", 7, False, 350)]  # fmt: skip
    s = summary.summarize(records)
    assert s["largest"]["plain"]["num_layers"] == 2 and s["largest"]["paged"]["params"] == 300
    assert s["paged_over_plain_params"] == 3.0 and "fuyou" not in s["largest"]
    assert [row[-1] for row in summary.rows(records)] == [
        "fits", "out of memory", "fits", "fits", "out of memory"
    ]  # fmt: skip


# ---------------------------------------------------------------- real probes: jaxoff train


def test_the_quick_validation_command_writes_a_result_of_trainer_probes(capacity, sizes, tmp_path):
    """The command end to end at a tiny size: the paged mode's disk-bound record at the
    disk's cap, then one `jaxoff train` probe of 2 layers, in a result that says where it
    came from."""
    out = tmp_path / "capacity.json"
    start = sizes.num_params(2, 128, 32)
    capacity.main(
        ["--modes", "paged", "--d-model", "128", "--seq-len", "32", "--steps", "2",
         "--data", "random", "--warmup-steps", "0", "--mem-limit-gib", "3", "--start",
         str(start), "--max-probes", "1", "--timeout-s", str(HANG_S), "--store-dir",
         str(tmp_path / "probes"), "--out", str(out)]
    )  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python bench/capacity.py --modes paged")
    assert {"commit", "machine", "versions", "date"} <= doc.keys()
    skipped, r = doc["records"]
    assert skipped["status"] == "skipped" and skipped["why"].startswith("disk-bound")
    assert "peak_rss" not in skipped
    assert r["fits"] is True, _why(r)
    assert r["via"] == "train" and r["status"] == "ok" and r["returncode"] == 0
    assert r["train_options"]["store"] != "none" and r["train_options"]["strategy"] == "plain"
    assert r["num_layers"] == 2 and r["params"] == start
    # paged: bf16 params + grads (2 + 2), fp32 masters (4) and moments (8)
    assert r["state_bytes"] == 16 * r["params"]
    assert r["state_bytes_by_part"]["masters"] == 4 * r["params"]
    assert r["store_bytes_needed"] == 24 * r["params"]
    assert r["store_bytes_on_disk"] >= r["store_bytes_needed"]  # both slots, chunk-padded
    assert len(r["losses"]) == len(r["step_s"]) == len(r["io_s"]) == 2
    assert r["loss_finite"] and abs(r["losses"][0] - math.log(256)) < 0.5  # random bytes
    assert all(t > 0 for t in r["step_s"]) and r["compile_s"] > 0
    assert all(s > 0 for s in r["io_s"])  # the trainer's own split of a paged step
    assert 100 << 20 < r["peak_rss_steps"] <= r["peak_rss"] < 3 << 30
    assert r["rss_over_state"] == r["peak_rss"] / r["state_bytes"]
    assert doc["summary"]["largest"]["paged"]["num_layers"] == 2
    assert list((tmp_path / "probes").iterdir()) == []  # store, run and scratch removed


def test_fuyou_probe_through_the_trainer_trains_ten_steps(probing, tmp_path):
    """``--strategy fuyou`` (bf16 blocks as their bits): its losses, validation losses and
    peak RSS from the trainer's records, its store and checkpoint counted toward the disk."""
    r = probing.probe(
        "fuyou", 2, d_model=128, seq_len=32, steps=10, mem_limit_gib=3,
        store_dir=str(tmp_path), timeout_s=HANG_S, slots=1, lr=3e-3, warmup_steps=3,
    )  # fmt: skip
    assert r["fits"] is True, _why(r)
    cfg = r["train_options"]
    assert cfg["strategy"] == "fuyou" and cfg["page_params"] is False and cfg["steps"] == 10
    assert len(r["losses"]) == len(r["step_s"]) == 10 and r["loss_finite"]
    # the validation loss at step 5 and 10, on the same held-out batch, fell
    assert len(r["val_losses"]) == 2 and r["val_losses"][1] < r["val_losses"][0]
    assert r["loss_falling"] is True
    assert 100 << 20 < r["peak_rss_steps"] <= r["peak_rss"] < 3 << 30
    assert r["store_bytes_needed"] <= r["store_bytes_on_disk"] < 24 * r["params"]
    assert r["checkpoint_bytes_needed"] == 12 * r["params"]  # the store's version, copied
    assert list(tmp_path.iterdir()) == []


def test_fuyou_nvme_probe_pages_the_block_parameters_through_the_trainer(probing, tmp_path):
    r = probing.probe(
        "fuyou-nvme", 2, d_model=64, seq_len=32, steps=2, mem_limit_gib=3,
        store_dir=str(tmp_path), timeout_s=HANG_S, slots=1, paged_checkpoint="store", **RANDOM,
    )  # fmt: skip
    assert r["fits"] is True, _why(r)
    assert r["train_options"]["page_params"] is True
    assert r["train_options"]["paged_checkpoint"] == "store"
    # one slot of fp32 masters and moments (12 B/param) and bf16 block parameters (2)
    assert r["store_bytes_needed"] == 14 * r["params"] and r["checkpoint_bytes_needed"] == 0
    assert r["store_bytes_needed"] <= r["store_bytes_on_disk"] < 28 * r["params"]
    assert len(r["losses"]) == 2 and abs(r["losses"][0] - math.log(256)) < 0.5
    assert list(tmp_path.iterdir()) == []


def test_probe_over_the_memory_limit_is_stopped_and_does_not_fit(probing, tmp_path):
    r = probing.probe(
        "plain", 2, d_model=128, seq_len=32, steps=2, mem_limit_gib=0.25,
        store_dir=str(tmp_path), timeout_s=HANG_S,
    )  # fmt: skip
    assert r["why"].startswith("over-limit"), _why(r)
    assert "in jaxoff train" in r["why"] or "in start" in r["why"]  # the child's phase
    assert r["fits"] is False
    assert r["status"] == "killed" and r["returncode"] == 3
    assert r["peak_rss"] > 0.25 * GIB
    assert list(tmp_path.iterdir()) == []


def test_paged_size_beyond_the_free_disk_is_skipped_as_disk_bound(probing, tmp_path):
    r = probing.probe("paged", 100_000, d_model=2048, store_dir=str(tmp_path))
    assert r["fits"] is False and r["status"] == "skipped"
    assert r["why"].startswith("disk-bound")
    assert "peak_rss" not in r and list(tmp_path.iterdir()) == []

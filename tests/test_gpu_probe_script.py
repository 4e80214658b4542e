"""bench/gpu/pager_probe.py, the GPU pager's prepared device run, checked on the CPU (--smoke)."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _limits import HANG_S

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu" / "pager_probe.py"


def load():
    spec = importlib.util.spec_from_file_location("pager_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(tmp_path, *args, timeout=HANG_S):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--store-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"},
    )
    return r, out


def test_without_a_gpu_it_refuses_unless_smoke(tmp_path):
    r, out = run(tmp_path)
    assert r.returncode == 3, r.stderr
    assert "no GPU" in r.stderr and "--smoke" in r.stderr
    assert not out.exists()


def test_busy_time_is_the_union_of_overlapping_spans():
    mod = load()
    assert mod.union_s([(0, 10), (5, 20), (30, 40)]) == pytest.approx(30e-9)
    assert mod.union_s([(30, 40), (0, 10)]) == pytest.approx(20e-9)
    assert mod.union_s([(0, 100), (10, 20)]) == pytest.approx(100e-9)


def test_a_spent_deadline_skips_sections_and_says_so(tmp_path):
    r, out = run(tmp_path, "--smoke", "--deadline-s", "0.01", "--sections", "pcie", "fuyou")
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sections"] == {
        "pcie": summary["sections"]["pcie"],
        "fuyou": summary["sections"]["fuyou"],
    }
    assert all(v.startswith("skipped: deadline") for v in summary["sections"].values())
    assert not (out / "pcie.json").exists()


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ builds the probe's debug target")
def test_smoke_transfers_handlers_and_xla_facts_on_cpu(tmp_path):
    r, out = run(tmp_path, "--smoke", "--sections", "pcie", "handlers", "xla_facts")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sections"] == {"pcie": "ok", "handlers": "ok", "xla_facts": "ok"}, summary
    prov = summary["provenance"]
    assert prov["commit"] and prov["platform"] == "cpu" and prov["versions"]["jax"]
    assert prov["engine_defaults"]["threads"] >= 2
    pcie = json.loads((out / "pcie.json").read_text())
    assert pcie["h2d_gb_s"] > 0 and pcie["d2h_gb_s"] > 0 and pcie["bidirectional_gb_s"] > 0
    handlers = json.loads((out / "handlers.json").read_text())
    assert handlers["platform"] == "cpu"  # the pager of the device JAX has
    assert handlers["take_4k"]["calls"] == 200 and handlers["take_4k"]["us_per_call"] > 0
    assert handlers["take_big"]["gb_s"] > 0 and handlers["write_behind_big"]["gb_s"] > 0
    stats = handlers["stats"]  # two warm-up and two timed runs of each step
    assert stats["takes"] == 2 * (200 + 8) and stats["puts"] == 2 * 8
    assert stats["commits"] == 2 and stats["read_only_steps"] == 4
    facts = json.loads((out / "xla_facts.json").read_text())
    # XLA's CPU runtime: one run id per execution, the scan's two sites in order, 20 trips.
    assert facts["run_id_per_execution"] is True
    assert facts["site_order"] is True
    assert facts["calls_per_execution"] == [40, 40, 40]
    assert facts["host_ahead_of_gpu"] is None  # a GPU-only fact
    assert not list(tmp_path.glob("jaxoff-pager-probe-*"))  # its page store is removed


@pytest.mark.slow
def test_smoke_fuyou_probes_run_in_child_processes(tmp_path):
    r, out = run(tmp_path, "--smoke", "--deadline-s", "1500", "--sections", "fuyou")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((out / "fuyou.json").read_text())
    plain, fuyou = rec["plain_bf16"], rec["fuyou_1L"]
    assert plain["ok"] and fuyou["ok"], (plain, fuyou)
    assert fuyou["mode"] == "fuyou-nvme" and len(fuyou["step_s"]) == 2
    assert fuyou["engine"] and "read_bytes" in json.dumps(fuyou["engine"])
    assert fuyou["gpu_busy_s"] is None  # no GPU plane in a CPU trace
    assert rec["step_ratio_fuyou_over_plain"] > 0


def test_smoke_gpu_pager_section_lowers_the_pager_steps_without_a_gpu(tmp_path):
    r, out = run(tmp_path, "--smoke", "--sections", "gpu_pager")
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sections"] == {"gpu_pager": "ok"}, summary
    rec = json.loads((out / "gpu_pager.json").read_text())
    assert rec["skipped"].startswith("no GPU (cpu)")
    assert rec["lowering"]["operands"] == {
        "jaxoff_pager_begin": [1, 1],  # a write step and a read step: the token each
        "jaxoff_pager_take": [1],
        "jaxoff_pager_out": [2],  # the tensor and the token
        "jaxoff_pager_commit": [1, 1],
    }
    assert rec["lowering"]["attributes"]["jaxoff_pager_out"] == [["plan", "site", "table"]]
    assert rec["lowering"]["callbacks"] == 0

"""bench/gpu_session.sh and bench/gpu/pager_probe.py, the GPU machine's one command, checked
on the CPU: --smoke runs the whole control flow at tiny sizes on JAX's CPU platform."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _limits import HANG_S

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "bench" / "gpu_session.sh"
SCRIPT = ROOT / "bench" / "gpu" / "pager_probe.py"
STEPS = ROOT / "bench" / "gpu" / "steps.py"
CPU = {**os.environ, "JAX_PLATFORMS": "cpu"}


def load(path):
    """The script as a module; the environment it sets for its own children as it is
    imported (XLA_PYTHON_CLIENT_PREALLOCATE) is undone."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    env = dict(os.environ)
    try:
        spec.loader.exec_module(mod)
    finally:
        os.environ.clear()
        os.environ.update(env)
    return mod


def run(tmp_path, *args):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--store-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=tmp_path,
        env=CPU,
    )
    return r, out


def test_without_a_gpu_it_refuses_unless_smoke(tmp_path):
    r, out = run(tmp_path)
    assert r.returncode == 3, r.stderr
    assert "no GPU" in r.stderr and "--smoke" in r.stderr
    assert not out.exists()


def test_legacy_pager_without_its_tree_fails_in_one_line(tmp_path):
    r = subprocess.run(
        ["bash", str(SESSION), str(tmp_path / "out"), "--pager", "legacy"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=ROOT,
        env={**CPU, "LEGACY_TREE": str(tmp_path / "no-legacy")},
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "8abcffe" in lines[0] and "1.54 s" in lines[0], r.stderr
    assert r.stdout == "" and not (tmp_path / "out").exists()  # nothing installed or written


def test_busy_time_is_the_union_of_overlapping_spans_inside_the_steps():
    steps = load(STEPS)
    assert steps.union_s([(0, 10), (5, 20), (30, 40)]) == pytest.approx(30e-9)
    assert steps.union_s([(30, 40), (0, 10)]) == pytest.approx(20e-9)
    assert steps.union_s([(0, 100), (10, 20)]) == pytest.approx(100e-9)
    assert steps.union_s([(0, 10), (5, 20), (30, 40)], 5, 35) == pytest.approx(20e-9)
    # step 1 (0..100) is left out; steps 2 and 3 are 100 ns each, GPU busy 50 + 100 ns
    spans = [(0, 100), (100, 150), (200, 300)]
    share = steps.busy_share(spans, [(0, 100), (100, 200), (200, 300)])
    assert share["gpu_busy_fraction"] == pytest.approx(0.75)


def test_the_plain_bracket_is_bounded():
    steps = load(STEPS)
    assert steps.next_size([], [], 8) == 8
    assert steps.next_size([4, 8], [], 8) == 16  # doubling until one fails
    assert steps.next_size([4, 8], [16], 8) == 12  # then halving the gap
    assert steps.next_size([4], [8], 8) == 6
    assert steps.next_size([5], [6], 8) is None


def test_a_spent_deadline_skips_parts_and_says_so(tmp_path):
    r, out = run(tmp_path, "--smoke", "--deadline-s", "0.01", "--parts", "pcie", "pager")
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["parts"]) == ["pcie", "pager"]
    assert all(p["status"].startswith("skipped: deadline") for p in summary["parts"].values())
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_the_session_measures_the_pager_first():
    text = SESSION.read_text()
    parts = re.search(r"^PARTS=\$\{PARTS:-([^}]*)\}", text, re.M).group(1).split()
    assert parts[0] == "pager" and parts == load(SCRIPT).PARTS


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ builds xla_facts' debug target")
def test_smoke_session_writes_six_files_at_most_with_every_figure(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        ["bash", str(SESSION), str(out), "--smoke"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=ROOT,
        env={**CPU, "STORE_SMOKE": str(tmp_path / "store")},
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "facts.json",
        "pager.json",
        "plain_vs_jaxoff.json",
        "session.log",
        "summary.json",
    ]
    assert all(p.is_file() for p in out.iterdir())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["commit"] and summary["tree_clean"] in (True, False)
    assert summary["machine"]["platform"] == "cpu" and summary["machine"]["cpus"] >= 1
    assert summary["versions"]["jax"] and summary["pager"] == "new" and summary["smoke"]
    parts = summary["parts"]
    assert list(parts)[0] == "pager"
    assert {k: v["status"] for k, v in parts.items()} == dict.fromkeys(
        ["pager", "plain_vs_jaxoff", "gpu_pager", "xla_facts", "pcie", "handlers"], "ok"
    )
    assert {v["file"] for v in parts.values()} == {
        "pager.json",
        "plain_vs_jaxoff.json",
        "facts.json",
    }
    figures = summary["figures"]
    assert set(figures) == {"fuyou_16L_step_s", "gpu_busy_fraction_16L", "tokens_per_s_ratio"}
    assert figures["fuyou_16L_step_s"]["value"] > 0 and figures["fuyou_16L_step_s"]["met"] is None
    assert figures["tokens_per_s_ratio"]["value"] > 0
    assert summary["legacy_record"]["fuyou_16L_step_s"] == 1.543

    pager = json.loads((out / "pager.json").read_text())
    for n in (1, 2):  # the smoke run's 4 and 16 layers
        rec = pager[f"fuyou_{n}L"]
        assert rec["ok"] and rec["mode"] == "fuyou-nvme" and len(rec["step_s"]) == 2, rec
        assert rec["step_windows"] == 2  # each step's wall-clock window, for the busy share
        assert rec["gpu_busy_fraction"] is None  # no GPU plane in a CPU trace
        assert "read_bytes" in json.dumps(rec["engine"])
    assert pager["plain_bf16_1L"]["ok"] and pager["figures"]["step_ratio_fuyou_over_plain"] > 0

    pvj = json.loads((out / "plain_vs_jaxoff.json").read_text())
    assert pvj["plain_probes_run"] <= pvj["plain_probes_cap"] == 1
    assert pvj["jaxoff"]["layers"] == pvj["plain_largest_layers"] and pvj["jaxoff"]["ok"]

    facts = json.loads((out / "facts.json").read_text())
    assert set(facts) == {"gpu_pager", "xla_facts", "pcie", "handlers"}
    assert facts["gpu_pager"]["skipped"].startswith("no GPU (cpu)")
    assert facts["gpu_pager"]["lowering"]["operands"] == {
        "jaxoff_pager_begin": [1, 1],  # a write step and a read step: the token each
        "jaxoff_pager_take": [1],
        "jaxoff_pager_out": [2],  # the tensor and the token
        "jaxoff_pager_commit": [1, 1],
    }
    assert facts["gpu_pager"]["lowering"]["callbacks"] == 0
    xf = facts["xla_facts"]  # XLA's CPU runtime: a run id an execution, sites in order
    assert xf["run_id_per_execution"] and xf["site_order"] and xf["host_ahead_of_gpu"] is None
    assert facts["pcie"]["h2d_gb_s"] > 0 and facts["handlers"]["platform"] == "cpu"
    stats = facts["handlers"]["stats"]  # two warm-up and two timed runs of each step
    assert stats["takes"] == 2 * (200 + 8) and stats["puts"] == 2 * 8
    log = (out / "session.log").read_text()
    assert "== parts: pager plain_vs_jaxoff" in log and "== done" in log
    assert not list((tmp_path / "store").glob("jaxoff-*"))  # page stores removed

"""Whether XLA's instruction-set cap decides the bits of the bitwise fixtures on this CPU.

``tests/test_bitwise_fixtures.py`` runs each fixture in a child process with XLA's CPU
target capped at SSE4.2 (``--xla_cpu_max_isa=SSE4_2``) and compares its digests with
``tests/fixtures/bitwise.json``, recorded on another machine under the same cap. This runs
the fixture runs named by ``--runs`` (default: ``paged-tiny``, the plain paged step, and
``fuyou-tiny``) once under each cap of ``--caps`` (``none``: no cap, XLA's default for this
CPU) in child processes of that test module, and records per cap the digests and whether
they equal the recorded ones. On a machine the fixtures hold on, the SSE4.2 column equals
the file; a cap column that differs from another shows that the instruction set changes the
bits here, so that pinning it is what makes the fixtures portable.

    python bench/investigations/isa_bits.py                  # every cap, two runs
    python bench/investigations/isa_bits.py --caps none SSE4_2 --runs paged-tiny
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the result writer
from _common.results import write_result  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "bitwise.json"
MODULE = ROOT / "tests" / "test_bitwise_fixtures.py"
CAPS = ("none", "AVX512", "AVX2", "AVX", "SSE4_2")
DIGESTS = ("params", "opt_state", "store", "checkpoint_pages", "losses")


def cpu() -> dict:
    """The CPU's model name and the vector extensions that decide XLA's default target."""
    info = Path("/proc/cpuinfo").read_text()
    lines = info.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if "model name" in ln), "?")
    vendor = next((ln.split(":", 1)[1].strip() for ln in lines if "vendor_id" in ln), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return {
        "vendor": vendor,
        "model": model,
        "avx512f": "avx512f" in flags,
        "avx2": "avx2" in flags,
        "fma": "fma" in flags,
    }


def run(name: str, cap: str, root: Path) -> dict:
    """Fixture run ``name`` in a child of the test module under ``cap``: its digests."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    flags = "--xla_force_host_platform_device_count=4"
    if cap != "none":
        flags += f" --xla_cpu_max_isa={cap}"
    env.update(XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(MODULE), "--one", name, str(root / f"{name}-{cap}")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        sys.exit(f"isa_bits: {name} under {cap} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps", nargs="+", default=list(CAPS), choices=CAPS)
    ap.add_argument("--runs", nargs="+", default=["paged-tiny", "fuyou-tiny"])
    ap.add_argument("--json", help="the result file (default: bench/results/isa_bits/)")
    args = ap.parse_args(argv)
    recorded = json.loads(FIXTURES.read_text())
    records: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            records[name] = {}
            for cap in args.caps:
                got = run(name, cap, Path(tmp))
                want = recorded["runs"][name]
                same = {k: got[k] == want[k] for k in DIGESTS}
                records[name][cap] = {"digests": got, "equal_to_recorded": same}
                print(f"{name:12s} {cap:7s} equal to the recorded fixture: {all(same.values())}")
    summary = {
        "cpu": cpu(),
        "recorded_on": recorded["machine"],
        "recorded_cap": recorded["xla_cpu_max_isa"],
        "pinned_cap_equals_recorded": {
            n: all(r[recorded["xla_cpu_max_isa"]]["equal_to_recorded"].values())
            for n, r in records.items()
            if recorded["xla_cpu_max_isa"] in r
        },
        # per run, the caps grouped by the params digest they end with
        "params_digest_groups": {
            n: _groups({cap: r[cap]["digests"]["params"] for cap in r}) for n, r in records.items()
        },
    }
    print(json.dumps(summary, indent=1))
    path = write_result(
        "isa_bits", args=vars(args), summary=summary, records=records, path=args.json
    )
    print(f"result: {path}")


def _groups(by_cap: dict[str, str]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for cap, digest in by_cap.items():
        groups.setdefault(digest, []).append(cap)
    return list(groups.values())


if __name__ == "__main__":
    main()

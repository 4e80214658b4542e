"""The performance gate of the one-transaction pager: the old paging path (commit 8abcffe: five
FFI targets with device-scalar metadata and three host callbacks a step) against this tree,
paired in one run on one machine, interleaved: old, new, old, new, ...

Each pair runs ``bench/fuyou.py`` (Fuyou's step / max(compute-only, pure I/O)) and
``bench/paged_step.py`` (the paged step / the in-RAM step) from the old tree and from this one,
every figure a ratio against a baseline measured in the same process; the gate compares the
medians of those ratios (new / old: at most 1.05 passes).

The old tree is a checkout of 8abcffe with jaxoff built and installed into a folder of its own:

    git worktree add /tmp/old 8abcffe
    pip install --no-deps --target /tmp/oldsite /tmp/old
    python bench/investigations/pager_gate.py --old-tree /tmp/old --old-site /tmp/oldsite \\
        --json bench/results/pager_gate/2026-11-29.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
from _common.results import write_result  # noqa: E402

# runs a bench script of the old tree with the old jaxoff first on the path (and this tree's
# editable install out of the way)
RUNNER = """
import runpy, sys
sys.meta_path[:] = [m for m in sys.meta_path
                    if "skbc" not in repr(m).lower() and "editable" not in repr(m).lower()]
sys.path.insert(0, sys.argv[1])
script = sys.argv[2]
sys.path.insert(0, script.rsplit("/", 1)[0])
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""

GATES = {
    # bench: (its arguments, the figure compared)
    "fuyou": (
        ["--model", "mini", "--batch", "4", "--steps", "5", "--rounds", "5"],
        "fuyou_over_bound",
    ),
    "paged_step": ([], "paged_over_compute_only"),
}


def run(side: str, bench: str, args, old_tree: str, old_site: str, out: Path) -> dict:
    extra, _ = GATES[bench]
    if side == "old":
        cmd = [sys.executable, "-c", RUNNER, old_site, f"{old_tree}/bench/{bench}.py"]
    else:
        cmd = [sys.executable, str(BENCH / f"{bench}.py")]
    cmd += [*extra, "--json", str(out)]
    print(f"== {side} {bench}: {' '.join(cmd[-len(extra) - 2 :])}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
    if proc.returncode != 0:
        sys.exit(f"{side} {bench} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    doc = json.loads(out.read_text())
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-tree", required=True)
    ap.add_argument("--old-site", required=True)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--benches", nargs="+", default=list(GATES), choices=list(GATES))
    ap.add_argument("--timeout-s", type=int, default=1800)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pager_gate_"))
    runs: dict[str, dict[str, list]] = {b: {"old": [], "new": []} for b in args.benches}
    for i in range(args.pairs):
        for bench in args.benches:
            for side in ("old", "new"):
                doc = run(
                    side,
                    bench,
                    args,
                    args.old_tree,
                    args.old_site,
                    tmp / f"{side}-{bench}-{i}.json",
                )
                figure = doc["summary"][GATES[bench][1]]
                print(f"   {GATES[bench][1]} = {figure:.3f}", flush=True)
                runs[bench][side].append(
                    {"figure": figure, "commit": doc.get("commit"), "summary": doc["summary"]}
                )
    summary = {}
    for bench in args.benches:
        name = GATES[bench][1]
        old = statistics.median(r["figure"] for r in runs[bench]["old"])
        new = statistics.median(r["figure"] for r in runs[bench]["new"])
        summary[bench] = {
            "figure": name,
            "old_median": old,
            "new_median": new,
            "new_over_old": new / old,
            "passes": new / old <= 1.05,
            "old_runs": [r["figure"] for r in runs[bench]["old"]],
            "new_runs": [r["figure"] for r in runs[bench]["new"]],
        }
        print(
            f"{bench}: {name} median old {old:.3f}, new {new:.3f}: new/old {new / old:.3f} "
            f"({'passes' if new / old <= 1.05 else 'FAILS'} the 1.05 gate)"
        )
    if args.json:
        out = write_result(
            "pager_gate", args=vars(args), summary=summary, records=runs, path=args.json
        )
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""The planner's benches, one subcommand each (``python bench/plan.py SUBCOMMAND --help``).

  validate  priced plans (and the cost model alone) against the full-depth compile, and
            the MILP's plan against the fastest fitting preset under a budget
  options   priced temporaries against the step ``jaxoff train`` compiles, with and without
            ``jaxoff.compiler_options``
  depth     how a scanned step's temporaries grow with depth (the depths the pricing compiles)
  probe     predicted against measured temporaries on one held-out shape (cost model only)

    python bench/plan.py validate --models tiny,llama-tiny --shapes 3x149 --layers 16 --quick
    python bench/plan.py options --models tiny mini --json bench/results/plan_options/NAME.json
    python bench/plan.py depth --json bench/results/plan_depth/NAME.json
    python bench/plan.py probe gpt-d48h3-b3s149 float32 all

Each writes its result under ``bench/results/plan_<subcommand>/`` (``_common/results.py``).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: _plan, _common

SUBCOMMANDS = ("validate", "options", "depth", "probe")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    if not argv or argv[0] not in SUBCOMMANDS:
        sys.exit(f"usage: bench/plan.py {{{','.join(SUBCOMMANDS)}}} ...\n\n{__doc__}")
    importlib.import_module(f"_plan.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    main()

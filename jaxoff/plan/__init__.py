"""Memory-budget planner: profile a model's residuals, choose where every tensor lives.

``jaxoff plan --model xl --hardware rtx4090 --batch 8 --seq 1024`` profiles the model
(jaxpr + compiled memory analysis), solves a MILP for the fastest plan that fits the
budgets, prices the plans with the compiled program (4- and 8-layer copies, extrapolated
in depth: `Pricer`, `solve_priced`) and re-solves until the priced plan fits, prints it
beside a greedy baseline and presets, and writes a plan file that ``jaxoff train --plan
FILE`` runs. `measured_temp_bytes` compiles a plan's full-depth step for comparison.
"""

from ._calibrate import profile as profile
from ._config import PlanConfig as PlanConfig
from ._config import compared_presets as compared_presets
from ._config import make_plan as make_plan
from ._config import preset_plan as preset_plan
from ._config import run as run
from ._cost import Plan as Plan
from ._cost import Prediction as Prediction
from ._cost import brute_force as brute_force
from ._cost import evaluate as evaluate
from ._greedy import greedy as greedy
from ._hardware import PRESETS as HARDWARE_PRESETS
from ._hardware import Hardware as Hardware
from ._hardware import calibrate as calibrate
from ._hardware import parse_size as parse_size
from ._hardware import preset as preset
from ._hardware import total_ram as total_ram
from ._jaxpr import jaxpr_flops as jaxpr_flops
from ._planfile import PlanFile as PlanFile
from ._planfile import apply_plan as apply_plan
from ._planfile import load_plan as load_plan
from ._price import Pricer as Pricer
from ._price import solve_priced as solve_priced
from ._profile import NameProfile as NameProfile
from ._profile import Profile as Profile
from ._profile import measured_temp_bytes as measured_temp_bytes
from ._solver import InfeasibleError as InfeasibleError
from ._solver import smallest_budget as smallest_budget
from ._solver import solve as solve

__all__ = [
    "HARDWARE_PRESETS",
    "Hardware",
    "InfeasibleError",
    "NameProfile",
    "Plan",
    "PlanConfig",
    "PlanFile",
    "Prediction",
    "Pricer",
    "Profile",
    "apply_plan",
    "brute_force",
    "calibrate",
    "compared_presets",
    "evaluate",
    "greedy",
    "jaxpr_flops",
    "load_plan",
    "make_plan",
    "measured_temp_bytes",
    "parse_size",
    "preset",
    "total_ram",
    "preset_plan",
    "profile",
    "run",
    "smallest_budget",
    "solve",
    "solve_priced",
]

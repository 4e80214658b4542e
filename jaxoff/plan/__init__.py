"""Memory-budget planner: profile a model's residuals, choose where every tensor lives.

``jaxoff plan --model xl --hardware rtx4090 --batch 8 --seq 1024`` profiles the model
(jaxpr + compiled memory analysis), solves a MILP for the fastest plan that fits the
budgets, prices the plans with the compiled program (4- and 8-layer copies, extrapolated
in depth; ``_price``) and re-solves until the priced plan fits, prints it beside a greedy
baseline and presets, and writes a plan file that ``jaxoff train --plan FILE`` runs.
"""

from ._calibrate import profile as profile
from ._config import PlanConfig as PlanConfig
from ._config import make_plan as make_plan
from ._config import run as run
from ._cost import Plan as Plan
from ._cost import Prediction as Prediction
from ._cost import brute_force as brute_force
from ._cost import evaluate as evaluate
from ._greedy import greedy as greedy
from ._hardware import PRESETS as HARDWARE_PRESETS
from ._hardware import Hardware as Hardware
from ._hardware import calibrate as calibrate
from ._hardware import preset as preset
from ._planfile import PlanFile as PlanFile
from ._planfile import apply_plan as apply_plan
from ._planfile import load_plan as load_plan
from ._profile import NameProfile as NameProfile
from ._profile import Profile as Profile
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
    "Profile",
    "apply_plan",
    "brute_force",
    "calibrate",
    "evaluate",
    "greedy",
    "load_plan",
    "make_plan",
    "preset",
    "profile",
    "run",
    "smallest_budget",
    "solve",
]

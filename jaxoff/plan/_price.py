"""Pricing a plan with the compiled program: device temporaries from compiles of shallow
copies of the model, extrapolated in depth.

The cost model (:func:`jaxoff.plan._cost.evaluate`) is linear so that the MILP can search
it, and its workspace term is a calibrated approximation: which recomputations XLA's
scheduler defers into a layer's backward pass depends on the block and the shape, so
partial plans are mispriced (by how much: ``docs/guide/planner.md``). A
:class:`Pricer` replaces that term by the compiler's own figure:

* the scanned train step under a plan is compiled at two shallow depths (4 and 8 layers
  by default, the same batch, sequence, widths and dtypes); its
  ``memory_analysis().temp_size_in_bytes`` is linear in the depth (stacked residuals and
  stacked gradients grow by one layer's bytes per layer, the loop's workspace does not),
  so the two figures extrapolate to the model's depth. A model at most as deep as the
  deeper copy is compiled as it is.
* the correction (compiled minus modelled temporaries of the same program, with
  parameters and optimizer states on device) is added to the model's prediction of the
  plan, so its homes (parameters streamed or paged, states off device) are still
  modelled as before.

:func:`solve_priced` closes the loop: the MILP chooses with the linear model, the
compiled price checks, and the device budget the MILP sees is moved by the measured
error until the priced plan fits (and no faster one does).
"""

from __future__ import annotations

import dataclasses
import time

import jax

from .._errors import ConfigError
from ._cost import Plan, Prediction, evaluate, fits
from ._hardware import Hardware
from ._profile import Profile, _plain, measured_temp_bytes
from ._solver import InfeasibleError, solve

# Two depths past the shallowest (a scanned step's compile time does not grow with its
# depth): XLA shares some buffers with the stacked ones at small depths, so the per-layer
# growth between 2 and 4 layers is below the growth further down (float32: extrapolating
# from 2 and 4 layers to 24 errs by up to 2.7%, from 4 and 8 by up to 1.3%;
# bench/results/plan_depth/2026-11-24.json). Depth 1 would be another program: XLA drops a scan of
# length 1.
PRICE_DEPTHS = (4, 8)
MAX_ROUNDS = 8  # MILP solves in solve_priced (a compile pair only for each new plan)
TOLERANCE = 0.005  # of the device budget: a priced plan this close to its limit ends the search
# of the device budget, kept free for the extrapolation's own error: from 4 and 8 layers to
# 12-24 it was within 1.3% in float32 and 4.2% in bfloat16 (XLA's CPU backend, whose
# widening of bfloat16 varies with depth) on the probes of bench/plan.py depth
# (bench/results/plan_depth/2026-11-24.json)
MARGIN = 0.05


class Pricer:
    """Compiled device temporaries of plans of one profiled model (cached per plan).

    Args:
        prof: the model's profile (batch, sequence and depth come from it).
        model_cfg: the model config the profile was taken of.
        depths: the two shallow depths compiled.

    Example:
        >>> from jaxoff.models.gpt import CONFIGS  # doctest: +SKIP
        >>> prof = profile(CONFIGS["small"], 8, 512)  # doctest: +SKIP
        >>> Pricer(prof, CONFIGS["small"]).price(hw, plan).device_temp_bytes  # doctest: +SKIP
    """

    def __init__(self, prof: Profile, model_cfg, depths: tuple[int, int] = PRICE_DEPTHS):
        if len(depths) != 2 or not 2 <= depths[0] < depths[1]:
            raise ValueError(f"depths {depths!r}: two increasing depths of at least 2")
        self.prof = prof
        self.model_cfg = model_cfg
        self.depths = depths
        self.compiles = 0
        self.compile_s = 0.0
        self._temps: dict[tuple, int] = {}

    def _compiled_temp(self, actions: dict[str, str], depth: int) -> int:

        try:
            cfg = dataclasses.replace(_plain(self.model_cfg), num_layers=depth)
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"cannot price plans on a {depth}-layer copy of the model ({e}); plan with "
                f"--no-price to use the cost model alone"
            ) from None
        t0 = time.perf_counter()
        temp = measured_temp_bytes(self.prof, cfg, actions)
        self.compile_s += time.perf_counter() - t0
        self.compiles += 1
        return temp

    def describe(self) -> str:
        """How plans are priced, for a report."""
        if self.prof.num_layers <= self.depths[1]:
            return f"compiles of the {self.prof.num_layers}-layer model"
        return f"compiles of {self.depths[0]}- and {self.depths[1]}-layer copies"

    def temp_bytes(self, actions: dict[str, str]) -> int:
        """``temp_size_in_bytes`` of the model's scanned step under ``actions``
        (parameters and states on device), from the shallow compiles."""
        key = tuple(sorted(actions.items()))
        if key not in self._temps:
            L = self.prof.num_layers
            lo, hi = self.depths
            if L <= hi:
                self._temps[key] = self._compiled_temp(actions, L)
            else:
                t_lo = self._compiled_temp(actions, lo)
                t_hi = self._compiled_temp(actions, hi)
                self._temps[key] = int(round(t_lo + (L - lo) * (t_hi - t_lo) / (hi - lo)))
        return self._temps[key]

    def price(self, hw: Hardware, plan: Plan, *, cpu_lowering: bool = False) -> Prediction:
        """``evaluate(prof, hw, plan)`` with its device temporaries (and so its device
        bytes) corrected by the compiled program.

        The compile runs on this process's JAX backend; ``cpu_lowering`` of the
        correction's modelled side follows that backend (on XLA's CPU backend offloaded
        residuals stay in device temporaries), whatever the target's ``cpu_lowering``.
        """

        pred = evaluate(self.prof, hw, plan, cpu_lowering=cpu_lowering)
        same = dataclasses.replace(plan, params="device", opt="device")
        local_cpu = jax.default_backend() == "cpu"
        modelled = evaluate(self.prof, hw, same, cpu_lowering=local_cpu).device_temp_bytes
        delta = self.temp_bytes(dict(plan.actions)) - modelled
        return dataclasses.replace(
            pred,
            device_temp_bytes=pred.device_temp_bytes + delta,
            device_bytes=pred.device_bytes + delta,
        )


@dataclasses.dataclass(frozen=True)
class PricedSolve:
    """What :func:`solve_priced` found: the plan, its priced prediction, the model's
    prediction of it, and every (device budget given to the MILP, plan, priced
    prediction) it tried."""

    plan: Plan
    pred: Prediction
    modelled: Prediction
    rounds: tuple[tuple[float, Plan, Prediction], ...]


def solve_priced(
    prof: Profile,
    hw: Hardware,
    pricer: Pricer,
    *,
    cpu_lowering: bool = False,
    rounds: int = MAX_ROUNDS,
    margin: float = MARGIN,
    **solve_kw,
) -> PricedSolve:
    """The fastest plan whose *compiled* price fits ``hw``'s budgets, less ``margin`` of
    the device budget (kept for the error of the extrapolation in depth).

    Solves the MILP at the device budget, prices its plan, and re-solves at the budget
    moved by the priced plan's distance from the real one (down when the model
    under-predicted, up when it over-predicted). Once one budget's plan fits and
    another's does not, later budgets stay between them (bisecting when a plan
    repeats); before that, a repeated plan doubles the step (at least ``TOLERANCE`` of
    the budget). Stops after ``rounds`` solves, or when a plan fits within
    ``TOLERANCE`` of the budget. Returns the fastest (predicted step time) priced plan
    that fits.

    Raises:
        InfeasibleError: no plan fits, or no tried plan's compiled price does.
    """

    budget = hw.device_mem  # the first solve: the cost model's own plan
    limit = hw.device_mem * (1 - margin)
    capped = hw.with_budgets(device_mem=limit)
    tol = TOLERANCE * hw.device_mem
    tried: list[tuple[float, Plan, Prediction]] = []
    seen: set[Plan] = set()
    lo = hi = None  # largest MILP budget whose plan fits, smallest whose plan does not
    stride = 1.0  # doubles while the MILP keeps returning a plan already priced
    for _ in range(rounds):
        try:
            plan = solve(
                prof, hw.with_budgets(device_mem=budget), cpu_lowering=cpu_lowering, **solve_kw
            )
        except InfeasibleError:
            if not tried:  # at the real budget: the model's own message
                raise
            lo, plan = budget, None  # below the model's smallest plan: search above
        if plan is not None:
            repeated = plan in seen
            seen.add(plan)
            priced = pricer.price(hw, plan, cpu_lowering=cpu_lowering)
            if not repeated:
                tried.append((budget, plan, priced))
            over = priced.device_bytes - limit
            if over <= 0:
                lo = budget if lo is None else max(lo, budget)
                if -over <= tol:
                    break  # fits with less than the tolerance left over
            else:
                hi = budget if hi is None else min(hi, budget)
            stride = 2 * stride if repeated else 1.0
            # the budget at which this plan's price would just fit (further on repeats)
            nxt = budget - stride * (max(over, tol) if over > 0 else min(over, -tol))
        if lo is not None and hi is not None:
            if hi - lo <= tol:
                break
            if plan is None or repeated or not lo < nxt < hi:
                nxt = (lo + hi) / 2  # bisect the bracket
        elif plan is None:
            break
        if nxt <= 0:
            break
        budget = nxt
    ok = [(b, p, e) for b, p, e in tried if fits(e, capped)]
    if not ok:
        _, plan, priced = min(tried, key=lambda t: t[2].device_bytes)
        raise InfeasibleError(
            f"no plan's compiled price fits device memory {hw.device_mem:.4g} B less a "
            f"{margin:.0%} margin: the smallest tried needs {priced.device_bytes:.4g} B (the "
            f"cost model predicted less); raise --device-mem, lower --batch-size or "
            f"--seq-len, or plan with --no-price to use the cost model alone"
        )
    _, plan, priced = min(ok, key=lambda t: t[2].step_s)
    return PricedSolve(
        plan, priced, evaluate(prof, hw, plan, cpu_lowering=cpu_lowering), tuple(tried)
    )

"""The greedy baseline, reported beside the MILP: start with everything on device and
take, one at a time, the move that frees the most device bytes per second of step time
it adds, until the plan fits (in the spirit of MaxText's remat-policy estimator, which
walks tensors from "keep" to "offload"/"remat" by benefit).
"""

from __future__ import annotations

from ._cost import HOMES, Plan, Prediction, allowed_homes, choices, evaluate, fits
from ._hardware import Hardware
from ._profile import Profile
from ._solver import restrict


def _moves(prof: Profile, plan: Plan, allowed):
    opts = choices(prof, allowed)
    acts = dict(plan.actions)
    for n, options in opts.items():
        for a in options:
            if a != acts[n] and (acts[n], a) in (
                ("device", "offload"),
                ("device", "remat"),
                ("offload", "remat"),
            ):
                yield Plan(
                    tuple((k, a if k == n else v) for k, v in plan.actions), plan.params, plan.opt
                )
    homes = allowed_homes(prof)
    for field in ("params", "opt"):
        i = HOMES.index(getattr(plan, field))
        for home in HOMES[i + 1 :]:
            kw = {"params": plan.params, "opt": plan.opt, field: home}
            if (kw["params"], kw["opt"]) in homes:
                yield Plan(plan.actions, **kw)


def greedy(
    prof: Profile, hw: Hardware, *, allowed=None, cpu_lowering: bool = False, actions=None
) -> tuple[Plan, Prediction] | tuple[None, None]:
    """The greedy plan and its prediction, or ``(None, None)`` if it finds none that fits.

    ``actions`` restricts every name to those actions (e.g. ``("device", "remat")``).
    """

    allowed = restrict(prof, allowed, actions)
    opts = choices(prof, allowed)
    start = {n: ("device" if "device" in o else o[0]) for n, o in opts.items()}
    plan = Plan.from_actions(prof, start)
    pred = evaluate(prof, hw, plan, cpu_lowering=cpu_lowering)
    while not fits(pred, hw):
        best = None
        for cand in _moves(prof, plan, allowed):
            p = evaluate(prof, hw, cand, cpu_lowering=cpu_lowering)
            freed = pred.device_bytes - p.device_bytes
            if freed <= 0 or p.host_bytes > hw.host_mem or p.disk_bytes > hw.disk:
                continue
            score = freed / max(p.step_s - pred.step_s, 1e-12)
            if best is None or score > best[0]:
                best = (score, cand, p)
        if best is None:
            return None, None
        _, plan, pred = best
    return plan, pred

"""Static planners over the profile (``jaxoff.plan``): Checkmate's optimal remat, DTR's
eviction heuristic, Capuchin's swap-or-recompute choice.

Each returns ``{name: action}`` for the free residual names of one block; the same plan
applies to every layer (XLA compiles the scanned block once), and the planner's cost
model (:func:`jaxoff.plan.evaluate`, as on the context's accelerator: offloaded residuals
leave device memory) decides whether it fits ``Context.device_mem``.
"""

from __future__ import annotations

from .._errors import ConfigError
from ..plan import InfeasibleError, Plan, evaluate, solve
from ..policy import Policy
from ._recipe import Context


def _fits_or_raise(ctx: Context, prof, hw, plan, who: str):
    pred = evaluate(prof, hw, plan)
    if pred.device_bytes > hw.device_mem:
        raise InfeasibleError(
            f"{who}: no plan fits {hw.device_mem / 2**20:,.0f} MiB of device memory for "
            f"model {ctx.model} at batch {ctx.batch} x seq {ctx.seq} (even recomputing "
            f"everything it may needs {pred.device_bytes / 2**20:,.0f} MiB); raise "
            f"`device_mem` or lower `batch_size` / `seq_len`"
        )
    return pred


def checkmate_actions(ctx: Context) -> dict[str, str]:
    """The MILP's fastest plan with every name kept on device or recomputed, parameters
    and optimizer states on device (``jaxoff.plan.solve(actions=("device", "remat"))``)."""

    plan = solve(ctx.profile(), ctx.hw(), actions=("device", "remat"), homes=[("device", "device")])
    return dict(plan.actions)


def dtr_actions(ctx: Context) -> dict[str, str]:
    """DTR's heuristic as a static plan: while the plan does not fit, evict (recompute) the
    kept name of least ``cost / (bytes x staleness)``.

    * cost: FLOPs to recompute it, plus those of evicted names it is computed from (DTR's
      evicted neighbourhood, ``e*``: recomputing it recomputes them too);
    * staleness: time since its last use when memory peaks (the end of the forward pass):
      half the layers' forward on average plus the block's forward after it is made;
    * bytes: its stacked size.
    """

    prof, hw = ctx.profile(), ctx.hw()
    names = [n for n in prof.names if not n.fixed]
    by = {n.name: n for n in prof.names}
    layer_fwd = sum(n.flops for n in prof.names)
    after = {}
    for i, n in enumerate(prof.names):
        after[n.name] = sum(m.flops for m in prof.names[i + 1 :])
    actions = {n.name: "device" for n in names}

    def cost(name: str, seen: set[str]) -> float:
        total = by[name].flops
        for p in by[name].preds:
            if p not in seen and actions.get(p) == "remat":
                seen.add(p)
                total += cost(p, seen)
        return total

    while True:
        plan = Plan.from_actions(prof, actions)
        pred = evaluate(prof, hw, plan)
        if pred.device_bytes <= hw.device_mem:
            return dict(plan.actions)
        kept = [n for n in names if actions[n.name] == "device" and n.name in pred.needed]
        if not kept:
            _fits_or_raise(ctx, prof, hw, plan, "dtr_greedy")
        stale = {n.name: prof.num_layers / 2 * layer_fwd + after[n.name] for n in kept}
        worst = min(kept, key=lambda n: cost(n.name, {n.name}) / (n.bytes * stale[n.name] + 1e-30))
        actions[worst.name] = "remat"


def capuchin_actions(ctx: Context) -> dict[str, str]:
    """Capuchin's per-tensor choice as a static plan: take names largest first until the
    plan fits; swap one out (offload) while its transfer (out and back, every layer) hides
    behind the step's compute, else pick whichever of swapping or recomputing adds less
    time (the transfer not hidden vs its recompute FLOPs)."""

    prof, hw = ctx.profile(), ctx.hw()
    L = prof.num_layers
    compute_s = prof.base_flops / hw.flops
    link_s = 0.0
    actions = {n.name: "device" for n in prof.names if not n.fixed}
    plan = Plan.from_actions(prof, actions)
    pred = evaluate(prof, hw, plan)
    for n in sorted((n for n in prof.names if not n.fixed), key=lambda n: -n.bytes):
        if pred.device_bytes <= hw.device_mem:
            break
        if n.name not in pred.needed:
            continue
        swap_s = 2 * L * n.bytes / hw.link
        exposed = max(0.0, link_s + swap_s - compute_s) - max(0.0, link_s - compute_s)
        recompute_s = L * n.flops / hw.flops
        if exposed <= recompute_s:
            actions[n.name] = "offload"
            link_s += swap_s
        else:
            actions[n.name] = "remat"
        plan = Plan.from_actions(prof, actions)
        pred = evaluate(prof, hw, plan)
    _fits_or_raise(ctx, prof, hw, plan, "capuchin")
    return dict(plan.actions)


def policy_spelling(actions: dict[str, str]) -> str:
    """``{name: action}`` as a ``jaxoff.policy`` spelling (``a=remat,...,*=device``)."""

    if not actions:
        raise ConfigError("empty plan")
    # the planners give every residual name of the model an action
    return Policy.from_mapping(actions, names=tuple(actions)).describe()

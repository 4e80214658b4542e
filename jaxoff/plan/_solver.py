"""The exact planner: a mixed-integer linear program solved by HiGHS (``scipy.optimize.milp``).

It encodes :func:`jaxoff.plan._cost.evaluate` linearly (tests check both agree, and that
the MILP's optimum equals brute-force enumeration on small cases):

* per free name ``n``: binaries ``d, o, m`` (device, offload, remat; one of them),
  ``u`` (needed), ``z >= u + m - 1`` (recomputed), ``w >= u + d - 1`` (kept on
  device), ``v >= u + o - 1`` (offloaded); ``u = 1`` for names the backward pass reads,
  ``u_p >= z_n`` for each predecessor ``p`` of ``n`` (a recomputed name needs its inputs);
* one binary per (params home, optimizer-state home) pair; its bytes and seconds are
  constants (``_cost.home_costs``);
* ``e >= 0`` is transfer time not hidden behind compute: ``e >= link_bytes / link -
  compute`` and ``e >= disk_s - compute``;
* minimise compute + recompute + ``e`` + optimizer update, subject to the device, host
  and disk budgets.

Every lower bound above is tight at an optimum: raising ``u, z, w, v`` or ``e`` never
lowers time or bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from .._errors import ConfigError
from ._cost import ACTIONS, Plan, allowed_homes, choices, home_costs
from ._hardware import GIB, Hardware
from ._profile import Profile
from ._report import fmt_bytes


class InfeasibleError(ConfigError):
    """No plan fits the budgets; the message gives the smallest budget that would."""


@dataclasses.dataclass
class _Model:
    names: list[str]
    homes: list[tuple[str, str]]
    index: dict
    n: int


def _build(prof: Profile, allowed, homes):
    opts = choices(prof, allowed)
    names = list(opts)
    pairs: list[tuple[str, str]] = list(homes or allowed_homes(prof))
    index = {}
    k = 0
    for n in names:
        for var in ("d", "o", "m", "u", "z", "w", "v"):
            index[(var, n)] = k
            k += 1
    for h in pairs:
        index[("y", h)] = k
        k += 1
    index["e"] = k
    return _Model(names, pairs, index, k + 1), opts


def _exprs(prof: Profile, hw: Hardware, mdl: _Model, cpu_lowering: bool) -> dict[str, Any]:
    """Linear expressions (coefficient vectors + constants) of the model's quantities."""
    L, ix, N = prof.num_layers, mdl.index, mdl.n
    by = {p.name: p for p in prof.names}

    def vec():
        return np.zeros(N)

    time_c, dev_c, host_c, disk_c, link_c, disks_c = vec(), vec(), vec(), vec(), vec(), vec()
    compute0 = prof.base_flops / hw.flops
    widening = prof.kept_widening if cpu_lowering else 1.0
    micro = prof.grad_accum  # recompute and offload traffic: once per micro-batch
    for n in mdl.names:
        b = L * by[n].bytes / GIB
        time_c[ix[("z", n)]] = micro * L * by[n].flops / hw.flops
        dev_c[ix[("z", n)]] = prof.recompute_workspace * by[n].bytes / GIB
        dev_c[ix[("w", n)]] = widening * b
        if cpu_lowering:
            dev_c[ix[("v", n)]] = widening * b
        else:
            host_c[ix[("v", n)]] = b
        link_c[ix[("v", n)]] = micro * 2 * b * GIB / hw.link  # seconds
    for h in mdl.homes:
        c = home_costs(prof, hw, *h)
        j = ix[("y", h)]
        dev_c[j], host_c[j], disk_c[j] = c["dev"] / GIB, c["host"] / GIB, c["disk"] / GIB
        link_c[j] = c["link"] / hw.link
        disks_c[j] = c["disk_s"]
        time_c[j] = c["opt_s"]
    dev0 = (prof.workspace_bytes + prof.fixed_residual_bytes) / GIB
    if hw.shared_memory:
        dev_c, host_c = dev_c + host_c, np.zeros(N)
    return dict(
        time=time_c,
        compute0=compute0,
        dev=dev_c,
        dev0=dev0,
        host=host_c,
        disk=disk_c,
        link=link_c,
        disk_s=disks_c,
    )


def _structure(prof: Profile, mdl: _Model, opts):
    """Rows of the plan's logic; returns (A rows, lb, ub) and variable bounds."""
    ix, N = mdl.index, mdl.n
    by = {p.name: p for p in prof.names}
    rows, lo, hi = [], [], []

    def row(coefs, lb, ub):
        r = np.zeros(N)
        for key, c in coefs:
            r[ix[key]] += c
        rows.append(r)
        lo.append(lb)
        hi.append(ub)

    lb, ub = np.zeros(N), np.ones(N)
    for n in mdl.names:
        row([(("d", n), 1), (("o", n), 1), (("m", n), 1)], 1, 1)
        for var, act in zip("dom", ACTIONS, strict=True):
            if act not in opts[n]:
                ub[ix[(var, n)]] = 0
        if by[n].direct:
            lb[ix[("u", n)]] = 1
        row([(("z", n), 1), (("u", n), -1), (("m", n), -1)], -1, np.inf)
        row([(("w", n), 1), (("u", n), -1), (("d", n), -1)], -1, np.inf)
        row([(("v", n), 1), (("u", n), -1), (("o", n), -1)], -1, np.inf)
        for p in by[n].preds:
            if p in opts:
                row([(("u", p), 1), (("z", n), -1)], 0, np.inf)
    row([(("y", h), 1) for h in mdl.homes], 1, 1)
    ub[ix["e"]] = np.inf
    return rows, lo, hi, lb, ub


def _solve(prof, hw, allowed, homes, cpu_lowering, objective: str, budgets: set[str]):
    mdl, opts = _build(prof, allowed, homes)
    ex = _exprs(prof, hw, mdl, cpu_lowering)
    rows, lo, hi, lb, ub = _structure(prof, mdl, opts)
    ix = mdl.index
    recompute = ex["time"].copy()
    for h in mdl.homes:
        recompute[ix[("y", h)]] = 0.0  # z terms only: compute time that hides transfers
    for key in ("link", "disk_s"):  # e >= busy - compute0 - recompute
        r = -ex[key] + recompute
        r[ix["e"]] = 1.0
        rows.append(r)
        lo.append(-ex["compute0"])
        hi.append(np.inf)
    caps = {"dev": hw.device_mem, "host": hw.host_mem, "disk": hw.disk}
    consts = {"dev": ex["dev0"], "host": 0.0, "disk": 0.0}
    for tier in budgets:
        if tier == "host" and hw.shared_memory:
            continue
        rows.append(ex[tier])
        lo.append(-np.inf)
        hi.append(caps[tier] / GIB - consts[tier])
    if objective == "time":
        c = ex["time"].copy()
        c[ix["e"]] = 1.0
    else:
        c = ex[objective].copy()
        c[ix["e"]] = 1e-9  # keep e at its bound
    # HiGHS's MIP gap is absolute (1e-6) as well as relative: bring the objective to ~1e6
    scale = 1e6 / max(float(np.abs(c).max()), ex["compute0"], 1e-30)
    c = c * scale
    integrality = np.ones(mdl.n)
    integrality[ix["e"]] = 0
    res = milp(
        c,
        # scipy's stubs type the bounds as scalars; per-row/per-variable arrays are documented
        constraints=LinearConstraint(np.array(rows), lo, hi),  # pyright: ignore[reportArgumentType]
        integrality=integrality,
        bounds=Bounds(lb, ub),  # pyright: ignore[reportArgumentType]
        options={"mip_rel_gap": 1e-9},
    )
    if res.x is None:
        return None, None
    x = np.round(res.x).astype(int)
    acts = {}
    for n in mdl.names:
        acts[n] = next(a for var, a in zip("dom", ACTIONS, strict=True) if x[ix[(var, n)]])
    params, opt = next(h for h in mdl.homes if x[ix[("y", h)]])
    plan = Plan.from_actions(prof, acts, params=params, opt=opt)
    value = float(res.fun) / scale + (ex["dev0"] if objective == "dev" else 0.0)
    if objective == "time":
        value += ex["compute0"]
    return plan, value


def restrict(prof: Profile, allowed=None, actions=None):
    """``allowed`` narrowed so that every free name picks among ``actions`` only
    (``("device", "remat")``: Checkmate's problem, no offload); ``None`` leaves it."""
    if actions is None:
        return allowed
    unknown = [a for a in actions if a not in ACTIONS]
    if unknown or not actions:
        raise ConfigError(f"actions {tuple(actions)!r}: choose among {', '.join(ACTIONS)}")
    allowed = dict(allowed or {})
    return {
        n.name: tuple(a for a in allowed.get(n.name, ACTIONS) if a in actions)
        for n in prof.names
        if not n.fixed
    }


def solve(
    prof: Profile,
    hw: Hardware,
    *,
    allowed=None,
    homes=None,
    cpu_lowering: bool = False,
    actions=None,
) -> Plan:
    """The plan of least predicted step time that fits ``hw``'s budgets.

    Args:
        prof: the model's profile.
        hw: budgets and speeds.
        allowed: ``{name: actions}`` to narrow some names' choices.
        homes: ``(params, opt)`` pairs to consider (default: ``_cost.allowed_homes``, all
            nine without gradient accumulation).
        cpu_lowering: count offloaded residuals on device (XLA's CPU backend).
        actions: the only actions any name may take (e.g. ``("device", "remat")``).

    Raises:
        InfeasibleError: with the smallest device (or host, disk) budget that fits.

    Example:
        >>> from jaxoff.plan import profile, preset, solve  # doctest: +SKIP
        >>> plan = solve(profile(cfg, 8, 1024), preset("rtx4090"))  # doctest: +SKIP
    """
    allowed = restrict(prof, allowed, actions)
    plan, _ = _solve(prof, hw, allowed, homes, cpu_lowering, "time", {"dev", "host", "disk"})
    if plan is not None:
        return plan
    raise InfeasibleError(_infeasible_message(prof, hw, allowed, homes, cpu_lowering))


def smallest_budget(
    prof, hw, tier: str, *, allowed=None, homes=None, cpu_lowering=False, actions=None
) -> float | None:
    """Least bytes of ``tier`` (``dev``, ``host``, ``disk``) any plan needs, the other
    budgets held; ``None`` if none fits even then."""
    allowed = restrict(prof, allowed, actions)
    others = {"dev", "host", "disk"} - {tier}
    _, value = _solve(prof, hw, allowed, homes, cpu_lowering, tier, others)
    return None if value is None else float(value * GIB)


def _infeasible_message(prof, hw, allowed, homes, cpu_lowering) -> str:

    need_dev = smallest_budget(
        prof, hw, "dev", allowed=allowed, homes=homes, cpu_lowering=cpu_lowering
    )
    what = f"model {prof.model} at batch {prof.batch} x seq {prof.seq}"
    if need_dev is not None:
        return (
            f"no plan for {what} fits {fmt_bytes(hw.device_mem)} of device memory; the "
            f"smallest device budget that works is {fmt_bytes(need_dev)} (with "
            f"{fmt_bytes(hw.host_mem)} host, {fmt_bytes(hw.disk)} disk). Raise --device-mem, "
            f"or lower --batch / --seq"
        )
    loose = dataclasses.replace(hw, device_mem=float("inf"))
    need_host = smallest_budget(
        prof, loose, "host", allowed=allowed, homes=homes, cpu_lowering=cpu_lowering
    )
    need_disk = smallest_budget(
        prof,
        dataclasses.replace(loose, host_mem=float("inf")),
        "disk",
        allowed=allowed,
        homes=homes,
        cpu_lowering=cpu_lowering,
    )
    parts = []
    if need_host is not None and need_host > hw.host_mem:
        parts.append(f"--host-mem of at least {fmt_bytes(need_host)}")
    if need_disk is not None and need_disk > hw.disk:
        parts.append(f"--disk of at least {fmt_bytes(need_disk)}")
    return (
        f"no plan for {what} fits the budgets (device {fmt_bytes(hw.device_mem)}, host "
        f"{fmt_bytes(hw.host_mem)}, disk {fmt_bytes(hw.disk)}) even with everything off "
        f"device; it needs {' and '.join(parts) or 'more memory'}"
    )

"""The planner's cost model: what a plan costs in bytes per memory tier and in step time.

One function, :func:`evaluate`, is the reference: the MILP (``_solver``) encodes the same
model linearly, the greedy baseline and the brute-force enumeration call it directly, and
tests check that the three agree.

Model, per step (``L`` layers; per-name figures are per layer):

* a name is **needed** if the backward pass reads it (``direct``) or a needed name that is
  recomputed is computed from it (``preds``); a needed name is kept on device, copied to
  host (``offload``) or **recomputed** (``remat``, ``flops`` each layer);
* device temporaries = workspace (+ ``recompute_workspace`` x one layer's recomputed
  bytes) + stacked kept residuals (+ offloaded ones when the backend keeps them on
  device anyway, ``cpu_lowering``, where 16-bit ones also take ``kept_widening`` times
  their bytes);
* parameters ``device | host | nvme``: off device they stream one layer ahead over the
  host link (read in forward and backward, gradients back), which is hidden behind
  compute when the link is fast enough; ``nvme`` also reads them from and writes them to
  disk;
* optimizer states ``device | host | nvme``: the update runs after the backward pass and
  is not hidden; on host it is bound by host memory bandwidth (plus moving gradients
  down and parameters up), on NVMe also by disk read and write (pipelined, so the slowest
  of the three);
* step time = compute (base + recompute) + link/disk time not hidden behind compute +
  optimizer update.

With gradient accumulation (``Profile.grad_accum`` micro-batches a step, ``jaxoff train
--grad-accum``) the per-name figures are one micro-batch's: recomputation and the
offloaded residuals' traffic happen once per micro-batch, the optimizer update once per
step; the float32 accumulator is in the workspace (measured on the accumulating step);
and the parameters stay on the device (:func:`allowed_homes`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping

from ._hardware import Hardware
from ._profile import Profile

ACTIONS = ("device", "offload", "remat")
HOMES = ("device", "host", "nvme")
STAGING_BYTES = 3 * 64 * 2**20  # the paged optimizer's ~3 chunks in flight


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-name actions and the homes of parameters and optimizer states."""

    actions: tuple[tuple[str, str], ...]
    params: str = "device"
    opt: str = "device"

    @classmethod
    def from_actions(cls, prof: Profile, actions: Mapping[str, str], **kw) -> Plan:
        """Names not listed are recomputed; fixed names stay on device."""
        out = []
        for n in prof.names:
            a = "device" if n.fixed else actions.get(n.name, "remat")
            out.append((n.name, a))
        return cls(tuple(out), **kw)

    def action(self, name: str) -> str:
        return dict(self.actions)[name]


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What :func:`evaluate` predicts for one plan (bytes per step, seconds)."""

    device_bytes: int
    host_bytes: int
    disk_bytes: int
    device_temp_bytes: int
    compute_s: float
    recompute_s: float
    exposed_s: float
    optimizer_s: float
    link_bytes: int
    recomputed: tuple[str, ...]
    needed: tuple[str, ...]
    ram_tier_bytes: int = 0  # of the paged optimizer state, kept in host RAM (--host-mem)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.recompute_s + self.exposed_s + self.optimizer_s


def allowed_homes(prof: Profile) -> tuple[tuple[str, str], ...]:
    """The ``(params, opt)`` homes a plan of ``prof`` may choose: all nine, or with
    gradient accumulation only those with the parameters on the device (the trainer
    accumulates neither streamed parameters' gradients nor Fuyou's paged ones)."""
    params = HOMES if prof.grad_accum == 1 else ("device",)
    return tuple(itertools.product(params, HOMES))


def needed_and_recomputed(prof: Profile, plan: Plan) -> tuple[set[str], set[str]]:
    """Names the step needs (kept or recomputed) and those it recomputes."""
    by = {n.name: n for n in prof.names}
    needed = {n.name for n in prof.names if n.direct}
    stack = list(needed)
    while stack:
        n = stack.pop()
        if plan.action(n) == "remat" and not by[n].fixed:
            for p in by[n].preds:
                if p not in needed:
                    needed.add(p)
                    stack.append(p)
    recomputed = {n for n in needed if plan.action(n) == "remat" and not by[n].fixed}
    return needed, recomputed


def residual_split(prof: Profile, plan: Plan) -> tuple[int, int]:
    """Stacked residual bytes ``(on device, offloaded)`` for all layers."""
    needed, _ = needed_and_recomputed(prof, plan)
    dev = prof.fixed_residual_bytes
    host = 0
    for n in prof.names:
        if n.fixed or n.name not in needed:
            continue
        a = plan.action(n.name)
        if a == "device":
            dev += prof.num_layers * n.bytes
        elif a == "offload":
            host += prof.num_layers * n.bytes
    return dev, host


# the share of the host memory a plan leaves free that the paged optimizer state's RAM tier
# may take (the rest: what the cost model does not count, the OS's page cache)
RAM_TIER_SHARE = 0.8


def home_costs(prof: Profile, hw: Hardware, params: str, opt: str) -> dict[str, float]:
    """Bytes per tier and seconds that depend only on where params and states live."""
    P, G, S = prof.param_bytes, prof.grad_bytes, prof.opt_bytes
    dev = prof.input_bytes
    host = 0.0
    disk = 0.0
    link = 0.0  # bytes over the host link during forward/backward
    disk_s = 0.0  # disk time during forward/backward (parameter paging)
    if params == "device":
        dev += P
    else:
        dev += 2 * prof.layer_param_bytes - G  # double buffer; grads leave the device
        link += 2 * P + G
        host += G + (P if params == "host" else 2 * prof.layer_param_bytes)
        if params == "nvme":
            disk += P
            disk_s = 2 * P / hw.disk_read + P / hw.disk_write
    touched = 2 * S + 3 * P  # read+write states, read grads, read+write params
    opt_mem_s = 0.0  # paged (nvme): the update's time without the disk, a RAM tier's cost
    if opt == "device":
        dev += S
        opt_s = touched / hw.device_mem_bw
    else:
        opt_s = touched / hw.host_mem_bw
        if params == "device":
            opt_s += (G + P) / hw.link  # gradients down, new parameters up
        if opt == "host":
            host += S
        else:
            host += STAGING_BYTES
            disk += S
            opt_mem_s = opt_s
            opt_s = max(opt_s, S / hw.disk_read, S / hw.disk_write)
    return dict(
        dev=dev,
        host=host,
        disk=disk,
        link=link,
        disk_s=disk_s,
        opt_s=opt_s,
        opt_mem_s=opt_mem_s,
    )


def evaluate(prof: Profile, hw: Hardware, plan: Plan, *, cpu_lowering: bool = False) -> Prediction:
    """Bytes per tier and step time of ``plan`` (the reference cost model).

    ``cpu_lowering``: offloaded residuals stay in device temporaries (XLA's CPU backend
    drops the host placement), as on our validation machine, and kept residuals take
    ``kept_widening`` times their traced bytes (the CPU backend widens 16-bit ones to
    float32 for the backward pass).
    """
    needed, recomputed = needed_and_recomputed(prof, plan)
    res_dev, res_host = residual_split(prof, plan)
    L = prof.num_layers
    home = home_costs(prof, hw, plan.params, plan.opt)
    work = prof.workspace_bytes + prof.recompute_workspace * sum(
        prof.name(n).bytes for n in recomputed
    )
    if cpu_lowering:  # offloaded residuals stay on device; 16-bit ones are widened
        free = res_dev + res_host - prof.fixed_residual_bytes
        on_device = res_dev + res_host + (prof.kept_widening - 1.0) * free
    else:
        on_device = res_dev
    temp = work + on_device
    if plan.params != "device":
        temp += 2 * prof.layer_param_bytes - prof.grad_bytes
    device = work + on_device + home["dev"]
    host = (0 if cpu_lowering else res_host) + home["host"]
    if hw.shared_memory:  # device and host are one pool (CPU): count it all on device
        device, host = device + host, 0
    # host memory the plan leaves free keeps the paged optimizer state's first pages (the
    # store's RAM tier, `jaxoff train --host-mem`): off the disk and its time
    tier = 0
    if plan.opt == "nvme":
        spare = (hw.device_mem - device) if hw.shared_memory else (hw.host_mem - host)
        tier = int(max(0.0, min(prof.opt_bytes, RAM_TIER_SHARE * spare)))
        if tier:
            rest = prof.opt_bytes - tier
            home = {
                **home,
                "disk": home["disk"] - tier,
                "opt_s": max(home["opt_mem_s"], rest / hw.disk_read, rest / hw.disk_write),
            }
            if hw.shared_memory:
                device += tier
            else:
                host += tier
    compute = prof.base_flops / hw.flops
    micro = prof.grad_accum  # recompute and offload traffic: once per micro-batch
    recompute = micro * L * sum(prof.name(n).flops for n in recomputed) / hw.flops
    link_bytes = micro * 2 * res_host + home["link"]
    busy = max(link_bytes / hw.link, home["disk_s"])
    exposed = max(0.0, busy - compute - recompute)
    return Prediction(
        device_bytes=int(device),
        host_bytes=int(host),
        disk_bytes=int(home["disk"]),
        device_temp_bytes=int(temp),
        compute_s=compute,
        recompute_s=recompute,
        exposed_s=exposed,
        optimizer_s=home["opt_s"],
        link_bytes=int(link_bytes),
        recomputed=tuple(n.name for n in prof.names if n.name in recomputed),
        needed=tuple(n.name for n in prof.names if n.name in needed),
        ram_tier_bytes=tier,
    )


def fits(pred: Prediction, hw: Hardware) -> bool:
    return (
        pred.device_bytes <= hw.device_mem
        and pred.host_bytes <= hw.host_mem
        and pred.disk_bytes <= hw.disk
    )


def choices(prof: Profile, allowed: Mapping[str, tuple[str, ...]] | None = None):
    """Per free name, the actions the planner may pick (``allowed`` narrows them)."""
    allowed = allowed or {}
    return {n.name: tuple(allowed.get(n.name, ACTIONS)) for n in prof.names if not n.fixed}


def enumerate_plans(
    prof: Profile,
    allowed: Mapping[str, tuple[str, ...]] | None = None,
    homes: tuple[tuple[str, str], ...] | None = None,
) -> Iterator[Plan]:
    """Every plan (brute force; for tests on small cases)."""
    opts = choices(prof, allowed)
    homes = homes or allowed_homes(prof)
    for combo in itertools.product(*opts.values()):
        acts = dict(zip(opts, combo, strict=True))
        for params, opt in homes:
            yield Plan.from_actions(prof, acts, params=params, opt=opt)


def brute_force(prof, hw, allowed=None, homes=None, cpu_lowering=False):
    """The fastest fitting plan by enumeration, or ``None``."""
    best, best_pred = None, None
    for plan in enumerate_plans(prof, allowed, homes):
        pred = evaluate(prof, hw, plan, cpu_lowering=cpu_lowering)
        if fits(pred, hw) and (best_pred is None or pred.step_s < best_pred.step_s - 1e-12):
            best, best_pred = plan, pred
    return best, best_pred

"""Printing a plan: what goes where and why, memory per tier, step time, baselines."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .. import _output
from ._cost import Plan, Prediction
from ._hardware import Hardware
from ._profile import Profile


def fmt_bytes(n: float) -> str:
    if n == float("inf"):
        return "unlimited"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_s(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _why(prof: Profile, hw: Hardware, name: str, action: str, pred: Prediction) -> str:
    n = prof.name(name)
    L = prof.num_layers
    if n.fixed:
        return "block input: kept by remat itself (scan carry)"
    if name not in pred.needed:
        return "backward never reads it and nothing recomputed needs it: costs nothing"
    micro = prof.grad_accum  # recomputed and moved once per micro-batch
    cost = micro * L * n.flops / hw.flops
    freed = fmt_bytes(L * n.bytes)
    moved = fmt_bytes(micro * 2 * L * n.bytes)
    if action == "device":
        return (
            f"kept ({freed} fits): recomputing costs {fmt_s(cost)}/step, offloading "
            f"{moved}/step over the link"
        )
    if action == "remat":
        return f"recomputed: frees {freed} for {fmt_s(cost)}/step of compute"
    return f"to host: frees {freed} of device; {moved}/step over the link"


def plan_table(prof: Profile, hw: Hardware, plan: Plan, pred: Prediction) -> Table:
    t = Table(
        title=f"plan for {prof.model}: batch {prof.batch} x seq {prof.seq}"
        + (f" x {prof.grad_accum} micro-batches" if prof.grad_accum > 1 else "")
        + f", {prof.num_layers} layers, on {hw.name}"
    )
    for col in ("residual", "per layer", "all layers", "recompute", "action", "why"):
        t.add_column(col, justify="left" if col in ("residual", "action", "why") else "right")
    for name, action in plan.actions:
        n = prof.name(name)
        t.add_row(
            name,
            fmt_bytes(n.bytes),
            fmt_bytes(prof.num_layers * n.bytes),
            f"{n.flops / 1e9:.3g} GFLOP",
            action if name in pred.needed else f"({action})",
            _why(prof, hw, name, action, pred),
        )
    t.add_row("parameters", "", fmt_bytes(prof.param_bytes), "", plan.params, "")
    t.add_row("optimizer states", "", fmt_bytes(prof.opt_bytes), "", plan.opt, "")
    return t


def tiers_table(hw: Hardware, rows: list[tuple[str, Plan, Prediction]]) -> Table:
    t = Table(title="predicted memory per tier and step time")
    for col in (
        "plan",
        "device",
        "host",
        "RAM tier",
        "disk",
        "step",
        "compute",
        "recompute",
        "exposed xfer",
        "optimizer",
    ):
        t.add_column(col, justify="left" if col == "plan" else "right")
    t.add_row(
        "budget",
        fmt_bytes(hw.device_mem),
        "shared with device" if hw.shared_memory else fmt_bytes(hw.host_mem),
        "",
        fmt_bytes(hw.disk),
        "",
        "",
        "",
        "",
        "",
    )
    for label, _, p in rows:
        if p is None:
            t.add_row(label, "-", "-", "-", "-", "no plan fits", "", "", "", "")
            continue
        t.add_row(
            label,
            fmt_bytes(p.device_bytes),
            fmt_bytes(p.host_bytes),
            fmt_bytes(p.ram_tier_bytes) if p.ram_tier_bytes else "-",
            fmt_bytes(p.disk_bytes),
            fmt_s(p.step_s),
            fmt_s(p.compute_s),
            fmt_s(p.recompute_s),
            fmt_s(p.exposed_s),
            fmt_s(p.optimizer_s),
        )
    return t


def print_plan(prof, hw, plan, pred, others, console: Console | None = None) -> None:
    console = console or _output.console()
    console.print(plan_table(prof, hw, plan, pred))
    console.print(tiers_table(hw, [("MILP (chosen)", plan, pred), *others]))
    console.print(
        f"hardware: {hw.name}: {hw.flops / 1e12:.3g} TFLOP/s sustained, link "
        f"{hw.link / 1e9:.3g} GB/s, disk {hw.disk_read / 1e9:.3g}/"
        f"{hw.disk_write / 1e9:.3g} GB/s read/write ({hw.source})"
    )

"""``jaxoff compare --strategies``: every named strategy on one model, measured.

The parent builds each strategy's recipe (the budgeted ones plan over one shared
profile), then measures each recipe in its own subprocess (``python -m
jaxoff.compare._strategies``) so peak RSS figures do not mix. A recipe whose compiled step
needs more device memory than ``--device-mem`` is not run; it is listed with the reason,
as are strategies that cannot be planned or built.

Device bytes are what an accelerator would hold: state in device memory plus the
compiled step's temporaries, minus the activations the policy offloads (XLA's CPU
lowering keeps those in its temporaries, JAX-ON-CPU.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import psutil

from .._errors import JaxoffError
from .._memory import peak_rss_bytes
from ..models import load_model  # pyright: ignore[reportMissingImports]
from ..nn import with_stack
from ..placement import abstract_with, analyze_export, bytes_by_kind
from ..plan import jaxpr_flops
from ..policy import JAX_POLICIES, get_policy
from ..step import abstract_state, make_loss_fn, make_train_step
from ..strategies import (
    Context,
    Recipe,
    StrategyUnavailable,
    accumulates,
    build_recipe,
    placement,
    prepare,
)
from ._measure import _subs, optimizer, segment_size

MiB = 2**20


def _is_host(space) -> bool:
    kind = getattr(space, "memory_kind", None) or str(space)
    return "host" in kind.lower()


def transfer_bytes(jaxpr) -> tuple[int, int]:
    """``(to host, to device)`` bytes per step: every ``device_put`` that changes memory
    space in the jaxpr, weighted by the trip counts of the scans around it."""

    totals = [0, 0]

    def walk(jx, mult: int):
        for eqn in jx.eqns:
            if eqn.primitive.name == "device_put":
                for dst, v, out in zip(
                    eqn.params.get("devices", ()), eqn.invars, eqn.outvars, strict=False
                ):
                    src_host = _is_host(getattr(v.aval, "memory_space", "device"))
                    if dst is None or _is_host(dst) == src_host:
                        continue
                    size = out.aval.size * out.aval.dtype.itemsize
                    totals[0 if _is_host(dst) else 1] += mult * size
            inner = mult * eqn.params["length"] if eqn.primitive.name == "scan" else mult
            for sub in _subs(eqn):
                walk(sub, inner)

    walk(jaxpr.jaxpr, 1)
    return totals[0], totals[1]


def offloaded_activation_bytes(model_cfg, batch: int, seq: int) -> int:
    """Activation bytes the policy sends to host per step (params on device, no streaming):
    what an accelerator keeps off device between forward and backward."""

    cfg = with_stack(model_cfg, stream_window=0, stream_to=None)
    graphdef, state = abstract_state(cfg, optimizer())
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    jaxpr = jax.make_jaxpr(jax.value_and_grad(make_loss_fn(graphdef)))(state.params, tok, tok)
    return transfer_bytes(jaxpr)[0]


def traced_flops(jaxpr) -> float:
    """FLOPs of the traced step: every equation, scans times their trip count, recomputed
    forward ops included (``jaxoff.plan``'s count; no compile needed)."""

    return jaxpr_flops(jaxpr)


def baseline_flops(model_cfg, batch: int, seq: int) -> float:
    """:func:`traced_flops` of the plain step (no remat, all on device, AdamW)."""

    graphdef, state = abstract_state(model_cfg, optimizer())
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return traced_flops(jax.make_jaxpr(make_train_step(graphdef, optimizer()))(state, tok, tok))


def _offloads(recipe, names=None) -> bool:

    specs = [recipe.policy, recipe.stack_overrides.get("split_policy")]
    return any(
        isinstance(s, str) and s not in JAX_POLICIES and get_policy(s, names).offloaded()
        for s in specs
    )


def export_check(recipe, model: str, batch: int, seq: int, platform: str = "cuda") -> dict:
    """Exports the strategy's step for ``platform`` and checks that its placement and
    offload show: host-resident state as host arguments, streamed layers as copies inside
    the layer loop, offloaded activations as ``pinned_host`` copies inside the loop, a host
    update as host-compute ops. A paged optimizer is exported as the in-RAM one in the
    same placement (its FFI calls and commit callback do not export)."""

    if recipe.update_in_backward:
        return {
            "ok": None,
            "problems": [],
            "skipped": "the update-in-backward step pages "
            "inside the layer scan through FFI calls, which do not export",
        }
    pl = placement(recipe)
    plain = dataclasses.replace(recipe, store=False, placement=pl)
    base = load_model(model)
    prep = prepare(plain, base, optimizer(), abstract=True)
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=None)
    text = jax.export.export(prep.step, platforms=[platform])(prep.state, tok, tok).mlir_module()
    rep = analyze_export(text, platform)
    host = pl.host_memory_kind
    problems = []
    wants_host = pl.params == "host" or pl.opt_state == "host"
    if wants_host != bool(rep.arg_kinds.get(host)):
        problems.append(
            f"host arguments {rep.arg_kinds.get(host, 0)}, expected "
            f"{'some' if wants_host else 'none'}"
        )
    if pl.streams and not (
        rep.placements_in_loops.get("device") and rep.placements_in_loops.get(host)
    ):
        problems.append("no per-layer parameter/gradient copies inside the layer loop")
    offloads = _offloads(recipe, base.residual_names)
    if offloads and not rep.placements_in_loops.get(host):
        problems.append("offloaded activations: no pinned_host copy inside the layer loop")
    if not offloads and not pl.streams and rep.placements_in_loops:
        problems.append(f"copies inside loops: {rep.placements_in_loops}")
    if pl.update_kind == "host" and not rep.host_compute_ops:
        problems.append("host update: no host-compute ops")
    return {"report": rep.to_dict(), "problems": problems, "ok": not problems}


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def measure_strategy(
    model: str,
    name: str,
    recipe: dict,
    batch: int,
    seq: int,
    *,
    steps: int,
    warmup: int,
    seed: int = 0,
    device_mem: float | None = None,
    store_root: str | None = None,
    check_export: bool = False,
    grad_accum: int = 1,
) -> dict:
    """Compiles the strategy's step; unless it needs more device memory than
    ``device_mem``, runs it and returns every figure (see ``_report.STRATEGY_COLUMNS``).
    ``grad_accum`` > 1: the step over that many micro-batches of ``batch`` rows, its
    accumulator among its temporaries (offloaded activations: one micro-batch's)."""

    plan = Recipe.from_json(recipe)
    row = {
        "strategy": name,
        "policy": plan.policy,
        "placement": plan.placement_name(),
        "store": plan.store,
        "note": plan.note,
    }
    store = Path(store_root or "runs/compare/stores") / name
    shutil.rmtree(store, ignore_errors=True)
    t0 = time.perf_counter()
    prep = prepare(
        plan, load_model(model), optimizer(), store_dir=store, seed=seed, grad_accum=grad_accum
    )
    rows = grad_accum * batch  # the step's rows, every micro-batch
    try:
        tok = jax.ShapeDtypeStruct((rows, seq), jnp.int32)
        compiled = prep.step.lower(prep.state, tok, tok).compile()
        row["compile_s"] = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        kinds = bytes_by_kind(prep.state, prep.shardings)
        offloaded = offloaded_activation_bytes(prep.model_config, batch, seq)
        abstract = abstract_with(prep.state, prep.shardings)
        jaxpr = jax.make_jaxpr(prep.step_fn)(abstract, tok, tok)
        to_host, to_device = transfer_bytes(jaxpr)
        device_state = kinds.get("device", 0)
        row.update(
            device_state_bytes=device_state,
            temp_bytes=int(mem.temp_size_in_bytes),
            offloaded_bytes=offloaded,
            device_bytes=device_state + int(mem.temp_size_in_bytes) - offloaded,
            host_bytes=sum(b for k, b in kinds.items() if k != "device") + offloaded,
            disk_bytes=_dir_bytes(store),
            link_bytes=to_host + to_device,
            flops=traced_flops(jaxpr),
            remat_every=segment_size(prep.model_config, batch, seq),
        )
        if check_export:
            row["export"] = export_check(plan, model, batch, seq)
            row["export_ok"] = row["export"]["ok"]
        if device_mem is not None and row["device_bytes"] > device_mem:
            row["status"] = (
                f"does not fit: needs {row['device_bytes'] / MiB:,.1f} MiB on device, "
                f"budget {device_mem / MiB:,.1f} MiB"
            )
            return row
        key = jax.random.key(seed)
        tokens = jax.random.randint(key, (rows, seq + 1), 0, 256, dtype=jnp.int32)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        state, times, io = prep.state, [], []
        proc = psutil.Process()
        for i in range(warmup + steps):
            c0 = proc.io_counters()
            start = time.perf_counter()
            state, metrics = compiled(state, inputs, targets)
            jax.block_until_ready((state, metrics))
            if i >= warmup:
                times.append(time.perf_counter() - start)
                c1 = proc.io_counters()
                io.append(c1.read_bytes - c0.read_bytes + c1.write_bytes - c0.write_bytes)
        row.update(
            status="ok",
            step_s=statistics.median(times),
            disk_io_bytes=int(statistics.median(io)),
            peak_rss_bytes=peak_rss_bytes(),
            loss=float(metrics["loss"]),
        )
        return row
    finally:
        if hasattr(prep.tx, "close"):
            prep.tx.close()
        shutil.rmtree(store, ignore_errors=True)


def measure_strategy_isolated(timeout: float = 1800, **kw) -> dict:
    """:func:`measure_strategy` in a fresh Python process (its own peak RSS)."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxoff.compare._strategies", json.dumps(kw)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise JaxoffError(f"exit {proc.returncode}: " + " | ".join(tail))
    return json.loads(lines[-1])


_NO_ACCUM = (
    "not run with --grad-accum {n}: it updates inside the backward pass or streams its "
    "parameters, whose gradients jaxoff does not accumulate (jaxoff train refuses it too)"
)


def strategy_rows(cfg, console, progress, task) -> tuple[list[dict], list[dict]]:
    """``(measured rows, rows not run)`` of ``cfg.strategy_list()``."""

    budget = cfg.device_mem_bytes()
    ctx = Context(
        load_model(cfg.model),
        cfg.batch_size,
        cfg.seq_len,
        budget,
        cfg.hardware,
        cfg.model,
        cfg.grad_accum,
    )
    measured, skipped = [], []
    for name in cfg.strategy_list():
        progress.update(task, description=f"plan {name}")
        try:
            recipe = build_recipe(name, ctx)
        except StrategyUnavailable as e:
            skipped.append({"strategy": name, "status": f"not available: {e}"})
            progress.advance(task)
            continue
        except JaxoffError as e:  # InfeasibleError and other ConfigErrors
            skipped.append({"strategy": name, "status": f"does not fit: {e}"})
            progress.advance(task)
            continue
        if cfg.grad_accum > 1 and not accumulates(recipe):
            skipped.append({"strategy": name, "status": _NO_ACCUM.format(n=cfg.grad_accum)})
            progress.advance(task)
            continue
        progress.update(task, description=f"compile + run {name}")
        kw: dict[str, Any] = dict(
            model=cfg.model,
            name=name,
            recipe=recipe.to_json(),
            batch=cfg.batch_size,
            seq=cfg.seq_len,
            steps=cfg.steps,
            warmup=cfg.warmup,
            seed=cfg.seed,
            device_mem=budget,
            store_root=str(Path(cfg.out_dir) / "stores"),
            check_export=cfg.check_export,
            grad_accum=cfg.grad_accum,
        )
        try:
            row = (measure_strategy_isolated if cfg.isolate else measure_strategy)(**kw)
        except Exception as e:  # noqa: BLE001 - one failing strategy must not stop the rest
            row = {"strategy": name, "status": f"failed: {type(e).__name__}: {e}"[:400]}
        (measured if row.get("status") == "ok" else skipped).append(row)
        progress.advance(task)
    return measured, skipped


if __name__ == "__main__":
    print(json.dumps(measure_strategy(**json.loads(sys.argv[1]))))

"""Measures one policy: compiled memory, host traffic, FLOPs, step time, peak RSS.

Run in-process with :func:`measure_policy`, or isolated with :func:`measure_isolated`
(a child ``python -m jaxoff.compare._measure`` per policy, so each peak RSS is its own).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

from .._errors import JaxoffError
from .._memory import peak_rss_bytes
from ..models import load_model  # pyright: ignore[reportMissingImports]
from ..nn import AUTO, recorded_segments
from ..placement import bytes_by_kind, check_placement, streamed_model
from ..policy import apply_policy
from ..step import abstract_state, init_state, make_loss_fn, make_train_step
from ..step import compile_step as compile_step
from ..step import optimizer as optimizer
from ..step import tokens as _tokens  # noqa: F401


def model_config(model: str, spec: str):
    """The model named ``model`` (a size or ``package.module:factory``) with the policy
    spelled ``spec`` applied to its stack (policy + segments)."""

    return apply_policy(load_model(model), spec)


def _flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost.get("flops", 0.0))


def segment_plan(model_cfg, batch: int, seq: int):
    """The ``jaxoff.nn.SegmentPlan`` a ``remat_every="auto"`` stack resolves to at this
    batch and sequence (traced, nothing compiled), or ``None`` for any other stack."""

    if model_cfg.stack.remat_every != AUTO or model_cfg.stack.policy is None:
        return None
    graphdef, state = abstract_state(model_cfg, optimizer())
    tok = _tokens(batch, seq)
    with recorded_segments() as plans:
        jax.eval_shape(make_loss_fn(graphdef), state.params, tok, tok)
    return plans[0]


def segment_size(model_cfg, batch: int, seq: int) -> int:
    """Blocks per remat unit that run: the stack's ``remat_every``, ``"auto"`` resolved at
    this batch and sequence (:func:`segment_plan`)."""
    plan = segment_plan(model_cfg, batch, seq)
    return plan.size if plan is not None else model_cfg.stack.remat_every


def _probe_flops(model_cfg, layers: int, batch: int, seq: int, **stack) -> float:
    """XLA's FLOPs of the step at ``layers`` layers, every loop unrolled."""
    stack = dataclasses.replace(model_cfg.stack, scan_unroll=layers, **stack)
    probe = dataclasses.replace(model_cfg, num_layers=layers, stack=stack)
    return _flops(compile_step(probe, batch, seq)[0])


def step_flops(model_cfg, batch: int, seq: int) -> float:
    """FLOPs of one train step, corrected for XLA counting a loop body once.

    ``cost_analysis()`` counts a while-loop body once whatever its trip count. We
    compile the same step for 1 layer and for 2 layers with the scan fully unrolled
    (``scan_unroll`` = layers, so every block is in the counted body exactly once):
    ``F1 = outside + per_layer`` and ``F2 = outside + 2 per_layer``. Everything the
    step does per layer (forward, recompute, backward, optimizer update of that
    layer's parameters) is the same for every layer, so the step at L layers costs
    ``F1 + (L - 1) (F2 - F1)``.

    Chen segments of ``k`` blocks (``remat_every`` ``k > 1``, or ``"auto"`` resolved at this
    batch and sequence) are not the same for every layer: the last segment is not
    recomputed. The segment size is probed as it runs: the step at ``k + 1`` layers
    (segments ``k, 1``) and at ``2k + 1`` (``k, k, 1``), unrolled, differ by one recomputed
    segment, which costs its blocks' plain share (none's per-layer figure) plus its
    recomputation. The step is none's plus that recomputation per recomputed segment.
    """
    size = segment_size(model_cfg, batch, seq)
    if size == 1:
        f1, f2 = (_probe_flops(model_cfg, n, batch, seq, remat_every=1) for n in (1, 2))
        return f1 + (model_cfg.num_layers - 1) * (f2 - f1)
    n1, n2 = (_probe_flops(model_cfg, n, batch, seq, policy=None, remat_every=1) for n in (1, 2))
    s1, s2 = (
        _probe_flops(model_cfg, n, batch, seq, remat_every=size) for n in (size + 1, 2 * size + 1)
    )
    recompute = (s2 - s1) - size * (n2 - n1)
    segments = (model_cfg.num_layers - 1) // size  # all but the last
    return n1 + (model_cfg.num_layers - 1) * (n2 - n1) + segments * recompute


def host_bytes(jaxpr) -> int:
    """Bytes the step copies to host memory: ``device_put`` to a host memory space in
    the jaxpr, each weighted by the trip counts of the scans around it."""
    total = 0

    def is_host(dst) -> bool:
        kind = getattr(dst, "memory_kind", None) or str(dst)
        return "host" in kind.lower()

    def walk(jx, mult: int):
        nonlocal total
        for eqn in jx.eqns:
            if eqn.primitive.name == "device_put" and any(
                is_host(d) for d in eqn.params.get("devices", ())
            ):
                total += mult * sum(
                    math.prod(v.aval.shape) * v.aval.dtype.itemsize for v in eqn.outvars
                )
            inner = mult * eqn.params["length"] if eqn.primitive.name == "scan" else mult
            # jax imports jax.core itself (the stubs do not say so); subjaxprs where it exists
            for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else _subs(eqn):  # pyright: ignore[reportAttributeAccessIssue]
                walk(sub, inner)

    walk(jaxpr.jaxpr, 1)
    return total


def _subs(eqn):
    for value in eqn.params.values():
        for sub in value if isinstance(value, list | tuple) else (value,):
            if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
                yield sub.jaxpr
            elif type(sub).__name__ == "Jaxpr":
                yield sub


def measure_policy(
    model: str,
    spec: str,
    batch: int,
    seq: int,
    *,
    steps: int,
    warmup: int,
    seed: int = 0,
    placement: str = "device",
    grad_accum: int = 1,
) -> dict:
    """Every figure of one policy under one placement, as a JSON-able dict
    (see ``_report.COLUMNS``); ``grad_accum`` > 1: of the step over that many micro-batches
    of ``batch`` rows (``jaxoff train --grad-accum``), its accumulator in ``temp_bytes``."""

    cfg = model_config(model, spec)
    check_placement(placement, cfg, policy=spec)
    plan = segment_plan(cfg, batch, seq)
    t0 = time.perf_counter()
    compiled, _, abstract = compile_step(cfg, batch, seq, placement, grad_accum)
    cfg = streamed_model(cfg, placement)
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    rows = grad_accum * batch  # the step's rows, every micro-batch
    tok = _tokens(rows, seq)

    graphdef, _ = abstract_state(cfg, optimizer())
    step_fn = make_train_step(graphdef, optimizer(), placement, grad_accum)
    jaxpr = jax.make_jaxpr(step_fn)(abstract, tok, tok)
    # a streamed step does `full`'s arithmetic (bitwise-equal results), but its custom-VJP
    # loops ignore scan_unroll, which the FLOP probe relies on: count the unstreamed step.
    # XLA counts the micro-batch loop's body once too: the FLOPs of N micro-batches of B
    # rows are those of one batch of N x B (less the accumulator's N adds per parameter).
    flops = step_flops(model_config(model, spec), rows, seq)
    state_kinds = bytes_by_kind(abstract, jax.tree.map(lambda s: s.sharding, abstract))

    _, state = init_state(cfg, optimizer(), seed)
    state = jax.device_put(state, jax.tree.map(lambda s: s.sharding, abstract))
    key = jax.random.key(seed)
    tokens = jax.random.randint(key, (rows, seq + 1), 0, 256, dtype=jnp.int32)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        state, metrics = compiled(state, inputs, targets)
        jax.block_until_ready((state, metrics))
        if i >= warmup:
            times.append(time.perf_counter() - start)
    assert mem is not None  # compiled steps report their memory on every backend
    return {
        "policy": spec,
        "placement": placement,
        # the segment size that runs ("auto" resolved at this batch and sequence)
        "remat_every": plan.size if plan is not None else cfg.stack.remat_every,
        **({"segments": _plan_dict(plan)} if plan is not None else {}),
        "device_state_bytes": state_kinds.get("device", 0),
        "host_state_bytes": sum(b for k, b in state_kinds.items() if k != "device"),
        "temp_bytes": int(mem.temp_size_in_bytes),
        "argument_bytes": int(mem.argument_size_in_bytes),
        "host_bytes": host_bytes(jaxpr),
        "flops": flops,
        "step_s": statistics.median(times),
        "compile_s": compile_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "loss": float(metrics["loss"]),
    }


def _plan_dict(plan) -> dict:
    """A segment plan's figures (bytes modelled at the chosen size and at per-block remat)."""
    return {
        "size": plan.size,
        "lengths": list(plan.lengths),
        "boundary_bytes": plan.boundary_bytes,
        "interior_bytes": plan.interior_bytes,
        "modelled_bytes": plan.memory(),
        "modelled_bytes_per_block_remat": plan.memory(1),
        "recomputed_layers": plan.recomputed_layers,
        "pays_from_layers": plan.pays_from(),
    }


def measure_isolated(
    model: str,
    spec: str,
    batch: int,
    seq: int,
    *,
    steps: int,
    warmup: int,
    seed: int = 0,
    timeout: float = 1800,
    placement: str = "device",
    grad_accum: int = 1,
) -> dict:
    """:func:`measure_policy` in a fresh Python process (its own peak RSS)."""
    args = json.dumps(
        dict(
            model=model,
            spec=spec,
            batch=batch,
            seq=seq,
            steps=steps,
            warmup=warmup,
            seed=seed,
            placement=placement,
            grad_accum=grad_accum,
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "jaxoff.compare._measure", args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        raise JaxoffError(
            f"measuring policy {spec!r} failed in its subprocess (exit {proc.returncode}):\n"
            + "\n".join(tail)
            + (
                "\n(exit -9 usually means the OOM killer: try a smaller --batch-size/--seq-len)"
                if proc.returncode == -9
                else ""
            )
        )
    return json.loads(lines[-1])


if __name__ == "__main__":
    print(json.dumps(measure_policy(**json.loads(sys.argv[1]))))

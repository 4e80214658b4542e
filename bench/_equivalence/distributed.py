"""How far two processes' training is from the same mesh's in one process, and from optax
in RAM: the figures behind the tolerances of ``tests/test_distributed.py``.

Runs ``jaxoff train --model tiny --fsdp 4`` for ``--steps`` steps four ways, on 4 XLA CPU
devices in all:

* ``two``: 2 processes × 2 devices, paged optimizer (a store per process): the reference;
* ``plain``: 2 processes × 2 devices, optax in RAM;
* ``one``: 1 process × 4 devices, paged optimizer;
* ``streamed``: 2 processes × 2 devices, paged, host parameters streamed a layer ahead.

For each of the last three against ``two``: the largest parameter difference after the
last step (and its ratio to the largest distance any parameter moved from its initial
value), the largest relative loss and gradient-norm difference, and how many steps' losses
are bitwise equal.

    python bench/equivalence.py distributed --json bench/results/distributed_equivalence/NAME.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import tyro
from _common.results import write_result


@dataclasses.dataclass(frozen=True)
class Args:
    steps: int = 10
    json: Path | None = None


def _train(out: Path, steps: int, processes: int, *extra: str) -> None:
    train = [
        "train", "--model", "tiny", "--batch-size", "4", "--seq-len", "32", "--eval-every",
        "0", "--ckpt-every", str(steps), "--no-progress", "--chunk-mib", "1", "--fsdp", "4",
        "--steps", str(steps), "--out-dir", str(out), *extra,
    ]  # fmt: skip
    if processes > 1:
        train = ["launch", "--processes", str(processes), "--devices-per-process",
                 str(4 // processes), "--", *train]  # fmt: skip
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-m", "jaxoff", *train], capture_output=True, text=True,
                          env=env)  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"{' '.join(train)} failed:\n{proc.stderr[-3000:]}")


def _record(out: Path, steps: int) -> tuple[list[dict], list[np.ndarray]]:
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    path = out / "checkpoints" / str(steps) / "default"
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as ckpt:
        meta = ckpt.metadata(path).item_metadata
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), meta)
        saved = ckpt.restore(path, target)
    return metrics, [np.asarray(x) for x in jax.tree.leaves(saved["params"])]


def _initial_params() -> list[np.ndarray]:
    from flax import nnx

    from jaxoff.models import load_model

    model = load_model("tiny").build(nnx.Rngs(0))  # jaxoff train's --seed default
    return [np.asarray(x) for x in jax.tree.leaves(nnx.split(model, nnx.Param)[1])]


def _max_rel(rows: list[dict], ref: list[dict], key: str) -> float:
    return max(abs(r[key] - s[key]) / abs(s[key]) for r, s in zip(rows, ref, strict=True))


def main(a: Args) -> dict:
    variants = {
        "two": (2, "--store", "auto"),
        "plain": (2, "--store", "none"),
        "one": (1, "--store", "auto"),
        "streamed": (
            2,
            "--store",
            "auto",
            "--placement",
            "host_params_stream1",
            "--policy",
            "full",
        ),  # fmt: skip
    }
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (processes, *extra) in variants.items():
            _train(Path(tmp) / name, a.steps, processes, *extra)
            records[name] = _record(Path(tmp) / name, a.steps)
            print(f"{name}: trained", flush=True)
    ref_metrics, ref_params = records["two"]
    moved = max(
        float(np.abs(b - i).max()) for i, b in zip(_initial_params(), ref_params, strict=True)
    )
    result = {
        "steps": a.steps,
        "reference": "two: 2 processes x 2 devices, paged",
        "largest_parameter_move": moved,
        "losses_two": [r["loss"] for r in ref_metrics],
    }
    for name in ("plain", "one", "streamed"):
        metrics, params = records[name]
        diff = max(float(np.abs(x - y).max()) for x, y in zip(params, ref_params, strict=True))
        row = {
            "max_parameter_difference": diff,
            "difference_over_largest_move": diff / moved,
            "max_relative_loss_difference": _max_rel(metrics, ref_metrics, "loss"),
            "max_relative_grad_norm_difference": _max_rel(metrics, ref_metrics, "grad_norm"),
            "bitwise_equal_losses": sum(
                r["loss"] == s["loss"] for r, s in zip(metrics, ref_metrics, strict=True)
            ),
        }
        result[name] = row
        print(f"{name} vs two: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()))
    if a.json:
        write_result("distributed_equivalence", args=vars(a), path=a.json, **result)
    return result


def cli(argv: list[str]) -> dict:
    """``bench/equivalence.py distributed ARGS``."""
    return main(tyro.cli(Args, args=argv, prog="bench/equivalence.py distributed"))

"""Layer streaming on the tiny GPT: parameters and AdamW states in host memory, each
layer's parameters copied to the device inside the layer loop, one (L2L) or two
(STRONGHOLD-style) layers ahead. Checks the result against the all-device run and
shows what the step exported for cuda looks like.

    python examples/layer_streaming.py
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import optax

from jaxoff.models.gpt import CONFIGS
from jaxoff.nn import with_stack
from jaxoff.placement import get_placement, jit_step, streamed_model
from jaxoff.step import check_placement_export
from jaxoff.train import init_state, make_train_step

PLACEMENTS = ("host_params_stream1", "host_params_stream2")


def run(cfg, tx, name: str, tokens: np.ndarray):
    """Trains ``cfg`` under placement ``name`` on ``tokens`` ([steps, batch, seq + 1]);
    returns the final state and the last step's loss."""
    placement = get_placement(name)
    graphdef, state = init_state(streamed_model(cfg, placement), tx, seed=0)
    step, shardings = jit_step(make_train_step(graphdef, tx, placement), placement, state)
    state = jax.device_put(state, shardings)
    for batch in tokens:
        state, metrics = step(state, batch[:, :-1], batch[:, 1:])
    return state, float(metrics["loss"])


def main(steps: int = 5, batch: int = 4, seq: int = 32) -> dict[str, dict]:
    """Trains the device run and each streaming run for ``steps``; prints and returns, by
    placement, the loss, whether the state equals the device run's bit for bit, where the
    parameters live, and what the step exported for cuda copies inside layer loops."""
    cfg = with_stack(CONFIGS["tiny"], policy="nothing_saveable")  # streaming = full remat
    tx = optax.adamw(3e-3)
    tokens = np.random.default_rng(0).integers(0, 256, (steps, batch, seq + 1), dtype=np.int32)
    ref, ref_loss = run(cfg, tx, "device", tokens)
    found = {}
    for name in PLACEMENTS:
        state, loss = run(cfg, tx, name, tokens)
        same = all(
            np.array_equal(a, b)
            for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(state), strict=True)
        )
        kind = jax.tree.leaves(state.params)[0].sharding.memory_kind
        report, problems = check_placement_export(cfg, name, tx, batch, seq, "cuda")
        found[name] = dict(
            loss=loss,
            device_loss=ref_loss,
            bitwise_equal=same,
            memory_kind=kind,
            copies_in_loops=report.placements_in_loops,
            problems=problems,
        )
        print(
            f"{name}: loss {loss:.4f} (device {ref_loss:.4f}), bitwise equal: {same}, "
            f"params in {kind}; cuda export: copies inside layer loops "
            f"{report.placements_in_loops}, problems {problems or 'none'}"
        )
    return found


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    main(args.steps)

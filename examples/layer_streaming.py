"""Layer streaming on the tiny GPT: parameters and AdamW states in host memory, each
layer's parameters copied to the device inside the layer loop, one (L2L) or two
(STRONGHOLD-style) layers ahead. Checks the result against the all-device run and
shows what the step exported for cuda looks like.

    python examples/layer_streaming.py
"""

import jax
import numpy as np
import optax

from jaxoff.models.gpt import CONFIGS
from jaxoff.nn import with_stack
from jaxoff.placement import get_placement, jit_step, streamed_model
from jaxoff.step import check_placement_export
from jaxoff.train import init_state, make_train_step

cfg = with_stack(CONFIGS["tiny"], policy="nothing_saveable")  # streaming = full remat
tx = optax.adamw(3e-3)
tokens = np.random.default_rng(0).integers(0, 256, (5, 4, 33), dtype=np.int32)


def run(name):
    placement = get_placement(name)
    graphdef, state = init_state(streamed_model(cfg, placement), tx, seed=0)
    step, shardings = jit_step(make_train_step(graphdef, tx, placement), placement, state)
    state = jax.device_put(state, shardings)
    for batch in tokens:
        state, metrics = step(state, batch[:, :-1], batch[:, 1:])
    return state, float(metrics["loss"])


ref, ref_loss = run("device")
for name in ("host_params_stream1", "host_params_stream2"):
    state, loss = run(name)
    same = all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(state), strict=True)
    )
    kind = jax.tree.leaves(state.params)[0].sharding.memory_kind
    report, problems = check_placement_export(cfg, name, tx, 4, 32, "cuda")
    print(
        f"{name}: loss {loss:.4f} (device {ref_loss:.4f}), bitwise equal: {same}, "
        f"params in {kind}; cuda export: copies inside layer loops {report.placements_in_loops}"
        f", problems {problems or 'none'}"
    )

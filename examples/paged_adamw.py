"""Paged AdamW on a tiny MLP: bf16 parameters in RAM, fp32 master + moments in a page store.

python examples/paged_adamw.py /tmp/paged-example
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import optax

from jaxoff.optim import paged, update_and_apply


def main(store_dir: str, steps: int = 20) -> list[float]:
    """Trains for ``steps`` with the optimizer state paged to ``store_dir``; returns the
    loss of every step."""
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "w": (jax.random.normal(k1, (64, 64)) * 0.1).astype(jnp.bfloat16),
        "b": jnp.zeros(64, jnp.bfloat16),
    }
    x = jax.random.normal(k2, (32, 64)).astype(jnp.bfloat16)
    # Global ops lead the chain: they run on the gradients in RAM before the paged pipeline.
    tx = paged(
        optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2)), store_dir, chunk_bytes=4096
    )
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((jnp.tanh(x @ p["w"] + p["b"]).astype(jnp.float32) - 0.5) ** 2)
        )(params)
        params, state = update_and_apply(tx, grads, state, params)
        return params, state, loss

    losses = []
    for i in range(steps):
        params, state, loss = step(params, state)
        losses.append(float(loss))
        print(f"step {i + 1:2d} loss {losses[-1]:.5f} store version {int(state.version)}")
    tx.close()
    return losses


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/jaxoff-paged-example")

"""Train with the block parameters *and* the AdamW state in a page store (Fuyou's update in
the backward scan, ZeRO-Infinity's parameter offload): RAM holds the embeddings, the head,
each block's input and a window of two layers.

Any jaxoff.nn protocol model works (here the built-in ``tiny`` GPT, or a
``package.module:factory`` of your own); the embedded corpus is the data.

python examples/fuyou_nvme.py /tmp/fuyou-nvme-example
"""

import sys

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxoff.models import load_model
from jaxoff.nn import with_stack
from jaxoff.optim import paged
from jaxoff.step import TrainState
from jaxoff.strategies.fuyou import fuyou_init, fuyou_params, fuyou_resident, make_fuyou_step
from jaxoff.train import Batches, load_corpus


def main(store_dir: str, model: str = "tiny", steps: int = 30, batch: int = 8, seq: int = 64):
    cfg = with_stack(load_model(model), policy="nothing_saveable")  # each block recomputed
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    lr = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 5, steps, end_value=3e-4)
    tx = paged(optax.adamw(lr), store_dir, chunk_bytes=1 << 20)
    opt = fuyou_init(cfg, tx, params, page_params=True)  # parameters and state to the store
    state = TrainState(jnp.zeros((), jnp.int32), fuyou_resident(params), opt)
    del params  # the blocks now live in the store only
    step = jax.jit(make_fuyou_step(graphdef, cfg, tx, page_params=True), donate_argnums=0)
    batches = Batches(load_corpus(), batch, seq, 0)  # the embedded corpus, as bytes
    losses = []
    for i in range(steps):
        state, metrics = step(state, *batches(i))
        losses.append(float(metrics["loss"]))
        print(f"step {i + 1:3d} loss {losses[-1]:.4f} store version {int(state.opt_state.version)}")
    params = fuyou_params(tx, state.params)  # the whole model, read back and verified
    print(f"{sum(x.size for x in jax.tree.leaves(params)):,} parameters read back from the store")
    tx.close()
    return losses, params


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/jaxoff-fuyou-nvme-example")

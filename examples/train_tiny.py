"""Train the tiny GPT for a few hundred steps from Python, then sample from it.

python examples/train_tiny.py
"""

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

import jaxoff
from jaxoff.train import abstract_state
from jaxoff.train._checkpoint import Checkpoints


def sample(model, prompt: bytes, n: int, key) -> bytes:
    tokens = list(prompt)
    for _ in range(n):
        logits = model(jnp.asarray([tokens[-model.cfg.max_seq_len :]], jnp.int32))[0, -1]
        key, sub = jax.random.split(key)
        tokens.append(int(jax.random.categorical(sub, logits / 0.8)))
    return bytes(tokens)


def main():
    out = Path(tempfile.mkdtemp()) / "tiny"
    cfg = jaxoff.TrainConfig(
        model="tiny",
        steps=200,
        batch_size=8,
        seq_len=128,
        out_dir=out,
        eval_every=50,
        ckpt_every=200,
    )
    result = jaxoff.train(cfg)
    print(f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}")
    graphdef, abstract = abstract_state(cfg.model_config(), cfg.build_optimizer())
    ckpts = Checkpoints(out, keep=1)
    state = ckpts.restore(ckpts.latest_step(), abstract)
    ckpts.close()
    model = nnx.merge(graphdef, state.params)
    print(sample(model, b"def ", 120, jax.random.key(0)).decode("utf-8", "replace"))


if __name__ == "__main__":
    main()

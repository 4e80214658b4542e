"""Train the tiny GPT from Python with jaxoff's public parts, then sample text from it.

    python examples/train_tiny.py              # 200 steps: about a minute on 2 CPU cores
    python examples/train_tiny.py --steps 20   # a quick look

The loop is the trainer's own pieces (``jaxoff.train``: ``init_state``, ``make_train_step``,
``Batches``, ``load_corpus``); ``jaxoff train`` adds metrics, checkpoints and the paged
optimizer around the same step. Sampling runs one jitted forward per token over a buffer of
fixed length (the prompt, padded), so it compiles once however long the text grows.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxoff
from jaxoff.train import Batches, init_state, load_corpus, make_train_step


def make_sampler(graphdef, seq_len: int, temperature: float = 0.8):
    """``sample(params, prompt, n, key) -> bytes`` and its jitted one-token step.

    The model is causal: the logits at position ``length - 1`` of a buffer padded after
    ``length`` tokens are those of the unpadded prefix, and the buffer's shape never changes.
    """

    @jax.jit
    def next_token(params, buffer, length, key):
        logits = nnx.merge(graphdef, params)(buffer[None])[0]  # [seq_len, vocab]
        last = jax.lax.dynamic_index_in_dim(logits, length - 1, keepdims=False)
        return jax.random.categorical(key, last / temperature)

    def sample(params, prompt: bytes, n: int, key) -> bytes:
        tokens = list(prompt)
        buffer = np.zeros(seq_len, np.int32)
        for _ in range(n):
            window = tokens[-seq_len:]
            buffer[:] = 0
            buffer[: len(window)] = window
            key, sub = jax.random.split(key)
            tokens.append(int(next_token(params, buffer, jnp.int32(len(window)), sub)))
        return bytes(tokens)

    return sample, next_token


def main(
    steps: int = 200,
    sample_tokens: int = 120,
    log_every: int = 50,
    batch_size: int = 8,
    seq_len: int = 128,
    data: str | None = None,
) -> list[float]:
    """Trains for ``steps`` steps on ``data`` (a text file or folder; default: this Python's
    standard-library source), prints the loss and a sample; returns the losses."""
    cfg = jaxoff.TrainConfig(
        model="tiny", batch_size=batch_size, seq_len=seq_len, steps=steps, store="none"
    )
    tx = cfg.build_optimizer()  # AdamW with warm-up and cosine decay, as `jaxoff train`
    graphdef, state = init_state(cfg.model_config(), tx, cfg.seed)
    train_step = jax.jit(make_train_step(graphdef, tx), donate_argnums=0)
    batches = Batches(load_corpus(data), cfg.batch_size, cfg.seq_len, cfg.seed)
    losses = []
    for i in range(steps):
        state, metrics = train_step(state, *batches(i))
        losses.append(float(metrics["loss"]))
        if (i + 1) % log_every == 0 or i + 1 == steps:
            print(f"step {i + 1:4d}  loss {losses[-1]:.3f}", flush=True)
    sample, _ = make_sampler(graphdef, cfg.seq_len)
    text = sample(state.params, b"def ", sample_tokens, jax.random.key(0))
    print(text.decode("utf-8", "replace"))
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sample-tokens", type=int, default=120)
    args = parser.parse_args()
    main(args.steps, args.sample_tokens)

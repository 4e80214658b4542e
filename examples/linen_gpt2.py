"""Your own Flax linen GPT-2, trained with jaxoff: paged AdamW in a ``TrainState`` and a
remat/offload policy over the residual names your module tags.

    python examples/linen_gpt2.py --steps 300 --store /tmp/jaxoff-linen-store

What jaxoff asks of the model is only this: tag the activations a policy may keep, offload or
recompute with ``jax.ad_checkpoint.checkpoint_name`` (here :data:`NAMES`), and remat the block
with the JAX policy a :class:`jaxoff.policy.Policy` over those names translates to. The
optimizer is ``optax.adamw`` wrapped in :func:`jaxoff.optim.paged`: its moments and fp32
master weights live in a page store on disk, and ``TrainState.apply_gradients`` uses it as it
would any optax transformation. Data is the byte corpus jaxoff ships (this Python's standard
library source), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.ad_checkpoint import checkpoint_name

from jaxoff.optim import paged
from jaxoff.policy import get_policy
from jaxoff.train import Batches, load_corpus

NAMES = ("attn_qkv", "attn_probs", "attn_out", "mlp_hidden", "mlp_out")
"""The residual names this model's blocks tag; a jaxoff Policy is over them."""

POLICY = "attn_qkv=device,mlp_hidden=offload,*=remat"
"""Keep q/k/v, offload the MLP's hidden activation to host memory, recompute the rest."""


class Block(nn.Module):
    """A pre-LayerNorm GPT-2 block with its residuals named."""

    d_model: int
    num_heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h, dh = self.num_heads, d // self.num_heads
        qkv = checkpoint_name(nn.Dense(3 * d, name="qkv")(nn.LayerNorm()(x)), "attn_qkv")
        q, k, v = jnp.split(qkv.reshape(b, t, 3 * h, dh), 3, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
        probs = checkpoint_name(jax.nn.softmax(scores, axis=-1), "attn_probs")
        context = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, d)
        x = x + checkpoint_name(nn.Dense(d, name="proj")(context), "attn_out")
        hidden = nn.gelu(nn.Dense(4 * d, name="fc")(nn.LayerNorm()(x)))
        hidden = checkpoint_name(hidden, "mlp_hidden")
        return x + checkpoint_name(nn.Dense(d, name="fc_out")(hidden), "mlp_out")


class GPT2(nn.Module):
    """A small GPT-2 (learned positions, tied output head) over bytes."""

    vocab_size: int = 256
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    max_seq_len: int = 256
    remat_policy: Callable | None = None  # a jax.checkpoint_policies policy, or no remat

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        wte = nn.Embed(self.vocab_size, self.d_model, name="wte")
        wpe = nn.Embed(self.max_seq_len, self.d_model, name="wpe")
        x = wte(tokens) + wpe(jnp.arange(tokens.shape[1]))[None]
        block = Block if self.remat_policy is None else nn.remat(Block, policy=self.remat_policy)
        for i in range(self.num_layers):
            x = block(self.d_model, self.num_heads, name=f"block_{i}")(x)
        return wte.attend(nn.LayerNorm(name="ln_f")(x))


def main(
    steps: int = 300,
    store: str | None = None,
    *,
    d_model: int = 128,
    num_layers: int = 4,
    batch_size: int = 16,
    seq_len: int = 64,
    lr: float = 3e-3,
    policy: str = POLICY,
    log_every: int = 25,
) -> list[float]:
    """Trains for ``steps`` and returns the loss of every step."""
    remat_policy = get_policy(policy, NAMES).to_jax()
    model = GPT2(d_model=d_model, num_layers=num_layers, remat_policy=remat_policy)
    tokens = load_corpus(max_bytes=4 << 20)
    batches = Batches(tokens, batch_size, seq_len, seed=0)
    params = model.init(jax.random.key(0), jnp.zeros((1, seq_len), jnp.int32))["params"]
    store = store or tempfile.mkdtemp(prefix="jaxoff-linen-")
    tx = paged(optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1), store)
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    @jax.jit
    def step(state, x, y):
        def loss_fn(p):
            logits = state.apply_fn({"params": p}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    losses = []
    for i in range(steps):
        state, loss = step(state, *batches(i))
        losses.append(float(loss))
        if (i + 1) % log_every == 0 or i in (0, steps - 1):
            print(f"step {i + 1:4d}  loss {losses[-1]:.4f}", flush=True)
    tx.close()
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--store", default=None, help="page store directory (default: a temp dir)")
    parser.add_argument("--policy", default=POLICY, help=f"name=action over {', '.join(NAMES)}")
    args = parser.parse_args()
    main(args.steps, args.store, policy=args.policy)

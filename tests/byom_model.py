"""A model written outside jaxoff's ``models/``, as a user would: a tiny GPT-style decoder
whose blocks mix tokens with a causal, learned-decay average instead of attention.

It implements the model protocol of :mod:`jaxoff.nn` and nothing else of jaxoff, so
``jaxoff train --model tests.byom_model:build`` (and ``compare``, ``plan``, ``--strategies``)
exercise the protocol on a model jaxoff has never seen.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxoff.nn import Stack, run_stack, stacked

NAMES = ("layer_input", "mix_norm", "mixed", "ff_norm", "ff_up", "ff_act", "ff_down")


class MixBlock(nnx.Module):
    def __init__(self, cfg: MixerConfig, *, rngs: nnx.Rngs):
        d, f = cfg.width, 4 * cfg.width
        kw = dict(dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)
        self.mix_norm = nnx.LayerNorm(d, **kw)
        self.decay = nnx.Param(jnp.zeros((d,), jnp.dtype(cfg.param_dtype)))
        self.ff_norm = nnx.LayerNorm(d, **kw)
        self.up = nnx.Linear(d, f, **kw)
        self.down = nnx.Linear(f, d, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = checkpoint_name(x, "layer_input")
        h = checkpoint_name(self.mix_norm(x), "mix_norm")
        # causal mixing: position t averages positions <= t with weights decay^(t - s)
        t = jnp.arange(x.shape[1], dtype=jnp.float32)
        rate = jax.nn.sigmoid(self.decay[...].astype(jnp.float32))  # [D]
        lag = t[:, None] - t[None, :]  # [T, T]
        w = jnp.where(lag[..., None] >= 0, rate ** jnp.maximum(lag, 0)[..., None], 0.0)
        w = w / w.sum(axis=1, keepdims=True)
        mixed = checkpoint_name(jnp.einsum("tsd,bsd->btd", w.astype(h.dtype), h), "mixed")
        x = x + mixed
        g = checkpoint_name(self.ff_norm(x), "ff_norm")
        u = checkpoint_name(self.up(g), "ff_up")
        a = checkpoint_name(jax.nn.gelu(u), "ff_act")
        return x + checkpoint_name(self.down(a), "ff_down")


class Mixer(nnx.Module):
    def __init__(self, cfg: MixerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)
        self.tok = nnx.Embed(cfg.vocab_size, cfg.width, **kw)
        self.blocks = stacked(lambda r: MixBlock(cfg, rngs=r), cfg.num_layers, rngs)
        self.norm = nnx.LayerNorm(cfg.width, **kw)
        self.out = nnx.Linear(cfg.width, cfg.vocab_size, use_bias=False, **kw)

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        return self.tok(tokens).astype(jnp.dtype(self.cfg.dtype))

    def logits(self, x: jax.Array) -> jax.Array:
        return self.out(self.norm(x)).astype(jnp.float32)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(run_stack(self.blocks, self.embed_tokens(tokens), self.cfg.stack))


@dataclasses.dataclass(frozen=True)
class MixerConfig:
    num_layers: int = 3
    width: int = 64
    max_seq_len: int = 128
    vocab_size: int = 256
    dtype: str = "float32"
    param_dtype: str = "float32"
    stack: Stack = Stack()
    name: str = ""

    residual_names = NAMES

    def build(self, rngs: nnx.Rngs) -> Mixer:
        return Mixer(self, rngs=rngs)


def build() -> MixerConfig:
    """The factory ``--model tests.byom_model:build`` names."""
    return MixerConfig()


@dataclasses.dataclass(frozen=True)
class Unnamed:
    """A model config with no residual names (policies over names must be refused)."""

    num_layers: int = 2
    width: int = 32
    max_seq_len: int = 64
    vocab_size: int = 256
    dtype: str = "float32"
    param_dtype: str = "float32"
    stack: Stack = Stack()

    def build(self, rngs: nnx.Rngs) -> Mixer:
        return Mixer(MixerConfig(self.num_layers, self.width, stack=self.stack), rngs=rngs)


def not_a_model():
    return {"layers": 3}

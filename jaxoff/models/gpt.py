"""A GPT-style decoder in Flax NNX, with named residuals and layers scanned under remat.

It implements jaxoff's model protocol (:mod:`jaxoff.nn`): its blocks are stacked with
:func:`jaxoff.nn.stacked` and run with :func:`jaxoff.nn.run_stack` under the config's
``stack`` (remat policy, segments, split, streaming: set by jaxoff, not part of the model),
and every activation a policy may keep, offload or recompute is tagged with
:func:`jax.ad_checkpoint.checkpoint_name`, using exactly the names in :data:`RESIDUAL_NAMES`
(documented below).

Residual names (per layer, inside the scanned block):

================  ==========================================  =====================
name              tensor                                      shape
================  ==========================================  =====================
``layer_input``   block input (residual stream)               ``[B, T, D]``
``attn_norm``     LayerNorm output before attention           ``[B, T, D]``
``attn_q``        query projection                            ``[B, T, H, Dh]``
``attn_k``        key projection (after rotary, if any)       ``[B, T, H, Dh]``
``attn_v``        value projection                            ``[B, T, H, Dh]``
``attn_logits``   scaled, masked attention scores             ``[B, H, T, T]``
``attn_probs``    softmax of the scores                       ``[B, H, T, T]``
``attn_context``  probabilities times values                  ``[B, T, H, Dh]``
``attn_out``      attention output projection                 ``[B, T, D]``
``mlp_norm``      LayerNorm output before the MLP             ``[B, T, D]``
``mlp_up``        MLP up-projection (pre-activation)          ``[B, T, F]``
``mlp_act``       GELU of the up-projection                   ``[B, T, F]``
``mlp_down``      MLP down-projection                         ``[B, T, D]``
================  ==========================================  =====================

Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxoff.models.gpt import CONFIGS, GPT
    >>> model = GPT(CONFIGS["tiny"], rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 16), jnp.int32)).shape
    (2, 16, 256)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxoff.nn import Stack, run_stack, stacked

VOCAB_SIZE = 256  # byte-level tokens

RESIDUAL_NAMES: tuple[str, ...] = (
    "layer_input",
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_logits",
    "attn_probs",
    "attn_context",
    "attn_out",
    "mlp_norm",
    "mlp_up",
    "mlp_act",
    "mlp_down",
)
"""Every name a block tags with ``checkpoint_name``, in the order they are produced."""


_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

ACTIVATIONS = {
    "gelu_new": lambda x: jax.nn.gelu(x),  # tanh approximation (GPT-2's)
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # exact, with erf
}
"""The MLP activations by their Hugging Face names (``gelu_new``, the tanh approximation,
is also Hugging Face's ``gelu_pytorch_tanh``)."""


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Shape and dtypes of a GPT (a :class:`jaxoff.nn.LayeredModel`).

    Attributes:
        num_layers: transformer blocks, stacked and scanned over.
        d_model: width of the residual stream.
        num_heads: attention heads; ``d_model`` must be divisible by it.
        d_ff: MLP hidden width (``4 * d_model`` in GPT-2 shapes).
        max_seq_len: longest sequence (size of the learned position table).
        positions: ``"learned"`` (GPT-2) or ``"rotary"`` (RoPE on q and k).
        dtype: compute dtype name (``"float32"``, ``"bfloat16"``).
        param_dtype: parameter dtype name.
        vocab_size: token ids are in ``[0, vocab_size)`` (256: bytes).
        stack: how the blocks run (:class:`jaxoff.nn.Stack`); jaxoff's commands set it.
        name: the size name, for tables and logs.
        norm_eps: LayerNorm epsilon (GPT-2's is ``1e-5``).
        tie_embeddings: the output head is the token embedding transposed (GPT-2).
        activation: the MLP activation, a key of :data:`ACTIVATIONS`.
    """

    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    max_seq_len: int = 1024
    positions: Literal["learned", "rotary"] = "learned"
    dtype: str = "float32"
    param_dtype: str = "float32"
    vocab_size: int = VOCAB_SIZE
    stack: Stack = Stack()
    name: str = ""
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    activation: str = "gelu_new"

    residual_names = RESIDUAL_NAMES

    def __post_init__(self):
        if min(self.num_layers, self.d_model, self.num_heads, self.d_ff, self.vocab_size) < 1:
            raise ValueError(f"GPTConfig sizes must be positive, got {self}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} is not one of {sorted(ACTIVATIONS)}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        if self.positions not in ("learned", "rotary"):
            raise ValueError(f"positions must be 'learned' or 'rotary', got {self.positions!r}")
        if self.positions == "rotary" and (self.d_model // self.num_heads) % 2:
            raise ValueError("rotary positions need an even head dimension")
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(
                    f"{field}={getattr(self, field)!r} is not one of {sorted(_DTYPES)}"
                )
        self.stack.check_depth(self.num_layers)

    def build(self, rngs: nnx.Rngs) -> GPT:
        """The model (the protocol's constructor)."""
        return GPT(self, rngs=rngs)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def parameter_dtype(self):
        return _DTYPES[self.param_dtype]

    def num_params(self) -> int:
        """Parameter count from the shapes (equals the built model's; a test checks it)."""
        d, f, n = self.d_model, self.d_ff, self.num_layers
        block = (
            2 * 2 * d  # two LayerNorms (scale, bias)
            + 4 * (d * d + d)  # q, k, v, out projections with bias
            + (d * f + f)
            + (f * d + d)  # MLP
        )
        pos = self.max_seq_len * d if self.positions == "learned" else 0
        head = 0 if self.tie_embeddings else d * self.vocab_size
        # token embedding, final LayerNorm, output head (no bias)
        return self.vocab_size * d + pos + n * block + 2 * d + head


def _gpt2(num_layers: int, d_model: int, num_heads: int, **kw) -> GPTConfig:
    return GPTConfig(num_layers, d_model, num_heads, 4 * d_model, **kw)


def _named(configs: dict[str, GPTConfig]) -> dict[str, GPTConfig]:
    return {k: dataclasses.replace(v, name=k) for k, v in configs.items()}


CONFIGS: dict[str, GPTConfig] = _named(
    {
        # name: GPT-2/GPT-3-like shapes; the comment is the parameter count
        "tiny": _gpt2(5, 128, 4, max_seq_len=256),  # 1.1M
        "mini": _gpt2(4, 256, 4, max_seq_len=512),  # 3.4M
        "small": _gpt2(12, 768, 12),  # 86M (GPT-2 small's blocks)
        "medium": _gpt2(24, 1024, 16),  # 304M
        "large": _gpt2(36, 1280, 20),  # 709M
        "xl": _gpt2(48, 1600, 25),  # 1.48B (GPT-2 XL's blocks)
        "2.7b": _gpt2(32, 2560, 32, max_seq_len=2048),  # 2.5B
        "6.7b": _gpt2(32, 4096, 32, max_seq_len=2048),  # 6.4B
        "13b": _gpt2(40, 5120, 40, max_seq_len=2048),  # 12.6B
        # deep and narrow: its layer boundaries dominate its activations, as Chen et al.'s
        # segments need (`sqrt` runs segments of 2 blocks here; see docs/guide/policies.md)
        "deep": _gpt2(128, 64, 2, max_seq_len=256),  # 6.4M
    }
)
"""Named sizes. Vocabulary is 256 bytes, so counts sit slightly below GPT-2's."""


def _rotary(x: jax.Array, positions: jax.Array) -> jax.Array:
    """RoPE on the last axis of ``x: [B, T, H, Dh]``."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions[:, None].astype(jnp.float32) * freqs[None, :]  # [T, half]
    sin = jnp.sin(angles)[None, :, None, :].astype(x.dtype)
    cos = jnp.cos(angles)[None, :, None, :].astype(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class Attention(nnx.Module):
    """Causal multi-head self-attention with every intermediate named."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        lin = dict(dtype=cfg.compute_dtype, param_dtype=cfg.parameter_dtype, rngs=rngs)
        d, h, dh = cfg.d_model, cfg.num_heads, cfg.head_dim
        init = nnx.initializers.normal(0.02)
        self.q = nnx.LinearGeneral(d, (h, dh), kernel_init=init, **lin)
        self.k = nnx.LinearGeneral(d, (h, dh), kernel_init=init, **lin)
        self.v = nnx.LinearGeneral(d, (h, dh), kernel_init=init, **lin)
        out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * cfg.num_layers))
        self.out = nnx.LinearGeneral((h, dh), d, axis=(-2, -1), kernel_init=out_init, **lin)

    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        seq = x.shape[1]
        q = self.q(x)
        k = self.k(x)
        if cfg.positions == "rotary":
            pos = jnp.arange(seq)
            q, k = _rotary(q, pos), _rotary(k, pos)
        q = checkpoint_name(q, "attn_q")
        k = checkpoint_name(k, "attn_k")
        v = checkpoint_name(self.v(x), "attn_v")
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(cfg.head_dim).astype(q.dtype)
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
        logits = checkpoint_name(logits, "attn_logits")
        # softmax in float32 for stability whatever the compute dtype
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
        probs = checkpoint_name(probs, "attn_probs")
        context = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", probs, v), "attn_context")
        return checkpoint_name(self.out(context), "attn_out")


class MLP(nnx.Module):
    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        self.activation = cfg.activation
        lin = dict(dtype=cfg.compute_dtype, param_dtype=cfg.parameter_dtype, rngs=rngs)
        self.up = nnx.Linear(
            cfg.d_model, cfg.d_ff, kernel_init=nnx.initializers.normal(0.02), **lin
        )
        out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * cfg.num_layers))
        self.down = nnx.Linear(cfg.d_ff, cfg.d_model, kernel_init=out_init, **lin)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = checkpoint_name(self.up(x), "mlp_up")
        h = checkpoint_name(ACTIVATIONS[self.activation](h), "mlp_act")
        return checkpoint_name(self.down(h), "mlp_down")


class Block(nnx.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        norm = dict(
            epsilon=cfg.norm_eps,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.parameter_dtype,
            rngs=rngs,
        )
        self.attn_norm = nnx.LayerNorm(cfg.d_model, **norm)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(cfg.d_model, **norm)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = checkpoint_name(x, "layer_input")
        x = x + self.attn(checkpoint_name(self.attn_norm(x), "attn_norm"))
        return x + self.mlp(checkpoint_name(self.mlp_norm(x), "mlp_norm"))


class GPT(nnx.Module):
    """GPT decoder: ``model(tokens[B, T] int32) -> logits[B, T, vocab_size]``.

    Blocks are stacked with :func:`jaxoff.nn.stacked` (parameters on a leading layer axis)
    and run with :func:`jaxoff.nn.run_stack` under ``cfg.stack``, so XLA compiles one block
    whatever the depth.
    """

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        emb = dict(param_dtype=cfg.parameter_dtype, dtype=cfg.compute_dtype, rngs=rngs)
        init = nnx.initializers.normal(0.02)
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, embedding_init=init, **emb)
        if cfg.positions == "learned":
            self.pos_embed = nnx.Embed(cfg.max_seq_len, cfg.d_model, embedding_init=init, **emb)
        self.blocks = stacked(lambda r: Block(cfg, rngs=r), cfg.num_layers, rngs)
        self.final_norm = nnx.LayerNorm(
            cfg.d_model,
            epsilon=cfg.norm_eps,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.parameter_dtype,
            rngs=rngs,
        )
        if not cfg.tie_embeddings:
            self.head = nnx.Linear(
                cfg.d_model,
                cfg.vocab_size,
                use_bias=False,
                kernel_init=init,
                dtype=cfg.compute_dtype,
                param_dtype=cfg.parameter_dtype,
                rngs=rngs,
            )

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        """Token (and learned position) embeddings in the compute dtype: ``[B, T, D]``."""
        cfg = self.cfg
        seq = tokens.shape[-1]
        if seq > cfg.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len={cfg.max_seq_len}")
        x = self.embed(tokens)
        if cfg.positions == "learned":
            x = x + self.pos_embed(jnp.arange(seq))[None]
        return x.astype(cfg.compute_dtype)

    def logits(self, x: jax.Array) -> jax.Array:
        """Final LayerNorm and output head (or the tied embedding), in float32:
        ``[B, T, vocab_size]``."""
        x = self.final_norm(x)
        out = self.embed.attend(x) if self.cfg.tie_embeddings else self.head(x)
        return out.astype(jnp.float32)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(run_stack(self.blocks, self.embed_tokens(tokens), self.cfg.stack))

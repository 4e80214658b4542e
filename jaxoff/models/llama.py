"""A Llama-style decoder in Flax NNX: RMSNorm, SwiGLU, rotary positions, grouped-query
attention, no biases, optionally tied embeddings.

Options of the Llama family's relatives, all off by default (then the model is bit for bit
the plain Llama): an explicit head size (Mistral, Qwen3), Llama 3.1's rotary frequency
scaling (:class:`Llama3RopeScaling`), query/key/value biases (Qwen2), RMSNorm of each query
and key head (Qwen3) and a sliding attention window (Mistral). ``jaxoff.models.hf`` reads
and writes Hugging Face checkpoints of all of them.

Like the GPT (``models/gpt.py``) it implements jaxoff's model protocol (:mod:`jaxoff.nn`): its
blocks are stacked with :func:`jaxoff.nn.stacked` and run with :func:`jaxoff.nn.run_stack`
under the config's ``stack`` (set by jaxoff), and every activation a policy may keep, offload
or recompute is tagged with :func:`jax.ad_checkpoint.checkpoint_name`, using exactly the names
in :data:`RESIDUAL_NAMES`. A name means the same role as in the GPT; ``mlp_gate`` is the
SwiGLU gate, which the GPT has not.

Residual names (per layer, inside the scanned block; ``H`` query heads, ``K`` key/value
heads, ``F`` the MLP width):

================  ==========================================  =====================
name              tensor                                      shape
================  ==========================================  =====================
``layer_input``   block input (residual stream)               ``[B, T, D]``
``attn_norm``     RMSNorm output before attention             ``[B, T, D]``
``attn_q``        query projection, after rotary              ``[B, T, H, Dh]``
``attn_k``        key projection, after rotary                ``[B, T, K, Dh]``
``attn_v``        value projection                            ``[B, T, K, Dh]``
``attn_logits``   scaled, masked attention scores             ``[B, H, T, T]``
``attn_probs``    softmax of the scores                       ``[B, H, T, T]``
``attn_context``  probabilities times values                  ``[B, T, H, Dh]``
``attn_out``      attention output projection                 ``[B, T, D]``
``mlp_norm``      RMSNorm output before the MLP               ``[B, T, D]``
``mlp_gate``      SwiGLU gate projection (pre-activation)     ``[B, T, F]``
``mlp_up``        SwiGLU up-projection                        ``[B, T, F]``
``mlp_act``       ``silu(gate) * up``, the down-proj. input   ``[B, T, F]``
``mlp_down``      MLP down-projection                         ``[B, T, D]``
================  ==========================================  =====================

Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxoff.models.llama import CONFIGS
    >>> model = CONFIGS["llama-tiny"].build(nnx.Rngs(0))
    >>> model(jnp.zeros((2, 16), jnp.int32)).shape
    (2, 16, 256)
"""

from __future__ import annotations

import dataclasses
import math

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
    "mlp_gate",
    "mlp_up",
    "mlp_act",
    "mlp_down",
)
"""Every name a block tags with ``checkpoint_name``, in the order they are produced."""


_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's rotary frequency scaling (Hugging Face ``rope_type: "llama3"``).

    Wavelengths longer than ``original_max_position_embeddings / low_freq_factor`` are
    stretched ``factor`` times, those shorter than ``original_max_position_embeddings /
    high_freq_factor`` are kept, and those between are interpolated smoothly.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        if self.factor <= 0 or self.original_max_position_embeddings < 1:
            raise ValueError(f"Llama3RopeScaling needs a positive factor and length: {self}")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"Llama3RopeScaling needs high_freq_factor > low_freq_factor, got {self}"
            )

    def scale(self, inv_freq: jax.Array) -> jax.Array:
        """The scaled inverse frequencies (the arithmetic of Hugging Face's
        ``_compute_llama3_parameters``)."""
        old = self.original_max_position_embeddings
        low_wavelen = old / self.low_freq_factor
        high_wavelen = old / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (old / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return jnp.where(medium, smoothed, scaled)


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Shape and dtypes of a Llama (a :class:`jaxoff.nn.LayeredModel`).

    Attributes:
        num_layers: transformer blocks, stacked and scanned over.
        d_model: width of the residual stream.
        num_heads: query heads; ``d_model`` must be divisible by it, into an even head size.
        num_kv_heads: key/value heads (grouped-query attention); must divide ``num_heads``.
            ``num_heads`` is multi-head attention, ``1`` multi-query attention.
        d_ff: SwiGLU hidden width (see :func:`swiglu_width` for Llama's rule).
        max_seq_len: longest sequence (rotary positions have no table; this bounds inputs).
        rope_theta: base of the rotary frequencies.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: the output head is the token embedding transposed (one parameter).
        dtype: compute dtype name (``"float32"``, ``"bfloat16"``).
        param_dtype: parameter dtype name.
        vocab_size: token ids are in ``[0, vocab_size)`` (256: bytes).
        stack: how the blocks run (:class:`jaxoff.nn.Stack`); jaxoff's commands set it.
        name: the size name, for tables and logs.
        head_size: the attention head size (Hugging Face's ``head_dim``); None is
            ``d_model // num_heads``. Read it as :attr:`head_dim`.
        rope_scaling: Llama 3.1's rotary frequency scaling, or None (plain rotary).
        qkv_bias: the query, key and value projections have biases (Qwen2).
        qk_norm: each query and key head is RMSNormed (over ``head_dim``) before rotary
            positions (Qwen3).
        sliding_window: a query attends to the last ``sliding_window`` positions only
            (itself included; Mistral), or to all earlier ones (None).
    """

    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    vocab_size: int = VOCAB_SIZE
    stack: Stack = Stack()
    name: str = ""
    head_size: int | None = None
    rope_scaling: Llama3RopeScaling | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None

    residual_names = RESIDUAL_NAMES

    def __post_init__(self):
        sizes = (self.num_layers, self.d_model, self.num_heads, self.num_kv_heads, self.d_ff)
        if min(*sizes, self.max_seq_len, self.vocab_size) < 1:
            raise ValueError(f"LlamaConfig sizes must be positive, got {self}")
        if self.head_size is not None and self.head_size < 1:
            raise ValueError(f"head_size must be positive, got {self.head_size}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.head_size is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head dimension, got {self.head_dim}")
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(
                    f"{field}={getattr(self, field)!r} is not one of {sorted(_DTYPES)}"
                )
        self.stack.check_depth(self.num_layers)

    def build(self, rngs: nnx.Rngs) -> Llama:
        """The model (the protocol's constructor)."""
        return Llama(self, rngs=rngs)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads if self.head_size is None else self.head_size

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def parameter_dtype(self):
        return _DTYPES[self.param_dtype]

    def num_params(self) -> int:
        """Parameter count from the shapes (equals the built model's; a test checks it)."""
        d, f, n = self.d_model, self.d_ff, self.num_layers
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        block = (
            2 * d  # two RMSNorm scales
            + 2 * d * q  # q and out projections
            + 2 * d * kv  # k and v projections
            + 3 * d * f  # SwiGLU gate, up, down
            + (q + 2 * kv if self.qkv_bias else 0)
            + (2 * self.head_dim if self.qk_norm else 0)
        )
        head = 0 if self.tie_embeddings else d * self.vocab_size
        # token embedding, blocks, final RMSNorm, output head
        return self.vocab_size * d + n * block + d + head


def swiglu_width(d_model: int, multiple_of: int = 256, multiplier: float = 1.0) -> int:
    """Llama's SwiGLU hidden width: ``8/3 * d_model`` (times ``multiplier``), rounded up to a
    multiple of ``multiple_of`` (the rule of Meta's ``llama/model.py``).

    Example:
        >>> swiglu_width(4096)  # Llama 2 7B
        11008
        >>> swiglu_width(4096, 1024, 1.3)  # Llama 3 8B
        14336
    """
    hidden = int(multiplier * int(2 * 4 * d_model / 3))
    return multiple_of * -(-hidden // multiple_of)


def _llama(
    num_layers: int,
    d_model: int,
    num_heads: int,
    num_kv_heads: int,
    *,
    multiple_of: int = 256,
    multiplier: float = 1.0,
    **kw,
) -> LlamaConfig:
    d_ff = swiglu_width(d_model, multiple_of, multiplier)
    return LlamaConfig(num_layers, d_model, num_heads, num_kv_heads, d_ff, **kw)


def _named(configs: dict[str, LlamaConfig]) -> dict[str, LlamaConfig]:
    return {k: dataclasses.replace(v, name=k) for k, v in configs.items()}


CONFIGS: dict[str, LlamaConfig] = _named(
    {
        # name: Llama-shaped sizes; the comment is the parameter count (256-byte vocabulary)
        "llama-tiny": _llama(5, 128, 4, 2, multiple_of=32, max_seq_len=256),  # 0.99M
        "llama-mini": _llama(4, 256, 8, 2, multiple_of=64, max_seq_len=512),  # 2.9M
        "llama-small": _llama(12, 768, 12, 4),  # 76M
        "llama-1b": _llama(22, 2048, 32, 4),  # 0.97B (TinyLlama's blocks)
        "llama-3b": _llama(28, 3072, 24, 8),  # 2.8B (Llama 3.2 3B's blocks)
        "llama-7b": _llama(32, 4096, 32, 8, multiple_of=1024, multiplier=1.3),  # 7.0B (Llama 3 8B)
    }
)
"""Named sizes. The vocabulary is 256 bytes, so counts sit below the namesakes' (whose
embeddings alone are 0.26B to 1B parameters)."""


def rotary(
    x: jax.Array,
    positions: jax.Array,
    theta: float = 10000.0,
    scaling: Llama3RopeScaling | None = None,
) -> jax.Array:
    """RoPE on the last axis of ``x: [B, T, H, Dh]`` at ``positions: [T]``, in the halves
    layout of Llama's Hugging Face checkpoints (``rotate_half``): dimension ``i`` of the
    first half turns with ``i + Dh/2`` at frequency ``theta ** (-2i / Dh)`` (then scaled by
    ``scaling``, if any)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    if scaling is not None:
        freqs = scaling.scale(freqs)
    angles = positions[:, None].astype(jnp.float32) * freqs[None, :]  # [T, half]
    sin = jnp.sin(angles)[None, :, None, :].astype(x.dtype)
    cos = jnp.cos(angles)[None, :, None, :].astype(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class Attention(nnx.Module):
    """Causal grouped-query self-attention with rotary positions and every intermediate named.

    Query head ``h`` reads key/value head ``h // (num_heads // num_kv_heads)``; the keys and
    values are never repeated in memory (the einsums carry a group axis).
    """

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        lin = dict(
            use_bias=False, dtype=cfg.compute_dtype, param_dtype=cfg.parameter_dtype, rngs=rngs
        )
        qkv = dict(lin, use_bias=cfg.qkv_bias)
        d, h, kv, dh = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        init = nnx.initializers.normal(0.02)
        self.q = nnx.LinearGeneral(d, (h, dh), kernel_init=init, **qkv)
        self.k = nnx.LinearGeneral(d, (kv, dh), kernel_init=init, **qkv)
        self.v = nnx.LinearGeneral(d, (kv, dh), kernel_init=init, **qkv)
        out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * cfg.num_layers))
        self.out = nnx.LinearGeneral((h, dh), d, axis=(-2, -1), kernel_init=out_init, **lin)
        if cfg.qk_norm:  # made last: without it, the other parameters draw the same keys
            self.q_norm = _rms_norm(cfg, rngs, dh)
            self.k_norm = _rms_norm(cfg, rngs, dh)

    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        b, seq = x.shape[:2]
        kv, group, dh = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
        pos = jnp.arange(seq)
        q, k = self.q(x), self.k(x)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = checkpoint_name(rotary(q, pos, cfg.rope_theta, cfg.rope_scaling), "attn_q")
        k = checkpoint_name(rotary(k, pos, cfg.rope_theta, cfg.rope_scaling), "attn_k")
        v = checkpoint_name(self.v(x), "attn_v")
        qg = q.reshape(b, seq, kv, group, dh)  # head h = (h // group, h % group)
        logits = jnp.einsum("bqkgd,bskd->bkgqs", qg, k) / jnp.sqrt(dh).astype(q.dtype)
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        if cfg.sliding_window is not None:  # query i sees keys i - window + 1 .. i
            causal &= jnp.triu(jnp.ones((seq, seq), dtype=bool), 1 - cfg.sliding_window)
        logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
        logits = checkpoint_name(logits.reshape(b, cfg.num_heads, seq, seq), "attn_logits")
        # softmax in float32 for stability whatever the compute dtype
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
        probs = checkpoint_name(probs, "attn_probs")
        pg = probs.reshape(b, kv, group, seq, seq)
        context = jnp.einsum("bkgqs,bskd->bqkgd", pg, v).reshape(b, seq, cfg.num_heads, dh)
        context = checkpoint_name(context, "attn_context")
        return checkpoint_name(self.out(context), "attn_out")


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        lin = dict(
            use_bias=False, dtype=cfg.compute_dtype, param_dtype=cfg.parameter_dtype, rngs=rngs
        )
        init = nnx.initializers.normal(0.02)
        self.gate = nnx.Linear(cfg.d_model, cfg.d_ff, kernel_init=init, **lin)
        self.up = nnx.Linear(cfg.d_model, cfg.d_ff, kernel_init=init, **lin)
        out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * cfg.num_layers))
        self.down = nnx.Linear(cfg.d_ff, cfg.d_model, kernel_init=out_init, **lin)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = checkpoint_name(self.gate(x), "mlp_gate")
        up = checkpoint_name(self.up(x), "mlp_up")
        h = checkpoint_name(jax.nn.silu(gate) * up, "mlp_act")
        return checkpoint_name(self.down(h), "mlp_down")


def _rms_norm(cfg: LlamaConfig, rngs: nnx.Rngs, size: int | None = None) -> nnx.RMSNorm:
    return nnx.RMSNorm(
        cfg.d_model if size is None else size,
        epsilon=cfg.norm_eps,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.parameter_dtype,
        rngs=rngs,
    )


class Block(nnx.Module):
    """Pre-RMSNorm transformer block."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.attn_norm = _rms_norm(cfg, rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = _rms_norm(cfg, rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = checkpoint_name(x, "layer_input")
        x = x + self.attn(checkpoint_name(self.attn_norm(x), "attn_norm"))
        return x + self.mlp(checkpoint_name(self.mlp_norm(x), "mlp_norm"))


class Llama(nnx.Module):
    """Llama decoder: ``model(tokens[B, T] int32) -> logits[B, T, vocab_size]``.

    Blocks are stacked with :func:`jaxoff.nn.stacked` (parameters on a leading layer axis)
    and run with :func:`jaxoff.nn.run_stack` under ``cfg.stack``. With ``tie_embeddings``
    there is no ``head``: the logits are ``x @ embed.embedding.T``.
    """

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        init = nnx.initializers.normal(0.02)
        self.embed = nnx.Embed(
            cfg.vocab_size,
            cfg.d_model,
            embedding_init=init,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.parameter_dtype,
            rngs=rngs,
        )
        self.blocks = stacked(lambda r: Block(cfg, rngs=r), cfg.num_layers, rngs)
        self.final_norm = _rms_norm(cfg, rngs)
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
        """Token embeddings in the compute dtype: ``[B, T, D]`` (positions are rotary, applied
        in attention)."""
        cfg = self.cfg
        seq = tokens.shape[-1]
        if seq > cfg.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len={cfg.max_seq_len}")
        return self.embed(tokens).astype(cfg.compute_dtype)

    def logits(self, x: jax.Array) -> jax.Array:
        """Final RMSNorm and output head (or the tied embedding), float32:
        ``[B, T, vocab_size]``."""
        x = self.final_norm(x)
        out = self.embed.attend(x) if self.cfg.tie_embeddings else self.head(x)
        return out.astype(jnp.float32)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(run_stack(self.blocks, self.embed_tokens(tokens), self.cfg.stack))

"""A GPT-style decoder in Flax NNX, with named residuals and layers scanned under remat.

The model knows nothing of jaxoff. It exposes two things a memory policy needs:

* **Named residuals.** Every activation a policy may keep, offload or recompute is
  tagged with :func:`jax.ad_checkpoint.checkpoint_name`, using exactly the names in
  :data:`RESIDUAL_NAMES` (documented below).
* **A policy slot.** ``GPTConfig.policy`` is handed to ``nnx.remat`` around the scan
  body (one transformer block): ``None`` means no remat, a string names an attribute
  of :mod:`jax.checkpoint_policies` (e.g. ``"nothing_saveable"``), and any callable is
  used as a JAX checkpoint policy as it is.

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
    >>> from models.gpt import CONFIGS, GPT
    >>> model = GPT(CONFIGS["tiny"], rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 16), jnp.int32)).shape
    (2, 16, 256)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

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

PolicySpec = str | Callable[..., Any] | None

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Shape, dtypes and remat policy of a GPT.

    Attributes:
        num_layers: transformer blocks, scanned over.
        d_model: width of the residual stream.
        num_heads: attention heads; ``d_model`` must be divisible by it.
        d_ff: MLP hidden width (``4 * d_model`` in GPT-2 shapes).
        max_seq_len: longest sequence (size of the learned position table).
        positions: ``"learned"`` (GPT-2) or ``"rotary"`` (RoPE on q and k).
        dtype: compute dtype name (``"float32"``, ``"bfloat16"``).
        param_dtype: parameter dtype name.
        policy: remat policy of the scan body: ``None`` (no remat), the name of a
            ``jax.checkpoint_policies`` attribute, or a policy callable.
        scan_unroll: ``unroll`` of the layer scan (1 keeps one compiled block).
        remat_every: layers per remat segment. ``1`` puts each block under
            ``nnx.remat(policy)``. ``k > 1`` groups the layers into segments of ``k``
            (the last one shorter when ``k`` does not divide ``num_layers``): a scan over
            segments whose body, one segment, is under remat with ``policy``, and runs its
            ``k`` blocks with no remat of their own, so only segment boundaries are kept
            between forward and backward (Chen et al. 2016, "Training deep nets with
            sublinear memory cost": ``k ~ sqrt(num_layers)`` gives O(sqrt L) memory).
        stream_window: ``0`` runs the blocks' parameters where they are. ``w >= 1``
            *streams* them: the stacked block parameters stay where the caller put them
            (typically host memory) and each layer's slice is copied to ``stream_to``
            inside the layer loop, ``w`` layers ahead of the one computing (so at most
            ``w + 1`` layers' parameters are in device memory), in forward and again, in
            reverse order, in backward. Streaming saves each block's input and recomputes
            the block in backward (as ``nothing_saveable``); see :func:`stream_blocks`.
        stream_to: where a streamed layer's parameters are copied to: ``None`` means
            device memory (``jax.memory.Space.Device``, sharding unchanged); otherwise
            anything ``jax.device_put`` accepts (e.g. a replicated ``NamedSharding`` with
            ``memory_kind="device"``, which also all-gathers FSDP-sharded parameters).
        split_layers: ``0`` runs every layer under ``policy``. ``n >= 1`` splits the layer
            scan in two: the first ``n`` layers run under ``split_policy`` and the other
            ``num_layers - n`` under ``policy``, each part a scan of its own (one block per
            remat unit). This is how TransformerEngine-style activation offload of the
            first ``n`` layers is expressed (their activations wait longest for backward).
        split_policy: the remat policy of the first ``split_layers`` layers (same spellings
            as ``policy``).
    """

    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    max_seq_len: int = 1024
    positions: Literal["learned", "rotary"] = "learned"
    dtype: str = "float32"
    param_dtype: str = "float32"
    policy: PolicySpec = None
    scan_unroll: int = 1
    remat_every: int = 1
    stream_window: int = 0
    stream_to: Any = None
    split_layers: int = 0
    split_policy: PolicySpec = None

    def __post_init__(self):
        if self.num_layers < 1 or self.d_model < 1 or self.num_heads < 1 or self.d_ff < 1:
            raise ValueError(f"GPTConfig sizes must be positive, got {self}")
        if self.scan_unroll < 1 or self.remat_every < 1:
            raise ValueError(f"scan_unroll and remat_every must be at least 1, got {self}")
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
        if self.stream_window < 0:
            raise ValueError(f"stream_window must be 0 (off) or at least 1, got {self}")
        if self.stream_window and self.remat_every != 1:
            raise ValueError(
                f"stream_window={self.stream_window} streams one block per layer step and "
                f"cannot be combined with remat_every={self.remat_every}"
            )
        for field in ("policy", "split_policy"):
            value = getattr(self, field)
            if isinstance(value, str) and not hasattr(jax.checkpoint_policies, value):
                raise ValueError(
                    f"{field}={value!r} is not an attribute of jax.checkpoint_policies"
                )
        if not 0 <= self.split_layers <= self.num_layers:
            raise ValueError(
                f"split_layers={self.split_layers} must be between 0 (off) and "
                f"num_layers={self.num_layers}"
            )
        if self.split_layers and (self.stream_window or self.remat_every != 1):
            raise ValueError(
                f"split_layers={self.split_layers} runs two scans of one block per remat "
                f"unit; it cannot be combined with stream_window={self.stream_window} or "
                f"remat_every={self.remat_every}"
            )

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
        # token embedding, final LayerNorm, untied output head (no bias)
        return VOCAB_SIZE * d + pos + n * block + 2 * d + d * VOCAB_SIZE


def _gpt2(num_layers: int, d_model: int, num_heads: int, **kw) -> GPTConfig:
    return GPTConfig(num_layers, d_model, num_heads, 4 * d_model, **kw)


CONFIGS: dict[str, GPTConfig] = {
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
}
"""Named sizes. Vocabulary is 256 bytes, so counts sit slightly below GPT-2's."""


def resolve_policy(policy: PolicySpec):
    """Turns ``GPTConfig.policy`` into a JAX checkpoint policy callable (or ``None``)."""
    if policy is None or callable(policy):
        return policy
    return getattr(jax.checkpoint_policies, policy)


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
        lin = dict(dtype=cfg.compute_dtype, param_dtype=cfg.parameter_dtype, rngs=rngs)
        self.up = nnx.Linear(
            cfg.d_model, cfg.d_ff, kernel_init=nnx.initializers.normal(0.02), **lin
        )
        out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * cfg.num_layers))
        self.down = nnx.Linear(cfg.d_ff, cfg.d_model, kernel_init=out_init, **lin)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = checkpoint_name(self.up(x), "mlp_up")
        h = checkpoint_name(jax.nn.gelu(h), "mlp_act")
        return checkpoint_name(self.down(h), "mlp_down")


class Block(nnx.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        norm = dict(dtype=cfg.compute_dtype, param_dtype=cfg.parameter_dtype, rngs=rngs)
        self.attn_norm = nnx.LayerNorm(cfg.d_model, **norm)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(cfg.d_model, **norm)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = checkpoint_name(x, "layer_input")
        x = x + self.attn(checkpoint_name(self.attn_norm(x), "attn_norm"))
        return x + self.mlp(checkpoint_name(self.mlp_norm(x), "mlp_norm"))


class GPT(nnx.Module):
    """GPT decoder over byte tokens: ``model(tokens[B, T] int32) -> logits[B, T, 256]``.

    Blocks are created with ``nnx.vmap`` (parameters stacked on a leading layer axis)
    and run with ``nnx.scan``; the scan body is wrapped in ``nnx.remat`` with the
    config's policy, so XLA compiles one block whatever the depth.
    """

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        emb = dict(param_dtype=cfg.parameter_dtype, dtype=cfg.compute_dtype, rngs=rngs)
        init = nnx.initializers.normal(0.02)
        self.embed = nnx.Embed(VOCAB_SIZE, cfg.d_model, embedding_init=init, **emb)
        if cfg.positions == "learned":
            self.pos_embed = nnx.Embed(cfg.max_seq_len, cfg.d_model, embedding_init=init, **emb)

        @nnx.split_rngs(splits=cfg.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make_blocks(rngs: nnx.Rngs) -> Block:
            return Block(cfg, rngs=rngs)

        self.blocks = make_blocks(rngs)
        self.final_norm = nnx.LayerNorm(
            cfg.d_model, dtype=cfg.compute_dtype, param_dtype=cfg.parameter_dtype, rngs=rngs
        )
        self.head = nnx.Linear(
            cfg.d_model,
            VOCAB_SIZE,
            use_bias=False,
            kernel_init=init,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.parameter_dtype,
            rngs=rngs,
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.cfg
        seq = tokens.shape[-1]
        if seq > cfg.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len={cfg.max_seq_len}")
        x = self.embed(tokens)
        if cfg.positions == "learned":
            x = x + self.pos_embed(jnp.arange(seq))[None]
        x = x.astype(cfg.compute_dtype)
        if cfg.stream_window:
            x = stream_blocks(self.blocks, x, window=cfg.stream_window, to=cfg.stream_to)
        elif cfg.split_layers:
            head, tail = split_blocks(self.blocks, cfg.split_layers)
            x = scan_blocks(head, x, policy=cfg.split_policy, unroll=cfg.scan_unroll)
            if tail is not None:
                x = scan_blocks(tail, x, policy=cfg.policy, unroll=cfg.scan_unroll)
        else:
            x = scan_blocks(
                self.blocks,
                x,
                policy=cfg.policy,
                unroll=cfg.scan_unroll,
                remat_every=cfg.remat_every,
            )
        return self.head(self.final_norm(x)).astype(jnp.float32)


def split_blocks(blocks: Block, n: int) -> tuple[Block, Block | None]:
    """The stacked ``blocks`` as two stacks: layers ``[0, n)`` and ``[n, L)`` (``None``
    when ``n == L``). Slices of the parameters, so gradients flow back to the stack."""
    graphdef, state = nnx.split(blocks)
    num_layers = jax.tree.leaves(state)[0].shape[0]
    head = nnx.merge(graphdef, jax.tree.map(lambda a: a[:n], state))
    if n == num_layers:
        return head, None
    return head, nnx.merge(graphdef, jax.tree.map(lambda a: a[n:], state))


def scan_blocks(
    blocks: Block, x: jax.Array, *, policy: PolicySpec, unroll: int = 1, remat_every: int = 1
) -> jax.Array:
    """Runs stacked ``blocks`` over ``x``; the remat unit is one block or one segment.

    ``remat_every == 1``: ``nnx.scan`` over blocks, the body under ``nnx.remat(policy)``.
    ``remat_every == k > 1``: a scan over segments of ``k`` blocks (the stacked
    parameters reshaped to ``[L // k, k, ...]``, the ``L % k`` remaining blocks one last,
    shorter segment); the segment runs its blocks with an inner scan and is itself under
    ``jax.checkpoint(policy)``. Both scans use ``unroll``.
    """
    if remat_every == 1:

        def body(block: Block, h: jax.Array) -> jax.Array:
            return block(h)

        if policy is not None:
            body = nnx.remat(body, policy=resolve_policy(policy))

        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry, unroll=unroll)
        def run(block: Block, h: jax.Array) -> jax.Array:
            return body(block, h)

        return run(blocks, x)

    graphdef, state = nnx.split(blocks)
    num_layers = jax.tree.leaves(state)[0].shape[0]
    k = min(remat_every, num_layers)
    groups, rest = divmod(num_layers, k)

    def segment(seg_state, h: jax.Array) -> jax.Array:
        def layer(h, layer_state):
            return nnx.merge(graphdef, layer_state)(h), None

        n = jax.tree.leaves(seg_state)[0].shape[0]
        return jax.lax.scan(layer, h, seg_state, unroll=min(unroll, n))[0]

    if policy is not None:
        segment = jax.checkpoint(segment, policy=resolve_policy(policy))
    head = jax.tree.map(lambda a: a[: groups * k].reshape(groups, k, *a.shape[1:]), state)
    h = jax.lax.scan(lambda h, s: (segment(s, h), None), x, head, unroll=min(unroll, groups))[0]
    if rest:
        h = segment(jax.tree.map(lambda a: a[groups * k :], state), h)
    return h


def stream_blocks(blocks: Block, x: jax.Array, *, window: int, to: Any = None) -> jax.Array:
    """Runs stacked ``blocks`` over ``x``, copying each layer's parameters in as it is needed.

    The stacked parameters stay where they are (host memory, typically); inside the
    layer loop the parameters of layer ``i + window`` are copied to ``to`` (default:
    device memory) while layer ``i`` computes, into a ring of ``window + 1`` device
    slots, so at most ``window + 1`` layers' parameters are on the device at once
    (``window = 1``: L2L, Pudipeddi et al. 2020; ``window > 1``: a STRONGHOLD-style
    working window, Sun et al. 2022). The copy and the compute have no data dependency,
    so an accelerator's scheduler can overlap them.

    Autodiff cannot see that a prefetched copy may be fetched again (a copy carried
    from one loop step to the next would be saved for backward, every layer's weights
    on device), so the loop has a custom VJP: forward saves each block's input only;
    backward walks the layers in reverse with the same ring (prefetching ``window``
    layers below), recomputes the block, and sends each layer's parameter gradient
    back to the parameters' own memory space inside the loop. The arithmetic is the
    block's own forward and VJP, as under ``nothing_saveable`` remat.
    """
    graphdef, state = nnx.split(blocks)

    def block(layer_state, h):
        return nnx.merge(graphdef, layer_state)(h)

    # where the parameters live, read here: inside the custom VJP's backward its
    # residuals no longer carry their memory space
    homes = jax.tree.map(lambda a: jax.typeof(a).memory_space, state)
    to = jax.memory.Space.Device if to is None else to
    return _streamed(block, window, to, homes)(state, x)


def _streamed(block: Callable, window: int, to: Any, homes: Any) -> Callable:
    """``run(stacked, x)`` of :func:`stream_blocks`, with its custom VJP."""

    def fetch(stacked, i):
        n = jax.tree.leaves(stacked)[0].shape[0]
        i = jnp.clip(i, 0, n - 1)  # the last `window` steps re-fetch an end layer (unused)
        return jax.tree.map(
            lambda a: jax.device_put(jax.lax.dynamic_index_in_dim(a, i, 0, False), to), stacked
        )

    def ring_init(stacked, first, step):
        # slots 0..w-1 hold layers first, first+step, ...; slot w is free
        w = window
        layers = [fetch(stacked, first + step * k) for k in range(w)]
        return jax.tree.map(lambda *a: jnp.stack([*a, jnp.zeros_like(a[0])]), *layers)

    def slot(ring, j):
        j = j % (window + 1)
        return jax.tree.map(lambda r: jax.lax.dynamic_index_in_dim(r, j, 0, False), ring)

    def put(ring, j, layer):
        return jax.tree.map(
            lambda r, v: jax.lax.dynamic_update_index_in_dim(r, v, j % (window + 1), 0), ring, layer
        )

    def forward(stacked, x, save: bool):
        n = jax.tree.leaves(stacked)[0].shape[0]

        def body(carry, j):
            h, ring = carry
            ahead = fetch(stacked, j + window)  # prefetch; independent of this layer
            out = block(slot(ring, j), h)
            return (out, put(ring, j + window, ahead)), (h if save else None)

        (h, _), saved = jax.lax.scan(body, (x, ring_init(stacked, 0, 1)), jnp.arange(n))
        return h, saved

    @jax.custom_vjp
    def run(stacked, x):
        return forward(stacked, x, save=False)[0]

    def run_fwd(stacked, x):
        h, saved = forward(stacked, x, save=True)
        return h, (stacked, saved)

    def run_bwd(res, g):
        stacked, saved = res
        n = jax.tree.leaves(stacked)[0].shape[0]

        def body(carry, i):  # i runs n-1 .. 0 (reverse scan); j counts steps from 0
            gh, ring = carry
            j = n - 1 - i
            ahead = fetch(stacked, i - window)
            h = jax.lax.dynamic_index_in_dim(saved, i, 0, False)
            _, vjp = jax.vjp(block, slot(ring, j), h)
            g_layer, gh = vjp(gh)
            g_layer = jax.tree.map(jax.device_put, g_layer, homes)  # back to the params' home
            return (gh, put(ring, j + window, ahead)), g_layer

        init = (g, ring_init(stacked, n - 1, -1))
        (gx, _), g_stacked = jax.lax.scan(body, init, jnp.arange(n), reverse=True)
        return g_stacked, gx

    run.defvjp(run_fwd, run_bwd)
    return run

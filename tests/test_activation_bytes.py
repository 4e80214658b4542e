"""Per-layer activation memory of the policies against closed forms of the blocks' tensors.

Korthikanti et al. 2022 (Sec. 4.1) count what one transformer layer keeps between forward and
backward: ``sbh (34 + 5 a s / h)`` bytes at 16 bits, with dropout, of which the ``5 a s^2 b``
are the attention scores, softmax, its dropout mask and output. Their selective recomputation
(Sec. 4.2) drops exactly those and keeps ``34 sbh``; full recomputation keeps the layer's input.

Here the same accounting, tensor by tensor, for jaxoff's blocks (no dropout), compared with what
JAX saves: the residuals of the stack's VJP (``jax._src.ad_checkpoint.saved_residuals``) at
depths 2 and 1, whose difference is one layer (the scan stacks a layer's residuals on the layer
axis; what does not depend on the layer, such as the causal mask, is hoisted out and cancels).
The parameters, which are arguments and held anyway, are not counted. At several sequence
lengths the bytes are fitted, by least squares, as ``c0 + c1 s + c2 s^2``; the fit must be
exact and its coefficients integers equal to the closed form, for float32 and bfloat16.

This is the program JAX hands to XLA, the same on every platform; a backend may add buffers
of its own (XLA:CPU keeps a float32 copy of a stacked bfloat16 residual, for one).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals

from jaxoff.models.gpt import GPTConfig
from jaxoff.models.llama import LlamaConfig
from jaxoff.nn import run_stack
from jaxoff.policy import apply_policy

B = 2  # batch
SEQS = (8, 16, 24, 32)  # four lengths for three coefficients: the fit is over-determined
GPT = GPTConfig(1, 32, 4, 96, max_seq_len=64)  # h = 32, a = 4, mlp width 96 (not 4h)
LLAMA = LlamaConfig(1, 32, 4, 2, 80, max_seq_len=64)  # GQA: 2 key/value heads of 8
DTYPES = ("float32", "bfloat16")
F32 = 4  # bytes of a float32


def _sizes(cfg) -> tuple[int, int, int, int]:
    """``(h, a, kv, mlp width)``: the widths of the tensors; ``kv`` that of k and v."""
    kv = getattr(cfg, "num_kv_heads", cfg.num_heads) * cfg.head_dim
    return cfg.d_model, cfg.num_heads, kv, cfg.d_ff


def _layer_residual_bytes(cfg, policy: str, seq: int) -> int:
    """Bytes one layer keeps for the backward pass: the stack's residuals at depth 2 less
    those at depth 1, arguments (parameters, the stack's input) not counted."""

    def residual_bytes(depth: int) -> int:
        model_cfg = apply_policy(dataclasses.replace(cfg, num_layers=depth), policy)
        graphdef, state = nnx.split(nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0))).blocks)

        def loss(state, x):
            h = run_stack(nnx.merge(graphdef, state), x, model_cfg.stack)
            return h.astype(jnp.float32).sum()

        x = jax.ShapeDtypeStruct((B, seq, cfg.d_model), model_cfg.compute_dtype)
        residuals = saved_residuals(loss, state, x)
        return sum(
            aval.size * aval.dtype.itemsize
            for aval, source in residuals
            if not source.startswith("from the argument")
        )

    return residual_bytes(2) - residual_bytes(1)


@functools.cache  # the claims test refits what the closed-form tests fitted
def _fit(cfg, policy: str) -> tuple[int, int, int]:
    """``(c0, c1, c2)`` of ``bytes(s) = c0 + c1 s + c2 s^2`` per layer, checked exact."""
    measured = np.array([_layer_residual_bytes(cfg, policy, s) for s in SEQS], dtype=np.float64)
    s = np.array(SEQS, dtype=np.float64)
    design = np.stack([np.ones_like(s), s, s * s], axis=1)
    coef = np.linalg.lstsq(design, measured, rcond=None)[0]
    c = tuple(int(round(x)) for x in coef)
    refit = [c[0] + c[1] * n + c[2] * n * n for n in SEQS]
    assert refit == measured.astype(np.int64).tolist(), (policy, coef, measured)
    return c


def _gpt_closed_form(cfg: GPTConfig, policy: str) -> tuple[int, int, int]:
    """``(c0, c1, c2)`` of the GPT block, listed tensor by tensor (``p``: compute itemsize)."""
    h, a, _, f = _sizes(cfg)
    p = jnp.dtype(cfg.compute_dtype).itemsize
    if policy == "full":  # nothing_saveable: the block input, the scan carry
        return 0, p * B * h, 0
    # the names kept: layer_input, attn_norm, q, k, v, context, attn_out, mlp_norm ([B, T, D]
    # each: the heads of q, k, v and context make D), mlp_up and mlp_act ([B, T, F]);
    # mlp_down is kept by name but no backward rule reads it, so it is not saved
    if policy == "selective":
        return 0, p * B * (8 * h + 2 * f), 0
    if policy == "attention_core":  # selective, the context recomputed
        return 0, p * B * (7 * h + 2 * f), 0
    assert policy == "none"
    # flax's LayerNorm works in float32 whatever the compute dtype: per norm three float32
    # [B, T, D] intermediates, two [B, T] and two [B, T, 1] statistics
    norms = 2 * F32 * (3 * h + 2 + 2)
    # in the compute dtype: attn_norm, q, k, v, context, mlp_norm; mlp_up, the tanh GELU's
    # intermediates and mlp_act
    kept = p * (6 * h + (2 + _GELU_INTERMEDIATES) * f)
    c1 = B * (norms + kept + _SOFTMAX_STATS * a)
    # per layer, not per token: each norm's scale as float32 [1, 1, D]; in a compute dtype
    # narrower than the float32 parameters, the kernels cast to it (q, k, v, out; up, down)
    casts = p * (4 * h * h + 2 * h * f) if p < F32 else 0
    return 2 * F32 * h + casts, c1, _quadratic(cfg)


def _llama_closed_form(cfg: LlamaConfig, policy: str) -> tuple[int, int, int]:
    """``(c0, c1, c2)`` of the Llama block; ``kv``: the width of k and v (``K * Dh``)."""
    h, a, kv, f = _sizes(cfg)
    p = jnp.dtype(cfg.compute_dtype).itemsize
    if policy == "full":
        return 0, p * B * h, 0
    # layer_input, attn_norm, q, context, attn_out, mlp_norm ([B, T, D]), k and v
    # ([B, T, K, Dh]), mlp_gate, mlp_up and mlp_act ([B, T, F])
    if policy == "selective":
        return 0, p * B * (6 * h + 2 * kv + 3 * f), 0
    if policy == "attention_core":
        return 0, p * B * (5 * h + 2 * kv + 3 * f), 0
    assert policy == "none"
    # flax's RMSNorm in float32: per norm three [B, T, D] intermediates, two [B, T, 1]
    norms = 2 * F32 * (3 * h + 2)
    # in the compute dtype: attn_norm, q, context, mlp_norm, k, v; mlp_gate, mlp_up, the
    # SwiGLU's intermediates and mlp_act (six [B, T, F] in all)
    kept = p * (4 * h + 2 * kv + 6 * f)
    c1 = B * (norms + kept + _SOFTMAX_STATS * a)
    # each norm's scale as float32 [1, 1, D]; the kernels cast to a narrower compute dtype
    # (q and out D x D, k and v D x K Dh, gate, up and down D x F)
    casts = p * (2 * h * h + 2 * h * kv + 3 * h * f) if p < F32 else 0
    return 2 * F32 * h + casts, c1, _quadratic(cfg)


_SOFTMAX_STATS = 2 * F32  # the float32 softmax's max and sum: [B, H, T, 1] each

# The [B, T, F] intermediates the tanh GELU keeps besides its input: two products, and for
# tanh's JVP its output and ``1 - tanh(x)^2`` (sub). jax 0.12's tanh JVP computes the
# derivative with the ``one_minus_square`` primitive and keeps that alone, not tanh's output:
# three (saved_residuals of jax.nn.gelu on either version shows it).
_GELU_INTERMEDIATES = 3 if hasattr(jax.lax, "one_minus_square") else 4


def _quadratic(cfg) -> int:
    """The ``s^2`` coefficient without remat: the float32 softmax's exp and the probabilities
    (attn_probs, compute dtype), ``[B, H, T, T]`` each; the masked scores (attn_logits) are
    read by no backward rule. Korthikanti et al.'s ``5 a s^2 b`` at 16 bits with dropout."""
    return B * cfg.num_heads * (F32 + jnp.dtype(cfg.compute_dtype).itemsize)


_CLOSED_FORMS = {"gpt": (GPT, _gpt_closed_form), "llama": (LLAMA, _llama_closed_form)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", ["none", "selective", "attention_core", "full"])
@pytest.mark.parametrize("model", sorted(_CLOSED_FORMS))
def test_layer_bytes_match_the_closed_form(model, policy, dtype):
    base, closed_form = _CLOSED_FORMS[model]
    cfg = dataclasses.replace(base, dtype=dtype)
    assert _fit(cfg, policy) == closed_form(cfg, policy)


@pytest.mark.parametrize("dtype", DTYPES)
def test_selective_drops_the_quadratic_term_and_keeps_the_context(dtype):
    """The claims of the paper, from the measurements alone: without remat a layer keeps
    ``[B, H, T, T]`` tensors; ``selective`` keeps none, and keeps one ``[B, T, D]`` tensor
    (the context) more than recomputing the whole attention core; ``full`` keeps one
    ``[B, T, D]`` tensor per layer."""
    cfg = dataclasses.replace(GPT, dtype=dtype)
    h, a, _, _ = _sizes(cfg)
    p = jnp.dtype(cfg.compute_dtype).itemsize
    none, selective, core, full = (
        _fit(cfg, name) for name in ("none", "selective", "attention_core", "full")
    )
    assert none[2] >= B * a * p  # at least the probabilities
    assert selective[2] == core[2] == full[2] == 0
    assert selective[1] - core[1] == B * h * p  # the context
    assert full == (0, B * h * p, 0)
    # at 16 bits and an MLP of 4h, Korthikanti et al.'s 34 sbh less the two dropout masks
    if p == 2:
        wide = dataclasses.replace(cfg, d_ff=4 * h)
        assert _fit(wide, "selective")[1] == 32 * B * h

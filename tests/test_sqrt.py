"""sqrt is Chen et al.'s algorithm: one extra forward, segments of round(sqrt(L)) blocks;
sqrt_bytes sizes the segments from the block's bytes instead.

Every test runs the blocks of a narrow GPT (d_model 32, 2 heads, batch 4, sequence 32) as a
stack alone, ``grad`` of ``sum(stack(x) ** 2)`` with respect to the parameters and ``x``: the
compiled program then holds nothing but the stack's activations in its temporaries (the
parameters are arguments and their gradients outputs), so ``temp_size_in_bytes`` is the
activation memory. Only compiles: nothing here is timed.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _grads import assert_grads_close
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals

from jaxoff.models.gpt import GPTConfig
from jaxoff.nn import SegmentPlan, Stack, plan_segments, recorded_segments, run_stack
from jaxoff.plan._jaxpr import jaxpr_flops

B, T, D, H = 4, 32, 32, 2
F = 4 * D
FULL = Stack(policy="nothing_saveable")
# what apply_policy(cfg, "sqrt_bytes") sets: segments sized from the traced block's bytes
SQRT = Stack(policy="nothing_saveable", remat_every="auto")


def _config(layers: int) -> GPTConfig:
    return GPTConfig(layers, D, H, F, max_seq_len=T)


def _stack_loss(layers: int, stack: Stack | None):
    """``(loss(state, x), abstract state, abstract x)`` of the narrow GPT's blocks."""
    model = nnx.eval_shape(lambda: _config(layers).build(nnx.Rngs(0)))
    graphdef, state = nnx.split(model.blocks)

    def loss(state, x):
        return jnp.sum(run_stack(nnx.merge(graphdef, state), x, stack) ** 2)

    return loss, state, jax.ShapeDtypeStruct((B, T, D), jnp.float32)


def _grad_flops(layers: int, stack: Stack | None) -> float:
    loss, state, x = _stack_loss(layers, stack)
    return jaxpr_flops(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(state, x))


def _block_forward_flops() -> float:
    model = nnx.eval_shape(lambda: _config(1).build(nnx.Rngs(0)))
    graphdef, state = nnx.split(model.blocks)
    layer = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), state)
    block = jax.make_jaxpr(lambda s, h: nnx.merge(graphdef, s)(h))
    return jaxpr_flops(block(layer, jax.ShapeDtypeStruct((B, T, D), jnp.float32)))


@pytest.mark.parametrize(
    "layers, size, lengths",
    [(12, 3, (3, 3, 3, 3)), (11, 3, (3, 3, 3, 2)), (12, 5, (5, 5, 2)), (7, 2, (2, 2, 2, 1))],
)
def test_extra_flops_are_one_forward_of_the_recomputed_blocks(layers, size, lengths):
    """Counted on the traced gradient program: sqrt's FLOPs minus none's are one forward of
    every block but the last segment's (whose forward keeps its residuals), within 1%. A
    nested recomputation, or recomputing the last segment too, is 17-100% off."""
    plan = SegmentPlan(layers, 1, 1, size)
    assert plan.lengths == lengths
    stack = Stack(policy="nothing_saveable", remat_every=size)
    extra = _grad_flops(layers, stack) - _grad_flops(layers, None)
    expected = plan.recomputed_layers * _block_forward_flops()
    assert plan.recomputed_layers == layers - lengths[-1]
    assert abs(extra / expected - 1) < 0.01, (extra, expected)


def test_segment_size_minimises_the_byte_model_of_the_gpt_block():
    """b and i by hand for the GPT block (float32, B, T, D, H heads, F = 4D), the chosen k
    the least of ceil(L / k) b + k i over every k, and the depth where k first passes 1."""
    model = nnx.eval_shape(lambda: _config(8).build(nnx.Rngs(0)))
    x = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
    plan = plan_segments(model.blocks, x)
    btd, bt, bhtt, bht, btf = B * T * D, B * T, B * H * T * T, B * H * T, B * T * F
    # What the block's VJP keeps (float32 elements), nothing rematted, parameters aside:
    layer_norm = 3 * btd + 4 * bt + D  # centred x, normalised x, scaled x; mean, var terms
    attention = 5 * btd + 3 * bhtt + 2 * bht + 1  # norm, q, k, v, context; masked scores,
    # exp, probs; softmax sums; the 1/sqrt(Dh) scale
    mlp = btd + 6 * btf  # norm; up, GELU's four inner terms, act
    boundary = 4 * btd
    interior = boundary + 4 * (2 * layer_norm + attention + mlp) + bhtt  # + the bool mask
    assert (plan.boundary_bytes, plan.interior_bytes) == (boundary, interior)
    # the same bytes by JAX's own account of a VJP's residuals (literals and arguments aside)
    graphdef, state = nnx.split(model.blocks)
    layer = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), state)
    listed = saved_residuals(lambda s, h: nnx.merge(graphdef, s)(h), layer, x)
    kept = [a for a, why in listed if "argument" not in why and "literal" not in why]
    assert boundary + sum(a.size * a.dtype.itemsize for a in kept) == interior

    for layers in (1, 8, 87, 88, 128, 512, 1024):
        chosen = SegmentPlan.choose(layers, boundary, interior)
        by_hand = [math.ceil(layers / k) * boundary + k * interior for k in range(1, layers + 1)]
        assert chosen.memory() == min(by_hand) == by_hand[chosen.size - 1], layers
    # k = 2 pays once floor(L / 2) boundaries outweigh a second interior: L = 88 here
    assert interior // boundary == 43 and plan.pays_from() == 88
    assert SegmentPlan.choose(87, boundary, interior).size == 1
    assert SegmentPlan.choose(88, boundary, interior).size == 2
    assert SegmentPlan.choose(512, boundary, interior).size == 3


@functools.cache
def _temp_bytes(layers: int, stack: Stack) -> tuple[int, tuple[int, ...]]:
    """Compiled activation bytes of the gradient, and the segment sizes traced."""
    loss, state, x = _stack_loss(layers, stack)
    with recorded_segments() as plans:
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(state, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes, tuple(p.size for p in plans)


def _exponent(depths, memory) -> float:
    return float(np.polyfit(np.log(depths), np.log(memory), 1)[0])


def test_memory_grows_as_the_square_root_of_depth():
    """The slope of log(activation memory) on log(depth) over depths where k >= 2: sqrt's
    within 0.4-0.6, full's near 1 (its L boundaries, plus one block's interior, which does
    not grow with depth and keeps the slope a little under 1 at these depths)."""
    depths = (128, 256, 512, 1024)
    sqrt = [_temp_bytes(n, SQRT) for n in depths]
    assert all(sizes[0] >= 2 for _, sizes in sqrt), sqrt
    full = [_temp_bytes(n, FULL)[0] for n in depths]
    assert 0.4 <= _exponent(depths, [m for m, _ in sqrt]) <= 0.6, sqrt
    assert _exponent(depths, full) >= 0.85, full


def test_sqrt_is_full_below_the_crossover_and_beats_it_beyond():
    """Below 88 layers the byte model picks k = 1 and sqrt compiles to full's program (the
    same temp bytes); at 96 it picks k = 2 and needs at least 10% less than full."""
    below, sizes = _temp_bytes(64, SQRT)
    assert sizes == (1,) and below == _temp_bytes(64, FULL)[0]
    beyond, sizes = _temp_bytes(96, SQRT)
    assert sizes == (2,) and beyond < 0.9 * _temp_bytes(96, FULL)[0], beyond


@pytest.mark.parametrize(
    "layers, stack", [(11, Stack(policy="nothing_saveable", remat_every=3)), (96, SQRT)]
)
def test_gradients_equal_no_remat(layers, stack):
    """Segments are the plain stack's forward and VJP: the output is bitwise none's; the
    gradients are within tests/test_policy_grads.py's bound of 8 float32 ulps of the largest
    gradient (XLA fuses the recomputed forward into backward its own way; measured ~1.3)."""
    model = _config(layers).build(nnx.Rngs(0))
    graphdef, state = nnx.split(model.blocks)
    x = jax.random.normal(jax.random.key(1), (B, T, D), jnp.float32)

    def run(stack):
        def loss(state, x):
            out = run_stack(nnx.merge(graphdef, state), x, stack)
            return jnp.sum(jnp.sin(out)), out

        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(state, x)

    grads0, out0 = run(None)
    grads, out = run(stack)
    assert np.asarray(out).tobytes() == np.asarray(out0).tobytes()
    assert_grads_close(grads, grads0)


@pytest.mark.parametrize("policy", [None, "dots_saveable"])
def test_segments_refuse_a_policy_that_is_not_nothing_saveable(policy):
    with pytest.raises(ValueError, match="set policy='nothing_saveable', or remat_every=1"):
        Stack(policy=policy, remat_every=2)
    with pytest.raises(ValueError, match="at least 1 or 'auto'"):
        Stack(policy="nothing_saveable", remat_every="sqrt")


def test_the_shipped_deep_model_runs_sqrt_bytes_in_segments_of_two():
    """``jaxoff compare --model deep --policies full,sqrt_bytes``: at its default batch 8 x 128,
    apply_policy's "auto" resolves to segments of 2, and a shipped shape such as tiny's stays
    at 1 (the same program as full)."""
    from jaxoff.models.gpt import CONFIGS
    from jaxoff.policy import apply_policy

    def traced_sizes(name: str) -> tuple[int, ...]:
        cfg = apply_policy(CONFIGS[name], "sqrt_bytes")
        model = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
        graphdef, state = nnx.split(model)
        tokens = jax.ShapeDtypeStruct((8, 128), jnp.int32)

        def loss(state, tokens):
            return jnp.sum(nnx.merge(graphdef, state)(tokens))

        with recorded_segments() as plans:
            jax.eval_shape(jax.grad(loss), state, tokens)
        return tuple(p.size for p in plans)

    assert traced_sizes("deep") == (2,)
    assert traced_sizes("tiny") == (1,)


CHEN_DEPTHS = (9, 16, 25, 36, 49, 64)


def test_sqrt_preset_is_chens_square_root_of_the_depth():
    """``--policy sqrt`` sets segments of round(sqrt(L)) blocks, whatever the block's bytes
    (it picked 1 block, full's program, at every depth up to 64 before)."""
    from jaxoff.models.gpt import CONFIGS
    from jaxoff.nn._segments import sqrt_segment_size
    from jaxoff.policy import apply_policy

    for layers in CHEN_DEPTHS:
        cfg = apply_policy(_config(layers), "sqrt")
        assert cfg.stack.remat_every == sqrt_segment_size(layers) == math.isqrt(layers)
    assert apply_policy(CONFIGS["small"], "sqrt").stack.remat_every == 3  # 12 layers
    assert apply_policy(CONFIGS["deep"], "sqrt").stack.remat_every == 11  # 128 layers
    assert apply_policy(CONFIGS["small"], "sqrt_bytes").stack.remat_every == "auto"


@pytest.mark.slow
def test_sqrt_memory_grows_as_the_square_root_over_9_to_64_layers():
    """Chen's claim at the depths people train: the slope of log(activation memory) on
    log(depth) over 9..64 layers is within 0.4-0.6 for sqrt. Its traced gradient FLOPs over
    full's: -1.7% at 9 layers (the last segment is not recomputed) to +3.8% at 64 (a
    segment's recomputation runs each inner block's last matmul, which full's per-block
    remat skips: backward needs only its input); the same on the whole GPT."""
    from jaxoff.nn._segments import sqrt_segment_size

    memory, flops = [], []
    for layers in CHEN_DEPTHS:
        stack = Stack(policy="nothing_saveable", remat_every=sqrt_segment_size(layers))
        memory.append(_temp_bytes(layers, stack)[0])
        flops.append(_grad_flops(layers, stack) / _grad_flops(layers, FULL))
    assert 0.4 <= _exponent(CHEN_DEPTHS, memory) <= 0.6, memory
    assert max(flops) <= 1.04, flops
    assert flops == sorted(flops), flops  # the overhead grows with k = sqrt(L)

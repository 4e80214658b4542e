import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxoff.models.gpt import CONFIGS, GPT, RESIDUAL_NAMES, VOCAB_SIZE, GPTConfig
from jaxoff.nn import with_stack

TINY = CONFIGS["tiny"]


def _count(cfg: GPTConfig) -> int:
    model = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


# Documented sizes (README "Model sizes"): a wrong shape or a missed parameter changes them.
EXPECTED_PARAMS = {
    "tiny": 1_089_920,
    "mini": 3_421_696,
    "small": 86_235_648,
    "medium": 303_884_288,
    "large": 710_356_480,
    "xl": 1_478_019_200,
    "2.7b": 2_524_206_080,
    "6.7b": 6_454_648_832,
    "13b": 12_598_691_840,
    "deep": 6_447_232,
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_counts(name):
    cfg = CONFIGS[name]
    assert _count(cfg) == EXPECTED_PARAMS[name] == cfg.num_params()


def test_sizes_reach_1_3b():
    assert max(c.num_params() for c in CONFIGS.values()) >= 1.3e9
    assert 0.8e6 <= CONFIGS["tiny"].num_params() <= 1.5e6


def test_rotary_drops_position_table():
    cfg = dataclasses.replace(TINY, positions="rotary")
    assert _count(cfg) == TINY.num_params() - TINY.max_seq_len * TINY.d_model == cfg.num_params()


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_shape_and_dtype(positions, dtype):
    cfg = dataclasses.replace(TINY, positions=positions, dtype=dtype, param_dtype=dtype)
    model = GPT(cfg, rngs=nnx.Rngs(0))
    logits = model(jnp.zeros((3, 17), jnp.int32))
    assert logits.shape == (3, 17, VOCAB_SIZE)
    assert logits.dtype == jnp.float32
    assert jax.tree.leaves(nnx.state(model, nnx.Param))[0].dtype == jnp.dtype(dtype)


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_causality(positions):
    model = GPT(dataclasses.replace(TINY, positions=positions), rngs=nnx.Rngs(1))
    tokens = jax.random.randint(jax.random.key(0), (2, 24), 0, VOCAB_SIZE, jnp.int32)
    changed = tokens.at[:, 15].set((tokens[:, 15] + 1) % VOCAB_SIZE)
    a, b = model(tokens), model(changed)
    np.testing.assert_array_equal(a[:, :15], b[:, :15])  # the past never sees the future
    assert not np.allclose(a[:, 15:], b[:, 15:])  # ...and the change is visible after it


def test_every_residual_name_is_tagged():
    model = GPT(TINY, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tokens = jnp.zeros((1, 8), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda p: nnx.merge(graphdef, p)(tokens))(params)
    text = str(jaxpr)
    for name in RESIDUAL_NAMES:
        assert f"name={name}" in text, name


def _grads(cfg, tokens):
    model = GPT(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
        logits = nnx.merge(graphdef, p)(tokens[:, :-1])
        return jnp.mean(
            jax.nn.log_softmax(logits)[
                jnp.arange(tokens.shape[0])[:, None], jnp.arange(tokens.shape[1] - 1), tokens[:, 1:]
            ]
        )

    return jax.jit(jax.grad(loss))(params)


@pytest.mark.parametrize(
    "policy",
    [
        "nothing_saveable",
        "dots_saveable",
        "dots_with_no_batch_dims_saveable",
        "everything_saveable",
    ],
)
def test_remat_gradients_match_no_remat(policy):
    tokens = jax.random.randint(jax.random.key(2), (2, 33), 0, VOCAB_SIZE, jnp.int32)
    ref = _grads(TINY, tokens)
    got = _grads(with_stack(TINY, policy=policy), tokens)
    # Scanned remat reorders a few float reductions (JAX-ON-CPU.md: ~1e-8); anything
    # structural (a dropped or doubled term) is orders of magnitude larger.
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-7)


def test_remat_changes_compiled_temp_memory():
    tokens = jnp.zeros((4, 128), jnp.int32)

    def temp_bytes(policy):
        model = GPT(with_stack(TINY, policy=policy), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model, nnx.Param)
        f = jax.jit(jax.grad(lambda p: nnx.merge(graphdef, p)(tokens).mean()))
        return f.lower(params).compile().memory_analysis().temp_size_in_bytes

    assert temp_bytes("nothing_saveable") < temp_bytes(None)


@pytest.mark.parametrize(
    "bad",
    [
        dict(d_model=130),  # not divisible by heads
        dict(num_layers=0),
        dict(dtype="float64"),
        dict(positions="alibi"),
        dict(stack=dict(policy="no_such_policy")),
        dict(stack=dict(split_layers=6)),
    ],
)
def test_bad_config_is_refused(bad):
    with pytest.raises(ValueError):
        if "stack" in bad:
            with_stack(TINY, **bad["stack"])
        else:
            dataclasses.replace(TINY, **bad)


def test_sequence_longer_than_table_is_refused():
    model = GPT(TINY, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(jnp.zeros((1, TINY.max_seq_len + 1), jnp.int32))

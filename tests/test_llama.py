"""The Llama: shapes, sizes, attention against a reference, tied embeddings, causality, rotary
positions, residual names, and every layer-stack variant against the plain stack."""

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxoff.models import load_model
from jaxoff.models.llama import (
    CONFIGS,
    RESIDUAL_NAMES,
    VOCAB_SIZE,
    LlamaConfig,
    rotary,
    swiglu_width,
)
from jaxoff.nn import Stack, check_model, count_params, with_stack

TINY = CONFIGS["llama-tiny"]  # 5 layers, 4 query heads over 2 key/value heads


def _count(cfg: LlamaConfig) -> int:
    model = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _tokens(shape, seed=0):
    return jax.random.randint(jax.random.key(seed), shape, 0, VOCAB_SIZE, jnp.int32)


# Documented sizes (the comments of CONFIGS): a wrong shape or a missed parameter changes them.
EXPECTED_PARAMS = {
    "llama-tiny": 988_544,
    "llama-mini": 2_951_424,
    "llama-small": 75_909_888,
    "llama-1b": 970_024_960,
    "llama-3b": 2_820_320_256,
    "llama-7b": 6_981_685_248,
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_counts(name):
    cfg = CONFIGS[name]
    assert cfg.name == name
    assert _count(cfg) == EXPECTED_PARAMS[name] == cfg.num_params() == count_params(cfg)


def test_sizes_follow_llamas_rules():
    assert 0.8e6 <= TINY.num_params() <= 1.5e6
    assert swiglu_width(4096) == 11008  # Llama 2 7B
    assert swiglu_width(4096, 1024, 1.3) == CONFIGS["llama-7b"].d_ff == 14336  # Llama 3 8B
    for name in ("llama-1b", "llama-3b", "llama-7b"):
        cfg = CONFIGS[name]
        assert cfg.num_kv_heads < cfg.num_heads  # grouped-query attention
        assert cfg.d_ff % 256 == 0


def test_implements_the_protocol_and_is_named_on_the_command_line():
    assert load_model("llama-tiny") is check_model(TINY, needs=["policy", "streaming", "fuyou"])
    assert TINY.residual_names == RESIDUAL_NAMES


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tie", [False, True])
def test_logits_shape_and_dtype(dtype, tie):
    cfg = dataclasses.replace(TINY, dtype=dtype, param_dtype=dtype, tie_embeddings=tie)
    model = cfg.build(nnx.Rngs(0))
    logits = model(jnp.zeros((3, 17), jnp.int32))
    assert logits.shape == (3, 17, VOCAB_SIZE)
    assert logits.dtype == jnp.float32
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(dtype)}
    x = model.embed_tokens(jnp.zeros((3, 17), jnp.int32))
    assert x.shape == (3, 17, TINY.d_model) and x.dtype == jnp.dtype(dtype)


def _rms(x, scale, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _reference_logits(cfg: LlamaConfig, params, tokens):
    """A plain multi-head Llama forward over the model's parameters: keys and values repeated
    to every query head, one layer after another, no scan, no names."""
    p = nnx.to_pure_dict(params)
    group = cfg.num_heads // cfg.num_kv_heads
    seq = tokens.shape[1]
    x = p["embed"]["embedding"][tokens]
    pos = jnp.arange(seq)
    mask = jnp.tril(jnp.ones((seq, seq), bool))
    blocks = p["blocks"]
    for i in range(cfg.num_layers):
        layer = jax.tree.map(lambda a, i=i: a[i], blocks)
        a = layer["attn"]
        h = _rms(x, layer["attn_norm"]["scale"], cfg.norm_eps)
        q = rotary(jnp.einsum("btd,dhe->bthe", h, a["q"]["kernel"]), pos, cfg.rope_theta)
        k = rotary(jnp.einsum("btd,dhe->bthe", h, a["k"]["kernel"]), pos, cfg.rope_theta)
        v = jnp.einsum("btd,dhe->bthe", h, a["v"]["kernel"])
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / np.sqrt(cfg.head_dim)
        s = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
        ctx = jnp.einsum("bhqk,bkhe->bqhe", s, v)
        x = x + jnp.einsum("bqhe,hed->bqd", ctx, a["out"]["kernel"])
        m = layer["mlp"]
        h = _rms(x, layer["mlp_norm"]["scale"], cfg.norm_eps)
        act = jax.nn.silu(h @ m["gate"]["kernel"]) * (h @ m["up"]["kernel"])
        x = x + act @ m["down"]["kernel"]
    x = _rms(x, p["final_norm"]["scale"], cfg.norm_eps)
    head = p["embed"]["embedding"].T if cfg.tie_embeddings else p["head"]["kernel"]
    return x @ head


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # multi-head, grouped, multi-query
@pytest.mark.parametrize("tie", [False, True])
def test_matches_a_reference_multi_head_computation(kv_heads, tie):
    cfg = dataclasses.replace(TINY, num_kv_heads=kv_heads, tie_embeddings=tie)
    model = cfg.build(nnx.Rngs(3))
    tokens = _tokens((2, 19))
    want = _reference_logits(cfg, nnx.state(model, nnx.Param), tokens)
    # the same arithmetic in another order (grouped einsums, fused norms): float32 rounding
    np.testing.assert_allclose(model(tokens), want, rtol=2e-5, atol=2e-5)


def test_grouped_attention_is_multi_head_with_repeated_keys_and_values():
    """A GQA model equals the MHA model whose k and v heads are the GQA ones repeated."""
    gqa = TINY.build(nnx.Rngs(4))
    mha_cfg = dataclasses.replace(TINY, num_kv_heads=TINY.num_heads)
    mha = mha_cfg.build(nnx.Rngs(5))
    group = TINY.num_heads // TINY.num_kv_heads
    state = nnx.to_pure_dict(nnx.state(gqa, nnx.Param))
    for proj in ("k", "v"):  # kernels [L, D, K, Dh] -> [L, D, H, Dh]
        kernel = state["blocks"]["attn"][proj]["kernel"]
        state["blocks"]["attn"][proj]["kernel"] = jnp.repeat(kernel, group, axis=2)
    target = nnx.state(mha, nnx.Param)
    nnx.replace_by_pure_dict(target, state)
    nnx.update(mha, target)
    tokens = _tokens((2, 23), seed=1)
    np.testing.assert_allclose(mha(tokens), gqa(tokens), rtol=1e-5, atol=1e-5)
    assert _count(mha_cfg) > _count(TINY)


def test_tied_embeddings_share_one_parameter():
    cfg = dataclasses.replace(TINY, tie_embeddings=True)
    model = cfg.build(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    leaves = jax.tree.leaves(params)
    assert not hasattr(model, "head")
    assert [x.shape for x in leaves].count((VOCAB_SIZE, TINY.d_model)) == 1
    assert _count(cfg) == cfg.num_params() == TINY.num_params() - VOCAB_SIZE * TINY.d_model
    # the head is the embedding: its gradient gets both uses (head and lookup)
    graphdef, params = nnx.split(model, nnx.Param)
    tokens = _tokens((2, 9))

    x = jnp.ones((1, 1, TINY.d_model))
    np.testing.assert_allclose(
        model.logits(x), model.final_norm(x) @ model.embed.embedding[...].T, rtol=1e-6
    )
    g = jax.grad(lambda p: nnx.merge(graphdef, p)(tokens).sum())(params)
    unused = np.setdiff1d(np.arange(VOCAB_SIZE), np.asarray(tokens))
    # rows of tokens never looked up still get a gradient: through the head
    assert np.abs(np.asarray(g["embed"]["embedding"][...])[unused]).sum() > 0


def test_causality():
    model = TINY.build(nnx.Rngs(1))
    tokens = _tokens((2, 24))
    changed = tokens.at[:, 15].set((tokens[:, 15] + 1) % VOCAB_SIZE)
    a, b = model(tokens), model(changed)
    np.testing.assert_array_equal(a[:, :15], b[:, :15])  # the past never sees the future
    assert not np.allclose(a[:, 15:], b[:, 15:])  # ...and the change is visible after it


def test_rotary_scores_depend_on_relative_position_only():
    q = jax.random.normal(jax.random.key(0), (1, 1, 2, 16))
    k = jax.random.normal(jax.random.key(1), (1, 1, 2, 16))

    def score(i, j):
        qi = rotary(q, jnp.array([i]))
        kj = rotary(k, jnp.array([j]))
        return jnp.einsum("bthd,bthd->h", qi, kj)

    base = score(3, 1)
    for shift in (1, 7, 100):
        np.testing.assert_allclose(score(3 + shift, 1 + shift), base, rtol=1e-4, atol=1e-5)
    assert not np.allclose(score(3, 2), base)  # another offset gives another score
    np.testing.assert_array_equal(rotary(q, jnp.array([0])), q)  # position 0 is no rotation
    np.testing.assert_allclose(  # a rotation keeps norms
        jnp.linalg.norm(rotary(q, jnp.array([5]))), jnp.linalg.norm(q), rtol=1e-6
    )


def _tagged(jaxpr) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of every ``checkpoint_name`` equation in ``jaxpr`` and its
    sub-jaxprs (scan and remat bodies)."""
    found = {
        eqn.params["name"]: tuple(eqn.outvars[0].aval.shape)
        for eqn in jaxpr.eqns
        if eqn.primitive.name == "name"
    }
    for sub in jax.extend.core.subjaxprs(jaxpr):
        found.update({k: v for k, v in _tagged(sub).items() if k not in found})
    return found


def test_every_residual_name_is_tagged_with_its_documented_shape():
    B, T, D, F = 2, 8, TINY.d_model, TINY.d_ff
    H, K, Dh = TINY.num_heads, TINY.num_kv_heads, TINY.head_dim
    policy = jax.checkpoint_policies.save_only_these_names(*RESIDUAL_NAMES)
    model = with_stack(TINY, policy=policy).build(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tokens = jnp.zeros((B, T), jnp.int32)
    grad = jax.grad(lambda p: nnx.merge(graphdef, p)(tokens).sum())
    names = _tagged(jax.make_jaxpr(grad)(params).jaxpr)
    assert tuple(names) == RESIDUAL_NAMES  # all of them, in the documented order, no others
    shapes = {  # the module docstring's table
        "layer_input": (B, T, D),
        "attn_norm": (B, T, D),
        "attn_q": (B, T, H, Dh),
        "attn_k": (B, T, K, Dh),
        "attn_v": (B, T, K, Dh),
        "attn_logits": (B, H, T, T),
        "attn_probs": (B, H, T, T),
        "attn_context": (B, T, H, Dh),
        "attn_out": (B, T, D),
        "mlp_norm": (B, T, D),
        "mlp_gate": (B, T, F),
        "mlp_up": (B, T, F),
        "mlp_act": (B, T, F),
        "mlp_down": (B, T, D),
    }
    assert names == shapes


def _logits_and_grads(cfg: LlamaConfig, tokens):
    model = cfg.build(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
        logits = nnx.merge(graphdef, p)(tokens[:, :-1])
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1)
        return -jnp.mean(picked), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return logits, grads


# The stack variants run on a smaller Llama (3 layers, grouped heads) to keep compiles short.
SMALL = dataclasses.replace(TINY, num_layers=3, d_model=64, d_ff=160)

STACKS = {
    "nothing_saveable": Stack(policy="nothing_saveable"),
    "dots_saveable": Stack(policy="dots_saveable"),
    "dots_with_no_batch_dims_saveable": Stack(policy="dots_with_no_batch_dims_saveable"),
    "everything_saveable": Stack(policy="everything_saveable"),
    "names": Stack(policy=jax.checkpoint_policies.save_only_these_names("attn_q", "mlp_act")),
    "unroll2": Stack(policy="nothing_saveable", scan_unroll=2),
    "remat_every2": Stack(policy="nothing_saveable", remat_every=2),  # segments 2, 1
    "remat_every3": Stack(policy="nothing_saveable", remat_every=3),  # one segment
    "split1": Stack(split_layers=1, split_policy="nothing_saveable"),
    "split3": Stack(policy="dots_saveable", split_layers=3, split_policy="nothing_saveable"),
    "stream1": Stack(stream_window=1),
    "stream3": Stack(stream_window=3),
}


@pytest.fixture(scope="module")
def plain():
    cache = {}

    def get(dtype):
        if dtype not in cache:
            cfg = dataclasses.replace(SMALL, dtype=dtype, param_dtype=dtype)
            cache[dtype] = _logits_and_grads(cfg, _tokens((2, 17), seed=2))
        return cache[dtype]

    return get


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", list(STACKS))
def test_every_stack_variant_matches_the_plain_stack(plain, variant, dtype):
    logits0, grads0 = plain(dtype)
    cfg = dataclasses.replace(SMALL, dtype=dtype, param_dtype=dtype, stack=STACKS[variant])
    logits, grads = _logits_and_grads(cfg, _tokens((2, 17), seed=2))
    # the forward pass is the same arithmetic under every stack: bitwise equal logits
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(logits0))
    # Gradients: remat, segments and two scans change how XLA fuses the recomputed forward
    # ops into the backward pass, so an elementwise op may round one ulp differently and
    # that propagates through the layers; as tests/test_policy_grads.py (the GPT) we allow
    # 8 ulps of the largest gradient, in the compute dtype. A layer out of order or a wrong
    # residual gives differences of ~1e-3 relative.
    eps = float(jnp.finfo(jnp.dtype(dtype)).eps)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads0))
    for (path, g0), g in zip(
        jax.tree.leaves_with_path(grads0), jax.tree.leaves(grads), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(g, np.float32),
            np.asarray(g0, np.float32),
            rtol=0,
            atol=8 * eps * scale,
            err_msg=jax.tree_util.keystr(path),
        )


@pytest.mark.parametrize(
    "bad",
    [
        dict(d_model=130),  # not divisible by heads
        dict(num_kv_heads=3),  # does not divide num_heads
        dict(num_heads=128),  # head dimension 1 is odd: no rotary pairs
        dict(num_layers=0),
        dict(dtype="float64"),
        dict(stack=Stack(split_layers=6)),
    ],
)
def test_bad_config_is_refused(bad):
    with pytest.raises(ValueError):
        dataclasses.replace(TINY, **bad)


def test_sequence_longer_than_max_seq_len_is_refused():
    model = TINY.build(nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(jnp.zeros((1, TINY.max_seq_len + 1), jnp.int32))

"""Models as Flax users write them: blocks with per-call inputs (a mask, positions, a
``deterministic`` flag) and NNX state besides ``nnx.Param`` (dropout RNG streams, batch
statistics), trained through the model protocol of :mod:`jaxoff.nn`."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxoff import ConfigError
from jaxoff.nn import Stack, check_model, model_state, run_stack, stacked
from jaxoff.step import PlainStep, TrainState
from jaxoff.step._plain import cross_entropy, split_model
from jaxoff.train import TrainConfig, train

NAMES = ("layer_input",)


class Block(nnx.Module):
    """Masked attention-like mixing with rotary-free position features; dropout and batch
    statistics when the config asks for them."""

    def __init__(self, cfg: InputsConfig, *, rngs: nnx.Rngs):
        d = cfg.width
        self.qk = nnx.Linear(d, 2 * d, rngs=rngs)
        self.pos = nnx.Linear(1, d, rngs=rngs)
        self.up = nnx.Linear(d, 2 * d, rngs=rngs)
        self.down = nnx.Linear(2 * d, d, rngs=rngs)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs) if cfg.dropout else None
        self.norm = nnx.BatchNorm(d, rngs=rngs) if cfg.batch_norm else nnx.LayerNorm(d, rngs=rngs)

    def __call__(self, h, *, mask, positions, deterministic: bool):
        h = h + self.pos(positions[..., None].astype(h.dtype))
        q, k = jnp.split(self.qk(self.norm(h)), 2, axis=-1)
        logits = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(q.shape[-1])
        logits = jnp.where(mask, logits, -1e9)
        h = h + jnp.einsum("bts,bsd->btd", jax.nn.softmax(logits, axis=-1), h)
        u = self.down(jax.nn.gelu(self.up(h)))
        if self.drop is not None:
            u = self.drop(u, deterministic=deterministic)
        return h + u


class LinenBlock(nn.Module):
    """The same role in Flax linen: the user's block as it is, its inputs as arguments."""

    width: int
    dropout: float

    @nn.compact
    def __call__(self, h, mask, positions, deterministic: bool):
        h = h + nn.Dense(self.width)(positions[..., None].astype(h.dtype))
        q, k = jnp.split(nn.Dense(2 * self.width)(nn.LayerNorm()(h)), 2, axis=-1)
        logits = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(q.shape[-1])
        logits = jnp.where(mask, logits, -1e9)
        h = h + jnp.einsum("bts,bsd->btd", jax.nn.softmax(logits, axis=-1), h)
        u = nn.Dense(self.width)(nn.gelu(nn.Dense(2 * self.width)(h)))
        return h + nn.Dropout(self.dropout, deterministic=deterministic)(u)


class FromLinen(nnx.Module):
    """A linen block in the stack: ``nnx.bridge.ToNNX``, initialised at a small shape."""

    def __init__(self, cfg: InputsConfig, *, rngs: nnx.Rngs):
        self.inner = nnx.bridge.ToNNX(LinenBlock(cfg.width, cfg.dropout), rngs=rngs)
        x, t = jnp.zeros((1, 2, cfg.width)), jnp.ones((1, 2, 2), bool)
        nnx.bridge.lazy_init(self.inner, x, t, jnp.zeros((1, 2)), True)

    def __call__(self, h, *, mask, positions, deterministic: bool):
        return self.inner(h, mask, positions, deterministic)


class Model(nnx.Module):
    def __init__(self, cfg: InputsConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tok = nnx.Embed(cfg.vocab_size, cfg.width, rngs=rngs)
        block = FromLinen if cfg.linen else Block
        self.blocks = stacked(lambda r: block(cfg, rngs=r), cfg.num_layers, rngs)
        self.out = nnx.Linear(cfg.width, cfg.vocab_size, rngs=rngs)

    def embed_tokens(self, tokens):
        return self.tok(tokens)

    def logits(self, x):
        return self.out(x).astype(jnp.float32)

    def __call__(self, tokens, deterministic: bool = True):
        t = tokens.shape[1]
        causal = jnp.tril(jnp.ones((t, t), bool))
        segments = jnp.cumsum(tokens == ord("\n"), axis=1)  # documents end at a newline
        mask = causal[None] & (segments[:, :, None] == segments[:, None, :])
        positions = jnp.broadcast_to(jnp.arange(t), tokens.shape)
        x = run_stack(
            self.blocks,
            self.embed_tokens(tokens),
            self.cfg.stack,
            mask=mask,
            positions=positions,
            deterministic=deterministic,
        )
        return self.logits(x)


@dataclasses.dataclass(frozen=True)
class InputsConfig:
    num_layers: int = 2
    width: int = 16
    max_seq_len: int = 32
    vocab_size: int = 256
    dtype: str = "float32"
    param_dtype: str = "float32"
    stack: Stack = Stack()
    dropout: float = 0.0
    batch_norm: bool = False
    linen: bool = False
    name: str = ""

    residual_names = NAMES

    def build(self, rngs):
        return Model(self, rngs=rngs)


def _batches(n, seed=0, batch=4, seq=16):
    rng = np.random.default_rng(seed)
    text = rng.choice(np.frombuffer(b"abcdefgh\n", np.uint8), size=(n, batch, seq + 1))
    toks = jnp.asarray(text, jnp.int32)
    return [(t[:, :-1], t[:, 1:]) for t in toks]


def _plain_loop(cfg, tx, batches, seed=0):
    """The reference: the user's own JAX/optax loop on the same model and inputs."""
    graphdef, params, rest = split_model(cfg.build(nnx.Rngs(seed)))
    opt_state = tx.init(params)

    def loss(params, rest, x, y):
        model = nnx.merge(graphdef, params, *([] if rest is None else [rest]), copy=True)
        logits = model(x, deterministic=False)
        new_rest = None if rest is None else nnx.split(model, nnx.Param, ...)[2]
        return cross_entropy(logits, y), new_rest

    @jax.jit
    def step(params, opt_state, rest, x, y):
        (value, rest), grads = jax.value_and_grad(loss, has_aux=True)(params, rest, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rest, value

    losses = []
    for x, y in batches:
        params, opt_state, rest, value = step(params, opt_state, rest, x, y)
        losses.append(float(value))
    return losses, params, rest


def _jaxoff_steps(cfg, tx, batches, seed=0):
    step = PlainStep(cfg, tx, seed=seed)
    state = step.compile(step.init(), *batches[0])
    losses = []
    for x, y in batches:
        state, metrics = step(state, x, y)
        losses.append(float(metrics["loss"]))
    return losses, state, step


def _bits(a):
    return np.asarray(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a)


def _same(a, b):
    jax.tree.map(lambda u, v: np.testing.assert_array_equal(_bits(u), _bits(v)), a, b)


@pytest.mark.parametrize(
    "stack",
    [Stack(), Stack(policy="nothing_saveable"), Stack(split_layers=1)],
    ids=["scan", "remat", "split"],
)
def test_nnx_block_with_mask_positions_and_flag_matches_a_plain_loop(stack):
    cfg = InputsConfig(stack=stack)
    batches = _batches(3)
    tx = optax.adam(1e-2)
    ref_losses, ref_params, _ = _plain_loop(cfg, tx, batches)
    losses, state, _ = _jaxoff_steps(cfg, tx, batches)
    assert losses == ref_losses  # bitwise
    assert type(state) is TrainState  # no state besides nnx.Param: three fields, as ever
    _same(state.params, ref_params)


def test_linen_block_with_mask_positions_and_dropout_matches_a_plain_loop():
    cfg = InputsConfig(linen=True, dropout=0.2, stack=Stack(policy="nothing_saveable"))
    batches = _batches(3)
    tx = optax.adam(1e-2)
    ref_losses, ref_params, ref_rest = _plain_loop(cfg, tx, batches)
    losses, state, step = _jaxoff_steps(cfg, tx, batches)
    assert losses == ref_losses  # bitwise, dropout masks included
    _same(state.params, ref_params)
    _same(state.rest, ref_rest)  # the bridge's RNG stream, advanced as the plain loop's
    x, y = batches[0]
    assert float(step.evaluate(state, x, y)) == float(step.evaluate(state, x, y))


def test_the_mask_and_the_flag_reach_every_block():
    cfg = InputsConfig(dropout=0.5)
    model = cfg.build(nnx.Rngs(0))
    x = _batches(1)[0][0]
    # one document per row: the first position attends to itself only, whatever follows
    y = model(x, deterministic=True)
    changed = x.at[:, 1:].set((x[:, 1:] + 1) % 8 + ord("a"))
    np.testing.assert_array_equal(y[:, 0], model(changed, deterministic=True)[:, 0])
    assert not np.array_equal(np.asarray(y), np.asarray(model(x, deterministic=False)))


def test_dropout_and_batch_stats_are_carried_outside_the_optimizer():
    cfg = InputsConfig(dropout=0.3, batch_norm=True)
    batches = _batches(3)
    tx = optax.adam(1e-2)
    ref_losses, ref_params, ref_rest = _plain_loop(cfg, tx, batches)
    losses, state, step = _jaxoff_steps(cfg, tx, batches)
    assert losses == ref_losses  # bitwise, dropout masks included
    _same(state.params, ref_params)
    _same(state.rest, ref_rest)
    paths = lambda tree: {jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(tree)}  # noqa: E731
    assert paths(state.params).isdisjoint(paths(state.rest))
    assert paths(state.opt_state[0].mu) == paths(state.params)  # the optimizer: params only
    counts = [a for a in jax.tree.leaves(state.rest) if a.dtype == jnp.uint32]
    assert counts and all(int(c.max()) == 3 for c in counts)  # one draw per step and layer
    # evaluation is deterministic (dropout off, running statistics) and leaves the state
    x, y = batches[0]
    first = float(step.evaluate(state, x, y))
    assert first == float(step.evaluate(state, x, y))
    # training draws new masks: the same parameters, the next RNG count, another loss
    loss_fn = jax.jit(
        lambda p, r: nnx.merge(step.graphdef, p, r, copy=True)(x, deterministic=False).sum()
    )
    advanced = jax.tree.map(lambda a: a + 1 if a.dtype == jnp.uint32 else a, state.rest)
    assert float(loss_fn(state.params, state.rest)) != float(loss_fn(state.params, advanced))


@pytest.mark.parametrize("store", ["none", "auto"])
def test_a_dropout_model_trains_and_resumes_bitwise(tmp_path, store):
    cfg = InputsConfig(dropout=0.1, batch_norm=True)
    common = dict(
        batch_size=4,
        seq_len=16,
        steps=8,
        lr=1e-2,
        warmup_steps=1,
        eval_every=4,
        ckpt_every=3,
        progress=False,
        store=store,
        chunk_mib=1,
    )
    full = train(TrainConfig(**common, out_dir=tmp_path / "full"), model=cfg)
    assert np.mean(full.losses[-2:]) < np.mean(full.losses[:2])
    part = TrainConfig(**common, out_dir=tmp_path / "part", stop_at=5)
    first = train(part, model=cfg)
    resumed = train(dataclasses.replace(part, stop_at=0, resume=True), model=cfg)
    assert first.losses + resumed.losses == full.losses  # bitwise: float equality


def test_state_in_blocks_is_refused_where_a_custom_vjp_runs_the_layers():
    x = jnp.ones((2, 4, 16))
    for stack in (Stack(policy="nothing_saveable", remat_every=2), Stack(stream_window=1)):
        cfg = InputsConfig(dropout=0.1, stack=stack)
        model = cfg.build(nnx.Rngs(0))
        with pytest.raises(ConfigError, match="besides nnx.Param") as e:
            run_stack(
                model.blocks, x, stack, mask=True, positions=jnp.zeros((2, 4)), deterministic=True
            )
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("options", "advice"),
    [
        (dict(fuyou=True, clip_norm=0.0), "train it without `fuyou=True`"),
        (dict(fsdp=2), "`fsdp` and `store='none'`"),
    ],
    ids=["fuyou", "sharded"],
)
def test_fuyou_and_the_sharded_step_refuse_model_state_in_one_line(tmp_path, options, advice):
    cfg = TrainConfig(
        batch_size=4, seq_len=16, steps=2, eval_every=0, ckpt_every=0, progress=False,
        store="auto", chunk_mib=1, out_dir=tmp_path / "run", **options,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="RngCount, RngKey") as e:
        train(cfg, model=InputsConfig(dropout=0.1))
    assert advice in str(e.value) and "\n" not in str(e.value)
    feature = "fuyou" if options.get("fuyou") else "sharded"
    assert check_model(InputsConfig(), needs=[feature])  # no such state: accepted


def test_model_state_is_what_the_optimizer_does_not_see():
    model = InputsConfig(dropout=0.1, batch_norm=True).build(nnx.Rngs(0))
    kinds = {
        type(v).__name__
        for v in jax.tree.leaves(model_state(model), is_leaf=lambda v: isinstance(v, nnx.Variable))
    }
    assert {"RngCount", "RngKey", "BatchStat"} <= kinds
    assert split_model(InputsConfig().build(nnx.Rngs(0)))[2] is None


def test_compare_strategies_prepare_a_model_with_state_or_refuse_it_in_one_line():
    """``jaxoff compare --strategies`` builds its steps with ``jaxoff.strategies.prepare``:
    a dropout + batch-norm model gets its rest carried (the step runs, the RNG count moves),
    and Fuyou's recipe refuses it with a ConfigError, not flax's filter error."""
    from jaxoff.strategies import Recipe, prepare

    cfg = InputsConfig(dropout=0.1, batch_norm=True)
    p = prepare(Recipe(policy="none"), cfg, optax.adam(1e-2))
    (x, y), _ = _batches(2)
    before = [np.asarray(a) for a in jax.tree.leaves(p.state.rest) if a.dtype == jnp.uint32]
    state, metrics = p.step(p.state, x, y)
    after = [np.asarray(a) for a in jax.tree.leaves(state.rest) if a.dtype == jnp.uint32]
    assert np.isfinite(float(metrics["loss"]))
    assert before and all((b + 1 == a).all() for b, a in zip(before, after, strict=True))
    with pytest.raises(ConfigError, match="fuyou|Fuyou"):
        prepare(Recipe(update_in_backward=True), cfg, optax.adam(1e-2))

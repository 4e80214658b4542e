"""jaxoff.paged as a drop-in in Flax's own training loops and orbax's CheckpointManager.

The loops are the ones in Flax's documentation (NNX: ``nnx.Optimizer`` with an ``nnx.jit``
train step; linen: ``flax.training.train_state.TrainState``), with ``optax.adamw(...)``
swapped for ``jaxoff.paged(optax.adamw(...), directory)`` and nothing else changed.
"""

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from flax.training import train_state

from jaxoff.optim import PagedRestore, PagedSave, PagedTensors, paged


# ---------------------------------------------------------------- Flax NNX (the MNIST tutorial)
class CNN(nnx.Module):
    """A simple CNN model (Flax's "MNIST tutorial" model, smaller)."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = lambda x: nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(4 * 4 * 16, 64, rngs=rngs)
        self.linear2 = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.linear1(x))
        return self.linear2(x)


def loss_fn(model: CNN, batch):
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits=logits, labels=batch["label"]
    ).mean()
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # in-place updates
    optimizer.update(model, grads)  # in-place updates


def mnist_batch(step, n=16):
    k1, k2 = jax.random.split(jax.random.key(1000 + step))
    return {
        "image": jax.random.normal(k1, (n, 16, 16, 1)),
        "label": jax.random.randint(k2, (n,), 0, 10),
    }


def nnx_run(tx, steps, start=None):
    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    losses = []
    for step in range(steps):
        train_step(model, optimizer, metrics, mnist_batch(step))
        losses.append(float(metrics.compute()["loss"]))
        metrics.reset()
    return model, optimizer, np.asarray(losses)


def test_nnx_optimizer_documented_loop(tmp_path):
    learning_rate, momentum = 5e-3, 0.9
    ptx = paged(optax.adamw(learning_rate, momentum), tmp_path / "store", chunk_bytes=4096)
    model, optimizer, losses = nnx_run(ptx, 12)
    _, plain_opt, plain_losses = nnx_run(optax.adamw(learning_rate, momentum), 12)
    plain_model = plain_opt.model if hasattr(plain_opt, "model") else None
    del plain_model
    # The state lives in the store: moments are PagedTensors, count is a RAM leaf.
    state = optimizer.opt_state
    assert isinstance(state.inner_state[0].mu, PagedTensors)
    assert int(optimizer.step[...]) == 12 and int(state.inner_state[0].count[...]) == 12
    assert ptx.store.version == 13
    # Equal to plain optax in the same loop, up to last-bit rounding of a different program.
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-4)
    want = nnx.state(nnx_run(optax.adamw(learning_rate, momentum), 12)[0], nnx.Param)
    got = nnx.state(model, nnx.Param)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
    ptx.close()


def test_nnx_optimizer_checkpoint_manager(tmp_path):
    """nnx.state(optimizer) through CheckpointManager: save, train on, restore, train again."""
    tx = paged(optax.adamw(5e-3), tmp_path / "store", chunk_bytes=4096)
    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average("loss"))
    mngr = ocp.CheckpointManager(tmp_path / "ckpt")
    params_at = {}
    for step in range(8):
        train_step(model, optimizer, metrics, mnist_batch(step))
        if step == 3:
            mngr.save(
                4,
                args=PagedSave(tx, {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}),
            )
            mngr.wait_until_finished()
        params_at[step + 1] = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    # Restore step 4 into the live objects, and train steps 4..7 again.
    abstract = {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract)
    restored = mngr.restore(4, args=PagedRestore(tx, abstract))
    nnx.update(model, restored["model"])
    nnx.update(optimizer, restored["optimizer"])
    assert int(optimizer.step[...]) == 4
    for step in range(4, 8):
        train_step(model, optimizer, metrics, mnist_batch(step))
    for a, b in zip(
        jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(params_at[8]), strict=True
    ):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    mngr.close()
    tx.close()


# ---------------------------------------------------------------- linen TrainState
class MLP(linen.Module):
    @linen.compact
    def __call__(self, x):
        x = linen.relu(linen.Dense(48)(x))
        return linen.Dense(10)(x)


@jax.jit
def linen_step(state: train_state.TrainState, batch):
    def loss(params):
        logits = state.apply_fn(
            {"params": params}, batch["image"].reshape(batch["image"].shape[0], -1)
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

    value, grads = jax.value_and_grad(loss)(state.params)
    return state.apply_gradients(grads=grads), value


def linen_state(tx):
    model = MLP()
    params = model.init(jax.random.key(0), jnp.ones((1, 256)))["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def linen_run(state, start, stop):
    losses = []
    for step in range(start, stop):
        state, loss = linen_step(state, mnist_batch(step))
        losses.append(float(loss))
    return state, np.asarray(losses)


def test_linen_train_state_loop(tmp_path):
    make = lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3))  # noqa: E731
    tx = paged(make(), tmp_path / "store", chunk_bytes=4096)
    state, losses = linen_run(linen_state(tx), 0, 10)
    plain, plain_losses = linen_run(linen_state(make()), 0, 10)
    assert int(state.step) == 10 and tx.store.version == 11
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-4)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(plain.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
    n = linen_step._cache_size()
    linen_run(state, 10, 12)
    assert linen_step._cache_size() == n  # no recompilation after the first steps
    tx.close()


@pytest.mark.parametrize("composite", [False, True], ids=["alone", "composite"])
def test_checkpoint_manager_save_train_restore_train(tmp_path, composite):
    """Save at step 4 with CheckpointManager, train to 9, restore 4, train again: the same
    parameters and losses as the uninterrupted run from step 4, bit for bit; the restored
    version keeps the number it was saved under, so the restored state (the version is all
    of the store it holds) describes the store again."""
    tx = paged(optax.adamw(3e-3, weight_decay=0.1), tmp_path / "store", chunk_bytes=4096)
    mngr = ocp.CheckpointManager(tmp_path / "ckpt")
    state, _ = linen_run(linen_state(tx), 0, 4)

    def save_args(s):
        if composite:
            return ocp.args.Composite(
                params=ocp.args.StandardSave(s.params),
                train=PagedSave(tx, {"step": s.step, "opt": s.opt_state}),
            )
        return PagedSave(tx, s)

    mngr.save(4, args=save_args(state))
    mngr.wait_until_finished()
    version_at_save = tx.store.version
    end, losses = linen_run(state, 4, 9)
    assert tx.store.version == version_at_save + 5
    abstract = jax.eval_shape(lambda: state)
    if composite:
        r = mngr.restore(
            4,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract.params),
                train=PagedRestore(tx, {"step": abstract.step, "opt": abstract.opt_state}),
            ),
        )
        restored = state.replace(
            step=r["train"]["step"], params=r["params"], opt_state=r["train"]["opt"]
        )
    else:
        restored = mngr.restore(4, args=PagedRestore(tx, abstract))
    assert tx.store.version == version_at_save == int(restored.opt_state.version)
    again, losses2 = linen_run(restored, 4, 9)
    assert losses2.tobytes() == losses.tobytes()
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(end.params), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    # ... into another store directory (a new process would do this after tx.init or
    # jax.eval_shape(tx.init, params)).
    tx2 = paged(optax.adamw(3e-3, weight_decay=0.1), tmp_path / "other", chunk_bytes=4096)
    abstract2 = jax.eval_shape(lambda: linen_state(tx2))
    if not composite:
        restored2 = mngr.restore(4, args=PagedRestore(tx2, abstract2))
        again2, losses3 = linen_run(restored2.replace(apply_fn=state.apply_fn), 4, 9)
        assert losses3.tobytes() == losses.tobytes()
    mngr.close()
    tx.close()
    tx2.close()


def test_standard_save_alone_is_refused_as_stale(tmp_path):
    """The usual StandardSave keeps only the RAM part; restoring it after the store moved on is
    refused with that reason (not as a corrupt page file)."""
    tx = paged(optax.adamw(3e-3), tmp_path / "store", chunk_bytes=4096)
    mngr = ocp.CheckpointManager(tmp_path / "ckpt")
    state, _ = linen_run(linen_state(tx), 0, 3)
    mngr.save(3, args=ocp.args.StandardSave(state))
    mngr.wait_until_finished()
    linen_run(state, 3, 5)
    old = mngr.restore(3, args=ocp.args.StandardRestore(jax.eval_shape(lambda: state)))
    with pytest.raises(Exception, match="the state is stale.*PagedSave"):
        jax.block_until_ready(linen_run(old, 3, 4))
    # Saving a state that is not the store's latest is refused at save time as well.
    mngr.close()
    mngr = ocp.CheckpointManager(tmp_path / "ckpt2")
    with pytest.raises(Exception, match="stale"):
        mngr.save(4, args=PagedSave(tx, state))
    mngr.close()
    tx.close()

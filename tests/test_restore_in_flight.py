"""A restore waits for the steps still in flight: issue 46's rollback in a user's own loop.

A jitted, donated paged step is dispatched a few times after a checkpoint and nothing reads
its results (as ordinary JAX code does); then the checkpoint is restored and training goes
on. The steps in flight must commit before the restore takes the store over, not over it:
the continued run equals, bitwise, one restored from the same checkpoint in a fresh store.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from jaxoff.optim import PagedRestore, PagedSave, paged, restore_paged, save_paged


def _params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w": jax.random.normal(k1, (64, 512)), "b": jax.random.normal(k2, (512,))}


def _stepper(tx):
    @partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt, k):
        grads = jax.tree.map(lambda p: jnp.sin(p * k) + 0.01 * k, params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    return step


def _continue(tx, params, opt, steps):
    step = _stepper(tx)
    for k in steps:
        params, opt = step(params, opt, jnp.float32(k))
    return jax.device_get(params)


def test_restore_paged_waits_for_dispatched_steps(tmp_path):
    tx = paged(optax.adamw(1e-2), tmp_path / "store")
    step = _stepper(tx)
    params = _params()
    opt = tx.init(params)
    for k in range(10):
        params, opt = step(params, opt, jnp.float32(k))
    save_paged(tx, opt, tmp_path / "ckpt")
    saved = jax.device_get(params)
    for k in range(10, 15):  # dispatched, never read
        params, opt = step(params, opt, jnp.float32(k))
    opt = restore_paged(tx, tmp_path / "ckpt", saved)
    got = _continue(tx, jax.tree.map(jnp.asarray, saved), opt, range(10, 14))
    tx.close()

    fresh = paged(optax.adamw(1e-2), tmp_path / "fresh")
    opt2 = restore_paged(fresh, tmp_path / "ckpt", saved)
    want = _continue(fresh, jax.tree.map(jnp.asarray, saved), opt2, range(10, 14))
    fresh.close()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_paged_restore_in_the_nnx_optimizer_loop_waits(tmp_path):
    def build():
        return nnx.Linear(64, 256, rngs=nnx.Rngs(0))

    @nnx.jit
    def train_step(model, optimizer, x):
        grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)

    def run(store, restore_from=None, detour=0):
        model = build()
        tx = paged(optax.adamw(1e-2), store)
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        mngr = ocp.CheckpointManager(tmp_path / f"ckpt-{store.name}")
        xs = [jax.random.normal(jax.random.key(i), (8, 64)) for i in range(20)]
        if restore_from is None:
            for i in range(10):
                train_step(model, optimizer, xs[i])
            mngr.save(10, args=PagedSave(tx, nnx.state((model, optimizer))))
            mngr.wait_until_finished()
            for i in range(10, 10 + detour):  # dispatched, never read
                train_step(model, optimizer, xs[i])
            mngr_from = mngr
        else:
            mngr_from = restore_from
        abstract = nnx.state((model, optimizer))
        restored = mngr_from.restore(10, args=PagedRestore(tx, abstract))
        nnx.update((model, optimizer), restored)
        for i in range(10, 14):
            train_step(model, optimizer, xs[i])
        out = jax.device_get(nnx.state(model, nnx.Param))
        tx.close()
        return out, mngr

    got, mngr = run(tmp_path / "a", detour=5)
    want, _ = run(tmp_path / "b", restore_from=mngr)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)

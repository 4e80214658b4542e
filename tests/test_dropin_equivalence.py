"""What 'equal to optax' means, measured in the test itself.

Plain optax differs from itself in the last bits when the same update is compiled as another
program (a whole tree or leaf by leaf; gradient and update in one jit or two), and training
amplifies those bits. That is the noise floor. Paged training (200 steps of a tiny MLP) must
stay within it, measured in the same test against the user's whole-tree jitted step; and it
is bitwise equal to optax run leaf by leaf (the tests in test_paged.py and test_dropin_optax.py).
"""

import os
import sys

import jax
import numpy as np
import optax

from jaxoff.optim import paged, update_and_apply

sys.path.insert(0, os.path.dirname(__file__))
from test_paged import batch, loss_fn, mlp_params  # noqa: E402

STEPS = 200
# Paged is one more regrouping of the same arithmetic; a factor 2 over the largest distance
# between two regroupings of plain optax leaves room for the randomness of which bits round
# which way. A wrong update (bias correction, decay, schedule off by one step) is orders of
# magnitude beyond the floor.
FACTOR = 2.0


def make_tx():
    lr = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 20, STEPS, end_value=1e-3)
    return optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1)


def _data():
    return [batch(t) for t in range(STEPS)]


def _loop(step, tx, data):
    p = mlp_params()
    s = tx.init(p)
    losses = []
    for x, y in data:
        p, s, loss = step(p, s, x, y)
        losses.append(loss)
    return p, np.asarray(losses, np.float64)


def run_whole(tx, data, paged_apply=False):
    @jax.jit
    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        if paged_apply:
            p, s = update_and_apply(tx, g, s, p)
        else:
            u, s = tx.update(g, s, p)
            p = optax.apply_updates(p, u)
        return p, s, loss

    return _loop(step, tx, data)


def run_split(tx, data):
    grad = jax.jit(jax.value_and_grad(loss_fn))

    @jax.jit
    def update(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    def step(p, s, x, y):
        loss, g = grad(p, x, y)
        return (*update(p, s, g), loss)

    return _loop(step, tx, data)


def run_leaf(tx, data):
    p = mlp_params()
    leaves, treedef = jax.tree.flatten(p)
    states = [tx.init({"x": x}) for x in leaves]
    grad = jax.jit(jax.value_and_grad(loss_fn))

    @jax.jit
    def leaf_step(g, s, x):
        u, s = tx.update({"x": g}, s, {"x": x})
        return optax.apply_updates({"x": x}, u)["x"], s

    losses = []
    for x, y in data:
        loss, g = grad(jax.tree.unflatten(treedef, leaves), x, y)
        for i, gi in enumerate(jax.tree.leaves(g)):
            leaves[i], states[i] = leaf_step(gi, states[i], leaves[i])
        losses.append(loss)
    return jax.tree.unflatten(treedef, leaves), np.asarray(losses, np.float64)


def distance(a, b) -> tuple[float, float]:
    (p, lp), (q, lq) = a, b
    x = np.concatenate([np.asarray(v, np.float64).ravel() for v in jax.tree.leaves(p)])
    y = np.concatenate([np.asarray(v, np.float64).ravel() for v in jax.tree.leaves(q)])
    return float(np.linalg.norm(x - y) / np.linalg.norm(y)), float(np.max(np.abs(lp - lq) / lq))


def test_paged_training_stays_within_the_noise_floor_of_optax(tmp_path):
    data = _data()
    plain = run_whole(make_tx(), data)
    floors = [
        distance(run_split(make_tx(), data), plain),
        distance(run_leaf(make_tx(), data), plain),
    ]
    floor_params = max(f[0] for f in floors)
    floor_loss = max(f[1] for f in floors)
    assert floor_params > 0  # plain optax is not bitwise stable: there is a floor to measure
    assert plain[1][-1] < 0.8 * plain[1][0]  # it trains
    for fused in (True, False):
        tx = paged(make_tx(), tmp_path / f"s{fused}", chunk_bytes=4096)
        got = run_whole(tx, data, paged_apply=fused)
        d_params, d_loss = distance(got, plain)
        assert d_params <= FACTOR * floor_params, (fused, d_params, floor_params)
        assert d_loss <= FACTOR * floor_loss + 1e-12, (fused, d_loss, floor_loss)
        tx.close()


def test_the_floor_test_can_fail(tmp_path):
    """A slightly different optimizer (b2 0.95 -> 0.951) is far outside the floor."""
    data = _data()[:60]
    plain = run_whole(make_tx(), data)
    floor = distance(run_split(make_tx(), data), plain)[0]
    lr = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 20, STEPS, end_value=1e-3)
    other = paged(
        optax.adamw(lr, b1=0.9, b2=0.951, weight_decay=0.1), tmp_path / "s", chunk_bytes=4096
    )
    assert distance(run_whole(other, data, paged_apply=True), plain)[0] > 10 * FACTOR * floor
    other.close()

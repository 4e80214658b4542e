"""jaxoff.optim.paged: bitwise equal to plain optax, chunk by chunk from a page store."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxoff.aio import PageStoreLayoutError
from jaxoff.aio._layout import MAX_CHUNK_BYTES
from jaxoff.optim import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_ENGINE,
    NotElementwiseError,
    load_state,
    paged,
    update_and_apply,
)

LR = optax.warmup_cosine_decay_schedule(0.0, 3e-2, 5, 30, end_value=3e-3)
OPTIMIZERS = {
    "adamw": lambda: optax.adamw(LR, b1=0.9, b2=0.95, weight_decay=0.1),
    "adam": lambda: optax.adam(LR),
    "lion": lambda: optax.lion(LR, weight_decay=0.1),
    "sgd": lambda: optax.sgd(LR, momentum=0.9),
    "rmsprop": lambda: optax.rmsprop(LR),
}


def mlp_params(dtype=jnp.float32, seed=0):
    """A tiny MLP whose leaves are 1, 2 and 5 chunks of 4 KiB (and a scalar)."""
    k = jax.random.split(jax.random.key(seed), 4)
    return {
        "l1": {"w": jax.random.normal(k[0], (24, 100), dtype) * 0.2, "b": jnp.zeros(100, dtype)},
        "l2": {"w": jax.random.normal(k[1], (100, 33), dtype) * 0.1, "b": jnp.zeros(33, dtype)},
        "scale": jnp.ones((), dtype),
    }


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["l1"]["w"] + params["l1"]["b"])
    out = (h @ params["l2"]["w"] + params["l2"]["b"]) * params["scale"]
    return jnp.mean((out.astype(jnp.float32) - y) ** 2)


def batch(step):
    k1, k2 = jax.random.split(jax.random.key(100 + step))
    return jax.random.normal(k1, (16, 24)), jax.random.normal(k2, (16, 33))


def make_step(tx, dtype=jnp.float32, fused=False):
    def step(params, opt_state, x, y):
        grads = jax.grad(loss_fn)(params, x.astype(dtype), y)
        # XLA contracts a*b+c into FMA inside a fusion; plain optax would otherwise fuse the
        # gradient's last ops into the update, the paged update reads materialised gradients.
        grads = jax.lax.optimization_barrier(grads)
        if fused:
            return update_and_apply(tx, grads, opt_state, params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step, donate_argnums=(0, 1))


def run(tx, params, steps, dtype=jnp.float32, fused=False):
    step = make_step(tx, dtype, fused)
    state = tx.init(params)
    for t in range(steps):
        params, state = step(params, state, *batch(t))
    return params, state, step


def run_reference(inner, params, steps, clip=None, dtype=jnp.float32):
    """Plain optax, one jitted update per parameter leaf, on materialised gradients.

    This is the arithmetic the paged pipeline performs, compiled the same way: XLA rewrites the
    step-count scalars and contracts multiply-adds to FMA depending on the surrounding
    program, so plain optax on a one-leaf tree and on a many-leaf tree differ in the last bit
    for the same leaf (test_whole_tree_optax_is_not_bitwise_stable). Returns the parameters,
    the fp32 masters and, per leaf, the per-parameter state tensors.
    """
    leaves, treedef = jax.tree.flatten(params)
    master = [{"x": x.astype(jnp.float32)} for x in leaves]
    states = [inner.init(m) for m in master]
    clip_state = clip.init(params) if clip is not None else None

    @jax.jit
    def grad_fn(p, x, y, clip_state):
        g = jax.lax.optimization_barrier(jax.grad(loss_fn)(p, x.astype(dtype), y))
        # Global ops on the gradients in RAM, in the same program; the clipped gradients are
        # its outputs, materialised, as the paged pipeline reads them (Pager._step).
        if clip is not None:
            g, clip_state = clip.update(g, clip_state, p)
        return g, clip_state

    @jax.jit
    def leaf_step(g, s, m):
        u, s = inner.update({"x": g.astype(jnp.float32)}, s, m)
        return optax.apply_updates(m, u), s

    def current():
        return jax.tree.unflatten(
            treedef, [m["x"].astype(x.dtype) for m, x in zip(master, leaves, strict=True)]
        )

    for t in range(steps):
        p = current()
        g, clip_state = grad_fn(p, *batch(t), clip_state)
        for i, gi in enumerate(jax.tree.leaves(g)):
            master[i], states[i] = leaf_step(gi, states[i], master[i])
    is_node = lambda x: isinstance(x, dict) and list(x) == ["x"]
    moments = [[n["x"] for n in jax.tree.leaves(s, is_leaf=is_node) if is_node(n)] for s in states]
    return current(), [m["x"] for m in master], moments


def assert_trees_equal(a, b):
    for (path, x), y in zip(
        jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True
    ):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, path
        assert x.tobytes() == y.tobytes(), (
            jax.tree_util.keystr(path),
            np.max(np.abs(x.astype(float) - y.astype(float))),
        )


def check_store(tx, params, ref_master, ref_moments):
    """Every paged tensor in the store (master copies, moments) equals the reference's."""
    plan = tx.pager.plan(params)
    for e in plan.entries:
        ref = ref_master[e.leaf] if e.node < 0 else ref_moments[e.leaf][e.node]
        got = tx.store.read(e.name).astype(e.dtype)
        assert got.tobytes() == np.asarray(ref).tobytes(), e.name
    return len(plan.entries)


@pytest.mark.parametrize(
    "name, clip, chunk_bytes",
    [(n, False, 4096) for n in OPTIMIZERS]
    + [(n, "outside", 8192) for n in ("adamw", "lion", "sgd")]
    + [(n, "inside", 4096) for n in ("adamw", "rmsprop")]
    + [("adam", "inside", 1 << 20)],
)
def test_bitwise_equal_to_optax(tmp_path, name, clip, chunk_bytes):
    inner = OPTIMIZERS[name]()
    clipper = optax.clip_by_global_norm(0.5)
    if clip == "outside":
        ptx = paged(inner, tmp_path / "s", chunk_bytes=chunk_bytes)
        tx = optax.chain(clipper, ptx)
    elif clip == "inside":  # leading global ops are split off and run in RAM
        tx = ptx = paged(optax.chain(clipper, inner), tmp_path / "s", chunk_bytes=chunk_bytes)
    else:
        tx = ptx = paged(inner, tmp_path / "s", chunk_bytes=chunk_bytes)
    want, ref_master, ref_moments = run_reference(
        inner, mlp_params(), 20, clipper if clip else None
    )
    got, state, step = run(tx, mlp_params(), 20, fused=True)
    assert_trees_equal(got, want)
    n = check_store(ptx, got, ref_master, ref_moments)
    assert n == {"adamw": 2, "adam": 2, "lion": 1, "sgd": 1, "rmsprop": 1}[name] * 5
    assert step._cache_size() == 1  # no recompilation after step 1 (slot flips are operands)
    assert ptx.store.version == 21
    ptx.close()
    # The optax protocol (tx.update + apply_updates) and plain optax on the whole tree: the
    # same up to last-bit rounding (float32 updates new - old cannot always be exact).
    tx2 = paged(inner, tmp_path / "s2", chunk_bytes=chunk_bytes)
    via_updates, _, _ = run(optax.chain(clipper, tx2) if clip else tx2, mlp_params(), 20)
    whole, _, _ = run(optax.chain(clipper, inner) if clip else inner, mlp_params(), 20)
    for a, b, c in zip(
        jax.tree.leaves(got), jax.tree.leaves(whole), jax.tree.leaves(via_updates), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-4, atol=1e-6)
    tx2.close()


def test_a_chunk_update_traces_its_own_leaf_only(tmp_path):
    """Each chunk update calls the inner transformation on a tree holding its leaf alone (the
    others are ``optax.MaskedNode()``): tracing a model of N leaves costs N leaf updates, not
    N squared (a tree of one-element arrays traced every leaf for every leaf), and the
    result is still optax run leaf by leaf."""
    base = optax.adamw(1e-2, weight_decay=0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p))
    seen = []

    def update(updates, state, params=None, **extra):
        seen.append(len(jax.tree.leaves(updates)))
        return base.update(updates, state, params, **extra)

    inner = optax.GradientTransformationExtraArgs(base.init, update)
    tx = paged(inner, tmp_path / "s", chunk_bytes=4096, probe=False)
    params = mlp_params()
    n = len(jax.tree.leaves(params))
    step = make_step(tx, fused=True)
    state = tx.init(params)
    seen.clear()
    got, _ = step(params, state, *batch(0))
    # one call per leaf and chunk shape on that leaf alone; one on empty leaves for the
    # step-count scalars (every leaf, no arithmetic)
    assert seen.count(1) >= n and len(seen) - seen.count(1) <= 1, seen
    want, _, _ = run_reference(base, mlp_params(), 1)
    assert_trees_equal(got, want)
    tx.close()


def test_whole_tree_optax_is_not_bitwise_stable():
    """Why the reference updates leaf by leaf: plain optax itself is not bitwise stable."""
    inner = optax.adamw(3e-2, weight_decay=0.1)

    def update(tree):
        return jax.jit(lambda g, s, p: optax.apply_updates(p, inner.update(g, s, p)[0]))(
            tree, inner.init(tree), tree
        )

    w = jax.random.normal(jax.random.key(0), (4000,))
    alone = update({"w": w})["w"]
    with_other = update({"w": w, "b": jnp.ones(100)})["w"]
    assert np.asarray(alone).tobytes() != np.asarray(with_other).tobytes()
    np.testing.assert_allclose(alone, with_other, rtol=1e-4, atol=1e-7)


def test_bf16_params_with_fp32_master_match_reference_by_hand(tmp_path):
    params = mlp_params(jnp.bfloat16)
    inner = OPTIMIZERS["adamw"]()
    tx = paged(inner, tmp_path / "s", chunk_bytes=4096)
    # The optax protocol path: float32 updates that apply_updates turns into master.astype(bf16)
    got, state, step = run(tx, params, 20, dtype=jnp.bfloat16)
    # Reference by hand: fp32 master, optax on fp32 gradients, params = master.astype(bf16).
    want, ref_master, ref_moments = run_reference(
        inner, mlp_params(jnp.bfloat16), 20, dtype=jnp.bfloat16
    )
    assert_trees_equal(got, want)
    assert check_store(tx, got, ref_master, ref_moments) == 15  # 5 masters, 10 moments
    # Nothing of the moments or master is in the RAM state: only crcs and scalars.
    ram_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    assert ram_bytes < 200
    tx.close()


def test_fused_update_and_apply_equals_updates_path(tmp_path):
    a, _, _ = run(
        paged(OPTIMIZERS["lion"](), tmp_path / "a", chunk_bytes=4096),
        mlp_params(jnp.bfloat16),
        6,
        dtype=jnp.bfloat16,
    )
    b, _, _ = run(
        paged(OPTIMIZERS["lion"](), tmp_path / "b", chunk_bytes=4096),
        mlp_params(jnp.bfloat16),
        6,
        dtype=jnp.bfloat16,
        fused=True,
    )
    assert_trees_equal(a, b)


def test_bf16_updates_reproduce_master_exactly():
    """f32 updates = new - old make apply_updates give exactly master_new.astype(bf16)."""
    rng = np.random.default_rng(0)
    old = jnp.asarray(rng.standard_normal(100_000), jnp.bfloat16)
    new_master = old.astype(jnp.float32) * (
        1 + 1e-3 * jnp.asarray(rng.standard_normal(100_000), jnp.float32)
    )
    new = new_master.astype(jnp.bfloat16)
    u = new.astype(jnp.float32) - old.astype(jnp.float32)
    assert np.asarray(optax.apply_updates(old, u)).tobytes() == np.asarray(new).tobytes()
    # A bf16 update would not be exact: the f32 path is needed.
    u16 = (new_master - old.astype(jnp.float32)).astype(jnp.bfloat16)
    assert np.asarray(optax.apply_updates(old, u16)).tobytes() != np.asarray(new).tobytes()


def test_masked_weight_decay_by_rank(tmp_path):
    def inner():
        return optax.adamw(
            1e-2, weight_decay=0.5, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)
        )

    want, _, _ = run_reference(inner(), mlp_params(), 5)
    got, _, _ = run(paged(inner(), tmp_path / "s", chunk_bytes=4096), mlp_params(), 5, fused=True)
    assert_trees_equal(got, want)


def _leafwise_normalize():
    def update(updates, state, params=None):
        return jax.tree.map(lambda g: g / jnp.mean(jnp.abs(g)), updates), state

    return optax.GradientTransformation(lambda p: optax.EmptyState(), update)


def _roll():
    def update(updates, state, params=None):
        return jax.tree.map(lambda g: jnp.roll(g, 1), updates), state

    return optax.GradientTransformation(lambda p: optax.EmptyState(), update)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: optax.lbfgs(), "scale_by_lbfgs"),
        (
            lambda: optax.chain(optax.scale_by_adam(), optax.clip_by_global_norm(1.0)),
            "clip_by_global_norm",
        ),
        (lambda: optax.lamb(1e-3), "trust_ratio"),
        (lambda: optax.adafactor(1e-3), "factored"),
        (lambda: optax.chain(_leafwise_normalize(), optax.adam(1e-3)), "not element-wise"),
        (lambda: optax.chain(optax.adam(1e-3), _roll()), "not element-wise"),
    ],
    ids=["lbfgs", "clip-inside", "lamb", "adafactor", "leaf-mean", "roll"],
)
def test_refuses_non_elementwise(tmp_path, make, match):
    with pytest.raises(NotElementwiseError, match=match):
        tx = paged(make(), tmp_path / "s", chunk_bytes=4096)
        tx.init(mlp_params())
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_abstract_init_touches_no_disk(tmp_path):
    tx = paged(OPTIMIZERS["adamw"](), tmp_path / "s", chunk_bytes=4096)
    shapes = jax.eval_shape(tx.init, mlp_params())
    assert shapes.version.shape == () and shapes.version.dtype == jnp.int32
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("chunk_bytes", [4096, DEFAULT_CHUNK_BYTES])
def test_inject_hyperparams_adamw_keeps_its_scalars_in_ram(tmp_path, chunk_bytes):
    """Injected hyperparameters and step counts are not parameter-shaped: they stay in RAM
    (the inner state), and only the moments are paged; bitwise equal to plain optax."""
    make = lambda: optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3)  # noqa: E731
    tx = paged(make(), tmp_path / "s", chunk_bytes=chunk_bytes)
    want, ref_master, ref_moments = run_reference(make(), mlp_params(), 4)
    got, state, _ = run(tx, mlp_params(), 4, fused=True)
    assert_trees_equal(got, want)
    assert check_store(tx, got, ref_master, ref_moments) == 2 * 5  # mu and nu of 5 leaves
    ram = state.inner_state
    assert int(ram.count) == 4 and float(ram.hyperparams["learning_rate"]) == np.float32(1e-3)
    assert all(np.shape(x) == () for x in jax.tree.leaves(ram))  # scalars only
    tx.close()


@pytest.mark.parametrize(
    "chunk_bytes, match",
    [
        (4 << 30, r"`chunk_bytes=4294967296` \(4096 MiB\) is larger than the page store"),
        (0, "`chunk_bytes=0` is not a positive multiple of 4096"),
        (6000, "`chunk_bytes=6000` is not a positive multiple of 4096.*use 8192"),
    ],
)
def test_chunk_bytes_out_of_range_names_the_option_and_range(tmp_path, chunk_bytes, match):
    with pytest.raises(PageStoreLayoutError, match=match) as info:
        paged(optax.adamw(1e-3), tmp_path / "s", chunk_bytes=chunk_bytes)
    assert "from 4096 (4 KiB) to 1073741824 (1 GiB)" in str(info.value)
    assert info.value.options == ("chunk_bytes",)  # the command says it as --chunk-mib
    assert "element" not in str(info.value)  # about the chunk size, not a parameter
    assert not (tmp_path / "s").exists()


def test_largest_chunk_stages_only_each_leaf(tmp_path):
    """A chunk larger than every leaf: each leaf is one chunk, and the pager's slots are
    sized by the largest chunk there is, not by the chunk size (else: gigabytes of buffers
    for a tiny model)."""
    tx = paged(optax.adam(1e-2), tmp_path / "s", chunk_bytes=MAX_CHUNK_BYTES)
    got, _, _ = run(tx, mlp_params(), 2, fused=True)
    assert tx.pager.txn.config.slot_bytes < 2 << 20
    assert_trees_equal(got, run_reference(optax.adam(1e-2), mlp_params(), 2)[0])
    assert tx.pager.engine == DEFAULT_ENGINE  # the default, not grown
    tx.close()


def _untainted(tx, params, target) -> int:
    """Calls of ``target`` in a whole training step (gradients, then the paged update) that no
    matmul of the step feeds: calls that may run while the gradients are computed."""
    import jax.extend.core as jex

    def step(p, s, x, y):
        g = jax.lax.optimization_barrier(jax.grad(loss_fn)(p, x, y))
        return update_and_apply(tx, g, s, p)

    closed = jax.make_jaxpr(step)(params, tx.init(params), *batch(0))
    tainted, free = set(), 0
    for e in closed.jaxpr.eqns:
        dirty = any(isinstance(v, jex.Var) and v in tainted for v in e.invars)
        if e.primitive.name == "ffi_call" and e.params["target_name"] == target:
            free += not dirty
        if dirty or e.primitive.name == "dot_general":
            tainted.update(e.outvars)
    return free


def test_the_step_begins_before_the_gradients_exist(tmp_path):
    """The step's ``page_begin`` (from which the pager reads ahead) has no data path from any
    matmul: its reads may run while the gradients are computed. The results stay bitwise
    those of plain optax."""
    params = mlp_params()
    tx = paged(optax.adam(1e-2), tmp_path / "s", chunk_bytes=4096)
    assert _untainted(tx, params, "jaxoff_pager_begin") == 1
    assert _untainted(tx, params, "jaxoff_pager_out") == 0  # every write follows an update
    got, _, _ = run(tx, mlp_params(), 3, fused=True)  # donates its parameters
    assert_trees_equal(got, run_reference(optax.adam(1e-2), mlp_params(), 3)[0])
    tx.close()


def test_closing_the_optimizer_releases_the_store_files_and_reopening_registers_them(tmp_path):
    """The paged optimizer's file table holds every page file of its store open (one per
    entry and slot); tx.close() releases them, so a process that trains many models does not
    run out of file descriptors, and a step after close reopens the store and its table."""
    import gc
    import os

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    for i in range(2):
        tx = paged(OPTIMIZERS["adamw"](), tmp_path / f"s{i}", chunk_bytes=4096)
        new_params, state, step = run(tx, mlp_params(), 2)
        jax.block_until_ready(new_params)
        assert open_fds() > before + 10  # the table's files are open while it is in use
        tx.close()
        del step  # the compiled step uses the table until it is freed
        gc.collect()
        assert open_fds() <= before + 2, "the store's page files are still open"
    # the last optimizer, closed, takes one more step: its store and table are reopened and
    # the step goes on from the state it left (the same as a run that never closed)
    ref_tx = paged(OPTIMIZERS["adamw"](), tmp_path / "ref", chunk_bytes=4096)
    ref_params, _, _ = run(ref_tx, mlp_params(), 3)
    params3, _ = make_step(tx)(new_params, state, *batch(2))
    assert_trees_equal(params3, ref_params)
    tx.close()
    ref_tx.close()


def test_an_optimizer_closed_late_leaves_the_table_of_the_one_on_its_store_now(tmp_path):
    """The first optimizer's store is closed directly (not through tx.close()), a second one
    opens the same store and registers its file table under the same name; the first one's
    late close() must not drop the second one's table mid-training."""
    tx1 = paged(OPTIMIZERS["adamw"](), tmp_path / "s", chunk_bytes=4096)
    jax.block_until_ready(run(tx1, mlp_params(), 1)[:2])  # the step runs asynchronously
    tx1.pager.store.close()
    tx2 = paged(OPTIMIZERS["adamw"](), tmp_path / "s", chunk_bytes=4096)
    params2, state2, _ = run(tx2, mlp_params(), 2)
    tx1.close()
    # a step compiled now looks the table up by name (a compiled one holds the table it got)
    params3, _ = make_step(tx2)(params2, state2, *batch(2))
    ref_tx = paged(OPTIMIZERS["adamw"](), tmp_path / "ref", chunk_bytes=4096)
    ref_params, _, _ = run(ref_tx, mlp_params(), 3)
    assert_trees_equal(params3, ref_params)
    tx2.close()
    ref_tx.close()


@pytest.mark.parametrize("name", ["adamw", "adam", "lion", "sgd", "rmsprop"])
def test_the_trainers_optimizers_pass_the_probe_it_skips(tmp_path, monkeypatch, name):
    """``jaxoff train`` pages its own optimizers with ``probe=False``: each of them passes the
    probe (with the trainer's hyper-parameters and clipping), and the trainer's paged
    transformation indeed does not run it (a probe that always refuses is not reached)."""
    from jaxoff.optim import _paged
    from jaxoff.train import TrainConfig

    cfg = TrainConfig(optimizer=name, store=str(tmp_path / "s"), out_dir=tmp_path / "run")
    pre, tx = cfg.build_optimizer_parts()
    assert pre is None  # the clipping is split off inside the paged transformation
    params = mlp_params()
    probed = paged(optax.chain(optax.clip_by_global_norm(1.0), tx.pager.inner), tmp_path / "p")
    probed.init(params)  # the real probe: raises NotElementwiseError if it is not element-wise
    probed.pager.close()

    def refuse(*args):
        raise NotElementwiseError("probe called")

    monkeypatch.setattr(_paged, "probe_elementwise", refuse)
    tx.init(params)  # no probe
    tx.pager.close()
    with pytest.raises(NotElementwiseError, match="probe called"):
        paged(OPTIMIZERS[name](), tmp_path / "q").init(params)


def test_an_optimizer_let_go_without_close_gives_back_its_files_and_commits(tmp_path):
    """Nothing outside the optimizer (not the pager's thread, not the store) keeps it alive:
    collected, it closes its pager, store and file table, its last step committed."""
    import gc

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    def run():
        tx = paged(OPTIMIZERS["adamw"](), tmp_path / "s", chunk_bytes=4096)
        params = mlp_params(jnp.bfloat16)
        state = tx.init(params)
        step = make_step(tx, jnp.bfloat16, fused=True)
        for t in range(2):
            params, state = step(params, state, *batch(t))
        return params

    before = open_fds()
    want = run()
    gc.collect()
    assert open_fds() <= before, "the optimizer's page files are still open"
    tx = paged(OPTIMIZERS["adamw"](), tmp_path / "s", chunk_bytes=4096)  # the lock is free
    params, _ = load_state(tx, mlp_params(jnp.bfloat16))
    assert tx.store.version == 3  # the initial write and both steps
    assert_trees_equal(params, want)
    tx.close()

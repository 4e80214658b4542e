"""jaxoff.optim.fused_adamw: the fused C++ AdamW against numpy, optax and the paged path."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from jaxoff.optim import FusedAdamWState, fused_adamw, paged, update_and_apply

F32 = np.float32
B1, B2, EPS, WD = 0.9, 0.95, 1e-8, 0.1
LR = optax.warmup_cosine_decay_schedule(0.0, 3e-2, 5, 30, end_value=3e-3)
STEPS = 20
# Sizes around the vector widths (4/8/16 floats), one element, empty, and a leaf large enough
# (> 2**18 elements) to be split between threads.
SIZES = {
    "empty": (0,),
    "one": (1,),
    "scalar": (),
    "v7": (7,),
    "v16": (16,),
    "v17": (17,),
    "m": (33, 5),
    "big": (2**19 + 13,),
}


def make_params(sizes=SIZES, seed=0, dtype=F32):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in sizes.items()}


def make_grads(params, step):
    rng = np.random.default_rng(1000 + step)
    # magnitudes from 1e-4 to 10, so mu and p + u see cancellations and large steps
    return {
        k: (rng.standard_normal(np.shape(params[k])) * 10 ** rng.uniform(-4, 1)).astype(
            params[k].dtype
        )
        for k in sorted(params)
    }  # jit returns dicts sorted


def _scalars(count):
    """(r1, r2, -lr) for the update that makes step ``count + 1``: optax's expressions, jitted."""
    f = jax.jit(
        lambda c: (
            1 / (1 - B1 ** (c + 1)).astype(jnp.float32),
            1 / (1 - B2 ** (c + 1)).astype(jnp.float32),
            jnp.asarray(-1 * LR(c), jnp.float32),
        )
    )
    return tuple(np.asarray(x) for x in f(jnp.int32(count)))


def reference(p, g, m, v, count, decay):
    """The kernel's exact float32 operation order in numpy (no fused multiply-add)."""
    r1, r2, neg_lr = _scalars(count)
    m = F32(1 - B1) * g + F32(B1) * m
    v = F32(1 - B2) * (g * g) + F32(B2) * v
    u = (m * r1) / (np.sqrt(v * r2) + F32(EPS))
    if decay:
        u = u + F32(WD) * p
    u = neg_lr * u
    return p + u, m, v


def fused_step(tx):
    # Donated inputs in the order of the outputs, so every buffer is updated in place.
    return jax.jit(lambda p, s, g: tx.apply(g, s, p), donate_argnums=(0, 1))


def run_fused(tx, params, steps=STEPS):
    step = fused_step(tx)
    params = jax.tree.map(jnp.asarray, params)
    state = tx.init(params)
    for t in range(steps):
        params, state = step(params, state, jax.tree.map(jnp.asarray, make_grads(params, t)))
    return params, state, step


@pytest.mark.parametrize("threads", [1, 2])
def test_bitwise_equal_to_numpy_reference(threads):
    mask = lambda params: {k: k != "v7" for k in params}  # one leaf without weight decay
    tx = fused_adamw(LR, B1, B2, EPS, WD, mask=mask, threads=threads)
    got, state, _ = run_fused(tx, make_params())
    p = make_params()
    m = {k: np.zeros_like(x) for k, x in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t in range(STEPS):
        g = make_grads(p, t)
        for k in p:
            p[k], m[k], v[k] = reference(p[k], g[k], m[k], v[k], t, decay=k != "v7")
    assert int(state.count) == STEPS
    for k in p:
        assert got[k].shape == p[k].shape and got[k].dtype == p[k].dtype
        np.testing.assert_array_equal(np.asarray(got[k]), p[k], err_msg=f"params {k}")
        np.testing.assert_array_equal(np.asarray(state.mu[k]), m[k], err_msg=f"mu {k}")
        np.testing.assert_array_equal(np.asarray(state.nu[k]), v[k], err_msg=f"nu {k}")


def test_mask_and_zero_weight_decay_change_the_result():
    params = make_params({"a": (100,)})
    g = jax.tree.map(jnp.asarray, make_grads(params, 0))
    results = {}
    for name, tx in {
        "decay": fused_adamw(0.1, weight_decay=0.5),
        "masked": fused_adamw(0.1, weight_decay=0.5, mask={"a": False}),
        "zero": fused_adamw(0.1, weight_decay=0.0),
    }.items():
        p = jax.tree.map(jnp.asarray, params)
        results[name] = np.asarray(tx.apply(g, tx.init(p), p)[0]["a"])
    assert not np.array_equal(results["decay"], results["masked"])
    np.testing.assert_array_equal(results["masked"], results["zero"])


def test_close_to_optax_adamw_with_schedule_and_no_recompilation():
    tx = fused_adamw(LR, B1, B2, EPS, WD)
    got, state, step = run_fused(tx, make_params())
    assert step._cache_size() == 1  # the schedule and step count are operands

    ox = optax.adamw(LR, B1, B2, EPS, weight_decay=WD)

    @jax.jit
    def ostep(p, s, g):
        u, s = ox.update(g, s, p)
        return optax.apply_updates(p, u), s

    p = jax.tree.map(jnp.asarray, make_params())
    s = ox.init(p)
    for t in range(STEPS):
        p, s = ostep(p, s, jax.tree.map(jnp.asarray, make_grads(p, t)))
    lr_max = 3e-2
    ulp = 2.0**-23
    for k in p:
        want, have = np.asarray(p[k]), np.asarray(got[k])
        # XLA contracts mu, nu and p + (-lr)*x into fused multiply-adds; the kernel rounds each
        # product. Per step that changes p by one rounding of p + u (<= 1 ulp of |p|) and u by
        # a few roundings of terms of size ~lr (mu's rounding error divided by sqrt(nu)), so we
        # allow 1 ulp of |p| + lr_max per step, summed over the steps. Measured here: at most
        # 0.71 of this bound (on the 2**19 leaf, where |p| is tiny), 0.2 on the small leaves.
        bound = STEPS * ulp * (np.abs(want) + lr_max)
        assert np.all(np.abs(have - want) <= bound), (k, np.max(np.abs(have - want) / bound))
        for name, a, b in (("mu", state.mu[k], s[0].mu[k]), ("nu", state.nu[k], s[0].nu[k])):
            a, b = np.asarray(a), np.asarray(b)
            scale = np.max(np.abs(b)) if b.size else 0.0
            assert np.max(np.abs(a - b), initial=0.0) <= STEPS * ulp * scale, (k, name)
        # and not trivially equal: the last bits differ somewhere (FMA), so this test can fail
    assert any(not np.array_equal(np.asarray(p[k]), np.asarray(got[k])) for k in p)


def test_update_path_equals_apply_path_bitwise():
    for dtype in (F32, ml_dtypes.bfloat16):
        tx = fused_adamw(LR, B1, B2, EPS, WD)
        params = jax.tree.map(jnp.asarray, make_params(dtype=dtype))
        state = tx.init(params)
        g = jax.tree.map(jnp.asarray, make_grads(params, 0))

        @jax.jit
        def via_updates(p, s, g, tx=tx):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        a, sa = jax.jit(tx.apply)(g, state, params)
        b, sb = via_updates(params, state, g)
        for x, y in zip(jax.tree.leaves((a, sa)), jax.tree.leaves((b, sb)), strict=True):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bfloat16_params_and_grads_with_float32_moments():
    tx = fused_adamw(LR, B1, B2, EPS, WD)
    params = make_params({"w": (1001,)}, dtype=ml_dtypes.bfloat16)
    got, state, _ = run_fused(tx, params, steps=3)
    assert got["w"].dtype == jnp.bfloat16 and state.mu["w"].dtype == jnp.float32
    p32 = params["w"].astype(F32)
    m = v = np.zeros_like(p32)
    for t in range(3):
        g = make_grads({"w": params["w"]}, t)["w"].astype(F32)
        # the bf16 parameter is the rounding of the float32 sum, as optax.apply_updates does
        new, m, v = reference(p32, g, m, v, t, decay=True)
        p32 = new.astype(ml_dtypes.bfloat16).astype(F32)
    np.testing.assert_array_equal(np.asarray(got["w"]).astype(F32), p32)
    np.testing.assert_array_equal(np.asarray(state.mu["w"]), m)


def test_updates_in_place_when_donated():
    tx = fused_adamw(1e-3)
    params = {"w": jnp.ones((1 << 16,)), "b": jnp.ones((7,))}
    state = tx.init(params)
    g = jax.tree.map(jnp.ones_like, params)
    step = fused_step(tx)
    hlo = step.lower(params, state, g).compile().as_text()
    assert " copy(" not in hlo and hlo.count('custom_call_target="jaxoff_adamw"') == 2
    before = [x.unsafe_buffer_pointer() for x in jax.tree.leaves((params, state.mu, state.nu))]
    params, state = step(params, state, g)
    after = [x.unsafe_buffer_pointer() for x in jax.tree.leaves((params, state.mu, state.nu))]
    assert before == after


def test_update_and_apply_takes_the_fused_path():
    tx = fused_adamw(1e-3)
    params = {"w": jnp.ones((5,))}
    state = tx.init(params)
    text = jax.jit(update_and_apply, static_argnums=0).lower(tx, params, state, params).as_text()
    assert text.count("jaxoff_adamw") == 1 and "mode = 0" in text  # mode 0: writes new params
    a = update_and_apply(tx, params, state, params)
    b = tx.apply(params, state, params)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_paged_fused_equals_in_ram_fused_bitwise(tmp_path):
    # Leaves of 1, 2 and 3 chunks of 4 KiB (1024 floats) and a scalar.
    sizes = {"a": (1000,), "b": (3, 700), "c": (2100,), "s": ()}
    make = lambda: fused_adamw(LR, B1, B2, EPS, WD, mask=lambda p: {k: k != "c" for k in p})
    ram, pt = make(), paged(make(), tmp_path / "store", chunk_bytes=4096)

    def step_of(tx):
        return jax.jit(lambda p, s, g: update_and_apply(tx, g, s, p), donate_argnums=(0, 1))

    results = []
    for tx in (ram, pt):
        step, p = step_of(tx), jax.tree.map(jnp.asarray, make_params(sizes))
        s = tx.init(p)
        for t in range(4):
            p, s = step(p, s, jax.tree.map(jnp.asarray, make_grads(p, t)))
        results.append(p)
    pt.close()
    for k in sizes:
        np.testing.assert_array_equal(np.asarray(results[0][k]), np.asarray(results[1][k]))


def test_bad_inputs_say_what_to_do():
    tx = fused_adamw(1e-3)
    params = {"w": jnp.ones((4,))}
    with pytest.raises(TypeError, match="parameter .*'w'.* dtype int32"):
        tx.init({"w": jnp.ones((4,), jnp.int32)})
    state = tx.init(params)
    bad = FusedAdamWState(state.count, {"w": jnp.zeros((4,), jnp.bfloat16)}, state.nu)
    with pytest.raises(TypeError, match="mu.*bfloat16.*float32.*tx.init"):
        tx.update(params, bad, params)
    with pytest.raises(TypeError, match="FusedAdamWState"):
        tx.update(params, optax.adamw(1e-3).init(params), params)
    with pytest.raises(ValueError, match="needs the parameters"):
        tx.update(params, state)
    with pytest.raises(ValueError, match="shape"):
        tx.update({"w": jnp.ones((5,))}, state, params)
    with pytest.raises(TypeError, match="gradient .* float16"):
        tx.update({"w": jnp.ones((4,), jnp.float16)}, state, params)


def test_kernel_rejects_bad_operands():
    from jaxoff.aio._ffi_calls import register_targets

    register_targets()
    x = jnp.ones((8,))
    call = jax.ffi.ffi_call("jaxoff_adamw", (jax.ShapeDtypeStruct((8,), jnp.float32),) * 3)
    with pytest.raises(Exception, match="INVALID_ARGUMENT.*jaxoff_adamw: hyper must be"):
        jax.block_until_ready(
            call(
                x, x, x, x, jnp.ones((3,)), mode=np.int64(0), decay=np.int64(1), threads=np.int64(0)
            )
        )
    with pytest.raises(Exception, match="jaxoff_adamw: the moments mu and nu must be float32"):
        jax.block_until_ready(
            call(
                x,
                x,
                x.astype(jnp.bfloat16),
                x,
                jnp.ones((9,)),
                mode=np.int64(0),
                decay=np.int64(1),
                threads=np.int64(0),
            )
        )


def test_weight_decay_schedule_matches_optax():
    wd = lambda count: 0.05 * (count + 1).astype(jnp.float32)
    tx, ox = fused_adamw(1e-2, weight_decay=wd), optax.adamw(1e-2, weight_decay=wd)
    p0 = jax.tree.map(jnp.asarray, make_params({"w": (301,)}))
    p, s, q, r = p0, tx.init(p0), p0, ox.init(p0)
    for t in range(3):
        g = jax.tree.map(jnp.asarray, make_grads(p0, t))
        p, s = jax.jit(tx.apply)(g, s, p)
        u, r = jax.jit(ox.update)(g, r, q)
        q = optax.apply_updates(q, u)
    # the same bound as above (3 steps, lr 1e-2); a wrong step count in the schedule is off
    # by 0.05 * lr * |p| per step, far outside it
    want, have = np.asarray(q["w"]), np.asarray(p["w"])
    assert np.all(np.abs(have - want) <= 3 * 2.0**-23 * (np.abs(want) + 1e-2))

"""`jaxoff.aio.host_call`: Python called by name from a jitted CPU step, so that JAX's
persistent compilation cache keeps the paged step (io_callback's steps are never cached)."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxoff.aio import HostCalls, PageStoreError, _host_call, host_call, store_error_from


def test_operands_arrive_as_numpy_copies_with_their_tree_and_dtypes():
    calls = HostCalls("test")
    seen = {}

    def fn(pair, flags, half):
        seen.update(pair=pair, flags=flags, half=half)
        a, b = pair
        return (
            a.astype(np.int64).sum() + b * int(flags.sum()) + half.astype(np.float32).sum()
        ).astype(np.int32)

    @jax.jit
    def f(a, b, flags, half):
        return host_call(
            fn,
            jax.ShapeDtypeStruct((), jnp.int32),
            (a, b),
            flags,
            half,
            name=calls.name("sum", (a.shape, half.dtype.name)),
        )

    a = jnp.arange(6, dtype=jnp.uint32).reshape(2, 3)
    flags = jnp.array([True, False, True])
    half = jnp.array([1.5, 2.5], jnp.bfloat16)
    out = f(a, jnp.int32(7), flags, half)
    assert int(out) == 15 + 7 * 2 + 4
    assert isinstance(seen["pair"], tuple) and seen["pair"][0].dtype == np.uint32
    assert seen["pair"][0].shape == (2, 3) and seen["flags"].dtype == np.bool_
    assert seen["half"].dtype == jnp.bfloat16 and seen["half"].tolist() == [1.5, 2.5]
    # copies: the function may keep (and change) them after XLA reuses its buffers
    seen["pair"][0][0, 0] = 99
    assert int(f(a, jnp.int32(7), flags, half)) == 15 + 7 * 2 + 4


def test_the_program_names_the_function_and_no_callback_pointer():
    calls = HostCalls("test")
    name = calls.name("one", 3)

    def f(x):
        return host_call(lambda v: v + 1, jax.ShapeDtypeStruct((3,), x.dtype), x, name=name)

    text = jax.jit(f).lower(jnp.zeros(3)).as_text()
    assert "jaxoff_host_call" in text and name in text
    assert "callback" not in text.replace("jaxoff_host_call", "")


def test_jaxoff_host_call_chooses_io_callback_and_refuses_other_values(monkeypatch):
    calls = HostCalls("test")

    def f(x):
        name = calls.name("plus")
        return host_call(lambda v: v + 1, jax.ShapeDtypeStruct((3,), x.dtype), x, name=name)

    monkeypatch.setenv("JAXOFF_HOST_CALL", "io_callback")
    text = jax.jit(f).lower(jnp.zeros(3)).as_text()
    assert "jaxoff_host_call" not in text and "callback" in text
    assert jax.jit(f)(jnp.zeros(3)).tolist() == [1.0, 1.0, 1.0]
    monkeypatch.setenv("JAXOFF_HOST_CALL", "pointer")
    with pytest.raises(ValueError, match="JAXOFF_HOST_CALL='pointer': use 'ffi'"):
        jax.jit(lambda x: f(x)).lower(jnp.zeros(3))  # a new function: traced again


def test_names_are_unique_per_owner_and_stable_per_key():
    a, b = HostCalls("test.names"), HostCalls("test.names")
    assert a.name("commit", (1, 2)) == a.name("commit", (1, 2))
    assert a.name("commit", (1, 2)) != a.name("commit", (1, 3))
    assert a.name("commit", (1, 2)) != a.name("check", (1, 2))
    assert a.name("commit", (1, 2)) != b.name("commit", (1, 2))
    with pytest.raises(ValueError, match="no '/' or '#'"):
        HostCalls("a/b")


def test_an_exception_fails_the_step_with_its_traceback_and_store_error_from_finds_it():
    calls = HostCalls("test")

    def fail(x):
        raise PageStoreError("no space left for the manifest: free some disk and resume")

    f = jax.jit(
        lambda x: host_call(fail, jax.ShapeDtypeStruct((), jnp.int32), x, name=calls.name("fail"))
    )
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(f(jnp.zeros(2)))
    text = str(info.value)
    assert "in fail" in text  # the traceback
    assert "PageStoreError: no space left for the manifest: free some disk and resume" in text
    err = store_error_from(info.value)
    assert isinstance(err, PageStoreError) and "free some disk" in str(err)


def test_a_wrong_result_and_an_unregistered_name_are_reported():
    calls = HostCalls("test")
    name = calls.name("shape")
    f = jax.jit(
        lambda x: host_call(
            lambda v: np.zeros(4, np.int32), jax.ShapeDtypeStruct((), jnp.int32), x, name=name
        )
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"returned shape \(4,\) for \(\)"):
        jax.block_until_ready(f(jnp.zeros(2)))
    with _host_call._lock:
        del _host_call._functions[name]
    with pytest.raises(jax.errors.JaxRuntimeError, match="is not registered in this process"):
        jax.block_until_ready(f(jnp.zeros(2)))


_CHILD = textwrap.dedent(
    """
    import json, logging, sys
    import jax, jax.numpy as jnp, numpy as np, optax
    import jaxoff

    hits = []  # the programs JAX took from its persistent cache, by name

    class Hits(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Persistent compilation cache hit for"):
                hits.append(record.args[0])

    log = logging.getLogger("jax._src.compiler")
    log.setLevel(logging.DEBUG)
    log.addHandler(Hits())
    params = {"w": jnp.arange(4096, dtype=jnp.float32) / 4096, "b": jnp.ones((7, 3))}
    tx = jaxoff.paged(optax.adamw(1e-2), sys.argv[1], chunk_bytes=4096)
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        grads = jax.tree.map(lambda p: jnp.sin(p) + 0.5, params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(3):
        params, state = step(params, state)
    jax.block_until_ready(params)
    tx.close()
    print(json.dumps({"hits": hits, "params": [np.asarray(x).tolist() for x in
                      jax.tree.leaves(params)]}))
    """
)


@pytest.mark.subprocess
def test_a_second_process_loads_the_paged_step_from_the_compilation_cache(tmp_path):
    """The paged step calls the page store by name: JAX writes it to its persistent cache, and a
    second process, on another store directory, gets it from there and computes the same."""
    env = dict(os.environ)
    env.update(
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    runs = []
    for i in range(2):
        store = tmp_path / f"store{i}"
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(store)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    entries = os.listdir(tmp_path / "cache")
    assert any(e.startswith("jit_step") for e in entries), entries
    assert "jit_step" not in runs[0]["hits"]
    assert "jit_step" in runs[1]["hits"]
    assert runs[0]["params"] == runs[1]["params"]  # the cached program computes the same


def test_closing_right_after_the_steps_waits_for_them(tmp_path):
    """On the CPU a paged step returns before it has run (no io_callback makes its dispatch
    synchronous): tx.close() waits for the steps in flight, which then compute what steps that
    were each waited for compute."""
    import optax

    from jaxoff.optim import paged, update_and_apply

    params = {"w": jnp.arange(2048, dtype=jnp.float32) / 2048, "b": jnp.ones((3, 5))}
    results = []
    for i, wait in enumerate((True, False)):
        tx = paged(optax.adamw(1e-2), tmp_path / f"s{i}", chunk_bytes=4096)
        p, s = params, tx.init(params)
        step = jax.jit(lambda p, s, tx=tx: update_and_apply(tx, jax.tree.map(jnp.sin, p), s, p))
        for _ in range(3):
            p, s = step(p, s)
            if wait:
                jax.block_until_ready(p)
        tx.close()
        results.append([np.asarray(x) for x in jax.tree.leaves(p)])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)

"""Placement of parameters / optimizer states and layer streaming: numerics, export, errors."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest

from jaxoff import ConfigError, TrainConfig
from jaxoff.models.gpt import CONFIGS
from jaxoff.nn import Stack, with_stack
from jaxoff.optim import paged
from jaxoff.placement import (
    check_placement,
    get_placement,
    jit_step,
    make_mesh,
    streamed_model,
    with_paged_optimizer,
)
from jaxoff.step import check_placement_export, init_state, make_train_step

STEPS = 10
B, T = 4, 16
CFG = with_stack(dataclasses.replace(CONFIGS["tiny"], num_layers=3), policy="nothing_saveable")
TOKENS = np.asarray(
    jax.random.randint(jax.random.key(1), (STEPS, B, T + 1), 0, 256), dtype=np.int32
)


def adamw():
    return optax.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.1)


def train(placement, tx, mesh=None, cfg=CFG):
    """``STEPS`` steps of the real step under ``placement``: (final state, losses)."""
    placement = get_placement(placement)
    graphdef, state = init_state(streamed_model(cfg, placement, mesh), tx, 0)
    step, shardings = jit_step(make_train_step(graphdef, tx, placement), placement, state, mesh)
    state = jax.device_put(state, shardings)
    step = step.lower(state, TOKENS[0, :, :-1], TOKENS[0, :, 1:]).compile()
    losses = []
    for i in range(STEPS):
        state, metrics = step(state, TOKENS[i, :, :-1], TOKENS[i, :, 1:])
        losses.append(float(metrics["loss"]))
    return state, losses


def kinds(tree) -> set[str]:
    return {leaf.sharding.memory_kind for leaf in jax.tree.leaves(tree)}


def assert_bitwise(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def reference():
    return {
        "adamw": train("device", adamw()),
        # clip_by_global_norm cannot trace on host operands: exercises the fallback
        "clip": train("device", optax.chain(optax.clip_by_global_norm(1.0), adamw())),
    }


@pytest.mark.parametrize(
    "name, params_kind, opt_kind",
    [
        ("host_opt", "device", "pinned_host"),
        ("host_opt_xfer", "device", "pinned_host"),
        ("host_params", "pinned_host", "pinned_host"),
        ("host_params_stream1", "pinned_host", "pinned_host"),
        ("host_params_stream2", "pinned_host", "pinned_host"),
    ],
)
def test_placement_trains_bitwise_like_device(reference, name, params_kind, opt_kind):
    ref_state, ref_losses = reference["adamw"]
    state, losses = train(name, adamw())
    assert losses == ref_losses
    assert_bitwise(state, ref_state)
    assert kinds(state.params) == {params_kind}
    assert kinds(state.opt_state) == {opt_kind}


def test_host_update_falls_back_to_transfers_for_clipping(reference):
    ref_state, ref_losses = reference["clip"]
    tx = optax.chain(optax.clip_by_global_norm(1.0), adamw())
    state, losses = train("host_params_stream1", tx)
    assert losses == ref_losses
    assert_bitwise(state, ref_state)


@pytest.mark.parametrize("name", ["host_opt", "host_params", "host_params_stream2"])
def test_paged_optimizer_with_host_placement_is_bitwise_the_paged_device_run(tmp_path, name):
    """ZeRO-Infinity's layout: parameters on host, optimizer states and masters on disk."""
    ref_tx = paged(adamw(), tmp_path / "ref", chunk_bytes=8192)
    ref_state, ref_losses = train("device", ref_tx)
    tx = paged(adamw(), tmp_path / "s", chunk_bytes=8192)
    placement = with_paged_optimizer(name)
    state, losses = train(placement, tx)
    assert losses == ref_losses
    assert_bitwise(state.params, ref_state.params)
    want_params = {"host_opt": "device"}.get(name, "pinned_host")
    assert kinds(state.params) == {want_params}
    assert kinds(state.opt_state) == {"device"}  # version, checksums, counts: bytes
    for name_ in ref_tx.store.entries:  # the stores hold the same masters and moments
        assert tx.store.read(name_).tobytes() == ref_tx.store.read(name_).tobytes(), name_
    tx.close()
    ref_tx.close()


def test_streaming_window_larger_than_model(reference):
    ref_state, ref_losses = reference["adamw"]
    state, losses = train("host_params_stream7", adamw())  # window 7 > 3 layers: clamped
    assert losses == ref_losses
    assert_bitwise(state, ref_state)


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_export_shows_host_state_and_in_loop_transfers(platform):
    tx = adamw()
    dev, problems = check_placement_export(CFG, "device", tx, B, T, platform)
    assert problems == [] and set(dev.arg_kinds) == {"device"}
    assert dev.placements_in_loops == {} and dev.host_compute_ops == 0

    opt, problems = check_placement_export(CFG, "host_opt", tx, B, T, platform)
    assert problems == []
    n_params = len(jax.tree.leaves(init_state(CFG, tx, 0)[1].params))
    # mu and nu of every parameter (and the count) live in host memory
    assert opt.arg_kinds["pinned_host"] >= 2 * n_params
    assert opt.host_compute_ops > 0  # the update runs under compute_on("device_host")
    assert opt.placements_in_loops == {}

    whole, problems = check_placement_export(CFG, "host_params", tx, B, T, platform)
    assert problems == [] and whole.placements_in_loops == {}

    n_block = n_params - 5  # embed, pos_embed, final_norm (2), head are not stacked
    for window in (1, 2):
        r, problems = check_placement_export(CFG, f"host_params_stream{window}", tx, B, T, platform)
        assert problems == []
        assert r.arg_kinds["pinned_host"] >= 3 * n_params
        # every stacked leaf is copied to the device inside a layer loop (forward and
        # backward prefetch) and its gradient copied back to host inside the backward loop
        assert r.placements_in_loops["device"] >= n_block
        assert r.placements_in_loops["pinned_host"] >= n_block
        # the ring is filled with `window` layers before each of the two loops
        assert r.placements_outside["device"] >= 2 * window * n_block


def test_fsdp_mesh_host_params_streamed():
    """4 CPU devices, parameters and states FSDP-sharded in host memory, batch split.

    Against the same mesh all on device: bitwise (placement adds no arithmetic).
    Against one device: not bitwise, because the data-parallel gradient is a sum of 4
    per-device partial sums (and XLA may split contractions), a different float32
    summation order. With SGD (no Adam normalization to blow up the round-off of
    near-zero gradients) the difference stays at float32 rounding: parameters
    (|p| <= ~1) within 1e-6 (~8 ulp), losses within 1e-6 relative.
    """
    mesh = make_mesh(4)
    ref_state, ref_losses = train("device", adamw(), mesh)
    state, losses = train("host_params_stream2", adamw(), mesh)
    assert losses == ref_losses
    assert_bitwise(state, ref_state)
    assert kinds(state.params) == {"pinned_host"}
    kernel = state.params["blocks"]["mlp"]["up"]["kernel"].value  # [L, D, F]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, None, "fsdp")
    assert len(kernel.addressable_shards) == 4

    sgd = optax.sgd(0.1, momentum=0.9)
    single, single_losses = train("device", sgd)
    sharded, sharded_losses = train("host_params_stream1", sgd, mesh)
    np.testing.assert_allclose(sharded_losses, single_losses, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(placement="host_params_stream1", policy="sqrt"), "remat_every|policy"),
        (dict(placement="host_params_stream1", policy="selective"), "`policy='full'`"),
        (dict(placement="host_params_stream0", policy="full"), "at least 1"),
        (dict(placement="host_params_stream-2", policy="full"), "at least 1"),
        (dict(placement="host_everything"), "not known"),
        (dict(placement="host_opt", fsdp=3, batch_size=4), "does not split"),
        (dict(placement="host_opt", fsdp=64), "sees 4 device"),
    ],
)
def test_bad_combinations_are_config_errors(tmp_path, kwargs, match):
    base = dict(model="tiny", steps=2, batch_size=4, seq_len=16, out_dir=tmp_path, progress=False)
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**{**base, **kwargs}).validate()


def test_streaming_needs_scanned_layers():
    unrolled = with_stack(CFG, scan_unroll=3)
    with pytest.raises(ConfigError, match="scan_unroll"):
        check_placement("host_params_stream1", unrolled)
    with pytest.raises(ConfigError, match="scanned layers"):
        check_placement("host_params_stream1", CFG, params={"layers_0": {"w": np.zeros(3)}})
    with pytest.raises(ValueError, match="remat_every"):
        Stack(stream_window=1, remat_every=2)


def test_trainer_runs_streamed_and_resumes_exactly(tmp_path, tiny_train_args):
    from jaxoff.train import train as run

    args = {**tiny_train_args, "steps": 4, "placement": "host_params_stream1", "policy": "full"}
    full = run(TrainConfig(**{**args, "out_dir": tmp_path / "a"}))
    run(TrainConfig(**{**args, "out_dir": tmp_path / "b", "stop_at": 2, "ckpt_every": 2}))
    rest = run(TrainConfig(**{**args, "out_dir": tmp_path / "b", "ckpt_every": 2, "resume": True}))
    assert rest.losses == full.losses[2:]
    plain = run(
        TrainConfig(**{**tiny_train_args, "steps": 4, "policy": "full", "out_dir": tmp_path / "c"})
    )
    assert plain.losses == full.losses


def test_trainer_pages_optimizer_with_streamed_host_params(tmp_path, tiny_train_args):
    """--store with --placement host_params_stream1: bitwise the --store run on device, and
    resumable exactly."""
    from jaxoff.train import train as run

    args = {**tiny_train_args, "steps": 4, "policy": "full", "store": "auto"}
    want = run(TrainConfig(**{**args, "out_dir": tmp_path / "dev"}))
    args["placement"] = "host_params_stream1"
    full = run(TrainConfig(**{**args, "out_dir": tmp_path / "a"}))
    assert full.losses == want.losses
    run(TrainConfig(**{**args, "out_dir": tmp_path / "b", "stop_at": 2, "ckpt_every": 2}))
    rest = run(TrainConfig(**{**args, "out_dir": tmp_path / "b", "ckpt_every": 2, "resume": True}))
    assert rest.losses == full.losses[2:]


def test_host_update_runs_under_either_form_of_compute_on(monkeypatch):
    """JAX 0.10 has ``compute_on(compute_type)`` as a context manager; 0.11 (a GPU machine's)
    has ``compute_on(f, compute_type=..., out_memory_spaces=...)`` and rejects the old call.
    The host update takes whichever the installed JAX has; the other form is checked here
    with a stand-in that records how it was called."""
    import inspect

    from jax.experimental.compute_on import compute_on

    from jaxoff.placement import _apply

    installed = "out_memory_spaces" in inspect.signature(compute_on).parameters
    assert _apply._COMPUTE_ON_WRAPS == installed
    calls = []

    def wrapping_compute_on(f=None, *, compute_type, out_memory_spaces):
        calls.append((compute_type, out_memory_spaces))
        return lambda *args: ("wrapped", f(*args))

    monkeypatch.setattr(_apply, "compute_on", wrapping_compute_on)
    monkeypatch.setattr(_apply, "_COMPUTE_ON_WRAPS", True)
    assert _apply.on_host(lambda a, b: a + b, 1, 2) == ("wrapped", 3)
    assert calls == [("device_host", jax.memory.Space.Host)]


class _Lowered:
    """A lowered step whose compile() raises ``error`` (or returns "compiled")."""

    def __init__(self, error=None):
        self.error = error

    def compile(self):
        if self.error is not None:
            raise self.error
        return "compiled"


def test_xla_refusing_the_host_update_is_one_config_error():
    """XLA 0.11.2 on an H200 could not compile the update under compute_on('device_host'):
    the trainer and the benchmarks say so in one line, with the routes that compile."""
    from jaxoff.placement import compile_placed

    xla = RuntimeError(
        "INTERNAL: during context [end-of-post-layout_assignment]: host-call.cloned.1.call-start"
        " (opcode: async-start) expects the async shape at index {0} to be a tuple\nf32[...]"
    )
    with pytest.raises(ConfigError, match="host_opt_xfer") as e:
        compile_placed(_Lowered(xla), "host_params_stream1")
    assert "\n" not in str(e.value) and "jaxoff.paged" in str(e.value)
    assert e.value.__cause__ is xla
    # the same failure where the update is not host computation, or another failure, is
    # raised as it is
    for placement, error in [
        ("device", xla),
        ("host_opt_xfer", xla),
        ("host_opt", RuntimeError("RESOURCE_EXHAUSTED: out of memory")),
    ]:
        with pytest.raises(RuntimeError) as e:
            compile_placed(_Lowered(error), placement)
        assert e.value is error
    assert compile_placed(_Lowered(), "host_opt") == "compiled"

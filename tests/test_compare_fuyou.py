"""`jaxoff compare`'s Fuyou entry runs the step `jaxoff train --strategy fuyou` runs: the bits
form (``blocks_as_bits``) wherever the trainer's `FuyouStep` decides it applies, and on
float32 blocks the float step, bitwise as `prepare` built it before."""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxoff.models.gpt import CONFIGS
from jaxoff.strategies import Context, build_recipe, prepare

sys.path.insert(0, os.path.dirname(__file__))
from test_train_fuyou import _spy_bits  # noqa: E402  (the trainer's test: the same spy)

B, T, STEPS = 2, 16, 2
TOKENS = jax.random.randint(jax.random.key(3), (STEPS, B, T + 1), 0, 256, dtype=jnp.int32)
BF16_TINY = dataclasses.replace(CONFIGS["tiny"], param_dtype="bfloat16", dtype="bfloat16")


def _measure(model_cfg, store_root) -> dict:
    from jaxoff.compare._strategies import measure_strategy

    recipe = build_recipe("fuyou", Context(model_cfg, B, T))
    return measure_strategy(
        model=model_cfg,
        name="fuyou",
        recipe=recipe.to_json(),
        batch=B,
        seq=T,
        steps=2,
        warmup=1,
        store_root=str(store_root),
    )


def test_compare_runs_fuyou_in_the_bits_form_where_train_does(tmp_path, monkeypatch):
    from jaxoff.strategies.fuyou import _train as _fuyou_train

    assert _fuyou_train.bits_apply(BF16_TINY, False)  # the trainer's decision for this model
    seen = _spy_bits(monkeypatch)
    bits = _measure(BF16_TINY, tmp_path / "bits")
    assert bits["status"] == "ok", bits
    assert set(seen) == {(True, frozenset({"uint16"}))}

    seen.clear()
    monkeypatch.setattr(_fuyou_train, "bits_apply", lambda *a: False)
    floats = _measure(BF16_TINY, tmp_path / "floats")
    assert floats["status"] == "ok", floats
    assert set(seen) == {(False, frozenset({"bfloat16"}))}
    assert bits["loss"] == floats["loss"]  # the bits form computes the float step bitwise

    seen.clear()
    f32 = _measure(CONFIGS["tiny"], tmp_path / "f32")  # float32 blocks: as they are
    assert f32["status"] == "ok", f32
    assert set(seen) == {(False, frozenset({"float32"}))}


def _run(step, state):
    compiled = step.lower(state, TOKENS[0, :, :-1], TOKENS[0, :, 1:]).compile()
    losses = []
    for i in range(STEPS):
        state, metrics = compiled(state, TOKENS[i, :, :-1], TOKENS[i, :, 1:])
        losses.append(float(metrics["loss"]))
    return state, losses


def test_compare_fuyou_on_float32_is_bitwise_the_float_step(tmp_path):
    """On float32 blocks `prepare`'s Fuyou step is the one it built before it followed the
    trainer: ``nnx.split`` of the model, ``fuyou_init``, ``make_fuyou_step`` without bits."""
    from flax import nnx

    from jaxoff.optim import paged
    from jaxoff.step import TrainState
    from jaxoff.step._plain import jit_train_step
    from jaxoff.strategies import fuyou

    recipe = build_recipe("fuyou", Context(CONFIGS["tiny"], B, T))
    prep = prepare(
        recipe, CONFIGS["tiny"], optax.adamw(1e-2), store_dir=tmp_path / "new", chunk_bytes=8192
    )
    try:
        state, losses = _run(prep.step, prep.state)
        params = jax.device_get(state.params)
    finally:
        prep.tx.close()

    cfg = prep.model_config
    tx = paged(optax.adamw(1e-2), tmp_path / "old", chunk_bytes=8192)
    try:
        graphdef, ref_params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
        ref = TrainState(
            jnp.zeros((), jnp.int32), ref_params, fuyou.fuyou_init(cfg, tx, ref_params)
        )
        step, shardings = jit_train_step(
            fuyou.make_fuyou_step(graphdef, cfg, tx), prep.placement, ref
        )
        ref, ref_losses = _run(step, jax.device_put(ref, shardings))
        ref_params = jax.device_get(ref.params)
    finally:
        tx.close()

    assert len(losses) == STEPS and losses == ref_losses
    flat, ref_flat = jax.tree.leaves(params), jax.tree.leaves(ref_params)
    assert len(flat) == len(ref_flat) > 0
    for x, y in zip(flat, ref_flat, strict=True):
        assert x.dtype == y.dtype == np.float32
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()

"""Every policy computes the same gradients as no remat, and saves what it should."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _grads import assert_grads_close

from jaxoff.models.gpt import CONFIGS
from jaxoff.policy import PRESETS, apply_policy
from jaxoff.step import init_state, make_loss_fn

B, T = 4, 64  # attention scores [B, H, T, T] big enough to matter in temp memory


@functools.cache
def _run(spec: str):
    """(loss, grads, temp bytes) of the scanned tiny model's loss gradient under ``spec``."""
    cfg = apply_policy(CONFIGS["tiny"], spec)
    graphdef, state = init_state(cfg, optax.sgd(0.0), seed=0)
    tokens = jax.random.randint(jax.random.key(1), (B, T + 1), 0, 256, dtype=jnp.int32)
    fn = jax.jit(jax.value_and_grad(make_loss_fn(graphdef)))
    compiled = fn.lower(state.params, tokens[:, :-1], tokens[:, 1:]).compile()
    loss, grads = compiled(state.params, tokens[:, :-1], tokens[:, 1:])
    return loss, grads, compiled.memory_analysis().temp_size_in_bytes


SPECS = [*PRESETS, "dots_saveable,mlp_act=offload,attn_q=device"]  # + the mixed code path


@pytest.mark.parametrize("spec", SPECS)
def test_gradients_equal_no_remat(spec):
    loss0, grads0, _ = _run("none")
    loss, grads, _ = _run(spec)
    # The forward pass is the same arithmetic under every policy: the loss is bitwise equal.
    assert np.asarray(loss).tobytes() == np.asarray(loss0).tobytes()
    # Gradients: remat changes how XLA fuses the recomputed forward ops in the backward
    # pass (and sqrt changes the scan structure), so an elementwise op may round one ulp
    # differently and that propagates through 5 layers. Measured: <= 4e-8 absolute for
    # gradients up to 0.15, i.e. ~3 float32 ulps of the largest. We allow 8 ulps of the
    # largest gradient; a layer out of order or a wrong residual gives differences ~1e-3.
    assert_grads_close(grads, grads0)


def test_device_temp_memory_ordered():
    temp = {s: _run(s)[2] for s in ("none", "selective", "full", "dots_saveable")}
    assert temp["full"] < temp["selective"] < temp["none"], temp
    assert temp["full"] < temp["dots_saveable"] < temp["none"], temp
    # selective drops the two [B, H, T, T] tensors per layer (logits, probs) at least
    tiny = CONFIGS["tiny"]
    scores = B * tiny.num_heads * T * T * 4
    assert temp["none"] - temp["selective"] >= 2 * scores * tiny.num_layers, temp


def test_sqrt_bytes_is_full_on_a_shallow_stack():
    """tiny (5 layers): a block's interior is far more than its input, so the byte model
    (``sqrt_bytes``) picks per-block segments and compiles to full's program
    (tests/test_sqrt.py has the depths where segments pay)."""
    assert apply_policy(CONFIGS["tiny"], "sqrt_bytes").stack.remat_every == "auto"
    assert _run("sqrt_bytes")[2] == _run("full")[2] < _run("none")[2], (
        _run("sqrt_bytes")[2],
        _run("none")[2],
    )


def test_sqrt_is_chens_rule_on_a_shallow_stack():
    """tiny (5 layers): ``sqrt`` runs segments of round(sqrt(5)) = 2 layers."""
    assert apply_policy(CONFIGS["tiny"], "sqrt").stack.remat_every == 2

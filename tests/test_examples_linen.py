"""examples/linen_gpt2.py: a user's linen GPT-2 trains with paged AdamW in a TrainState and a
jaxoff policy over its own residual names."""

import functools
import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "linen_gpt2.py"
SMALL = dict(d_model=64, num_layers=2, batch_size=8, seq_len=32)


@functools.cache
def _example():
    spec = importlib.util.spec_from_file_location("linen_gpt2", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # linen's dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_linen_gpt2_loss_falls_with_a_paged_optimizer(tmp_path, capsys):
    example = _example()
    losses = example.main(24, str(tmp_path / "store"), log_every=8, **SMALL)
    assert len(losses) == 24 and np.isfinite(losses).all()
    assert np.mean(losses[-4:]) < losses[0] - 1.0, losses  # 5.6 (uniform bytes) -> ~3
    assert any((tmp_path / "store").iterdir())  # the optimizer state went to the page store
    assert "step   24  loss" in capsys.readouterr().out


def test_the_policy_acts_on_the_modules_own_names():
    example = _example()
    policy = example.get_policy(example.POLICY, example.NAMES)
    assert policy.offloaded() == ("mlp_hidden",)
    model = example.GPT2(d_model=32, num_layers=1, num_heads=2, remat_policy=policy.to_jax())
    tokens = jnp.zeros((2, 8), jnp.int32)
    params = model.init(jax.random.key(0), tokens)["params"]
    jaxpr = str(
        jax.make_jaxpr(jax.grad(lambda p: model.apply({"params": p}, tokens).sum()))(params)
    )
    for name in example.NAMES:
        assert f"name={name}" in jaxpr, name
    # mlp_hidden [B, T, 4 * d_model] is a residual in host memory between forward and backward
    assert "f32<host>[2,8,128]" in jaxpr

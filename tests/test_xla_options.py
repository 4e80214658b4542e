"""``jaxoff.compiler_options``: on CPU, no float32 copy of a bf16 layer stack, same bits."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxoff
from jaxoff.models import load_model
from jaxoff.nn import with_stack
from jaxoff.placement import _jit as jit_module
from jaxoff.step import make_loss_fn
from jaxoff.train import TrainConfig, train


def test_options_only_on_cpu_with_16_bit_floats():
    off = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}
    bf16 = {"blocks": jnp.zeros((4, 8, 8), jnp.bfloat16), "head": jnp.zeros((8,))}
    assert jaxoff.compiler_options(bf16, backend="cpu") == off
    half = jax.ShapeDtypeStruct((2, 3), jnp.float16)
    assert jaxoff.compiler_options([half], backend="cpu") == off
    assert jaxoff.compiler_options(None, backend="cpu") == off
    f32 = {"blocks": jnp.zeros((4, 8, 8)), "step": jnp.zeros((), jnp.int32)}
    assert jaxoff.compiler_options(f32, backend="cpu") == {}
    assert jaxoff.compiler_options(bf16, backend="gpu") == {}
    assert jaxoff.compiler_options(bf16) == off  # this suite runs on CPU


def _grad_step(layers: int, options):
    """The compiled ``value_and_grad`` of a bf16 GPT of ``layers`` stacked blocks, and its
    inputs."""
    cfg = with_stack(load_model("tiny"), policy="nothing_saveable")
    cfg = dataclasses.replace(
        cfg, num_layers=layers, d_model=256, num_heads=4, d_ff=1024, param_dtype="bfloat16"
    )
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    loss = make_loss_fn(graphdef)
    x = jax.random.randint(jax.random.key(0), (2, 33), 0, 256)
    args = (params, x[:, :-1], x[:, 1:])
    compiled = jax.jit(jax.value_and_grad(loss)).lower(*args).compile(options or None)
    blocks = sum(a.nbytes for a in jax.tree.leaves(params["blocks"]))
    return compiled, args, blocks


def test_a_bf16_stack_keeps_no_float32_copy_and_computes_the_same_bits():
    """Without the options XLA:CPU's temporaries grow by at least a float32 copy of the added
    layers (twice their bf16 bytes); with them by less than half those bytes, and the loss
    and every gradient are bitwise the same."""
    options = jaxoff.compiler_options(None, backend="cpu")
    grown = {}
    for name, opts in (("xla", {}), ("jaxoff", options)):
        temps, blocks = [], []
        for layers in (2, 6):
            compiled, args, nbytes = _grad_step(layers, opts)
            temps.append(compiled.memory_analysis().temp_size_in_bytes)
            blocks.append(nbytes)
        added = blocks[1] - blocks[0]
        grown[name] = (temps[1] - temps[0]) / added
    assert grown["xla"] >= 2.0, grown
    assert grown["jaxoff"] < 0.5, grown
    (c1, args, _), (c2, _, _) = _grad_step(4, {}), _grad_step(4, options)
    out1, out2 = c1(*args), c2(*args)
    for a, b in zip(jax.tree.leaves(out1), jax.tree.leaves(out2), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_the_trainer_compiles_its_step_with_them(tiny_train_args, monkeypatch):
    seen = []
    options_of = jit_module.compiler_options

    def spy(params):
        seen.append(options_of(params))
        return seen[-1]

    monkeypatch.setattr(jit_module, "compiler_options", spy)
    args = {**tiny_train_args, "steps": 2}
    train(TrainConfig(**args, param_dtype="bfloat16"))
    train(TrainConfig(**{**args, "out_dir": args["out_dir"].parent / "f32"}))
    assert seen == [jaxoff.compiler_options(None, backend="cpu"), {}]


def test_plan_and_compare_compile_the_program_that_trains(monkeypatch):
    """``jaxoff.step.compile_step`` (what ``jaxoff plan`` prices and ``jaxoff compare``
    measures) compiles with the options, as the trainer does: for a bf16 model its
    temporaries are those of the same program compiled with the options, below XLA's default
    compile by more than the stacked blocks' bf16 bytes (the default's float32 copy of them
    is twice those bytes; in this step with AdamW, 1.2 times them was measured); for float32
    parameters they are XLA's default."""
    from jaxoff.step import compile_step

    base = with_stack(load_model("tiny"), policy="nothing_saveable")
    for dtype in ("bfloat16", "float32"):
        cfg = dataclasses.replace(
            base, num_layers=6, d_model=256, num_heads=4, d_ff=1024, param_dtype=dtype
        )
        compiled, _, state = compile_step(cfg, 2, 32)
        with monkeypatch.context() as m:  # the same step jitted without the options
            m.setattr(jit_module, "compiler_options", lambda params: {})
            default, jitted, _ = compile_step(cfg, 2, 32)
        tok = jax.ShapeDtypeStruct((2, 32), jnp.int32)
        temp = compiled.memory_analysis().temp_size_in_bytes
        temp_default = default.memory_analysis().temp_size_in_bytes
        blocks = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params["blocks"]))
        if dtype == "bfloat16":
            options = jaxoff.compiler_options(state.params)
            with_options = jitted.lower(state, tok, tok).compile(options)
            assert temp == with_options.memory_analysis().temp_size_in_bytes
            assert temp_default - temp > blocks, (temp_default, temp, blocks)
        else:
            assert temp == temp_default

"""Policies over any model's residual names: a toy model of its own, the Llama's, none at all."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxoff._errors import ConfigError
from jaxoff.models.gpt import RESIDUAL_NAMES as GPT_NAMES
from jaxoff.nn import Stack, run_stack, stacked
from jaxoff.policy import (
    PRESETS,
    PROJECTIONS,
    Action,
    Policy,
    apply_policy,
    get_policy,
    load_policy_file,
    preset,
    resolve_policy,
)

cp = jax.checkpoint_policies

TOY_NAMES = ("hidden", "act")
D = 16


class ToyBlock(nnx.Module):
    """``x + h tanh(h)`` with ``h = W x``: backward reads both tagged values (its residuals)."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        h = checkpoint_name(self.lin(x), "hidden")
        return x + h * checkpoint_name(jnp.tanh(h), "act")


class Toy(nnx.Module):
    def __init__(self, cfg: ToyConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, D, rngs=rngs)
        self.blocks = stacked(ToyBlock, cfg.num_layers, rngs)
        self.head = nnx.Linear(D, cfg.vocab_size, use_bias=False, rngs=rngs)

    def embed_tokens(self, tokens):
        return self.embed(tokens)

    def logits(self, x):
        return self.head(x).astype(jnp.float32)

    def __call__(self, tokens):
        return self.logits(run_stack(self.blocks, self.embed_tokens(tokens), self.cfg.stack))


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """A model of the jaxoff protocol that tags two names of its own."""

    num_layers: int = 4
    max_seq_len: int = 8
    vocab_size: int = 32
    dtype: str = "float32"
    param_dtype: str = "float32"
    stack: Stack = Stack()
    residual_names: tuple[str, ...] = TOY_NAMES
    name: str = "toy"

    def build(self, rngs: nnx.Rngs) -> Toy:
        return Toy(self, rngs)


TOY = ToyConfig()
NAMELESS = ToyConfig(residual_names=(), name="nameless")

# The Llama's names: the GPT's plus the gate of its gated MLP (models/llama.py has its own
# list; test_llama_presets checks the presets over that one when it is there).
LLAMA_NAMES = (
    *GPT_NAMES[: GPT_NAMES.index("mlp_up")],
    "mlp_gate",
    *GPT_NAMES[GPT_NAMES.index("mlp_up") :],
)


def _loss_and_grads(cfg):
    model = cfg.build(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tokens = jax.random.randint(jax.random.key(1), (2, cfg.max_seq_len + 1), 0, cfg.vocab_size)

    def loss(params, x, y):
        logits = nnx.merge(graphdef, params)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    fn = jax.value_and_grad(loss)
    args = (params, tokens[:, :-1], tokens[:, 1:])
    return jax.jit(fn)(*args), jax.export.export(jax.jit(fn), platforms=("cuda",))(*args)


def test_import_of_jaxoff_policy_imports_no_model():
    code = (
        "import sys, jaxoff.policy\n"
        "loaded = [m for m in sys.modules if m.startswith('jaxoff.models')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_policy_over_a_custom_name_set():
    p = Policy.parse("act=offload,*=device", names=TOY_NAMES)
    assert p.names == TOY_NAMES
    assert p.action("hidden") is Action.DEVICE and p.offloaded() == ("act",)
    assert Policy.parse(p.describe(), names=TOY_NAMES) == p
    assert get_policy("hidden=device", TOY_NAMES).names_with(Action.REMAT) == ("act",)
    assert Policy.uniform(Action.OFFLOAD, names=TOY_NAMES).offloaded() == TOY_NAMES


@pytest.mark.parametrize("spec", ["attn_probs=remat", "act=offload,attn_probs=remat"])
def test_a_gpt_name_is_rejected_with_the_models_own_names(spec):
    with pytest.raises(ConfigError) as e:
        get_policy(spec, names=TOY_NAMES)
    msg = str(e.value)
    assert "'attn_probs' is not a residual name" in msg
    assert "valid names are hidden, act" in msg and "layer_input" not in msg
    with pytest.raises(ConfigError, match=r"model 'toy': .*valid names are hidden, act"):
        apply_policy(TOY, spec)


def test_unknown_spec_lists_the_models_names(tmp_path):
    with pytest.raises(ConfigError, match="with names hidden, act and actions"):
        get_policy("bogus", names=TOY_NAMES)
    f = tmp_path / "toy_policy.toml"
    f.write_text('[policy]\npreset = "full"\nact = "offload"\n')
    assert load_policy_file(f, TOY_NAMES) == Policy.parse("act=offload", names=TOY_NAMES)
    with pytest.raises(ConfigError, match="toy_policy.toml: .*valid names are layer_input"):
        load_policy_file(f)  # over the GPT's names by default


def test_presets_over_a_model_lacking_their_names():
    # no attention core, no projection names: valid, acting on what exists
    assert preset("selective", TOY_NAMES).names_with(Action.DEVICE) == TOY_NAMES
    assert preset("offload_dots", TOY_NAMES).offloaded() == ()
    assert preset("offload_all", TOY_NAMES).offloaded() == TOY_NAMES
    assert resolve_policy("offload_dots", TOY_NAMES) is cp.nothing_saveable
    for name, p in PRESETS.items():
        assert p.for_names(TOY_NAMES).names == TOY_NAMES, name
    with pytest.raises(ConfigError, match="'bogus' is not a policy preset; presets are none"):
        preset("bogus", TOY_NAMES)


def test_presets_over_llama_names_treat_mlp_gate_as_a_projection():
    assert "mlp_gate" in PROJECTIONS
    for name, p in PRESETS.items():
        assert p.for_names(LLAMA_NAMES).names == LLAMA_NAMES, name
    dots = preset("offload_dots", LLAMA_NAMES)
    assert set(dots.offloaded()) == {"attn_q", "attn_k", "attn_v", "attn_out"} | {
        "mlp_gate",
        "mlp_up",
        "mlp_down",
    }
    assert preset("selective", LLAMA_NAMES).action("mlp_gate") is Action.DEVICE
    assert preset("full", LLAMA_NAMES).action("mlp_gate") is Action.REMAT
    assert "mlp_gate" in preset("offload_all", LLAMA_NAMES).offloaded()
    q = get_policy("selective,mlp_gate=offload", names=LLAMA_NAMES)
    assert q.offloaded() == ("mlp_gate",) and q.action("attn_probs") is Action.REMAT
    # the GPT's names have no gate: the default names reject it, listing the GPT's
    with pytest.raises(ConfigError, match="'mlp_gate' is not a residual name.*layer_input"):
        get_policy("mlp_gate=offload")


def test_a_gpt_policy_object_carries_over_only_when_it_treats_names_alike():
    assert PRESETS["offload_all"].policy.for_names(LLAMA_NAMES).offloaded() == LLAMA_NAMES
    assert PRESETS["none"].policy.for_names(TOY_NAMES).to_jax() is None
    with pytest.raises(ConfigError, match="it gives no action to 'mlp_gate'.*names=cfg"):
        PRESETS["selective"].policy.for_names(LLAMA_NAMES)


def test_llama_presets():
    from jax._src.ad_checkpoint import name_p
    from jax._src.interpreters import partial_eval as pe

    llama = pytest.importorskip("jaxoff.models.llama")
    names = tuple(llama.RESIDUAL_NAMES)
    assert "mlp_gate" in names
    assert "mlp_gate" in preset("offload_dots", names).offloaded()
    for name, p in PRESETS.items():
        assert p.for_names(names).names == names, name
    # apply_policy resolves over the Llama config's own names
    cfg = apply_policy(llama.CONFIGS["llama-tiny"], "offload_dots")
    assert isinstance(cfg.stack.policy(name_p, name="mlp_gate"), pe.Offloadable)
    assert cfg.stack.policy(name_p, name="attn_probs") is pe.Recompute


def test_apply_policy_sets_the_stack_of_any_model():
    cfg = apply_policy(TOY, "act=offload,*=device")
    assert callable(cfg.stack.policy) and cfg.stack.remat_every == 1
    assert apply_policy(TOY, "sqrt_bytes").stack.remat_every == "auto"  # sized when traced
    assert apply_policy(TOY, "sqrt").stack.remat_every == 2  # round(sqrt(4 layers))
    assert apply_policy(TOY, "none").stack.policy is None
    assert apply_policy(TOY, "nothing_saveable").stack.policy is cp.nothing_saveable


@pytest.mark.parametrize("spec", ["full", "none", "sqrt", "dots_saveable", "nothing_saveable"])
def test_a_model_without_names_takes_the_policies_that_need_none(spec):
    cfg = apply_policy(NAMELESS, spec)
    assert cfg.stack.policy is resolve_policy(spec, names=())


@pytest.mark.parametrize(
    "spec",
    [
        "selective",
        "offload_all",
        "offload_dots",
        "act=offload",
        Policy.parse("act=device", names=TOY_NAMES),
    ],
)
def test_a_model_without_names_refuses_a_names_based_policy(spec):
    with pytest.raises(
        ConfigError, match="'nameless' has no residual_names .* which a policy needs"
    ):
        apply_policy(NAMELESS, spec)


def test_not_a_model_config_is_a_clear_error():
    with pytest.raises(ConfigError, match="is not a model config"):
        apply_policy(object(), "full")


@pytest.mark.parametrize(
    "spec", ["full", "selective", "offload_all", "act=offload,*=device", "sqrt"]
)
def test_toy_gradients_equal_no_remat_and_offload_reaches_the_host(spec):
    (loss0, grads0), _ = _loss_and_grads(apply_policy(TOY, "none"))
    (loss, grads), exported = _loss_and_grads(apply_policy(TOY, spec))
    assert np.asarray(loss).tobytes() == np.asarray(loss0).tobytes()
    # the same bound as test_policy_grads: 8 float32 ulps of the largest gradient
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads0))
    atol = 8 * np.finfo(np.float32).eps * scale
    for g0, g in zip(jax.tree.leaves(grads0), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(g, g0, rtol=0, atol=atol)
    offloaded = get_policy(spec, TOY_NAMES).offloaded()
    placed = exported.mlir_module().count('_xla_buffer_placement = "pinned_host"')
    # one copy to host per offloaded residual in the layer body, none when nothing is offloaded
    assert placed == len(offloaded), (spec, placed)

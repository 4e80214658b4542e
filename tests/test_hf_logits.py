"""Hugging Face checkpoints in jaxoff's models give transformers' logits, and each known mapping
bug, applied on purpose, is caught by that comparison by a wide margin.

The fixtures (tests/fixtures/hf, every parameter random) and their transformers logits were
written by tests/fixtures/hf/generate.py; versions.json there names the versions.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from _hf import FIXTURES, NAMES, TOL, copy, logits, reference
from flax import nnx

from jaxoff.models import from_pretrained, open_pretrained
from jaxoff.models.gpt import GPTConfig
from jaxoff.models.hf import _mapping
from jaxoff.models.hf._safetensors import DTYPES, read_header
from jaxoff.models.llama import Llama3RopeScaling, LlamaConfig
from jaxoff.nn import count_params

MUTATION_FACTOR = 100  # a bug must move the logits by at least this many tolerances


def test_every_architecture_has_a_fixture():
    assert set(NAMES) == {
        "gpt2",
        "llama",
        "llama3-scaled",
        "mistral",
        "qwen2",
        "qwen3",
        "smollm2-sharded",
    }
    types = {json.loads((FIXTURES / n / "config.json").read_text())["model_type"] for n in NAMES}
    assert types == {"gpt2", "llama", "mistral", "qwen2", "qwen3"}
    assert len(list((FIXTURES / "smollm2-sharded").glob("*.safetensors"))) >= 2


@pytest.mark.parametrize("name", NAMES)
def test_logits_equal_transformers(name):
    model = from_pretrained(FIXTURES / name)
    np.testing.assert_allclose(logits(model, name), reference(name), atol=TOL, rtol=TOL)


def _v4_layout(directory):
    """Rewrites the folder's config.json in transformers v4's layout."""
    path = directory / "config.json"
    cfg = json.loads(path.read_text())
    params = cfg.pop("rope_parameters", None)
    if params is not None:
        cfg["rope_theta"] = params.pop("rope_theta")
        cfg["rope_scaling"] = None if params.get("rope_type") == "default" else params
    cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("name", ["llama", "llama3-scaled", "qwen3"])
def test_transformers_v4_config_layout_reads_the_same(name, tmp_path):
    v5 = open_pretrained(FIXTURES / name)
    v5.close()
    folder = copy(name, tmp_path)
    _v4_layout(folder)
    assert "rope_parameters" not in (folder / "config.json").read_text()
    with open_pretrained(folder, name=v5.config.name) as v4:
        assert v4.config == v5.config
        np.testing.assert_allclose(logits(v4.load(), name), reference(name), atol=TOL, rtol=TOL)


def test_config_options_are_read():
    cfgs = {}
    for name in NAMES:
        with open_pretrained(FIXTURES / name) as ckpt:
            cfgs[name] = ckpt.config
    assert cfgs["llama"].rope_theta == 1000.0 and cfgs["llama"].rope_scaling is None
    assert cfgs["llama3-scaled"].rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 16)
    assert cfgs["mistral"].head_dim == 16 != 32 // 4 and cfgs["mistral"].sliding_window == 6
    assert cfgs["qwen2"].qkv_bias and not cfgs["qwen2"].qk_norm
    assert cfgs["qwen3"].qk_norm and cfgs["qwen3"].head_dim == 16
    assert cfgs["smollm2-sharded"].tie_embeddings
    gpt2 = cfgs["gpt2"]
    assert isinstance(gpt2, GPTConfig)
    assert (gpt2.tie_embeddings, gpt2.norm_eps, gpt2.activation) == (True, 1e-5, "gelu_new")
    for cfg in cfgs.values():  # num_params counts the new options right
        built = nnx.eval_shape(lambda c=cfg: c.build(nnx.Rngs(0)))
        count = sum(x.size for x in jax.tree.leaves(nnx.state(built, nnx.Param)))
        assert cfg.num_params() == count_params(cfg) == count, cfg


@pytest.mark.parametrize("name", ["llama3-scaled", "qwen3"])
def test_float32_masters_are_the_bfloat16_checkpoint_exactly(name):
    (file,) = (FIXTURES / name).glob("*.safetensors")
    infos = read_header(file)
    assert {i.dtype for i in infos.values()} == {"BF16"}
    raw = infos["model.layers.1.mlp.down_proj.weight"]
    data = file.read_bytes()[raw.offset : raw.offset + raw.nbytes]
    want = np.frombuffer(data, DTYPES["BF16"]).reshape(raw.shape).astype(np.float32).T
    model = from_pretrained(FIXTURES / name)
    got = np.asarray(model.blocks.mlp.down.kernel[...][1])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


# --- mutation tests: each known mapping bug, applied on purpose, must fail the comparison


def _error(name, cfg=None, rules=None) -> float:
    with open_pretrained(FIXTURES / name) as ckpt:
        model = ckpt.load(cfg, rules=rules)
    err = float(np.abs(logits(model, name) - reference(name)).max())
    assert np.isfinite(err)
    return err


def _wrap(rules, path, fn):
    """``rules`` with the conversion of the rule making ``path`` followed by ``fn``."""
    out = []
    for r in rules:
        if path in r.paths:
            to_jax = r.to_jax
            r = dataclasses.replace(r, to_jax=lambda w, f=to_jax: tuple(fn(x) for x in f(w)))
        out.append(r)
    return out


def _meta_permute(w, heads):
    """The q/k permutation that turns Meta's interleaved rotary layout into Hugging Face's
    halves: applied to weights already in the halves layout, it is the classic bug."""
    out_dim, in_dim = w.shape
    return w.reshape(heads, out_dim // heads // 2, 2, in_dim).swapaxes(1, 2).reshape(w.shape)


def _assert_caught(err):
    assert err >= MUTATION_FACTOR * TOL, f"the bug moved the logits by only {err:.3g}"


def test_bug_q_k_permuted_is_caught():
    with open_pretrained(FIXTURES / "llama") as ckpt:
        cfg, rules = ckpt.config, ckpt.rules(ckpt.config)
    for name, heads in (("q", cfg.num_heads), ("k", cfg.num_kv_heads)):
        for i, r in enumerate(rules):
            if r.paths == (("blocks", "attn", name, "kernel"),):
                to_jax = r.to_jax
                rules[i] = dataclasses.replace(
                    r, to_jax=lambda w, f=to_jax, h=heads: f(_meta_permute(w, h))
                )
    _assert_caught(_error("llama", rules=rules))


@pytest.mark.parametrize("name", ["gpt2", "smollm2-sharded"])
def test_bug_tied_head_untied_is_caught(name):
    """A loader that ignores ``tie_word_embeddings`` keeps a freshly initialised head."""
    with open_pretrained(FIXTURES / name) as ckpt:
        cfg = dataclasses.replace(ckpt.config, tie_embeddings=False)
        embed = next(r for r in ckpt.rules(ckpt.config) if ("embed", "embedding") in r.paths)
    rng = np.random.default_rng(0)
    fresh = _mapping.Rule(
        embed.hf,
        (("head", "kernel"),),
        lambda w: (rng.normal(0, 0.02, w.T.shape).astype(np.float32),),
        lambda p: p.T,
    )
    with open_pretrained(FIXTURES / name) as ckpt:
        rules = [*ckpt.rules(ckpt.config), fresh]
    _assert_caught(_error(name, cfg, rules))


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_bug_grouped_query_heads_grouped_wrong_is_caught(name):
    """Query head ``h`` paired with key/value head ``h % K`` instead of ``h // (H / K)``:
    the same as reordering the query heads (and the output's) by the other grouping."""
    with open_pretrained(FIXTURES / name) as ckpt:
        cfg, rules = ckpt.config, ckpt.rules(ckpt.config)
    kv, group = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
    assert kv > 1 and group > 1

    def regroup(x, axis):
        shape = x.shape
        x = x.reshape(*shape[:axis], kv, group, *shape[axis + 1 :])
        return np.swapaxes(x, axis, axis + 1).reshape(shape)

    rules = _wrap(rules, ("blocks", "attn", "q", "kernel"), lambda x: regroup(x, 1))
    rules = _wrap(rules, ("blocks", "attn", "out", "kernel"), lambda x: regroup(x, 0))
    if cfg.qkv_bias:
        rules = _wrap(rules, ("blocks", "attn", "q", "bias"), lambda x: regroup(x, 0))
    _assert_caught(_error(name, rules=rules))


def test_bug_llama3_rope_scaling_dropped_is_caught():
    with open_pretrained(FIXTURES / "llama3-scaled") as ckpt:
        cfg = ckpt.config
    assert isinstance(cfg, LlamaConfig) and cfg.rope_scaling is not None
    _assert_caught(_error("llama3-scaled", dataclasses.replace(cfg, rope_scaling=None)))


def test_bug_rope_theta_ignored_is_caught():
    with open_pretrained(FIXTURES / "llama") as ckpt:
        cfg = ckpt.config
    assert cfg.rope_theta != 10000.0
    _assert_caught(_error("llama", dataclasses.replace(cfg, rope_theta=10000.0)))


def test_bug_qkv_bias_dropped_is_caught():
    with open_pretrained(FIXTURES / "qwen2") as ckpt:
        cfg = ckpt.config
    _assert_caught(_error("qwen2", dataclasses.replace(cfg, qkv_bias=False)))


def test_bug_qk_norm_dropped_is_caught():
    with open_pretrained(FIXTURES / "qwen3") as ckpt:
        cfg = ckpt.config
    _assert_caught(_error("qwen3", dataclasses.replace(cfg, qk_norm=False)))


def test_bug_sliding_window_ignored_is_caught():
    with open_pretrained(FIXTURES / "mistral") as ckpt:
        cfg = ckpt.config
    _assert_caught(_error("mistral", dataclasses.replace(cfg, sliding_window=None)))


def test_bug_gpt2_conv1d_transposed_is_caught():
    """GPT-2's Conv1D weights are ``[in, out]`` already; transposing them (as for a Linear)
    is the classic bug (``c_proj`` is square, so its shape cannot catch it)."""
    with open_pretrained(FIXTURES / "gpt2") as ckpt:
        cfg, rules = ckpt.config, ckpt.rules(ckpt.config)
    path = ("blocks", "attn", "out", "kernel")
    h, dh, d = cfg.num_heads, cfg.head_dim, cfg.d_model
    rules = _wrap(rules, path, lambda x: x.reshape(h * dh, d).T.reshape(h, dh, d))
    _assert_caught(_error("gpt2", rules=rules))

"""examples/train_tiny.py: trains from Python with the public API and samples with one compile."""

import ast
import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxoff
from jaxoff.train import init_state

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_tiny.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_example_imports_only_public_jaxoff_modules():
    tree = ast.parse(EXAMPLE.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    jaxoff_modules = [m for m in names if m.split(".")[0] == "jaxoff"]
    assert jaxoff_modules and not [m for m in jaxoff_modules if "._" in m or m.startswith("_")]


def test_train_tiny_runs_and_prints_a_sample(capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 200)
    losses = _example().main(
        steps=4, sample_tokens=8, log_every=2, batch_size=2, seq_len=32, data=str(corpus)
    )
    assert len(losses) == 4 and np.isfinite(losses).all()
    out = capsys.readouterr().out
    assert "step    2  loss" in out and "step    4  loss" in out
    assert out.rstrip().splitlines()[-1].startswith("def ")


def test_sampling_compiles_once_and_matches_the_unpadded_forward():
    example = _example()
    cfg = jaxoff.TrainConfig(model="tiny", store="none")
    graphdef, state = init_state(cfg.model_config(), cfg.build_optimizer(), 0)
    seq_len = 8
    sample, next_token = example.make_sampler(graphdef, seq_len)
    # the text grows past the buffer (4 + 10 > 8): the window slides, the shape stays
    text = sample(state.params, b"def ", 10, jax.random.key(0))
    assert len(text) == 14 and text.startswith(b"def ")
    assert next_token._cache_size() == 1  # a growing input used to compile every token
    # padded after the prompt, the last prompt position's logits are the prompt's own
    prompt = np.frombuffer(b"import", np.uint8).astype(np.int32)
    buffer = np.zeros(seq_len, np.int32)
    buffer[: prompt.size] = prompt
    key = jax.random.key(1)
    logits = nnx.merge(graphdef, state.params)(jnp.asarray(prompt)[None])[0, -1]
    expected = jax.random.categorical(key, logits / 0.8)
    assert int(next_token(state.params, buffer, jnp.int32(prompt.size), key)) == int(expected)

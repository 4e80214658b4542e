"""Every refusal of a Hugging Face checkpoint: one line, a jaxoff error naming the key (and
what to do), raised before anything is read into a model or written."""

from __future__ import annotations

import json
import struct

import pytest
from _hf import copy, tree

from jaxoff._errors import JaxoffError
from jaxoff.models import PretrainedError, from_pretrained, open_pretrained


def _edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def _edit_header(file, name, **changes):
    """Rewrites one tensor's header entry (same header length: padded with spaces)."""
    data = file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    header[name].update(changes)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    file.write_bytes(data[:8] + text + b" " * (n - len(text)) + data[8 + n :])


def _rope(folder, **params):
    cfg = json.loads((folder / "config.json").read_text())
    return {**cfg["rope_parameters"], **params}


def _break_shard(folder):
    (folder / "model-00002-of-00004.safetensors").unlink()


def _truncate(folder):
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])


def _leftover(folder):
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.layers.3.mlp.up_proj.weight"] = "model-00001-of-00004.safetensors"
    index.write_text(json.dumps(data))


CASES = {
    "unknown model_type": (
        "llama",
        lambda f: _edit_config(f, model_type="falcon"),
        r"config.json: model_type='falcon' is not supported: jaxoff reads llama, mistral",
    ),
    "unknown rope type": (
        "llama3-scaled",
        lambda f: _edit_config(f, rope_parameters=_rope(f, rope_type="yarn")),
        r"rope_parameters.rope_type='yarn' is not supported",
    ),
    "unknown v4 rope type": (
        "llama",
        lambda f: _edit_config(
            f, rope_parameters=None, rope_theta=1000.0, rope_scaling={"type": "dynamic"}
        ),
        r"rope_scaling.rope_type='dynamic' is not supported",
    ),
    "llama3 scaling incomplete": (
        "llama3-scaled",
        lambda f: _edit_config(f, rope_parameters=_rope(f, factor=None)),
        r"config.json: rope_parameters of rope_type 'llama3' has no 'factor'",
    ),
    "unknown activation": (
        "gpt2",
        lambda f: _edit_config(f, activation_function="relu"),
        r"activation_function='relu' is not supported",
    ),
    "unknown llama activation": (
        "qwen2",
        lambda f: _edit_config(f, hidden_act="gelu"),
        r"hidden_act='gelu' is not supported",
    ),
    "attention bias": (
        "llama",
        lambda f: _edit_config(f, attention_bias=True),
        r"attention_bias=True is not supported",
    ),
    "qwen sliding window": (
        "qwen3",
        lambda f: _edit_config(f, use_sliding_window=True),
        r"use_sliding_window=True is not supported",
    ),
    "missing key": (
        "llama",
        lambda f: _edit_config(f, hidden_size=None),
        r"config.json has no 'hidden_size'",
    ),
    "missing config": (
        "llama",
        lambda f: (f / "config.json").unlink(),
        r"config.json does not exist",
    ),
    "missing shard": (
        "smollm2-sharded",
        _break_shard,
        r"is in shard model-00002-of-00004.safetensors, which is missing",
    ),
    "no weights": (
        "llama",
        lambda f: (f / "model.safetensors").unlink(),
        r"has no \*.safetensors file",
    ),
    "wrong shape": (
        "llama",
        lambda f: _edit_header(
            f / "model.safetensors", "model.layers.1.self_attn.k_proj.weight", shape=[32, 16]
        ),
        r"tensor 'model.layers.1.self_attn.k_proj.weight' has shape \[32, 16\], config.json "
        r"implies \[16, 32\]",
    ),
    "wrong dtype": (
        "llama",
        lambda f: _edit_header(f / "model.safetensors", "model.norm.weight", dtype="I32"),
        r"tensor 'model.norm.weight' is I32: jaxoff reads F32, F16, BF16",
    ),
    "layer missing": (
        "llama",
        lambda f: _edit_config(f, num_hidden_layers=3),
        r"tensor 'model.layers.2.input_layernorm.weight' is missing",
    ),
    "tensor left over": (
        "smollm2-sharded",
        lambda f: _edit_config(f, num_hidden_layers=2),
        r"tensor 'model.layers.2.\S+' \(and 8 more\) is no parameter of the llama",
    ),
    "index names a tensor not in its shard": (
        "smollm2-sharded",
        _leftover,
        r"tensor 'model.layers.3.mlp.up_proj.weight' is not in its shard",
    ),
    "truncated file": (
        "llama",
        _truncate,
        r"lies at bytes .* the file is truncated",
    ),
    "bad dimensions": (
        "llama",
        lambda f: _edit_config(f, num_key_value_heads=3),
        r"config.json describes no valid llama model: num_kv_heads=3 must divide",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line_naming_the_key_and_nothing_written(case, tmp_path):
    name, breaker, match = CASES[case]
    folder = copy(name, tmp_path)
    breaker(folder)
    before = tree(tmp_path)
    with pytest.raises(PretrainedError, match=match) as e:
        from_pretrained(folder)
    assert isinstance(e.value, JaxoffError)
    assert "\n" not in str(e.value)
    with pytest.raises(PretrainedError):
        open_pretrained(folder)
    assert tree(tmp_path) == before

"""`jaxoff.nn.layerwise_params`: a model's parameters with its stacked blocks made one layer at
a time, bitwise the whole build's, the whole stack never in memory."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jaxoff.models.gpt import CONFIGS
from jaxoff.models.llama import CONFIGS as LLAMA
from jaxoff.nn import LayerLeaf, layerwise_params, stacked


def _is_layer_leaf(x):
    return isinstance(x, LayerLeaf)


def _assert_layerwise_equals_whole(build):
    graphdef, whole = nnx.split(build(), nnx.Param)
    lazy_def, lazy = layerwise_params(build)
    assert lazy_def == graphdef
    flat = jax.tree_util.tree_flatten_with_path(whole)[0]
    leaves = jax.tree.leaves(lazy, is_leaf=_is_layer_leaf)
    assert len(leaves) == len(flat)
    n_stacked = 0
    for (path, x), y in zip(flat, leaves, strict=True):
        name = jax.tree_util.keystr(path)
        if isinstance(y, LayerLeaf):
            n_stacked += 1
            assert (y.shape, y.dtype) == (x.shape, x.dtype), name
            for j in range(x.shape[0]):
                np.testing.assert_array_equal(np.asarray(y[j]), np.asarray(x[j]), err_msg=name)
        else:
            assert "blocks" not in name, name
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x), err_msg=name)
    return n_stacked


@pytest.mark.parametrize(
    "cfg",
    [
        CONFIGS["tiny"],
        dataclasses.replace(CONFIGS["tiny"], positions="rotary", num_layers=3),
        LLAMA["llama-tiny"],
    ],
    ids=["gpt-tiny", "gpt-rotary", "llama-tiny"],
)
def test_layerwise_params_are_the_whole_build_bitwise(cfg):
    # the streams after the blocks (final norm, head) advance as in a whole build: the head
    # equal bitwise checks that the split consumed the same draws
    n = _assert_layerwise_equals_whole(lambda: cfg.build(nnx.Rngs(7)))
    assert n > 0


def test_layerwise_params_of_two_stacks_in_one_model():
    class TwoStacks(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Linear(3, 8, rngs=rngs)
            self.blocks = stacked(lambda r: nnx.Linear(8, 8, rngs=r), 4, rngs)
            self.mid = nnx.Linear(8, 8, rngs=rngs)
            self.more = stacked(lambda r: nnx.LayerNorm(8, rngs=r), 2, rngs)
            self.head = nnx.Linear(8, 2, rngs=rngs)

    assert _assert_layerwise_equals_whole(lambda: TwoStacks(nnx.Rngs(1))) == 4


def test_layerwise_params_of_a_model_larger_than_memory():
    # 4096 layers of d_model 1024: ~50 billion parameters (200 GB in float32); built whole it
    # could not exist on this machine, layer by layer each layer is 50 MB
    cfg = dataclasses.replace(CONFIGS["tiny"], num_layers=4096, d_model=1024, d_ff=4096)
    _, params = layerwise_params(lambda: cfg.build(nnx.Rngs(0)))
    up = params["blocks"]["mlp"]["up"]["kernel"].get_value()
    assert isinstance(up, LayerLeaf)
    assert up.shape == (4096, 1024, 4096)
    total = sum(x.size for x in jax.tree.leaves(params, is_leaf=_is_layer_leaf))
    assert total > 5e10
    first, last = np.asarray(up[0]), np.asarray(up[4095])
    assert first.shape == last.shape == (1024, 4096)
    assert 0.015 < float(first.std()) < 0.025  # GPT's normal(0.02) init
    assert not np.array_equal(first, last)


def test_a_layer_leaf_cannot_be_made_whole():
    _, params = layerwise_params(lambda: CONFIGS["tiny"].build(nnx.Rngs(0)))
    leaf = params["blocks"]["attn"]["q"]["kernel"].get_value()
    with pytest.raises(TypeError, match=r"one layer at a time: index it"):
        np.asarray(leaf)
    with pytest.raises(IndexError, match="layer 5 of a stack of 5"):
        leaf[5]


def test_a_layerwise_model_is_written_to_the_store_without_being_whole_in_memory(tmp_path):
    """bench/layerwise_init.py's children: ``fuyou_init(..., page_params=True)`` of GPT
    'small' (340 MB of float32 parameters) built whole, then layer by layer; the layerwise
    child's peak RSS stays below the whole one's by more than half the parameters."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "bench" / "layerwise_init.py"
    out = tmp_path / "lwi.json"
    cmd = [sys.executable, str(script), "--model", "small", "--store-dir", str(tmp_path)]
    subprocess.run([*cmd, "--train-steps", "0", "--json", str(out)], check=True)
    rec = json.loads(out.read_text())
    whole, layerwise = rec["records"]["whole"], rec["records"]["layerwise"]
    assert whole["param_bytes"] == layerwise["param_bytes"] > 3e8
    assert layerwise["peak_rss"] < whole["peak_rss"] - whole["param_bytes"] / 2


def test_the_docstring_example_runs():
    import doctest

    from jaxoff.nn import _layerwise

    result = doctest.testmod(_layerwise)
    assert result.attempted > 0 and result.failed == 0

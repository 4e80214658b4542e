"""A Hugging Face checkpoint is read one layer at a time: every read is one tensor's byte range
(``os.pread`` at its header offsets), a layer's read touches only that layer's tensors, and
the lazy leaves go straight into a Fuyou page store (``fuyou_init(..., page_params=True)``)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from _hf import FIXTURES
from flax import nnx

from jaxoff.models import from_pretrained, open_pretrained
from jaxoff.models.hf import PretrainedLeaf, _safetensors


@pytest.fixture
def reads(monkeypatch):
    """Every positioned read: ``(file name, offset, length)``."""
    import os

    log: list[tuple[str, int, int]] = []
    real = _safetensors._pread

    def pread(fd, n, offset):
        log.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), offset, n))
        return real(fd, n, offset)

    monkeypatch.setattr(_safetensors, "_pread", pread)
    return log


def _ranges(ckpt, names):
    return {(i.file.name, i.offset, i.nbytes) for n, i in ckpt._tensors.items() if n in names}


def _layer_names(ckpt, j):
    return {n for n in ckpt._tensors if n.startswith(f"model.layers.{j}.")}


def test_a_layer_read_touches_only_that_layers_bytes(reads):
    with open_pretrained(FIXTURES / "smollm2-sharded") as ckpt:
        assert len({i.file for i in ckpt._tensors.values()}) >= 2
        _, params = ckpt.params()
        outside = {n for n in ckpt._tensors if not n.startswith("model.layers.")}
        assert set(reads) == _ranges(ckpt, outside)  # no block tensor read yet
        leaves = [x for x in jax.tree.leaves(params) if isinstance(x, PretrainedLeaf)]
        assert len(leaves) == 9
        for j in range(ckpt.config.num_layers):
            reads.clear()
            for leaf in leaves:
                assert leaf[j].shape == leaf.shape[1:]
            # exactly layer j's tensors, each read once, in one read each
            assert sorted(reads) == sorted(_ranges(ckpt, _layer_names(ckpt, j)))


def test_a_whole_load_reads_each_tensor_once_layer_by_layer(reads):
    from_pretrained(FIXTURES / "smollm2-sharded")
    with open_pretrained(FIXTURES / "smollm2-sharded") as ckpt:
        every = _ranges(ckpt, set(ckpt._tensors))
        layer_of = {
            (i.file.name, i.offset, i.nbytes): int(n.split(".")[2])
            for n, i in ckpt._tensors.items()
            if n.startswith("model.layers.")
        }
    assert sorted(reads) == sorted(every)  # every range once, no read spans two tensors
    # each stacked leaf is filled layer by layer (j ascending) from its own tensors
    order = [layer_of[r] for r in reads if r in layer_of]
    assert len(order) == 9 * 3


def test_gpt2_c_attn_is_read_once_per_layer_for_query_key_and_value(reads):
    with open_pretrained(FIXTURES / "gpt2") as ckpt:
        _, params = ckpt.params()
        reads.clear()
        attn = params["blocks"]["attn"]
        for name in ("q", "k", "v"):
            attn[name]["kernel"][1]
        (info,) = [i for n, i in ckpt._tensors.items() if n.endswith("h.1.attn.c_attn.weight")]
    assert reads == [(info.file.name, info.offset, info.nbytes)]


def test_a_pretrained_leaf_cannot_be_made_whole():
    with open_pretrained(FIXTURES / "llama") as ckpt:
        _, params = ckpt.params()
        leaf = params["blocks"]["mlp"]["up"]["kernel"].get_value()
        assert isinstance(leaf, PretrainedLeaf)
        with pytest.raises(TypeError, match="read one layer at a time"):
            np.asarray(leaf)
        with pytest.raises(IndexError, match="layer 2 of a stack of 2"):
            leaf[2]


def test_lazy_leaves_go_straight_into_a_fuyou_page_store(tmp_path):
    """``fuyou_init(..., page_params=True)`` of a checkpoint's lazy leaves writes the
    checkpoint's blocks, bitwise those of an in-memory load."""
    from jaxoff.nn import with_stack
    from jaxoff.optim import paged
    from jaxoff.strategies.fuyou import fuyou_init, fuyou_params, fuyou_resident

    whole = nnx.state(from_pretrained(FIXTURES / "llama"), nnx.Param)
    with open_pretrained(FIXTURES / "llama") as ckpt:
        cfg = with_stack(ckpt.config, policy="nothing_saveable")
        _, params = ckpt.params(cfg)
        tx = paged(optax.adamw(1e-3), tmp_path / "store", chunk_bytes=1 << 14)
        fuyou_init(cfg, tx, params, page_params=True)
    back = fuyou_params(tx, fuyou_resident(jax.tree.map(lambda x: x, whole)))
    want = jax.tree_util.tree_flatten_with_path(whole)[0]
    got = jax.tree.leaves(back)
    assert len(got) == len(want)
    for (path, x), y in zip(want, got, strict=True):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x), jax.tree_util.keystr(path))
    assert dataclasses.replace(cfg, stack=ckpt.config.stack) == ckpt.config

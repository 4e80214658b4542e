"""The paged update indexes a leaf's chunks with int32: what it refuses, and what Fuyou may page.

A leaf updated in one pass must hold fewer than ``2**31 - chunk_elems`` elements. Fuyou pages a
stacked leaf one layer at a time, so only a layer must: the capacity model of
``bench/capacity.py`` (132 layers at d_model 2048) has a stacked MLP kernel of 2.2 billion
elements. Nothing here allocates a large array: plans and traces take shapes.
"""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest

from jaxoff.aio import PageStore
from jaxoff.optim import NotElementwiseError, paged
from jaxoff.optim.chunks import chunk_updater, fixed_names
from jaxoff.strategies.fuyou import _layout as _fuyou

CHUNK = 1 << 20  # 262144 float32 elements
LIMIT = 2**31 - CHUNK // 4


def test_a_leaf_too_large_to_index_is_refused_with_what_to_do(tmp_path):
    updater = chunk_updater(paged(optax.adamw(1e-3), str(tmp_path / "s"), chunk_bytes=CHUNK))
    ok = {"w": jax.ShapeDtypeStruct((LIMIT - 1,), jnp.float32)}
    assert updater.plan(ok).leaves[0].size == LIMIT - 1
    big = {"w": jax.ShapeDtypeStruct((LIMIT,), jnp.float32)}
    with pytest.raises(
        NotElementwiseError,
        match=r"'w'.*2\*\*31.*split.*a layer at a time \(`strategy='fuyou'`, jaxoff\.strat",
    ):
        updater.plan(big)
    assert not (tmp_path / "s").exists()  # refused before anything is written


def test_a_stacked_leaf_paged_a_layer_at_a_time_may_exceed_int32(tmp_path):
    updater = chunk_updater(paged(optax.adamw(1e-3), str(tmp_path / "s"), chunk_bytes=CHUNK))
    stacked = {"w": jax.ShapeDtypeStruct((128, 4096, 4096), jnp.bfloat16)}  # 2**31 elements
    with pytest.raises(NotElementwiseError, match="2147483648 elements at a time"):
        updater.plan(stacked)
    plan = updater.plan(stacked, parts=(128,))
    assert plan.leaves[0].size == 2**31
    with pytest.raises(NotElementwiseError, match="2147483648 elements at a time"):
        updater.plan(stacked, parts=(1,))  # one part: the whole leaf


class _NoPaging:
    """A step recorder that fails any use: the refusal comes before the first paging call."""

    def __getattr__(self, name):
        raise AssertionError(f"update_leaf paged (StepRecorder.{name}) before refusing")


def test_update_leaf_refuses_a_part_too_large_to_index(tmp_path):
    """A plan made for layer-sized parts does not let a whole stacked leaf through."""
    updater = chunk_updater(paged(optax.adamw(1e-3), str(tmp_path / "s"), chunk_bytes=CHUNK))
    shape = (128, 4096, 4096)
    plan = updater.plan({"w": jax.ShapeDtypeStruct(shape, jnp.bfloat16)}, parts=(128,))
    leaf = plan.leaves[0]
    names = fixed_names([plan.entries[k].name for k in leaf.entries])

    def update(g, p):
        return updater.update_leaf(_NoPaging(), plan, leaf, g, p, [], names)

    whole = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    with pytest.raises(NotElementwiseError, match="2147483648 elements at a time"):
        jax.eval_shape(update, whole, whole)


def _capacity_module():
    """``bench/capacity.py``, whose ``model_config`` makes the capacity probes' models."""
    path = Path(__file__).resolve().parents[1] / "bench" / "capacity.py"
    spec = importlib.util.spec_from_file_location("capacity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Reached(Exception):
    pass


def test_fuyou_lays_out_a_model_whose_stacked_leaves_exceed_int32(tmp_path, monkeypatch):
    """The capacity model: Fuyou plans it (a layer of each stacked leaf is 16.8M elements)
    where the sequential paged update refuses it. The store is not created (it would take
    80 GB): its creation is where the layout is checked."""
    cfg = _capacity_module().model_config(132, 2048, 128, "fuyou")
    params = _fuyou._abstract_params(cfg)
    tx = paged(optax.adamw(1e-3), str(tmp_path / "s"), chunk_bytes=16 << 20)
    with pytest.raises(NotElementwiseError, match=r"blocks.*mlp.*2214592512 elements at a time"):
        chunk_updater(tx).plan(params)

    seen = {}

    def open_or_create(root, layout, **kw):
        seen.update({e.name: e.shape for e in layout.entries})  # the planned layout
        raise _Reached

    monkeypatch.setattr(PageStore, "open_or_create", staticmethod(open_or_create))
    with pytest.raises(_Reached):
        _fuyou._layout(tx, params)
    kernels = {
        k: shape
        for k, shape in seen.items()
        if k.startswith("master.blocks.mlp.") and ".kernel@" in k
    }
    assert len(kernels) == 2 * 132  # up and down, per layer
    assert set(kernels.values()) == {(2048, 8192), (8192, 2048)}

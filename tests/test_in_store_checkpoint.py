"""In-store checkpoints (``--paged-checkpoint store``, ``save_paged(..., in_store=True)``): a
checkpoint's paged part names the store's committed version by its checksums instead of
copying it, so a store as large as the disk can still end a run on a checkpoint."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax.numpy as jnp
import pytest

from jaxoff import ConfigError
from jaxoff.aio import PageStoreCorruptError, PageStoreError
from jaxoff.optim import paged, restore_paged, save_paged
from jaxoff.train import TrainConfig, train

sys.path.insert(0, os.path.dirname(__file__))
from test_paged import OPTIMIZERS, assert_trees_equal, mlp_params  # noqa: E402
from test_paged_processes import _steps  # noqa: E402
from test_train_fuyou import COMMON as FUYOU_COMMON  # noqa: E402


def _tx(root, slots):
    return paged(OPTIMIZERS["adamw"](), root, chunk_bytes=4096, slots=slots)


@pytest.mark.parametrize("slots", [1, 2])
def test_in_store_checkpoint_restores_bitwise_and_refuses_once_the_store_moved_on(tmp_path, slots):
    p0 = mlp_params(jnp.bfloat16)  # a step donates its parameters: each run has its own
    ref = _tx(tmp_path / "ref", slots)
    want, _ = _steps(ref, p0, ref.init(p0), 0, 6)
    ref.close()

    tx = _tx(tmp_path / "store", slots)
    p0 = mlp_params(jnp.bfloat16)
    params, state = _steps(tx, p0, tx.init(p0), 0, 3)
    ck = tmp_path / "ck"
    assert save_paged(tx, state, ck, in_store=True) == 0
    assert sorted(os.listdir(ck)) == ["paged.json"]  # no page file: the pages stay put
    meta = json.loads((ck / "paged.json").read_text())
    assert meta["in_store"] == os.path.realpath(tmp_path / "store")
    assert meta["store_version"] == tx.store.version == 4
    tx.close()

    tx = _tx(tmp_path / "store", slots)  # a new process's optimizer over the same store
    state = restore_paged(tx, ck, mlp_params(jnp.bfloat16))
    assert tx.store.version == 4  # adopted, not rewritten as a new version
    got, state = _steps(tx, params, state, 3, 6)
    assert_trees_equal(want, got)  # bitwise the uninterrupted run

    # the store has committed three more versions: the checkpoint's is gone
    with pytest.raises(PageStoreCorruptError, match="no longer holds that version: it holds"):
        restore_paged(tx, ck, mlp_params(jnp.bfloat16))
    tx.close()

    other = _tx(tmp_path / "other", slots)
    with pytest.raises(PageStoreError, match="restore it with that store"):
        restore_paged(other, ck, mlp_params(jnp.bfloat16))
    assert other.store is None or other.store.version == 0  # nothing written
    other.close()


def test_a_copied_checkpoint_is_unchanged_by_the_option(tmp_path):
    """``in_store=False`` (the default) still copies every page, restorable anywhere."""
    p0 = mlp_params(jnp.bfloat16)
    tx = _tx(tmp_path / "store", 2)
    _, state = _steps(tx, p0, tx.init(p0), 0, 2)
    assert save_paged(tx, state, tmp_path / "ck") > 0
    files = os.listdir(tmp_path / "ck")
    assert "paged.json" in files and any(f.endswith(".page") for f in files)
    assert "in_store" not in json.loads((tmp_path / "ck" / "paged.json").read_text())
    tx.close()


COMMON = dict(FUYOU_COMMON, store_slots=1)  # the Fuyou trainer tests' run, in place


def _paged_files(run) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), run / "checkpoints_paged")
        for d, _, fs in os.walk(run / "checkpoints_paged")
        for f in fs
    )


@pytest.mark.parametrize("strategy", ["plain", "fuyou", "fuyou-bf16"])
def test_train_with_in_store_checkpoints_resumes_bitwise(tmp_path, strategy):
    """``jaxoff train --paged-checkpoint store``: each checkpoint's paged part is a manifest;
    a run stopped at step 3 and resumed is bitwise the uninterrupted run with copies
    (``fuyou-bf16``: the capacity record's form, whose blocks are made from the masters)."""
    fuyou = strategy.startswith("fuyou")
    base = dict(COMMON, strategy="fuyou" if fuyou else "plain", fuyou=fuyou)
    if strategy == "fuyou-bf16":
        base.update(param_dtype="bfloat16", dtype="bfloat16")
    copies = train(TrainConfig(**base, out_dir=tmp_path / "copies"))
    part = TrainConfig(**base, out_dir=tmp_path / "part", paged_checkpoint="store", stop_at=3)
    first = train(part)
    assert _paged_files(tmp_path / "part") == ["3/paged.json"]
    resumed = train(dataclasses.replace(part, stop_at=0, resume=True))
    assert resumed.first_step == 3
    assert first.losses + resumed.losses == copies.losses  # bitwise: float equality
    assert [r.get("val_loss") for r in resumed.records] == [
        r.get("val_loss") for r in copies.records[3:]
    ]
    # both checkpoints kept (--keep-checkpoints 2) are manifests; 3's now names a version
    # the store has since overwritten
    assert _paged_files(tmp_path / "part") == ["3/paged.json", "6/paged.json"]
    assert any(f.endswith(".page") for f in _paged_files(tmp_path / "copies"))


def test_resume_from_an_in_store_checkpoint_whose_store_is_gone_says_so(tmp_path):
    import shutil

    cfg = TrainConfig(**COMMON, out_dir=tmp_path / "run", paged_checkpoint="store", stop_at=3)
    train(cfg)
    shutil.rmtree(tmp_path / "run" / "store")  # the store the checkpoint names
    with pytest.raises(Exception, match="in-store checkpoint") as info:
        train(dataclasses.replace(cfg, stop_at=0, resume=True))
    assert "no longer holds that version" in str(info.value)
    assert (tmp_path / "run" / "checkpoints" / "3").is_dir()  # nothing removed unasked


def test_in_store_checkpoints_need_a_store(tmp_path):
    with pytest.raises(ConfigError, match="--paged-checkpoint store .* --store none"):
        TrainConfig(
            **COMMON, out_dir=tmp_path / "r", store="none", paged_checkpoint="store"
        ).validate()
    with pytest.raises(ConfigError, match="--paged-checkpoint must be copy or store"):
        TrainConfig(**COMMON, out_dir=tmp_path / "r", paged_checkpoint="link").validate()  # type: ignore[arg-type]
    assert not (tmp_path / "r").exists()  # nothing written before the input is known good

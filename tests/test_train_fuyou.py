"""``jaxoff train --fuyou [--page-params]``: Fuyou's step in the trainer, with the block
parameters paged to the store (ZeRO-Infinity's parameter offload), checkpointed and resumed.

The reference is the trainer's own sequential paged run (``--store``, the update after the
backward pass) with the same options: Fuyou's step is bitwise that step (``test_fuyou.py``), so
the trainer runs must agree bitwise too, in losses, evaluation losses and parameters.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from jaxoff.strategies.fuyou import _layout as _fuyou
from jaxoff.strategies.fuyou import default_read_ahead_bytes
from jaxoff.train import TrainConfig, train
from jaxoff.train._options import flat_options

# each block recomputed in backward, as Fuyou's step does: the reference's arithmetic is then
# the same, and the comparison bitwise
COMMON = dict(
    model="tiny",
    policy="nothing_saveable",
    batch_size=2,
    seq_len=32,
    steps=6,
    lr=3e-3,
    warmup_steps=2,
    clip_norm=0.0,
    eval_every=3,
    eval_batches=2,
    ckpt_every=3,
    chunk_mib=1,
    progress=False,
)


def _config(tmp_path, name, **over):
    return TrainConfig(**{**COMMON, "out_dir": tmp_path / name, **over})


def _final_params(cfg) -> dict:
    """``{leaf path: array}`` of the run's parameters after its last step: its last orbax
    checkpoint, and with paged parameters each block leaf stacked from the store's entries
    (``param.<leaf>@<layer>``, read and verified); blocks held as bits are saved as their
    fp32 masters only (``master.<leaf>@<layer>``), cast to the parameters' dtype here."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from jaxoff.aio import PageStore
    from jaxoff.optim.chunks import path_name

    saved = ocp.StandardCheckpointer().restore(
        (cfg.out_dir / "checkpoints" / str(cfg.steps) / "default").absolute()
    )
    paged = json.loads(
        (cfg.out_dir / "checkpoints_paged" / str(cfg.steps) / "paged.json").read_text()
    )
    masters = paged.get("extra", {}).get("blocks") == "masters"
    flat = jax.tree_util.tree_flatten_with_path(saved["params"])[0]
    if not cfg.page_params and not masters:
        return {path_name(p): np.asarray(x) for p, x in flat}
    out = {
        k.strip("[']").replace("']['", ".").replace("'].", "."): np.asarray(x)
        for k, x in saved["params"].items()
    }
    store = PageStore.open(cfg.store_dir())
    layers: dict[str, dict[int, np.ndarray]] = {}
    prefix = "master." if masters else "param."
    for name, e in store.entries.items():
        if name.startswith(prefix) and "@" in name:  # a layer of a block leaf
            leaf, j = name.removeprefix(prefix).rsplit("@", 1)
            x = store.read(name).reshape(e.shape)
            if masters:  # the step's own cast of its new master
                x = np.asarray(jnp.asarray(x).astype(cfg.param_dtype))
            layers.setdefault(leaf + ".value", {})[int(j)] = x
    store.close()
    for leaf, per in layers.items():
        out[leaf] = np.stack([per[j] for j in range(len(per))])
    return out


def _spy_read_ahead(monkeypatch) -> list[int]:
    """The read-ahead budgets Fuyou's store layouts are made with, from now on."""
    budgets, real = [], _fuyou._Layout

    def spy(*args, **kw):
        lay = real(*args, **kw)
        budgets.append(lay.read_ahead_bytes)
        return lay

    monkeypatch.setattr(_fuyou, "_Layout", spy)
    return budgets


def test_fuyou_trainer_is_bitwise_the_sequential_paged_trainer(tmp_path, monkeypatch):
    seq = train(_config(tmp_path, "seq"))
    budgets = _spy_read_ahead(monkeypatch)
    fuyou = train(_config(tmp_path, "fuyou", fuyou=True))
    assert set(budgets) == {default_read_ahead_bytes()}
    budgets.clear()
    # --fuyou-read-ahead-mib 0: each tensor's first chunk read ahead (here a layer's tensors
    # are a chunk each: the same reads); the store's layout is made with it
    nvme = train(
        _config(
            tmp_path, "nvme", fuyou=True, page_params=True, store_slots=1, fuyou_read_ahead_mib=0
        )
    )
    assert set(budgets) == {0}
    assert len(seq.losses) == 6 and np.mean(seq.losses[-2:]) < seq.losses[0]
    assert fuyou.losses == seq.losses  # bitwise: float equality
    assert nvme.losses == seq.losses
    for run in (fuyou, nvme):
        assert [r.get("val_loss") for r in run.records] == [r.get("val_loss") for r in seq.records]
        # the I/O split of the paged step, from Fuyou's own file table
        assert all(r["io_s"] > 0 and 0 <= r["io_hidden"] <= 1 for r in run.records)
    # the same parameters; the --page-params run's blocks read back from its store, where
    # each layer is its own entries
    ref = _final_params(_config(tmp_path, "seq"))
    for run in (
        _config(tmp_path, "fuyou", fuyou=True),
        _config(tmp_path, "nvme", fuyou=True, page_params=True, store_slots=1),
    ):
        got = _final_params(run)
        assert sorted(ref) == sorted(got)
        for k in ref:
            assert ref[k].tobytes() == got[k].tobytes(), k
    cfg = flat_options(json.loads((tmp_path / "nvme" / "config.json").read_text()))
    assert cfg["fuyou"] is True and cfg["page_params"] is True


def test_fuyou_run_with_paged_parameters_resumes_bitwise(tmp_path):
    full = train(_config(tmp_path, "full", fuyou=True, page_params=True))
    part = _config(tmp_path, "part", fuyou=True, page_params=True, stop_at=3)
    first = train(part)
    # the store runs ahead of the checkpoint after a crash: damage it, the resume rebuilds it
    store = tmp_path / "part" / "store"
    page = next(p for p in sorted(store.rglob("*")) if p.is_file() and "param." in p.name)
    page.write_bytes(b"\0" * page.stat().st_size)
    resumed = train(dataclasses.replace(part, stop_at=0, resume=True))
    assert resumed.first_step == 3
    assert first.losses + resumed.losses == full.losses  # bitwise
    assert [r.get("val_loss") for r in resumed.records] == [
        r.get("val_loss") for r in full.records[3:]
    ]


def test_fuyou_resume_refuses_a_damaged_checkpoint_and_falls_back(tmp_path):
    cfg = _config(tmp_path, "run", fuyou=True, page_params=True, steps=9, eval_every=0)
    first = train(dataclasses.replace(cfg, stop_at=6))  # checkpoints 3 and 6
    paged = tmp_path / "run" / "checkpoints_paged" / "6"
    page = next(p for p in sorted(paged.iterdir()) if p.name.startswith("param"))
    raw = bytearray(page.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    page.write_bytes(bytes(raw))
    again = dataclasses.replace(cfg, resume=True)
    with pytest.raises(Exception, match="damaged") as e:
        train(again)
    assert "--resume-fallback" in str(e.value)
    assert (tmp_path / "run" / "checkpoints" / "6").is_dir()  # nothing removed
    # with --resume-fallback: back to checkpoint 3, then steps 4-6 again, bitwise
    resumed = train(dataclasses.replace(again, resume_fallback=True))
    assert resumed.first_step == 3
    assert resumed.losses[:3] == first.losses[3:]
    assert len(resumed.losses) == 6


def test_fuyou_options_cannot_change_on_resume(tmp_path):
    cfg = _config(tmp_path, "run", fuyou=True, steps=3, eval_every=0)
    train(dataclasses.replace(cfg, stop_at=2))
    with pytest.raises(ValueError, match="fuyou"):
        train(dataclasses.replace(cfg, fuyou=False, resume=True))
    with pytest.raises(ValueError, match="page_params"):
        train(dataclasses.replace(cfg, page_params=True, resume=True))


def test_fuyou_read_ahead_may_change_on_resume(tmp_path, monkeypatch):
    cfg = _config(tmp_path, "run", fuyou=True, steps=3, eval_every=0)
    full = train(dataclasses.replace(cfg, out_dir=tmp_path / "full"))
    train(dataclasses.replace(cfg, stop_at=2))
    budgets = _spy_read_ahead(monkeypatch)
    # how far reads run ahead is not what the step computes: the resumed run restores the
    # store with the new budget and continues bitwise
    resumed = train(dataclasses.replace(cfg, fuyou_read_ahead_mib=1, resume=True))
    assert set(budgets) == {1 << 20}
    assert resumed.first_step == 2 and resumed.losses == full.losses[2:]


def _spy_bits(monkeypatch) -> list[tuple[bool, frozenset]]:
    """Per Fuyou step the trainer builds from now on: its ``blocks_as_bits`` and the dtypes
    of the stacked block leaves of the state it is traced with."""
    import jax

    from jaxoff.strategies.fuyou import _train  # where FuyouStep builds its step

    seen, real = [], _train.make_fuyou_step

    def spy(*args, **kw):
        step = real(*args, **kw)

        def traced(state, inputs, targets):
            dtypes = frozenset(str(x.dtype) for x in jax.tree.leaves(state.params["blocks"]))
            seen.append((kw.get("blocks_as_bits", False), dtypes))
            return step(state, inputs, targets)

        return traced

    monkeypatch.setattr(_train, "make_fuyou_step", spy)
    return seen


def test_fuyou_trainer_runs_bf16_blocks_as_bits_bitwise(tmp_path, monkeypatch):
    """16-bit parameters in RAM: the trainer's Fuyou step holds the blocks as their bits and
    updates them in place (``blocks_as_bits``, the capacity record's form), bitwise the step
    given floats. Its checkpoints hold no blocks: they are the casts of the fp32 masters the
    paged part holds, and a resumed run, made from those, is bitwise an uninterrupted one; a
    checkpoint of the float step (blocks in orbax) resumes into the bits step bitwise too."""
    from jaxoff.models.gpt import CONFIGS
    from jaxoff.strategies.fuyou import _train as _fuyou_train

    bf16 = dict(fuyou=True, param_dtype="bfloat16", dtype="bfloat16")
    assert not _fuyou_train.bits_apply(CONFIGS["tiny"], False)  # float32: as they are
    bf16_tiny = dataclasses.replace(CONFIGS["tiny"], param_dtype="bfloat16")
    assert not _fuyou_train.bits_apply(bf16_tiny, True)  # paged blocks: not in the state
    seen = _spy_bits(monkeypatch)
    bits = train(_config(tmp_path, "bits", **bf16))
    assert seen == [(True, {"uint16"})]
    seen.clear()
    part = _config(tmp_path, "part", **bf16, stop_at=3)
    first = train(part)
    resumed = train(dataclasses.replace(part, stop_at=0, resume=True))
    assert seen == [(True, {"uint16"})] * 2
    seen.clear()
    monkeypatch.setattr(_fuyou_train, "bits_apply", lambda *a: False)
    floats = train(_config(tmp_path, "floats", **bf16))
    assert seen == [(False, {"bfloat16"})]

    assert len(bits.losses) == 6 and np.mean(bits.losses[-2:]) < bits.losses[0]
    assert bits.losses == floats.losses  # bitwise: float equality
    assert [r.get("val_loss") for r in bits.records] == [r.get("val_loss") for r in floats.records]
    assert resumed.first_step == 3 and first.losses + resumed.losses == bits.losses
    assert [r.get("val_loss") for r in resumed.records] == [
        r.get("val_loss") for r in bits.records[3:]
    ]
    ref = _final_params(_config(tmp_path, "floats", **bf16))
    for name in ("bits", "part"):
        got = _final_params(_config(tmp_path, name, **bf16))
        assert sorted(ref) == sorted(got)
        for k in ref:  # the masters' casts are bitwise the float run's blocks
            assert ref[k].dtype == got[k].dtype and ref[k].tobytes() == got[k].tobytes(), k
    assert {str(x.dtype) for k, x in ref.items() if k.startswith("blocks")} == {"bfloat16"}
    for name, blocks in (("bits", False), ("part", False), ("floats", True)):
        paged = tmp_path / name / "checkpoints_paged" / "6" / "paged.json"
        extra = json.loads(paged.read_text()).get("extra", {})
        assert extra == ({} if blocks else {"blocks": "masters"}), name
        meta = (tmp_path / name / "checkpoints" / "6" / "default" / "_METADATA").read_text()
        assert ("blocks" in meta) == blocks, name  # the orbax part: blocks only as floats

    # a float step's checkpoint (blocks in orbax) resumed by the bits step
    old = _config(tmp_path, "old", **bf16, stop_at=3)
    assert train(old).losses == bits.losses[:3]
    monkeypatch.undo()
    seen = _spy_bits(monkeypatch)
    later = train(dataclasses.replace(old, stop_at=0, resume=True))
    assert seen == [(True, {"uint16"})]
    assert later.losses == bits.losses[3:]

"""Checkpoint retention deletes only the step folders it wrote: a file or folder a user put
beside them in ``checkpoints_paged/`` survives a run that drops old checkpoints."""

from __future__ import annotations

from jaxoff.train import TrainConfig, train


def test_retention_keeps_what_a_user_put_beside_the_paged_checkpoints(tmp_path):
    cfg = TrainConfig(
        model="tiny",
        steps=4,
        stop_at=2,
        batch_size=2,
        seq_len=16,
        ckpt_every=1,
        keep_checkpoints=1,
        eval_every=0,
        chunk_mib=1,
        progress=False,
        compile_cache="none",
        out_dir=tmp_path / "run",
    )
    train(cfg)
    paged = tmp_path / "run" / "checkpoints_paged"
    assert sorted(p.name for p in paged.iterdir()) == ["2"]  # step 1 dropped by retention
    (paged / "notes.txt").write_text("mine")
    (paged / "mine").mkdir()
    (paged / "mine" / "data.bin").write_bytes(b"\x00" * 10)
    train(TrainConfig(**{**cfg.__dict__, "stop_at": 0, "resume": True}))
    names = sorted(p.name for p in paged.iterdir())
    assert "4" in names and "2" not in names  # retention ran
    assert (paged / "notes.txt").read_text() == "mine"
    assert (paged / "mine" / "data.bin").read_bytes() == b"\x00" * 10

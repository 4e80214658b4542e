"""The run directory stays trustworthy: checksummed checkpoints, one run at a time, a resume
that heals the working store and never loops, a full disk said in one line, plain progress
lines where stderr is not a terminal."""

import dataclasses
import errno
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxoff import ConfigError, JaxoffError
from jaxoff.train import TrainConfig, load_config_file, read_metrics, train
from jaxoff.train._checkpoint import Checkpoints, disk_full_error
from jaxoff.train._loop import _bar_stats
from jaxoff.train._metrics import trim_metrics

TIMEOUT_S = 600 * float(os.environ.get("JAXOFF_TEST_TIMEOUT_SCALE", "1"))
TINY = dict(
    model="tiny", batch_size=2, seq_len=32, eval_every=0, progress=False, keep_checkpoints=3
)


def _params(out_dir, step):
    tree = ocp.StandardCheckpointer().restore(out_dir / "checkpoints" / str(step) / "default")
    return [np.asarray(x) for x in jax.tree.leaves(tree["params"])]


def _assert_same_params(a, b, step):
    for x, y in zip(_params(a, step), _params(b, step), strict=True):
        np.testing.assert_array_equal(x, y)


def _one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


# ---------------------------------------------------------------- the paged (default) store


@pytest.fixture(scope="module")
def paged_reference(tmp_path_factory):
    """An uninterrupted 6-step run with the optimizer state paged to <out_dir>/store."""
    cfg = TrainConfig(**TINY, steps=6, ckpt_every=3, out_dir=tmp_path_factory.mktemp("ref"))
    return cfg, train(cfg)


def test_resume_rebuilds_a_damaged_store_of_a_moved_run(paged_reference, tmp_path, capfd):
    ref_cfg, ref = paged_reference
    part = dataclasses.replace(ref_cfg, out_dir=tmp_path / "a", stop_at=3)
    first = train(part)
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "a", moved)
    data = moved / "store" / "data"
    for p in data.glob("opt.0.mu.head.kernel.*.page"):  # a flipped byte in both slots
        raw = bytearray(p.read_bytes())
        raw[100] ^= 0xFF
        p.write_bytes(bytes(raw))
    for p in data.glob("opt.0.nu.head.kernel.*.page"):
        os.truncate(p, p.stat().st_size // 2)
    for p in data.glob("opt.0.mu.embed.embedding.*.page"):
        p.unlink()
    capfd.readouterr()
    resumed = train(dataclasses.replace(part, out_dir=moved, stop_at=0, resume=True))
    err = capfd.readouterr().err
    assert f"the page store {moved / 'store'} was damaged" in err
    assert "rebuilt it from checkpoint 3" in err
    assert resumed.first_step == 3
    assert first.losses + resumed.losses == ref.losses  # bitwise
    _assert_same_params(ref_cfg.out_dir, moved, 6)


def test_disk_full_in_a_step_is_one_line_and_resume_is_exact(
    paged_reference, tmp_path, monkeypatch
):
    from jaxoff.aio import PageStore, PageStoreFullError, _manifest

    ref_cfg, ref = paged_reference
    cfg = dataclasses.replace(ref_cfg, out_dir=tmp_path / "full")
    commit, calls = PageStore.commit, []

    def full_at_step_5(self, crcs=None, **kw):  # commit 1 is init's, k + 1 is step k's
        calls.append(1)
        if len(calls) != 6:
            return commit(self, crcs, **kw)

        def no_space(root, *args, **kwargs):  # the manifest's write, as a full disk fails it
            raise PageStoreFullError(
                f"no space left on the disk of {root} for its manifest; free space",
                path=root,
                needed_bytes=4096,
                errno=errno.ENOSPC,
            )

        # the store's own commit fails (and records its error, which the step's runtime
        # error is then recognised by): the pager makes it on its thread, behind step 5
        with monkeypatch.context() as inner:
            inner.setattr(_manifest, "write", no_space)
            return commit(self, crcs, **kw)

    with monkeypatch.context() as m:
        m.setattr(PageStore, "commit", full_at_step_5)
        with pytest.raises(JaxoffError) as e:
            train(cfg)
    # step 5 ran; its commit, made by the pager behind it, failed: step 6's page_begin
    # raises that before it reads or writes a page, and the loop names the step it ran
    assert _one_line(e).startswith(f"step 6: no space left on the disk of {cfg.out_dir}")
    resumed = train(dataclasses.replace(cfg, resume=True))
    assert resumed.first_step == 3
    assert [r["loss"] for r in read_metrics(cfg.out_dir / "metrics.jsonl")] == ref.losses
    _assert_same_params(ref_cfg.out_dir, cfg.out_dir, 6)


# ---------------------------------------------------------------- optimizer state in RAM


def test_checkpoint_files_are_verified_with_fallback_on_request(tmp_path, capfd, monkeypatch):
    cfg = TrainConfig(**TINY, steps=8, ckpt_every=2, store="none", out_dir=tmp_path / "r")
    first = train(dataclasses.replace(cfg, stop_at=6))
    ckpts = cfg.out_dir / "checkpoints"
    assert all((ckpts / str(s) / "checksums.json").is_file() for s in (2, 4, 6))
    target = max(
        (p for p in (ckpts / "6").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    target.write_bytes(bytes(raw))

    with pytest.raises(JaxoffError) as e:
        train(dataclasses.replace(cfg, resume=True))
    text = _one_line(e)
    assert f"checkpoint 6 in {ckpts} is damaged: {target}" in text and "--resume-fallback" in text
    assert (ckpts / "6").is_dir()  # refused: nothing removed

    capfd.readouterr()
    second = train(dataclasses.replace(cfg, resume=True, resume_fallback=True, stop_at=7))
    assert "checkpoint 6 is damaged" in capfd.readouterr().err
    assert second.first_step == 4
    assert second.losses[:2] == first.losses[4:6]  # steps 5 and 6 again, bitwise

    # a crash after orbax wrote step 7 but before its checksums: 7 never counted as saved
    (ckpts / "7" / "checksums.json").unlink()
    third = train(dataclasses.replace(cfg, resume=True))
    assert "checkpoint 7 in" in capfd.readouterr().err
    assert third.first_step == 6
    assert third.losses[0] == second.losses[2]  # step 7
    assert [r["step"] for r in read_metrics(cfg.out_dir / "metrics.jsonl")] == list(range(1, 9))

    # checkpoints with no checksums at all (all deleted, or an older jaxoff): re-admitted
    # unverified only when asked, and refused with one line (nothing changed) otherwise
    for p in ckpts.glob("*/checksums.json"):
        p.unlink()
    before = tree_bytes(cfg.out_dir)
    with pytest.raises(JaxoffError, match="have no checksums.json.*--resume-unverified"):
        train(dataclasses.replace(cfg, resume=True))
    assert tree_bytes(cfg.out_dir) == before
    done = train(dataclasses.replace(cfg, resume=True, resume_unverified=True))
    err = capfd.readouterr().err
    assert "had no checksums" in err and "is complete at step 8 of 8" in err
    assert (done.first_step, done.records) == (8, [])


def tree_bytes(root) -> dict:
    """Every file under ``root`` and its bytes, every folder (None)."""
    root = Path(root)
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


def test_full_disk_at_a_checkpoint_then_resume_from_scratch(tmp_path, capfd, monkeypatch):
    cfg = TrainConfig(**TINY, steps=4, ckpt_every=2, store="none", out_dir=tmp_path / "ref")
    logged_before_save = []
    save = Checkpoints.save

    def checking_save(self, step, state):
        logged_before_save.append(read_metrics(cfg.out_dir / "metrics.jsonl")[-1]["step"] == step)
        save(self, step, state)

    monkeypatch.setattr(Checkpoints, "save", checking_save)
    ref = train(dataclasses.replace(cfg, progress=True))
    monkeypatch.undo()
    assert logged_before_save == [True, True]  # the metrics line precedes its checkpoint
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("step ")]
    assert lines and lines[-1].startswith("step 4/4 loss ")  # stderr is not a terminal here
    assert all(" tok/s " in ln and " GiB elapsed " in ln for ln in lines), lines

    run = dataclasses.replace(cfg, out_dir=tmp_path / "run")
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, limits[1]))  # the params file is ~4 MB
    try:
        with pytest.raises(JaxoffError) as e:
            train(run)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, old)
    text = _one_line(e)
    assert text.startswith(f"checkpoint 2: cannot write {run.out_dir / 'checkpoints'}")
    assert "file size limit reached" in text and "--resume" in text

    capfd.readouterr()
    resumed = train(dataclasses.replace(run, resume=True))  # no checkpoint yet: from step 0
    assert "starting from step 0" in capfd.readouterr().err
    assert resumed.first_step == 0 and resumed.losses == ref.losses

    done = train(dataclasses.replace(run, resume=True))
    assert f"the run in {run.out_dir} is complete at step 4 of 4" in capfd.readouterr().err
    assert (done.first_step, done.last_step, done.records) == (4, 4, [])


def test_a_live_run_is_never_touched(tmp_path):
    cfg = TrainConfig(**TINY, steps=4, ckpt_every=2, store="none", out_dir=tmp_path / "r")
    cfg.out_dir.mkdir()
    files = {
        "config.json": json.dumps(cfg.to_json()),
        "metrics.jsonl": '{"step": 1, "loss": 5.0}\n',
        "checkpoints/2/checksums.json": "{}",
    }
    for name, text in files.items():
        (cfg.out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (cfg.out_dir / name).write_text(text)
    code = (
        "import sys, time\n"
        "from jaxoff.train._rundir import RunLock\n"
        "lock = RunLock(sys.argv[1])\n"
        "print('locked', flush=True)\n"
        "time.sleep(3600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(cfg.out_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([child.stdout], [], [], TIMEOUT_S)
        assert ready and child.stdout.readline().strip() == "locked"
        for variant in (
            cfg,
            dataclasses.replace(cfg, resume=True),
            dataclasses.replace(cfg, overwrite=True),
        ):
            with pytest.raises(ConfigError) as e:
                train(variant)
            assert f"--out-dir {cfg.out_dir} is in use" in _one_line(e)
            assert f"pid {child.pid}" in str(e.value)
    finally:
        child.kill()
        child.wait(TIMEOUT_S)
    for name, text in files.items():
        assert (cfg.out_dir / name).read_text() == text


# ---------------------------------------------------------------- checks that need no run


def test_a_store_that_cannot_be_a_directory_is_refused_up_front(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=f"--store {a_file} is a file, not a directory"):
        TrainConfig(**TINY, store=str(a_file), out_dir=tmp_path / "r").validate()
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    try:
        with pytest.raises(ConfigError, match=f"--store {ro / 's'} is not writable"):
            TrainConfig(**TINY, store=str(ro / "s"), out_dir=tmp_path / "r").validate()
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@pytest.mark.parametrize(
    "line, message",
    [
        ('steps = "ten"', "steps must be an integer, got 'ten' (str)"),
        ('lr = "x"', "lr must be a number, got 'x' (str)"),
        ("progress = 1", "progress must be true or false, got 1 (int)"),
        ('optimizer = "adamx"', "optimizer must be one of 'adamw', 'adam'"),
        ("data = 3", "data must be a path string, got 3 (int)"),
        ("stepz = 3", "unknown keys ['stepz']"),
    ],
)
def test_toml_values_of_the_wrong_type_are_named(tmp_path, line, message):
    path = tmp_path / "c.toml"
    path.write_text(f"[train]\n{line}\n")
    with pytest.raises(ConfigError) as e:
        load_config_file(path)
    assert _one_line(e).startswith(f"--config {path}: ") and message in str(e.value)


def test_a_torn_last_metrics_line_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    trim_metrics(path, 5)
    assert path.read_text() == '{"loss": 2.0, "step": 1}\n{"loss": 1.5, "step": 2}\n'
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(JaxoffError, match="line 2 is not JSON"):
        read_metrics(path)


def test_progress_shows_disk_rates_in_mb_per_s():
    record = {
        "loss": 3.4123,
        "tokens_per_s": 12345.6,
        "rss_gib": 1.234,
        "disk_read_mbps": 120.4,
        "disk_write_mbps": 80.2,
    }
    stats = _bar_stats(record, [record])
    assert stats == {
        "loss": "3.412",
        "tok/s": "12,346",
        "disk r/w": "120/80 MB/s",
        "rss": "1.23 GiB",
    }


def test_disk_full_errors_are_recognised(tmp_path):
    from jaxoff.aio import PageStoreFullError

    step_dir = tmp_path / "checkpoints" / "5"
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert "no space left on the disk" in str(disk_full_error(enospc, 5, step_dir))
    assert str(step_dir) in str(disk_full_error(enospc, 5, step_dir))
    store = PageStoreFullError("x", path="/s/p", needed_bytes=1, errno=errno.EDQUOT)
    assert "cannot write /s/p (disk quota exceeded)" in str(disk_full_error(store, 5, step_dir))
    orbax = ValueError(
        'OUT_OF_RANGE: Error writing "w/0": Failed writing: "/c/5/d/0f": Failed to write '
        "2827989 bytes to file 7: No space left on device [os_error_code='28']"
    )
    assert "cannot write /c/5/d/0f (no space left" in str(disk_full_error(orbax, 5, step_dir))
    assert disk_full_error(ValueError("bad shape"), 5, step_dir) is None
    assert disk_full_error(OSError(errno.EIO, "I/O error"), 5, step_dir) is None


def test_a_torn_last_metrics_line_is_said_with_its_step(tmp_path, capfd):
    """Issue 46: a torn last line is dropped on resume, and said: whose step it was, and
    whether that step is trained again or (checkpointed) its line is lost."""
    from jaxoff.train._resume import warn_torn_metrics

    path = tmp_path / "metrics.jsonl"
    good = "".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in range(1, 13))
    path.write_text(good)
    warn_torn_metrics(path, 12)
    assert capfd.readouterr().err == ""  # whole: nothing to say
    path.write_text(good + '{"step": 13, "loss": 2.')
    warn_torn_metrics(path, 12)
    assert "step 13's, torn by the stop" in capfd.readouterr().err
    path.write_text(good[:-5])  # step 12's line cut, and step 12 is checkpointed
    warn_torn_metrics(path, 12)
    err = capfd.readouterr().err
    assert "step 12's, torn" in err and "its metrics line is lost" in err

import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxoff.train import Batches, TrainConfig, init_state, load_corpus, make_train_step, train


def test_batches_are_deterministic_and_shifted():
    tokens = load_corpus()
    b = Batches(tokens, batch_size=3, seq_len=16, seed=7)
    x1, y1 = b(5)
    x2, y2 = b(5)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(x1[:, 1:], y1[:, :-1])  # targets are inputs shifted by one
    assert not np.array_equal(b(6)[0], x1)
    assert x1.dtype == np.int32 and x1.shape == (3, 16)


def test_default_corpus_is_python_source():
    tokens = load_corpus(max_bytes=1 << 20)
    text = tokens.tobytes()
    assert b"def " in text and b"import " in text
    assert tokens.size == 1 << 20


def test_data_from_a_text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"hello world. " * 200)
    tokens = load_corpus(path)
    assert tokens.tobytes().startswith(b"hello world. hello")


def test_a_folder_is_read_in_path_order_without_site_packages(tmp_path):
    root = tmp_path / "corpus"
    files = {
        "b.txt": b"second " * 100,
        "a/z.md": b"first " * 100,
        "a/skip.bin": b"binary " * 100,
        "lib/site-packages/pkg/mod.py": b"installed " * 100,
        "c.py": b"third " * 100,
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "d").symlink_to(root / "a", target_is_directory=True)  # not entered, as by rglob
    text = load_corpus(root).tobytes()
    want = b"\0".join(files[n] for n in ("a/z.md", "b.txt", "c.py")) + b"\0"
    assert text == want


def test_tiny_run_loss_falls(tiny_train_args):
    result = train(TrainConfig(**{**tiny_train_args, "steps": 40, "lr": 3e-3}))
    losses = result.losses
    assert len(losses) == 40
    assert np.mean(losses[-5:]) < losses[0] - 1.0  # ~5.5 -> ~3.5 on byte-level Python


def test_metrics_log_records_required_fields(tiny_train_args):
    cfg = TrainConfig(**{**tiny_train_args, "eval_every": 6})
    train(cfg)
    records = [
        json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == list(range(1, 13))
    for key in ("loss", "tokens_per_s", "step_time_s", "peak_rss_gib", "rss_gib"):
        assert all(r[key] > 0 for r in records), key
    assert "compile_s" in records[0]
    assert [r["step"] for r in records if "val_loss" in r] == [6, 12]


def test_resume_is_bitwise_exact(tiny_train_args, tmp_path):
    common = {**tiny_train_args, "steps": 16, "ckpt_every": 5}
    full = train(TrainConfig(**{**common, "out_dir": tmp_path / "full"}))
    part = TrainConfig(**{**common, "out_dir": tmp_path / "part", "stop_at": 11})
    first = train(part)
    assert first.last_step == 11
    resumed = train(dataclasses.replace(part, stop_at=0, resume=True))
    assert resumed.first_step == 11  # the stop checkpointed its last step
    assert first.losses + resumed.losses == full.losses  # bitwise: float equality


def test_resume_after_crash_replays_from_last_checkpoint(tiny_train_args, tmp_path):
    """A run killed after step 8 (checkpoint at 5) resumes at 5 and logs each step once."""
    common = {**tiny_train_args, "steps": 10, "ckpt_every": 5, "out_dir": tmp_path / "r"}
    full = train(TrainConfig(**{**common, "out_dir": tmp_path / "full"}))
    train(TrainConfig(**{**common, "stop_at": 5}))
    # Simulate the crash: the log has steps 6..8 written after the last checkpoint.
    log = tmp_path / "r" / "metrics.jsonl"
    with open(log, "a") as f:
        for step in (6, 7, 8):
            f.write(json.dumps({"step": step, "loss": -1.0}) + "\n")
    train(TrainConfig(**{**common, "resume": True}))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 11))
    assert [r["loss"] for r in records] == full.losses


def test_resume_refuses_changed_options(tiny_train_args):
    cfg = TrainConfig(**{**tiny_train_args, "steps": 4, "ckpt_every": 2})
    train(cfg)
    with pytest.raises(ValueError, match="lr"):
        train(dataclasses.replace(cfg, lr=1e-2, resume=True))


def test_existing_run_is_not_overwritten_silently(tiny_train_args):
    cfg = TrainConfig(**{**tiny_train_args, "steps": 2})
    train(cfg)
    with pytest.raises(ValueError, match="--resume"):
        train(cfg)
    assert len(train(dataclasses.replace(cfg, overwrite=True)).losses) == 2


def test_no_recompilation_on_step_two(tmp_path):
    # its own out_dir: the default (runs/default) may hold the user's run and its store
    cfg = TrainConfig(model="tiny", batch_size=2, seq_len=16, out_dir=tmp_path / "run")
    tx = cfg.build_optimizer()
    graphdef, state = init_state(cfg.model_config(), tx, 0)
    step = jax.jit(make_train_step(graphdef, tx), donate_argnums=0)
    batch = Batches(load_corpus(max_bytes=1 << 16), 2, 16, 0)
    compiles = []
    listener = lambda event, *a, **k: compiles.append(event) if "backend_compile" in event else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        state, _ = step(state, *batch(0))
        first = len(compiles)
        for i in range(1, 4):
            state, m = step(state, *batch(i))
        jax.block_until_ready(m)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert first >= 1
    assert len(compiles) == first


@pytest.mark.parametrize("steps", [1, 2, 31])
def test_schedule_of_a_short_run_warms_up_and_decays(steps, tmp_path):
    from jaxoff.train import TrainConfig

    cfg = TrainConfig(steps=steps, warmup_steps=30, lr=1e-3, out_dir=tmp_path / "run")
    sched = cfg.schedule()
    lrs = [float(sched(t)) for t in range(steps + 1)]
    assert lrs[0] == 0.0 and all(np.isfinite(lrs))
    assert max(lrs) == pytest.approx(1e-3) if steps > 1 else lrs[1] == pytest.approx(1e-3)
    cfg.build_optimizer()  # --steps 1 used to fail: "requires positive decay_steps"


def test_compile_cache_option_resolves_and_bad_values_are_refused(tiny_train_args, tmp_path):
    from jaxoff._errors import ConfigError
    from jaxoff.train._loop import use_compile_cache

    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        auto = TrainConfig(**tiny_train_args)
        assert use_compile_cache(auto) == str((tmp_path / "run" / "compile-cache").absolute())
        assert jax.config.jax_compilation_cache_dir == use_compile_cache(auto)
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
        assert use_compile_cache(auto) == str(tmp_path / "mine")  # auto keeps a configured one
        none = TrainConfig(**tiny_train_args, compile_cache="none")
        assert use_compile_cache(none) == str(tmp_path / "mine")
        given = TrainConfig(**tiny_train_args, compile_cache=str(tmp_path / "cc"))
        assert use_compile_cache(given) == str(tmp_path / "cc")
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    with pytest.raises(ConfigError, match="--compile-cache is empty"):
        TrainConfig(**tiny_train_args, compile_cache=" ").validate()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="--compile-cache .*a-file is a file"):
        TrainConfig(**tiny_train_args, compile_cache=str(tmp_path / "a-file")).validate()


def test_each_run_of_a_process_compiles_into_its_own_cache(tiny_train_args, tmp_path):
    """Two runs in one process, neither with a cache configured outside jaxoff: the second
    run's programs go to its own <out-dir>/compile-cache, not the first run's (deleted here,
    as a benchmark deletes its temporary runs), and ``none`` turns the cache an earlier run
    set off again; a directory configured outside jaxoff is never replaced."""
    import shutil

    from jax.experimental.compilation_cache import compilation_cache

    from jaxoff.train._loop import use_compile_cache

    before = jax.config.jax_compilation_cache_dir
    limits = {  # every compilation is cached, however small
        k: getattr(jax.config, k)
        for k in (
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    runs = [TrainConfig(**{**tiny_train_args, "out_dir": str(tmp_path / name)}) for name in "ab"]
    try:
        for k in limits:
            jax.config.update(k, 0)
        jax.config.update("jax_compilation_cache_dir", None)
        compilation_cache.reset_cache()
        first = use_compile_cache(runs[0])
        assert first == str((tmp_path / "a" / "compile-cache").absolute())
        jax.jit(lambda x: x * 3 + 1)(np.ones(7))  # JAX fixes its cache now
        shutil.rmtree(tmp_path / "a")
        second = use_compile_cache(runs[1])
        assert second == str((tmp_path / "b" / "compile-cache").absolute())
        jax.jit(lambda x: x * 5 - 2)(np.ones(9)).block_until_ready()
        written = list((tmp_path / "b" / "compile-cache").iterdir())
        assert any(p.name.startswith("jit_") for p in written), written
        assert not (tmp_path / "a").exists()
        none = TrainConfig(**{**tiny_train_args, "compile_cache": "none"})
        assert use_compile_cache(none) is None
        assert jax.config.jax_compilation_cache_dir is None
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
        assert use_compile_cache(runs[0]) == str(tmp_path / "mine")
        assert use_compile_cache(none) == str(tmp_path / "mine")
    finally:
        for k, v in limits.items():
            jax.config.update(k, v)
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()


@pytest.mark.subprocess
def test_a_resumed_run_loads_its_paged_step_from_the_run_compile_cache(tmp_path):
    """Without JAX_COMPILATION_CACHE_DIR, `jaxoff train` keeps compiled programs in
    <out-dir>/compile-cache; the resumed process takes its paged step from there."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["JAX_LOG_COMPILES"] = "1"
    run = tmp_path / "run"
    opts = ["--model", "tiny", "--batch-size", "2", "--seq-len", "32", "--steps", "4"]
    opts += ["--ckpt-every", "2", "--eval-every", "0", "--store", "auto", "--no-progress"]
    logs = []
    for extra in (["--stop-at", "2"], ["--resume"]):
        out = subprocess.run(
            [sys.executable, "-m", "jaxoff", "train", *opts, "--out-dir", str(run), *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        logs.append(out.stderr)
    assert any(p.name.startswith("jit_train_step") for p in (run / "compile-cache").iterdir())
    hit = "Persistent compilation cache hit for 'jit_train_step'"
    assert hit not in logs[0] and hit in logs[1]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s] == [1, 2, 3, 4]

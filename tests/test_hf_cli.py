"""``jaxoff train --init-from DIR`` and ``jaxoff export``: a Hugging Face checkpoint
fine-tuned by the trainer (in RAM, with the paged optimizer, with Fuyou's paged parameters)
and written back as a Hugging Face folder.

The first step's loss is the loss of ``from_pretrained``'s model on the same batch (whose
logits match transformers', ``test_hf_logits.py``); an export read back with
``from_pretrained`` is bitwise the run's final parameters (float32); every refusal is one line
and writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _hf import TOL, copy, tree
from flax import nnx
from test_train_fuyou import _final_params

from jaxoff import JaxoffError, cli
from jaxoff.models import from_pretrained
from jaxoff.optim.chunks import path_name
from jaxoff.step import cross_entropy
from jaxoff.train import TrainConfig, train
from jaxoff.train._data import data_batches
from jaxoff.train._options import flat_options

COMMON = dict(
    batch_size=2,
    seq_len=16,
    steps=4,
    lr=1e-3,
    warmup_steps=1,
    clip_norm=0.0,  # Fuyou's step updates each layer before the global norm exists
    eval_every=0,
    ckpt_every=2,
    chunk_mib=1,
    progress=False,
)
FUYOU = dict(strategy="fuyou", page_params=True)


def _data(tmp_path: Path, name: str) -> Path:
    """Text for a fixture with a tokenizer (gpt2: its tokenizer.json encodes it), else a
    token file within the fixture's vocabulary (96 ids)."""
    if name == "gpt2":
        path = tmp_path / "text.txt"
        path.write_text((Path(__file__).read_text() + "\n") * 4)
        return path
    path = tmp_path / "tokens.npy"
    np.save(path, np.random.default_rng(0).integers(0, 96, 8192).astype(np.uint16))
    return path


def _config(tmp_path, name, run="run", **over) -> TrainConfig:
    folder = tmp_path / name
    if not folder.exists():
        copy(name, tmp_path)
    options = {**COMMON, "init_from": folder, "data": _data(tmp_path, name)}
    return TrainConfig(**{**options, "out_dir": tmp_path / run, **over})


def _first_batch_loss(cfg: TrainConfig) -> float:
    """The loss of ``from_pretrained``'s model on the run's first batch."""
    cfg = cfg.validate()
    batches, _ = data_batches(cfg.data_options, cfg.seed, cfg.model_config().vocab_size, "m")
    inputs, targets = batches(0)
    model = from_pretrained(cfg.init_from)
    return float(cross_entropy(model(jnp.asarray(inputs)), jnp.asarray(targets)))


def _exported(folder: Path) -> dict[str, np.ndarray]:
    """``{path_name: array}`` of the parameters ``from_pretrained`` reads from ``folder``."""
    state = nnx.state(from_pretrained(folder), nnx.Param)
    return {path_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}


def _orbax_final(cfg: TrainConfig) -> dict[str, np.ndarray]:
    """``{path_name: array}`` of the parameters of the run's last orbax checkpoint (a run
    that keeps its parameters in its state)."""
    import orbax.checkpoint as ocp

    saved = ocp.StandardCheckpointer().restore(
        (cfg.out_dir / "checkpoints" / str(cfg.steps) / "default").absolute()
    )
    flat = jax.tree_util.tree_flatten_with_path(saved["params"])[0]
    return {path_name(p): np.asarray(x) for p, x in flat}


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("name", ["llama", "gpt2", "mistral"])
def test_the_first_loss_is_the_pretrained_models(tmp_path, name):
    """In RAM and with Fuyou's paged parameters (blocks streamed into the store layer by
    layer): the checkpoint's loss on the first batch. Mistral's window (6) is shorter than
    --seq-len (16): the model masks it."""
    want = _first_batch_loss(_config(tmp_path, name))
    plain = train(_config(tmp_path, name, "plain", store="none", steps=1))
    fuyou = train(_config(tmp_path, name, "fuyou", steps=1, **FUYOU))
    assert abs(plain.losses[0] - want) <= TOL * max(1.0, abs(want))
    assert fuyou.losses[0] == plain.losses[0]


def test_a_fuyou_page_params_run_resumes_bitwise_and_exports_its_parameters(tmp_path):
    full_cfg = _config(tmp_path, "llama", "full", **FUYOU)
    full = train(full_cfg)
    part = _config(tmp_path, "llama", "part", stop_at=2, **FUYOU)
    train(part)
    rest = train(_config(tmp_path, "llama", "part", resume=True, **FUYOU))
    assert rest.first_step == 2
    assert rest.losses == full.losses[2:]  # bitwise
    saved = flat_options(json.loads((tmp_path / "full" / "config.json").read_text()))
    assert saved["init_from"] == str((tmp_path / "llama").absolute())
    assert saved["model"] == "hf:llama"

    for run in ("full", "part"):
        out = tmp_path / f"hf-{run}"
        assert cli.main(["export", "--run", str(tmp_path / run), "--out", str(out)]) == 0
    final = _final_params(full_cfg.validate())
    _assert_same(_exported(tmp_path / "hf-full"), final)
    _assert_same(_exported(tmp_path / "hf-part"), final)
    # the trained model, not the checkpoint it started from
    start = _exported(tmp_path / "llama")
    assert any(not np.array_equal(start[k], final[k]) for k in final)
    written = json.loads((tmp_path / "hf-full" / "config.json").read_text())
    assert (written["model_type"], written["bos_token_id"]) == ("llama", 1)


@pytest.mark.parametrize("store", ["none", "auto"])
def test_an_in_ram_or_paged_optimizer_run_exports_its_parameters(tmp_path, store):
    cfg = _config(tmp_path, "gpt2", store=store, steps=2)
    train(cfg)
    out = tmp_path / "hf"
    assert cli.main(["export", "--run", str(cfg.out_dir), "--out", str(out)]) == 0
    _assert_same(_exported(out), _orbax_final(cfg))
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "gpt2/tokenizer.json").read_bytes()
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"


def test_an_fsdp_run_starts_from_the_checkpoint_and_exports_its_parameters(tmp_path):
    """``--fsdp 2`` with the paged optimizer (each process pages its own blocks): the
    parameters start from the checkpoint (the first loss is ``from_pretrained``'s on the same
    batch), and the export is bitwise the run's final parameters."""
    want = _first_batch_loss(_config(tmp_path, "llama"))
    cfg = _config(tmp_path, "llama", "fsdp", fsdp=2, steps=2)
    run = train(cfg)
    assert abs(run.losses[0] - want) <= TOL * max(1.0, abs(want))
    out = tmp_path / "hf"
    assert cli.main(["export", "--run", str(cfg.out_dir), "--out", str(out)]) == 0
    final = _orbax_final(cfg)
    _assert_same(_exported(out), final)
    start = _exported(tmp_path / "llama")
    assert any(not np.array_equal(start[k], final[k]) for k in final)  # trained


def test_a_bfloat16_export_of_a_paged_run_is_its_parameters_rounded_once(tmp_path):
    """``jaxoff export --dtype bfloat16`` of a Fuyou ``--page-params`` run: every tensor is
    the run's float32 parameter rounded to bfloat16 (read back as float32), stored as
    bfloat16 safetensors."""
    import ml_dtypes

    cfg = _config(tmp_path, "llama", steps=2, **FUYOU)
    train(cfg)
    out = tmp_path / "hf"
    args = ["export", "--run", str(cfg.out_dir), "--out", str(out), "--dtype", "bfloat16"]
    assert cli.main(args) == 0
    final = _final_params(cfg.validate())
    want = {k: x.astype(ml_dtypes.bfloat16).astype(np.float32) for k, x in final.items()}
    assert any(not np.array_equal(want[k], final[k]) for k in final)  # rounding happened
    _assert_same(_exported(out), want)
    written = json.loads((out / "config.json").read_text())
    assert written["torch_dtype"] == "bfloat16"
    header = _safetensors_dtypes(out)
    assert header and set(header) == {"BF16"}, header


def _safetensors_dtypes(folder: Path) -> list[str]:
    """The dtype of every tensor in ``folder``'s safetensors files (their JSON headers)."""
    import struct

    dtypes = []
    for shard in sorted(folder.glob("*.safetensors")):
        with open(shard, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        dtypes += [v["dtype"] for k, v in header.items() if k != "__metadata__"]
    return dtypes


def test_a_store_kept_checkpoint_exports_its_parameters(tmp_path):
    """``--paged-checkpoint store``: the last checkpoint records the store's version by its
    checksums instead of copying it; the export reads the blocks from the store (verified)
    and is bitwise the run's final parameters."""
    cfg = _config(tmp_path, "llama", steps=2, ckpt_every=0, paged_checkpoint="store", **FUYOU)
    train(cfg)
    assert not list((cfg.out_dir / "checkpoints_paged" / "2").glob("*.page"))  # not copied
    out = tmp_path / "hf"
    assert cli.main(["export", "--run", str(cfg.out_dir), "--out", str(out)]) == 0
    # the run's last parameters: its orbax part, and the blocks from the store itself
    _assert_same(_exported(out), _final_params(cfg.validate()))


def test_the_command_line_uses_the_folders_tokenizer(tmp_path, capsys):
    folder = copy("gpt2", tmp_path)
    text = _data(tmp_path, "gpt2")
    args = ["train", "--init-from", str(folder), "--data", str(text), "--seq-len", "16"]
    args += ["--batch-size", "2", "--steps", "2", "--eval-every", "0", "--clip-norm", "0"]
    args += ["--strategy", "fuyou", "--page-params", "--no-progress"]
    assert cli.main([*args, "--out-dir", str(tmp_path / "run")]) == 0
    saved = flat_options(json.loads((tmp_path / "run" / "config.json").read_text()))
    assert saved["tokenizer"] == str(folder / "tokenizer.json")
    assert "jaxoff export --run" in capsys.readouterr().out  # the way back, in the summary


def test_a_jaxoff_llama_run_exports_as_llama(tmp_path):
    """A run of jaxoff's own Llama config (no --init-from) exports as model_type llama."""
    cfg = TrainConfig(
        **{**COMMON, "model": "llama-tiny", "store": "none", "steps": 1, "seq_len": 16},
        out_dir=tmp_path / "run",
    )
    train(cfg)
    assert cli.main(["export", "--run", str(cfg.out_dir), "--out", str(tmp_path / "hf")]) == 0
    _assert_same(_exported(tmp_path / "hf"), _orbax_final(cfg))
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"


# --- refusals: one line, nothing written ------------------------------------------------


def _bad_folder(tmp_path: Path) -> Path:
    folder = copy("llama", tmp_path)
    hf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf, "model_type": "bert"}))
    return folder


TRAIN_REFUSALS = {
    "missing folder": (lambda t: dict(init_from=t / "nowhere"), "config.json does not exist"),
    "invalid folder": (lambda t: dict(init_from=_bad_folder(t)), "model_type='bert'"),
    "longer than its positions": (lambda t: dict(seq_len=65), "exceeds the 64 positions"),
    "another --model": (lambda t: dict(model="llama-tiny"), "both name the model"),
    "--positions": (lambda t: dict(positions="rotary"), "leave --positions out"),
    "a larger vocabulary": (lambda t: dict(data=None), "vocab_size 96"),
}


@pytest.mark.parametrize("case", sorted(TRAIN_REFUSALS))
def test_train_refusals_write_nothing(tmp_path, case, capsys):
    over, match = TRAIN_REFUSALS[case]
    cfg = _config(tmp_path, "llama", **over(tmp_path))
    before = tree(tmp_path)
    args = ["train", "--no-progress", "--out-dir", str(cfg.out_dir), "--seq-len", str(cfg.seq_len)]
    args += ["--init-from", str(cfg.init_from)]
    if cfg.data is not None:
        args += ["--data", str(cfg.data)]
    if cfg.model != "mini":
        args += ["--model", cfg.model]
    if cfg.positions is not None:
        args += ["--positions", cfg.positions]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1, err
    assert tree(tmp_path) == before
    with pytest.raises(JaxoffError, match=match.replace("(", r"\(")):
        train(cfg)
    assert tree(tmp_path) == before


def test_a_resume_needs_the_same_init_from(tmp_path, capsys):
    cfg = _config(tmp_path, "llama", store="none", steps=1)
    train(cfg)
    before = tree(tmp_path)
    args = ["train", "--resume", "--out-dir", str(cfg.out_dir), "--seq-len", "16"]
    args += ["--data", str(cfg.data), "--steps", "1", "--no-progress", "--store", "none"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "options differ" in err and "init_from" in err
    # every file as it was (validation's write probe touches the run folder's mtime)
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if k != "run"} == {
        k: v for k, v in before.items() if k != "run"
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run of the llama fixture (in RAM, one checkpoint at step 2)."""
    tmp_path = tmp_path_factory.mktemp("trained")
    cfg = _config(tmp_path, "llama", store="none", steps=2)
    train(cfg)
    return cfg.out_dir


def _not_empty(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    return tmp_path / "full"


EXPORT_REFUSALS = {
    "non-empty --out": (lambda t, run: ["--run", run, "--out", _not_empty(t)], "not an empty"),
    "no run": (lambda t, run: ["--run", t, "--out", t / "hf"], "holds no jaxoff run"),
    "no --step": (lambda t, run: ["--run", run, "--out", t / "hf", "--step", "1"], "steps 2"),
    "no --out": (lambda t, run: ["--run", run], "needs --run RUN_DIR and --out"),
}


@pytest.mark.parametrize("case", sorted(EXPORT_REFUSALS))
def test_export_refusals_write_nothing(tmp_path, trained, case, capsys):
    args, match = EXPORT_REFUSALS[case]
    args = [str(a) for a in args(tmp_path, trained)]
    before, run_before = tree(tmp_path), tree(trained)
    assert cli.main(["export", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1, err
    assert tree(tmp_path) == before and tree(trained) == run_before


def test_export_refuses_a_damaged_paged_checkpoint(tmp_path, capsys):
    cfg = _config(tmp_path, "llama", steps=2, **FUYOU)
    train(cfg)
    page = next((cfg.out_dir / "checkpoints_paged" / "2").glob("param.blocks.mlp.up.kernel_1.page"))
    raw = bytearray(page.read_bytes())
    raw[5] ^= 1
    page.write_bytes(bytes(raw))
    # paged.json's own checksum still holds: the chunk's crc32c finds the flipped bit
    assert cli.main(["export", "--run", str(cfg.out_dir), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "fails its checksum" in err and "mlp.up.kernel@1" in err
    assert not (tmp_path / "hf").exists()
    assert not list(tmp_path.glob(".hf.partial-*"))

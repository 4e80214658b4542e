"""``jaxoff export``: a training run's checkpoint as a Hugging Face checkpoint folder,
written one layer at a time (``jaxoff.models.hf.export_pretrained`` over `RunSource`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

from jaxoff.models.gpt import GPTConfig
from jaxoff.models.llama import LlamaConfig

from .._errors import ConfigError
from ._checkpoint import complete_steps
from ._config import TrainConfig
from ._options import flat_options
from ._run_source import RunSource

# config.json keys of the --init-from folder an export carries over: the tokenizer's, which
# are not the model's shape
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """Every option of ``jaxoff export``.

    Attributes:
        run: the run directory (``jaxoff train --out-dir``) whose checkpoint is exported.
        out: the Hugging Face folder to write (new, or empty); transformers'
            ``from_pretrained`` and ``jaxoff.models.from_pretrained`` read it.
        dtype: the tensors' dtype: float32 (the trained values exactly) or bfloat16.
        step: the checkpoint to export; default: the run's last.
    """

    run: Path | None = None
    out: Path | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"
    step: int | None = None

    def validate(self) -> ExportConfig:
        """Refuses, in one line and before anything is written: no --run or --out, a run
        directory without a run or without a checkpoint (or without --step), an --out that
        is not new or empty."""
        if self.run is None or self.out is None:
            raise ConfigError("jaxoff export needs --run RUN_DIR and --out HF_DIR")
        run = Path(self.run)
        if not (run / "config.json").is_file():
            raise ConfigError(
                f"--run {run} holds no jaxoff run (no config.json): name a jaxoff train --out-dir"
            )
        out = Path(self.out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError(
                f"--out {out} exists and is not an empty folder: export into a new folder "
                f"(jaxoff never overwrites a checkpoint)"
            )
        if not out.absolute().parent.is_dir():
            raise ConfigError(f"--out {out}: its folder {out.absolute().parent} does not exist")
        self.checkpoint_step()
        return self

    def checkpoint_step(self) -> int:
        """The step exported: --step, or the run's last complete checkpoint."""
        assert self.run is not None
        steps = complete_steps(Path(self.run) / "checkpoints")
        if not steps:
            raise ConfigError(
                f"--run {self.run} has no complete checkpoint yet: train it (a run saves one "
                f"at its end), then export"
            )
        if self.step is None:
            return steps[-1]
        if self.step not in steps:
            raise ConfigError(
                f"--step {self.step}: the run in {self.run} has checkpoints at steps "
                f"{', '.join(map(str, steps))}; choose one of them"
            )
        return self.step


def run_config(run: Path):
    """The ``TrainConfig`` a run was trained with (its ``config.json``)."""

    saved = json.loads((Path(run) / "config.json").read_text())
    return TrainConfig(**flat_options(saved, extra=()))


def _model_config(train_cfg):
    """The run's model config, refused unless it has a Hugging Face counterpart."""

    try:
        model = train_cfg.model_config()
    except ConfigError as e:
        raise ConfigError(
            f"the run's model {train_cfg.model_label()} cannot be made again ({e}); jaxoff "
            f"export needs a run of a size name, a package.module:factory or --init-from"
        ) from None
    if not isinstance(model, LlamaConfig | GPTConfig):
        raise ConfigError(
            f"the run's model {train_cfg.model_label()} is a {type(model).__name__}: jaxoff "
            f"exports Llama-family and GPT models (jaxoff.models), the architectures Hugging "
            f"Face's llama, mistral, qwen2, qwen3 and gpt2 hold"
        )
    return model


def export_run(config: ExportConfig) -> Path:
    """Writes checkpoint ``config.step`` (default: the last) of the run ``config.run`` as a
    Hugging Face folder ``config.out``, one layer at a time, with the tokenizer files and
    the model type of the run's ``--init-from`` folder; returns the folder.

    Example:
        >>> export_run(ExportConfig(run=run_dir, out=tmp_path / "hf"))  # doctest: +SKIP
    """
    from jaxoff.models.hf import export_pretrained  # pyright: ignore[reportMissingImports] (export only)

    config = config.validate()
    assert config.run is not None and config.out is not None
    train_cfg = run_config(config.run)
    model = _model_config(train_cfg)
    step = config.checkpoint_step()
    model_type, extra, tokenizer_dir = None, {}, None
    if train_cfg.init_from is not None:
        folder = Path(train_cfg.init_from)
        hf = json.loads((folder / "config.json").read_text())
        model_type = hf.get("model_type")
        extra = {k: hf[k] for k in TOKEN_KEYS if hf.get(k) is not None}
        tokenizer_dir = folder
    page_params = train_cfg.page_params and train_cfg.strategy == "fuyou"
    with RunSource(Path(config.run), step, model, page_params) as source:
        out = export_pretrained(
            source,
            config.out,
            dtype=config.dtype,
            model_type=model_type,
            tokenizer_dir=tokenizer_dir,
            extra_config=extra or None,
        )
    print(
        f"jaxoff export: step {step} of {train_cfg.model_label()} written to {out} ({config.dtype})"
    )
    return out

"""Fine-tune a Hugging Face checkpoint with Fuyou's paged parameters, then write it back as
a Hugging Face folder: ``jaxoff train --init-from DIR --strategy fuyou --page-params`` and
``jaxoff export``, from Python.

The checkpoint's blocks go into the page store one layer at a time (its model is never whole
in RAM); the export reads them back one layer at a time. A folder with a ``tokenizer.json``
trains on text (this file's own source here; pass yours as ``--data`` to the CLI); one
without trains on random token ids within its vocabulary.

python examples/finetune_pretrained.py [HF_DIR [OUT_DIR]]   # default: tests/fixtures/hf/llama
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

from jaxoff.models import from_pretrained
from jaxoff.train import ExportConfig, TrainConfig, export_run, train

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf" / "llama"


def main(folder=FIXTURE, out_dir=None, steps: int = 4):
    folder = Path(folder)
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="finetune-"))
    if (folder / "tokenizer.json").is_file():  # text, encoded by the folder's tokenizer
        data = Path(__file__)
    else:
        vocab = from_pretrained(folder).cfg.vocab_size
        data = out_dir / "tokens.npy"
        np.save(data, np.random.default_rng(0).integers(0, vocab, 1 << 14).astype(np.uint32))
    result = train(
        TrainConfig(
            init_from=folder,
            strategy="fuyou",
            page_params=True,  # the blocks live in the page store, read layer by layer
            clip_norm=0.0,  # each layer is updated before a global gradient norm exists
            data=data,
            seq_len=16,
            batch_size=2,
            steps=steps,
            lr=1e-4,
            warmup_steps=1,
            eval_every=0,
            progress=False,
            out_dir=out_dir / "run",
        )
    )
    exported = export_run(ExportConfig(run=out_dir / "run", out=out_dir / "hf"))
    model = from_pretrained(exported)  # or transformers' AutoModelForCausalLM.from_pretrained
    print(f"losses {[round(x, 4) for x in result.losses]}; {model.cfg.name} from {exported}")
    return result.losses, exported


if __name__ == "__main__":
    main(*sys.argv[1:3])

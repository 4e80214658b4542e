"""Peak RSS and time of a Llama-2-7B-shaped Hugging Face checkpoint going into a Fuyou
``--page-params`` page store (the code path of ``jaxoff train --init-from``) and out again
(``jaxoff export``), each in a child process of its own.

    python bench/hf_load.py --layers 4            # a 4-layer cut of the 7B shapes
    python bench/hf_load.py                       # the 32 layers: ~13.5 GB checkpoint
    python bench/hf_load.py --optimizer lion      # the same, 54 GB of store instead of 80

Writes a synthetic checkpoint with Llama-2-7b's ``config.json`` shapes (hidden 4096, 32 heads,
intermediate 11008, vocabulary 32000; ``--layers`` of its 32 layers), bfloat16 tensors of
random bits (a fixed exponent keeps them finite) in shards of at most 5 GB, written by
``jaxoff.models.hf.export_pretrained``. Then three children, each measured by its
``ru_maxrss`` (``os.wait4``) and wall time:

* ``load``: ``TrainConfig(init_from=..., strategy="fuyou", page_params=True).validate()``,
  ``jaxoff.strategies.build_step(cfg).init()``: the trainer's own start of a run, which reads
  the checkpoint one layer at a time into the page store; no step;
* ``train``: ``jaxoff train --init-from DIR --strategy fuyou --page-params --steps N``
  (``--steps``, default 2; batch 1 x 16 tokens): the training step's own peak, and a
  checkpoint to export;
* ``export``: ``jaxoff export --run RUN --out HF --dtype bfloat16``, read back per layer
  from the paged checkpoint (the synthetic checkpoint's tensors are deleted first: the export
  reads only its ``config.json``, and the 32 layers need the disk they held).

The goal is a peak RSS of at most 4 GiB for ``load`` and ``export`` (the whole model in
float32 is 27 GB at 32 layers). ``--optimizer`` decides the store's bytes: AdamW keeps 12
bytes per block parameter (float32 parameters and two moments, ``--store-slots 1``), Lion
and SGD 8; at 32 layers AdamW's store is 80 GB, Lion's 54 GB. The run refuses when the disk
has less than 40 GB free or less than the bench needs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the result writer
from _common.results import write_result  # noqa: E402

GIB = 2**30
MIN_FREE = 40 * 10**9
GOAL_RSS = 4 * GIB
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def _sizes(layers: int) -> tuple[int, int]:
    """``(parameters outside the blocks, parameters of one layer)`` of the 7B shapes."""
    d, f, v = LLAMA2_7B["hidden_size"], LLAMA2_7B["intermediate_size"], LLAMA2_7B["vocab_size"]
    return 2 * v * d + d, 4 * d * d + 3 * d * f + 2 * d


def write_checkpoint(directory: Path, layers: int) -> float:
    """The synthetic checkpoint, written layer by layer; returns seconds."""
    import ml_dtypes
    import numpy as np

    from jaxoff.models.hf import ParamsSource, export_pretrained
    from jaxoff.models.llama import LlamaConfig

    h = LLAMA2_7B
    cfg = LlamaConfig(
        num_layers=layers,
        d_model=h["hidden_size"],
        num_heads=h["num_attention_heads"],
        num_kv_heads=h["num_key_value_heads"],
        d_ff=h["intermediate_size"],
        max_seq_len=h["max_position_embeddings"],
        rope_theta=h["rope_theta"],
        norm_eps=h["rms_norm_eps"],
        vocab_size=h["vocab_size"],
    )
    rng = np.random.default_rng(0)

    def random(shape):
        # random sign and mantissa, exponent 2^-7: finite bfloat16 values of about 0.01
        bits = (rng.integers(0, 2**16, shape, dtype=np.uint16) & 0x807F) | 0x3C00
        return bits.view(ml_dtypes.bfloat16).astype(np.float32)

    class Random(ParamsSource):
        def __init__(self):
            from flax import nnx

            abstract = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
            super().__init__(cfg, nnx.state(abstract, nnx.Param))

        def outside(self):
            return {p: random(x.shape) for p, x in self._leaves.items() if p[0] != "blocks"}

        def layer(self, j):
            return {p: random(x.shape[1:]) for p, x in self._leaves.items() if p[0] == "blocks"}

    t0 = time.perf_counter()
    tokens = {k: h[k] for k in ("bos_token_id", "eos_token_id")}
    export_pretrained(Random(), directory, dtype="bfloat16", extra_config=tokens)
    return time.perf_counter() - t0


def _load(directory: str, run: str, read_ahead_mib: str, optimizer: str) -> None:
    """Child: the trainer's start of an ``--init-from`` Fuyou ``--page-params`` run."""
    from jaxoff.strategies import build_step
    from jaxoff.train import TrainConfig

    t0 = time.perf_counter()
    cfg = TrainConfig(
        init_from=Path(directory),
        strategy="fuyou",
        page_params=True,
        clip_norm=0.0,
        optimizer=optimizer,
        seq_len=16,
        batch_size=1,
        store_slots=1,
        fuyou_read_ahead_mib=int(read_ahead_mib),
        data=Path(run) / "tokens.npy",
        out_dir=Path(run),
    ).validate()
    step = build_step(cfg)
    state = step.init()
    step.close()
    del state
    store = cfg.store_dir()
    assert store is not None
    store_bytes = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    print(json.dumps({"seconds": time.perf_counter() - t0, "store_bytes": store_bytes}))


def _child(cmd: list[str], record: bool = False) -> dict:
    """Runs ``cmd``; its peak RSS and wall time (and with ``record`` its last stdout line, a
    JSON record)."""
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE if record else None, text=True)
    out = child.stdout.read() if (record and child.stdout) else ""
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"hf_load: {' '.join(cmd)} failed (status {status})")
    rec = json.loads(out.splitlines()[-1]) if record else {}
    rec["peak_rss_bytes"] = usage.ru_maxrss * 1024  # KiB on Linux
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/jaxoff-hf-load", help="scratch folder (emptied)")
    ap.add_argument("--layers", type=int, default=32, help="layers of the 32 of Llama-2-7B")
    ap.add_argument("--read-ahead-mib", type=int, default=128, help="--fuyou-read-ahead-mib")
    ap.add_argument("--optimizer", default="adamw", choices=("adamw", "lion", "sgd"))
    ap.add_argument("--steps", type=int, default=2, help="training steps before the export")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--json", help="the result file (default: bench/results/hf_load/)")
    args = ap.parse_args(argv)
    if not 1 <= args.layers <= 32:
        sys.exit("hf_load: --layers must be from 1 to 32")
    outside, per_layer = _sizes(args.layers)
    blocks = per_layer * args.layers
    ckpt_bytes = 2 * (outside + blocks)
    # the checkpoint (deleted before the export, which takes its place), the store (fp32
    # blocks and their moments, one slot; the moments of the rest), the run's orbax part
    # (fp32 embeddings and head)
    moments = 2 if args.optimizer == "adamw" else 1
    need = ckpt_bytes + 4 * (1 + moments) * blocks + 4 * moments * outside + 4 * outside
    scratch = Path(args.dir)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    free = shutil.disk_usage(scratch).free
    if free < max(MIN_FREE, int(1.1 * need)):
        sys.exit(
            f"hf_load: {scratch} has {free / 1e9:.1f} GB free; this bench needs "
            f"{max(MIN_FREE, int(1.1 * need)) / 1e9:.1f} GB: free space, or pass fewer --layers"
        )
    ckpt, run, out = scratch / "ckpt", scratch / "run", scratch / "export"
    import numpy as np

    run.mkdir()
    tokens = np.random.default_rng(1).integers(0, 32000, 4096).astype(np.uint16)
    np.save(run / "tokens.npy", tokens)
    write_s = write_checkpoint(ckpt, args.layers)
    print(f"checkpoint: {_bytes(ckpt) / 1e9:.2f} GB in {write_s:.0f} s", flush=True)
    recs = {"write": {"wall_s": write_s, "bytes": _bytes(ckpt)}}

    me = [sys.executable, __file__, "--child-load", str(ckpt), str(run)]
    me += [str(args.read_ahead_mib), args.optimizer]
    recs["load"] = _child(me, record=True)
    shutil.rmtree(run / "store", ignore_errors=True)
    print(f"load: peak RSS {recs['load']['peak_rss_bytes'] / GIB:.2f} GiB", flush=True)

    train = [sys.executable, "-m", "jaxoff", "train", "--init-from", str(ckpt)]
    train += ["--strategy", "fuyou", "--page-params", "--clip-norm", "0"]
    train += ["--steps", str(args.steps), "--optimizer", args.optimizer]
    train += ["--batch-size", "1", "--seq-len", "16", "--data", str(run / "tokens.npy")]
    train += ["--store-slots", "1", "--paged-checkpoint", "store", "--eval-every", "0"]
    train += ["--fuyou-read-ahead-mib", str(args.read_ahead_mib), "--warmup-steps", "1"]
    train += ["--out-dir", str(run / "out"), "--no-progress"]
    recs["train"] = _child(train)
    recs["train"]["losses"] = [
        r["loss"] for r in map(json.loads, open(run / "out" / "metrics.jsonl")) if "loss" in r
    ]
    print(f"train: peak RSS {recs['train']['peak_rss_bytes'] / GIB:.2f} GiB", flush=True)

    for shard in ckpt.glob("*.safetensors"):  # the export reads the run, not these
        shard.unlink()
    export = [sys.executable, "-m", "jaxoff", "export", "--run", str(run / "out")]
    export += ["--out", str(out), "--dtype", "bfloat16"]
    recs["export"] = _child(export)
    recs["export"]["bytes"] = _bytes(out)
    print(f"export: peak RSS {recs['export']['peak_rss_bytes'] / GIB:.2f} GiB", flush=True)

    summary = {
        "layers": args.layers,
        "optimizer": args.optimizer,
        "params": outside + blocks,
        "checkpoint_bytes": recs["write"]["bytes"],
        "store_bytes": recs["load"]["store_bytes"],
        "fp32_model_bytes": 4 * (outside + blocks),
        "load_peak_rss_gib": recs["load"]["peak_rss_bytes"] / GIB,
        "load_s": recs["load"]["wall_s"],
        "train_peak_rss_gib": recs["train"]["peak_rss_bytes"] / GIB,
        "export_peak_rss_gib": recs["export"]["peak_rss_bytes"] / GIB,
        "export_s": recs["export"]["wall_s"],
        "goal_rss_gib": GOAL_RSS / GIB,
        "goal_met": max(recs["load"]["peak_rss_bytes"], recs["export"]["peak_rss_bytes"])
        <= GOAL_RSS,
    }
    for k, v in summary.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    path = write_result(
        "hf_load", args=vars(args), summary=summary, records=recs, path=args.json, disk_path=scratch
    )
    print(f"result: {path}")
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-load":
        _load(*sys.argv[2:6])
    else:
        main()

"""Tokens/s of ``jaxoff train`` versus a plain hand-written flax + optax loop.

Same model, optimizer, batches and step count, measured in the same run, interleaved
``--reps`` times; prints medians and the ratio jaxoff / plain (goal >= 0.97: the framework
costs nothing when no offload is used).

    python bench/train_throughput.py [--model mini --batch-size 16 --seq-len 128 --steps 30]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import optax
import tyro
from flax import nnx

from jaxoff.train import Batches, TrainConfig, load_corpus, split, train

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the result writer
from _common.results import write_result  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    model: str = "mini"
    batch_size: int = 16
    seq_len: int = 128
    steps: int = 30
    reps: int = 3
    json: Path | None = None  # write the result here (bench/_common/results.py's schema)


def plain_loop(cfg: TrainConfig) -> float:
    """The loop a Flax user writes by hand; returns seconds per step after the first."""
    model = cfg.model_config().build(nnx.Rngs(cfg.seed))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = cfg.build_optimizer()
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = jax.jit(step, donate_argnums=(0, 1))
    train_tokens, _ = split(load_corpus(cfg.data), cfg.val_fraction)
    batches = Batches(train_tokens, cfg.batch_size, cfg.seq_len, cfg.seed)
    params, opt_state, loss = step(params, opt_state, *batches(0))
    float(loss)
    t0 = time.perf_counter()
    for i in range(1, cfg.steps):
        params, opt_state, loss = step(params, opt_state, *batches(i))
        float(loss)  # the same per-step sync the trainer does to log the loss
    return (time.perf_counter() - t0) / (cfg.steps - 1)


def jaxoff_loop(cfg: TrainConfig) -> float:
    """``jaxoff.train.train`` (metrics, log, progress bar); seconds per step after the first."""
    with tempfile.TemporaryDirectory() as d:
        result = train(dataclasses.replace(cfg, out_dir=Path(d) / "run"))
    first, last = result.records[0], result.records[-1]
    return (last["elapsed_s"] - first["elapsed_s"]) / (len(result.records) - 1)


def main(args: Args) -> None:
    cfg = TrainConfig(
        model=args.model,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        steps=args.steps,
        eval_every=0,
        ckpt_every=0,
        store="none",  # optimizer in RAM: this measures the framework, not the paging
        progress=True,
    ).validate()
    tokens = args.batch_size * args.seq_len
    plain, ours = [], []
    for rep in range(args.reps):
        plain.append(plain_loop(cfg))
        ours.append(jaxoff_loop(cfg))
        rates = f"plain {tokens / plain[-1]:,.0f}  jaxoff {tokens / ours[-1]:,.0f}"
        print(f"rep {rep}: {rates} tok/s")
    p, o = statistics.median(plain), statistics.median(ours)
    print(
        f"\nmodel {args.model}, batch {args.batch_size}x{args.seq_len}, {args.steps} steps, "
        f"{args.reps} interleaved reps (medians)"
    )
    print(f"plain flax+optax : {tokens / p:10,.0f} tokens/s  ({p * 1e3:.1f} ms/step)")
    print(f"jaxoff train     : {tokens / o:10,.0f} tokens/s  ({o * 1e3:.1f} ms/step)")
    print(f"ratio jaxoff/plain (tokens/s): {p / o:.3f}")
    if args.json:
        summary = {
            "plain_s_per_step": p,
            "jaxoff_s_per_step": o,
            "plain_tokens_per_s": tokens / p,
            "jaxoff_tokens_per_s": tokens / o,
            "jaxoff_over_plain_tokens_per_s": p / o,
        }
        records = [
            {"rep": i, "plain_s": a, "jaxoff_s": b}
            for i, (a, b) in enumerate(zip(plain, ours, strict=True))
        ]
        out = write_result(
            "train_throughput",
            args=dataclasses.asdict(args),
            summary=summary,
            records=records,
            path=args.json,
        )
        print(f"wrote {out}")


if __name__ == "__main__":
    main(tyro.cli(Args))

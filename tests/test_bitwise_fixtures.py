"""Bitwise fixtures: what tiny trainer runs end with, recorded once, compared forever.

Each run trains through the public trainer (``jaxoff.train.train``) and is summarised by
sha256 digests of

- ``params``: the parameters of its last orbax checkpoint (every leaf: path, dtype, shape,
  bytes);
- ``opt_state``: the optimizer state that checkpoint holds in orbax (the plain paged step's
  RAM leaves and counters; nothing for the sharded and Fuyou steps, whose state is in their
  paged part);
- ``store``: every entry of the run's page store, read back (verified) in its committed
  version: the paged optimizer state, and Fuyou's paged parameters;
- ``checkpoint_pages``: the data files (``*.page``) of the last checkpoint's paged part;
- ``losses``: the training losses, as float64 bytes.

``tests/fixtures/bitwise.json`` holds the digests the code produced when they were recorded.
A refactor that claims to change no arithmetic must leave every one of them equal; a change
that means to change the numbers records them again, and says why in its commit::

    python tests/test_bitwise_fixtures.py --record

XLA:CPU compiles for the host's instruction set: the vector width and whether FMA is used
decide the bits (on an Intel Xeon with AVX-512, ``paged-tiny`` ends with one digest under
caps of AVX-512, AVX2 or none, another under AVX, a third under SSE4.2), and digests
recorded on one CPU failed on an AMD EPYC. Each run is therefore made in a process of its
own with XLA's instruction set capped at SSE4.2 (``--xla_cpu_max_isa=SSE4_2``: 128-bit
vectors, no FMA, which every x86-64 machine the suite runs on has), recorded and compared
alike; the file names the machine that recorded it (an Intel Xeon with AVX-512). Checked on
an AMD EPYC with AVX-512 (2026-12-02): every fixture equal, and ``paged-tiny`` and
``fuyou-tiny`` end with one digest under no cap, AVX-512 and AVX2, another under AVX and a
third under SSE4.2, the last equal to the file's (``python
bench/investigations/isa_bits.py``, ``bench/results/isa_bits/2026-12-02-7bc88c8.json``).

The runs: the plain paged step (``--store``), the sharded paged step (``--fsdp 2 --store``,
two of the 4 fake CPU devices of ``conftest.py``), Fuyou (``--fuyou``, and with
``--page-params``), on ``tiny`` and ``llama-tiny``; and a resumed run of each of the plain
and Fuyou steps (trained to step 4 with checkpoints, then ``--resume`` to step 6).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "bitwise.json"

COMMON = dict(
    batch_size=2,
    seq_len=16,
    steps=3,
    lr=3e-3,
    warmup_steps=1,
    eval_every=0,
    ckpt_every=0,
    chunk_mib=1,
    progress=False,
    compile_cache="none",
)
# Fuyou updates inside the backward pass: no global-norm clipping, blocks recomputed
FUYOU = dict(fuyou=True, clip_norm=0.0, policy="nothing_saveable")

RUNS: dict[str, dict] = {
    "paged-tiny": dict(model="tiny"),
    "paged-llama-tiny": dict(model="llama-tiny"),
    "sharded-tiny": dict(model="tiny", fsdp=2),
    "sharded-llama-tiny": dict(model="llama-tiny", fsdp=2),
    "fuyou-tiny": dict(model="tiny", **FUYOU),
    "fuyou-llama-tiny": dict(model="llama-tiny", **FUYOU),
    "fuyou-page-params-tiny": dict(model="tiny", page_params=True, **FUYOU),
}
# (the run's options, the step the first run stops at): stopped there (``--stop-at``), with a
# checkpoint every 2 steps, then resumed to the end
RESUMED: dict[str, tuple[dict, int]] = {
    "paged-tiny-resumed": (dict(model="tiny", steps=6, ckpt_every=2), 4),
    "fuyou-tiny-resumed": (dict(model="tiny", steps=6, ckpt_every=2, **FUYOU), 4),
}


def _config(out_dir: Path, **over):
    from jaxoff.train import TrainConfig

    return TrainConfig(**{**COMMON, "out_dir": out_dir, **over})


def _digest_arrays(named) -> str:
    """sha256 over ``(name, array)`` pairs, in name order: name, dtype, shape and bytes."""
    import numpy as np

    h = hashlib.sha256()
    for name, x in sorted(named, key=lambda p: p[0]):
        x = np.ascontiguousarray(np.asarray(x))
        h.update(f"{name}|{x.dtype.str}|{x.shape}|".encode())
        h.update(x.view(np.uint8).tobytes() if x.size else b"")
    return h.hexdigest()


def _tree_pairs(tree) -> list:
    import jax

    from jaxoff.optim.chunks import path_name

    if tree is None:
        return []
    return [(path_name(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _summary(cfg, losses: list[float]) -> dict:
    """The digests of a finished run (see the module docstring)."""
    import numpy as np
    import orbax.checkpoint as ocp

    from jaxoff.aio import PageStore

    out = Path(cfg.out_dir).absolute()
    last = max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    saved = ocp.StandardCheckpointer().restore(out / "checkpoints" / str(last) / "default")
    record = {
        "last_step": last,
        "params": _digest_arrays(_tree_pairs(saved.get("params"))),
        "opt_state": _digest_arrays(_tree_pairs(saved.get("opt_state"))),
        "losses": hashlib.sha256(np.asarray(losses, np.float64).tobytes()).hexdigest(),
    }
    store_dir = cfg.store_dir()
    stores = sorted(Path(store_dir).rglob("store.json")) if store_dir is not None else []
    named = []
    for manifest in stores or [Path(store_dir) / "x"]:
        root = manifest.parent
        store = PageStore.open(root)
        try:
            prefix = str(root.relative_to(store_dir))
            named += [(f"{prefix}:{n}", store.read(n)) for n in store.entries]
        finally:
            store.close()
    record["store"] = _digest_arrays(named)
    pages = sorted((out / "checkpoints_paged" / str(last)).rglob("*.page"))
    h = hashlib.sha256()
    for p in pages:
        h.update(str(p.relative_to(out / "checkpoints_paged")).encode() + b"|")
        h.update(p.read_bytes())
    record["checkpoint_pages"] = h.hexdigest() if pages else None
    return record


ISA = "SSE4_2"  # the instruction set XLA compiles the runs for (see the module docstring)


def run_pinned(root: Path, name: str) -> dict:
    """`run_one` in a child process with XLA's instruction set capped at `ISA` (and the 4
    fake CPU devices of ``conftest.py``)."""
    import subprocess

    from _limits import HANG_S

    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags += " --xla_force_host_platform_device_count=4"
    env["XLA_FLAGS"] = f"{flags} --xla_cpu_max_isa={ISA}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, __file__, "--one", name, str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_S,
    )
    last = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else []
    if not last or not last[0].startswith("{"):
        raise AssertionError(
            f"fixture run {name} failed (exit {proc.returncode}): {proc.stderr[-3000:]}"
        )
    return json.loads(last[0])


def run_one(root: Path, name: str) -> dict:
    """Trains fixture run ``name`` under ``root``; its digests."""
    from jaxoff.train import train

    if name in RUNS:
        cfg = _config(root / name, **RUNS[name])
        return _summary(cfg, train(cfg).losses)
    over, stop = RESUMED[name]
    losses = train(_config(root / name, **over, stop_at=stop)).losses
    resumed = _config(root / name, **over, resume=True)
    result = train(resumed)
    assert result.first_step == stop, result
    return _summary(resumed, losses + result.losses)


@pytest.mark.parametrize("name", [*RUNS, *RESUMED])
def test_bitwise_fixture(tmp_path, name):
    """The run ends with the recorded parameters, optimizer state and page files."""
    expected = json.loads(FIXTURES.read_text())["runs"][name]
    got = run_pinned(tmp_path, name)
    differ = {k: (v, got[k]) for k, v in expected.items() if got[k] != v}
    assert not differ, (
        f"run {name} no longer ends bit for bit as recorded ((expected, got) per digest); if "
        "the change is meant, record again with `python tests/test_bitwise_fixtures.py "
        f"--record`: {differ}"
    )


def test_fixtures_cover_every_run():
    assert sorted(json.loads(FIXTURES.read_text())["runs"]) == sorted([*RUNS, *RESUMED])


def _machine() -> str:
    """The CPU whose instruction set XLA compiled the runs for (the bits depend on it)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln), "?"
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
    )
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model} ({isa})"


def _record() -> None:
    import tempfile

    import jax

    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in [*RUNS, *RESUMED]:
            t = time.perf_counter()
            runs[name] = run_pinned(Path(tmp), name)
            print(f"{name}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
    FIXTURES.parent.mkdir(exist_ok=True)
    doc = {
        "how": "python tests/test_bitwise_fixtures.py --record (see its docstring)",
        "jax": jax.__version__,
        "machine": _machine(),
        "xla_cpu_max_isa": ISA,
        "runs": runs,
    }
    FIXTURES.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURES}: {len(runs)} runs")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if sys.argv[1:2] == ["--one"] and len(sys.argv) == 4:  # a child of `run_pinned`
        print(json.dumps(run_one(Path(sys.argv[3]), sys.argv[2])))
    elif sys.argv[1:] == ["--record"]:
        _record()
    else:
        sys.exit("usage: python tests/test_bitwise_fixtures.py --record")

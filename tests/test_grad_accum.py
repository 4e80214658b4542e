"""``jaxoff train --grad-accum N``: one optimizer step over N micro-batches of ``--batch-size``
rows, bitwise what a plain JAX + optax loop at batch N x B computes when it averages the same
micro-batches' gradients.

The reference (:func:`reference_run`) is written here in JAX and optax: the step's batch of
N x B rows (the trainer's data at ``--batch-size N*B``), micro-batch n its rows n, n + N,
n + 2N, ...; ``jax.value_and_grad`` of the model's loss jitted per micro-batch in a Python
loop, each micro-batch's gradients added in order to a float32 accumulator that starts at
zero (a jitted add); then the mean (sum / N, cast to the parameters' dtype), its global
norm, and the optimizer, applied the way the trainer's step applies it
(``docs/guide/optimizer.md#equivalence-with-optax``): with ``--store none`` all three in
one jitted program, one optax update of the whole tree; with a page store, the mean and
the clipping of the whole tree in one jitted program, then optax leaf by leaf on the
materialised gradients, as ``jaxoff.paged`` computes it (the equivalence tests' reference,
``tests/test_paged.py``).

What decides the bits of an accumulated gradient: inside one program XLA folds
``acc + scatter-add(0, ids, rows)`` (the embedding's gradient) into ``scatter-add(acc, ids,
rows)``, which adds each row to the accumulator on its own instead of adding their sum; the
step therefore materialises each micro-batch's gradients before adding them
(``lax.optimization_barrier`` in ``jaxoff.step._accum.accumulate``), and the per-micro-batch
jits of the reference compute the same arithmetic.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxoff._errors import ConfigError
from jaxoff.step import make_loss_fn
from jaxoff.train import TrainConfig, train

N = 4  # micro-batches per step
B = 2  # rows per micro-batch (--batch-size)
COMMON = dict(
    model="tiny",
    batch_size=B,
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


def _config(out: Path, **over) -> TrainConfig:
    return TrainConfig(**{**COMMON, "out_dir": out, **over})


def _optax(cfg: TrainConfig):
    """The trainer's optimizer written in optax: ``(clip, AdamW)``, AdamW under a linear
    warm-up of ``warmup_steps`` and a cosine decay to 10% over ``steps``."""
    lr = optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, cfg.warmup_steps, cfg.steps, end_value=cfg.lr * 0.1
    )
    adamw = optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)
    return optax.clip_by_global_norm(cfg.clip_norm), adamw


def _step_batches(cfg: TrainConfig):
    """The trainer's batches at ``--batch-size N*B`` (one step's N x B rows each)."""
    from jaxoff.train._data import data_batches

    data = dataclasses.replace(cfg.data_options, batch_size=N * B, grad_accum=1)
    return data_batches(data, cfg.seed, cfg.model_config().vocab_size, "tiny")[0]


def _norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def reference_run(cfg: TrainConfig, *, leafwise: bool, mesh=None):
    """``(params, losses, grad_norms)`` after ``cfg.steps`` steps of the reference (see the
    module docstring). ``leafwise``: the optimizer leaf by leaf after a whole-tree clip (a
    paged step), else one whole-tree update. ``mesh``: the gradients computed on that FSDP
    mesh as the sharded step computes them (parameters sharded, rows split), the update on
    the gathered arrays."""
    graphdef, params = nnx.split(cfg.model_config().build(nnx.Rngs(cfg.seed)), nnx.Param)
    clip, adamw = _optax(cfg)
    tx = optax.chain(clip, adamw)
    loss_fn = make_loss_fn(graphdef)
    grad_kw, place = {}, lambda x: x
    if mesh is not None:
        from jax.sharding import NamedSharding, PartitionSpec

        from jaxoff.placement import batch_sharding, get_placement, state_shardings
        from jaxoff.step import TrainState

        shard = state_shardings(get_placement("device"), TrainState(0, params, ()), mesh).params
        rep, rows = NamedSharding(mesh, PartitionSpec()), batch_sharding(mesh)
        grad_kw = dict(in_shardings=(shard, rows, rows), out_shardings=(rep, shard))
        place = lambda x: jax.device_put(x, shard)  # noqa: E731
    grad = jax.jit(jax.value_and_grad(loss_fn), **grad_kw)
    add = jax.jit(lambda a, g: jax.tree.map(lambda x, y: x + y.astype(jnp.float32), a, g))

    @jax.jit
    def mean_and_clip(acc, clip_state, p):
        g = jax.tree.map(lambda a, q: (a / N).astype(q.dtype), acc, p)
        clipped, _ = clip.update(g, clip_state, p)
        return clipped, _norm(g)

    @jax.jit
    def whole_update(acc, opt_state, p):
        g = jax.tree.map(lambda a, q: (a / N).astype(q.dtype), acc, p)
        updates, opt_state = tx.update(g, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, _norm(g)

    @jax.jit
    def leaf_update(g, s, x):
        u, s = adamw.update({"x": g}, s, {"x": x})
        return optax.apply_updates({"x": x}, u)["x"], s

    leaves, treedef = jax.tree.flatten(params)
    opt_state = tx.init(params)
    leaf_states = [adamw.init({"x": x}) for x in leaves]
    batches = _step_batches(cfg)
    losses, norms = [], []
    for t in range(cfg.steps):
        x, y = batches(t)
        p = place(jax.tree.unflatten(treedef, leaves))
        acc = place(jax.tree.map(lambda q: jnp.zeros(q.shape, jnp.float32), params))
        loss = np.float32(0)
        for n in range(N):
            rows = (jnp.asarray(x[n::N]), jnp.asarray(y[n::N]))
            if mesh is not None:
                rows = jax.device_put(rows, batch_sharding(mesh))
            value, g = grad(p, *rows)
            acc = add(acc, g)
            loss = loss + np.float32(value)
        losses.append(float(loss / np.float32(N)))
        if not leafwise:
            new, opt_state, norm = whole_update(acc, opt_state, p)
            leaves = jax.tree.leaves(new)
        else:
            g, norm = mean_and_clip(acc, clip.init(p), p)
            for i, gi in enumerate(jax.tree.leaves(g)):
                gi, xi = jnp.asarray(np.asarray(gi)), jnp.asarray(np.asarray(leaves[i]))
                leaves[i], leaf_states[i] = leaf_update(gi, leaf_states[i], xi)
        norms.append(float(norm))
    return jax.tree.unflatten(treedef, [np.asarray(x) for x in leaves]), losses, norms


def _final_params(cfg: TrainConfig):
    import orbax.checkpoint as ocp

    path = (Path(cfg.out_dir) / "checkpoints" / str(cfg.steps) / "default").absolute()
    return ocp.StandardCheckpointer().restore(path)["params"]


def _assert_same_bits(got, want) -> None:
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    assert len(got_leaves) == len(jax.tree.leaves(want))
    for (path, a), b in zip(got_leaves, jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, jax.tree_util.keystr(path)
        assert a.tobytes() == b.tobytes(), (
            jax.tree_util.keystr(path),
            float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))),
        )


@pytest.mark.parametrize(
    "name, over, leafwise",
    [
        ("store-none", dict(store="none"), False),
        ("paged", dict(store="auto"), True),
        ("sharded", dict(store="auto", fsdp=2), True),
    ],
)
def test_accumulated_steps_are_bitwise_the_reference_at_batch_n_times_b(
    tmp_path, name, over, leafwise
):
    """--grad-accum 4 at --batch-size 2: the parameters, the losses (the mean of the
    micro-batches') and the gradient norms (of the averaged gradient) of the reference at
    batch 8; clipping acts on the averaged gradient, whose norm exceeds --clip-norm here."""
    cfg = _config(tmp_path / name, grad_accum=N, **over)
    result = train(cfg)
    want, losses, norms = reference_run(cfg, leafwise=leafwise, mesh=cfg.mesh())
    assert result.losses == losses  # bitwise: float equality
    assert [r["grad_norm"] for r in result.records] == norms
    assert max(norms) > cfg.clip_norm  # the clipping did act
    _assert_same_bits(_final_params(cfg), want)


def test_a_model_with_state_carries_it_through_the_micro_batches():
    """A model with dropout and batch statistics (state besides ``nnx.Param``): each
    micro-batch draws its dropout masks from the RNG counts the one before left and updates
    the batch statistics in turn; the step returns the state the last micro-batch left. The
    reference is the same model in a plain JAX loop carrying that state from micro-batch to
    micro-batch."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_model_inputs import InputsConfig, _batches, _same

    from jaxoff.step import PlainStep
    from jaxoff.step._plain import cross_entropy, split_model

    cfg = InputsConfig(dropout=0.3, batch_norm=True)
    batches = _batches(3, batch=N * B)
    tx = optax.adam(1e-2)
    step = PlainStep(cfg, tx, grad_accum=N)
    state = step.compile(step.init(), *batches[0])
    losses = []
    for x, y in batches:
        state, metrics = step(state, x, y)
        losses.append(float(metrics["loss"]))

    graphdef, params, rest = split_model(cfg.build(nnx.Rngs(0)))
    opt_state = tx.init(params)

    def loss(params, rest, x, y):
        model = nnx.merge(graphdef, params, rest, copy=True)
        value = cross_entropy(model(x, deterministic=False), y)
        return value, nnx.split(model, nnx.Param, ...)[2]

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    add = jax.jit(lambda a, g: jax.tree.map(lambda u, v: u + v.astype(jnp.float32), a, g))

    @jax.jit
    def update(acc, opt_state, p):
        g = jax.tree.map(lambda a, q: (a / N).astype(q.dtype), acc, p)
        updates, opt_state = tx.update(g, opt_state, p)
        return optax.apply_updates(p, updates), opt_state

    want = []
    for x, y in batches:
        acc = jax.tree.map(lambda q: jnp.zeros(q.shape, jnp.float32), params)
        total = np.float32(0)
        for n in range(N):
            (value, rest), g = grad(params, rest, x[n::N], y[n::N])
            acc = add(acc, g)
            total = total + np.float32(value)
        params, opt_state = update(acc, opt_state, params)
        want.append(float(total / np.float32(N)))
    assert losses == want  # bitwise, dropout masks included
    _same(state.params, params)
    _same(state.rest, rest)
    counts = [a for a in jax.tree.leaves(state.rest) if a.dtype == jnp.uint32]
    assert counts and all(int(c.max()) == 3 * N for c in counts)  # one draw per micro-batch


@pytest.mark.parametrize(
    "over, words",
    [
        (dict(grad_accum=0), "--grad-accum must be at least 1 (micro-batches per optimizer step"),
        (dict(grad_accum=-3), "--grad-accum must be at least 1"),
        (
            dict(grad_accum=4, fuyou=True, clip_norm=0.0),
            "`grad_accum=4` does not apply to `strategy='fuyou'`, which updates each layer "
            "inside the backward pass",
        ),
        (
            dict(grad_accum=2, policy="full", placement="host_params_stream1"),
            "--grad-accum 2 with --placement host_params_stream1",
        ),
    ],
    ids=["zero", "negative", "fuyou", "streamed"],
)
def test_bad_grad_accum_is_refused_in_one_line_before_anything_is_written(tmp_path, over, words):
    """From Python as from the command line (``tests/test_bad_invocations.py``): one line
    naming the option, raised at validation, the run directory never made."""
    with pytest.raises(ConfigError) as e:
        train(_config(tmp_path / "run", **over))
    assert "\n" not in str(e.value) and words in str(e.value), str(e.value)
    assert not (tmp_path / "run").exists()


# the pager's counters of one step, once its writes and commit are done (times left out)
COUNTERS = (
    "steps_begun", "version_checks", "takes", "puts", "reads_done", "read_bytes",
    "writes_done", "write_bytes", "syncs", "commits",
)  # fmt: skip


@pytest.mark.parametrize("fsdp", [1, 2], ids=["plain", "sharded"])
def test_the_paged_state_is_read_and_written_once_per_optimizer_step(tmp_path, fsdp):
    """The pager's counters (``jaxoff.aio.io_stats`` of the step's file table) of each of
    three steps, counted once the step's writes and commit are done: the same with
    --grad-accum 4 as without (one read and one write of the state per step, not per
    micro-batch)."""
    from jaxoff.aio import io_stats
    from jaxoff.strategies import build_step
    from jaxoff.train._data import data_batches

    per_step = {}
    for n in (1, N):
        cfg = _config(tmp_path / f"n{n}", grad_accum=n, fsdp=fsdp).validate()
        batches, _ = data_batches(cfg.data_options, cfg.seed, 256, "tiny")
        step = build_step(cfg)
        try:
            state = step.compile(step.init(), *batches(0))
            table = step.io_table()
            assert table is not None
            seen = []
            for t in range(3):
                before = io_stats(table)
                state, _ = step(state, *batches(t))
                jax.block_until_ready(state)
                step.tx.pager.txn.settle()  # the step's writes and its commit are done
                after = io_stats(table)
                assert before is not None and after is not None
                seen.append({k: after[k] - before[k] for k in COUNTERS})
            per_step[n] = seen
        finally:
            step.close()
    assert per_step[N] == per_step[1]
    assert all(s["steps_begun"] == s["commits"] == 1 and s["takes"] > 0 for s in per_step[N])
    assert all(s["read_bytes"] > 0 and s["write_bytes"] > 0 for s in per_step[N])


def _argv(cfg: TrainConfig, *extra: str) -> list[str]:
    """``jaxoff train`` with ``cfg``'s options (those of these tests) and ``extra``."""
    import sys

    argv = [sys.executable, "-m", "jaxoff", "train", "--no-progress"]
    for name in ("model", "batch_size", "grad_accum", "seq_len", "steps", "lr"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(cfg, name))]
    for name in ("warmup_steps", "eval_every", "ckpt_every", "chunk_mib", "compile_cache"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(cfg, name))]
    return [*argv, "--out-dir", str(cfg.out_dir), *extra]


def _killed(cfg: TrainConfig, fault: str, *extra: str) -> None:
    """Runs ``jaxoff train`` in a child killed with SIGKILL at fault point ``fault``."""
    import os
    import signal
    import subprocess

    from _limits import HANG_S

    env = {**os.environ, "JAXOFF_FAULT": fault}
    proc = subprocess.run(
        _argv(cfg, *extra), capture_output=True, text=True, env=env, timeout=HANG_S
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def _record(cfg: TrainConfig) -> dict:
    """What two runs of the same options must agree on, bit for bit: every step's loss and
    gradient norm, the last checkpoint's parameters and its paged part's page files."""
    out = Path(cfg.out_dir)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    paged = out / "checkpoints_paged" / str(cfg.steps)
    return {
        "steps": [r["step"] for r in records],
        "losses": [r["loss"] for r in records],
        "grad_norms": [r["grad_norm"] for r in records],
        "pages": {p.name: p.read_bytes() for p in sorted(paged.rglob("*.page"))},
    }


@pytest.mark.subprocess
def test_a_run_killed_inside_a_step_resumes_bitwise(tmp_path):
    """Checkpoints land on optimizer steps only: a run killed (SIGKILL) inside step 3's
    program, where its micro-batches are accumulated and the store is paged (its paging
    calls run inside it), resumes from checkpoint 2; killed again after step 4 ran but
    before its line and checkpoint, it resumes from 2 once more; then it finishes bitwise
    the uninterrupted run."""
    over = dict(grad_accum=N, steps=5, ckpt_every=2, store="auto")
    full = _config(tmp_path / "full", **over)
    train(full)
    killed = _config(tmp_path / "killed", **over)
    _killed(killed, "pager.begin:3")  # the third step's paging transaction begins
    out = Path(killed.out_dir)
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [2]
    _killed(killed, "train.step:2", "--resume")  # after step 4 ran (the second it ran)
    result = train(dataclasses.replace(killed, resume=True))
    assert result.first_step == 2
    want, got = _record(full), _record(killed)
    assert got["steps"] == [1, 2, 3, 4, 5] and got["pages"]
    assert got == want
    _assert_same_bits(_final_params(killed), _final_params(full))


def test_a_resume_with_another_grad_accum_is_refused_in_one_line(tmp_path, capsys):
    """--grad-accum changes what a step is: a resume with another is refused in one line,
    nothing written; a run whose config.json predates the option resumes as --grad-accum 1."""
    cfg = _config(tmp_path / "run", grad_accum=2, steps=2, store="none")
    train(cfg)
    out = Path(cfg.out_dir)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for n in (1, 4):
        with pytest.raises(ConfigError) as e:
            train(dataclasses.replace(cfg, grad_accum=n, resume=True))
        msg = str(e.value)
        assert "\n" not in msg and f"--resume --grad-accum {n}" in msg, msg
        assert "started with --grad-accum 2" in msg and "resume with --grad-accum 2" in msg
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after.keys() == before.keys()
    assert all(after[p] == before[p] for p in before if p.name != "run.lock")

    old = _config(tmp_path / "old", steps=2, store="none")
    train(old)
    path = Path(old.out_dir) / "config.json"
    saved = json.loads(path.read_text())
    del saved["data_options"]["grad_accum"]  # as a run written before --grad-accum saved it
    path.write_text(json.dumps(saved, indent=2, sort_keys=True))
    with pytest.raises(ConfigError, match="started with --grad-accum 1"):
        train(dataclasses.replace(old, grad_accum=2, steps=3, resume=True))
    assert train(dataclasses.replace(old, steps=3, resume=True)).first_step == 2


# --- what plan and compare report: the compiled accumulating step ---------------------------

SEQ = 32


def _grad_tree_bytes(model_cfg) -> int:
    """Bytes of one float32 gradient tree of ``model_cfg`` (the accumulator's size)."""
    from jaxoff.step import abstract_state, optimizer

    _, state = abstract_state(model_cfg, optimizer())
    return sum(4 * int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))


def _temp(model_cfg, grad_accum: int) -> int:
    from jaxoff.plan._profile import temp_bytes
    from jaxoff.step import compile_step

    return temp_bytes(compile_step(model_cfg, B, SEQ, grad_accum=grad_accum)[0])


def _about_one_gradient_tree(extra: int, grads: int) -> bool:
    """``extra`` bytes are one gradient tree, within what XLA's buffer sharing moves."""
    return 0.9 * grads <= extra <= 1.5 * grads


@pytest.fixture(scope="module")
def tiny_temps():
    """``(grad tree bytes, {grad_accum: temp bytes})`` of tiny's compiled train step."""
    from jaxoff.models import load_model

    model = load_model("tiny")
    return _grad_tree_bytes(model), {n: _temp(model, n) for n in (1, N)}


def test_the_accumulating_step_holds_one_more_gradient_tree(tiny_temps):
    """``memory_analysis()`` of the compiled step: at the same micro-batch, the step over 4
    micro-batches has about one float32 gradient tree more temporaries (the accumulator)
    than the plain step; the activations are one micro-batch's."""
    grads, temps = tiny_temps
    assert _about_one_gradient_tree(temps[N] - temps[1], grads), (temps, grads)


def test_plan_counts_the_accumulator(tmp_path, tiny_temps):
    """``jaxoff plan --grad-accum 4``: the profile's workspace is calibrated on the
    accumulating step, the priced device temporaries of a plan are the compiled
    accumulating step's own, and the plan file says how many micro-batches it is for
    (``jaxoff train --plan`` with another --grad-accum is refused)."""
    from jaxoff.models import load_model
    from jaxoff.models.gpt import RESIDUAL_NAMES
    from jaxoff.plan import Plan, Pricer, load_plan, preset, profile
    from jaxoff.plan._profile import temp_bytes, with_policy
    from jaxoff.step import compile_step

    grads, temps = tiny_temps
    model = load_model("tiny")
    profiles = {n: profile(model, B, SEQ, model="tiny", grad_accum=n) for n in (1, N)}
    extra = profiles[N].workspace_bytes - profiles[1].workspace_bytes
    assert _about_one_gradient_tree(extra, grads), (extra, grads)
    actions = {n: "remat" for n in RESIDUAL_NAMES} | {"mlp_up": "device"}
    plan = Plan.from_actions(profiles[N], actions)
    priced = Pricer(profiles[N], model).price(preset("rtx4090"), plan)
    compiled = compile_step(with_policy(model, dict(plan.actions)), B, SEQ, grad_accum=N)[0]
    assert priced.device_temp_bytes == temp_bytes(compiled)

    from jaxoff.cli import main

    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "tiny", "--hardware", "rtx4090", "--batch", str(B)]
    argv += ["--seq", str(SEQ), "--grad-accum", str(N), "--no-price", "--out", str(out)]
    assert main(argv) == 0
    assert load_plan(out).grad_accum == N
    run = dict(model="tiny", batch_size=B, seq_len=SEQ, plan=out, out_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match="made for --grad-accum 4, not 1"):
        TrainConfig(**run).validate()
    assert not (tmp_path / "run").exists()
    assert TrainConfig(**run, grad_accum=N).validate().policy == load_plan(out).policy_spec()


def test_compare_measures_the_accumulating_step(tmp_path, tiny_temps):
    """``jaxoff compare --grad-accum 4``: each policy's temporaries are the compiled
    accumulating step's (a gradient tree above the plain step's), its FLOPs all four
    micro-batches'; under --strategies, Fuyou and the streamed strategies are listed as not
    run, the others measured on the accumulating step."""
    from jaxoff.compare import CompareConfig, compare
    from jaxoff.compare._measure import measure_policy
    from jaxoff.compare._strategies import measure_strategy
    from jaxoff.strategies import Context, build_recipe

    grads, temps = tiny_temps
    rows = compare(
        CompareConfig(
            model="tiny",
            policies="none",
            batch_size=B,
            seq_len=SEQ,
            steps=1,
            warmup=0,
            isolate=False,
            grad_accum=N,
            out_dir=tmp_path / "cmp",
        )
    )
    assert rows[0]["temp_bytes"] == temps[N]
    plain = measure_policy("tiny", "none", B, SEQ, steps=1, warmup=0)
    assert _about_one_gradient_tree(rows[0]["temp_bytes"] - plain["temp_bytes"], grads)
    # four micro-batches of forward and backward, one update (a small share of the FLOPs)
    assert rows[0]["flops"] == pytest.approx(N * plain["flops"], rel=0.05)
    meta = json.loads((tmp_path / "cmp" / "compare.json").read_text())["meta"]
    assert meta["grad_accum"] == N

    from jaxoff.models import load_model

    recipe = build_recipe("megatron_selective", Context(load_model("tiny"), B, SEQ)).to_json()
    kw = dict(model="tiny", name="megatron_selective", recipe=recipe, batch=B, seq=SEQ)
    kw |= dict(steps=1, warmup=0, store_root=str(tmp_path / "stores"))
    one, accum = measure_strategy(**kw), measure_strategy(**kw, grad_accum=N)
    assert one["status"] == accum["status"] == "ok"
    assert _about_one_gradient_tree(accum["temp_bytes"] - one["temp_bytes"], grads)
    rows = compare(
        CompareConfig(
            model="tiny",
            strategies="fuyou,l2l",
            batch_size=B,
            seq_len=SEQ,
            steps=1,
            warmup=0,
            isolate=False,
            grad_accum=N,
            out_dir=tmp_path / "strategies",
        )
    )
    assert [r["strategy"] for r in rows] == ["fuyou", "l2l"]
    assert all(r["status"].startswith(f"not run with --grad-accum {N}") for r in rows)

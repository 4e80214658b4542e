"""One paging transaction on the CPU and on CUDA: what a paged step lowers, the plan the pager
follows, durability, versions, stale states, faults.

Every paged step (the paged optimizer's and Fuyou's, with resident and with paged parameters)
lowers four targets, ``jaxoff_pager_begin/take/out/commit``, with attributes only (table,
plan, site) and one token chain; its `StepPlan` is recorded at trace time and handed to the
pager. The step is exported for CUDA on this CPU machine (``jax.export``) to prove the GPU
program is the same one: no host callback, no metadata operand.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _limits import HANG_S

from jaxoff import _ffi
from jaxoff.aio import PageStore, PageStoreCorruptError, PageStoreError, store_error_from
from jaxoff.aio._pager import PAGER_TARGETS
from jaxoff.optim import paged, update_and_apply
from jaxoff.optim.chunks import chunk_updater

CHUNK = 4096


def params_tree():
    k = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(k[0], (40, 70), jnp.float32),  # 2800 elements: 3 chunks
        "h": jax.random.normal(k[1], (3000,), jnp.bfloat16),  # a master copy: 3 + 2 chunks
        "b": jax.random.normal(k[2], (5,), jnp.float32),
    }


def grads_like(params, t):
    return jax.tree.map(lambda x: jnp.sin(x.astype(jnp.float32) * (t + 1)).astype(x.dtype), params)


def make_step(tx):
    def step(params, state, t):
        return update_and_apply(tx, grads_like(params, t), state, params)

    return step


# --- what a step lowers, for the CPU and for CUDA ----------------------------------------------

_CALL = re.compile(r"stablehlo\.custom_call @(\w+)\(([^)]*)\)[^\n]*")


def pager_calls(text: str) -> list[tuple[str, int, dict]]:
    """Every custom call of a StableHLO module: (target, operand count, attributes)."""
    out = []
    for m in _CALL.finditer(text):
        target, operands = m[1], m[2].strip()
        attrs = dict(re.findall(r"(\w+) = (\"[^\"]*\"|-?\d+)", m[0]))
        out.append((target, len(operands.split(",")) if operands else 0, attrs))
    return out


def export_for(step, platform, *args):
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in PAGER_TARGETS]
    exp = jax.export.export(jax.jit(step), platforms=[platform], disabled_checks=checks)(*args)
    return exp.mlir_module()


def check_lowered(text: str, recorders) -> None:
    """Only the four pager targets; operands: one token (page_out: its tensor too); table,
    plan and site as attributes; no host callback; the sites lowered are the recorded ones,
    and their trips add up to the plan's reads and writes."""
    calls = pager_calls(text)
    assert calls and {t for t, _, _ in calls} <= set(PAGER_TARGETS), {t for t, _, _ in calls}
    assert "callback" not in text
    want = {"jaxoff_pager_begin": 1, "jaxoff_pager_take": 1, "jaxoff_pager_out": 2,
            "jaxoff_pager_commit": 1}  # fmt: skip
    for target, n, attrs in calls:
        assert n == want[target], (target, n)
        assert "table" in attrs and "plan" in attrs, (target, attrs)
        assert ("site" in attrs) == (target in ("jaxoff_pager_take", "jaxoff_pager_out"))
    sites = {(t, int(a["plan"]), int(a["site"])) for t, _, a in calls if "site" in a}
    recorded = set()
    for rec in recorders:
        plan = rec.plan
        kinds = {"read": "jaxoff_pager_take", "write": "jaxoff_pager_out"}
        recorded |= {(kinds[s.kind], rec.plan_id, s.index) for s in plan.sites
                     if s.index in plan.trips()}  # fmt: skip
        ios = plan.ios()
        trips = plan.trips()
        by_site = {s.index: s for s in plan.sites}
        for kind in ("read", "write"):
            assert sum(n for i, n in trips.items() if by_site[i].kind == kind) == sum(
                io.kind == kind for io in ios
            )
    assert sites == recorded
    assert [t for t, _, _ in calls].count("jaxoff_pager_begin") == len(recorders)


@pytest.fixture
def recorders(monkeypatch):
    """The `StepRecorder` of every step traced in the test, in order."""
    from jaxoff.optim import _transaction

    seen = []
    begin = _transaction.PageTransaction.begin

    def spy(self, version):
        rec = begin(self, version)
        seen.append(rec)
        return rec

    monkeypatch.setattr(_transaction.PageTransaction, "begin", spy)
    return seen


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_a_paged_step_lowers_the_four_targets_with_attributes_only(tmp_path, recorders, platform):
    params = params_tree()
    tx = paged(optax.adamw(1e-3), tmp_path / "s", chunk_bytes=CHUNK)
    state = tx.init(params)
    text = export_for(make_step(tx), platform, params, state, jnp.int32(0))
    check_lowered(text, recorders[-1:])
    tx.close()


def test_the_paged_step_plan_is_the_canonical_walk(tmp_path, recorders):
    """Per leaf, per chunk: each entry's chunk read, then each written; the RAM leaves last."""
    params = params_tree()
    tx = paged(optax.adam(1e-3), tmp_path / "s", chunk_bytes=CHUNK)
    state = tx.init(params)
    jax.jit(make_step(tx)).lower(params, state, jnp.int32(0))
    plan = chunk_updater(tx).plan(params)
    want = []
    for leaf in plan.leaves:
        names = [plan.entries[k].name for k in leaf.entries]
        for c in range(leaf.num_chunks):
            n = leaf.chunk_size(c)
            for kind in ("read", "write"):
                want += [(kind, name, c, n * plan.entries[k].storage.itemsize)
                         for k, name in zip(leaf.entries, names, strict=True)]  # fmt: skip
    want.append(("write", plan.ram_entry()[0], 0, plan.ram_nbytes))
    got = [(io.kind, io.entry, io.chunk, io.nbytes) for io in recorders[-1].plan.ios()]
    assert got == want
    tx.close()


def fuyou_setup(tmp_path, page_params):
    from flax import nnx

    from jaxoff.models.gpt import CONFIGS
    from jaxoff.step import TrainState
    from jaxoff.strategies.fuyou import fuyou_init, fuyou_resident, make_fuyou_step

    cfg = CONFIGS["tiny"]
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    tx = paged(optax.adamw(1e-3), tmp_path / "s", chunk_bytes=1 << 16)
    opt = fuyou_init(cfg, tx, params, page_params=page_params)
    state = TrainState(
        jnp.zeros((), jnp.int32), fuyou_resident(params) if page_params else params, opt
    )
    step = make_fuyou_step(graphdef, cfg, tx, page_params=page_params)
    return tx, state, step


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
@pytest.mark.parametrize("page_params", [False, True])
def test_a_fuyou_step_lowers_the_same_transaction(tmp_path, recorders, platform, page_params):
    tx, state, step = fuyou_setup(tmp_path, page_params)
    tokens = jnp.zeros((2, 16), jnp.int32)
    text = export_for(step, platform, state, tokens, tokens)
    check_lowered(text, recorders[-1:])
    tx.close()


# --- what a step does: counters, durability, versions -------------------------------------------


def test_each_step_takes_and_puts_its_plan_and_fsyncs_what_it_wrote(tmp_path, recorders):
    params = params_tree()
    tx = paged(optax.adamw(1e-3), tmp_path / "s", chunk_bytes=CHUNK)
    state = tx.init(params)
    step = jax.jit(make_step(tx))
    txn = tx.pager.txn
    before, syncs = txn.stats(), _ffi.file_sync_count()
    for t in range(3):
        params, state = step(params, state, jnp.int32(t))
    txn.settle()
    after = txn.stats()
    counts = recorders[-1].plan.counts()
    assert after["takes"] - before["takes"] == 3 * counts["read"]
    assert after["puts"] - before["puts"] == 3 * counts["write"]
    assert after["commits"] - before["commits"] == 3 and after["syncs"] - before["syncs"] == 3
    # every file a step wrote is fsynced before its commit: one file per entry and slot here
    written = {io.entry for io in recorders[-1].plan.ios() if io.kind == "write"}
    assert _ffi.file_sync_count() - syncs >= 3 * len(written)
    assert tx.store.version == int(state.version) == 4
    tx.close()


def _stepped(tmp_path, name, steps):
    """``steps`` paged steps from the same start: (params, state, tx)."""
    params = params_tree()
    tx = paged(optax.adamw(1e-3), tmp_path / name, chunk_bytes=CHUNK)
    state = tx.init(params)
    step = jax.jit(make_step(tx))
    for t in range(steps):
        params, state = step(params, state, jnp.int32(t))
    return params, state, tx


def _store_contents(root) -> dict:
    with PageStore.open(root) as store:
        store.verify()
        return {n: store.read(n) for n in store.entries} | {"#version": store.version}


def test_a_stale_state_is_refused_before_anything_is_read_or_written(tmp_path):
    params, state, tx = _stepped(tmp_path, "s", 2)
    step = jax.jit(make_step(tx))
    old = state._replace(version=state.version - 1)
    txn = tx.pager.txn
    txn.settle()
    before = txn.stats()
    with pytest.raises(jax.errors.JaxRuntimeError, match="the state is stale") as info:
        jax.block_until_ready(step(params, old, jnp.int32(2)))
    assert "describes version 2" in str(info.value) and "holds version 3" in str(info.value)
    after = txn.stats()
    assert (after["takes"], after["puts"]) == (before["takes"], before["puts"])
    assert after["stale_steps"] == before["stale_steps"] + 1
    params, state = step(params, state, jnp.int32(2))  # the current state still steps
    assert tx.store.version == 4
    tx.close()


def test_a_commit_that_fails_leaves_the_previous_version_readable(tmp_path, monkeypatch):
    """The manifest of step 3 cannot be written: that step does not count, the next step is
    refused saying why, and the store (reopened) is version 3, every chunk verified, equal to
    a run that made two steps."""
    params, state, tx = _stepped(tmp_path, "s", 2)
    tx.pager.txn.settle()
    original = PageStore.commit

    def full(self, crcs=None, **kw):
        raise PageStoreError(f"no space left to write the manifest of {self.root} (injected)")

    monkeypatch.setattr(PageStore, "commit", full)
    step = jax.jit(make_step(tx))
    params3, state3 = step(params, state, jnp.int32(2))  # runs; its commit fails behind it
    jax.block_until_ready((params3, state3))
    with pytest.raises(PageStoreError, match="injected"):
        tx.pager.txn.settle()
    monkeypatch.setattr(PageStore, "commit", original)
    with pytest.raises(jax.errors.JaxRuntimeError, match="the state is stale"):
        jax.block_until_ready(step(params3, state3, jnp.int32(3)))
    tx.close()
    _, _, ref = _stepped(tmp_path, "ref", 2)
    ref.close()
    got, want = _store_contents(tmp_path / "s"), _store_contents(tmp_path / "ref")
    assert got["#version"] == want["#version"] == 3
    for n in want:
        assert np.asarray(got[n]).tobytes() == np.asarray(want[n]).tobytes(), n


_KILLED_STEP = """
import sys
sys.path.insert(0, {tests!r})
import jax.numpy as jnp
from test_pager import _stepped
from pathlib import Path
_stepped(Path({root!r}), "s", {steps})
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("point", ["pager.put:1", "pager.put:9", "pager.take:5", "pager.commit:1"])
def test_a_kill_inside_a_step_leaves_the_previous_version(tmp_path, point):
    """SIGKILL inside the third step (counted from its first call): the store reopens at
    version 3 (init and two steps) or, killed once the step ended, 4, every chunk verified
    and equal to an uninterrupted run's."""
    name, n = point.split(":")
    plan = chunk_updater(paged(optax.adamw(1e-3), tmp_path / "p", chunk_bytes=CHUNK)).plan(
        params_tree()
    )
    reads = sum(len(leaf.entries) * leaf.num_chunks for leaf in plan.leaves)
    per_step = {"pager.put": reads + 1, "pager.take": reads, "pager.commit": 1}[name]
    assert int(n) <= per_step
    visit = 2 * per_step + int(n)  # that call of the third step
    code = _KILLED_STEP.format(tests=str(Path(__file__).parent), root=str(tmp_path), steps=3)
    env = dict(os.environ, JAXOFF_FAULT=f"{name}:{visit}")
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=HANG_S,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    got = _store_contents(tmp_path / "s")
    assert got["#version"] in ((3, 4) if name == "pager.commit" else (3,))
    steps = got["#version"] - 1
    _, _, ref = _stepped(tmp_path, "ref", steps)
    ref.close()
    want = _store_contents(tmp_path / "ref")
    for k in want:
        assert np.asarray(got[k]).tobytes() == np.asarray(want[k]).tobytes(), k


def _chunk_place(store, name: str, chunk: int) -> tuple[str, int]:
    """The page file and byte offset of chunk ``chunk`` of entry ``name``'s committed version."""
    store.wait_committed()  # the steps in flight have committed: the active slot is theirs
    slot = store.active_slot
    table = store.chunk_table(slot)
    e = list(store.entries).index(name)
    row = int(np.flatnonzero((table["entry"] == e) & (table["chunk"] == chunk))[0])
    return store.file_table()[int(table["file_id"][row])], int(table["offset"][row])


def test_a_corrupt_chunk_fails_the_take_that_needs_it(tmp_path):
    params, state, tx = _stepped(tmp_path, "s", 1)
    store = tx.store
    path, offset = _chunk_place(store, "opt.0.mu.w", 1)
    with open(path, "r+b") as f:
        f.seek(offset + 7)
        byte = f.read(1)
        f.seek(offset + 7)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(jax.jit(make_step(tx))(params, state, jnp.int32(1)))
    assert "checksum mismatch in " + path in str(info.value)
    assert isinstance(store_error_from(info.value), PageStoreCorruptError)
    tx.close()


def test_a_step_compiled_before_the_store_was_reopened_pages_through_the_new_pager(tmp_path):
    params, state, tx = _stepped(tmp_path, "s", 1)
    step = jax.jit(make_step(tx))
    params, state = step(params, state, jnp.int32(1))
    tx.close()  # the pager and its plans go
    state = tx.init(params)  # a new pager on the same table name, the plans registered again
    version = int(state.version)  # init writes the store's next version
    params, state = step(params, state, jnp.int32(2))  # compiled before: not traced again
    assert step._cache_size() == 1 and tx.store.version == version + 1 == int(state.version)
    tx.close()


def test_a_closed_store_is_reported_in_one_line(tmp_path):
    params, state, tx = _stepped(tmp_path, "s", 1)
    step = jax.jit(make_step(tx))
    jax.block_until_ready(step(params, state, jnp.int32(1)))
    tx.close()
    with pytest.raises(jax.errors.JaxRuntimeError, match="no pager is open") as info:
        jax.block_until_ready(step(params, state, jnp.int32(1)))
    assert "open it again" in str(info.value)


def test_paging_calls_outside_their_step_are_refused(tmp_path):
    """A take whose step was not begun (another plan's begin ran last) fails, naming both."""
    from jaxoff.aio import page_begin, page_commit, page_take

    params, state, tx = _stepped(tmp_path, "s", 1)
    table = tx.pager.table
    tx.pager.txn.settle()

    @jax.jit
    def rogue(version):
        tok = page_begin(table, 10_000, version)  # a plan never registered
        return page_commit(table, 10_000, tok)

    with pytest.raises(jax.errors.JaxRuntimeError, match="not registered"):
        jax.block_until_ready(rogue(state.version))

    @jax.jit
    def stray():
        x, tok = page_take(table, 77, 0, jnp.zeros((), jnp.int32), shape=(4,), dtype=jnp.float32)
        return x

    with pytest.raises(jax.errors.JaxRuntimeError, match="take"):
        jax.block_until_ready(stray())
    tx.close()


def test_a_traced_step_of_the_wrong_size_is_refused_at_trace_time(tmp_path):
    from jaxoff.optim._transaction import PagedTable
    from jaxoff.optim.chunks import PageTransaction

    txn = PageTransaction.open(tmp_path / "t", {"w": ((1024,), np.float32)}, chunk_bytes=CHUNK,
                               table=PagedTable("test"))  # fmt: skip
    txn.write_initial([("w", 0, np.ones(1024, np.float32))])

    def step(version):
        rec = txn.begin(version)
        x = rec.take(lambda env: ("w", 0), (512,), jnp.float32)  # half a chunk
        rec.put(lambda env: ("w", 0), jnp.concatenate([x, x]))
        rec.commit()
        return version + 1

    with pytest.raises(PageStoreError, match="512 .*|2048 bytes"):
        jax.jit(step).lower(jnp.int32(1))
    txn.close()

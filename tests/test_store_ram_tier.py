"""The page store's RAM tier (``--host-mem``): its first entries in host memory (a tmpfs), the
rest on disk, one store with the same checksums and commits; equal bit for bit to a store
all on disk, resumable, refused in one line where it cannot be had, and counted by the
planner."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_paged import OPTIMIZERS, assert_trees_equal, batch, make_step, mlp_params

from jaxoff.aio import PageStore, PageStoreError, PageStoreFullError
from jaxoff.aio._hostmem import HostMemLimits
from jaxoff.aio._layout import plan_layout
from jaxoff.aio._ramtier import ENV_DIR, check_ram_tier, filesystem_type, ram_tier_dir
from jaxoff.aio._store_files import owned_files, remove_owned
from jaxoff.optim import paged


@pytest.fixture
def ram_base(monkeypatch):
    """A folder of this test's own on the machine's tmpfs, as ``$JAXOFF_HOST_MEM_DIR``."""
    base = tempfile.mkdtemp(prefix="jaxoff-test-", dir="/dev/shm")
    monkeypatch.setenv(ENV_DIR, base)
    yield Path(base)
    shutil.rmtree(base, ignore_errors=True)


ENTRIES = {"a": ((1000,), "float32"), "b": ((5000,), "float32"), "c": ((100,), "float32")}


def test_entries_go_to_ram_in_order_while_they_fit():
    layout = plan_layout(ENTRIES, chunk_bytes=4096, ram_bytes=3 * 8192, ram_dir="/dev/shm/x")
    # a: 1 chunk (2 slots: 8 KiB) fits; b: 5 chunks do not; c: 1 chunk fits after a
    assert [e.ram for e in layout.entries] == [True, False, True]
    assert layout.ram_bytes == 2 * 8192
    assert layout.relpath("a", "B", 0) == "/dev/shm/x/a.B.page"
    assert layout.relpath("b", "B", 0) == os.path.join("data", "b.B.page")
    assert plan_layout(ENTRIES, chunk_bytes=4096).ram_dir is None
    with pytest.raises(PageStoreError, match="absolute directory"):
        plan_layout(ENTRIES, chunk_bytes=4096, ram_bytes=4096, ram_dir="relative")


def test_a_store_with_a_ram_tier_reopens_with_it_and_removes_its_files(tmp_path, ram_base):
    root = tmp_path / "s"
    layout = plan_layout(ENTRIES, chunk_bytes=4096, ram_bytes=1 << 20, ram_dir=ram_tier_dir(root))
    assert all(e.ram for e in layout.entries)
    store = PageStore.create(root, layout)
    for name, (shape, _) in ENTRIES.items():
        store.write(name, np.arange(shape[0], dtype=np.float32))
    store.commit()
    store.close()
    ram = Path(ram_tier_dir(root))
    assert ram.parent == ram_base and sorted(p.name for p in ram.iterdir()) == sorted(
        f"{n}.{s}.page" for n in ENTRIES for s in "AB"
    )
    assert not list((root / "data").glob("*.page")) if (root / "data").exists() else True
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["ram_dir"] == str(ram) and all(e["ram"] for e in manifest["entries"].values())
    store = PageStore.open(root)  # the layout comes back from the manifest, tier included
    assert store.layout == layout
    np.testing.assert_array_equal(store.read("b"), np.arange(5000, dtype=np.float32))
    store.close()
    remove_owned(str(root), owned_files(str(root)))
    assert not ram.exists()  # its files and its folder: jaxoff's own


def test_a_damaged_ram_page_is_caught_by_its_checksum(tmp_path, ram_base):
    root = tmp_path / "s"
    layout = plan_layout(ENTRIES, chunk_bytes=4096, ram_bytes=1 << 20, ram_dir=ram_tier_dir(root))
    store = PageStore.create(root, layout)
    for name, (shape, _) in ENTRIES.items():
        store.write(name, np.ones(shape, np.float32))
    store.commit()
    path = Path(ram_tier_dir(root)) / f"a.{store.active_slot}.page"
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(PageStoreError, match="a"):
        store.read("a")
    store.close()


def test_a_tier_off_host_memory_or_too_large_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    root = tmp_path / "s"
    on_disk = tmp_path / "not-ram"
    monkeypatch.setenv(ENV_DIR, str(on_disk))
    assert filesystem_type(str(tmp_path)) not in ("tmpfs", "ramfs") or pytest.fail(
        "tmp_path is on a tmpfs here: this case needs a disk folder"
    )
    tx = paged(OPTIMIZERS["adamw"](), root, chunk_bytes=4096, host_mem=1 << 20)
    with pytest.raises(PageStoreError) as e:
        tx.init(mlp_params(jnp.bfloat16))
    assert "not in host memory (tmpfs)" in str(e.value) and "\n" not in str(e.value)
    assert not root.exists() and not on_disk.exists()
    layout = plan_layout(
        ENTRIES, chunk_bytes=4096, ram_bytes=1 << 20, ram_dir="/dev/shm/jaxoff-never-made"
    )
    with pytest.raises(PageStoreFullError) as e:
        check_ram_tier(layout, str(root), limits=HostMemLimits(mem_available=1 << 20))
    msg = str(e.value)
    assert "RAM tier (`host_mem`) needs" in msg and "MemAvailable" in msg
    assert "lower `host_mem`" in msg
    assert "\n" not in msg and not os.path.exists("/dev/shm/jaxoff-never-made")


def test_files_of_others_in_the_tier_folder_are_refused(tmp_path, ram_base):
    root = tmp_path / "s"
    ram = Path(ram_tier_dir(root))
    ram.mkdir()
    (ram / "notes.txt").write_text("mine")
    tx = paged(OPTIMIZERS["adamw"](), root, chunk_bytes=4096, host_mem=1 << 20)
    with pytest.raises(PageStoreError, match="did not write"):
        tx.init(mlp_params(jnp.bfloat16))
    assert (ram / "notes.txt").read_text() == "mine" and sorted(os.listdir(ram)) == ["notes.txt"]


def _run(root, host_mem, steps=4):
    tx = paged(OPTIMIZERS["adamw"](), root, chunk_bytes=4096, host_mem=host_mem)
    params = mlp_params(jnp.bfloat16)
    state = tx.init(params)
    step = make_step(tx, jnp.bfloat16, fused=True)
    for t in range(steps):
        params, state = step(params, state, *batch(t))
    jax.block_until_ready(params)
    contents = {n: tx.store.read(n) for n in tx.store.entries}
    layout = tx.store.layout
    tx.close()
    return params, contents, layout


def test_the_paged_optimizer_with_a_ram_tier_is_bitwise_the_one_on_disk(tmp_path, ram_base):
    want, want_store, disk_layout = _run(tmp_path / "disk", 0)
    got, got_store, layout = _run(tmp_path / "ram", 40 << 10)
    assert 0 < sum(e.ram for e in layout.entries) < len(layout.entries)  # both tiers in use
    assert not any(e.ram for e in disk_layout.entries)
    assert_trees_equal(got, want)
    assert got_store.keys() == want_store.keys()
    for name in want_store:
        np.testing.assert_array_equal(got_store[name], want_store[name])


def _train_config(out, **over):
    from jaxoff.train import TrainConfig

    return TrainConfig(
        model="tiny",
        batch_size=2,
        seq_len=16,
        steps=6,
        lr=3e-3,
        warmup_steps=1,
        eval_every=0,
        ckpt_every=2,
        chunk_mib=1,
        progress=False,
        compile_cache="none",
        out_dir=out,
        **over,
    )


def _final_params(out: Path):
    import orbax.checkpoint as ocp

    last = max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    return ocp.StandardCheckpointer().restore(out / "checkpoints" / str(last) / "default")["params"]


def test_train_host_mem_is_bitwise_and_resumes_with_another_budget(tmp_path, ram_base):
    from jaxoff.train import train

    plain = train(_train_config(tmp_path / "plain"))
    tiered = _train_config(tmp_path / "tier", host_mem="8MiB", stop_at=4)
    first = train(tiered)
    tier_dir = Path(ram_tier_dir(tmp_path / "tier" / "store"))
    assert any(tier_dir.glob("*.page")), "no page of the store lives in host memory"
    # resumed with another budget: the restore moves every page to its new tier
    rest = train(dataclasses.replace(tiered, host_mem="0", stop_at=0, resume=True))
    assert first.losses + rest.losses == plain.losses
    assert_trees_equal(_final_params(tmp_path / "tier"), _final_params(tmp_path / "plain"))
    assert not tier_dir.exists()  # every page back on disk, the tier's folder removed
    with pytest.raises(Exception, match="--host-mem must be a size"):
        _train_config(tmp_path / "bad", host_mem="lots").validate()


def test_the_planner_keeps_the_paged_state_in_the_host_memory_it_leaves_free():
    from jaxoff.models.gpt import CONFIGS
    from jaxoff.plan import Plan, evaluate, preset, profile
    from jaxoff.plan._planfile import PlanFile, prediction_json, train_homes

    prof = profile(CONFIGS["tiny"], 4, 32, model="tiny", calibrate=False)
    acts = tuple((n.name, "device" if n.fixed else "remat") for n in prof.names)
    plan = Plan(acts, "device", "nvme")
    roomy = preset("rtx4090")
    tight = roomy.with_budgets(host_mem=1.0)
    free = evaluate(prof, roomy, plan)
    none = evaluate(prof, tight, plan)
    assert none.ram_tier_bytes == 0 and none.disk_bytes == prof.opt_bytes
    assert free.ram_tier_bytes == prof.opt_bytes and free.disk_bytes == 0
    assert free.host_bytes == none.host_bytes + prof.opt_bytes
    assert free.optimizer_s <= none.optimizer_s
    pf = PlanFile("tiny", {}, 4, 32, plan, roomy.to_json(), prediction_json(free), None)
    assert train_homes(pf)[0]["host_mem"] == str(prof.opt_bytes)
    pf = dataclasses.replace(pf, prediction=prediction_json(none))
    assert "host_mem" not in train_homes(pf)[0]

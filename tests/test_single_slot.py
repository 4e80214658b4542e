"""jaxoff.paged with a single-slot page store (``slots=1``): in-place updates, half the disk."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _limits import HANG_S

from jaxoff.aio import PageStoreTornError
from jaxoff.optim import load_state, paged, restore_paged

sys.path.insert(0, os.path.dirname(__file__))
from test_paged import OPTIMIZERS, assert_trees_equal, mlp_params  # noqa: E402
from test_paged_processes import _steps, _store_bytes  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_single_slot_is_bitwise_the_two_slot_run_on_half_the_disk(tmp_path):
    runs = {}
    for slots in (1, 2):
        tx = paged(OPTIMIZERS["adamw"](), tmp_path / f"s{slots}", chunk_bytes=4096, slots=slots)
        p0 = mlp_params(jnp.bfloat16)
        params, state = _steps(tx, p0, tx.init(p0), 0, 6)
        runs[slots] = (params, _store_bytes(tx), tx.store._files.disk_bytes(), tx.store.version)
        assert tx.store.layout.slots == slots
        tx.close()
    assert_trees_equal(runs[1][0], runs[2][0])
    assert runs[1][1] == runs[2][1]
    assert runs[1][3] == runs[2][3] == 7
    assert runs[1][2] * 2 == runs[2][2]  # page files, without the manifest


@pytest.mark.subprocess
def test_crash_mid_update_of_a_single_slot_store_resumes_from_the_checkpoint(tmp_path):
    root, ckpt = tmp_path / "store", tmp_path / "ckpt"
    script = f"""
        import os, signal, sys
        sys.path.insert(0, {TESTS!r})
        import jax, jax.numpy as jnp, numpy as np
        from jaxoff.aio import PageStore
        from jaxoff.optim import paged, save_paged
        from test_paged import OPTIMIZERS, batch, make_step, mlp_params
        tx = paged(OPTIMIZERS["adamw"](), {str(root)!r}, chunk_bytes=4096, slots=1)
        params = mlp_params(jnp.bfloat16)
        state = tx.init(params)
        step = make_step(tx, jnp.bfloat16, fused=True)
        for t in range(3):
            params, state = step(params, state, *batch(t))
        save_paged(tx, state, {str(ckpt / "paged")!r})
        np.save({str(ckpt / "params.npy")!r},
                np.array([np.asarray(x).view(np.uint16) for x in jax.tree.leaves(params)],
                         dtype=object), allow_pickle=True)
        # step 4 overwrites every chunk in place, then dies before its commit
        PageStore.commit = lambda self, crcs=None, **kw: os.kill(os.getpid(), signal.SIGKILL)
        params, state = step(params, state, *batch(3))
        jax.block_until_ready(state)
        print("NOT KILLED")
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert out.returncode == -9, out.stdout + out.stderr
    tx = paged(OPTIMIZERS["adamw"](), root, chunk_bytes=4096, slots=1)
    p_shape = mlp_params(jnp.bfloat16)
    with pytest.raises(PageStoreTornError, match="restore from the last checkpoint"):
        load_state(tx, p_shape)  # the committed step 3 was overwritten: the store says so
    saved = np.load(ckpt / "params.npy", allow_pickle=True)
    leaves, treedef = jax.tree.flatten(p_shape)
    params = jax.tree.unflatten(
        treedef,
        [jnp.asarray(s.view(x.dtype)).reshape(x.shape) for s, x in zip(saved, leaves, strict=True)],
    )
    state = restore_paged(tx, ckpt / "paged", params)  # re-creates the torn store
    resumed, _ = _steps(tx, params, state, 3, 6)
    tx_ref = paged(OPTIMIZERS["adamw"](), tmp_path / "ref", chunk_bytes=4096)
    p0 = mlp_params(jnp.bfloat16)
    want, _ = _steps(tx_ref, p0, tx_ref.init(p0), 0, 6)
    assert_trees_equal(resumed, want)
    assert _store_bytes(tx) == _store_bytes(tx_ref)
    tx.close()
    tx_ref.close()


def test_trainer_passes_store_slots_to_the_paged_optimizer(tmp_path):
    from jaxoff.train import TrainConfig

    for slots in (1, 2):
        cfg = TrainConfig(model="tiny", store_slots=slots, out_dir=tmp_path / "out").validate()
        tx = cfg.build_optimizer()
        assert tx.pager.slots == slots

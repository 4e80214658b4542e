"""Tests that need a CUDA device (marker ``gpu``); skipped, with the reason, everywhere else.

Run them on a GPU machine with JAX's GPU backend enabled (conftest.py defaults JAX_PLATFORMS to
cpu):

    JAX_PLATFORMS=cuda,cpu python -m pytest -m gpu tests/test_gpu.py -rsx

What they check: the CUDA pager (``jaxoff._ffi_cuda``: the four ``jaxoff_pager_*`` targets)
round-trips bytes and checksums through a paging transaction jitted for the GPU, its copies
crossing PCIe on the pager's own streams; a flipped byte fails the take that needs it; a
pinned arena the host cannot give fails the pager's opening in one line; the paged AdamW step
on the GPU equals plain optax on the GPU (bitwise, leaf by leaf, as tests/test_paged.py does
on CPU); host placement lowers the device's peak memory; layer streaming keeps at most
``w + 1`` layers of parameters on the device. Memory figures come from
``device.memory_stats()["peak_bytes_in_use"]`` of a child process per measurement
(``bench/gpu.py probe``), since the peak cannot be reset within a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _limits import HANG_S

from jaxoff.aio import PageStoreCorruptError, cuda_status, store_error_from
from jaxoff.aio._ffi_calls import register_file_table, register_targets, unregister_file_table
from jaxoff.aio._pager import (
    PAGER_TARGETS,
    Pager,
    PagerConfig,
    owner_name,
    page_begin,
    page_commit,
)
from jaxoff.optim import paged
from jaxoff.optim._transaction import PagedTable, PageTransaction

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_pager_io import assert_store_holds, chunk_place, flip_byte, initial, swap_step  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROBE = [str(ROOT / "bench" / "gpu.py"), "probe"]


def _no_gpu_reason() -> str | None:
    try:
        if jax.devices("gpu"):
            return None
        why = "jax.devices('gpu') is empty"
    except RuntimeError as e:
        why = str(e).splitlines()[0]
    return (
        f"no CUDA device: {why} (JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r}; "
        f"on a GPU machine run with JAX_PLATFORMS=cuda,cpu)"
    )


NO_GPU = _no_gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=NO_GPU or "")]


@pytest.fixture
def gpu():
    dev = jax.devices("gpu")[0]
    with jax.default_device(dev):
        yield dev


def test_cuda_paging_targets_registered(gpu):
    s = cuda_status()
    assert s.built and s.importable, s.reason
    register_targets()
    text = (
        jax.jit(lambda v: page_commit("unused", 1, page_begin("unused", 1, v)))
        .lower(jnp.int32(0))
        .as_text()
    )
    assert "@jaxoff_pager_begin(" in text and "@jaxoff_pager_commit(" in text
    s = cuda_status()
    assert s.gpu_backend and s.registered, s
    assert s.targets == tuple(sorted(PAGER_TARGETS))
    assert s.runtime["device_count"] >= 1 and not s.runtime["error"], s.runtime


@pytest.mark.parametrize(
    "dtype, n",
    [(jnp.float32, 1), (jnp.float32, 3_000_001), (jnp.bfloat16, 4096 * 7 + 3), (jnp.int8, 12345)],
)
def test_a_transaction_round_trips_chunks_through_the_cuda_pager(gpu, tmp_path, dtype, n):
    """Every chunk taken into GPU memory and put back from it, bitwise; the checksums the
    pager hands the store are the bytes' crc32c (as the CPU's); every byte read crossed to
    the device and every byte written back, on the pager's own copy streams."""
    rng = np.random.default_rng(n)
    x0 = np.asarray(jnp.asarray(rng.standard_normal(n) * 50).astype(dtype))
    x1 = np.asarray(jnp.asarray(rng.standard_normal(n) * 50).astype(dtype))
    txn = PageTransaction.open(tmp_path / "s", {"w": ((n,), x0.dtype)}, chunk_bytes=4 << 20,
                               table=PagedTable("test.gpu"))  # fmt: skip
    try:
        assert txn.pager.platform == "cuda"
        initial(txn, {"w": x0})
        step = swap_step(txn)
        text = step.lower(jnp.int32(1), {"w": x1}).as_text()
        assert "@jaxoff_pager_take(" in text and "@jaxoff_pager_out(" in text
        before = txn.stats()
        version, got = step(jnp.int32(1), {"w": x1})
        assert got["w"].devices() == {gpu}
        assert np.asarray(got["w"]).tobytes() == x0.tobytes()
        txn.settle()
        assert txn.store.version == int(version) == 2
        assert_store_holds(txn, {"w": x1})  # bytes and crc32c of every chunk
        version, got = step(version, {"w": x0})  # reads what the GPU wrote
        assert np.asarray(got["w"]).tobytes() == x1.tobytes()
        txn.settle()
        after = txn.stats()
        assert after["h2d_bytes"] - before["h2d_bytes"] == 2 * x0.nbytes
        assert after["d2h_bytes"] - before["d2h_bytes"] == 2 * x0.nbytes
        assert after["commits"] - before["commits"] == 2
    finally:
        txn.close()


def test_checksum_mismatch_on_gpu_is_data_loss(gpu, tmp_path):
    x = np.arange(5000, dtype=np.float32)
    txn = PageTransaction.open(tmp_path / "s", {"w": ((5000,), np.float32)},
                               chunk_bytes=32 << 10, table=PagedTable("test.gpu"))  # fmt: skip
    try:
        initial(txn, {"w": x})
        path, offset, _ = chunk_place(txn.store, "w", 0)
        flip_byte(path, offset + 100)
        with pytest.raises(jax.errors.JaxRuntimeError) as e:
            jax.block_until_ready(swap_step(txn)(jnp.int32(1), {"w": -x}))
        msg = str(e.value)
        assert "DATA_LOSS" in msg and f"checksum mismatch in {path} at offset {offset}" in msg
        assert isinstance(store_error_from(e.value), PageStoreCorruptError)
        assert txn.store.version == 1
    finally:
        txn.close()


def test_a_pinned_arena_the_host_cannot_give_fails_the_pager_in_one_line(gpu, tmp_path):
    """A GPU pager allocates its pinned arena when it opens: one the host cannot give (4 TiB
    here) fails the opening at once, in one line naming the CUDA call, and leaves no pager
    open."""
    from jaxoff.aio import _cuda

    table = owner_name("test.gpu")
    registration = register_file_table(table, [str(tmp_path / "a.page")])
    try:
        with pytest.raises(RuntimeError) as e:
            Pager(table, version=0, crcs=[], commit=lambda v, rows: None,
                  config=PagerConfig(slot_bytes=1 << 42, arena_slots=1, ring_slots=1,
                                     write_slots=1))  # fmt: skip
        msg = str(e.value)
        assert "\n" not in msg
        assert "cudaHostAlloc failed" in msg, msg
        assert table not in _cuda.module().pager_tables()
    finally:
        unregister_file_table(table, registration)


def test_paged_adamw_step_on_gpu_is_bitwise_plain_optax_leaf_by_leaf(gpu, tmp_path):
    """tests/test_paged.py's equivalence, with the step jitted for the GPU: the paged update
    (state in page files, chunks through the CUDA pager) against plain optax applied leaf by
    leaf on materialised gradients, also on the GPU."""
    from test_paged import (
        OPTIMIZERS,
        assert_trees_equal,
        check_store,
        mlp_params,
        run,
        run_reference,
    )

    inner = OPTIMIZERS["adamw"]()
    tx = paged(inner, tmp_path / "s", chunk_bytes=4096)
    want, ref_master, ref_moments = run_reference(inner, mlp_params(), 20)
    got, state, step = run(tx, mlp_params(), 20, fused=True)
    assert {d.platform for x in jax.tree.leaves(got) for d in x.devices()} == {"gpu"}
    txn = tx.pager.txn
    assert txn.pager.platform == "cuda"
    txn.settle()
    stats = txn.stats()
    assert stats["commits"] == 20 and stats["h2d_bytes"] > 0 and stats["d2h_bytes"] > 0
    assert_trees_equal(got, want)
    assert check_store(tx, got, ref_master, ref_moments) == 10
    assert step._cache_size() == 1
    tx.close()


def probe(**kw) -> dict:
    """One ``bench/gpu.py probe`` measurement in a child process (its own peak)."""
    args = [sys.executable, *PROBE]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=HANG_S, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    if not rec["ok"] and HOST_COMPUTE_REFUSED in rec.get("error", ""):
        # jaxoff.placement.compile_placed's ConfigError: this XLA does not compile the update
        # as host computation (JAX 0.11.2 on an H100 and an H200; docs/guide/gpu.md). Any other
        # failure fails the test.
        pytest.xfail(f"JAX {jax.__version__}: {rec['error'][:400]}")
    assert rec["ok"], rec
    assert rec["platform"] == "gpu" and rec["peak_bytes_in_use"], rec
    return rec


SIZE = dict(d_model=1024, seq_len=128, batch_size=4, steps=3, policy="full")
HOST_COMPUTE_REFUSED = "XLA could not compile the optimizer update as host computation"


def test_host_placement_lowers_device_peak():
    device = probe(placement="device", layers=8, **SIZE)
    host_opt = probe(placement="host_opt", layers=8, **SIZE)
    host_params = probe(placement="host_params", layers=8, **SIZE)
    moments = 2 * device["param_bytes"]  # AdamW's mu and nu, float32
    # The moments left the device (at least half of them, whatever XLA's temporaries).
    assert host_opt["peak_bytes_in_use"] <= device["peak_bytes_in_use"] - moments // 2, (
        host_opt["peak_bytes_in_use"],
        device["peak_bytes_in_use"],
        moments,
    )
    assert host_params["peak_bytes_in_use"] <= device["peak_bytes_in_use"] - moments // 2
    # Same numbers: placement moves bytes, not arithmetic.
    assert host_opt["losses"] == device["losses"]
    assert host_params["losses"] == device["losses"]


@pytest.mark.parametrize("window", [1, 2])
def test_streaming_keeps_at_most_window_plus_one_layers_on_device(window):
    lb = None
    streamed = {}
    for layers in (4, 8):
        streamed[layers] = probe(placement=f"host_params_stream{window}", layers=layers, **SIZE)
        lb = streamed[layers]["layer_param_bytes"]
    whole = {layers: probe(placement="host_params", layers=layers, **SIZE) for layers in (4, 8)}
    peak = lambda r: r["peak_bytes_in_use"]
    # Control: without streaming, four more layers put at least their parameters on the device.
    assert peak(whole[8]) - peak(whole[4]) >= int(0.9 * 4 * lb), (peak(whole[8]), peak(whole[4]))
    # Streaming: four more layers add only their saved block inputs (B*T*d each), < 1 layer.
    assert peak(streamed[8]) - peak(streamed[4]) < lb, (peak(streamed[8]), peak(streamed[4]), lb)
    # The run that holds all 8 layers needs at least (8 - (w + 1)) layers more than the window.
    assert peak(whole[8]) - peak(streamed[8]) >= int(0.9 * (8 - (window + 1)) * lb)
    assert streamed[8]["losses"] == whole[8]["losses"]


def test_fuyou_pages_optimizer_and_block_parameters_off_the_device():
    """The instrumented loop's pair of modes (bench/_common/step_loop.py) on the GPU: Fuyou with
    the AdamW state and the block parameters in a page store (read a layer ahead through the
    CUDA paging calls) against the same bf16 model with fp32 masters and moments on the device.
    Fuyou's device peak leaves out at least half of what it pages (fp32 masters and two moments
    of the blocks, 12 bytes a parameter), and it trains the same steps to the same losses up to
    rounding. Both update with optax's AdamW on the GPU (Fuyou chunk by chunk; the fused C++
    AdamW is a CPU-only target); the rounding differs because Fuyou differentiates layer by
    layer with its own VJP where plain-bf16 takes jax.value_and_grad of the whole model, then
    rounds to bf16 parameters."""
    size = dict(layers=4, d_model=512, seq_len=256, batch_size=4, steps=10)
    plain = probe(bench_mode="plain-bf16", **size)
    fuyou = probe(bench_mode="fuyou-nvme", **size)
    block_params = 4 * 12 * 512 * 512  # attention 4 d^2 + MLP 8 d^2 per layer
    paged_bytes = 12 * block_params
    assert fuyou["peak_bytes_in_use"] <= plain["peak_bytes_in_use"] - paged_bytes // 2, (
        fuyou["peak_bytes_in_use"],
        plain["peak_bytes_in_use"],
        paged_bytes,
    )
    assert fuyou["loss_falling"] and plain["loss_falling"]
    np.testing.assert_allclose(fuyou["losses"], plain["losses"], rtol=1e-3)

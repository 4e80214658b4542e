"""Tests that need a CUDA device (marker ``gpu``); skipped, with the reason, everywhere else.

Run them on a GPU machine with JAX's GPU backend enabled (conftest.py defaults JAX_PLATFORMS to
cpu):

    JAX_PLATFORMS=cuda,cpu python -m pytest -m gpu tests/test_gpu.py -rsx

What they check: the CUDA paging handlers round-trip bytes and checksums inside a step jitted
for the GPU; the paged AdamW step on the GPU equals plain optax on the GPU (bitwise, leaf by
leaf, as tests/test_paged.py does on CPU); host placement lowers the device's peak memory;
layer streaming keeps at most ``w + 1`` layers of parameters on the device. Memory figures
come from ``device.memory_stats()["peak_bytes_in_use"]`` of a child process per measurement
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

from jaxoff.aio import cuda_status
from jaxoff.aio._engine import EngineConfig
from jaxoff.aio._ffi_calls import (
    new_token,
    page_flush,
    page_in,
    page_out,
    page_prefetch,
    page_take,
    register_file_table,
    unregister_file_table,
)
from jaxoff.optim import paged

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


@pytest.fixture
def table(tmp_path):
    name = f"gpu_{os.getpid()}_{id(tmp_path)}"
    register_file_table(
        name, [tmp_path / "a.page", tmp_path / "b.page"], config=EngineConfig(pool_bytes=64 << 20)
    )
    yield name
    unregister_file_table(name)


def test_cuda_paging_targets_registered(gpu):
    s = cuda_status()
    assert s.built and s.importable, s.reason
    new_token()  # registration happens with the first paging call
    jax.jit(lambda x: page_flush("unused", x)).lower(new_token())
    s = cuda_status()
    assert s.gpu_backend and s.registered, s
    assert s.runtime["device_count"] >= 1 and not s.runtime["error"], s.runtime


@pytest.mark.parametrize(
    "dtype, n",
    [(jnp.float32, 1), (jnp.float32, 3_000_001), (jnp.bfloat16, 4096 * 7 + 3), (jnp.int8, 12345)],
)
def test_page_out_in_roundtrip_on_gpu(gpu, table, dtype, n):
    x = jnp.asarray(np.random.default_rng(n).standard_normal(n) * 50).astype(dtype)
    slot = -(-x.nbytes // 4096) * 4096

    @jax.jit
    def roundtrip(x):
        crc, tok = page_out(table, 0, 0, x, new_token())
        crc2, tok = page_out(table, 1, slot, x + 1, tok, write_behind=True)
        y, tok = page_in(table, 0, 0, crc, tok, shape=x.shape, dtype=x.dtype)
        ticket = page_prefetch(table, 1, slot, crc2, tok, shape=x.shape, dtype=x.dtype)
        z, tok = page_take(table, ticket, tok, shape=x.shape, dtype=x.dtype)
        return y, z, crc, page_flush(table, tok)

    assert "jaxoff_page_in" in roundtrip.lower(x).as_text()
    y, z, crc, _ = roundtrip(x)
    assert y.devices() == {gpu} and z.devices() == {gpu}
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(z), np.asarray(x + 1))
    # The crc is the bytes' crc32c (taken on the host), as the CPU handlers compute it.
    import crc32c as crc32c_pkg

    assert int(crc) == crc32c_pkg.crc32c(np.asarray(x).tobytes())


def test_checksum_mismatch_on_gpu_is_data_loss(gpu, table):
    x = jnp.arange(5000.0, dtype=jnp.float32)
    crc, _ = jax.jit(lambda x: page_out(table, 0, 0, x, new_token()))(x)
    bad = jnp.uint32((int(crc) + 1) & 0xFFFFFFFF)
    read = jax.jit(lambda c: page_in(table, 0, 0, c, new_token(), shape=x.shape, dtype=x.dtype)[0])
    with pytest.raises(Exception, match="checksum mismatch") as e:
        read(bad).block_until_ready()
    assert "DATA_LOSS" in str(e.value)


def test_pinned_staging_refused_is_one_clear_error(tmp_path):
    """A GPU without page-locked memory to spare: the call fails at once naming the bytes
    asked and what to do (simulated with the cap JAXOFF_CUDA_PINNED_MAX_BYTES), no hang."""
    code = f"""
import jax, jax.numpy as jnp
from jaxoff.aio._ffi_calls import register_file_table, page_out, new_token
register_file_table("t", [{str(tmp_path / "a.page")!r}])
x = jnp.zeros(16 << 20, jnp.float32)  # 64 MiB, above the 8 MiB cap
try:
    jax.jit(lambda x: page_out("t", 0, 0, x, new_token()))(x)[0].block_until_ready()
except Exception as e:
    print("ERR", str(e).splitlines()[-1] if str(e) else e)
"""
    env = dict(os.environ, JAXOFF_CUDA_PINNED_MAX_BYTES=str(8 << 20))
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_S
    )
    assert "ERR" in r.stdout, r.stdout + r.stderr
    assert "page-locked staging would exceed JAXOFF_CUDA_PINNED_MAX_BYTES" in r.stdout


def test_paged_adamw_step_on_gpu_is_bitwise_plain_optax_leaf_by_leaf(gpu, tmp_path):
    """tests/test_paged.py's equivalence, with the step jitted for the GPU: the paged update
    (state in page files, chunks through the CUDA handlers) against plain optax applied leaf
    by leaf on materialised gradients, also on the GPU."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
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
    """bench/capacity.py's pair of modes on the GPU: Fuyou with the AdamW state and the block
    parameters in a page store (read a layer ahead through the CUDA paging calls) against the
    same bf16 model with fp32 masters and moments on the device. Fuyou's device peak leaves
    out at least half of what it pages (fp32 masters and two moments of the blocks, 12 bytes a
    parameter), and it trains the same steps to the same losses up to rounding. Both update with
    optax's AdamW on the GPU (Fuyou chunk by chunk; the fused C++ AdamW is a CPU-only target);
    the rounding differs because Fuyou differentiates layer by layer with its own VJP where
    plain-bf16 takes jax.value_and_grad of the whole model, then rounds to bf16 parameters."""
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

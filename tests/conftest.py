"""A strict test environment: 4 fake CPU devices and warnings as errors (pyproject.toml).

Strict dtype promotion is not enabled: flax.nnx.LayerNorm itself promotes bfloat16
with float32 (flax 0.12.8), so bfloat16 models cannot run under it.
"""

import os
import sys

# tests.byom_model (a model outside models/) is imported as a user's package would be: from
# the repository root, in xdist workers and child processes too
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole run, shared by the xdist workers and every
# child process the tests start: most tests compile the same few train steps of the same tiny
# models, and a cached executable is the one XLA would compile again (the key covers the
# program, the jax/jaxlib versions and the XLA flags). JAXOFF_TEST_COMPILE_CACHE=0 turns it off.
if os.environ.get("JAXOFF_TEST_COMPILE_CACHE", "1") != "0":
    os.environ.setdefault(
        "JAX_COMPILATION_CACHE_DIR", os.path.join(ROOT, ".pytest_cache", "jax-compile")
    )
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402


@pytest.fixture
def tiny_train_args(tmp_path):
    """Keyword arguments of a TrainConfig that trains in a couple of seconds."""
    return dict(
        model="tiny",
        batch_size=4,
        seq_len=32,
        steps=12,
        eval_every=0,
        ckpt_every=0,
        progress=False,
        store="none",
        out_dir=tmp_path / "run",
    )

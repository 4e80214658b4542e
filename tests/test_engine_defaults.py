"""Engine defaults sized from the host's cores (a GPU host gets more workers, deeper queues)."""

import doctest

import pytest

from jaxoff.aio import _engine
from jaxoff.aio._engine import EngineConfig, sized_for_cores, usable_cores


def test_two_cores_keep_the_values_cpu_results_were_measured_with():
    # The CPU box (2 cores) must keep today's engine exactly, so no CPU result moves.
    assert sized_for_cores(2) == dict(
        threads=2, queue_depth=8, block_size=1 << 20, pool_bytes=16 << 20
    )
    assert sized_for_cores(1) == sized_for_cores(2)


@pytest.mark.parametrize(
    "cores, threads, depth, block",
    [
        (4, 2, 8, 1 << 20),
        (8, 4, 16, 1 << 20),
        (16, 8, 32, 4 << 20),
        (32, 16, 64, 4 << 20),
        (192, 16, 64, 4 << 20),
    ],
)
def test_gpu_hosts_get_more_workers_and_deeper_queues(cores, threads, depth, block):
    d = sized_for_cores(cores)
    assert (d["threads"], d["queue_depth"], d["block_size"]) == (threads, depth, block)
    assert d["pool_bytes"] == max(16 << 20, block * depth)
    EngineConfig(**d)  # every size is a valid config


@pytest.mark.parametrize("cores", [0, -1, 2.0, True, None])
def test_bad_core_count_is_refused(cores):
    with pytest.raises(ValueError, match="cores="):
        sized_for_cores(cores)


def test_default_config_is_the_one_sized_for_this_machine():
    d = sized_for_cores(usable_cores())
    c = EngineConfig()
    assert (c.threads, c.queue_depth, c.block_size, c.pool_bytes) == (
        d["threads"],
        d["queue_depth"],
        d["block_size"],
        d["pool_bytes"],
    )
    # An explicit knob still wins over the machine's default.
    assert EngineConfig(threads=3).threads == 3


def test_usable_cores_is_positive_and_within_the_affinity():
    import os

    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))


def test_doctests():
    assert doctest.testmod(_engine, raise_on_error=False).failed == 0

"""Joining ``jax.distributed`` from the environment, and the few collectives training needs.

A process takes part in a multi-process run when ``JAX_NUM_PROCESSES`` is more than 1; it
then also needs ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0, reachable from every
host) and ``JAX_PROCESS_ID`` (0 to N - 1, distinct). ``jaxoff launch`` sets the three for
processes on this machine; on a cluster, set them per host (or from SLURM's
``SLURM_PROCID``/``SLURM_NTASKS``). On CPU, collectives across processes go through gloo.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from .._errors import ConfigError

ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def initialize_from_env(environ=None) -> bool:
    """Joins the run described by the environment (see the module doc); returns whether
    this process is one of several. Call it before anything touches a JAX device.

    Raises:
      ConfigError: a variable is missing or malformed, naming it and the fix.
    """
    env = os.environ if environ is None else environ
    raw = env.get("JAX_NUM_PROCESSES")
    if raw is None:
        return False
    num = _int_var(raw, "JAX_NUM_PROCESSES", minimum=1)
    if num == 1:
        return False
    missing = [k for k in ENV if not env.get(k)]
    if missing:
        raise ConfigError(
            f"JAX_NUM_PROCESSES={num} but {', '.join(missing)} not set; set all of "
            f"{', '.join(ENV)} in every process (jaxoff launch --processes {num} -- train ... "
            f"does it on one machine)"
        )
    pid = _int_var(env["JAX_PROCESS_ID"], "JAX_PROCESS_ID", minimum=0)
    if pid >= num:
        raise ConfigError(f"JAX_PROCESS_ID={pid} must be less than JAX_NUM_PROCESSES={num}")
    if jax.distributed.is_initialized():
        return True
    # CPU collectives across processes (harmless where the devices are accelerators)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(env["JAX_COORDINATOR_ADDRESS"], num_processes=num, process_id=pid)
    return True


def _int_var(raw: str, name: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigError(f"{name}={raw!r} must be an integer of at least {minimum}")
    return value


def barrier(name: str) -> None:
    """Waits until every process reached the barrier ``name`` (nothing with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def broadcast_int(value: int) -> int:
    """Process 0's ``value``, on every process."""
    if jax.process_count() == 1:
        return int(value)

    return int(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int64)))


def allgather_ints(values: list[int]) -> np.ndarray:
    """``[process, len(values)]``: every process's ``values`` (the same length everywhere)."""
    mine = np.asarray(values, np.int64).reshape(1, -1)
    if jax.process_count() == 1:
        return mine

    return np.asarray(multihost_utils.process_allgather(mine, tiled=True))

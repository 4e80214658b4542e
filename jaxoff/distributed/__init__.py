"""Training across processes: jax.distributed, one page store per process, a local launcher."""

from ..placement import from_host
from ._launch import LaunchSpec as LaunchSpec
from ._launch import launch as launch
from ._launch import parse_launch_args as parse_launch_args
from ._runtime import (
    ENV,
    allgather_ints,
    barrier,
    broadcast_int,
    initialize_from_env,
)
from ._sharded import ShardedParams, init_sharded, local_box
from ._step import ShardedPagedStep

__all__ = [
    "ENV",
    "LaunchSpec",
    "ShardedPagedStep",
    "ShardedParams",
    "allgather_ints",
    "barrier",
    "broadcast_int",
    "from_host",
    "init_sharded",
    "initialize_from_env",
    "launch",
    "local_box",
    "parse_launch_args",
]

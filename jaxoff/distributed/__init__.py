"""Training across processes: jax.distributed, one page store per process, a local launcher."""

from ..step._sharded import ShardedPagedStep  # the step lives with the other steps
from ._runtime import (
    ENV,
    allgather_ints,
    barrier,
    broadcast_int,
    initialize_from_env,
)
from ._sharded import ShardedParams, from_host, init_sharded, local_box

__all__ = [
    "ENV",
    "ShardedPagedStep",
    "ShardedParams",
    "allgather_ints",
    "barrier",
    "broadcast_int",
    "from_host",
    "init_sharded",
    "initialize_from_env",
    "local_box",
]

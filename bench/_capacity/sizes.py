"""The capacity probes' models and their bytes.

GPT-2 shapes (``d_ff = 4 d_model``, head dim 128, learned positions, 256-byte vocab) at a fixed
width: a size is its number of layers, so sizes step by one block (12 d^2 + 13 d parameters,
50.4M at d = 2048). Bytes are counted at the modes' dtypes; chunk padding is ignored.
"""

from __future__ import annotations

import math
import shutil

GIB = 1 << 30
MODES = ("plain", "paged", "fuyou", "fuyou-nvme")  # each a `jaxoff train` configuration
PAGED_MODES = ("paged", "fuyou", "fuyou-nvme")
STORE_BYTES_PER_PARAM = 12  # fp32 master + mu + nu, per slot
PARAM_STORE_BYTES = 2  # bf16 block parameters, per slot, with fuyou-nvme


def model_config(num_layers: int, d_model: int, seq_len: int, mode: str):
    """GPT-2-shaped config of ``num_layers`` blocks of width ``d_model`` for ``mode``: fp32
    with ``plain``, bf16 otherwise; full remat (``nothing_saveable``), layers scanned."""
    from jaxoff.models.gpt import GPTConfig
    from jaxoff.nn import Stack

    dtype = "float32" if mode == "plain" else "bfloat16"
    return GPTConfig(
        num_layers=num_layers,
        d_model=d_model,
        num_heads=max(1, d_model // 128),
        d_ff=4 * d_model,
        max_seq_len=max(seq_len, 1024),
        dtype=dtype,
        param_dtype=dtype,
        stack=Stack(policy="nothing_saveable"),
    )


def num_params(num_layers: int, d_model: int, seq_len: int) -> int:
    return model_config(num_layers, d_model, seq_len, "plain").num_params()


def layers_for(params: float, d_model: int, seq_len: int) -> int:
    """Fewest layers whose model has at least ``params`` parameters (at least 1)."""
    base = num_params(1, d_model, seq_len)
    per_layer = num_params(2, d_model, seq_len) - base
    return max(1, math.ceil((params - base) / per_layer) + 1)


def state_bytes_per_param(mode: str) -> dict[str, int]:
    """Training-state bytes per parameter, by part: fp32 parameters, gradients and moments
    with ``plain``; bf16 parameters and gradients, fp32 masters and moments otherwise."""
    if mode == "plain":
        return {"params": 4, "grads": 4, "moments": 8, "masters": 0}
    return {"params": 2, "grads": 2, "moments": 8, "masters": 4}


def store_bytes_per_param(mode: str) -> int:
    """Page-store bytes per parameter and slot."""
    if mode not in PAGED_MODES:
        return 0
    return STORE_BYTES_PER_PARAM + (PARAM_STORE_BYTES if mode == "fuyou-nvme" else 0)


def store_bytes(n_params: int, mode: str, slots: int = 2) -> int:
    """Disk the page store needs (every slot)."""
    return slots * store_bytes_per_param(mode) * n_params


def checkpoint_bytes(n_params: int, mode: str, paged_checkpoint: str = "copy") -> int:
    """Disk a ``jaxoff train`` checkpoint of ``mode`` needs: the store's committed version
    (one slot; none with ``--paged-checkpoint store``, whose checkpoint names the store's
    version instead) and the parameters orbax holds: bf16 with ``paged``; none of the blocks
    with the fuyou modes (with ``fuyou`` they are the casts of the store's fp32 masters,
    with ``fuyou-nvme`` in the store; the embeddings and head left are not counted); fp32
    parameters and moments with ``plain``."""
    if mode == "plain":
        return 12 * n_params
    copy = 0 if paged_checkpoint == "store" else store_bytes_per_param(mode) * n_params
    return copy + (2 * n_params if mode == "paged" else 0)


def disk_bytes(n_params: int, mode: str, slots: int, paged_checkpoint: str | None) -> int:
    """Disk a run of ``mode`` needs: its store and, unless ``paged_checkpoint`` is None (a
    run that writes no checkpoint), its last checkpoint."""
    ckpt = 0 if paged_checkpoint is None else checkpoint_bytes(n_params, mode, paged_checkpoint)
    return store_bytes(n_params, mode, slots) + ckpt


def disk_cap_layers(
    root: str,
    mode: str,
    slots: int,
    d_model: int,
    seq_len: int,
    reserve_gib: float,
    paged_checkpoint: str | None = "copy",
) -> int:
    """Most layers (at least 1) whose run of ``mode`` (`disk_bytes`: a store of ``slots``
    slots and its checkpoint) fits the free disk under ``root`` less ``reserve_gib``."""
    free = shutil.disk_usage(root).free - reserve_gib * GIB

    def need(n: int) -> int:
        return disk_bytes(n, mode, slots, paged_checkpoint)

    per = need(1 << 30) / (1 << 30)
    cap = layers_for(free / per, d_model, seq_len)
    while cap > 1 and need(num_params(cap, d_model, seq_len)) > free:
        cap -= 1
    return cap

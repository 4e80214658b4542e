"""The optimizer of a run, built from its :class:`~jaxoff.train._options.OptimOptions`."""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path

import optax

from ..optim import paged
from ._options import Optimizer, OptimOptions


def schedule(opt: OptimOptions) -> optax.Schedule:
    """Linear warm-up to ``lr``, then cosine decay to 10% of it over ``steps``."""
    # at least one warm-up step and one decay step, so that --steps 1 runs
    warmup = max(min(opt.warmup_steps, opt.steps - 1), 1)
    return optax.warmup_cosine_decay_schedule(
        0.0, opt.lr, warmup, max(opt.steps, warmup + 1), end_value=opt.lr * 0.1
    )


def _adamw(lr: optax.Schedule, weight_decay: float) -> optax.GradientTransformation:
    return optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=weight_decay)


def _adam(lr: optax.Schedule, weight_decay: float) -> optax.GradientTransformation:
    return optax.adam(lr, b1=0.9, b2=0.95)


def _lion(lr: optax.Schedule, weight_decay: float) -> optax.GradientTransformation:
    return optax.lion(lr, weight_decay=weight_decay)


def _sgd(lr: optax.Schedule, weight_decay: float) -> optax.GradientTransformation:
    return optax.sgd(lr, momentum=0.9)


def _rmsprop(lr: optax.Schedule, weight_decay: float) -> optax.GradientTransformation:
    return optax.rmsprop(lr)


MENU: dict[str, Callable[[optax.Schedule, float], optax.GradientTransformation]] = {
    "adamw": _adamw,
    "adam": _adam,
    "lion": _lion,
    "sgd": _sgd,
    "rmsprop": _rmsprop,
}
"""``--optimizer NAME`` -> its optax transformation of the schedule and the weight decay
(adamw and lion decay; the others ignore it). Every entry is element-wise, and its paged
update is compared bitwise with optax's in the tests."""
assert tuple(MENU) == typing.get_args(Optimizer), "the menu and the option's choices differ"


def build_optimizer_parts(
    opt: OptimOptions,
    store: Path | None = None,
    *,
    chunk_mib: int = 16,
    slots: int = 2,
    sharded: bool = False,
    host_mem: int = 0,
):
    """``(clipping or None, the rest)``; the rest is paged into ``store`` (chunks of
    ``chunk_mib`` MiB, ``slots`` slots) unless it is None. With a store the clipping is
    inside the paged transformation (it splits it off and runs it on the gradients in RAM),
    except for FSDP blocks (``sharded``): there the clipping must see the global gradients,
    so it is returned apart."""
    tx = MENU[opt.optimizer](schedule(opt), opt.weight_decay)
    pre = optax.clip_by_global_norm(opt.clip_norm) if opt.clip_norm > 0 else None
    if store is None:
        return pre, tx

    if pre is not None and not sharded:
        # the leading clip is split off and runs on the gradients in RAM
        tx, pre = optax.chain(pre, tx), None
    # every optimizer of the menu is element-wise (see MENU): the probe would only cost
    # seconds of tracing
    return pre, paged(
        tx, store, chunk_bytes=chunk_mib << 20, slots=slots, probe=False, host_mem=host_mem
    )

"""Fuyou's own options in a training run (a group of ``jaxoff.train.TrainConfig``), and the
checks they need of the rest of the run."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxoff._errors import OptionError
from jaxoff.nn import recomputes_everything

from ._layout import check_model


@dataclasses.dataclass(frozen=True)
class FuyouOptions:
    """Fuyou's options (``jaxoff.strategies.fuyou``).

    Attributes:
        fuyou: the same as --strategy fuyou (an alias).
        page_params: with --strategy fuyou, the stacked block parameters live in the page
            store too (ZeRO-Infinity's parameter offload): each layer's are read one layer
            ahead in forward and in backward and written by its update, so RAM holds the
            embeddings, the head and a window of two layers instead of the model. Evaluation
            reads them from the store the same way.
        fuyou_read_ahead_mib: with --strategy fuyou, MiB of optimizer state read ahead of
            each layer's update while the layer above it is differentiated: the whole layer
            when its state fits, else the leading chunks of each of its tensors (the rest is
            read by the update itself, not hidden). Staging may hold four times this; 0 reads
            each tensor's first chunk only. Default: 128 MiB or 1/32 of RAM, the larger.
    """

    fuyou: bool = False
    page_params: bool = False
    fuyou_read_ahead_mib: int | None = None

    def check(self) -> None:
        """Each option on its own, and with the others of this group."""
        if self.page_params and not self.fuyou:
            raise OptionError(
                "`page_params=True` pages the block parameters through Fuyou's step: add "
                "`fuyou=True`"
            )
        if self.fuyou_read_ahead_mib is not None and not self.fuyou:
            raise OptionError(
                "`fuyou_read_ahead_mib` sets what Fuyou's step reads ahead of each layer's "
                "update: add `fuyou=True`, or leave it out"
            )
        if self.fuyou_read_ahead_mib is not None and self.fuyou_read_ahead_mib < 0:
            raise OptionError(
                f"`fuyou_read_ahead_mib` must be >= 0 (MiB of optimizer state read ahead of "
                f"each layer's update; 0: each tensor's first chunk only), got "
                f"{self.fuyou_read_ahead_mib}"
            )

    def read_ahead_bytes(self) -> int | None:
        """``fuyou_read_ahead_mib`` in bytes (None: Fuyou's default)."""
        mib = self.fuyou_read_ahead_mib
        return None if mib is None else mib << 20

    def check_run(self, run: RunShape, model: Any) -> None:
        """What Fuyou needs of the rest of a run ``run`` training ``model`` (a config whose
        stacked blocks Fuyou updates); each error says what to change."""
        if not self.fuyou:
            return
        if run.grad_accum > 1:
            raise OptionError(
                f"`grad_accum={run.grad_accum}` does not apply to `strategy='fuyou'`, which "
                f"updates each layer inside the backward pass as soon as its gradients exist: "
                f"there is no step-wide gradient to accumulate (holding one would cost the "
                f"gradient memory Fuyou saves); use `strategy='plain'` with `store` and "
                f"`grad_accum` (the paged update after the backward pass), or a larger "
                f"`batch_size` under Fuyou"
            )

        stack = getattr(model, "stack", None)
        if run.policy != "none" and not recomputes_everything(getattr(stack, "policy", None)):
            raise OptionError(
                f"`policy='{run.policy}'` does not apply to `strategy='fuyou'`, which recomputes "
                f"each block whole in backward (what `policy='full'` does): leave `policy` "
                f"out or pass `policy='full'`"
            )
        if not run.paged:
            raise OptionError(
                "`fuyou=True` pages the optimizer state inside the backward pass and needs a "
                "page store: leave out `store='none'` (or name a `store` directory)"
            )
        if run.clip_norm > 0:
            raise OptionError(
                "`fuyou=True` updates each layer inside the backward pass, as soon as its "
                f"gradients exist, so it cannot clip by the global gradient norm "
                f"(`clip_norm={run.clip_norm}` needs every gradient before the first update): "
                "pass `clip_norm=0`"
            )
        if run.devices != 1 or run.processes > 1:
            raise OptionError(
                "`fuyou=True` runs on one device in one process: use `fsdp=1` (and one "
                "process), or leave out `fuyou=True`"
            )
        if run.placement != "device":
            raise OptionError(
                f"`fuyou=True` keeps the parameters in the training state (or, with "
                f"`page_params=True`, in the page store) and the optimizer state in the store: "
                f"`placement='{run.placement}'` does not apply; use `placement='device'`"
            )

        check_model(model)  # a protocol model with stacked blocks, one block per layer step


@dataclasses.dataclass(frozen=True)
class RunShape:
    """What Fuyou's checks read of the rest of a run: its policy, gradient accumulation,
    whether a page store holds the optimizer state, the clipping norm, the devices and
    processes, and the placement."""

    policy: str
    grad_accum: int
    paged: bool
    clip_norm: float
    devices: int
    processes: int
    placement: str

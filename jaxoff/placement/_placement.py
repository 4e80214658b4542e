"""Where parameters, gradients and optimizer states live: one frozen dataclass, presets."""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from .._errors import ConfigError

Kind = Literal["device", "host"]
KINDS = ("device", "host")
UPDATES = ("auto", "host", "device")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Homes of the training state, and how parameters reach the device.

    Every field is data; :func:`jaxoff.placement.state_shardings` turns it into
    shardings with a ``memory_kind`` (``"device"`` or ``host_memory_kind``), which the
    trainer gives to ``jax.jit`` as in/out shardings of the donated state.

    Attributes:
        params: where parameters live between steps (``device`` or ``host``).
        opt_state: where optimizer states (moments, counts) live between steps.
        grads: where gradients are placed after the backward pass; ``None``: where
            autodiff leaves them (the parameters' home: the transpose of a
            host-to-device copy is a device-to-host copy).
        stream_window: ``0``: host parameters are copied to the device whole at the start
            of the step (and the copies freed after backward). ``w >= 1``: the scanned
            layers' parameters are streamed, layer by layer, inside the layer loop, ``w``
            layers ahead (``1`` is L2L, ``> 1`` a STRONGHOLD-style window); needs
            ``params="host"``, a scanned model with one block per remat unit and the
            ``full`` policy (the streamed loop recomputes each block in backward).
        update_on: where the optimizer update runs. ``host``: under
            ``compute_on("device_host")`` on host operands (no state crosses PCIe; the
            host CPU does the arithmetic, as ZeRO-Offload). ``device``: explicit
            transfers, state copied to the device, updated there and copied back
            (for backends without host compute). ``auto``: ``host`` when the optimizer
            state lives on host, else ``device``.
        host_memory_kind: the memory kind of ``host``: ``pinned_host`` (DMA-able, the
            default) or ``unpinned_host``.

    Example:
        >>> from jaxoff.placement import Placement, get_placement
        >>> p = get_placement("host_params_stream2")
        >>> p.params, p.opt_state, p.stream_window, p.update_kind
        ('host', 'host', 2, 'host')
    """

    params: Kind = "device"
    opt_state: Kind = "device"
    grads: Kind | None = None
    stream_window: int = 0
    update_on: Literal["auto", "host", "device"] = "auto"
    host_memory_kind: str = "pinned_host"

    def __post_init__(self):
        for name in ("params", "opt_state"):
            if getattr(self, name) not in KINDS:
                raise ConfigError(
                    f"placement {name}={getattr(self, name)!r} is not one of {', '.join(KINDS)}"
                )
        if self.grads is not None and self.grads not in KINDS:
            raise ConfigError(f"placement grads={self.grads!r} is not one of {', '.join(KINDS)}")
        if self.update_on not in UPDATES:
            raise ConfigError(
                f"placement update_on={self.update_on!r} is not one of {', '.join(UPDATES)}"
            )
        if self.host_memory_kind not in ("pinned_host", "unpinned_host"):
            raise ConfigError(
                f"host_memory_kind={self.host_memory_kind!r}: use pinned_host or unpinned_host"
            )
        if not isinstance(self.stream_window, int) or self.stream_window < 0:
            raise ConfigError(
                f"stream window {self.stream_window!r} must be at least 1 "
                f"(layers prefetched ahead; 0 turns streaming off)"
            )
        if self.stream_window and self.params != "host":
            raise ConfigError(
                "layer streaming copies host parameters to the device layer by layer; "
                "it needs params='host' (use a host_params_stream<N> placement)"
            )

    @property
    def streams(self) -> bool:
        return self.stream_window > 0

    @property
    def update_kind(self) -> Kind:
        """Where the optimizer update runs (``update_on`` with ``auto`` resolved)."""
        if self.update_on == "auto":
            return "host" if self.opt_state == "host" else "device"
        return self.update_on

    def memory_kind(self, kind: Kind) -> str:
        return "device" if kind == "device" else self.host_memory_kind

    @property
    def all_on_device(self) -> bool:
        return (
            self.params == "device"
            and self.opt_state == "device"
            and self.grads in (None, "device")
            and self.update_kind == "device"
        )


PRESETS: dict[str, tuple[Placement, str]] = {
    "device": (Placement(), "everything in device memory (plain JAX)"),
    "host_opt": (
        Placement(opt_state="host"),
        "optimizer states in host memory, update on the host (ZeRO-Offload's optimizer)",
    ),
    "host_opt_xfer": (
        Placement(opt_state="host", update_on="device"),
        "optimizer states in host memory, copied to the device for the update and back",
    ),
    "host_params": (
        Placement(params="host", opt_state="host"),
        "parameters and states in host memory; parameters copied to the device whole "
        "for forward/backward, gradients and update on the host",
    ),
    "host_params_stream1": (
        Placement(params="host", opt_state="host", stream_window=1),
        "host_params, layers streamed one ahead (L2L)",
    ),
    "host_params_stream2": (
        Placement(params="host", opt_state="host", stream_window=2),
        "host_params, layers streamed two ahead (STRONGHOLD-style window)",
    ),
}
"""Named placements; ``host_params_stream<N>`` works for any ``N >= 1``."""


def with_paged_optimizer(placement: Placement | str | None) -> Placement:
    """The placement used when the optimizer is paged to disk (``jaxoff.paged``).

    A paged optimizer's state lives in its page store; what the step carries is a few bytes
    (store version, chunk checksums, step counts), kept in device memory. Its update runs
    in device space, where the FFI paging calls run: the parameters are moved there for the
    update and back to their home after it (host parameters: ZeRO-Infinity's layout, with
    optimizer states and fp32 masters on NVMe). On an accelerator that copy costs device
    memory during the update; on the CPU both spaces are the same RAM.

    >>> p = with_paged_optimizer("host_params_stream1")
    >>> p.params, p.opt_state, p.update_kind, p.stream_window
    ('host', 'device', 'device', 1)
    """
    placement = get_placement(placement)
    if placement.all_on_device:
        return placement
    return dataclasses.replace(placement, opt_state="device", update_on="device")


_STREAM = re.compile(r"host_params_stream(-?\d+)")


def get_placement(spec: str | Placement | None) -> Placement:
    """A :class:`Placement` from a preset name (``None`` is ``device``).

    Raises:
        ConfigError: for an unknown name (listing the valid ones) or a window below 1.
    """
    if isinstance(spec, Placement):
        return spec
    spec = "device" if spec is None else spec.strip()
    if spec in PRESETS:
        return PRESETS[spec][0]
    m = _STREAM.fullmatch(spec)
    if m:
        window = int(m.group(1))
        if window < 1:
            raise ConfigError(
                f"placement {spec!r}: the stream window must be at least 1 "
                f"(host_params_stream1 is L2L, host_params_stream2 prefetches 2 layers)"
            )
        return Placement(params="host", opt_state="host", stream_window=window)
    raise ConfigError(
        f"placement {spec!r} is not known; choose one of {', '.join(PRESETS)} "
        f"(or host_params_stream<N> for a window of N layers)"
    )

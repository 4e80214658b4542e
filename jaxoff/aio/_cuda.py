"""The CUDA build of the paging calls (``jaxoff._ffi_cuda``): was it built, can it load, does
JAX have a GPU to run it on.

The CUDA handlers are a module of their own so that ``import jaxoff`` on a machine without
CUDA never loads CUDA code; it is imported only once JAX reports a GPU backend.

>>> s = cuda_status()
>>> isinstance(s.built, bool) and isinstance(s.reason, str)
True
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import jax

from jaxoff import _ffi

PAGING_TARGETS = (
    "jaxoff_pager_begin",
    "jaxoff_pager_take",
    "jaxoff_pager_out",
    "jaxoff_pager_commit",
)
REINSTALL = (
    "reinstall on this machine with `JAXOFF_CUDA=on pip install --no-build-isolation "
    "--no-deps .` (needs the CUDA toolkit: nvcc on PATH or CUDAToolkit_ROOT set)"
)


@dataclasses.dataclass(frozen=True)
class CudaStatus:
    """What :func:`cuda_status` reports.

    Attributes:
      built: the package build made ``jaxoff._ffi_cuda``.
      importable: it imports here (it needs only the CUDA driver at run time).
      reason: one line: what was built against which toolkit, or why not / why it fails.
      mode: ``JAXOFF_CUDA`` at build time (``auto``, ``on`` or ``off``).
      toolkit: the CUDA toolkit version it was built against ("" if not built).
      targets: the paging targets the module provides for platform CUDA.
      gpu_backend: JAX has a GPU backend in this process.
      registered: the CUDA targets are registered with XLA in this process.
      runtime: driver/runtime versions and device count as the module sees them (or None).
    """

    built: bool
    importable: bool
    reason: str
    mode: str
    toolkit: str
    targets: tuple[str, ...]
    gpu_backend: bool
    registered: bool
    runtime: dict[str, Any] | None


def build_info() -> dict[str, Any]:
    """How ``jaxoff._ffi`` was configured: ``cuda`` (bool), ``cuda_mode``, ``cuda_reason``,
    ``cuda_toolkit``."""
    return dict(_ffi.build_info())


@functools.cache
def _load() -> tuple[Any, str]:
    try:
        return importlib.import_module("jaxoff._ffi_cuda"), ""
    except ImportError as e:
        return None, f"{type(e).__name__}: {e}"


def module() -> Any | None:
    """``jaxoff._ffi_cuda``, or None when it was not built or does not load."""
    return _load()[0]


def missing_reason() -> str:
    """Why :func:`module` is None (one line), or "" when it loads."""
    mod, err = _load()
    if mod is not None:
        return ""
    info = build_info()
    if not info["cuda"]:
        return f"jaxoff was built without CUDA ({info['cuda_reason']})"
    return f"jaxoff._ffi_cuda was built but does not load ({err})"


def gpu_backend_present() -> bool:
    """JAX has a GPU backend in this process (``jax.devices("gpu")`` is not empty)."""
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:  # no such backend (JAX_PLATFORMS=cpu, no plugin, no driver)
        return False


def default_is_gpu() -> bool:
    """A program traced now compiles for a GPU unless its caller says otherwise: the default
    backend is a GPU and no non-GPU default device is set."""
    try:
        if jax.default_backend() != "gpu":
            return False
    except RuntimeError:
        return False
    device = getattr(jax.config, "jax_default_device", None)  # typed only by name in jax
    if device is None:
        return True
    platform = device if isinstance(device, str) else getattr(device, "platform", "gpu")
    return platform in ("gpu", "cuda")


# The CUDA registration of this process (set by register(), read by cuda_status()).
_checked = False
_registered = False
_missing = ""  # why a GPU backend exists without CUDA paging targets ("" otherwise)


def register() -> None:
    """Registers the CUDA paging targets with XLA, once, if JAX has a GPU backend.

    :func:`jaxoff.aio.register_targets` calls it, holding its lock, after the CPU targets.
    Without a GPU backend it does nothing; with one but no loadable ``jaxoff._ffi_cuda`` it
    keeps the reason for :func:`missing`.
    """
    global _checked, _registered, _missing
    if _checked:
        return
    _checked = True
    if not gpu_backend_present():
        return
    mod = module()
    if mod is None:
        _missing = missing_reason()
        return
    mod.bind_host_api(_ffi.host_paging_api())
    for name, capsule in mod.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
    _registered = True


def registered() -> bool:
    """The paging targets are registered for platform CUDA in this process."""
    return _registered


def missing() -> str:
    """Why a GPU backend found by :func:`register` has no CUDA paging targets ("" if it has
    them, or if there is no GPU backend or no registration yet)."""
    return _missing


def cuda_status() -> CudaStatus:
    """Whether the CUDA paging calls were built, load, and are registered here, and why not.

    >>> s = cuda_status()
    >>> s.registered <= s.importable
    True
    """
    info = build_info()
    mod = module()
    runtime = dict(mod.runtime()) if mod is not None else None
    if mod is not None:
        reason = info["cuda_reason"]
        if runtime and runtime.get("error"):
            reason += f"; no usable CUDA device: {runtime['error']}"
    else:
        reason = missing_reason()
    return CudaStatus(
        built=bool(info["cuda"]),
        importable=mod is not None,
        reason=reason,
        mode=str(info["cuda_mode"]),
        toolkit=str(info["cuda_toolkit"]),
        targets=tuple(sorted(mod.registrations())) if mod is not None else (),
        gpu_backend=gpu_backend_present(),
        registered=_registered,
        runtime=runtime,
    )

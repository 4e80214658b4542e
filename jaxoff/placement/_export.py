"""Proof of placement without a GPU: the train step exported for ``cuda`` / ``tpu``.

XLA's CPU lowering keeps memory kinds on arguments but drops in-program placement
annotations (JAX-ON-CPU.md), so we export the real step for an accelerator platform
(``jax.export`` works on a CPU-only machine) and read the StableHLO:

* arguments carry ``mhlo.memory_kind = "pinned_host"`` for host-resident state;
* every copy is a ``custom_call @annotate_device_placement`` whose
  ``_xla_buffer_placement`` says where the value goes; a streamed step has them *inside*
  ``stablehlo.while`` bodies (per layer: to ``device`` for parameters, to ``pinned_host``
  for their gradients);
* host compute is ``mhlo.frontend_attributes = {_xla_compute_type = "host"}``.
"""

from __future__ import annotations

import dataclasses
import re

_ARG = re.compile(r"%arg\d+: tensor<[^>]*>\s*\{([^}]*)\}")
_KIND = re.compile(r'mhlo\.memory_kind = "(\w+)"')
_PLACE = re.compile(r'_xla_buffer_placement = "(\w+)"')
_FUNC = re.compile(r"func\.func (?:public |private )?@([\w.$-]+)")
_CALL = re.compile(r"func\.call @([\w.$-]+)")


@dataclasses.dataclass(frozen=True)
class ExportReport:
    """What one exported step shows (counts of StableHLO constructs)."""

    platform: str
    arg_kinds: dict[str, int]  # memory kind -> arguments of the main function
    placements_in_loops: dict[str, int]  # destination -> annotate_device_placement in a while
    placements_outside: dict[str, int]  # destination -> annotate_device_placement elsewhere
    host_compute_ops: int  # ops tagged _xla_compute_type = "host"
    loops: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _functions(lines: list[str]) -> dict[str, list[str]]:
    """Lines of each ``func.func`` by name (JAX outlines named calls into private ones)."""
    funcs: dict[str, list[str]] = {}
    name = None
    for line in lines:
        if m := _FUNC.search(line):
            name = m.group(1)
            funcs[name] = []
        elif name is not None:
            funcs[name].append(line)
    return funcs


def _in_loop_flags(body: list[str]) -> list[bool]:
    """For each line of a function: whether it is inside a ``stablehlo.while`` region."""
    flags, loop_indents = [], []  # indentation of the enclosing while ops
    for line in body:
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        inner = stripped.startswith("}") or stripped == "cond {"
        while loop_indents and indent <= loop_indents[-1] and not inner:
            loop_indents.pop()
        flags.append(bool(loop_indents))
        if "stablehlo.while" in line:
            loop_indents.append(indent)
    return flags


def analyze(mlir: str, platform: str = "") -> ExportReport:
    """Counts memory kinds of arguments, placements inside/outside loops, host ops.

    A placement is *inside a loop* when it sits in a ``stablehlo.while`` region or in a
    function called (directly or not) from one.
    """
    lines = mlir.splitlines()
    main = next(line for line in lines if "func.func public @main" in line)
    arg_kinds: dict[str, int] = {}
    for attrs in _ARG.findall(main):
        m = _KIND.search(attrs)
        kind = m.group(1) if m else "device"
        arg_kinds[kind] = arg_kinds.get(kind, 0) + 1
    funcs = _functions(lines)
    flags = {name: _in_loop_flags(body) for name, body in funcs.items()}
    looped: set[str] = set()
    frontier = [
        c
        for name, body in funcs.items()
        for line, flag in zip(body, flags[name], strict=True)
        if flag
        for c in _CALL.findall(line)
    ]
    while frontier:
        name = frontier.pop()
        if name not in looped and name in funcs:
            looped.add(name)
            frontier.extend(c for line in funcs[name] for c in _CALL.findall(line))
    inside: dict[str, int] = {}
    outside: dict[str, int] = {}
    loops = host_ops = 0
    for name, body in funcs.items():
        for line, flag in zip(body, flags[name], strict=True):
            loops += "stablehlo.while" in line
            host_ops += '_xla_compute_type = "host"' in line
            if "annotate_device_placement" in line and (m := _PLACE.search(line)):
                counts = inside if flag or name in looped else outside
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return ExportReport(platform, arg_kinds, inside, outside, host_ops, loops)

"""The workspace of a profile, from two compiles of the scanned step.

:func:`~jaxoff.plan._profile.trace_profile` measures what the traced step says (per-name
bytes, FLOPs, the residuals the backward pass needs); what XLA adds when it compiles (the
temporaries that are not stacked residuals, the widening of kept 16-bit residuals) needs the
cost model's view of a plan, so it is set here, after the profile, by its caller:
:func:`profile` (``jaxoff.plan.profile``) and ``jaxoff plan`` do both.
"""

from __future__ import annotations

import dataclasses
import math
import re

from ..step import compile_step
from ._cost import Plan, needed_and_recomputed, residual_split
from ._profile import Profile, temp_bytes, trace_profile, with_policy


def profile(
    model_cfg,
    batch: int,
    seq: int,
    *,
    model: str = "custom",
    calibrate: bool = True,
    grad_accum: int = 1,
) -> Profile:
    """Profiles ``model_cfg`` (a :class:`jaxoff.nn.LayeredModel`) at ``batch x seq`` tokens:
    :func:`~jaxoff.plan._profile.trace_profile`, then, with ``calibrate``,
    :func:`calibrate_workspace` (two compiles of the scanned step). ``grad_accum``:
    micro-batches of ``batch`` rows per step (the workspace then holds the accumulator).

    Example:
        >>> from jaxoff.models.gpt import CONFIGS
        >>> from jaxoff.plan import profile
        >>> p = profile(CONFIGS["tiny"], 2, 16, model="tiny", calibrate=False)
        >>> p.name("mlp_up").bytes  # [2, 16, 512] float32
        65536
    """
    prof = trace_profile(model_cfg, batch, seq, model=model, grad_accum=grad_accum)
    return calibrate_workspace(prof, model_cfg) if calibrate else prof


def calibrate_workspace(prof: Profile, model_cfg) -> Profile:
    """Sets the workspace from two compiles of the scanned step (all kept, all
    recomputed).

    * ``kept_widening``: XLA's CPU backend computes bfloat16 and float16 in float32 and
      hoists the upcast of each stacked residual out of the backward loop, so during the
      backward pass a kept 16-bit residual occupies its float32 size. The factor is read
      from the all-kept program (:func:`widened_residual_bytes`), not assumed: 1 where
      nothing is widened (float32, or a backend that computes in 16 bits).
    * ``workspace_bytes``: the all-kept ``temp_size`` less its (widened) residuals.
    * ``recompute_workspace``: the all-recomputed ``temp_size`` less its residuals and
      the workspace, per byte of one layer's recomputed names (they are live in that
      layer's backward). It may be negative: a backend whose kept residuals cost more
      than their traced bytes may need less workspace when it recomputes them.
    """

    RESIDUAL_NAMES = tuple(model_cfg.residual_names)  # noqa: N806
    found = {}
    for action in ("device", "remat"):
        actions = dict.fromkeys(RESIDUAL_NAMES, action)
        cfg = with_policy(model_cfg, actions)
        compiled = compile_step(cfg, prof.batch, prof.seq, grad_accum=prof.grad_accum)[0]
        plan = Plan.from_actions(prof, actions)
        dev, host = residual_split(prof, plan)
        needed, recomputed = needed_and_recomputed(prof, plan)
        found[action] = dict(
            temp=temp_bytes(compiled),
            residuals=dev + host,
            free=dev + host - prof.fixed_residual_bytes,  # what a plan can change
            stacked=prof.num_layers * sum(prof.name(n).bytes for n in needed),
            recomputed=sum(prof.name(n).bytes for n in recomputed),
            widened=widened_residual_bytes(compiled.as_text() or "", prof.num_layers)
            if action == "device"
            else 0,
        )
    kept, remat = found["device"], found["remat"]
    widening = 1.0 + kept["widened"] / kept["stacked"] if kept["stacked"] else 1.0
    work = kept["temp"] - kept["residuals"] - (widening - 1.0) * kept["free"]
    extra = remat["temp"] - remat["residuals"] - work
    alpha = extra / remat["recomputed"] if remat["recomputed"] else 0.0
    return dataclasses.replace(
        prof,
        workspace_bytes=int(round(work)),
        workspace_range=(kept["temp"] - kept["residuals"], remat["temp"] - remat["residuals"]),
        recompute_workspace=alpha,
        kept_widening=widening,
    )


_FLOAT_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8}
# one HLO instruction: %name = dtype[dims]{layout} opcode(operands), attributes
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%(\S+)\s*=\s*(\w+)\[([\d,]*)\]\S*\s+([\w-]+)\((.*?)\)")


def widened_residual_bytes(hlo_text: str, num_layers: int) -> int:
    r"""Bytes the compiled program adds by widening stacked activations: in its entry
    computation, every single-operand instruction whose result has the operand's shape
    (``[num_layers, ...]``, at least 3 dimensions: a layer axis plus batch and sequence)
    in a wider float type, its operand not a parameter of the step (those are the
    parameters, widened whatever the plan). Counts ``result - operand`` bytes: the
    narrow stack is dead once widened.

    Example:
        >>> widened_residual_bytes(
        ...     "ENTRY %m (p: bf16[2]) -> f32[] {\n"
        ...     "  %g = bf16[4,2,8]{2,1,0} get-tuple-element(%w), index=1\n"
        ...     "  %c = f32[4,2,8]{2,1,0} fusion(%g), kind=kLoop\n}", 4)
        128
    """
    start = re.search(r"^ENTRY", hlo_text, re.MULTILINE)
    entry = hlo_text[start.start() :] if start else ""
    defs = {}
    extra = 0
    for line in entry.splitlines()[1:]:
        if line.startswith("}"):
            break
        m = _INSTR.match(line)
        if not m:
            continue
        name, dtype, dims, op, operands = m.groups()
        dims = tuple(int(d) for d in dims.split(",") if d)
        defs[name] = (dtype, dims, op)
        args = re.findall(r"%([\w.-]+)", operands)
        if len(args) != 1 or args[0] not in defs or dtype not in _FLOAT_BYTES:
            continue
        in_dtype, in_dims, in_op = defs[args[0]]
        if (
            in_dims == dims
            and len(dims) >= 3
            and dims[0] == num_layers
            and in_op != "parameter"
            and in_dtype in _FLOAT_BYTES
            and _FLOAT_BYTES[dtype] > _FLOAT_BYTES[in_dtype]
        ):
            extra += math.prod(dims) * (_FLOAT_BYTES[dtype] - _FLOAT_BYTES[in_dtype])
    return extra

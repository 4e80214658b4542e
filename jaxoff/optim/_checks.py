"""Which optax transformations can be paged: chain splitting, a table of known offenders, a probe.

A transformation can be paged chunk by chunk only if it is *element-wise*: every element of
its output (updates and per-parameter state) depends only on the same element of its inputs,
plus scalar state such as the step count. The table below names optax functions known not to
be (they take norms, means or dot products over a leaf or over all leaves); the probe in
`_paged` catches the others by comparing a whole-tree update with a chunked, permuted one.
"""

from __future__ import annotations

import functools
import types
from typing import Any, cast

import optax

# Leading members of an `optax.chain` that need all gradients but keep only small state: they
# are split off and run on the gradients in RAM, before the paged pipeline.
GLOBAL_PREFIX = ("clip_by_global_norm", "clip_by_block_rms", "centralize", "adaptive_grad_clip")

# Transformations that are not element-wise, and why; matched against the qualified names of
# the functions a transformation is built from (its closures, recursively).
KNOWN_OFFENDERS = {
    "clip_by_global_norm": "it scales by the norm of all gradients together",
    "apply_if_finite": "it decides from all gradients at once whether to apply the step",
    "scale_by_lbfgs": "L-BFGS takes dot products over all parameters and keeps a history of "
    "whole parameter vectors",
    "scale_by_trust_ratio": "it scales each leaf by the ratio of parameter and update norms "
    "(LAMB/LARS)",
    "clip_by_block_rms": "it clips each leaf by that leaf's RMS",
    "adaptive_grad_clip": "it clips each leaf by that leaf's norms",
    "centralize": "it subtracts each leaf's mean",
    "normalize_by_update_norm": "it divides by the norm of all updates",
    "scale_by_factored_rms": "Adafactor keeps factored (row/column) second moments",
    "scale_by_backtracking_linesearch": "a line search evaluates the loss on all parameters",
    "scale_by_zoom_linesearch": "a line search evaluates the loss on all parameters",
    "scale_by_polyak": "it uses the norm of all gradients",
    "scale_by_novograd": "it keeps per-leaf gradient norms",
    "scale_by_sm3": "it keeps per-dimension statistics",
    "scale_by_muon": "it orthogonalises whole matrices",
    "scale_by_shampoo": "it keeps per-leaf preconditioner matrices",
}


class NotElementwiseError(ValueError):
    """A transformation that cannot be updated chunk by chunk was handed to `jaxoff.paged`."""


def _closure_functions(fn: Any, depth: int = 0, seen: set | None = None):
    """Functions reachable from ``fn`` through closures, partials and transformation tuples."""
    seen = set() if seen is None else seen
    if depth > 12 or id(fn) in seen:
        return
    seen.add(id(fn))
    if isinstance(fn, functools.partial):
        yield from _closure_functions(fn.func, depth + 1, seen)
        for a in (*fn.args, *fn.keywords.values()):
            yield from _closure_functions(a, depth + 1, seen)
        return
    if isinstance(fn, optax.GradientTransformation | tuple | list | dict):
        for a in fn.values() if isinstance(fn, dict) else fn:  # dict: multi_transform
            yield from _closure_functions(a, depth + 1, seen)
        return
    if isinstance(fn, types.MethodType):
        yield from _closure_functions(fn.__func__, depth + 1, seen)
        # e.g. optax.MultiSteps keeps the transformation it wraps as an attribute
        for a in getattr(fn.__self__, "__dict__", {}).values():
            yield from _closure_functions(a, depth + 1, seen)
        return
    if not isinstance(fn, types.FunctionType):
        return
    yield fn
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        yield from _closure_functions(value, depth + 1, seen)


def _names(tx: Any) -> list[str]:
    return [f.__qualname__ for f in _closure_functions(tx)]


def _root_name(tx: optax.GradientTransformation) -> str:
    """``clip_by_global_norm`` for the transformation ``optax.clip_by_global_norm(1.0)``."""
    for f in _closure_functions(tx.update):  # past optax's with_extra_args_support wrapper
        name = f.__qualname__.split(".<locals>")[0]
        if name != "with_extra_args_support" and "update" in f.__qualname__.split(".")[-1]:
            return name
    return ""


def known_offender(tx: optax.GradientTransformation) -> tuple[str, str] | None:
    """``(name, reason)`` of the first known non-element-wise part of ``tx``, else None."""
    for qualname in _names(tx):
        for name, reason in KNOWN_OFFENDERS.items():
            if qualname.split(".<locals>")[0].endswith(name):
                return name, reason
    return None


def chain_members(
    tx: optax.GradientTransformation, flatten: bool = True
) -> list[optax.GradientTransformation] | None:
    """The members of an ``optax.chain`` (nested chains flattened), or None if not a chain."""
    init, update = tx.init, tx.update
    if getattr(init, "__qualname__", "") != "chain.<locals>.init_fn":
        return None
    # optax.chain's closures (the qualname says so), not just the protocol's callables
    init, update = cast(types.FunctionType, init), cast(types.FunctionType, update)
    cells = dict(zip(init.__code__.co_freevars, init.__closure__ or (), strict=True))
    ucells = dict(zip(update.__code__.co_freevars, update.__closure__ or (), strict=True))
    if "init_fns" not in cells or "update_fns" not in ucells:
        return None
    members = []
    for i, u in zip(
        cells["init_fns"].cell_contents, ucells["update_fns"].cell_contents, strict=True
    ):
        member = optax.GradientTransformationExtraArgs(i, u)
        members.extend((chain_members(member) if flatten else None) or [member])
    return members


def split_global_prefix(
    tx: optax.GradientTransformation,
) -> tuple[optax.GradientTransformation | None, optax.GradientTransformation]:
    """Splits ``chain(global ops..., rest...)`` into ``(chain(global ops), chain(rest))``.

    Global operations that lead the chain (`GLOBAL_PREFIX`) run on gradients in RAM before
    the paged pipeline; a transformation that is not such a chain is returned as ``(None, tx)``.
    """
    members = chain_members(tx)
    if not members:
        return None, tx
    k = 0
    while k < len(members) and _root_name(members[k]) in GLOBAL_PREFIX:
        k += 1
    if k == 0:
        return None, tx
    if k == len(members):
        raise NotElementwiseError(
            "jaxoff.paged: the chain holds only global operations "
            f"({', '.join(_root_name(m) for m in members)}) and no optimizer to page"
        )
    pre = members[0] if k == 1 else optax.chain(*members[:k])
    rest = members[k] if k + 1 == len(members) else optax.chain(*members[k:])
    return pre, rest


def refuse_known_offenders(tx: optax.GradientTransformation) -> None:
    found = known_offender(tx)
    if found is not None:
        name, reason = found
        hint = (
            "put it before the paged part, e.g. optax.chain(optax.clip_by_global_norm(1.0), "
            "jaxoff.paged(optax.adamw(lr), store)), or lead the chain passed to jaxoff.paged "
            "with it (it is then run on the gradients in RAM)"
            if name in GLOBAL_PREFIX
            else "keep this optimizer's state in RAM (plain optax) or choose an element-wise one "
            "(adam, adamw, lion, sgd, rmsprop, ...)"
        )
        raise NotElementwiseError(
            f"jaxoff.paged cannot page this transformation: it contains optax.{name}, which is "
            f"not element-wise ({reason}), so it cannot be updated one chunk at a time; {hint}"
        )

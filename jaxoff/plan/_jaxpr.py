"""Reading a jaxpr: FLOPs of equations, the scanned block's named values and their cones,
and the residuals the forward layer scan hands to the backward one.

Everything here is measured on the traced program (``jax.make_jaxpr``), not from
formulas of the model: a model with other layers or names profiles the same way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from jax.extend.core import Literal

# Ops that move or reinterpret data: no arithmetic.
_FREE = frozenset(
    {
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "transpose",
        "convert_element_type",
        "slice",
        "dynamic_slice",
        "dynamic_update_slice",
        "concatenate",
        "pad",
        "gather",
        "select_n",
        "iota",
        "copy",
        "copy_p",
        "device_put",
        "name",
        "stop_gradient",
        "rev",
        "optimization_barrier",  # a fusion fence (Chen segments): moves no data
    }
)


def subjaxprs(eqn) -> Iterator:
    """The jaxprs nested in one equation (scan/jit/remat/custom_jvp bodies)."""
    for value in eqn.params.values():
        for sub in value if isinstance(value, list | tuple) else (value,):
            if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
                yield sub.jaxpr
            elif type(sub).__name__ == "Jaxpr":
                yield sub


def nbytes(aval) -> int:
    return math.prod(aval.shape) * aval.dtype.itemsize


def eqn_flops(eqn) -> float:
    """FLOPs of one equation: 2 per multiply-add of a dot, 1 per output element of
    arithmetic, 1 per input element of a reduction; nested bodies counted recursively
    (a scan body times its trip count)."""
    name = eqn.primitive.name
    subs = list(subjaxprs(eqn))
    if subs:
        mult = eqn.params.get("length", 1) if name == "scan" else 1
        # custom_jvp/vjp carry the primal and the rule: count the primal only
        return mult * jaxpr_flops(subs[0])
    if name in _FREE:
        return 0.0
    out = sum(math.prod(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * out * math.prod(lhs[d] for d in lhs_contract)
    if name.startswith("reduce") or name in ("argmax", "argmin", "cumsum"):
        return float(math.prod(eqn.invars[0].aval.shape))
    return float(out)


def jaxpr_flops(jaxpr) -> float:
    """FLOPs of a whole (closed or open) jaxpr, scans multiplied by their length."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return sum(eqn_flops(e) for e in jaxpr.eqns)


def find_scans(jaxpr, length: int) -> list:
    """Every ``scan`` equation of trip count ``length``, in program order (recursing)."""
    found = []

    def walk(jx):
        for e in jx.eqns:
            if e.primitive.name == "scan" and e.params["length"] == length:
                found.append(e)
                continue
            for sub in subjaxprs(e):
                walk(sub)

    walk(getattr(jaxpr, "jaxpr", jaxpr))
    return found


@dataclasses.dataclass(frozen=True)
class NamedValue:
    """One ``checkpoint_name`` output of the block, as traced.

    Attributes:
        name: the residual name.
        shape, dtype: of the tagged value (one layer).
        bytes: its size in bytes (one layer).
        preds: names whose values the untagged ops producing this one read (the block
            input counts as ``layer_input``).
        flops: FLOPs of those untagged ops (what recomputing this value costs once its
            predecessors are at hand).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    preds: tuple[str, ...]
    flops: float


def block_values(body, carry_name: str = "layer_input") -> list[NamedValue]:
    """The named values of one scanned block body (a jaxpr without remat).

    For every variable we track its *cone*: the untagged equations computing it since
    the nearest named values (its *frontier*). A named value's recompute cost is the
    FLOPs of its cone, its predecessors the names on its frontier.
    """
    jaxpr = getattr(body, "jaxpr", body)
    info: dict = {}  # var -> (frontier frozenset, cone frozenset of eqn ids)
    flops: dict[int, float] = {}
    for v in jaxpr.invars:
        info[v] = (frozenset(), frozenset())
    # the carry is the block input (layer_input names it right away)
    for v in jaxpr.invars:
        if hasattr(v.aval, "shape") and len(v.aval.shape) == 3:
            info[v] = (frozenset({carry_name}), frozenset())
    out: list[NamedValue] = []
    for i, e in enumerate(jaxpr.eqns):
        front, cone = frozenset(), frozenset()
        for v in e.invars:
            if not isinstance(v, Literal) and v in info:  # literals: no entry
                f, c = info[v]
                front, cone = front | f, cone | c
        if e.primitive.name == "name":
            n = e.params["name"]
            aval = e.outvars[0].aval
            out.append(
                NamedValue(
                    n,
                    tuple(aval.shape),
                    str(aval.dtype),
                    nbytes(aval),
                    tuple(sorted(front - {n})),
                    sum(flops[j] for j in cone),
                )
            )
            for v in e.outvars:
                info[v] = (frozenset({n}), frozenset())
            continue
        flops[i] = eqn_flops(e)
        for v in e.outvars:
            info[v] = (front, cone | {i})
    return out


def scan_counts(eqn) -> tuple[int, int, int]:
    """``(consts, carry in, carry out)``: how many of a scan equation's inputs are
    constants and carried values, and how many of its outputs are carried values (the rest
    are its stacked ``ys``). jax < 0.12 records ``num_consts``/``num_carry``; jax 0.12 records
    flat trees ``ft_in`` = (consts, carry, xs) and ``ft_out`` = (carry, ys), and may move a
    carry that the body passes through unchanged to the constants.

    >>> import jax, jax.numpy as jnp
    >>> body = lambda c, x: ((c[0] + x * c[1], c[1]), c[0])
    >>> jaxpr = jax.make_jaxpr(lambda xs: jax.lax.scan(body, (0.0, 2.0), xs))(jnp.ones(3))
    >>> (scan,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    >>> consts, carry_in, carry_out = scan_counts(scan)
    >>> consts + carry_in == len(scan.invars) - 1, len(scan.outvars) - carry_out
    (True, 1)
    """
    params = eqn.params
    if "num_carry" in params:
        return params["num_consts"], params["num_carry"], params["num_carry"]
    consts, carry, _ = params["ft_in"].elts
    return len(consts.vals), len(carry.vals), len(params["ft_out"].elts[0].vals)


def residual_bytes(grad_jaxpr, num_layers: int) -> int:
    """Bytes of the stacked values the forward layer scan outputs for the backward one
    (its ``ys``): the residuals of all layers, plus the layer parameters it forwards."""
    scans = find_scans(grad_jaxpr, num_layers)
    if not scans:
        raise ValueError(f"no scan of length {num_layers} in the traced step")
    fwd = scans[0]
    ys = fwd.outvars[scan_counts(fwd)[2] :]
    return sum(nbytes(v.aval) for v in ys)

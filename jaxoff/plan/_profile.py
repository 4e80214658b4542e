"""Profile of one model and batch shape: what each named residual costs in bytes and in
recompute FLOPs, and what parameters, gradients and optimizer states weigh.

Measured on the traced and compiled program, not from formulas of the model:

* **per-name bytes, predecessors and recompute FLOPs** from the jaxpr of one scanned
  block (:func:`~jaxoff.plan._jaxpr.block_values`);
* **which names the backward pass needs** from the residuals the forward layer scan
  hands to the backward one, traced once with every name kept and once per name with
  that name dropped (a name whose drop changes nothing is only needed to recompute
  others);
* **step FLOPs** from the jaxpr of the whole train step, scans times their length
  (``cost_analysis`` counts a scan body once);
* **workspace** (temporaries that are not stacked residuals: gradients, the backward
  of one layer, the head and loss) from ``compiled.memory_analysis()`` of the scanned
  step, compiled with every name kept and with every name recomputed: that one is set
  after the profile by :func:`jaxoff.plan._calibrate.calibrate_workspace`, which prices
  the two plans with the cost model (``jaxoff.plan.profile`` runs both).
"""

from __future__ import annotations

import dataclasses
import math

import jax

from ..nn import Stack, check_model
from ..policy import Policy, apply_policy
from ..step import abstract_state, compile_step, make_loss_fn, make_train_step, optimizer, tokens
from ._jaxpr import block_values, find_scans, jaxpr_flops, residual_bytes

CARRY = "layer_input"  # the block input: kept by remat itself whatever the policy says


@dataclasses.dataclass(frozen=True)
class NameProfile:
    """One named residual, per layer.

    Attributes:
        name: the residual name.
        bytes: size of one layer's value.
        flops: FLOPs to recompute it from its predecessors.
        preds: names it is computed from (through untagged ops).
        direct: the backward pass reads it (if not kept, it must be recomputed); when
            False it is needed only to recompute other names.
        fixed: the planner cannot change it (the scan carry, kept by remat itself).
    """

    name: str
    bytes: int
    flops: float
    preds: tuple[str, ...]
    direct: bool
    fixed: bool = False


@dataclasses.dataclass(frozen=True)
class Profile:
    """Everything the planner's cost model reads about a model at one batch shape.

    Byte figures are per step; ``names`` are per layer (and per micro-batch with
    ``grad_accum`` > 1: recomputation and offload traffic then happen ``grad_accum`` times
    a step).
    """

    model: str
    model_config: dict
    batch: int
    seq: int
    num_layers: int
    names: tuple[NameProfile, ...]
    base_flops: float  # whole train step, every name kept (no recompute of names)
    layer_flops: float  # forward + backward of one block, every name kept
    fixed_residual_bytes: int  # stacked values kept whatever the plan (carry, layer params)
    workspace_bytes: int  # device temporaries besides the stacked residuals, nothing recomputed
    workspace_range: tuple[int, int]  # (every name kept, every name recomputed)
    param_bytes: int
    grad_bytes: int
    opt_bytes: int
    layer_param_bytes: int  # one block's parameters (a streaming buffer)
    input_bytes: int
    recompute_workspace: float = 0.0  # extra workspace per byte of one layer's recomputed names
    kept_widening: float = 1.0  # calibrating backend's device bytes per traced byte kept
    # micro-batches per step (``--grad-accum``): ``batch`` is one micro-batch's rows, the
    # per-name figures are one micro-batch's, and the workspace is measured on the
    # accumulating step (its float32 gradient accumulator included)
    grad_accum: int = 1

    def name(self, n: str) -> NameProfile:
        return {p.name: p for p in self.names}[n]

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["names"] = [dataclasses.asdict(n) for n in self.names]
        return d

    @classmethod
    def from_json(cls, d: dict) -> Profile:
        d = dict(d)
        d["names"] = tuple(NameProfile(**{**n, "preds": tuple(n["preds"])}) for n in d["names"])
        d["workspace_range"] = tuple(d["workspace_range"])
        return cls(**d)


def config_fingerprint(model_cfg) -> dict:
    """The fields of a model config that fix its shapes and dtypes (not its stack or name)."""
    d = {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(model_cfg)}
    for key in ("stack", "name"):
        d.pop(key, None)
    return {
        k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v
        for k, v in d.items()
    }


def _grad_jaxpr(model_cfg, batch: int, seq: int):
    graphdef, state = abstract_state(model_cfg, optimizer())
    tok = tokens(batch, seq)
    return jax.make_jaxpr(jax.value_and_grad(make_loss_fn(graphdef)))(state.params, tok, tok)


def _step_jaxpr(model_cfg, batch: int, seq: int, grad_accum: int = 1):
    tx = optimizer()
    graphdef, state = abstract_state(model_cfg, tx)
    tok = tokens(grad_accum * batch, seq)
    return jax.make_jaxpr(make_train_step(graphdef, tx, grad_accum=grad_accum))(state, tok, tok)


def names_policy(actions: dict[str, str], names=None):
    """A :class:`jaxoff.policy.Policy` over ``names`` (the model's residual names) from
    ``{name: action}`` (unlisted names remat)."""

    return Policy.from_mapping({"*": "remat", **actions}, names=names)


def with_policy(model_cfg, actions: dict[str, str]):
    return apply_policy(model_cfg, names_policy(actions, model_cfg.residual_names))


def _plain(model_cfg):
    """``model_cfg`` with a plain stack (no remat, one scan, no streaming)."""

    check_model(model_cfg, needs=["policy"])
    return dataclasses.replace(model_cfg, stack=Stack())


def _tree_bytes(tree) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def trace_profile(
    model_cfg, batch: int, seq: int, *, model: str = "custom", grad_accum: int = 1
) -> Profile:
    """Profiles ``model_cfg`` (a :class:`jaxoff.nn.LayeredModel`) at ``batch x seq`` tokens
    from its traced step, without compiling it: the workspace stays 0 until
    :func:`jaxoff.plan._calibrate.calibrate_workspace` sets it (:func:`jaxoff.plan.profile`
    does both). ``grad_accum``: micro-batches of ``batch`` rows per step (``jaxoff train
    --grad-accum``): the names are one micro-batch's, the step's FLOPs all of theirs.

    Traces the step ``2 + len(names)`` times (fast: no compile).

    Example:
        >>> from jaxoff.models.gpt import CONFIGS
        >>> p = trace_profile(CONFIGS["tiny"], 2, 16, model="tiny")
        >>> p.name("mlp_up").bytes  # [2, 16, 512] float32
        65536
        >>> p.workspace_bytes
        0
    """

    model_cfg = _plain(model_cfg)
    L = model_cfg.num_layers
    RESIDUAL_NAMES = tuple(model_cfg.residual_names)  # noqa: N806

    # 1. the block's named values, their cones and FLOPs (forward, no remat)
    graphdef, state = abstract_state(model_cfg, optimizer())
    tok = tokens(batch, seq)
    fwd = jax.make_jaxpr(make_loss_fn(graphdef))(state.params, tok, tok)
    body = find_scans(fwd, L)[0].params["jaxpr"]
    values = {v.name: v for v in block_values(body, CARRY)}
    missing = [n for n in RESIDUAL_NAMES if n not in values]
    if missing:
        raise ValueError(f"the traced block does not tag {missing}")

    # 2. residuals handed to the backward pass: all kept, none kept, each one dropped
    keep_all = dict.fromkeys(RESIDUAL_NAMES, "device")
    r_all = residual_bytes(_grad_jaxpr(with_policy(model_cfg, keep_all), batch, seq), L)
    r_none = residual_bytes(_grad_jaxpr(with_policy(model_cfg, {}), batch, seq), L)
    names = []
    for n in RESIDUAL_NAMES:
        v = values[n]
        if n == CARRY:
            names.append(NameProfile(n, v.bytes, 0.0, (), True, fixed=True))
            continue
        dropped = residual_bytes(
            _grad_jaxpr(with_policy(model_cfg, {**keep_all, n: "remat"}), batch, seq), L
        )
        direct = r_all - dropped > 0
        names.append(
            NameProfile(
                n,
                (r_all - dropped) // L if direct else v.bytes,
                v.flops,
                tuple(p for p in v.preds if p in values),
                direct,
            )
        )

    # 3. FLOPs: the whole step with every name kept; one block's forward
    base_flops = jaxpr_flops(_step_jaxpr(with_policy(model_cfg, keep_all), batch, seq, grad_accum))
    fwd_layer = sum(v.flops for v in values.values())
    layer_flops = 3.0 * fwd_layer  # forward + backward (2x) of one block, no recompute

    _, abstract = abstract_state(model_cfg, optimizer())
    param_bytes = _tree_bytes(abstract.params)
    opt_bytes = _tree_bytes(abstract.opt_state)
    layer_param_bytes = sum(
        math.prod(x.shape[1:]) * x.dtype.itemsize
        for x in jax.tree.leaves(abstract.params)
        if x.shape and x.shape[0] == L
    )
    prof = Profile(
        model=model,
        model_config=config_fingerprint(model_cfg),
        batch=batch,
        seq=seq,
        num_layers=L,
        names=tuple(names),
        base_flops=base_flops,
        layer_flops=layer_flops,
        fixed_residual_bytes=r_none,
        workspace_bytes=0,
        workspace_range=(0, 0),
        param_bytes=param_bytes,
        grad_bytes=param_bytes,
        opt_bytes=opt_bytes,
        layer_param_bytes=layer_param_bytes,
        input_bytes=2 * grad_accum * batch * seq * 4,
        grad_accum=grad_accum,
    )
    return prof


def measured_temp_bytes(prof: Profile, model_cfg, actions: dict[str, str]) -> int:
    """``compiled.memory_analysis().temp_size_in_bytes`` of the scanned step with a plan
    (over ``prof.grad_accum`` micro-batches: its gradient accumulator included)."""

    cfg = with_policy(model_cfg, actions)
    compiled = compile_step(cfg, prof.batch, prof.seq, grad_accum=prof.grad_accum)[0]
    return temp_bytes(compiled)


def temp_bytes(compiled) -> int:
    """``compiled.memory_analysis().temp_size_in_bytes``: XLA's temporaries of a program."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise RuntimeError(f"XLA gives no memory analysis on {jax.default_backend()}")
    return int(analysis.temp_size_in_bytes)


def traced_residual_bytes(model_cfg, batch: int, seq: int, actions: dict[str, str]) -> int:
    """Stacked residual bytes of the traced step under a plan (for validation)."""
    cfg = _plain(model_cfg)
    return residual_bytes(_grad_jaxpr(with_policy(cfg, actions), batch, seq), cfg.num_layers)

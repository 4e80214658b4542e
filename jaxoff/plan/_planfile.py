"""Plan files: JSON that ``jaxoff plan`` writes and ``jaxoff train --plan FILE`` runs.

A plan records the model it was made for (the shape/dtype fields of its model config)
and the batch shape; running it on another model is refused with a clear error.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from .._errors import ConfigError
from ..policy import Policy
from ._cost import Plan, Prediction
from ._profile import CARRY, config_fingerprint

VERSION = 1


def check_writable(path: str | Path, overwrite: bool) -> None:
    """Raises :class:`ConfigError` when a plan may not be written to ``path``: it is a
    directory, or an existing file and not ``overwrite``."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--out {path} is a directory; name a .json file")
    if path.exists() and not overwrite:
        raise ConfigError(
            f"--out {path} already exists; pass --overwrite to replace it, or choose another --out"
        )


@dataclasses.dataclass(frozen=True)
class PlanFile:
    """What a plan file holds.

    Attributes:
        model: the model's name (a size name or ``package.module:factory``).
        model_config: shape and dtype fields of the model it was made for.
        batch, seq: the batch shape it was made for.
        plan: per-name actions and the homes of parameters and optimizer states.
        hardware: the budgets and speeds it was made for.
        prediction: the cost model's figures for the plan.
        baseline: the greedy plan's figures (or ``None`` if greedy found none).
        grad_accum: micro-batches of ``batch`` rows per step it was made for
            (``--grad-accum``; 1 in a file written before the option).
    """

    model: str
    model_config: dict
    batch: int
    seq: int
    plan: Plan
    hardware: dict
    prediction: dict
    baseline: dict | None = None
    grad_accum: int = 1

    def policy(self):
        """The :class:`jaxoff.policy.Policy` of the plan's residual actions."""

        actions = dict(self.plan.actions)
        return Policy.from_mapping(actions, names=tuple(actions))

    def policy_spec(self) -> str:
        """The policy spelled for ``--policy`` (``name=action,...``)."""
        return ",".join(f"{n}={a}" for n, a in self.plan.actions)

    def to_json(self) -> dict:
        return {
            "version": VERSION,
            "model": self.model,
            "model_config": self.model_config,
            "batch": self.batch,
            "seq": self.seq,
            "grad_accum": self.grad_accum,
            "plan": {
                "actions": dict(self.plan.actions),
                "params": self.plan.params,
                "opt": self.plan.opt,
            },
            "hardware": self.hardware,
            "prediction": self.prediction,
            "baseline": self.baseline,
        }

    @classmethod
    def from_json(cls, d: dict) -> PlanFile:
        if d.get("version") != VERSION:
            raise ConfigError(
                f"plan file version {d.get('version')!r} is not {VERSION}; make it again "
                f"with this jaxoff's `jaxoff plan`"
            )
        p = d["plan"]
        plan = Plan(tuple(p["actions"].items()), p["params"], p["opt"])
        return cls(
            d["model"],
            d["model_config"],
            d["batch"],
            d["seq"],
            plan,
            d["hardware"],
            d["prediction"],
            d.get("baseline"),
            d.get("grad_accum", 1),
        )

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Writes the plan to ``path``; an existing file is refused unless ``overwrite``."""
        path = Path(path)
        check_writable(path, overwrite)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n"
        try:
            with open(path, "w" if overwrite else "x") as f:
                f.write(text)
        except FileExistsError:  # made since the check
            check_writable(path, overwrite)
            raise
        return path

    def check_model(
        self,
        model_cfg,
        batch: int | None = None,
        seq: int | None = None,
        grad_accum: int | None = None,
    ):
        """Raises :class:`ConfigError` unless ``model_cfg`` is the model planned for (and
        ``batch``, ``seq``, ``grad_accum`` the shape, where given)."""
        have = config_fingerprint(model_cfg)
        diff = {
            k: (self.model_config.get(k), have.get(k))
            for k in sorted(set(have) | set(self.model_config))
            if self.model_config.get(k) != have.get(k)
        }
        if diff:
            shown = ", ".join(
                f"{k} planned {a!r} but running {b!r}"
                for k, a, b in ((k, *v) for k, v in diff.items())
            )
            raise ConfigError(
                f"this plan was made for model {self.model!r} and does not fit the model "
                f"being run ({shown}); make a plan for this model with "
                f"`jaxoff plan --model ...`"
            )
        if (batch, seq) != (None, None) and (batch, seq) != (self.batch, self.seq):
            raise ConfigError(
                f"this plan was made for batch {self.batch} x seq {self.seq}, not "
                f"{batch} x {seq}: activation memory depends on both; pass --batch-size "
                f"{self.batch} --seq-len {self.seq} or plan again"
            )
        if grad_accum is not None and grad_accum != self.grad_accum:
            raise ConfigError(
                f"this plan was made for --grad-accum {self.grad_accum}, not {grad_accum}: "
                f"the gradient accumulator's memory and the step's time depend on it; pass "
                f"--grad-accum {self.grad_accum} or plan again with --grad-accum {grad_accum}"
            )


def load_plan(path: str | Path) -> PlanFile:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--plan {path}: no such file (write one with `jaxoff plan --out`)")
    try:
        return PlanFile.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"--plan {path}: not a jaxoff plan file ({e})") from None


def prediction_json(pred: Prediction) -> dict:
    d = dataclasses.asdict(pred)
    d["step_s"] = pred.step_s
    return d


def train_homes(pf: PlanFile, store: str = "auto") -> tuple[dict, list[str]]:
    """The ``TrainConfig`` fields that realise a plan's homes, and notes on what differs.

    * optimizer states ``device``: ``--store none``; ``host``: a ``host_opt`` /
      ``host_params*`` placement (update on the host, ZeRO-Offload); ``nvme``: the
      optimizer paged to disk (``--store``: the one given, else ``auto``), its first pages
      in host RAM as far as the plan leaves it free (``--host-mem``, the RAM tier).
    * parameters ``device``; ``host``: streamed one layer ahead
      (``host_params_stream1``, the planner's cost model) when every residual is
      recomputed (streaming recomputes each block), else copied whole (``host_params``);
      ``nvme``: the stacked block parameters paged to the store by Fuyou's step
      (``--fuyou --page-params``), read a layer ahead in forward and in backward; its
      optimizer state is then paged too, and each block recomputed in backward (notes say
      so where the plan differs). Fuyou's step cannot clip by the global norm: the
      trainer asks for ``--clip-norm 0``.
    """
    notes = []
    params, opt = pf.plan.params, pf.plan.opt

    if params == "nvme":
        if opt != "nvme":
            notes.append(
                f"parameters on NVMe are paged by Fuyou's step, which pages the optimizer "
                f"state too (the plan keeps it in {opt} memory)"
            )
        notes.append(
            "parameters on NVMe: Fuyou's step (--fuyou --page-params) recomputes each block "
            "in backward; the plan's remat policy does not apply"
        )
        store = store if store != "none" else "auto"
        return {
            "policy": "none",
            "placement": "device",
            "store": store,
            "fuyou": True,
            "page_params": True,
        }, notes
    all_remat = all(a == "remat" for n, a in pf.plan.actions if n != CARRY)
    if params == "host":
        if all_remat:
            placement, policy = "host_params_stream1", "full"
        else:
            placement, policy = "host_params", pf.policy_spec()
            notes.append(
                "parameters are copied to the device whole (host_params), not "
                "streamed: streaming needs every residual recomputed"
            )
    else:
        placement, policy = ("host_opt" if opt == "host" else "device"), pf.policy_spec()
    if opt == "nvme":
        store = store if store != "none" else "auto"
    else:
        store = "none"
    homes = {"policy": policy, "placement": placement, "store": store}
    tier = int(pf.prediction.get("ram_tier_bytes", 0))
    if opt == "nvme" and tier:
        homes["host_mem"] = str(tier)  # the store's RAM tier (the host memory left free)
    return homes, notes


def apply_plan(cfg):
    """``TrainConfig`` with the plan of ``cfg.plan`` applied: its remat/offload policy and
    the homes of parameters and optimizer states (:func:`train_homes`).

    Checks the plan was made for this model and batch shape; prints what the trainer
    cannot realise exactly.
    """

    pf = load_plan(cfg.plan)
    model_cfg = dataclasses.replace(cfg, plan=None, policy="none").model_config()
    pf.check_model(model_cfg, cfg.batch_size, cfg.seq_len, cfg.grad_accum)
    changes, notes = train_homes(pf, cfg.store)
    for note in notes:
        print(f"jaxoff train --plan: {note}", file=sys.stderr)
    return dataclasses.replace(cfg, **changes)

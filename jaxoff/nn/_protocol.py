"""The model protocol: what ``jaxoff train``, ``compare``, ``plan`` and the strategies need of a
model, and how a model is named on the command line.

A model is described by a **config**, a frozen dataclass with these fields and methods (the GPT
in ``models/gpt.py`` and the Llama in ``models/llama.py`` are two implementations; a user's is a
third):

==================  =========================================================================
``num_layers``      depth of the stacked blocks
``max_seq_len``     longest sequence the model takes
``vocab_size``      tokens are ``int32`` in ``[0, vocab_size)``
``dtype``           compute dtype name (``"float32"``, ``"bfloat16"``)
``param_dtype``     parameter dtype name
``stack``           a :class:`jaxoff.nn.Stack`: how the blocks run (jaxoff sets it)
``residual_names``  the names the blocks tag with ``checkpoint_name`` (what policies name)
``build(rngs)``     the ``nnx.Module``
``num_params()``    parameter count (optional: counted from the built shapes otherwise)
==================  =========================================================================

The built module has:

* ``blocks``: the stacked blocks (parameters stacked on a leading layer axis, e.g. made by
  :func:`jaxoff.nn.stacked`); ``blocks`` is also their path in the parameter tree;
* ``embed_tokens(tokens[B, T]) -> x[B, T, D]`` and ``logits(x) -> [B, T, vocab_size]``
  (float32);
* ``__call__(tokens) = logits(run_stack(blocks, embed_tokens(tokens), config.stack))``.

Per-call inputs: ``__call__`` may take a ``deterministic`` (or ``train``) keyword; jaxoff
passes ``deterministic=False`` (``train=True``) when it trains and ``True`` (``False``) when
it evaluates, and evaluates after ``model.eval()`` (NNX's switch of ``nnx.Dropout`` and
``nnx.BatchNorm`` to evaluation). The model hands what its blocks need besides the hidden
state (an attention mask or segment ids, positions, that flag) to
``run_stack(blocks, x, config.stack, **inputs)``, which calls every block as
``block(h, **inputs)``: the same inputs for every layer of one call.

State besides ``nnx.Param`` (``nnx.Dropout``'s RNG streams, ``nnx.BatchNorm``'s statistics):
the optimizer sees the parameters only; the rest is carried through the step (the ``rest``
of a ``TrainStateWithRest``), updated every step and checkpointed. Blocks holding it run
block by block (``remat_every=1``, no streaming); Fuyou and the sharded paged step refuse
it.

The loss is next-token cross entropy on the float32 logits (jaxoff computes it).

On the command line a model is a size name (``tiny``, ``llama-tiny``, ...) or
``package.module:factory``, where ``factory()`` returns a config (or the attribute is a config).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import jax
from flax import nnx

from .._errors import ConfigError, OptionError
from ._stack import Stack, model_state

BLOCKS = "blocks"
"""Attribute of the built model, and path in its parameter tree, of the stacked blocks."""


@runtime_checkable
class LayeredModel(Protocol):
    """A model config jaxoff can train (see the module docstring for each member)."""

    num_layers: int
    max_seq_len: int
    vocab_size: int
    dtype: str
    param_dtype: str
    stack: Stack
    residual_names: tuple[str, ...]

    def build(self, rngs: nnx.Rngs) -> nnx.Module: ...


_FIELDS = ("num_layers", "max_seq_len", "vocab_size", "dtype", "param_dtype", "stack")

_FEATURE_NEEDS = {
    # feature -> what the model must provide for it, in words
    "policy": "residual_names (the names its blocks tag with checkpoint_name)",
    "streaming": f"stacked blocks at .{BLOCKS} run with jaxoff.nn.run_stack",
    "segments": f"stacked blocks at .{BLOCKS} run with jaxoff.nn.run_stack",
    "fuyou": f"embed_tokens(tokens), stacked blocks at .{BLOCKS} and logits(x) on the model",
}


def model_name(cfg: Any) -> str:
    """A short name of a model config for tables and logs."""
    return getattr(cfg, "name", None) or type(cfg).__name__


def check_model(cfg: Any, needs: Iterable[str] = ()) -> Any:
    """Returns ``cfg`` if it implements the protocol (and what ``needs`` names), else raises
    :class:`jaxoff.ConfigError` naming what is missing.

    ``needs`` are features: ``policy``, ``streaming``, ``segments``, ``fuyou``, ``sharded``
    (the last two carry ``nnx.Param`` state only: a model with RNG streams or batch
    statistics is refused).
    """
    who = model_name(cfg)
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise ConfigError(
            f"model {who!r} is not a model config (a frozen dataclass instance with "
            f"{', '.join(_FIELDS)}, residual_names and build(rngs)); see jaxoff.nn's docs"
        )
    cfg = typing.cast(Any, cfg)  # a dataclass instance with the protocol's fields, checked below
    missing = [f for f in _FIELDS if not hasattr(cfg, f)]
    if not callable(getattr(cfg, "build", None)):
        missing.append("build(rngs)")
    if missing:
        raise ConfigError(f"model {who!r} lacks {', '.join(missing)} of the jaxoff model protocol")
    if not isinstance(cfg.stack, Stack):
        raise ConfigError(f"model {who!r}: its stack field must be a jaxoff.nn.Stack")
    needs = list(needs)
    if needs and "policy" in needs and not tuple(getattr(cfg, "residual_names", ()) or ()):
        raise ConfigError(f"model {who!r} has no {_FEATURE_NEEDS['policy']}, which a policy needs")
    if any(n in ("streaming", "segments", "fuyou") for n in needs):
        module = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
        if not isinstance(getattr(module, BLOCKS, None), nnx.Module):
            feature = next(n for n in needs if n in ("streaming", "segments", "fuyou"))
            raise ConfigError(
                f"model {who!r} has no {_FEATURE_NEEDS[feature]}, which {feature} needs"
            )
        if "fuyou" in needs and not (hasattr(module, "embed_tokens") and hasattr(module, "logits")):
            raise ConfigError(f"model {who!r} has no {_FEATURE_NEEDS['fuyou']}, which fuyou needs")
    for feature in ("fuyou", "sharded"):
        if feature in needs:
            _refuse_state(cfg, who, _STATELESS[feature])
    return cfg


_STATELESS = {
    # feature -> what it is, and what to do instead, for a model with state besides nnx.Param
    "fuyou": "the fuyou strategy (each layer's update inside backward) carries nnx.Param "
    "only: train it without `fuyou=True`",
    "sharded": "the sharded paged step (`fsdp` with `store`) carries nnx.Param only: train it "
    "on one device, or with `fsdp` and `store='none'`",
}


def _refuse_state(cfg: Any, who: str, what: str) -> None:

    module = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
    state = model_state(module)
    if jax.tree.leaves(state):
        kinds = sorted({type(v).__name__ for v in jax.tree.leaves(state, is_leaf=_is_variable)})
        raise OptionError(
            f"model {who!r} holds state besides nnx.Param ({', '.join(kinds)}: dropout RNG "
            f"streams or batch statistics); {what}"
        )


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def with_stack(cfg: Any, **changes: Any) -> Any:
    """``cfg`` with its :class:`Stack` fields replaced (e.g. ``policy=``, ``stream_window=``)."""
    stack = dataclasses.replace(cfg.stack, **changes)
    stack.check_depth(cfg.num_layers)
    return dataclasses.replace(cfg, stack=stack)


def count_params(cfg: Any) -> int:
    """``cfg.num_params()`` when the config has it, else counted from the built shapes."""
    if callable(getattr(cfg, "num_params", None)):
        return int(cfg.num_params())
    state = nnx.state(nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0))), nnx.Param)
    return sum(math.prod(a.shape) for a in jax.tree.leaves(state))

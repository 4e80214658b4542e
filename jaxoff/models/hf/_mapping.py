"""Which Hugging Face tensor makes which jaxoff parameter, and how.

A `Rule` pairs one checkpoint tensor (its name, ``{i}`` standing for the layer of a block
tensor) with the jaxoff parameters it makes (usually one; GPT-2's ``c_attn`` makes the query,
key and value projections) and the two conversions between them. The conversions use only
``reshape``, ``.T``, slices and :func:`_cat`, so they run on numpy arrays (a load, an export)
and on abstract shapes (the shape checks, with :func:`jax.eval_shape`).

``models/llama.py`` already uses the halves rotary layout of Hugging Face's Llama checkpoints,
so the query and key projections are not permuted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxoff.models.gpt import GPTConfig
from jaxoff.models.llama import LlamaConfig

Path = tuple[str, ...]  # a parameter's path in the model's nnx.Param state


@dataclasses.dataclass(frozen=True)
class Rule:
    """One checkpoint tensor and the jaxoff parameters it makes.

    Attributes:
      hf: the tensor's name in the checkpoint; ``{i}`` is the layer of a block tensor.
      paths: the jaxoff parameters it makes (under ``blocks`` for a block tensor, whose
        stacked leaf has the layer first; the conversions see one layer).
      to_jax: the tensor to the parameters, one per path.
      to_hf: the parameters (one per path) to the tensor.
    """

    hf: str
    paths: tuple[Path, ...]
    to_jax: Callable[[np.ndarray], tuple[np.ndarray, ...]]
    to_hf: Callable[..., np.ndarray]

    @property
    def is_block(self) -> bool:
        return "{i}" in self.hf

    def name(self, layer: int | None = None) -> str:
        return self.hf.format(i=layer) if self.is_block else self.hf

    def hf_shape(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
        """The tensor's shape, from its parameters' (one layer's) shapes."""
        abstract = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
        return tuple(jax.eval_shape(self.to_hf, *abstract).shape)


def _cat(xs, axis: int):
    """Concatenation of numpy arrays with numpy, of abstract ones with jax."""
    return (np if all(isinstance(x, np.ndarray) for x in xs) else jnp).concatenate(xs, axis)


def same(hf: str, path: Path) -> Rule:
    """A tensor that is the parameter as it is."""
    return Rule(hf, (path,), lambda w: (w,), lambda p: p)


def linear(hf: str, path: Path, shape: tuple[int, ...], n_in: int) -> Rule:
    """A ``torch.nn.Linear`` weight (``[out, in]``) for a kernel of ``shape`` whose first
    ``n_in`` axes are its input."""
    n_out = math.prod(shape[n_in:])

    def to_jax(w):
        return (w.T.reshape(shape),)

    def to_hf(p):
        return p.reshape(-1, n_out).T

    return Rule(hf, (path,), to_jax, to_hf)


def reshaped(hf: str, path: Path, shape: tuple[int, ...], hf_shape: tuple[int, ...]) -> Rule:
    """A tensor whose values are the parameter's, in another shape (a bias per head, a
    ``Conv1D`` weight that is already ``[in, out]``)."""
    return Rule(hf, (path,), lambda w: (w.reshape(shape),), lambda p: p.reshape(hf_shape))


def split_last(hf: str, paths: tuple[Path, ...], shapes: tuple[tuple[int, ...], ...]) -> Rule:
    """A tensor whose last axis is its parameters side by side (GPT-2's ``c_attn``: the
    query, key and value projections), each reshaped to its ``shapes``, whose last two axes
    are (heads, head size)."""
    n = len(paths)

    def to_jax(w):
        width = w.shape[-1] // n
        return tuple(w[..., k * width : (k + 1) * width].reshape(s) for k, s in enumerate(shapes))

    def to_hf(*ps):
        return _cat([p.reshape(*p.shape[:-2], -1) for p in ps], -1)

    return Rule(hf, paths, to_jax, to_hf)


def _llama_rules(cfg: LlamaConfig) -> list[Rule]:
    d, h, kv, dh, f = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff
    L = "model.layers.{i}."
    B = ("blocks",)
    rules = [
        same("model.embed_tokens.weight", ("embed", "embedding")),
        same(L + "input_layernorm.weight", (*B, "attn_norm", "scale")),
        linear(L + "self_attn.q_proj.weight", (*B, "attn", "q", "kernel"), (d, h, dh), 1),
        linear(L + "self_attn.k_proj.weight", (*B, "attn", "k", "kernel"), (d, kv, dh), 1),
        linear(L + "self_attn.v_proj.weight", (*B, "attn", "v", "kernel"), (d, kv, dh), 1),
        linear(L + "self_attn.o_proj.weight", (*B, "attn", "out", "kernel"), (h, dh, d), 2),
        same(L + "post_attention_layernorm.weight", (*B, "mlp_norm", "scale")),
        linear(L + "mlp.gate_proj.weight", (*B, "mlp", "gate", "kernel"), (d, f), 1),
        linear(L + "mlp.up_proj.weight", (*B, "mlp", "up", "kernel"), (d, f), 1),
        linear(L + "mlp.down_proj.weight", (*B, "mlp", "down", "kernel"), (f, d), 1),
        same("model.norm.weight", ("final_norm", "scale")),
    ]
    if cfg.qkv_bias:
        for name, heads in (("q", h), ("k", kv), ("v", kv)):
            path = (*B, "attn", name, "bias")
            rules.append(reshaped(L + f"self_attn.{name}_proj.bias", path, (heads, dh), (-1,)))
    if cfg.qk_norm:
        rules.append(same(L + "self_attn.q_norm.weight", (*B, "attn", "q_norm", "scale")))
        rules.append(same(L + "self_attn.k_norm.weight", (*B, "attn", "k_norm", "scale")))
    if not cfg.tie_embeddings:
        rules.append(linear("lm_head.weight", ("head", "kernel"), (d, cfg.vocab_size), 1))
    return rules


def _gpt2_rules(cfg: GPTConfig, prefix: str) -> list[Rule]:
    d, h, dh, f = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff
    L = prefix + "h.{i}."
    B = ("blocks",)
    attn = tuple((*B, "attn", n) for n in ("q", "k", "v"))
    rules = [
        same(prefix + "wte.weight", ("embed", "embedding")),
        same(prefix + "wpe.weight", ("pos_embed", "embedding")),
        same(L + "ln_1.weight", (*B, "attn_norm", "scale")),
        same(L + "ln_1.bias", (*B, "attn_norm", "bias")),
        # Conv1D weights are [in, out] already: no transpose
        split_last(
            L + "attn.c_attn.weight", tuple((*p, "kernel") for p in attn), ((d, h, dh),) * 3
        ),
        split_last(L + "attn.c_attn.bias", tuple((*p, "bias") for p in attn), ((h, dh),) * 3),
        reshaped(L + "attn.c_proj.weight", (*B, "attn", "out", "kernel"), (h, dh, d), (h * dh, d)),
        same(L + "attn.c_proj.bias", (*B, "attn", "out", "bias")),
        same(L + "ln_2.weight", (*B, "mlp_norm", "scale")),
        same(L + "ln_2.bias", (*B, "mlp_norm", "bias")),
        same(L + "mlp.c_fc.weight", (*B, "mlp", "up", "kernel")),
        same(L + "mlp.c_fc.bias", (*B, "mlp", "up", "bias")),
        same(L + "mlp.c_proj.weight", (*B, "mlp", "down", "kernel")),
        same(L + "mlp.c_proj.bias", (*B, "mlp", "down", "bias")),
        same(prefix + "ln_f.weight", ("final_norm", "scale")),
        same(prefix + "ln_f.bias", ("final_norm", "bias")),
    ]
    del f
    if not cfg.tie_embeddings:
        rules.append(linear("lm_head.weight", ("head", "kernel"), (d, cfg.vocab_size), 1))
    return rules


GPT2_PREFIX = "transformer."
"""The prefix ``GPT2LMHeadModel.save_pretrained`` gives GPT-2's tensors (OpenAI's own
``gpt2`` checkpoint has none; a load accepts both)."""

IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
"""Buffers some checkpoints hold that are not parameters (GPT-2's causal mask, old rotary
tables): a load skips them."""


def rules(cfg: LlamaConfig | GPTConfig, prefix: str = GPT2_PREFIX) -> list[Rule]:
    """The mapping of a model of ``cfg``: every parameter of the model is made by exactly one
    rule (a test checks it). ``prefix``: GPT-2's tensor name prefix."""
    if isinstance(cfg, GPTConfig):
        if cfg.positions != "learned":
            raise ValueError("a GPT with rotary positions has no Hugging Face counterpart")
        return _gpt2_rules(cfg, prefix)
    return _llama_rules(cfg)

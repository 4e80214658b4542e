"""A local Hugging Face checkpoint folder into a jaxoff model, one layer at a time."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxoff.models.gpt import GPTConfig
from jaxoff.models.llama import LlamaConfig

from . import _mapping
from ._config import model_config, read_config
from ._errors import PretrainedError
from ._safetensors import DTYPES, TensorInfo, TensorReader, read_header

INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
)
"""The files of a checkpoint folder besides its config and weights that an export copies."""


def _tensors(directory: Path) -> dict[str, TensorInfo]:
    """Every tensor of the folder's safetensors files (one file, or the shards its index
    names), each checked to lie inside its file."""
    index = directory / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PretrainedError(
                f"{index}: cannot read its weight_map ({e!r}): restore the original index"
            ) from None
        headers: dict[str, dict[str, TensorInfo]] = {}
        for name, shard in sorted(weight_map.items()):
            if shard not in headers:
                if not (directory / shard).is_file():
                    raise PretrainedError(
                        f"{index}: tensor {name!r} is in shard {shard}, which is missing from "
                        f"{directory}: download every shard the index names"
                    )
                headers[shard] = read_header(directory / shard)
            if name not in headers[shard]:
                raise PretrainedError(
                    f"{index}: tensor {name!r} is not in its shard {shard}: the index and the "
                    "shards disagree; download the checkpoint again"
                )
        return {name: headers[shard][name] for name, shard in weight_map.items()}
    files = sorted(directory.glob("*.safetensors"))
    if len(files) != 1:
        what = "no *.safetensors file" if not files else f"{len(files)} safetensors files"
        raise PretrainedError(
            f"{directory} has {what} and no {INDEX}: jaxoff reads one model.safetensors or "
            "shards with their index (convert a PyTorch *.bin checkpoint to safetensors)"
        )
    return read_header(files[0])


def _key(k) -> str | None:
    return getattr(k, "key", None)


def abstract_params(cfg: LlamaConfig | GPTConfig):
    """``(graphdef, {path: ShapeDtypeStruct}, state)`` of a model of ``cfg``, nothing
    allocated."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0))), nnx.Param)
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    shapes = {tuple(k for k in map(_key, p) if k is not None): x for p, x in flat}
    return graphdef, shapes, state


class PretrainedLeaf:
    """A stacked block parameter read from the checkpoint one layer at a time: ``leaf[j]`` is
    layer ``j``'s array (read from disk then, exactly that layer's tensor bytes); the whole
    leaf never exists. It has the whole leaf's ``shape``, ``dtype``, ``ndim`` and ``size``,
    as ``jaxoff.nn.LayerLeaf`` has, so ``fuyou_init`` takes it."""

    def __init__(self, source: Pretrained, rule: _mapping.Rule, part: int, sds):
        self._source, self._rule, self._part = source, rule, part
        self.shape, self.dtype = tuple(sds.shape), np.dtype(sds.dtype)
        self.ndim, self.size = len(self.shape), math.prod(self.shape)

    def __getitem__(self, j: int) -> np.ndarray:
        j = int(j)
        if not 0 <= j < self.shape[0]:
            raise IndexError(f"layer {j} of a stack of {self.shape[0]}")
        return self._source._convert(self._rule, j)[self._part].astype(self.dtype)

    def __array__(self, *args, **kwargs):
        raise TypeError(
            f"a pretrained block leaf of shape {self.shape} is read one layer at a time: "
            "index it (leaf[j]); it cannot be made whole"
        )

    def __repr__(self) -> str:
        return f"PretrainedLeaf({self._rule.hf!r}, shape={self.shape}, dtype={self.dtype})"


class Pretrained:
    """An open Hugging Face checkpoint folder: its config as a jaxoff model config, its
    tensors' places, checked, and its layers read on demand with positioned reads.

    Everything is checked when it opens (the config, every shard, every tensor's presence,
    shape and dtype, no tensor left over), so a refusal comes before anything is read or
    written. The files stay open until `close` (or the end of a ``with``); nothing is
    mapped into memory.

    Attributes:
      directory: the folder.
      hf_config: its ``config.json``.
      config: the jaxoff model config (``LlamaConfig`` or ``GPTConfig``) it holds.
      model_type: the Hugging Face ``model_type``.
    """

    def __init__(
        self,
        directory,
        *,
        dtype: str = "float32",
        param_dtype: str = "float32",
        name: str | None = None,
    ):
        self.directory = Path(directory)
        self.hf_config = read_config(self.directory)
        self.model_type = self.hf_config.get("model_type")
        self.config = model_config(
            self.hf_config,
            dtype=dtype,
            param_dtype=param_dtype,
            name=name or f"hf:{self.directory.name}",
        )
        self._tensors = _tensors(self.directory)
        self._prefix = ""
        if isinstance(self.config, GPTConfig):
            # GPT2LMHeadModel names its tensors "transformer.*"; OpenAI's checkpoint doesn't
            has = any(n.startswith(_mapping.GPT2_PREFIX) for n in self._tensors)
            self._prefix = _mapping.GPT2_PREFIX if has else ""
        self._check(self.config, self.rules(self.config), leftovers=True)
        self._reader = TensorReader()
        self._last: tuple[str, tuple] | None = None

    def rules(self, cfg: LlamaConfig | GPTConfig) -> list[_mapping.Rule]:
        """The mapping of this checkpoint's tensors to a model of ``cfg``."""
        return _mapping.rules(cfg, self._prefix)

    @property
    def tokenizer_files(self) -> list[Path]:
        """The folder's tokenizer (and generation config) files, for a copy or a
        ``tokenizers.Tokenizer.from_file`` (``tokenizer.json``)."""
        return [self.directory / n for n in TOKENIZER_FILES if (self.directory / n).is_file()]

    def _check(self, cfg, rules: list[_mapping.Rule], leftovers: bool = False) -> None:
        _, shapes, _ = abstract_params(cfg)
        made = [p for r in rules for p in r.paths]
        if sorted(made) != sorted(shapes):
            raise RuntimeError(f"the mapping makes {sorted(made)}, the model has {sorted(shapes)}")
        used = set()
        for rule in rules:
            layers = range(cfg.num_layers) if rule.is_block else [None]
            per_layer = tuple(
                shapes[p].shape[1:] if rule.is_block else shapes[p].shape for p in rule.paths
            )
            want = rule.hf_shape(per_layer)
            for j in layers:
                name = rule.name(j)
                info = self._tensors.get(name)
                if info is None:
                    raise PretrainedError(
                        f"{self.directory}: tensor {name!r} is missing: the checkpoint does not "
                        f"match its config.json ({self.model_type}, {cfg.num_layers} layers)"
                    )
                if info.dtype not in DTYPES:
                    raise PretrainedError(
                        f"{info.file}: tensor {name!r} is {info.dtype}: jaxoff reads "
                        f"{', '.join(DTYPES)} weights; convert the checkpoint"
                    )
                if info.shape != want:
                    raise PretrainedError(
                        f"{info.file}: tensor {name!r} has shape {list(info.shape)}, config.json "
                        f"implies {list(want)}: the checkpoint and its config disagree"
                    )
                used.add(name)
        if not leftovers:
            return
        tied = cfg.tie_embeddings and "lm_head.weight" in self._tensors  # a saved copy
        left = [
            n
            for n in self._tensors
            if n not in used
            and not n.endswith(_mapping.IGNORED_SUFFIXES)
            and not (tied and n == "lm_head.weight")
        ]
        if left:
            raise PretrainedError(
                f"{self.directory}: tensor {left[0]!r} (and {len(left) - 1} more) is no "
                f"parameter of the {self.model_type} its config.json describes: the checkpoint "
                "and its config disagree, or it is a variant jaxoff does not read"
            )

    def _convert(self, rule: _mapping.Rule, layer: int | None) -> tuple:
        """The parameters ``rule`` makes for ``layer``; the last conversion is kept, so the
        parameters one tensor makes (GPT-2's ``c_attn``) read it once."""
        name = rule.name(layer)
        key = f"{id(rule)}:{name}"
        if self._last is None or self._last[0] != key:
            self._last = None  # the previous layer's arrays go before the next are read
            self._last = (key, tuple(rule.to_jax(self._reader.read(self._tensors[name]))))
        return self._last[1]

    def params(
        self,
        cfg: LlamaConfig | GPTConfig | None = None,
        *,
        rules: Iterable[_mapping.Rule] | None = None,
    ):
        """``(graphdef, params)`` of a model of ``cfg`` (by default `config`): the
        parameters outside the blocks read (numpy arrays), each stacked block parameter a
        `PretrainedLeaf` read one layer at a time when indexed.

        This is what a model larger than memory is made from: ``fuyou_init(cfg, tx, params,
        page_params=True)`` writes it to a page store layer by layer, every leaf of layer
        ``j`` before layer ``j + 1``, and only one layer is ever in memory. The files must
        stay open (this object not closed) until then.

        Args:
          cfg: the model to fill; give `config` with another ``stack``, dtypes or
            ``max_seq_len``. Its parameter dtype decides the arrays' (float32 masters are
            the checkpoint's values exactly: bfloat16 and float16 widen without rounding).
          rules: the mapping (by default `rules` of ``cfg``), for a variant or a test.
        """
        own = cfg is None and rules is None  # checked when the folder was opened
        cfg = self.config if cfg is None else cfg
        rules = self.rules(cfg) if rules is None else list(rules)
        if not own:
            self._check(cfg, rules)
        graphdef, _, state = abstract_params(cfg)
        made: dict[tuple, tuple[_mapping.Rule, int]] = {}
        for rule in rules:
            for k, path in enumerate(rule.paths):
                made[path] = (rule, k)

        def leaf(path, sds):
            rule, k = made[tuple(x for x in map(_key, path) if x is not None)]
            if rule.is_block:
                return PretrainedLeaf(self, rule, k, sds)
            return np.asarray(self._convert(rule, None)[k], dtype=sds.dtype)

        return graphdef, jax.tree_util.tree_map_with_path(leaf, state)

    def load(
        self,
        cfg: LlamaConfig | GPTConfig | None = None,
        *,
        rules: Iterable[_mapping.Rule] | None = None,
    ) -> nnx.Module:
        """The model of ``cfg`` (by default `config`) with the checkpoint's weights, in
        memory; each stacked parameter is filled layer by layer in place (at most one layer
        of the checkpoint is read at a time). ``cfg`` and ``rules`` as in `params`."""
        graphdef, params = self.params(cfg, rules=rules)

        def whole(x):
            if not isinstance(x, PretrainedLeaf):
                return jnp.asarray(x)
            out = np.empty(x.shape, x.dtype)
            for j in range(x.shape[0]):
                out[j] = x[j]
            return jnp.asarray(out)

        return nnx.merge(graphdef, jax.tree.map(whole, params))

    def close(self) -> None:
        """Closes the checkpoint's files (`PretrainedLeaf` reads fail after it)."""
        self._last = None
        self._reader.close()

    def __enter__(self) -> Pretrained:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_pretrained(
    directory, *, dtype: str = "float32", param_dtype: str = "float32", name: str | None = None
) -> Pretrained:
    """Opens the local Hugging Face checkpoint folder ``directory`` (``config.json``,
    ``model.safetensors`` or shards with ``model.safetensors.index.json``, tokenizer files);
    nothing is downloaded.

    Reads Llama (2, 3, 3.1/3.2 with ``llama3`` rotary scaling; TinyLlama, SmolLM2), Mistral,
    Qwen2, Qwen3 and GPT-2 checkpoints, in transformers v4's and v5's config layouts.

    Args:
      directory: the folder.
      dtype: the model's compute dtype.
      param_dtype: its parameter dtype; float32 (the default) holds the checkpoint's values
        exactly whatever their dtype, as float32 master weights.
      name: the model's name (default ``hf:<folder name>``).

    Raises:
      PretrainedError: the folder cannot be read as a model jaxoff has (the message names
        the file, the key and what to do); nothing has been written.

    Example:
        >>> with open_pretrained(path) as ckpt:  # doctest: +SKIP
        ...     cfg = ckpt.config
        ...     graphdef, params = ckpt.params()  # blocks read layer by layer
        ...     state = fuyou_init(cfg, tx, params, page_params=True)
    """
    return Pretrained(directory, dtype=dtype, param_dtype=param_dtype, name=name)


def from_pretrained(
    directory, *, dtype: str = "float32", param_dtype: str = "float32", name: str | None = None
) -> nnx.Module:
    """The model of a local Hugging Face checkpoint folder, in memory (its ``cfg`` is the
    jaxoff config). Each block tensor is read on its own (``os.pread`` at its offsets) into
    its layer of the stacked parameter; the checkpoint is never whole in memory beside the
    model. For a model larger than memory use `open_pretrained` and ``params``.

    Args and raises as `open_pretrained`; float32 parameters (the default) are the
    checkpoint's own values exactly (bfloat16 and float16 widen to float32 without rounding).

    Example:
        >>> model = from_pretrained("/models/SmolLM2-135M")  # doctest: +SKIP
        >>> model(tokens).shape  # doctest: +SKIP
        (1, 16, 49152)
    """
    with open_pretrained(directory, dtype=dtype, param_dtype=param_dtype, name=name) as ckpt:
        return ckpt.load()

"""Hugging Face ``config.json`` to a jaxoff model config and back, in both the transformers
v4 layout (``rope_theta``, ``rope_scaling``, ``torch_dtype``) and the v5 one
(``rope_parameters``, ``dtype``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxoff.models.gpt import ACTIVATIONS, GPTConfig
from jaxoff.models.llama import Llama3RopeScaling, LlamaConfig

from ._errors import PretrainedError

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MODEL_TYPES = (*LLAMA_TYPES, "gpt2")
"""The ``model_type`` values jaxoff reads and writes."""

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}

# Hugging Face activation names -> GPTConfig.activation (the same function)
_GPT_ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu"}

_TORCH_DTYPES = ("float32", "bfloat16", "float16")


def read_config(directory: Path) -> dict:
    """The parsed ``config.json`` of ``directory``."""
    path = Path(directory) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PretrainedError(
            f"{path} does not exist: point at a Hugging Face model folder (config.json and "
            "*.safetensors); nothing is downloaded"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise PretrainedError(f"{path}: cannot read it as JSON ({e}): restore the file") from None


def _refuse(key: str, value: Any, what: str) -> PretrainedError:
    return PretrainedError(f"config.json: {key}={value!r} {what}")


def _get(hf: dict, key: str, default: Any = None, *, required: bool = False) -> Any:
    if key not in hf or hf[key] is None:
        if required:
            raise PretrainedError(
                f"config.json has no {key!r}: the checkpoint's config is incomplete; restore "
                "the original config.json"
            )
        return default
    return hf[key]


def _rope(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    """``(theta, scaling)`` from v5's ``rope_parameters`` or v4's ``rope_theta`` and
    ``rope_scaling``."""
    params = hf.get("rope_parameters")
    if params is not None:
        key = "rope_parameters"
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            raise _refuse(key, params, "is not one set of rotary parameters: not supported")
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = params
    else:
        key = "rope_scaling"
        theta = hf.get("rope_theta", 10000.0)
        scaling = hf.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise _refuse(
            "partial_rotary_factor",
            hf["partial_rotary_factor"],
            "is not supported: jaxoff turns every dimension of a head",
        )
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise _refuse(
            f"{key}.rope_type",
            rope_type,
            "is not supported: jaxoff reads 'default' and 'llama3' rotary scaling",
        )
    fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    try:
        missing = next((f for f in fields if scaling.get(f) is None), None)
        if missing is not None:
            raise KeyError(missing)
        return float(theta), Llama3RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise PretrainedError(
            f"config.json: {key} of rope_type 'llama3' has no {e.args[0]!r}: restore the "
            "original config.json"
        ) from None
    except (TypeError, ValueError) as e:
        raise _refuse(key, scaling, f"is not a valid llama3 scaling ({e})") from None


def _no(hf: dict, key: str, bad: Any, what: str) -> None:
    if hf.get(key, None) == bad:
        raise _refuse(key, bad, what)


def _llama(hf: dict, model_type: str, **kw) -> LlamaConfig:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise _refuse("hidden_act", act, "is not supported: the Llama family here uses 'silu'")
    _no(hf, "mlp_bias", True, "is not supported: the Llama family here has no MLP biases")
    if model_type != "qwen2":
        _no(hf, "attention_bias", True, "is not supported: only Qwen2's q/k/v biases are")
    if model_type in ("qwen2", "qwen3"):
        _no(hf, "use_sliding_window", True, "is not supported: set it to false")
    theta, scaling = _rope(hf)
    heads = int(_get(hf, "num_attention_heads", required=True))
    d = int(_get(hf, "hidden_size", required=True))
    head_size = hf.get("head_dim")
    if head_size is not None and d % heads == 0 and int(head_size) == d // heads:
        head_size = None  # the default: one config per model, whoever wrote head_dim
    window = hf.get("sliding_window") if model_type == "mistral" else None
    max_len = int(_get(hf, "max_position_embeddings", 2048))
    try:
        return LlamaConfig(
            num_layers=int(_get(hf, "num_hidden_layers", required=True)),
            d_model=d,
            num_heads=heads,
            num_kv_heads=int(_get(hf, "num_key_value_heads", heads)),
            d_ff=int(_get(hf, "intermediate_size", required=True)),
            max_seq_len=max_len,
            rope_theta=theta,
            norm_eps=float(_get(hf, "rms_norm_eps", 1e-6)),
            tie_embeddings=bool(_get(hf, "tie_word_embeddings", False)),
            vocab_size=int(_get(hf, "vocab_size", required=True)),
            head_size=None if head_size is None else int(head_size),
            rope_scaling=scaling,
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            # a window as long as the longest sequence changes nothing
            sliding_window=None if window is None or window >= max_len else int(window),
            **kw,
        )
    except ValueError as e:
        raise PretrainedError(f"config.json describes no valid {model_type} model: {e}") from None


def _gpt2(hf: dict, **kw) -> GPTConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in _GPT_ACTIVATIONS:
        raise _refuse(
            "activation_function",
            act,
            f"is not supported: jaxoff's GPT has {sorted(_GPT_ACTIVATIONS)}",
        )
    _no(hf, "scale_attn_weights", False, "is not supported: set it to true")
    _no(hf, "scale_attn_by_inverse_layer_idx", True, "is not supported: set it to false")
    _no(hf, "add_cross_attention", True, "is not supported: a decoder only has none")
    d = int(_get(hf, "n_embd", required=True))
    try:
        return GPTConfig(
            num_layers=int(_get(hf, "n_layer", required=True)),
            d_model=d,
            num_heads=int(_get(hf, "n_head", required=True)),
            d_ff=int(_get(hf, "n_inner", 4 * d)),
            max_seq_len=int(_get(hf, "n_positions", 1024)),
            vocab_size=int(_get(hf, "vocab_size", required=True)),
            norm_eps=float(_get(hf, "layer_norm_epsilon", 1e-5)),
            tie_embeddings=bool(_get(hf, "tie_word_embeddings", True)),
            activation=_GPT_ACTIVATIONS[act],
            **kw,
        )
    except ValueError as e:
        raise PretrainedError(f"config.json describes no valid gpt2 model: {e}") from None


def model_config(hf: dict, **kw) -> LlamaConfig | GPTConfig:
    """The jaxoff model config of the Hugging Face config ``hf``; ``kw`` are more fields
    (``dtype``, ``param_dtype``, ``name``...).

    Raises:
      PretrainedError: the config names an architecture or an option jaxoff lacks (the
        message names the key).
    """
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise _refuse(
            "model_type",
            model_type,
            f"is not supported: jaxoff reads {', '.join(MODEL_TYPES)} checkpoints",
        )
    return _gpt2(hf, **kw) if model_type == "gpt2" else _llama(hf, model_type, **kw)


def infer_model_type(cfg: LlamaConfig | GPTConfig) -> str:
    """The Hugging Face ``model_type`` that can hold ``cfg``."""
    if isinstance(cfg, GPTConfig):
        return "gpt2"
    if cfg.qk_norm:
        return "qwen3"
    if cfg.qkv_bias:
        return "qwen2"
    return "mistral" if cfg.sliding_window is not None else "llama"


def _rope_schemas(cfg: LlamaConfig) -> dict:
    """Both rotary schemas: v4's ``rope_theta`` and ``rope_scaling``, v5's
    ``rope_parameters``."""
    s = cfg.rope_scaling
    scaling = (
        None
        if s is None
        else {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    )
    params = {"rope_type": "default", **(scaling or {}), "rope_theta": cfg.rope_theta}
    return {"rope_theta": cfg.rope_theta, "rope_scaling": scaling, "rope_parameters": params}


def hf_config(cfg: LlamaConfig | GPTConfig, model_type: str, dtype: str) -> dict:
    """The ``config.json`` of ``cfg`` as a Hugging Face ``model_type`` whose weights are
    ``dtype``; both rotary schemas and both dtype keys, so transformers v4 and v5 read it.

    Raises:
      PretrainedError: ``model_type`` cannot hold ``cfg`` (the message says which field).
    """
    if model_type not in MODEL_TYPES:
        raise _refuse("model_type", model_type, f"is not one of {', '.join(MODEL_TYPES)}")
    if dtype not in _TORCH_DTYPES:
        raise PretrainedError(f"dtype={dtype!r} is not one of {', '.join(_TORCH_DTYPES)}")
    common = {
        "architectures": [_ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    if model_type == "gpt2":
        if not isinstance(cfg, GPTConfig) or cfg.positions != "learned":
            raise PretrainedError(
                "model_type 'gpt2' holds a GPT with learned positions only: export this model "
                "with its own family"
            )
        act = next(k for k, v in _GPT_ACTIVATIONS.items() if v == cfg.activation)
        assert cfg.activation in ACTIVATIONS
        return {
            **common,
            "n_embd": cfg.d_model,
            "n_layer": cfg.num_layers,
            "n_head": cfg.num_heads,
            "n_inner": cfg.d_ff,
            "n_positions": cfg.max_seq_len,
            "n_ctx": cfg.max_seq_len,
            "layer_norm_epsilon": cfg.norm_eps,
            "activation_function": act,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
    if not isinstance(cfg, LlamaConfig):
        raise PretrainedError(f"model_type {model_type!r} holds a Llama, not a {type(cfg)}")
    need = {
        "qkv_bias": model_type == "qwen2",
        "qk_norm": model_type == "qwen3",
    }
    for field, value in need.items():
        if getattr(cfg, field) != value:
            raise PretrainedError(
                f"model_type {model_type!r} needs {field}={value} but the model has "
                f"{getattr(cfg, field)}: export it as {infer_model_type(cfg)!r}"
            )
    if cfg.sliding_window is not None and model_type != "mistral":
        raise PretrainedError(
            f"model_type {model_type!r} has no sliding window but the model's is "
            f"{cfg.sliding_window}: export it as 'mistral'"
        )
    out = {
        **common,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        **_rope_schemas(cfg),
    }
    if model_type == "mistral":
        out["sliding_window"] = cfg.sliding_window
    if model_type in ("qwen2", "qwen3"):
        out["use_sliding_window"] = False
    if model_type == "qwen2":  # its q/k/v biases are built in, its output has none
        del out["attention_bias"]
    return out

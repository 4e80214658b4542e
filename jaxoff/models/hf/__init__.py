"""Hugging Face checkpoints into and out of jaxoff's models, streamed layer by layer.

:func:`from_pretrained` builds a model from a local checkpoint folder (nothing is
downloaded); :func:`open_pretrained` opens one for a model larger than memory, whose blocks
are read one layer at a time (``params()``, for ``fuyou_init(..., page_params=True)``);
:func:`export_pretrained` writes a model (or any :class:`LayerSource`) as a folder that
transformers loads. Llama (2, 3, 3.1/3.2), TinyLlama, SmolLM2, Mistral, Qwen2, Qwen3 and
GPT-2 checkpoints are read, in transformers v4's and v5's ``config.json`` layouts.

The safetensors files are read with positioned reads at the offsets of their headers
(``os.pread``), never mapped, and written by jaxoff itself: no ``torch``, ``safetensors`` or
``transformers`` is needed.
"""

from ._config import MODEL_TYPES as MODEL_TYPES
from ._errors import PretrainedError as PretrainedError
from ._export import LayerSource as LayerSource
from ._export import ParamsSource as ParamsSource
from ._export import export_pretrained as export_pretrained
from ._init import PretrainedInit as PretrainedInit
from ._init import pretrained_config as pretrained_config
from ._load import Pretrained as Pretrained
from ._load import PretrainedLeaf as PretrainedLeaf
from ._load import from_pretrained as from_pretrained
from ._load import open_pretrained as open_pretrained

__all__ = [
    "MODEL_TYPES",
    "LayerSource",
    "ParamsSource",
    "Pretrained",
    "PretrainedError",
    "PretrainedInit",
    "PretrainedLeaf",
    "export_pretrained",
    "from_pretrained",
    "open_pretrained",
    "pretrained_config",
]

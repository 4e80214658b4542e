"""jaxoff models out to Hugging Face folders: export then import is bitwise, the folder has what
transformers reads (shards with an index written last, both config schemas, the tokenizer),
the blocks are read from the source one layer at a time, and a refused export writes nothing.

That transformers loads these exports with equal logits is checked by
tests/fixtures/hf/generate.py (its result is in versions.json there: CI has no torch).
"""

from __future__ import annotations

import json
import os

import jax
import ml_dtypes
import numpy as np
import pytest
from _hf import FIXTURES, NAMES, TOL, logits, reference, tree
from flax import nnx

from jaxoff.models import PretrainedError, export_pretrained, from_pretrained, open_pretrained
from jaxoff.models.hf import ParamsSource
from jaxoff.models.hf._safetensors import read_header
from jaxoff.models.llama import CONFIGS as LLAMA


def _params(model) -> dict:
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in flat}


def _assert_bitwise(a, b):
    pa, pb = _params(a), _params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k].dtype == pb[k].dtype, k
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


@pytest.mark.parametrize("name", NAMES)
def test_export_then_import_is_bitwise(name, tmp_path):
    model = from_pretrained(FIXTURES / name)
    out = export_pretrained(model, tmp_path / "out", tokenizer_dir=FIXTURES / name)
    back = from_pretrained(out, name=model.cfg.name)
    assert back.cfg == model.cfg
    _assert_bitwise(model, back)
    np.testing.assert_allclose(logits(back, name), reference(name), atol=TOL, rtol=TOL)


def test_bfloat16_export_rounds_once_and_reimports_exactly(tmp_path):
    model = from_pretrained(FIXTURES / "llama")
    out = export_pretrained(model, tmp_path / "bf16", dtype="bfloat16")
    assert {i.dtype for i in read_header(out / "model.safetensors").values()} == {"BF16"}
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    back = from_pretrained(out)
    for k, x in _params(model).items():
        want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(_params(back)[k], want, err_msg=k)
    # a bfloat16 checkpoint exported in bfloat16 is the same checkpoint
    bf16 = from_pretrained(FIXTURES / "qwen3")
    again = export_pretrained(bf16, tmp_path / "qwen3", dtype="bfloat16")
    _assert_bitwise(bf16, from_pretrained(again, name=bf16.cfg.name))


def test_sharded_export_has_an_index_written_last(tmp_path):
    model = from_pretrained(FIXTURES / "smollm2-sharded")
    out = export_pretrained(model, tmp_path / "out", max_shard_bytes=20_000)
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) >= 3
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [p.name for p in shards]
    total = 0
    for shard in shards:
        infos = read_header(shard)
        total += sum(i.nbytes for i in infos.values())
        assert all(index["weight_map"][n] == shard.name for n in infos)
        head = shard.read_bytes()
        n = int.from_bytes(head[:8], "little")
        assert n % 8 == 0
        assert json.loads(head[8 : 8 + n])["__metadata__"] == {"format": "pt"}
        if len(infos) > 1:  # a shard holds no more than the limit, unless one tensor is larger
            assert sum(i.nbytes for i in infos.values()) <= 20_000
    assert index["metadata"]["total_size"] == total
    last = max(out.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert last.name == "model.safetensors.index.json"
    _assert_bitwise(model, from_pretrained(out, name=model.cfg.name))


@pytest.mark.parametrize("name", ["llama", "llama3-scaled", "gpt2"])
def test_config_has_both_schemas_and_dtype_keys(name, tmp_path):
    model = from_pretrained(FIXTURES / name)
    ids = {"bos_token_id": 0, "eos_token_id": 0}
    out = export_pretrained(
        model, tmp_path / "out", tokenizer_dir=FIXTURES / name, extra_config=ids
    )
    config = json.loads((out / "config.json").read_text())
    assert ids.items() <= config.items()
    original = json.loads((FIXTURES / name / "config.json").read_text())
    assert config["model_type"] == original["model_type"]
    assert config["torch_dtype"] == config["dtype"] == "float32"
    if name == "gpt2":
        assert (out / "tokenizer.json").read_bytes() == (
            FIXTURES / "gpt2" / "tokenizer.json"
        ).read_bytes()
        assert config["tie_word_embeddings"] and config["layer_norm_epsilon"] == 1e-5
        return
    rope = original["rope_parameters"]
    assert config["rope_parameters"] == rope
    assert config["rope_theta"] == rope["rope_theta"]
    if rope["rope_type"] == "default":
        assert config["rope_scaling"] is None
    else:
        assert config["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}


def test_copied_tokenizer_encodes_the_same(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    model = from_pretrained(FIXTURES / "gpt2")
    out = export_pretrained(model, tmp_path / "out", tokenizer_dir=FIXTURES / "gpt2")
    with open_pretrained(out) as ckpt:
        (path,) = [p for p in ckpt.tokenizer_files if p.name == "tokenizer.json"]
    tok = tokenizers.Tokenizer.from_file(str(path))
    ids = tok.encode("jaxoff trains models").ids
    assert ids and max(ids) < model.cfg.vocab_size


class _Recording(ParamsSource):
    """A source that records which layers it is asked for."""

    def __init__(self, *args):
        super().__init__(*args)
        self.asked: list = []

    def outside(self):
        self.asked.append("outside")
        return super().outside()

    def layer(self, j):
        self.asked.append(j)
        return super().layer(j)


def test_export_reads_the_source_one_layer_at_a_time(tmp_path):
    """From a checkpoint's lazy leaves (each layer read from disk when asked), in order."""
    with open_pretrained(FIXTURES / "smollm2-sharded") as ckpt:
        _, params = ckpt.params()
        source = _Recording(ckpt.config, params)
        out = export_pretrained(source, tmp_path / "out", max_shard_bytes=30_000)
    assert source.asked == ["outside", *range(ckpt.config.num_layers)]
    model = from_pretrained(FIXTURES / "smollm2-sharded")
    _assert_bitwise(model, from_pretrained(out, name=model.cfg.name))


def test_a_built_jaxoff_model_exports_and_reimports(tmp_path):
    import dataclasses

    cfg = dataclasses.replace(LLAMA["llama-tiny"], num_layers=2)
    model = cfg.build(nnx.Rngs(0))
    out = export_pretrained(model, tmp_path / "out")
    back = from_pretrained(out, name=cfg.name)
    assert dataclasses.replace(back.cfg, max_seq_len=cfg.max_seq_len) == cfg
    _assert_bitwise(model, back)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(dtype="float16"), "dtype='float16' is not one of float32, bfloat16"),
        (dict(model_type="qwen3"), "model_type 'qwen3' needs qk_norm=True"),
        (dict(model_type="falcon"), "model_type='falcon' is not one of"),
        (dict(max_shard_bytes=0), "max_shard_bytes=0 must be positive"),
        (dict(extra_config={"hidden_size": 8}), "extra_config sets 'hidden_size'"),
    ],
)
def test_a_refused_export_writes_nothing(tmp_path, kw, match):
    model = from_pretrained(FIXTURES / "llama")
    before = tree(tmp_path)
    with pytest.raises(PretrainedError, match=match) as e:
        export_pretrained(model, tmp_path / "out", **kw)
    assert "\n" not in str(e.value)
    assert tree(tmp_path) == before


def test_an_export_never_overwrites(tmp_path):
    model = from_pretrained(FIXTURES / "llama")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    before = tree(tmp_path)
    with pytest.raises(PretrainedError, match="exists and is not an empty folder"):
        export_pretrained(model, tmp_path / "out")
    assert tree(tmp_path) == before


def test_a_failed_export_leaves_nothing(tmp_path):
    model = from_pretrained(FIXTURES / "llama")

    class Broken(ParamsSource):
        def layer(self, j):
            if j == 1:
                raise OSError("the disk under the source failed")
            return super().layer(j)

    source = Broken(model.cfg, nnx.state(model, nnx.Param))
    with pytest.raises(OSError, match="disk under the source"):
        export_pretrained(source, tmp_path / "out")
    assert os.listdir(tmp_path) == []

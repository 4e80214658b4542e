"""Training data: the byte corpus, token files (memory-mapped), text through a tokenizer, and
the errors a user sees for bad inputs."""

import json

import numpy as np
import pytest

from jaxoff import ConfigError
from jaxoff.train._data import Batches, check_vocab, load_tokens, split

TEXT = "the quick brown fox jumps over the lazy dog. " * 20 + "a stitch in time saves nine. " * 20


def _assert_batches_are_slices(tokens, batches: Batches, index: int):
    """Batch ``index`` equals the windows its seeded starts name, sliced from ``tokens``."""
    x, y = batches(index)
    rng = np.random.default_rng([batches.seed, index])
    starts = rng.integers(0, tokens.size - batches.seq_len - 1, size=batches.batch_size)
    want = np.stack([np.asarray(tokens[s : s + batches.seq_len + 1]) for s in starts])
    np.testing.assert_array_equal(x, want[:, :-1].astype(np.int32))
    np.testing.assert_array_equal(y, want[:, 1:].astype(np.int32))
    assert x.dtype == y.dtype == np.int32


def test_default_corpus_is_bytes_with_no_download():
    tokens, vocab = load_tokens(max_bytes=8192)
    assert vocab == 256 and tokens.dtype == np.uint8 and tokens.size == 8192


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
@pytest.mark.parametrize("how", ["option", "sidecar", "meta.json"])
def test_bin_token_files_round_trip(tmp_path, dtype, how):
    ids = np.random.default_rng(0).integers(0, 50_000, size=5000).astype(dtype)
    ids[17] = 49_999  # the largest id: the vocabulary is 50_000
    path = tmp_path / "train.bin"
    ids.astype(np.dtype(dtype).newbyteorder("<")).tofile(path)  # nanoGPT's prepare.py format
    option = None
    if how == "option":
        option = dtype
    elif how == "sidecar":
        (tmp_path / "train.bin.json").write_text(json.dumps({"dtype": dtype}))
    else:
        (tmp_path / "meta.json").write_text(json.dumps({"dtype": dtype, "vocab_size": 50_257}))
    tokens, vocab = load_tokens(path, token_dtype=option)
    assert isinstance(tokens, np.memmap)  # mapped, not read
    assert tokens.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(tokens, ids)
    assert vocab == (50_257 if how == "meta.json" else 50_000)
    train, val = split(tokens, 0.1)
    assert isinstance(train, np.memmap) and train.size + val.size == ids.size
    batches = Batches(train, batch_size=3, seq_len=64, seed=5)
    for i in (0, 1, 9):
        _assert_batches_are_slices(ids[: train.size], batches, i)


def test_bin_without_dtype_is_nanogpts_uint16(tmp_path):
    ids = np.arange(3000, dtype=np.uint16) % 1000
    ids.tofile(tmp_path / "val.bin")
    tokens, vocab = load_tokens(tmp_path / "val.bin")
    np.testing.assert_array_equal(tokens, ids)
    assert vocab == 1000


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int32"])
def test_npy_token_files_round_trip(tmp_path, dtype):
    ids = (np.arange(4000) * 7919 % 251).astype(dtype)
    np.save(tmp_path / "tokens.npy", ids)
    tokens, vocab = load_tokens(tmp_path / "tokens.npy")
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(tokens, ids)
    assert vocab == int(ids.max()) + 1
    batches = Batches(tokens, batch_size=2, seq_len=32, seed=0)
    _assert_batches_are_slices(ids, batches, 3)


def _tiny_tokenizer(path):
    """A WordLevel tokenizer trained in memory on a few strings, saved as JSON."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    tok.train_from_iterator(TEXT.split(". "), trainer=trainer)
    tok.save(str(path))
    return tokenizers.Tokenizer.from_file(str(path))


def test_tokenizer_json_round_trip(tmp_path):
    tok = _tiny_tokenizer(tmp_path / "tok.json")
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT)
    (folder / "b.md").write_text(TEXT.upper() + " the fox")  # upper case words are unknown
    tokens, vocab = load_tokens(folder, tokenizer=tmp_path / "tok.json")
    assert (
        vocab == tok.get_vocab_size() == len(set(TEXT.replace(".", " ").split())) + 1
    )  # words + [UNK]
    assert tokens.dtype == np.uint16 and int(tokens.max()) < vocab
    want = tok.encode(TEXT).ids + tok.encode(TEXT.upper() + " the fox").ids
    np.testing.assert_array_equal(tokens, want)  # files in sorted order, one after another
    assert tok.decode(tokens[:9].tolist()) == "the quick brown fox jumps over the lazy dog"
    single, _ = load_tokens(folder / "a.txt", tokenizer=tmp_path / "tok.json", max_bytes=90)
    np.testing.assert_array_equal(single, tok.encode(TEXT[:90]).ids)


def test_tokenizer_without_the_package_is_one_clear_line(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_tokenizers(name, *args, **kw):
        if name == "tokenizers":
            raise ImportError("No module named 'tokenizers'")
        return real(name, *args, **kw)

    (tmp_path / "a.txt").write_text(TEXT)
    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(ConfigError, match=r"pip install 'jaxoff\[data\]'") as e:
        load_tokens(tmp_path / "a.txt", tokenizer=tmp_path / "tok.json")
    assert "\n" not in str(e.value)


def _bad_inputs(tmp):
    np.arange(100, dtype=np.uint16).tofile(tmp / "ok.bin")
    (tmp / "odd.bin").write_bytes(b"\x01\x02\x03")  # 3 bytes: not whole uint16 tokens
    np.arange(99, dtype=np.uint8).tofile(tmp / "u32.bin")  # 99 bytes: not whole uint32 tokens
    np.save(tmp / "float.npy", np.zeros(100, np.float32))
    np.save(tmp / "neg.npy", np.array([1, -2, 3] * 50, np.int32))
    np.arange(300, dtype=np.uint16).tofile(tmp / "big.bin")
    (tmp / "big.bin.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256}))
    (tmp / "a.txt").write_text(TEXT)
    (tmp / "broken.json").write_text("{not json")
    return {
        "missing file": (dict(data=tmp / "nope.bin"), "no such file"),
        "unknown dtype": (dict(data=tmp / "ok.bin", token_dtype="float32"), "not a token type"),
        "odd byte count": (dict(data=tmp / "odd.bin"), "3 bytes is not a whole number of uint16"),
        "wrong dtype size": (
            dict(data=tmp / "u32.bin", token_dtype="uint32"),
            "99 bytes is not a whole number of uint32",
        ),
        "float npy": (dict(data=tmp / "float.npy"), "1-D array of"),
        "negative id": (dict(data=tmp / "neg.npy"), "negative token id"),
        "ids >= sidecar vocab": (dict(data=tmp / "big.bin"), "token id 299 but .* vocab_size 256"),
        "dtype option on text": (dict(data=tmp / "a.txt", token_dtype="uint16"), "applies to .bin"),
        "tokenizer on tokens": (dict(data=tmp / "ok.bin", tokenizer=tmp / "t.json"), "already"),
        "missing tokenizer": (dict(data=tmp / "a.txt", tokenizer=tmp / "t.json"), "no such file"),
        "broken tokenizer": (
            dict(data=tmp / "a.txt", tokenizer=tmp / "broken.json"),
            "not a tokenizers JSON",
        ),
    }


BAD_CASES = [
    "missing file",
    "unknown dtype",
    "odd byte count",
    "wrong dtype size",
    "float npy",
    "negative id",
    "ids >= sidecar vocab",
    "dtype option on text",
    "tokenizer on tokens",
    "missing tokenizer",
    "broken tokenizer",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_inputs_are_one_line_config_errors(tmp_path, case):
    if "tokenizer" in case:
        pytest.importorskip("tokenizers")
    cases = _bad_inputs(tmp_path)
    assert sorted(cases) == sorted(BAD_CASES)
    kwargs, message = cases[case]
    with pytest.raises(ConfigError, match=message) as e:
        load_tokens(**kwargs)
    assert "\n" not in str(e.value)


def test_ids_beyond_the_models_vocabulary_are_refused():
    check_vocab(256, 256)
    check_vocab(1000, 50_257)
    with pytest.raises(ConfigError, match=r"ids up to 50256 .* llama-tiny has vocab_size 256"):
        check_vocab(50_257, 256, "llama-tiny")
    with pytest.raises(ConfigError, match=r"vocab_size >= 50257"):
        check_vocab(50_257, 256)


def test_train_config_checks_the_data_options(tmp_path):
    from jaxoff.train._config import TrainConfig, _check_data_options, load_config_file

    np.arange(100, dtype=np.uint32).tofile(tmp_path / "t.bin")
    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "tok.json").write_text("{}")
    _check_data_options(tmp_path / "t.bin", None, "uint32")
    _check_data_options(tmp_path / "a.txt", tmp_path / "tok.json", "auto")
    _check_data_options(None, None, "auto")
    for args, message in [
        ((tmp_path / "t.bin", None, "int8"), "not a token type"),
        ((tmp_path / "a.txt", None, "uint16"), "applies to .bin"),
        ((tmp_path / "t.bin", tmp_path / "tok.json", "auto"), "already tokens"),
        ((tmp_path / "a.txt", tmp_path / "nope.json", "auto"), "no such file"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _check_data_options(*args)
    assert TrainConfig().tokenizer is None and TrainConfig().token_dtype == "auto"
    (tmp_path / "run.toml").write_text(f'tokenizer = "{tmp_path / "tok.json"}"\n')
    loaded = load_config_file(tmp_path / "run.toml")  # by group, the path typed
    assert loaded["data_options"]["tokenizer"] == tmp_path / "tok.json"

"""examples/fuyou_nvme.py: trains with the block parameters and AdamW state in the store."""

import ast
import importlib.util
import sys
from pathlib import Path

import jax
import numpy as np

from jaxoff.models import load_model

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fuyou_nvme.py"


def _example():
    spec = importlib.util.spec_from_file_location("fuyou_nvme", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_example_imports_only_public_jaxoff_modules():
    tree = ast.parse(EXAMPLE.read_text())
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    jaxoff_modules = [m for m in names if m.split(".")[0] == "jaxoff"]
    assert "jaxoff.strategies.fuyou" in jaxoff_modules
    assert not [m for m in jaxoff_modules if "._" in m or m.startswith("_")]


def test_fuyou_nvme_example_trains_with_the_parameters_in_the_store(tmp_path, capsys):
    losses, params = _example().main(str(tmp_path / "store"), steps=12, batch=4, seq=32)
    assert len(losses) == 12 and np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < np.mean(losses[:3])  # the loss falls on the corpus
    blocks = jax.tree.leaves(params["blocks"])
    layers = load_model("tiny").num_layers
    assert blocks and all(x.ndim >= 2 and x.shape[0] == layers for x in blocks)
    out = capsys.readouterr().out
    assert "step  12 loss" in out and "read back from the store" in out
    assert any(p.name.startswith("param.") for p in (tmp_path / "store").rglob("*.page"))

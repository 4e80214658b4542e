"""Every example in examples/ imports only public jaxoff modules and is run by a test, at
small sizes: layer_streaming.py and paged_adamw.py here, the others in their own files."""

import ast
import importlib.util
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
# example -> the test file that runs it
RUN_BY = {
    "finetune_pretrained.py": "test_examples_all.py",
    "fuyou_nvme.py": "test_examples_fuyou.py",
    "layer_streaming.py": "test_examples_all.py",
    "linen_gpt2.py": "test_examples_linen.py",
    "paged_adamw.py": "test_examples_all.py",
    "train_tiny.py": "test_examples_tiny.py",
}


def _example(name: str):
    spec = importlib.util.spec_from_file_location(Path(name).stem, EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # linen's dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _jaxoff_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    return [m for m in names if m.split(".")[0] == "jaxoff"]


def test_every_example_is_run_by_a_test():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(RUN_BY)
    for example, test in RUN_BY.items():
        text = (ROOT / "tests" / test).read_text()
        assert f'"{example}"' in text, f"{test} does not run examples/{example}"


@pytest.mark.parametrize("name", sorted(RUN_BY))
def test_the_example_imports_only_public_jaxoff_modules(name):
    modules = _jaxoff_imports(EXAMPLES / name)
    assert modules, f"examples/{name} uses no jaxoff module"
    private = [m for m in modules if any(part.startswith("_") for part in m.split("."))]
    assert not private, f"examples/{name} imports private modules: {private}"


def test_paged_adamw_trains_with_the_state_in_the_store(tmp_path, capsys):
    losses = _example("paged_adamw.py").main(str(tmp_path / "store"), steps=6)
    assert len(losses) == 6 and np.isfinite(losses).all()
    assert losses[-1] < losses[0]
    assert any((tmp_path / "store").iterdir())  # the optimizer state went to the page store
    out = capsys.readouterr().out
    assert "step  6 loss" in out and "store version 6" in out


def test_layer_streaming_matches_the_device_run_bit_for_bit(capsys):
    found = _example("layer_streaming.py").main(steps=2, batch=2, seq=16)
    example = sys.modules["layer_streaming"]
    assert sorted(found) == sorted(example.PLACEMENTS)
    for name, run in found.items():
        assert run["bitwise_equal"], name
        assert run["loss"] == run["device_loss"] and np.isfinite(run["loss"])
        assert run["memory_kind"] == "pinned_host", name
        # the exported step copies the layers' parameters to the device inside the layer loops
        assert run["copies_in_loops"].get("device", 0) > 0 and not run["problems"], (name, run)
    assert "host_params_stream2: loss" in capsys.readouterr().out
    assert jax.default_backend() == "cpu"  # the cuda export above was made on a CPU machine


def test_finetune_pretrained_trains_a_fixture_and_exports_it(tmp_path, capsys):
    losses, exported = _example("finetune_pretrained.py").main(out_dir=tmp_path, steps=2)
    assert len(losses) == 2 and np.isfinite(losses).all()
    assert (exported / "config.json").is_file() and (exported / "model.safetensors").is_file()
    assert "from " + str(exported) in capsys.readouterr().out

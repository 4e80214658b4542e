"""Shared by tests/test_hf_*.py: the tiny Hugging Face fixtures (tests/fixtures/hf, written by
its generate.py with transformers) and their logits."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())
TOL = 1e-4  # atol = rtol, float32


def tokens(name: str) -> np.ndarray:
    return np.load(FIXTURES / name / "tokens.npy")


def reference(name: str) -> np.ndarray:
    """transformers' float32 logits of the fixture's tokens."""
    return np.load(FIXTURES / name / "logits.npy")


def logits(model, name: str) -> np.ndarray:
    return np.asarray(model(jnp.asarray(tokens(name))))


def copy(name: str, tmp_path: Path) -> Path:
    """A writable copy of fixture ``name``."""
    out = tmp_path / name
    shutil.copytree(FIXTURES / name, out)
    return out


def tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``path``: (size, mtime in ns), to see that nothing was written."""
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
    }

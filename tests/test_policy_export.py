"""Offload placement proven without a GPU: the train step exported for cuda and tpu."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import pytest

from jaxoff.compare._export import (
    check_export,
    export_text,
    host_shapes,
    placements,
    probe_name,
)
from jaxoff.compare._measure import model_config, optimizer
from jaxoff.models.gpt import CONFIGS, RESIDUAL_NAMES
from jaxoff.policy import PRESETS, get_policy
from jaxoff.step import abstract_state, make_train_step

B, T = 2, 16
NOT_RESIDUALS = {"mlp_down"}  # only added to the residual stream: backward never reads it


def _shape(name: str) -> str:
    """Tensor type of one residual of the tiny model, from the documented shapes."""
    c = CONFIGS["tiny"]
    d, h, dh, f = c.d_model, c.num_heads, c.head_dim, c.d_ff
    dims = {
        "attn_q": (B, T, h, dh),
        "attn_k": (B, T, h, dh),
        "attn_v": (B, T, h, dh),
        "attn_context": (B, T, h, dh),
        "attn_logits": (B, h, T, T),
        "attn_probs": (B, h, T, T),
        "mlp_up": (B, T, f),
        "mlp_act": (B, T, f),
    }
    return "x".join(map(str, dims.get(name, (B, T, d)))) + "xf32"


def test_offload_all_moves_every_residual_to_host():
    for platform in ("cuda", "tpu"):
        r = check_export("tiny", "offload_all", B, T, platforms=(platform,))[platform]
        assert r["ok"], r
        assert set(r["host_names"]) == set(RESIDUAL_NAMES) - NOT_RESIDUALS
        # one placement per residual per layer body, and one back to device for backward
        assert r["host_placements"] == r["device_placements"] == len(RESIDUAL_NAMES) - 1


def test_each_name_probe_has_its_documented_shape():
    for name in RESIDUAL_NAMES:
        expected = () if name in NOT_RESIDUALS else (_shape(name),)
        assert probe_name("tiny", B, T, name, "cuda") == expected, name


@pytest.mark.parametrize(
    "spec",
    [
        "full",
        "selective",
        "offload_dots",
        "attn_probs=remat,mlp_act=offload,*=device",
        "dots_saveable,mlp_act=offload,attn_v=offload",
    ],
)
def test_host_placements_are_exactly_the_offload_set(spec):
    result = check_export("tiny", spec, B, T)
    assert result["ok"], result
    # independent of the probes: the placed shapes are the documented shapes of the
    # offloaded names that are residuals
    offloaded = [n for n in get_policy(spec).offloaded() if n not in NOT_RESIDUALS]
    want = collections.Counter(_shape(n) for n in offloaded)
    graphdef, state = abstract_state(model_config("tiny", spec), optimizer())
    tok = jax.ShapeDtypeStruct((B, T), jnp.int32)
    for platform in ("cuda", "tpu"):
        text = export_text(make_train_step(graphdef, optimizer()), (state, tok, tok), platform)
        assert collections.Counter(host_shapes(text)) == want, platform


def test_check_export_catches_a_wrong_placement(monkeypatch):
    """The check fails when the step offloads something the policy does not say."""
    import jaxoff.compare._export as ex

    real = ex.placements
    # the probes (one name offloaded alone) keep the real parser, only the step gets the extra
    # placement; probe_name caches across tests, so a patched probe would depend on the order
    monkeypatch.setattr(
        ex, "host_shapes", lambda text: [t for kind, t in real(text) if kind == "pinned_host"]
    )
    monkeypatch.setattr(
        ex, "placements", lambda text: real(text) + [("pinned_host", "2x16x128xf32")]
    )
    r = check_export("tiny", "offload_dots", B, T, platforms=("cuda",))
    assert not r["ok"] and r["cuda"]["unexpected"] == ["2x16x128xf32"]


def test_placement_parser():
    line = (
        "%1 = stablehlo.custom_call @annotate_device_placement(%0) {has_side_effect = true, "
        'mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}} : '
        "(tensor<2x4xf32>) -> tensor<2x4xf32>"
    )
    assert placements(line) == [("pinned_host", "2x4xf32")]
    assert PRESETS["offload_all"].policy.offloaded()

"""Policy dataclass, presets, parsing and its one translation to JAX policies."""

from __future__ import annotations

import dataclasses
import logging

import jax
import pytest

from jaxoff._errors import ConfigError
from jaxoff.models.gpt import CONFIGS, RESIDUAL_NAMES
from jaxoff.policy import (
    PRESETS,
    Action,
    Policy,
    Segments,
    Untagged,
    apply_policy,
    get_policy,
    load_policy_file,
    resolve_policy,
)

cp = jax.checkpoint_policies


def test_every_policy_maps_every_name_once():
    for preset in PRESETS.values():
        assert [n for n, _ in preset.policy.actions] == list(RESIDUAL_NAMES)
        assert preset.doc and preset.source


def test_presets_translate_to_jax_policies():
    assert resolve_policy("none") is None
    assert resolve_policy("full") is cp.nothing_saveable
    assert resolve_policy("dots_saveable") is cp.dots_saveable
    assert resolve_policy("dots_with_no_batch_dims_saveable") is cp.dots_with_no_batch_dims_saveable
    assert resolve_policy("sqrt") is cp.nothing_saveable
    assert resolve_policy("everything_saveable") is cp.everything_saveable  # JAX names still work
    sel = PRESETS["selective"].policy
    assert set(sel.names_with(Action.REMAT)) == {"attn_logits", "attn_probs"}  # keeps context
    core = PRESETS["attention_core"].policy
    assert set(core.names_with(Action.REMAT)) == {"attn_logits", "attn_probs", "attn_context"}
    assert PRESETS["offload_all"].policy.offloaded() == RESIDUAL_NAMES
    assert set(PRESETS["offload_dots"].policy.offloaded()) == {
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_out",
        "mlp_up",
        "mlp_down",
    }
    assert PRESETS["none"].policy.offloaded() == ()  # remat off: nothing moves


def test_translation_decides_each_name_as_the_policy_says():
    from jax._src.ad_checkpoint import name_p
    from jax._src.interpreters import partial_eval as pe

    policy = Policy.parse("attn_probs=remat,mlp_act=offload,*=device").to_jax()
    assert policy(name_p, name="attn_probs") is pe.Recompute
    assert policy(name_p, name="attn_q") is pe.Saveable
    out = policy(name_p, name="mlp_act")
    assert isinstance(out, pe.Offloadable) and out.dst == "pinned_host" and out.src == "device"
    # with untagged dots kept, names still decide first and other prims go to dots_saveable
    mixed = Policy.from_mapping({"mlp_act": "offload"}, untagged=Untagged.DOTS).to_jax()
    assert isinstance(mixed(name_p, name="mlp_act"), pe.Offloadable)
    assert mixed(name_p, name="attn_q") is pe.Recompute or mixed(name_p, name="attn_q") is False


def test_parse_compact_string_and_preset_base():
    p = Policy.parse("attn_probs=remat, mlp_act=offload, *=device")
    assert p.action("attn_probs") is Action.REMAT
    assert p.action("mlp_act") is Action.OFFLOAD
    assert all(
        p.action(n) is Action.DEVICE for n in RESIDUAL_NAMES if n not in ("attn_probs", "mlp_act")
    )
    # without '*', names not listed are recomputed (as in JAX's names-based policies)
    assert Policy.parse("mlp_act=device").names_with(Action.DEVICE) == ("mlp_act",)
    q = get_policy("selective,mlp_act=offload")
    assert q.action("attn_probs") is Action.REMAT and q.action("mlp_act") is Action.OFFLOAD
    assert q.action("attn_q") is Action.DEVICE
    assert Policy.parse(p.describe()) == p
    assert get_policy("attn_probs=remat,*=device") == Policy.parse("attn_probs=remat,*=device")


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("attn_prob=remat", "'attn_prob' is not a residual name"),
        ("attn_probs=keep", "'keep' is not an action; choose one of device, offload, remat"),
        ("attn_probs", "not a known policy"),
        ("selective,attn_probs", "is not name=action"),
        ("bogus,attn_probs=remat", "neither a preset"),
        ("attn_probs=remat,attn_probs=device", "given twice"),
        ("", "not a known policy"),
    ],
)
def test_parse_errors_are_clear(spec, needle):
    with pytest.raises(ConfigError) as e:
        get_policy(spec)
    assert needle in str(e.value)
    if "residual name" in needle or "not a known policy" in needle:
        assert "layer_input" in str(e.value) and "mlp_down" in str(e.value)  # lists the names


def test_train_config_accepts_every_spelling(tmp_path):
    from jaxoff.train import TrainConfig

    for spec in ("selective", "attn_probs=remat,mlp_act=offload,*=device", "dots_saveable"):
        assert callable(TrainConfig(model="tiny", policy=spec).model_config().stack.policy)
    assert TrainConfig(model="tiny", policy="none").model_config().stack.policy is None
    with pytest.raises(ConfigError, match="valid names are"):
        TrainConfig(model="tiny", policy="attn_probz=remat", out_dir=tmp_path).validate()


def test_toml_file(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[policy]\npreset = "selective"\nmlp_act = "offload"\n')
    assert load_policy_file(f) == get_policy("selective,mlp_act=offload")
    assert get_policy(str(f)) == load_policy_file(f)
    g = tmp_path / "q.toml"
    g.write_text('"*" = "remat"\nsegments = "sqrt"\n')
    assert load_policy_file(g) == PRESETS["sqrt"].policy
    bad = tmp_path / "bad.toml"
    bad.write_text('[policy]\nmlp_actt = "offload"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: .*'mlp_actt' is not a residual name"):
        load_policy_file(bad)
    bad.write_text('[policy]\nsegments = "cube"\n')
    with pytest.raises(ConfigError, match="segments = 'cube' is not one of layer, sqrt"):
        load_policy_file(bad)


def test_every_shipped_policy_file_parses():
    from pathlib import Path

    configs = Path(__file__).parent.parent / "configs"
    files = sorted(configs.glob("**/*policy*.toml"))
    assert files, "configs/ ships no *policy*.toml file: the loop below would check nothing"
    for f in files:
        policy = load_policy_file(f)
        assert get_policy(str(f)) == policy
        assert apply_policy(CONFIGS["tiny"], str(f)).stack.policy is not None, f
    shipped = load_policy_file(configs / "policies" / "selective-offload-mlp-policy.toml")
    assert shipped == get_policy("selective,mlp_act=offload")
    assert shipped.offloaded() == ("mlp_act",)


def test_policy_is_complete_and_frozen():
    with pytest.raises(ConfigError, match=r"\['attn_q'\] are given more than one"):
        Policy((("attn_q", Action.REMAT), ("attn_q", Action.DEVICE)))
    partial = Policy((("attn_q", Action.DEVICE), ("attn_k", Action.REMAT)))
    with pytest.raises(ConfigError, match="it gives no action to 'layer_input'"):
        apply_policy(CONFIGS["tiny"], partial)
    with pytest.raises(ConfigError, match="the model has no 'mlp_gate'"):
        gated = Policy.from_mapping({"mlp_gate": "offload"}, names=(*RESIDUAL_NAMES, "mlp_gate"))
        get_policy(gated)  # over the GPT's names, which have no gate
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["full"].policy.remat = False  # type: ignore[misc]


def test_sqrt_segments(tmp_path):
    """sqrt_bytes sizes its segments when the stack is traced, sqrt takes round(sqrt(L))
    (tests/test_sqrt.py); a policy that keeps or offloads a name cannot have segments, which
    keep only their inputs."""
    cfg = apply_policy(CONFIGS["small"], "sqrt_bytes")
    assert cfg.stack.remat_every == "auto" and cfg.stack.policy is cp.nothing_saveable
    assert apply_policy(cfg, "selective").stack.remat_every == 1  # resets the segments
    assert apply_policy(cfg, "everything_saveable").stack.remat_every == 1
    assert PRESETS["sqrt_bytes"].policy.segments is Segments.BYTES
    assert PRESETS["sqrt_bytes"].policy.segment_size() == "auto"
    assert PRESETS["full"].policy.segment_size() == 1
    chen = apply_policy(CONFIGS["small"], "sqrt")  # 12 layers
    assert chen.stack.remat_every == 3 and chen.stack.policy is cp.nothing_saveable
    assert PRESETS["sqrt"].policy.segments is Segments.SQRT
    assert PRESETS["sqrt"].policy.segment_size(64) == 8
    with pytest.raises(ValueError, match="pass num_layers"):
        PRESETS["sqrt"].policy.segment_size()
    with pytest.raises(
        ConfigError, match="segments = 'sqrt' .* cannot also keep or offload mlp_act"
    ):
        get_policy("sqrt,mlp_act=offload")
    f = tmp_path / "kept.toml"
    f.write_text('segments = "sqrt"\nuntagged = "dots_saveable"\n"*" = "remat"\n')
    with pytest.raises(ConfigError, match="untagged values .dots_saveable.*segments = 'layer'"):
        load_policy_file(f)


def test_a_preset_naming_none_of_a_models_names_is_noted_with_its_names(caplog, monkeypatch):
    """`--policy selective` on a model without attention names kept every residual without a
    word; it is said once per preset and model, with the model's own names."""
    from jaxoff.models import llama
    from jaxoff.policy import apply_policy
    from jaxoff.policy._resolve import _note_missed_names
    from tests.byom_model import NAMES, build

    _note_missed_names.cache_clear()
    model = build()
    with caplog.at_level(logging.WARNING, logger="jaxoff.policy"):
        for _ in range(2):
            apply_policy(model, "selective")
        apply_policy(model, "full")  # needs no names: nothing to say
        apply_policy(model, "ff_act=remat,*=device")
        apply_policy(llama.CONFIGS["llama-tiny"], "selective")  # tags attn_probs
    records = [r.getMessage() for r in caplog.records if r.name == "jaxoff.policy"]
    assert len(records) == 1, records
    (line,) = records
    assert line.startswith("jaxoff: note: policy preset 'selective' acts on attn_logits")
    assert "every residual of it gets device" in line
    assert f"the model's residual names are {', '.join(NAMES)}" in line
    with caplog.at_level(logging.WARNING, logger="jaxoff.policy"):
        apply_policy(model, "offload_dots")
    assert "gets remat" in caplog.records[-1].getMessage()

"""`jaxoff compare` end to end on the tiny model, and its measurement helpers."""

from __future__ import annotations

import csv
import json

import jax
import jax.numpy as jnp

from jaxoff.cli import main
from jaxoff.compare._measure import (
    _flops,
    compile_step,
    host_bytes,
    model_config,
    optimizer,
    step_flops,
)
from jaxoff.models.gpt import CONFIGS
from jaxoff.nn import with_stack
from jaxoff.step import abstract_state, make_train_step

B, T = 2, 16


def test_compare_cli_writes_table_files_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # a log is not a terminal: the table keeps its width
    out = tmp_path / "cmp"
    # without "none" in the list, compare still measures its FLOPs as the baseline
    rc = main(
        [
            "compare",
            "--model",
            "tiny",
            "--policies",
            "full,offload_all",
            "--batch",
            str(B),
            "--seq",
            str(T),
            "--steps",
            "2",
            "--warmup",
            "1",
            "--out",
            str(out),
            "--check-export",
            "--no-isolate",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    for word in ("full", "offload_all", "temp MiB", "recompute", "pareto"):
        assert word in text
    assert "…" not in text
    rows = {r["policy"]: r for r in csv.DictReader(open(out / "compare.csv"))}
    assert list(rows) == ["full", "offload_all"]
    data = json.loads((out / "compare.json").read_text())
    by = {r["policy"]: r for r in data["policies"]}
    # on CPU offloaded residuals stay in device temp (JAX-ON-CPU.md): full is smaller
    assert by["full"]["temp_bytes"] < by["offload_all"]["temp_bytes"]
    assert by["full"]["recompute_overhead"] > 0.05  # each block's forward runs twice
    assert abs(by["offload_all"]["recompute_overhead"]) < 0.02  # only untagged ops rerun
    assert by["full"]["host_bytes"] == 0
    assert by["offload_all"]["host_bytes"] == _offload_all_bytes()
    assert all(r["export_ok"] for r in data["policies"])
    assert any(r["pareto"] for r in data["policies"])
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def _offload_all_bytes() -> int:
    """12 residuals per layer (mlp_down is never read by backward), float32, 5 layers."""
    c = CONFIGS["tiny"]
    d, f = c.d_model, c.d_ff
    per_layer = (
        8 * B * T * d  # layer_input, attn_norm, q, k, v, context, attn_out, mlp_norm
        + 2 * B * c.num_heads * T * T  # logits, probs
        + 2 * B * T * f
    )  # mlp_up, mlp_act
    return 4 * c.num_layers * per_layer


def test_compare_rejects_bad_policy(capsys):
    rc = main(["compare", "--model", "tiny", "--policies", "none,selectiv"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "'selectiv' is not a known policy" in err and "selective" in err


def test_host_bytes_counts_scan_trips():
    cfg = model_config("tiny", "mlp_act=offload")
    graphdef, state = abstract_state(cfg, optimizer())
    tok = jax.ShapeDtypeStruct((B, T), jnp.int32)
    jaxpr = jax.make_jaxpr(make_train_step(graphdef, optimizer()))(state, tok, tok)
    assert host_bytes(jaxpr) == cfg.num_layers * B * T * cfg.d_ff * 4


def test_flops_correction_matches_unrolled_count():
    """cost_analysis counts a scan body once; the 1-/2-layer extrapolation must equal the
    count of the fully unrolled step, where every layer is in straight-line code."""
    for spec in ("none", "full"):
        cfg = model_config("tiny", spec)
        unrolled = with_stack(cfg, scan_unroll=cfg.num_layers)
        exact = _flops(compile_step(unrolled, B, T)[0])
        once = _flops(compile_step(cfg, B, T)[0])
        corrected = step_flops(cfg, B, T)
        assert abs(corrected - exact) <= 1e-3 * exact, (spec, corrected, exact)
        assert once < 0.6 * exact  # the uncorrected figure is far off: the test can fail


def test_segment_flops_match_unrolled_count():
    """Chen segments are not alike per layer (the last is not recomputed): step_flops probes
    one recomputed segment (k + 1 and 2k + 1 layers) and must equal the fully unrolled count,
    here segments of 2, 2, 1."""
    cfg = with_stack(model_config("tiny", "full"), remat_every=2)
    exact = _flops(compile_step(with_stack(cfg, scan_unroll=cfg.num_layers), B, T)[0])
    corrected = step_flops(cfg, B, T)
    assert abs(corrected - exact) <= 1e-3 * exact, (corrected, exact)
    # tiny is far too shallow for segments to pay: sqrt_bytes resolves to per-block remat
    sqrt = model_config("tiny", "sqrt_bytes")
    assert sqrt.stack.remat_every == "auto"
    assert step_flops(sqrt, B, T) == step_flops(model_config("tiny", "full"), B, T)


def test_compare_reports_the_segment_size_that_runs():
    from jaxoff.compare._measure import measure_policy

    row = measure_policy("tiny", "sqrt_bytes", B, T, steps=1, warmup=0)
    assert row["remat_every"] == 1  # "auto" resolved at this shape: per-block remat
    seg = row["segments"]
    assert seg["size"] == 1 and seg["pays_from_layers"] > CONFIGS["tiny"].num_layers
    assert seg["modelled_bytes"] == seg["modelled_bytes_per_block_remat"]
    from jaxoff.compare._report import COLUMNS

    assert COLUMNS["segments"][1](seg) == f"{seg['pays_from_layers']} layers"


def test_plot_legend_covers_no_point_and_labels_stay_inside_the_axes():
    """The legend sits outside the axes, and every label (the top-right ``none`` of the docs'
    figure included) lies inside them: nothing covered, nothing clipped."""
    from jaxoff.compare import _report

    MiB = _report.MiB
    points = {  # policy -> (temp MiB, step ms): the shape of docs/compare_small.png
        "none": (1107, 1216),
        "full": (438, 2696),
        "dots_saveable": (610, 3282),
        "dots_with_no_batch_dims_saveable": (550, 1868),
        "selective": (655, 3056),
        "offload_all": (751, 1150),
        "offload_dots": (550, 3116),
        "sqrt": (734, 1432),
    }
    front = ("full", "dots_with_no_batch_dims_saveable", "offload_all")
    rows = [
        dict(policy=p, placement="device", temp_bytes=m * MiB, step_s=t / 1e3, pareto=p in front)
        for p, (m, t) in points.items()
    ]
    fig = _report.figure(rows, "jaxoff compare: model small", budget=1000 * MiB)
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    axes = ax.get_window_extent(renderer)
    for m, t in points.values():
        x, y = ax.transData.transform((m, t))
        assert not (legend.x0 <= x <= legend.x1 and legend.y0 <= y <= legend.y1), (m, t)
    assert not legend.overlaps(axes)
    labels = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    assert set(labels) == set(points)
    for name, box in labels.items():
        inside = axes.x0 <= box.x0 and box.x1 <= axes.x1 and axes.y0 <= box.y0
        assert inside and box.y1 <= axes.y1, name
    import matplotlib.pyplot as plt

    plt.close(fig)

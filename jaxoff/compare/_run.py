"""``jaxoff compare``: measure every policy, then print and write the report."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .. import _output
from .._errors import JaxoffError
from ..step import check_placement_export
from . import _report
from ._config import CompareConfig
from ._export import check_export
from ._measure import measure_isolated, measure_policy, model_config, optimizer, step_flops
from ._strategies import baseline_flops, strategy_rows


def _placement_export_ok(cfg: CompareConfig, row: dict) -> bool:
    """The placement's own export check (host state, in-loop copies when streaming)."""

    model_cfg = model_config(cfg.model, row["policy"])
    ok = True
    for platform in ("cuda", "tpu"):
        report, problems = check_placement_export(
            model_cfg, row["placement"], optimizer(), cfg.batch_size, cfg.seq_len, platform
        )
        row["export"][f"placement_{platform}"] = {**report.to_dict(), "problems": problems}
        ok = ok and not problems
    return ok


def _meta(cfg: CompareConfig, **extra) -> dict:
    """What every compare.json records about the run, then ``extra``."""
    keys = ("model", "batch_size", "grad_accum", "seq_len", "steps", "warmup", "isolate")
    return {**{k: getattr(cfg, k) for k in keys}, **extra}


def _progress(console: Console) -> Progress | _output.LogProgress:
    """The comparisons' progress bar: what runs now, done/total, time elapsed; in a log
    (not a terminal), a line as each measurement begins, with how many remain."""
    if not console.is_terminal:
        return _output.LogProgress("compare", console)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def compare(cfg: CompareConfig, console: Console | None = None) -> list[dict]:
    """Measures each policy of ``cfg`` and writes compare.{csv,json,png} to ``cfg.out_dir``.

    Returns the rows (one dict per policy, raw numbers; see ``_report.COLUMNS``).

    Example:
        >>> from jaxoff.compare import CompareConfig, compare
        >>> rows = compare(CompareConfig(model="tiny", policies="none,full",  # doctest: +SKIP
        ...                              batch_size=2, seq_len=16, steps=2))
    """

    console = console or _output.console()
    if cfg.strategies.strip():
        return compare_strategies(cfg, console)
    runs = cfg.runs()
    measure = measure_isolated if cfg.isolate else measure_policy
    rows = []
    with _progress(console) as progress:
        # a plain int from LogProgress; TaskID is that int (a NewType) for rich's Progress
        task = TaskID(
            progress.add_task("compare", total=len(runs) * (2 if cfg.check_export else 1) + 1)
        )
        for spec, placement in runs:
            progress.update(task, description=f"compile + run {spec} ({placement})")
            rows.append(
                measure(
                    cfg.model,
                    spec,
                    cfg.batch_size,
                    cfg.seq_len,
                    steps=cfg.steps,
                    warmup=cfg.warmup,
                    seed=cfg.seed,
                    placement=placement,
                    grad_accum=cfg.grad_accum,
                )
            )
            progress.advance(task)
        progress.update(task, description="baseline FLOPs (none)")
        base = [r["flops"] for r in rows if r["policy"] == "none" and r["placement"] == "device"]
        rows_per_step = cfg.grad_accum * cfg.batch_size  # FLOPs: see measure_policy
        baseline = (
            base[0]
            if base
            else step_flops(model_config(cfg.model, "none"), rows_per_step, cfg.seq_len)
        )
        progress.advance(task)
        if cfg.check_export:
            for r in rows:
                progress.update(task, description=f"export cuda/tpu {r['policy']}")
                r["export"] = check_export(cfg.model, r["policy"], cfg.batch_size, cfg.seq_len)
                r["export_ok"] = r["export"]["ok"]
                if r["placement"] != "device":
                    r["export_ok"] = r["export_ok"] and _placement_export_ok(cfg, r)
                progress.advance(task)
        progress.update(task, description="done")
    _report.finish_rows(rows, baseline)

    title = _report.title(_meta(cfg))
    console.print(_report.table(rows, title))
    if cfg.check_export:
        for r in rows:
            e = r["export"]
            if e["offloaded"]:
                console.print(
                    f"  {r['policy']}: on host in cuda/tpu export: "
                    f"{', '.join(e['cuda']['host_names']) or 'nothing'}"
                    + (
                        f"; not residuals (nothing to offload): "
                        f"{', '.join(e['cuda']['not_residuals'])}"
                        if e["cuda"]["not_residuals"]
                        else ""
                    )
                )
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = _meta(
        cfg, num_layers=model_config(cfg.model, "none").num_layers, baseline_flops=baseline
    )
    _report.write_csv(rows, out / "compare.csv")
    _report.write_json(rows, meta, out / "compare.json")
    _report.plot(rows, out / "compare.png", title)
    (out / "compare.md").write_text(_report.markdown(rows) + "\n")
    console.print(f"wrote {out / 'compare.csv'}, compare.json, compare.md, compare.png")
    if cfg.check_export and not all(r["export_ok"] for r in rows):
        bad = [r["policy"] for r in rows if not r["export_ok"]]
        raise JaxoffError(f"host placement in the cuda/tpu export is wrong for {bad}")
    return rows


def compare_strategies(cfg: CompareConfig, console: Console | None = None) -> list[dict]:
    """``jaxoff compare --strategies``: plans, compiles and runs each strategy; writes
    compare.{csv,json,md,png} to ``cfg.out_dir``. Returns every row (measured first,
    then those not run, each with its ``status``).

    Example:
        >>> from jaxoff.compare import CompareConfig, compare
        >>> rows = compare(CompareConfig(model="tiny", strategies="all",  # doctest: +SKIP
        ...                              device_mem="30MiB", batch_size=2, seq_len=16))
    """

    console = console or _output.console()
    names = cfg.strategy_list()
    with _progress(console) as progress:
        task = TaskID(progress.add_task("compare", total=len(names) + 1))
        progress.update(task, description="baseline FLOPs (none)")
        baseline = baseline_flops(
            model_config(cfg.model, "none"), cfg.grad_accum * cfg.batch_size, cfg.seq_len
        )
        progress.advance(task)
        measured, skipped = strategy_rows(cfg, console, progress, task)
        progress.update(task, description="done")
    _report.finish_rows(measured, baseline, x="device_bytes")
    for r in skipped:
        if "flops" in r:
            r["recompute_overhead"] = r["flops"] / baseline - 1.0
    budget = cfg.device_mem_bytes()
    title = _report.title(_meta(cfg, device_mem=budget), strategies=True)
    columns = _report.STRATEGY_COLUMNS
    if measured:
        console.print(_report.table(measured, title, columns))
    for r in skipped:
        console.print(f"  not run: {r['strategy']}: {r['status']}")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = _meta(cfg, device_mem=budget, hardware=cfg.hardware, baseline_flops=baseline)
    rows = measured + skipped
    _report.write_csv(rows, out / "compare.csv")
    _report.write_json(measured, meta, out / "compare.json", key="strategies", not_run=skipped)
    if measured:
        _report.plot(measured, out / "compare.png", title, x="device_bytes", budget=budget)
    md = _report.markdown(measured, columns) if measured else ""
    md += "".join(f"\n\nnot run: {r['strategy']}: {r['status']}" for r in skipped)
    (out / "compare.md").write_text(md.strip() + "\n")
    console.print(f"wrote {out / 'compare.csv'}, compare.json, compare.md, compare.png")
    bad = [r["strategy"] for r in measured if r.get("export_ok") is False]
    if cfg.check_export and bad:
        raise JaxoffError(f"placement/offload in the cuda export is wrong for {bad}")
    return rows

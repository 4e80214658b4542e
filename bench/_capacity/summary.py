"""The capacity probes as a table, and the summary a result holds (the largest fitting size
of each mode; ``bench/report.py`` computes the pages' ratios from the records)."""

from __future__ import annotations

from _capacity.sizes import GIB, MODES, PAGED_MODES


def fmt_gib(b) -> str:
    return "-" if b is None else f"{b / GIB:.2f}"


def _store_gb(r: dict) -> str:
    if r.get("store_bytes_on_disk"):
        return f"{r['store_bytes_on_disk'] / 1e9:.1f}"
    return f"({r['store_bytes_needed'] / 1e9:.1f})" if r["store_bytes_needed"] else "-"


COLUMNS = {
    "mode": lambda r: r["mode"],
    "layers": lambda r: str(r["num_layers"]),
    "params": lambda r: f"{r['params'] / 1e9:.3f}B",
    "peak RSS GiB": lambda r: fmt_gib(r.get("peak_rss")),
    "state GiB": lambda r: fmt_gib(r["state_bytes"]),
    "RSS/state": lambda r: f"{r['rss_over_state']:.3f}" if "rss_over_state" in r else "-",
    "store GB (disk)": _store_gb,
    "compile s": lambda r: f"{r['compile_s']:.0f}" if "compile_s" in r else "-",
    "step s": lambda r: " ".join(f"{s:.1f}" for s in r.get("step_s") or []) or "-",
    "val loss": lambda r: " → ".join(f"{x:.3f}" for x in r.get("val_losses") or []) or "-",
    "loss": lambda r: f"{r['losses'][-1]:.3f}" if r.get("losses") else "-",
    "fits / why not": lambda r: "fits" if r["fits"] else r.get("why", "?"),
}


def rows(records: list[dict]) -> list[list[str]]:
    """The table's cells, one row a probe, in ``COLUMNS`` order."""
    return [[cell(r) for cell in COLUMNS.values()] for r in records]


def render(records: list[dict], console) -> None:
    from rich.table import Table

    t = Table(
        title="GPT capacity probes, each a `jaxoff train` run (peak RSS of each child; "
        "state = params + grads + moments + masters)"
    )
    for col in COLUMNS:
        t.add_column(col, justify="left" if col in ("mode", "fits / why not") else "right")
    for row in rows(records):
        t.add_row(*row)
    console.print(t)


def summarize(records: list[dict]) -> dict:
    """The largest fitting size of each mode, and each paged mode's peak RSS over its
    training state and its parameters over plain's."""
    best = {}
    for m in MODES:
        fit = [r for r in records if r["mode"] == m and r["fits"]]
        if fit:
            best[m] = max(fit, key=lambda r: r["params"])
    keys = ("num_layers", "params", "peak_rss", "state_bytes", "rss_over_state")
    out: dict = {"largest": {m: {k: r.get(k) for k in keys} for m, r in best.items()}}
    for m in PAGED_MODES:
        if m in best:
            out[f"{m}_rss_over_state"] = best[m]["rss_over_state"]
            if "plain" in best:
                out[f"{m}_over_plain_params"] = best[m]["params"] / best["plain"]["params"]
    return out

"""Turns measured rows into a rich table, CSV, JSON and a Pareto plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rich.table import Table

MiB = 2**20

# column key -> (header, formatter); the CSV/JSON keep the raw numbers
COLUMNS: dict[str, tuple[str, object]] = {
    "policy": ("policy", str),
    "placement": ("placement", lambda p: p or "device"),
    "device_state_bytes": ("state on device MiB", lambda b: f"{(b or 0) / MiB:,.1f}"),
    "remat_every": ("remat unit", lambda k: "block" if k == 1 else f"{k} blocks"),
    "temp_bytes": ("temp MiB", lambda b: f"{b / MiB:,.1f}"),
    "host_bytes": ("host MiB/step", lambda b: f"{b / MiB:,.1f}" if b else "0"),
    "recompute_overhead": ("recompute", lambda r: f"{r:+.1%}"),
    "step_s": ("step ms", lambda s: f"{s * 1e3:,.1f}"),
    "peak_rss_bytes": ("RSS MiB", lambda b: f"{b / MiB:,.0f}"),
    "export_ok": ("export", lambda v: {True: "ok", False: "WRONG"}.get(v, "-")),
    "pareto": ("pareto", lambda p: "*" if p else ""),
}


def _mib(b) -> str:
    return "-" if b is None else (f"{b / MiB:,.1f}" if b else "0")


# the columns of ``jaxoff compare --strategies``
STRATEGY_COLUMNS: dict[str, tuple[str, object]] = {
    "strategy": ("strategy", str),
    "placement": ("placement", lambda p: p or "device"),
    "store": ("opt on disk", lambda s: "yes" if s else ""),
    "device_bytes": ("device MiB", _mib),
    "host_bytes": ("host MiB", _mib),
    "disk_bytes": ("disk MiB", _mib),
    "recompute_overhead": ("recompute", lambda r: "-" if r is None else f"{r:+.1%}"),
    "link_bytes": ("link MiB/step", _mib),
    "disk_io_bytes": ("disk I/O MiB/step", _mib),
    "step_s": ("step ms", lambda s: "-" if s is None else f"{s * 1e3:,.1f}"),
    "peak_rss_bytes": ("RSS MiB", lambda b: "-" if b is None else f"{b / MiB:,.0f}"),
    "export_ok": ("export", lambda v: {True: "ok", False: "WRONG"}.get(v, "-")),
    "pareto": ("pareto", lambda p: "*" if p else ""),
}


def pareto(rows: list[dict], x: str = "temp_bytes", y: str = "step_s") -> list[bool]:
    """Rows no other row beats on both ``x`` and ``y`` (lower is better)."""
    return [
        not any(o[x] <= r[x] and o[y] <= r[y] and (o[x] < r[x] or o[y] < r[y]) for o in rows)
        for r in rows
    ]


def finish_rows(rows: list[dict], baseline_flops: float, x: str = "temp_bytes") -> list[dict]:
    """Adds the recompute overhead (vs no remat) and the Pareto flag (``x`` vs step time)."""
    for r in rows:
        r["recompute_overhead"] = r["flops"] / baseline_flops - 1.0
    for r, front in zip(rows, pareto(rows, x=x), strict=True):
        r["pareto"] = front
    return rows


def table(rows: list[dict], title: str, columns: dict | None = None) -> Table:
    columns = columns or COLUMNS
    first = next(iter(columns))
    t = Table(title=title)
    keys = [k for k in columns if k != "export_ok" or any("export_ok" in r for r in rows)]
    for k in keys:
        t.add_column(columns[k][0], justify="left" if k == first else "right")
    for r in rows:
        t.add_row(*(columns[k][1](r.get(k)) for k in keys))
    return t


def markdown(rows: list[dict], columns: dict | None = None) -> str:
    """The table as GitHub markdown (for docs)."""
    columns = columns or COLUMNS
    first = next(iter(columns))
    keys = [k for k in columns if k != "export_ok" or any("export_ok" in r for r in rows)]
    lines = [
        "| " + " | ".join(columns[k][0] for k in keys) + " |",
        "|" + "|".join("---" if k == first else "---:" for k in keys) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(columns[k][1](r.get(k)) for k in keys) + " |")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    keys = []
    for r in rows:  # the union of every row's keys (rows not run have fewer)
        keys += [k for k in r if k not in keys and not isinstance(r[k], dict)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def write_json(rows: list[dict], meta: dict, path: Path, key: str = "policies", **more) -> None:
    path.write_text(json.dumps({"meta": meta, key: rows, **more}, indent=2) + "\n")


def plot(
    rows: list[dict], path: Path, title: str, x: str = "temp_bytes", budget: float | None = None
) -> None:
    """Device memory (``x``) vs step time, one point per row, the Pareto front joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for r in rows:
        px, py = r[x] / MiB, r["step_s"] * 1e3
        ax.scatter(
            px,
            py,
            s=60 if r["pareto"] else 30,
            color="tab:red" if r["pareto"] else "tab:blue",
            zorder=3,
        )
        if "strategy" in r:
            label = r["strategy"]
        elif r.get("placement", "device") == "device":
            label = r["policy"]
        else:
            label = f"{r['policy']}@{r['placement']}"
        ax.annotate(label[:36], (px, py), textcoords="offset points", xytext=(5, 4), fontsize=8)
    if budget is not None:
        ax.axvline(budget / MiB, color="gray", linestyle="--", label="device budget")
    front = sorted((r[x] / MiB, r["step_s"] * 1e3) for r in rows if r["pareto"])
    if front:
        ax.step(
            *zip(*front, strict=True),
            where="post",
            color="tab:red",
            alpha=0.6,
            label="Pareto front (lower-left is better)",
        )
    if front or budget is not None:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel(
        "device temp memory (MiB, compiled.memory_analysis)"
        if x == "temp_bytes"
        else "device memory (MiB: state on device + temp - offloaded activations)"
    )
    ax.set_ylabel("step time (ms, median)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

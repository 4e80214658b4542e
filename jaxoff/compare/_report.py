"""Turns measured rows into a rich table, CSV, JSON and a Pareto plot."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

from rich.table import Table

MiB = 2**20

# column key -> (header, formatter); the CSV/JSON keep the raw numbers
COLUMNS: dict[str, tuple[str, object]] = {
    "policy": ("policy", str),
    "placement": ("placement", lambda p: p or "device"),
    "device_state_bytes": ("state on device MiB", lambda b: f"{(b or 0) / MiB:,.1f}"),
    "remat_every": ("remat unit", lambda k: "block" if k == 1 else f"{k} blocks"),
    "segments": ("segments pay from", lambda s: f"{s['pays_from_layers']} layers" if s else ""),
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


def title(meta: dict, strategies: bool = False) -> str:
    """The title of the table and the plot, from compare.json's ``meta``."""
    n = meta.get("grad_accum", 1)
    batch = f"{meta['batch_size']}" + (f" x {n} micro-batches" if n > 1 else "")
    if not strategies:
        return (
            f"jaxoff compare: model {meta['model']}, batch {batch}, seq "
            f"{meta['seq_len']}, {meta['steps']} timed steps"
        )
    budget = meta.get("device_mem")
    return (
        f"jaxoff compare --strategies: model {meta['model']}, batch {batch}, seq "
        f"{meta['seq_len']}, device budget "
        f"{'none' if budget is None else f'{budget / MiB:,.0f} MiB'}, "
        f"{meta['steps']} timed steps"
    )


def plot(
    rows: list[dict], path: Path, title: str, x: str = "temp_bytes", budget: float | None = None
) -> None:
    """Device memory (``x``) vs step time, one point per row, the Pareto front joined; the
    legend sits outside the axes and every label inside them (nothing covered or clipped)."""
    import matplotlib.pyplot as plt  # heavy: only to draw the plot

    fig = figure(rows, title, x, budget)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def figure(rows: list[dict], title: str, x: str = "temp_bytes", budget: float | None = None):
    """The figure :func:`plot` saves (a ``matplotlib.figure.Figure``, laid out)."""

    import matplotlib  # heavy: only to draw the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: only to draw the plot

    fig, ax = plt.subplots(figsize=(8.5, 4.5), dpi=120)
    points = [(r[x] / MiB, r["step_s"] * 1e3) for r in rows]
    for r, (px, py) in zip(rows, points, strict=True):
        ax.scatter(
            px,
            py,
            s=60 if r["pareto"] else 30,
            color="tab:red" if r["pareto"] else "tab:blue",
            zorder=3,
        )
    if budget is not None:
        ax.axvline(budget / MiB, color="gray", linestyle="--", label="device budget")
    front = sorted(p for r, p in zip(rows, points, strict=True) if r["pareto"])
    if front:
        ax.step(
            *zip(*front, strict=True),
            where="post",
            color="tab:red",
            alpha=0.6,
            label="Pareto front (lower-left is better)",
        )
    ax.margins(x=0.08, y=0.1)
    ax.set_xlabel(
        "device temp memory (MiB, compiled.memory_analysis)"
        if x == "temp_bytes"
        else "device memory (MiB: state on device + temp - offloaded activations)"
    )
    ax.set_ylabel("step time (ms, median)")
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=10)
    ax.grid(alpha=0.3)
    if front or budget is not None:  # beside the axes: it covers no point and no label
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize=8)
    fig.tight_layout()
    _label_points(fig, ax, [_label(r) for r in rows], points)
    return fig


def _label(row: dict) -> str:
    if "strategy" in row:
        return row["strategy"]
    if row.get("placement", "device") == "device":
        return row["policy"]
    return f"{row['policy']}@{row['placement']}"


def _label_points(fig, ax, labels: list[str], points: list[tuple[float, float]]) -> None:
    """Annotates each point, choosing for each label the first of a few places beside its
    point where it stays inside the axes and covers no other label and no point."""
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    dots = [ax.transData.transform(p) for p in points]
    placed = []
    # offsets in points: right, left, then further up and down
    offsets = [(5, 4), (-5, 4), (5, -12), (-5, -12), (5, 14), (-5, 14), (5, -22), (-5, -22)]

    def annotate(i, offset):
        return ax.annotate(
            labels[i][:36],
            points[i],
            textcoords="offset points",
            xytext=offset,
            ha="left" if offset[0] > 0 else "right",
            fontsize=8,
            annotation_clip=False,
        )

    def score(i, box) -> int:  # 2: inside the axes and clear; 1: inside; 0: neither
        fits = inside.x0 <= box.x0 and box.x1 <= inside.x1
        fits = fits and inside.y0 <= box.y0 and box.y1 <= inside.y1
        covers = any(box.overlaps(b) for b in placed) or any(
            j != i and box.x0 <= d[0] <= box.x1 and box.y0 <= d[1] <= box.y1
            for j, d in enumerate(dots)
        )
        return 0 if not fits else 1 if covers else 2

    for i in sorted(range(len(points)), key=lambda i: (points[i][1], points[i][0])):
        scored = []
        for offset in offsets:
            text = annotate(i, offset)
            scored.append((score(i, text.get_window_extent(renderer)), offset))
            text.remove()
        best = max(scored, key=lambda s: s[0])[1]  # the first of the best
        placed.append(annotate(i, best).get_window_extent(renderer))

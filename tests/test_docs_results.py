"""Every result the README and docs name is committed, and the capacity records they quote obey
the record rule (a bracket: the largest that fits trained >= 10 steps with its loss falling, and
the next size up failed or exceeded the disk)."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOCS = [d for d in DOCS if d.exists()]
NAMED = re.compile(r"bench/results/[A-Za-z0-9_.\-/]*[A-Za-z0-9_\-/]")


def named_results() -> list[str]:
    return sorted({m for doc in DOCS for m in NAMED.findall(doc.read_text())})


def test_the_docs_name_results():
    assert len(named_results()) >= 10


@pytest.mark.parametrize("name", named_results())
def test_every_named_result_is_committed_and_readable(name):
    path = ROOT / name
    assert path.exists(), f"{name} is named in the docs but not committed"
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    assert files, f"{name} is an empty directory"
    for f in files:
        if f.suffix == ".json":
            json.loads(f.read_text())


# the capacity records quoted as records (10 steps, loss falling), by mode
RECORDS = {
    "capacity/fuyou_10steps.json": "fuyou",
    "capacity/fuyou_10steps_current.json": "fuyou",
    "capacity/fuyou_nvme_lr1e-6.json": "fuyou-nvme",
    "capacity/plain_10steps.json": "plain",
}


# records whose next size up was probed in a run of its own: (the record, the size up's file)
SPLIT = {"capacity/paged_55.json": ("paged", "capacity/paged_56.json")}


@pytest.mark.parametrize(
    "name,mode,more",
    [(n, m, None) for n, m in sorted(RECORDS.items())]
    + [(n, m, f) for n, (m, f) in sorted(SPLIT.items())],
)
def test_capacity_records_are_brackets_with_a_falling_loss(name, mode, more):
    doc = json.loads((ROOT / "bench/results" / name).read_text())
    recs = [r for r in doc["records"] if r["mode"] == mode]
    if more:  # the same command but for --start and --out
        other = json.loads((ROOT / "bench/results" / more).read_text())
        recs += [r for r in other["records"] if r["mode"] == mode]
        args = [
            {k: v for k, v in d["args"].items() if k not in ("start", "out")} for d in (doc, other)
        ]
        assert args[0] == args[1]
    fits = [r for r in recs if r.get("fits")]
    assert fits, f"{name}: nothing fits"
    best = max(fits, key=lambda r: r["num_layers"])
    assert best["steps"] >= 10 and len(best["losses"]) == best["steps"]
    assert best["loss_falling"] and best["data"] == "corpus"
    first, second = best["pass_losses"]
    assert second < first
    above = [r for r in recs if r["num_layers"] == best["num_layers"] + 1]
    assert above and not above[0].get("fits"), f"{name}: the next size up was not tried"
    assert any(w in above[0]["why"] for w in ("disk-bound", "out of memory", "RSS")), above[0][
        "why"
    ]
    # the rendered figures page quotes the record's parameter count (the README quotes the
    # headline records among them)
    assert f"{best['params'] / 1e9:.3f}B" in (ROOT / "docs/benchmarks.md").read_text()


# ---------------------------------------------------------------- pages rendered from results


def _report():
    """bench/report.py, imported from its file (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("jaxoff_bench_report", ROOT / "bench/report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_benchmarks_page_is_the_rendering_of_the_results():
    report = _report()
    assert (ROOT / "docs/benchmarks.md").read_text() == report.benchmarks_page(), (
        "docs/benchmarks.md differs from its rendering: run python bench/report.py"
    )


def test_readme_headline_table_is_the_rendering_of_the_results():
    report = _report()
    readme = (ROOT / "README.md").read_text()
    table = report.headline_table()
    assert readme == report.readme_with_table(readme, table), (
        "README.md's headline table differs from its rendering: run python bench/report.py"
    )
    rows = [r for r in table.splitlines()[2:] if r.startswith("|")]
    assert 1 <= len(rows) <= 6
    for row in rows:  # each headline figure links the result it comes from
        assert "](bench/results/" in row, row


def test_every_rendered_figure_names_committed_results():
    report = _report()
    figures = report.figures()
    assert len(figures) >= 10
    for f in figures:
        assert f.results, f.what
        for rel in f.results:
            assert (ROOT / "bench/results" / rel).is_file(), rel
    # the capacity headline's ratio is computed from its two results, not copied
    fuyou = next(f for f in figures if f.headline and "`jaxoff train` trains" in f.headline)
    assert fuyou.results == ("capacity/fuyou_train_record.json", "capacity/plain_10steps.json")
    largest = [
        max((r["params"] for r in json.loads((ROOT / "bench/results" / rel).read_text())["records"]
             if r.get("fits")), default=0)
        for rel in fuyou.results
    ]  # fmt: skip
    assert f"**{largest[0] / largest[1]:.2f}×**" in fuyou.headline


def test_every_result_says_where_it_came_from():
    report = _report()
    for path in sorted((ROOT / "bench/results").rglob("*.json")):
        folder = path.parent / "provenance.json"  # a folder of one run's files says it once
        doc = json.loads((folder if folder.exists() else path).read_text())
        if not isinstance(doc, dict):
            continue
        prov = report.provenance(doc)
        for key in ("bench", "command", "commit", "machine", "date"):
            assert key in prov, (
                f"{path.relative_to(ROOT)} has no {key}: write results with "
                "bench/_common/results.py's write_result"
            )


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


@pytest.mark.parametrize(
    "doc", [*DOCS, ROOT / "bench/README.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_relative_links_resolve(doc):
    for m in LINK.finditer(doc.read_text()):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links {target}"

"""Render ``docs/benchmarks.md`` and the README's headline table from the result files.

    python bench/report.py            # write docs/benchmarks.md and the README's table
    python bench/report.py --check    # exit 1, naming the page, where a committed page differs

Every figure on those pages is computed here from ``bench/results/<bench>/*.json`` (ratios too:
nothing is divided by hand), and names the files it comes from; each file says where it came
from (its ``provenance``: command, commit, machine, versions, date; see
``bench/_common/results.py``). ``tests/test_docs_results.py`` fails when a committed page
differs from this rendering.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
HEAD_START = "<!-- headline: rendered by python bench/report.py; do not edit -->"
HEAD_END = "<!-- /headline -->"
GIB = 1 << 30


def load(rel: str) -> dict:
    """A result file, by its path under ``bench/results/``."""
    return json.loads((RESULTS / rel).read_text())


def provenance(doc: dict) -> dict:
    """The provenance of a result: its own top-level fields (schema 1) or its added block."""
    return doc.get("provenance", doc)


@dataclass(frozen=True)
class Figure:
    section: str  # a key of SECTIONS
    what: str  # what is measured, in a few words
    value: str  # the figure, computed from the results
    results: tuple[str, ...]  # paths under bench/results/
    headline: str | None = None  # the README's wording of the row, when it is a headline


# ---------------------------------------------------------------- the figures, from the files


def _largest(rel: str, mode: str) -> dict:
    fits = [r for r in load(rel)["records"] if r["mode"] == mode and r.get("fits")]
    return max(fits, key=lambda r: r["num_layers"])


def _first_failing(rels: list[str], mode: str, layers: int) -> dict | None:
    for rel in rels:
        for r in load(rel)["records"]:
            if r["mode"] == mode and r["num_layers"] == layers:
                return r
    return None


def _b(params: int) -> str:
    return f"{params / 1e9:.3f}B"


FORMER_LOOP = "measured by the bench's former own loop, not `jaxoff train`"


def _through(rec: dict, what: str) -> str:
    """``what``, saying so when the record was not a ``jaxoff train`` run: capacity probes
    before every probe ran through the trainer (``via`` absent) ran in the bench's own loop."""
    return what if rec.get("via") == "train" else f"{what}; {FORMER_LOOP}"


def _capacity() -> list[Figure]:
    plain_rel, fuyou_rel = "capacity/plain_10steps.json", "capacity/fuyou_10steps.json"
    nvme_rel = "capacity/fuyou_nvme_lr1e-6.json"
    paged_rel, paged_up = "capacity/paged_55.json", "capacity/paged_56.json"
    opt_rel = "capacity/paged_106_compiler_options.json"
    train_rel = "capacity/fuyou_train_record.json"
    plain, fuyou = _largest(plain_rel, "plain"), _largest(fuyou_rel, "fuyou")
    nvme, paged = _largest(nvme_rel, "fuyou-nvme"), _largest(paged_rel, "paged")
    opt = _largest(opt_rel, "paged")
    above = _first_failing([plain_rel], "plain", plain["num_layers"] + 1)
    trained = _largest(train_rel, "fuyou")
    over = _first_failing([train_rel], "fuyou", trained["num_layers"] + 1)
    val = trained["val_losses"]
    x = lambda r: f"{r['params'] / plain['params']:.2f}×"  # noqa: E731
    rss = lambda r: f"{r['peak_rss'] / GIB:.2f} GiB"  # noqa: E731
    # a headline is a record of jaxoff: a `jaxoff train` run (STYLE.md, "the product
    # produces the headline"); the others stay on the figures page
    trainer = lambda r, line: line if r.get("via") == "train" else None  # noqa: E731
    return [
        Figure(
            "capacity",
            _through(plain, "plain flax + optax AdamW, fp32, all in RAM"),
            f"{_b(plain['params'])} ({plain['num_layers']} layers) in {rss(plain)} peak RSS; "
            f"{plain['num_layers'] + 1} layers: {above['why'] if above else 'not tried'}",
            (plain_rel,),
        ),
        Figure(
            "capacity",
            _through(
                trained,
                "`jaxoff train --strategy fuyou --paged-checkpoint store`: AdamW state (fp32 "
                "masters + moments) on SSD, bf16 parameters in RAM, 10 steps ending on a "
                "checkpoint",
            ),
            f"{_b(trained['params'])} ({trained['num_layers']} layers), {x(trained)} plain, "
            f"{rss(trained)} peak RSS, validation loss {val[0]:.3f} → {val[-1]:.3f}; "
            f"{trained['num_layers'] + 1} layers: {over['why'] if over else 'not tried'}",
            (train_rel, plain_rel),
            trainer(
                trained,
                f"Largest GPT `jaxoff train` trains in 24 GiB RAM | **{_b(trained['params'])}**, "
                f"**{x(trained)}** plain optax",
            ),
        ),
        Figure(
            "capacity",
            _through(fuyou, "the same step, no checkpoint, 84.6 GB of disk free then"),
            f"{_b(fuyou['params'])} ({fuyou['num_layers']} layers), {x(fuyou)} plain, "
            f"{rss(fuyou)} peak RSS = {fuyou['rss_over_state']:.3f} of the training state",
            (fuyou_rel, plain_rel),
        ),
        Figure(
            "capacity",
            _through(nvme, "Fuyou step with the block parameters paged too (`fuyou-nvme`)"),
            f"{_b(nvme['params'])} ({nvme['num_layers']} layers), {x(nvme)} plain, "
            f"{rss(nvme)} peak RSS = {nvme['rss_over_state']:.3f} of the training state",
            (nvme_rel, plain_rel),
        ),
        Figure(
            "capacity",
            _through(paged, "sequential paged AdamW, XLA's default compile"),
            f"{_b(paged['params'])} ({paged['num_layers']} layers; the next size up in "
            f"`{paged_up}`), {x(paged)} plain, {rss(paged)} peak RSS",
            (paged_rel, paged_up, plain_rel),
        ),
        Figure(
            "capacity",
            _through(
                opt,
                "sequential paged AdamW compiled with `jaxoff.compiler_options`, as `jaxoff "
                "train` does",
            ),
            f"{_b(opt['params'])} ({opt['num_layers']} layers), ≥ {x(opt)} plain (a lower bound: "
            f"{opt['num_layers'] + 1} layers not run), {rss(opt)} peak RSS",
            (opt_rel, plain_rel),
            trainer(
                opt,
                f"`jaxoff train`'s paged step, same rule | {_b(opt['params'])}, ≥ {x(opt)} plain",
            ),
        ),
    ]


def _pretrained() -> list[Figure]:
    """``bench/hf_load.py``: a Llama-2-7B-shaped checkpoint into ``jaxoff train --init-from``
    (Fuyou, ``--page-params``), one step, and back out through ``jaxoff export``."""
    full_rel, cut_rel = "hf_load/2026-12-02-e45bc26.json", "hf_load/2026-11-29-e6157f0.json"
    out = []
    for rel in (full_rel, cut_rel):
        r = load(rel)["summary"]
        shape = f"{r['layers']} of Llama-2-7B's 32 layers, {_b(r['params'])} parameters"
        out.append(
            Figure(
                "pretrained",
                f"{shape}, {r.get('optimizer', 'adamw')}: load, one `jaxoff train` step, export",
                f"load {r['load_peak_rss_gib']:.2f} GiB ({r['load_s']:.0f} s), step "
                f"{r['train_peak_rss_gib']:.2f} GiB, export {r['export_peak_rss_gib']:.2f} GiB "
                f"({r['export_s']:.0f} s) peak RSS, against {r['fp32_model_bytes'] / GIB:.1f} "
                "GiB for the model in float32",
                (rel,),
            )
        )
    r = load(full_rel)["summary"]
    out[0] = Figure(
        *dataclasses.astuple(out[0])[:4],
        f"A Llama-2-7B-shaped checkpoint fine-tuned by `jaxoff train --init-from` | "
        f"{_b(r['params'])}: a step in **{r['train_peak_rss_gib']:.2f} GiB** peak RSS, load "
        f"{r['load_peak_rss_gib']:.2f}, export {r['export_peak_rss_gib']:.2f}",
    )
    return out


def _bounds() -> list[Figure]:
    runs = ["fuyou_capacity/132.json"] + [f"fuyou_capacity/132_run{i}.json" for i in range(2, 6)]
    ratios = [load(r)["summary"]["capacity"]["fuyou_over_bound"] for r in runs]
    med = statistics.median(ratios)
    each = ", ".join(f"{r:.3f}" for r in ratios)
    mini = [f"fuyou/mini_flat_grads{s}.json" for s in ("", "_run2", "_run3")]
    mini_r = [load(r)["summary"]["fuyou_over_bound"] for r in mini]
    med_b1 = [f"fuyou/medium_b1{s}.json" for s in ("", "_run2", "_run3")]
    med_r = [load(r)["summary"]["fuyou_over_bound"] for r in med_b1]
    paged = load("paged_step/mini.json")["summary"]
    big = load(runs[0])["summary"]["capacity"]
    return [
        Figure(
            "bounds",
            f"Fuyou step / max(compute-only, pure I/O), {big['layers']} layers at d = 2048 "
            f"({_b(big['params'])}, {big['pure_io_read_gb']:.1f} GB of state read and written "
            f"a step), in the instrumented loop that was `bench/capacity.py`'s (now "
            "`bench/_common/step_loop.py`), not `jaxoff train`",
            f"median **{med:.3f}** of {len(runs)} runs ({each})",
            tuple(runs),
            # the size is the figure's page's; a README row holds 200 characters
            f"Fuyou step / max(compute-only, pure I/O), bench loop | median **{med:.3f}×** "
            f"({min(ratios):.2f}–{max(ratios):.2f})",
        ),
        Figure(
            "bounds",
            "Fuyou step / max(compute-only, pure I/O), GPT-2 medium's blocks (304M), batch 1",
            f"median {statistics.median(med_r):.3f} of 3 runs "
            f"({', '.join(f'{r:.3f}' for r in med_r)})",
            tuple(med_b1),
        ),
        Figure(
            "bounds",
            "Fuyou step / max(compute-only, pure I/O), `mini`, batch 4",
            f"median {statistics.median(mini_r):.3f} of 3 runs "
            f"({', '.join(f'{r:.3f}' for r in mini_r)})",
            tuple(mini),
        ),
        Figure(
            "bounds",
            "sequential paged step / the same step with the optimizer state in RAM, `mini`",
            f"{paged['paged_over_compute_only']:.3f} ({paged['paged_s']:.3f} against "
            f"{paged['compute_only_s']:.3f} s); `jaxoff train` counts "
            f"{100 * paged['train_io_hidden']:.0f}% of its I/O hidden",
            ("paged_step/mini.json",),
        ),
    ]


def _equivalence() -> list[Figure]:
    rel = "equivalence/2026-11-23.json"
    d = load(rel)
    dist = d["distances_to_plain"]  # to the user's whole-tree step
    leaf, paged = dist["plain-leaf"], dist["paged"]
    same = all(paged[k] == leaf[k] for k in ("param_max_abs", "param_rel_l2", "loss_max_rel"))
    bitwise = d["paged_bitwise_equal_to_plain_leaf"]
    l2 = paged["param_rel_l2"] / leaf["param_rel_l2"]
    return [
        Figure(
            "equivalence",
            f"paged AdamW against optax applied leaf by leaf ({d['model']}, {d['steps']} steps)",
            ("bitwise equal" if bitwise else "not bitwise equal")
            + "; against the whole-tree step, "
            + ("exactly the leaf-by-leaf floor" if same else f"{l2:.2f}× the leaf-by-leaf floor")
            + f" (relative L2 {leaf['param_rel_l2']:.1e}, parameters {leaf['param_max_abs']:.1e} "
            "max abs)",
            (rel,),
            "Paged AdamW against optax applied leaf by leaf (the floor) | "
            + ("**bitwise equal**" if bitwise else "differs")
            + f" over {d['steps']} steps (an MLP)",
        ),
    ]


def _main_job() -> tuple[str, list[dict]]:
    """The newest result of ``bench/main_job.py``, else the hand-made record before it."""
    made = sorted(
        (p for p in (RESULTS / "main_job").glob("*.json") if "schema" in json.loads(p.read_text())),
        key=lambda p: json.loads(p.read_text())["date"],
    )
    if made:
        rel = made[-1].relative_to(RESULTS).as_posix()
        return rel, load(rel)["records"]
    rel = "main_job/2026-11-23.json"  # recorded by hand: /usr/bin/time around the command
    return rel, [r | {"cpu_s": r["user_s"] + r["sys_s"]} for r in load(rel)["runs"]]


def _training() -> list[Figure]:
    job_rel, runs = _main_job()
    walls = sorted(r["wall_s"] for r in runs)
    cpu = sorted(r["cpu_s"] for r in runs)
    m = lambda s: f"{int(s // 60)} min {int(round(s % 60)):02d} s"  # noqa: E731
    r0 = runs[0]
    lw = load("layerwise_init/xl.json")
    recs = lw["records"]
    mp = {k: load(f"multiprocess/{k}.json")["ratio_2_over_1"] for k in ("tiny", "mini")}
    return [
        Figure(
            "training",
            "the main job, `jaxoff train` with its defaults (AdamW state paged)",
            f"loss {r0['first_loss']:.2f} → {r0['last_loss']:.2f} (validation "
            f"{r0['last_val_loss']:.2f})"
            + (" in every run" if len({r["last_loss"] for r in runs}) == 1 else " in the first run")
            + f"; {m(walls[0])} to {m(walls[-1])} wall, {cpu[0]:.0f}–{cpu[-1]:.0f} s of CPU, "
            f"{len(runs)} run{'s' if len(runs) > 1 else ''} on a shared 2-core machine",
            (job_rel,),
            f"The main job, `jaxoff train` (2-core CPU) | loss {r0['first_loss']:.2f} → "
            f"{r0['last_loss']:.2f}, {m(walls[0])} to {m(walls[-1])}",
        ),
        Figure(
            "training",
            "GPT xl (1.478B) written to a page store layer by layer / built whole, peak RSS",
            f"{recs['layerwise']['peak_rss'] / GIB:.2f} against "
            f"{recs['whole']['peak_rss'] / GIB:.2f} GiB "
            f"({lw['summary']['layerwise_over_whole']:.3f}×)",
            ("layerwise_init/xl.json",),
        ),
        Figure(
            "training",
            "paged FSDP step, 2 processes / 1 process on the same 2 devices",
            f"tiny {mp['tiny']:.2f}, mini {mp['mini']:.2f} (gloo on 2 shared cores)",
            ("multiprocess/tiny.json", "multiprocess/mini.json"),
        ),
    ]


def _planner() -> list[Figure]:
    po = load("plan_options/2026-11-28.json")
    rows = po["rows"]
    worst = max(rows, key=lambda r: abs(r["error_with_options"]))
    others = [abs(r["error_with_options"]) for r in rows if r is not worst]
    pv = load("plan_validate/s149_l16.json")
    return [
        Figure(
            "planner",
            "`jaxoff plan`'s compile-priced temporaries / the trained step's, bf16 presets at 16 "
            "layers",
            f"within {100 * max(others):.2f}% except {worst['model']} `{worst['plan']}` "
            f"({100 * worst['error_with_options']:+.1f}%); priced from XLA's default compile "
            f"instead: {100 * min(r['error_xla_default'] for r in rows):+.0f}% to "
            f"{100 * max(r['error_xla_default'] for r in rows):+.0f}%",
            ("plan_options/2026-11-28.json",),
        ),
        Figure(
            "planner",
            "priced plans against the full-depth compile (XLA's default compile), tiny and "
            "llama-tiny at 16 layers, batch 3 × seq 149",
            f"worst error {100 * pv['worst_abs_error']['float32']:.2f}% (float32), "
            f"{100 * pv['worst_abs_error']['bfloat16']:.2f}% (bfloat16), "
            f"{pv['within_5_percent']} within 5%; the cost model alone "
            f"{100 * pv['worst_abs_error_model']['float32']:.2f}% and "
            f"{100 * pv['worst_abs_error_model']['bfloat16']:.2f}%",
            ("plan_validate/s149_l16.json",),
        ),
    ]


def _investigations() -> list[Figure]:
    bf = {(r["kind"], r["layers"]): r for r in load("bf16_scan_copy/2026-11-28.json")["results"]}
    g, p = bf[("grad", 12)], bf[("paged", 12)]
    xo = load("xla_cpu_overlap/2026-11-26.json")["results"]
    scan = next(v for k, v in xo.items() if "scan" in k)
    crc = load("crc32c_speed/2026-11-26.json")["rows"]
    rc = load("resume_compile/tiny.json")
    med, ratios = rc["median"], rc["ratios"]
    return [
        Figure(
            "investigations",
            "XLA:CPU's float32 copy of a bf16 layer stack, removed by `jaxoff.compiler_options` "
            "(12 layers × 2048)",
            f"`value_and_grad` temporaries {g['xla_default']['temp_gib']:.2f} → "
            f"{g['jaxoff']['temp_gib']:.2f} GiB in {g['time_ratio']:.2f}× the time; the paged "
            f"step's {p['xla_default']['temp_gib']:.2f} → {p['jaxoff']['temp_gib']:.2f} GiB in "
            f"{p['time_ratio']:.2f}×; bitwise equal: {g['bitwise_equal'] and p['bitwise_equal']}",
            ("bf16_scan_copy/2026-11-28.json",),
        ),
        Figure(
            "investigations",
            "two independent computations in one XLA:CPU scan body, time / the sum alone",
            f"{scan['both_over_sum']:.2f} (full overlap would be {scan['max_over_sum']:.2f})",
            ("xla_cpu_overlap/2026-11-26.json",),
        ),
        Figure(
            "investigations",
            "the engine's crc32c / the `crc32c` package, by chunk size",
            ", ".join(f"{r['kib']} KiB {r['ratio']:.2f}×" for r in crc),
            ("crc32c_speed/2026-11-26.json",),
        ),
        Figure(
            "investigations",
            "a resumed run's compile of the paged step, FFI host call / `io_callback`",
            f"{med['ffi']['resume_compile_s']:.2f} against "
            f"{med['io_callback']['resume_compile_s']:.2f} s "
            f"({ratios['resume_compile_ffi_over_io_callback']:.3f}×); whole resumed run "
            f"{ratios['resume_wall_ffi_over_io_callback']:.2f}×",
            ("resume_compile/tiny.json",),
        ),
    ]


SECTIONS: dict[str, tuple[str, str, Callable[[], list[Figure]]]] = {
    "capacity": (
        "Capacity: the largest GPT that trains in 24 GiB",
        "`bench/capacity.py`: GPT-2 shapes at d_model 2048 (one layer = 50.4M parameters), batch "
        "1 × 128, full remat, each probe a `jaxoff train` run in a child process with a memory "
        "watchdog; rows that say so were measured by the bench's former own loop, before every "
        "probe ran through the trainer. A size *fits* when it trains 10 steps on the embedded "
        "corpus and its loss falls: in a `jaxoff train` probe the validation loss at the end is "
        "below the one at step 5 and the last five steps' mean loss below the first five's; in "
        "the former loop, the second pass over 5 fixed windows has a lower mean than the first. "
        "A record is a bracket: the next size up ran out of memory or of disk. Needs 24 GiB "
        "RAM, up to 85 GB free disk, hours.",
        _capacity,
    ),
    "pretrained": (
        "Fine-tuning a pretrained checkpoint beyond memory",
        "`bench/hf_load.py`: a synthetic checkpoint with Llama-2-7B's shapes (bfloat16 random "
        "values), read layer by layer into a Fuyou `--page-params` store, one or two steps of "
        "`jaxoff train --init-from` (batch 1 × 16), then `jaxoff export --dtype bfloat16`; each "
        "stage a process of its own, its peak RSS from the kernel (`ru_maxrss`). The goal for "
        "load and export is 4 GiB.",
        _pretrained,
    ),
    "bounds": (
        "Paged steps against their bounds",
        "`bench/fuyou_capacity.py`, `bench/fuyou.py`, `bench/paged_step.py`: the step against "
        "the larger of compute-only (the same step with the state in RAM; extrapolated from 4, "
        "8 and 16 layers where it cannot fit) and pure I/O (the same bytes read and written by "
        "the engine, no compute). 1.0 means the paging is fully hidden.",
        _bounds,
    ),
    "equivalence": (
        "Equivalence with optax",
        "`bench/equivalence.py`: the floor is optax's own AdamW applied leaf by leaf, the order "
        "in which the paged update computes; the user's whole-tree step differs from it by "
        "XLA's fusion choices.",
        _equivalence,
    ),
    "training": (
        "Training",
        "`jaxoff train`, `bench/layerwise_init.py`, `bench/multiprocess.py`.",
        _training,
    ),
    "planner": (
        "Planner",
        "`bench/plan.py options`, `bench/plan.py validate`: `jaxoff plan` prices its plans by "
        "compiling 4- and 8-layer copies of the model ([planner](guide/planner.md)).",
        _planner,
    ),
    "investigations": (
        "Investigations",
        "One-off studies under `bench/investigations/`, each behind one design choice.",
        _investigations,
    ),
}


def figures() -> list[Figure]:
    out = [f for _, _, make in SECTIONS.values() for f in make()]
    for f in out:
        for rel in f.results:
            if not (RESULTS / rel).is_file():
                raise FileNotFoundError(f"{f.what}: bench/results/{rel} is not committed")
    return out


# ---------------------------------------------------------------- the pages


def _link(rel: str, prefix: str) -> str:
    return f"[{rel}]({prefix}bench/results/{rel})"


def headline_table(figs: list[Figure] | None = None) -> str:
    """The README's table: at most six figures, each linked to its first result."""
    figs = [f for f in (figs or figures()) if f.headline]
    assert len(figs) <= 6, "the README holds at most six headline figures"
    rows = ["| figure | measured | result |", "|---|---|---|"]
    for f in figs:
        if len(f.results) <= 2:
            links = " ".join(f"[{i + 1}](bench/results/{r})" for i, r in enumerate(f.results))
        else:  # the first, and the page that names them all
            anchor = SECTIONS[f.section][0].lower().replace(" ", "-").replace(":", "")
            links = f"[1](bench/results/{f.results[0]}) "
            links += f"[all {len(f.results)}](docs/benchmarks.md#{anchor})"
        rows.append(f"| {f.headline} | {links} |")
    return "\n".join(rows)


def _short(commit: str) -> str:
    return commit[:7] if len(commit) >= 7 and commit != "unrecorded" else commit


def _machine(m) -> str:
    if isinstance(m, dict) and "cores" in m:
        return f"{m['cores']} cores, {m.get('ram_gib')} GiB" + (
            f", {m['gpu']}" if m.get("gpu") else ""
        )
    if isinstance(m, dict):
        return ", ".join(f"{k} {v}" for k, v in m.items())
    return str(m)


OUT_ARG = re.compile(r"\s--(json|out|out-dir)[ =]\S+")


def _command(cmd: str) -> str:
    """The recorded command, less where it wrote its result (the file now lies elsewhere)."""
    return OUT_ARG.sub("", cmd).replace("|", "\\|")


def benchmarks_page(figs: list[Figure] | None = None) -> str:
    figs = figs or figures()
    out = [
        "# Benchmarks",
        "",
        "<!-- rendered by python bench/report.py from bench/results/; do not edit -->",
        "",
        "Every figure below is computed by `bench/report.py` from the result files it names; "
        "each file records the command, the commit, the machine and the library versions "
        "that produced it (older files: the commit that added them, and `unrecorded` where "
        "they did not say). What each bench needs and how long it runs: "
        "[bench/README.md](../bench/README.md). How the numbers changed over time: "
        "[CHANGELOG.md](../CHANGELOG.md). Unless a row says otherwise, the machine was this "
        "project's shared 2-core, 24 GiB CPU machine.",
        "",
    ]
    for key, (title, preface, _) in SECTIONS.items():
        out += [f"## {title}", "", preface, "", "| what | figure | from |", "|---|---|---|"]
        for f in (f for f in figs if f.section == key):
            links = ", ".join(_link(r, "../") for r in f.results)
            cells = (c.replace("|", "\\|") for c in (f.what, f.value))  # a | would split a cell
            out.append(f"| {' | '.join(cells)} | {links} |")
        out.append("")
    out += [
        "## Where each result came from",
        "",
        "Commands are shown without their `--json` / `--out` argument: each wrote the file "
        "named in its row, which has since moved under `bench/results/<bench>/`. They are as "
        "recorded: [bench/README.md](../bench/README.md) gives each bench's command today.",
        "",
        "| result | bench | date | commit | machine | command |",
        "|---|---|---|---|---|---|",
    ]
    for path in sorted(RESULTS.rglob("*.json")):
        folder = path.parent / "provenance.json"
        if folder.exists() and path != folder:
            continue  # a folder of one run's files: listed once, by its provenance.json
        rel = path.relative_to(RESULTS).as_posix()
        if path == folder:
            rel = path.parent.relative_to(RESULTS).as_posix() + "/"
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or ("provenance" not in doc and "schema" not in doc):
            continue
        p = provenance(doc)
        cmd = _command(str(p.get("command", "unrecorded")))
        out.append(
            f"| {_link(rel, '../')} | {p.get('bench')} | {str(p.get('date'))[:10]} | "
            f"{_short(str(p.get('commit')))} | {_machine(p.get('machine'))} | `{cmd}` |"
        )
    return "\n".join(out) + "\n"


def readme_with_table(text: str, table: str) -> str:
    if HEAD_START not in text or HEAD_END not in text:
        raise ValueError(f"README.md lacks the markers {HEAD_START!r} ... {HEAD_END!r}")
    head, rest = text.split(HEAD_START, 1)
    _, tail = rest.split(HEAD_END, 1)
    return f"{head}{HEAD_START}\n{table}\n{HEAD_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, write nothing")
    a = ap.parse_args(argv)
    figs = figures()
    pages = {
        BENCHMARKS: benchmarks_page(figs),
        README: readme_with_table(README.read_text(), headline_table(figs)),
    }
    stale = [p for p, text in pages.items() if not p.exists() or p.read_text() != text]
    if a.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} differs from its rendering: run python bench/report.py")
        return 1 if stale else 0
    for p in stale:
        p.write_text(pages[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU AdamW update throughput (params/s, state in memory): jaxoff.optim.fused_adamw vs the peers.

    python bench/cpu_adam.py --nparams 100M,500M --steps 7 --reps 3

Every implementation updates ONE flat float32 parameter of N elements with a fixed gradient
(AdamW, lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), the setting of
/work/shared/peers/bench_cpu_adam.py, and runs in its own subprocess (memory is returned
between runs):

  jaxoff_fused_adamw  jax.jit(fused_adamw(...).apply) with params and state donated (in place)
  jaxoff_optax_adamw  jax.jit(optax.adamw update + apply_updates), params and state donated
  peers               DeepSpeedCPUAdam and torch.optim.AdamW(fused=True) by default, run by the
                      peers' own script under /tmp/peers/venv (made by setup.sh)

Each rep runs every (size, implementation) once, in a rotated order, so jaxoff and the peers
are interleaved in time on this shared, noisy machine. A run warms up (--warmup steps, not
timed), then times --steps steps one by one and reports their median; the table shows, per
size and implementation, the median over reps of those medians (min-max in brackets), params/s,
effective GB/s (28 bytes per parameter: read p, g, m, v, write p, m, v), params/s relative to
the best peer (the ratio of the medians, and the median of the per-rep ratios) and the CPU
seconds per second that other processes used during the timed steps (> 0.2: disturbed). Runs
that would need more than --max-gib of memory are skipped (optax at 500M needs ~12 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the result writer
from _common.results import write_result  # noqa: E402

PEERS_DIR = "/work/shared/peers"
PEER_SCRIPT = os.path.join(PEERS_DIR, "bench_cpu_adam.py")
PEER_PYTHON = "/tmp/peers/venv/bin/python"
OURS = ("jaxoff_fused_adamw", "jaxoff_optax_adamw")
LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 0.01
# peak resident bytes per parameter, roughly (p, g, m, v = 16 B, plus temporaries)
MEM_PER_PARAM = {
    "jaxoff_fused_adamw": 16.5,
    "jaxoff_optax_adamw": 26,
    "ds_cpu_adam": 17,
    "torch_adamw_fused": 17,
    "torch_adamw_foreach": 25,
    "torch_adamw_forloop": 25,
    "jax_optax_adamw": 26,
}


def cpu_busy_seconds() -> float | None:
    """Machine-wide busy CPU seconds (all cores) from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        return (sum(vals[:8]) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# ----------------------------------------------------------------------------- worker


def worker(impl: str, n: int, warmup: int, steps: int, threads: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    from jaxoff.optim import fused_adamw

    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = jax.jit(lambda k: jax.random.normal(k, (n,), jnp.float32))(k1)
    grads = jax.jit(lambda k: jax.random.normal(k, (n,), jnp.float32) * 1e-2)(k2)
    if impl == "jaxoff_fused_adamw":
        tx = fused_adamw(LR, B1, B2, EPS, weight_decay=WD, threads=threads)
        # Donated inputs in the order of the outputs: XLA then aliases p, mu, nu in place.
        update = jax.jit(lambda p, s, g: tx.apply(g, s, p), donate_argnums=(0, 1))
    elif impl == "jaxoff_optax_adamw":
        tx = optax.adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD)

        def plain(p, s, g):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        update = jax.jit(plain, donate_argnums=(0, 1))
    else:
        raise ValueError(impl)
    box = [params, tx.init(params)]

    def step():
        box[0], box[1] = update(box[0], box[1], grads)
        jax.block_until_ready(box)

    for _ in range(warmup):
        step()
    times = []
    c0, p0, w0 = cpu_busy_seconds(), time.process_time(), time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - w0
    c1, p1 = cpu_busy_seconds(), time.process_time()
    assert bool(jnp.isfinite(box[0][:1000]).all())
    foreign = None if c0 is None or c1 is None else max(0.0, (c1 - c0) - (p1 - p0))
    med = statistics.median(times)
    return {
        "bench": "cpu_adam",
        "impl": impl,
        "nparams": n,
        "seconds_per_step": med,
        "seconds_all": [round(t, 5) for t in times],
        "GBps_effective": round(28 * n / med / 1e9, 2),
        "own_cpu_cores": round((p1 - p0) / wall, 2),
        "foreign_cpu_per_s": None if foreign is None else round(foreign / wall, 2),
    }


# ----------------------------------------------------------------------------- driver


def parse_n(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def wait_quiet(max_wait: float, window: float = 0.5, cores: float = 0.5) -> bool:
    """Waits up to ``max_wait`` s for a ``window`` in which other processes use < ``cores``."""
    deadline = time.monotonic() + max_wait
    while True:
        c0 = cpu_busy_seconds()
        time.sleep(window)
        c1 = cpu_busy_seconds()
        if c0 is None or c1 is None or (c1 - c0) / window < cores:
            return True
        if time.monotonic() > deadline:
            return False


def run_ours(impl: str, n: int, a) -> dict:
    if a.quiet_wait > 0:
        wait_quiet(a.quiet_wait)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        impl,
        str(n),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--threads",
        str(a.threads),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        return {"impl": impl, "nparams": n, "error": f"exit {r.returncode}: {tail}"}
    return json.loads(lines[-1])


def run_peers(impls: list[str], n: int, a) -> list[dict]:
    cmd = [
        a.peer_python,
        PEER_SCRIPT,
        "--nparams",
        str(n),
        "--impls",
        ",".join(impls),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--quiet-wait",
        str(a.quiet_wait),
        "--budget",
        "100000",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    out = []
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if "impl" in d:
                out.append(d)
    if not out:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        out = [{"impl": i, "nparams": n, "error": f"exit {r.returncode}: {tail}"} for i in impls]
    return out


def fits(impl: str, n: int, max_gib: float) -> bool:
    return MEM_PER_PARAM.get(impl, 26) * n <= max_gib * 2**30


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nparams", default="100M,500M", help="comma list; M = 1e6")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ours", default=",".join(OURS))
    ap.add_argument(
        "--peers",
        default="ds_cpu_adam,torch_adamw_fused",
        help="impls of the peers' script (none: '')",
    )
    ap.add_argument("--threads", type=int, default=0, help="fused_adamw threads (0: all cores)")
    ap.add_argument(
        "--max-gib",
        type=float,
        default=8.5,
        help="skip a run whose estimated peak memory exceeds this",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=3.0,
        help="before each run wait up to this long for idle CPUs (the peers' "
        "script gets the same value)",
    )
    ap.add_argument("--peer-python", default=PEER_PYTHON)
    ap.add_argument("--json", help="also append every result as a JSON line to this file")
    ap.add_argument(
        "--result", help="write the summary in the result schema here (bench/_common/results.py)"
    )
    ap.add_argument("--worker", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(
            json.dumps(worker(a.worker[0], int(a.worker[1]), a.warmup, a.steps, a.threads)),
            flush=True,
        )
        return 0

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(132, Console().width))
    ns = [parse_n(s) for s in a.nparams.split(",") if s.strip()]
    ours = [s for s in a.ours.split(",") if s.strip()]
    peers = [s for s in a.peers.split(",") if s.strip()]
    if peers and not os.path.exists(a.peer_python):
        console.print(
            f"[red]{a.peer_python} not found: run `bash {PEERS_DIR}/setup.sh` "
            "(log /tmp/peers_setup.log), or pass --peers ''"
        )
        return 2
    results: dict[tuple[str, int], list[dict]] = {}
    skipped: list[str] = []
    jsonf = open(a.json, "a") if a.json else None  # noqa: SIM115
    t_start = time.monotonic()
    for rep in range(a.reps):
        for n in ns:
            groups = [[i] for i in ours if fits(i, n, a.max_gib)]
            peer_group = [i for i in peers if fits(i, n, a.max_gib)]
            if peer_group:
                groups.append(peer_group)
            if rep == 0:
                skipped += [
                    f"{i} @ {n / 1e6:g}M (needs ~{MEM_PER_PARAM.get(i, 26) * n / 2**30:.1f}"
                    f" GiB > --max-gib {a.max_gib})"
                    for i in ours + peers
                    if not fits(i, n, a.max_gib)
                ]
            k = rep % len(groups) if groups else 0
            for g in groups[k:] + groups[:k]:  # rotate: no implementation always goes first
                outs = run_ours(g[0], n, a) if g[0] in ours else None
                outs = [outs] if outs is not None else run_peers(g, n, a)
                for d in outs:
                    d["rep"] = rep
                    results.setdefault((d["impl"], n), []).append(d)
                    if jsonf:
                        jsonf.write(json.dumps(d) + "\n")
                        jsonf.flush()
                    what = (
                        f"{d['seconds_per_step'] * 1e3:8.1f} ms/step"
                        if "seconds_per_step" in d
                        else d.get("error", d.get("skipped"))
                    )
                    console.print(
                        f"[dim]rep {rep} {n / 1e6:>5g}M {d['impl']:<20} {what}"
                        f"  foreign cpu/s {d.get('foreign_cpu_per_s')}[/dim]"
                    )
    if jsonf:
        jsonf.close()

    table = Table(
        title=f"CPU AdamW update, fp32, state in RAM: median of {a.reps} reps x "
        f"{a.steps} steps ({time.monotonic() - t_start:.0f} s)"
    )
    for col in (
        "N",
        "impl",
        "s/step [min-max]",
        "Mparams/s",
        "GB/s eff.",
        "vs best peer",
        "per-rep ratio",
        "foreign cpu/s",
    ):
        table.add_column(col, justify="left" if col == "impl" else "right")
    summary = []
    for n in ns:
        med = {}
        for impl in ours + peers:
            rs = [d for d in results.get((impl, n), []) if "seconds_per_step" in d]
            if rs:
                med[impl] = [d["seconds_per_step"] for d in rs]
        peer_meds = {i: statistics.median(t) for i, t in med.items() if i in peers}
        best = min(peer_meds, key=peer_meds.get) if peer_meds else None
        for impl, ts in med.items():
            m = statistics.median(ts)
            ratio = per_rep = ""
            if best:
                ratio = f"{peer_meds[best] / m:.2f}x"
                pairs = []
                for d in results[(impl, n)]:
                    bs = [
                        b["seconds_per_step"]
                        for b in results.get((best, n), [])
                        if b["rep"] == d["rep"] and "seconds_per_step" in b
                    ]
                    if bs and "seconds_per_step" in d:
                        pairs.append(bs[0] / d["seconds_per_step"])
                per_rep = f"{statistics.median(pairs):.2f}x" if pairs else ""
            foreign = [
                d["foreign_cpu_per_s"]
                for d in results[(impl, n)]
                if d.get("foreign_cpu_per_s") is not None
            ]
            table.add_row(
                f"{n / 1e6:g}M",
                impl + (" (best peer)" if impl == best else ""),
                f"{m:.4f} [{min(ts):.4f}-{max(ts):.4f}]",
                f"{n / m / 1e6:,.0f}",
                f"{28 * n / m / 1e9:.1f}",
                ratio,
                per_rep,
                f"{statistics.median(foreign):.2f}" if foreign else "",
            )
            summary.append(
                {
                    "nparams": n,
                    "impl": impl,
                    "median_s": m,
                    "params_per_s": n / m,
                    "best_peer": best,
                    "ratio_vs_best_peer": (peer_meds[best] / m) if best else None,
                }
            )
        table.add_section()
    console.print(table)
    for s in skipped:
        console.print(f"[yellow]skipped: {s}")
    for impl in ours + peers:
        for n in ns:
            for d in results.get((impl, n), []):
                if "error" in d:
                    console.print(f"[red]{impl} @ {n}: {d['error']}")
    print(json.dumps({"bench": "cpu_adam", "summary": summary}))
    if a.result:
        records = [d for v in results.values() for d in v]
        out = write_result(
            "cpu_adam", args=vars(a), summary=summary, records=records, path=a.result
        )
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

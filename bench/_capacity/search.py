"""The bracketing search on layers: the largest size that fits, and the next one up failing.

It knows nothing of what a probe runs: ``run(layers)`` returns a record with ``fits`` (and
``num_layers``), so the logic is tested with fake probes.
"""

from __future__ import annotations

from collections.abc import Callable


def search(
    run: Callable[[int], dict],
    start_layers: int,
    *,
    max_probes: int,
    grow: float,
    cap_layers: int | None = None,
) -> list[dict]:
    """Records of the sizes probed, by layers: walk from ``start_layers`` by ``grow`` until
    a fitting and a failing size are known, then bisect between them. ``cap_layers``: the
    most layers the disk holds; ``cap_layers + 1`` is probed first (its record says
    "disk-bound") and the walk never goes above the cap. Each size is probed once; at most
    ``max_probes`` probes are spent on the walk and the bisection."""
    records: dict[int, dict] = {}

    def fits(layers: int) -> bool:
        if layers not in records:
            records[layers] = run(layers)
        return records[layers]["fits"]

    lo, hi = 0, None  # largest known fit, smallest known failure (layers)
    layers = start_layers
    if cap_layers is not None:
        hi = cap_layers + 1
        if fits(hi):  # free disk changed under us; fall back to walking
            lo, hi = hi, None
            layers = max(layers, lo + 1)
        else:
            layers = min(layers, hi - 1)
    probes = 0
    while probes < max_probes:
        if hi is not None and hi - lo <= 1:
            break
        if lo and hi is not None:
            layers = (lo + hi) // 2
        probes += 1
        if fits(layers):
            lo = layers
            nxt = max(layers + 1, int(layers * grow))
            layers = nxt if hi is None else min(nxt, hi - 1)
        else:
            hi = layers
            if layers == 1:
                break
            layers = max(1, min(layers - 1, int(layers / grow))) if not lo else layers
    return [records[n] for n in sorted(records)]

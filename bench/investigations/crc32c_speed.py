"""Throughput of jaxoff's crc32c (the engine's checksum of every chunk it reads or writes)
against the ``crc32c`` package (google's crc32c bindings, the checksum jaxoff's Python side
uses), on the same bytes in the same run: buffers that fit the cache and one that does not.
jaxoff's side is called as a user calls it, ``jaxoff.aio.crc32c`` (the C++ checksum behind a
zero-copy view of the bytes).

    python bench/investigations/crc32c_speed.py --json bench/results/crc32c_speed/NAME.json

Prints GB/s (best of ``--reps`` timings of ``--loops`` calls each) and jaxoff / crc32c.
"""

import argparse
import sys
import time
from pathlib import Path

import crc32c
import numpy as np

from jaxoff.aio import crc32c as jaxoff_crc32c

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the result writer
from _common.results import write_result  # noqa: E402


def speed(fn, data: bytes, loops: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(loops):
            fn(data)
        best = min(best, (time.perf_counter() - t) / loops)
    return len(data) / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-kib", type=int, nargs="+", default=[64, 1024, 65536])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for kib in a.sizes_kib:
        data = rng.integers(0, 256, kib << 10, dtype=np.uint8).tobytes()
        if jaxoff_crc32c(data) != crc32c.crc32c(data):
            sys.exit(f"jaxoff's crc32c differs from crc32c's on {kib} KiB")
        loops = max(3, (256 << 20) // len(data))
        ours = speed(jaxoff_crc32c, data, loops, a.reps)
        theirs = speed(crc32c.crc32c, data, loops, a.reps)
        ratio = ours / theirs
        rows.append({"kib": kib, "jaxoff_gb_s": ours, "crc32c_gb_s": theirs, "ratio": ratio})
        print(f"{kib:>7} KiB: jaxoff {ours:6.2f} GB/s  crc32c {theirs:6.2f} GB/s  {ratio:.2f}x")
    if a.json:
        out = write_result("crc32c_speed", args=vars(a), records=rows, path=a.json)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Does paging hide behind compute? A jitted lax.scan reads chunk i+1 while computing on chunk i.

Prints the compute-only, I/O-only and pipelined times (medians of --reps), the ratio
pipelined / max(compute, io) (1.0 = perfect overlap) and the fraction of the I/O hidden:
(compute + io - pipelined) / min(compute, io). All are measured in the same run, for two
pipelines: `page_in` (an async FFI call XLA must schedule around) and `prefetch`
(split-phase: the body starts the read of chunk i+1 with `page_prefetch`, then `page_take`s
chunk i, prefetched one iteration earlier, and computes on it: the engine's threads do the I/O
whatever XLA's executor does).

    python bench/investigations/overlap.py  # 8 chunks of 32 MiB, O_DIRECT, auto backend
    python bench/investigations/overlap.py --chunk-mib 64 --matmuls 4 --backend posix

XLA's CPU runtime only overlaps an async FFI call with other work when the scan body has more
than 8 thunks (else its ThunkExecutor runs the body in order and awaits page_in's future at
once). Beware: with jaxlib 0.10.2's default YNN fusion the whole `--matmuls` chain becomes ONE
thunk, so this body has 7 thunks and runs sequentially (see it with TF_CPP_MIN_LOG_LEVEL=0
TF_CPP_VMODULE=thunk_executor=2: "7 thunks ... is_sequential=true"). XLA_FLAGS=
--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT gives 28 thunks,
is_sequential=false. The prefetch pipeline does not depend on either.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxoff.aio import (
    Engine,
    EngineConfig,
    crc32c,
    encode_offsets,
    new_token,
    page_in,
    page_prefetch,
    page_take,
    register_file_table,
    unregister_file_table,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk-mib", type=int, default=32, help="chunk size in MiB (float32)")
    p.add_argument("--chunks", type=int, default=8, help="chunks per scan")
    p.add_argument("--matmuls", type=int, default=6, help="matmul+tanh pairs per chunk")
    p.add_argument("--width", type=int, default=256, help="matmul width (chunk is (-1, width))")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--backend", default="auto", choices=["auto", "io_uring", "posix"])
    p.add_argument("--block-mib", type=int, default=4)
    p.add_argument("--queue-depth", type=int, default=8)
    p.add_argument("--no-verify", action="store_true", help="skip the crc32c check on read")
    p.add_argument("--no-direct", action="store_true", help="buffered I/O instead of O_DIRECT")
    p.add_argument("--dir", default=None, help="where the page file goes (default: a temp dir)")
    return p.parse_args(argv)


def timed(fns, reps):
    """Median wall and CPU seconds of each of `fns`, repetitions interleaved (order rotated
    every repetition) so that a burst of foreign load (the machine is shared) costs one sample
    of every variant rather than all of one."""
    for fn in fns:
        jax.block_until_ready(fn())  # compile + warm up
    ts = [[] for _ in fns]
    cs = [[] for _ in fns]
    for rep in range(reps):
        k = rep % len(fns)
        for i in list(range(k, len(fns))) + list(range(k)):
            c0, t0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(fns[i]())
            ts[i].append(time.perf_counter() - t0)
            cs[i].append(time.process_time() - c0)
    return [statistics.median(t) for t in ts], [statistics.median(c) for c in cs]


def main(argv=None):
    a = parse_args(argv)
    elems = (a.chunk_mib << 20) // 4
    rows = elems // a.width
    shape = (rows, a.width)
    chunk_bytes = rows * a.width * 4
    rng = np.random.default_rng(0)
    data = rng.standard_normal((a.chunks, *shape), dtype=np.float32) * 0.1
    ws = jnp.asarray(
        rng.standard_normal((a.matmuls, a.width, a.width), dtype=np.float32) / np.sqrt(a.width)
    )

    root = a.dir or tempfile.mkdtemp(prefix="jaxoff_overlap_")
    path = os.path.join(root, "overlap.page")
    cfg = EngineConfig(
        block_size=a.block_mib << 20,
        queue_depth=a.queue_depth,
        # Also the split-phase staging: two prefetched chunks at the take (i and i+1).
        pool_bytes=max((a.block_mib << 20) * a.queue_depth, 2 * chunk_bytes),
        o_direct=not a.no_direct,
        backend=a.backend,
    )
    eng = Engine(cfg)
    for i in range(a.chunks):
        eng.write(path, i * chunk_bytes, data[i]).result()
    crcs = jnp.asarray(np.array([crc32c(d) for d in data], np.uint32))
    offs = jnp.asarray(encode_offsets([i * chunk_bytes for i in range(a.chunks)]))
    table = "overlap_bench"
    register_file_table(table, [path], config=cfg)

    def compute(x):
        h = x
        for j in range(a.matmuls):
            h = jnp.tanh(h @ ws[j])
        return jnp.sum(h)

    def read(off, crc, tok):
        return page_in(
            table, 0, off, crc, tok, shape=shape, dtype=jnp.float32, verify=not a.no_verify
        )

    @jax.jit
    def compute_only(xs):
        return jax.lax.scan(lambda c, x: (c, compute(x)), 0, xs)[1]

    @jax.jit
    def io_only(crcs, offs):
        def body(tok, xs):
            y, tok = read(xs[1], xs[0], tok)
            return tok, y[0, 0]

        return jax.lax.scan(body, new_token(), (crcs, offs))[1]

    @jax.jit
    def pipelined(crcs, offs):
        x0, tok = read(offs[0], crcs[0], new_token())

        def body(carry, xs):
            x, tok = carry
            x_next, tok = read(xs[1], xs[0], tok)  # chunk i+1: no data dependence on compute
            return (x_next, tok), compute(x)  # ... so XLA runs both at once

        (x_last, _), ys = jax.lax.scan(body, (x0, tok), (crcs[1:], offs[1:]))
        return jnp.concatenate([ys, compute(x_last)[None]])

    def prefetch(off, crc, tok):
        return page_prefetch(
            table, 0, off, crc, tok, shape=shape, dtype=jnp.float32, verify=not a.no_verify
        )

    def take(ticket, tok):
        return page_take(table, ticket, tok, shape=shape, dtype=jnp.float32)

    @jax.jit
    def prefetched(crcs, offs):
        def body(ticket, xs):  # ticket: chunk i, prefetched one iteration earlier
            # Chunk i+1 starts now; the engine's threads read it while chunk i is computed on.
            ticket_next = prefetch(xs[1], xs[0], ticket)
            # The new ticket is take's token: a data dependency, so XLA's schedule (whatever
            # its executor) is prefetch(i+1) -> take(i) -> compute(i).
            x, _ = take(ticket, ticket_next)
            return ticket_next, compute(x)

        first = prefetch(offs[0], crcs[0], new_token())
        last, ys = jax.lax.scan(body, first, (crcs[1:], offs[1:]))
        return jnp.concatenate([ys, compute(take(last, new_token())[0])[None]])

    @jax.jit
    def io_only_prefetch(crcs, offs):  # the same reads and copies, no compute
        def body(ticket, xs):
            ticket_next = prefetch(xs[1], xs[0], ticket)
            x, _ = take(ticket, ticket_next)
            return ticket_next, x[0, 0]

        first = prefetch(offs[0], crcs[0], new_token())
        last, ys = jax.lax.scan(body, first, (crcs[1:], offs[1:]))
        return jnp.concatenate([ys, take(last, new_token())[0][0, :1]])

    xs = jnp.asarray(data)
    ref = np.asarray(compute_only(xs))
    np.testing.assert_array_equal(np.asarray(pipelined(crcs, offs)), ref)  # same bytes in,
    np.testing.assert_array_equal(np.asarray(prefetched(crcs, offs)), ref)  # same numbers out

    (t_c, t_io, t_iof, t_p, t_f), (c_c, c_io, c_iof, c_p, c_f) = timed(
        [
            lambda: compute_only(xs),
            lambda: io_only(crcs, offs),
            lambda: io_only_prefetch(crcs, offs),
            lambda: pipelined(crcs, offs),
            lambda: prefetched(crcs, offs),
        ],
        a.reps,
    )
    unregister_file_table(table)
    total = a.chunks * chunk_bytes

    def hidden_of(t, io):
        return (t_c + io - t) / min(t_c, io)

    # Each pipeline against the I/O-only time of its own calls.
    hidden, hidden_f = hidden_of(t_p, t_io), hidden_of(t_f, t_iof)
    print(
        f"backend={eng.backend} o_direct={cfg.o_direct} chunks={a.chunks} x "
        f"{chunk_bytes / 2**20:.0f} MiB, {a.matmuls} matmuls of width {a.width}, "
        f"block {a.block_mib} MiB, qd {a.queue_depth}, verify={not a.no_verify}, "
        f"median of {a.reps}"
    )
    print(f"  compute only : {t_c * 1e3:8.1f} ms   (CPU {c_c * 1e3:7.1f} ms)")
    print(
        f"  I/O only     : {t_io * 1e3:8.1f} ms   (CPU {c_io * 1e3:7.1f} ms)  "
        f"({total / t_io / 1e9:.2f} GB/s)  page_in"
    )
    print(
        f"  I/O only     : {t_iof * 1e3:8.1f} ms   (CPU {c_iof * 1e3:7.1f} ms)  "
        f"({total / t_iof / 1e9:.2f} GB/s)  prefetch/take"
    )
    print(f"  sequential   : {(t_c + t_io) * 1e3:8.1f} ms   (compute + I/O, page_in)")
    print(f"  sequential   : {(t_c + t_iof) * 1e3:8.1f} ms   (compute + I/O, prefetch/take)")
    print(f"  pipelined    : {t_p * 1e3:8.1f} ms   (CPU {c_p * 1e3:7.1f} ms)  page_in in the body")
    print(f"  prefetched   : {t_f * 1e3:8.1f} ms   (CPU {c_f * 1e3:7.1f} ms)  prefetch/take")
    for label, t, io, h in (("page_in ", t_p, t_io, hidden), ("prefetch", t_f, t_iof, hidden_f)):
        which = "compute > io" if t_c > io else "io > compute: hides compute instead"
        print(
            f"  {label}: pipelined / max(compute, io) = {t / max(t_c, io):.3f}   "
            f"hidden {100 * h:3.0f}%  ({which})"
        )
    if not a.dir:
        os.remove(path)
        os.rmdir(root)
    return dict(
        compute=t_c,
        io=t_io,
        pipelined=t_p,
        hidden=hidden,
        io_prefetch=t_iof,
        prefetched=t_f,
        hidden_prefetch=hidden_f,
    )


if __name__ == "__main__":
    main()

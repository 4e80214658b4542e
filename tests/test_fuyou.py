"""Fuyou (update inside the backward scan): bitwise equal to the sequential paged step."""

import dataclasses
import re

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxoff._errors import ConfigError
from jaxoff.aio import PageStoreError
from jaxoff.models import load_model
from jaxoff.nn import with_stack
from jaxoff.optim import paged
from jaxoff.plan._jaxpr import scan_counts
from jaxoff.step import TrainState, make_train_step
from jaxoff.strategies import fuyou as fuyou_module
from jaxoff.strategies.fuyou import (
    blocks_from_bits,
    blocks_to_bits,
    fuyou_init,
    fuyou_params,
    fuyou_resident,
    make_fuyou_step,
)
from jaxoff.strategies.fuyou._layout import _layout

LR = optax.warmup_cosine_decay_schedule(0.0, 3e-2, 3, 30, end_value=3e-3)
CHUNK = 1 << 14


def inner():
    return optax.adamw(LR, b1=0.9, b2=0.95, weight_decay=0.1)


def config(dtype, model="tiny"):
    # fuyou recomputes each block in backward: the sequential reference does the same
    # arithmetic under nothing_saveable (with no remat XLA fuses the backward differently)
    cfg = dataclasses.replace(load_model(model), param_dtype=dtype)
    return with_stack(cfg, policy="nothing_saveable")


def batch(t):
    x = jax.random.randint(jax.random.key(t), (4, 33), 0, 256)
    return x[:, :-1], x[:, 1:]


def deep_config(dtype, layers):
    """``config(dtype)`` widened to 256 with ``layers`` layers, for the in-place tests."""
    return dataclasses.replace(
        config(dtype), num_layers=layers, d_model=256, num_heads=4, d_ff=1024
    )


def temp_bytes(step, state):
    """The compiled step's temporaries, in bytes."""
    return step.lower(state, *batch(0)).compile().memory_analysis().temp_size_in_bytes


def fuyou_run(cfg, root, read_ahead_bytes=None):
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    tx = paged(inner(), root, chunk_bytes=CHUNK)
    opt = fuyou_init(cfg, tx, params, read_ahead_bytes=read_ahead_bytes)
    state = TrainState(jnp.zeros((), jnp.int32), params, opt)
    return tx, state, jax.jit(make_fuyou_step(graphdef, cfg, tx), donate_argnums=0)


def seq_run(cfg, root):
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    tx = paged(inner(), root, chunk_bytes=CHUNK)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    return tx, state, jax.jit(make_train_step(graphdef, tx), donate_argnums=0)


@pytest.mark.parametrize(
    "model, dtype, read_ahead",
    [
        ("tiny", "float32", None),
        ("tiny", "bfloat16", None),
        ("llama-tiny", "float32", None),
        # a layer's state (1.6 MB) larger than the pager's read-ahead: its update waits
        # for some of its reads
        ("tiny", "float32", 600 << 10),
    ],
)
def test_bitwise_equal_to_sequential_paged(tmp_path, model, dtype, read_ahead):
    cfg = config(dtype, model)
    tx1, s1, step1 = seq_run(cfg, tmp_path / "seq")
    tx2, s2, step2 = fuyou_run(cfg, tmp_path / "fuyou", read_ahead)
    lay = _layout(tx2, s2.params)
    want = fuyou_module.default_read_ahead_bytes() if read_ahead is None else read_ahead
    assert lay.read_ahead_bytes == want
    assert lay.txn.config.arena_slots * lay.txn.config.slot_bytes >= want
    for t in range(10):
        s1, m1 = step1(s1, *batch(t))
        s2, m2 = step2(s2, *batch(t))
        assert float(m1["loss"]) == float(m2["loss"])
        # the sequential metric is optax.global_norm in the gradients' dtype (bf16: coarse);
        # fuyou sums squares in float32 per layer: a metric, not part of the update
        rtol = 1e-5 if dtype == "float32" else 2e-2
        np.testing.assert_allclose(float(m1["grad_norm"]), float(m2["grad_norm"]), rtol=rtol)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert int(s1.opt_state.version) == int(s2.opt_state.version) == 11
    assert step2._cache_size() == 1
    plan = tx1.pager.plan(s1.params)
    for e in plan.entries:
        want = tx1.store.read(e.name)
        if lay.blocks[e.leaf]:
            got = np.stack([tx2.store.read(f"{e.name}@{j}") for j in range(lay.num_layers)])
        else:
            got = tx2.store.read(e.name)
        assert want.tobytes() == got.tobytes(), e.name
    tx1.close()
    tx2.close()


def _loops_with_io_and_dots(hlo: str) -> int:
    """While loops whose body (with what it calls) holds both page I/O and a dot."""
    comps = dict(re.findall(r"^(?:ENTRY )?%?([\w.\-]+) .*?\{\n(.*?)\n\}", hlo, re.S | re.M))

    def closure(name, seen):
        if name in seen or name not in comps:
            return ""
        seen.add(name)
        body = comps[name]
        called = re.findall(
            r"(?:to_apply|body|condition|calls|branch_computations)=\{?%?"
            r"([\w.\-]+)",
            body,
        )
        return body + "".join(closure(c, seen) for c in called)

    bodies = re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo)
    n = 0
    for b in set(bodies):
        text = closure(b, set())
        if "jaxoff_pager_take" in text and "jaxoff_pager_out" in text and " dot(" in text:
            n += 1
    return n


def test_page_io_inside_backward_loop(tmp_path):
    cfg = config("float32")
    tx2, s2, step2 = fuyou_run(cfg, tmp_path / "fuyou")
    hlo = step2.lower(s2, *batch(0)).compile().as_text()
    assert _loops_with_io_and_dots(hlo) >= 1
    tx1, s1, step1 = seq_run(cfg, tmp_path / "seq")
    assert _loops_with_io_and_dots(step1.lower(s1, *batch(0)).compile().as_text()) == 0
    tx1.close()
    tx2.close()


_READS = ("jaxoff_pager_take",)


def _subjaxprs(eqn):
    for v in eqn.params.values():
        for x in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(x, jex_core.ClosedJaxpr):
                yield x.jaxpr
            elif isinstance(x, jex_core.Jaxpr):
                yield x


def _contains(eqn, pred) -> bool:
    return pred(eqn) or any(_contains(e, pred) for j in _subjaxprs(eqn) for e in j.eqns)


def _is_read(eqn) -> bool:
    return eqn.primitive.name == "ffi_call" and eqn.params.get("target_name") in _READS


def _is_dot(eqn) -> bool:
    return eqn.primitive.name == "dot_general"


def _paths(jaxpr, source, sink) -> list[str]:
    """Equations of ``jaxpr`` holding a ``sink`` op whose inputs depend on a ``source`` op
    of the same jaxpr (an equation holding both counts as both)."""
    tainted, hits = set(), []
    for e in jaxpr.eqns:
        dirty = any(isinstance(v, jex_core.Var) and v in tainted for v in e.invars)
        if dirty and _contains(e, sink):
            hits.append(e.primitive.name)
        if dirty or _contains(e, source):
            tainted.update(e.outvars)
    return hits


def test_layer_update_is_independent_of_the_backward_it_runs_beside(tmp_path):
    """On the traced program: the backward scan's step pages a layer's optimizer state (page
    reads, update, writes) and differentiates a layer (matmuls) with no data path between
    the two in either direction, so the reads of layer j + 1 and the matmuls of layer j can
    run at once. (The former step, which updated layer j after its own backward, has paths
    from the matmuls to every page read.)"""
    cfg = config("float32")
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    tx = paged(inner(), tmp_path / "s", chunk_bytes=CHUNK)
    state = TrainState(jnp.zeros((), jnp.int32), params, fuyou_init(cfg, tx, params))
    closed = jax.make_jaxpr(make_fuyou_step(graphdef, cfg, tx))(state, *batch(0))
    loops = [
        e
        for e in closed.jaxpr.eqns
        if e.primitive.name == "scan" and _contains(e, _is_read) and _contains(e, _is_dot)
    ]
    assert len(loops) == 1
    body = loops[0].params["jaxpr"].jaxpr
    assert sum(_contains(e, _is_read) for e in body.eqns) >= 2  # the layer's leaves are paged
    assert sum(_contains(e, _is_dot) for e in body.eqns) >= 2  # the layer's matmuls
    assert _paths(body, _is_read, _is_dot) == []
    assert _paths(body, _is_dot, _is_read) == []
    tx.close()


def test_clipping_is_refused(tmp_path):
    cfg = config("float32")
    graphdef, _ = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    clip = optax.clip_by_global_norm(1.0)
    for tx in (
        paged(optax.chain(clip, inner()), tmp_path / "a", chunk_bytes=CHUNK),
        optax.chain(clip, paged(inner(), tmp_path / "b", chunk_bytes=CHUNK)),
    ):
        msg = r"needs every gradient.*`clip_norm=0`.*zero_infinity \(update after backward\)"
        with pytest.raises(ConfigError, match=msg):
            make_fuyou_step(graphdef, cfg, tx)


def test_blocks_as_bits_is_bitwise_and_updates_the_blocks_in_place(tmp_path):
    """Given the blocks' bits, the step updates them in place: its temporaries do not grow
    with the model's depth. Same arithmetic as given floats."""

    def bits_setup(layers, root):
        cfg = deep_config("bfloat16", layers)
        graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
        tx = paged(inner(), root, chunk_bytes=CHUNK, slots=1)
        opt = fuyou_init(cfg, tx, params)
        blocks_bytes = sum(x.nbytes for x in jax.tree.leaves(params["blocks"]))
        bits = blocks_to_bits(params)
        assert {x.dtype for x in jax.tree.leaves(bits["blocks"])} == {np.dtype(np.uint16)}
        state = TrainState(jnp.zeros((), jnp.int32), bits, opt)
        step = jax.jit(make_fuyou_step(graphdef, cfg, tx, blocks_as_bits=True), donate_argnums=0)
        return cfg, tx, state, step, temp_bytes(step, state), blocks_bytes

    _, tx4, _, _, temp4, bytes4 = bits_setup(4, tmp_path / "bits4")
    tx4.close()
    cfg, tx2, s2, step2, temp8, bytes8 = bits_setup(8, tmp_path / "bits8")
    # What grows with the depth is activations, not blocks: each layer's input ([B, T, D]
    # in the compute dtype), stacked by the forward scan, and the backward scan's input,
    # that stack less the top layer; the compiled buffers of both versions hold no other
    # temporary with a layer axis. Their sum bounds the growth: jax 0.10.2 places the
    # same temporaries more tightly (+547,264 B from 4 to 8 layers) than 0.12 (+761,600 B),
    # so a share of the blocks (10 %: 631,808 B) was a bound on XLA's packing, not on
    # the step.
    tokens = batch(0)[0].size
    layer_input = tokens * cfg.d_model * jnp.dtype(cfg.compute_dtype).itemsize
    activations = 2 * (8 - 4) * layer_input
    assert activations < (bytes8 - bytes4) / 2  # a copy of half the blocks exceeds it
    assert temp8 - temp4 <= activations, (temp4, temp8, bytes4, bytes8)
    tx1, s1, step1 = fuyou_run(cfg, tmp_path / "floats")
    for t in range(4):
        s1, m1 = step1(s1, *batch(t))
        s2, m2 = step2(s2, *batch(t))
        assert float(m1["loss"]) == float(m2["loss"])
    got = blocks_from_bits(s2.params, jnp.bfloat16)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(got), strict=True):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    tx1.close()
    tx2.close()


def test_float32_blocks_are_updated_in_place(tmp_path):
    """float32 blocks given as floats are sliced and updated as they are: the step's
    temporaries do not grow with the model's depth (converting them to bits, as 16-bit
    floats are, would copy the whole stack at each end of the step)."""

    def float_setup(layers, root):
        cfg = deep_config("float32", layers)
        graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
        tx = paged(inner(), root, chunk_bytes=CHUNK, slots=1)
        state = TrainState(jnp.zeros((), jnp.int32), params, fuyou_init(cfg, tx, params))
        step = jax.jit(make_fuyou_step(graphdef, cfg, tx), donate_argnums=0)
        temp = temp_bytes(step, state)
        tx.close()
        return temp, sum(x.nbytes for x in jax.tree.leaves(params["blocks"]))

    temp4, bytes4 = float_setup(4, tmp_path / "f4")
    temp8, bytes8 = float_setup(8, tmp_path / "f8")
    assert temp8 - temp4 < 0.1 * (bytes8 - bytes4), (temp4, temp8, bytes4, bytes8)


def test_builds_on_the_public_chunk_update_api_only():
    # Fuyou is a strategy: it composes jaxoff.optim's public API, never its private modules
    import ast
    import importlib
    import inspect
    import pkgutil

    from jaxoff.strategies import fuyou

    private = []
    names = [m.name for m in pkgutil.iter_modules(fuyou.__path__)]
    assert {"_layout", "_step", "_checkpoint", "_bits", "_params"} <= set(names)
    for module in [fuyou, *(importlib.import_module(f"{fuyou.__name__}.{n}") for n in names)]:
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxoff.optim"):
                if node.module.startswith("jaxoff.optim._"):
                    private.append(node.module)
                private += [a.name for a in node.names if a.name.startswith("_")]
    assert private == []


def test_read_ahead_bytes_is_checked_and_fixed_while_the_store_is_open(tmp_path):
    cfg = config("float32")
    _, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    tx = paged(inner(), tmp_path / "s", chunk_bytes=CHUNK)
    for bad in (-1, 1.5, True, "128"):
        with pytest.raises(ConfigError, match=r"read_ahead_bytes=.*an int >= 0"):
            fuyou_init(cfg, tx, params, read_ahead_bytes=bad)
    fuyou_init(cfg, tx, params, read_ahead_bytes=0)
    lay = _layout(tx, params)
    assert lay.read_ahead_bytes == 0
    assert lay.txn.config.arena_slots == 2  # 0: the pager's least, two chunks
    # the pager was sized for it: another budget for the open store is refused, and says how
    with pytest.raises(ConfigError, match=r"read_ahead_bytes=0.*tx.close\(\)"):
        fuyou_init(cfg, tx, params, read_ahead_bytes=1 << 20)
    assert _layout(tx, params, read_ahead_bytes=None) is lay  # None keeps it
    tx.close()
    # a new optimizer on the same store lays it out with the new budget
    tx = paged(inner(), tmp_path / "s", chunk_bytes=CHUNK)
    fuyou_init(cfg, tx, params, read_ahead_bytes=4 << 20)
    lay = _layout(tx, params)
    assert lay.read_ahead_bytes == 4 << 20
    assert lay.txn.config.arena_slots == (4 << 20) // lay.txn.config.slot_bytes
    tx.close()


# ------------------------------------------------------------ parameters paged too


class _Layers:
    """A stacked leaf made one layer at a time, as a model larger than memory is given to
    fuyou_init (the whole leaf never exists)."""

    def __init__(self, x):
        self._x, self.shape, self.dtype, self.asked = x, x.shape, x.dtype, []

    def __getitem__(self, j):
        self.asked.append(j)
        return self._x[j]


def paged_params_run(cfg, root, slots=2, lazy=False):
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    tx = paged(inner(), root, chunk_bytes=CHUNK, slots=slots)
    given = params
    if lazy:
        given = jax.tree_util.tree_map_with_path(
            lambda p, x: _Layers(x) if "blocks" in jax.tree_util.keystr(p) else x, params
        )
    opt = fuyou_init(cfg, tx, given, page_params=True)
    if lazy:
        layers = [x for x in jax.tree.leaves(given) if isinstance(x, _Layers)]
        assert layers and all(x.asked == list(range(cfg.num_layers)) for x in layers)
    state = TrainState(jnp.zeros((), jnp.int32), fuyou_resident(params), opt)
    step = jax.jit(make_fuyou_step(graphdef, cfg, tx, page_params=True), donate_argnums=0)
    return tx, state, step


@pytest.mark.parametrize(
    "model, dtype, slots",
    [("tiny", "float32", 2), ("tiny", "bfloat16", 1), ("llama-tiny", "float32", 2)],
)
def test_paged_parameters_bitwise_equal_to_resident_ones(tmp_path, model, dtype, slots):
    """With the block parameters in the page store (read a layer ahead in forward and in
    backward, written by each layer's update) the step is bitwise the step that keeps them
    in the state: losses, every parameter and every optimizer entry, over several steps."""
    cfg = config(dtype, model)
    tx1, s1, step1 = fuyou_run(cfg, tmp_path / "ram")
    tx2, s2, step2 = paged_params_run(cfg, tmp_path / "nvme", slots=slots, lazy=True)
    for t in range(4):
        s1, m1 = step1(s1, *batch(t))
        s2, m2 = step2(s2, *batch(t))
        assert float(m1["loss"]) == float(m2["loss"])
        # a metric outside the update: its per-layer sums of squares of two layers are
        # reduced outside the backward scan here, in other fusions (float32 rounding)
        np.testing.assert_allclose(float(m1["grad_norm"]), float(m2["grad_norm"]), rtol=1e-6)
    assert all(x.size == 0 for x in jax.tree.leaves(s2.params["blocks"]))
    got = fuyou_params(tx2, s2.params)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(got), strict=True):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    for name in tx1.store.entries:  # the optimizer state's (tx2's store has the blocks too)
        assert tx1.store.read(name).tobytes() == tx2.store.read(name).tobytes(), name
    assert step2._cache_size() == 1
    tx1.close()
    tx2.close()


def test_paged_parameters_are_read_beside_the_layer_that_computes(tmp_path):
    """On the traced program: in both layer scans (forward, and backward with the update)
    no take waits for a matmul of the scan's step (the pager reads the next layer while
    this one computes, and the update's takes run beside layer j's matmuls); the state's
    blocks are empty, and the compiled step's arguments and temporaries hold no stacked copy
    of them. After a step, the pager had several reads in flight at once: it read ahead."""
    cfg = config("float32")
    tx, state, step = paged_params_run(cfg, tmp_path / "s")
    graphdef = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)[0]
    closed = jax.make_jaxpr(make_fuyou_step(graphdef, cfg, tx, page_params=True))(state, *batch(0))
    loops = [
        e
        for e in closed.jaxpr.eqns
        if e.primitive.name == "scan" and _contains(e, _is_read) and _contains(e, _is_dot)
    ]
    assert len(loops) == 2  # forward and backward
    for loop in loops:
        body = loop.params["jaxpr"].jaxpr
        assert any(_contains(e, _is_read) for e in body.eqns)
        assert _paths(body, _is_dot, _is_read) == []
    mem = step.lower(state, *batch(0)).compile().memory_analysis()
    tx1, s1, step1 = fuyou_run(cfg, tmp_path / "ram")
    mem1 = step1.lower(s1, *batch(0)).compile().memory_analysis()
    blocks = sum(x.nbytes for x in jax.tree.leaves(s1.params["blocks"]))
    layer = blocks // cfg.num_layers
    assert mem.argument_size_in_bytes <= mem1.argument_size_in_bytes - blocks
    # no stacked copy of the paged blocks among the temporaries: twice the layers adds to the
    # paged step's temporaries what it adds to the resident step's (the activations a layer
    # keeps), less than one layer more, where a stacked copy would add num_layers layers. The
    # window itself (the layers taken around the one computing) depends on XLA's scheduler:
    # CHANGELOG.md records it.
    deep = dataclasses.replace(cfg, num_layers=2 * cfg.num_layers)
    tx2, s2, step2 = paged_params_run(deep, tmp_path / "s2")
    tx3, s3, step3 = fuyou_run(deep, tmp_path / "ram2")
    paged_growth = (
        step2.lower(s2, *batch(0)).compile().memory_analysis().temp_size_in_bytes
        - mem.temp_size_in_bytes
    )
    resident_growth = (
        step3.lower(s3, *batch(0)).compile().memory_analysis().temp_size_in_bytes
        - mem1.temp_size_in_bytes
    )
    assert paged_growth < resident_growth + layer, (paged_growth, resident_growth, layer)
    for t in (tx2, tx3):
        t.close()
    state, _ = step(state, *batch(0))
    jax.block_until_ready(state)
    assert _layout(tx, None, True).txn.stats()["max_reads_in_flight"] >= 2
    tx.close()
    tx1.close()


def _is_take(eqn) -> bool:
    return eqn.primitive.name == "ffi_call" and eqn.params.get("target_name") == "jaxoff_pager_take"


def _traced_setup(cfg, tmp_path, page_params):
    """``(graphdef, tx, state)`` of a Fuyou step on ``cfg``, its store in ``tmp_path``."""
    if page_params:
        tx, state, _ = paged_params_run(cfg, tmp_path / "s")
        return nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)[0], tx, state
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    tx = paged(inner(), tmp_path / "s", chunk_bytes=CHUNK)
    return graphdef, tx, TrainState(jnp.zeros((), jnp.int32), params, fuyou_init(cfg, tx, params))


@pytest.mark.parametrize("page_params", [False, True])
def test_layer_gradients_are_carried_flat(tmp_path, page_params):
    """The backward scan carries a layer's gradients to the next step's update flat (1-D), as
    the update reads them: carried in their own shapes, XLA's CPU layout assignment gave the
    2-D ones a column-major layout and transposed them into row-major order twice a layer
    (for the update and for the squares), several times the layer's matmul time at
    d = 2048. A kernel's layer shape is carried once at most (its new values, in the
    parameters' form), not twice."""
    cfg = config("float32")
    graphdef, tx, state = _traced_setup(cfg, tmp_path, page_params)
    lay = _layout(tx, None, page_params)
    bleaves = [leaf for leaf in lay.plan.leaves if lay.blocks[leaf.index]]
    step = make_fuyou_step(graphdef, cfg, tx, page_params=page_params)
    x, y = batch(0)  # 2 x 32: the carried input gradient, (2, 32, 128), is no kernel's shape
    closed = jax.make_jaxpr(step)(state, x[:2], y[:2])
    loops = [
        e
        for e in closed.jaxpr.eqns
        if e.primitive.name == "scan" and _contains(e, _is_dot) and _contains(e, _is_take)
    ]
    scan = loops[-1]  # the backward scan
    n_consts, n_carry, _ = scan_counts(scan)  # jax 0.12 names them otherwise
    carried = [v.aval.shape for v in scan.params["jaxpr"].jaxpr.invars[n_consts:][:n_carry]]
    flat = [(leaf.size // lay.num_layers,) for leaf in bleaves]
    for shape in flat:
        assert shape in carried, (shape, carried)
    kernels = [
        leaf for leaf in bleaves if len(leaf.shape) > 2 and leaf.size // lay.num_layers >= 4096
    ]
    assert len(kernels) >= 4  # q, k, v, out, up, down: layer slices of two or more dimensions
    shapes = [tuple(leaf.shape[1:]) for leaf in kernels]
    for shape in set(shapes):  # at most the layers' new parameters, written one step late
        assert carried.count(shape) <= shapes.count(shape), (shape, carried)
    tx.close()


def test_paged_parameters_refuse_bad_input_and_detect_corruption(tmp_path):
    cfg = config("float32")
    graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    tx, state, step = paged_params_run(cfg, tmp_path / "s")
    with pytest.raises(ConfigError, match=r"pass fuyou_resident\(params\)"):
        step(TrainState(state.step, params, state.opt_state), *batch(0))
    with pytest.raises(ConfigError, match="same page_params"):
        jax.jit(make_fuyou_step(graphdef, cfg, tx))(state, *batch(0))
    with pytest.raises(ConfigError, match="blocks_as_bits does not apply"):
        make_fuyou_step(graphdef, cfg, tx, page_params=True, blocks_as_bits=True)
    # a flipped byte in a layer's parameters on disk: the read fails naming the file
    lay = _layout(tx, None, True)
    store, name = tx.store, f"{lay.params[0].name}@1"
    table = store.chunk_table(store.active_slot)
    e = list(store.entries).index(name)
    row = int(np.flatnonzero((table["entry"] == e) & (table["chunk"] == 0))[0])
    path, off = store.file_table()[int(table["file_id"][row])], int(table["offset"][row])
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(Exception, match="checksum mismatch in " + re.escape(path)):
        jax.block_until_ready(step(state, *batch(0)))
    tx.close()
    with pytest.raises(PageStoreError, match=r"param\.blocks\..*in the store but not requested"):
        tx2 = paged(inner(), tmp_path / "s", chunk_bytes=CHUNK)
        fuyou_init(cfg, tx2, params)


def test_closing_the_optimizer_releases_the_store_files(tmp_path):
    """Fuyou's file table holds every page file of its store open (one per layer, entry and
    slot); tx.close() releases them, so a process that trains many models does not run out
    of file descriptors."""
    import gc
    import os

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    cfg = config("float32")
    before = open_fds()
    tx, state, step = paged_params_run(cfg, tmp_path / "s", slots=1)
    state, _ = step(state, *batch(0))
    jax.block_until_ready(state)
    assert open_fds() > before + 10  # the table's files are open while it is in use
    tx.close()
    del step, state  # the compiled step uses the table until it is freed
    gc.collect()
    assert open_fds() <= before + 2, "the store's page files are still open"


@pytest.mark.parametrize("page_params", [False, True])
def test_a_stale_state_is_refused_as_stale(tmp_path, page_params):
    """Fuyou's step begins with the same transaction as the plain paged step's: a state that
    does not describe the store's committed version (here: a copy kept from an earlier step,
    after the store moved on) is refused by the step before it reads, saying it is stale and
    what to do, and by fuyou_save (as ``test_dropin_flax``'s test of the plain step)."""
    from jaxoff.strategies.fuyou import fuyou_save

    cfg = config("float32")
    if page_params:
        tx, state, step = paged_params_run(cfg, tmp_path / "s")
    else:
        tx, state, step = fuyou_run(cfg, tmp_path / "s")
    state, _ = step(state, *batch(0))
    old = jax.device_get(state)  # a copy: the step donates its input
    state, _ = step(state, *batch(1))
    jax.block_until_ready(state)
    with pytest.raises(Exception, match="the state is stale.*fuyou_save / fuyou_restore"):
        jax.block_until_ready(step(jax.device_put(old), *batch(1)))
    with pytest.raises(PageStoreError, match="fuyou_save: .*the state is stale"):
        fuyou_save(tx, old.opt_state, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
    # the current state still steps and saves
    state, _ = step(state, *batch(2))
    assert fuyou_save(tx, state.opt_state, tmp_path / "ckpt") > 0
    tx.close()

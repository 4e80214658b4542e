"""The GPU pager's CUDA code read as text, plus its module on a machine without a GPU.

Rule I1 of the GPU design: no paging handler waits for the GPU. The CUDA handlers of the four
paging targets (``ffi/src/cuda_pager_handlers.cc``) and the bodies they share with the CPU's
(``ffi/src/pager_registry.cc``) must not synchronise a stream, an event or the device, nor copy
with a blocking ``cudaMemcpy``; they only enqueue work on XLA's stream through the pager. The
pager itself (``ffi/engine/gpu_pager.cc``) waits for its streams only in its destructor, and
the CUDA device interface only in ``SynchronizeStream``, which is for teardown.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HANDLERS = ROOT / "ffi" / "src" / "cuda_pager_handlers.cc"
CPU_HANDLERS = ROOT / "ffi" / "src" / "pager_handlers.cc"
REGISTRY = ROOT / "ffi" / "src" / "pager_registry.cc"
PAGER = ROOT / "ffi" / "engine" / "gpu_pager.cc"
CUDA_OPS = ROOT / "ffi" / "src" / "cuda_device_ops.cc"
TARGETS = ("jaxoff_pager_begin", "jaxoff_pager_take", "jaxoff_pager_out", "jaxoff_pager_commit")

# Calls that block the host until the device (or a stream) has caught up. `cudaMemcpy` and
# `cudaMemset` without Async are synchronous; a device-to-host copy into pageable memory is
# too, and any device-to-host copy in a handler would need a wait before its bytes are used.
SYNCING = re.compile(
    r"\b(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaStreamQuery"
    r"|cudaEventQuery|cudaMemcpy|cudaMemcpy2D|cudaMemset|cudaMemcpyDeviceToHost"
    r"|cudaStreamWaitValue32|cuStreamSynchronize|cuCtxSynchronize|SynchronizeStream"
    r"|EventDone)\b"
)
# A handler moves no bytes itself: copies go through the pager (its own streams, and one
# device-to-device copy on XLA's stream ordered by events).
HANDLER_ONLY = re.compile(r"\b(cudaMemcpyAsync|cudaMemcpyPeerAsync|cudaLaunchHostFunc)\b")


def code_of(text: str, strings: bool = False) -> str:
    """C++ without comments and, unless ``strings``, string literals (a message may name a
    call it does not make); line breaks are kept, so line numbers still match."""
    out = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    if not strings:
        out = re.sub(r'"(\\.|[^"\\\n])*"', '""', out)
    return re.sub(r"//[^\n]*", "", out)


def offending(text: str, pattern: re.Pattern = SYNCING) -> list[tuple[int, str]]:
    """(line, call) for each synchronising call in ``text``'s code."""
    return [
        (n, m.group(1))
        for n, line in enumerate(code_of(text).splitlines(), 1)
        for m in pattern.finditer(line)
    ]


def body_of(text: str, signature: str) -> tuple[int, int]:
    """The character span of the braces of the function whose definition starts with
    ``signature``."""
    start = text.index(signature)
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return i, j
    raise AssertionError(f"unbalanced braces after {signature}")


def test_the_checker_finds_synchronising_calls_and_ignores_comments_and_messages():
    assert offending("cudaStreamSynchronize(s);\n") == [(1, "cudaStreamSynchronize")]
    assert offending("x();\ncudaMemcpy(d, s, n, cudaMemcpyDeviceToHost);") == [
        (2, "cudaMemcpy"),
        (2, "cudaMemcpyDeviceToHost"),
    ]
    assert offending("cudaMemcpyAsync(d, s, n, k, st); cudaMemsetAsync(p, 0, n, st);") == []
    assert offending('// cudaDeviceSynchronize()\nf("cudaEventSynchronize failed");') == []
    assert offending("/* cudaStreamSynchronize\n */ ops->SynchronizeStream(h2d_);") == [
        (2, "SynchronizeStream")
    ]
    # The CUDA device interface's teardown drains a stream: the checker sees it in real code.
    assert "cudaStreamSynchronize" in {call for _, call in offending(CUDA_OPS.read_text())}


def test_gpu_pager_handlers_make_no_synchronising_call():
    text = HANDLERS.read_text()
    assert offending(text) == []
    assert offending(text, HANDLER_ONLY) == []
    code = code_of(text)
    # Every handler looks its pager up by the table attribute and runs the body it shares
    # with the CPU's (pager_registry.cc) on XLA's stream; the only CUDA it names is the type.
    for impl, call in (
        ("ffi::Error BeginImpl(", "return Begin(e, stream, version.untyped_data(), *token, plan)"),
        ("ffi::Error TakeImpl(", "return Take(**found, stream, *out, *token, plan, site)"),
        ("ffi::Error OutImpl(", "return Out(**found, stream, x, *token, plan, site)"),
        ("ffi::Error CommitImpl(", "return Commit(**found, stream, *token, plan)"),
    ):
        a, b = body_of(code, impl)
        assert "Lookup(" in code[a:b] and call in code[a:b], impl
    assert set(re.findall(r"\bcuda[A-Z]\w*", code)) <= {"cudaStream_t"}


def test_the_shared_handler_bodies_only_enqueue_through_the_pager():
    """pager_registry.cc: the bodies of both platforms' handlers. They call the pager and
    fill the token with an enqueued memset; no CUDA call, no synchronisation."""
    text = REGISTRY.read_text()
    assert offending(text) == []
    assert offending(text, HANDLER_ONLY) == []
    code = code_of(text)
    assert not re.findall(r"\bcuda[A-Z]\w*", code)
    for sig, call in (
        ("ffi::Error Begin(Entry& e", "e.pager->Begin(plan, stream, version)"),
        ("ffi::Error Take(Entry& e", "e.pager->Take("),
        ("ffi::Error Out(Entry& e", "e.pager->Put("),
        ("ffi::Error Commit(Entry& e", "e.pager->Commit()"),
    ):
        a, b = body_of(code, sig)
        assert call in code[a:b], sig
        assert offending(code[a:b]) == [], sig
    # the device calls a handler body makes: the token's memset on XLA's stream
    assert set(re.findall(r"\.ops->(\w+)\(", code)) == {"MemsetAsync"}


@pytest.mark.parametrize(
    "path, prefix", [(HANDLERS, "CudaPager"), (CPU_HANDLERS, "CpuPager")], ids=["cuda", "cpu"]
)
def test_pager_handlers_take_no_metadata_operands(path, prefix):
    """What a call pages comes from attributes (table, plan, site) and the host cursor: the
    only operands are the ordering token (page_begin's: the state's int32 store version) and
    the tensor page_out writes."""
    code = code_of(path.read_text(), strings=True)
    binds = dict(
        re.findall(
            rf"XLA_FFI_DEFINE_HANDLER_SYMBOL\(({prefix}\w+),\s*\w+,\s*(ffi::Ffi::Bind\(\).*?)\);",
            code,
            flags=re.S,
        )
    )
    assert sorted(binds) == sorted(f"{prefix}{n}" for n in ("Begin", "Take", "Out", "Commit"))
    args = {name: bind.count(".Arg<") for name, bind in binds.items()}
    assert args == {
        f"{prefix}Begin": 1,  # token: the store version
        f"{prefix}Take": 1,  # token
        f"{prefix}Out": 2,  # the tensor, token
        f"{prefix}Commit": 1,  # token
    }
    rets = {name: bind.count(".Ret<") for name, bind in binds.items()}
    assert rets == {f"{prefix}Begin": 1, f"{prefix}Take": 2, f"{prefix}Out": 1,
                    f"{prefix}Commit": 1}  # fmt: skip
    for name, bind in binds.items():
        attrs = re.findall(r'\.Attr<[^>]*>\("(\w+)"\)', bind)
        want = ["table", "plan", "site"] if ("Take" in name or "Out" in name) else ["table", "plan"]
        assert attrs == want, name
        assert ".Attrs<" not in bind and ".RemainingArgs" not in bind, name


def test_the_pager_waits_for_its_streams_only_in_its_destructor():
    text = PAGER.read_text()
    code = code_of(text)
    lo, hi = body_of(code, "GpuPager::~GpuPager()")
    calls = [m.start() for m in re.finditer(r"\bSynchronizeStream\(", code)]
    assert calls and all(lo < c < hi for c in calls), "SynchronizeStream outside ~GpuPager"
    assert "EventDone(" not in code  # no polling of device events either
    # Take, Put, Begin and Commit hold the pager's host lock only; the device calls they make
    # are enqueues.
    for sig in (
        "IoStatus GpuPager::Take(int site",
        "IoStatus GpuPager::Put(int site",
        "IoStatus GpuPager::Begin(int64_t plan_id",
        "IoStatus GpuPager::Begin(StepPlan plan)",
        "IoStatus GpuPager::Start(StepPlan* given",  # both Begins: the version check
        "IoStatus GpuPager::Commit()",
        "IoStatus GpuPager::Settle()",
    ):
        a, b = body_of(code, sig)
        assert offending(code[a:b]) == [], sig
        device_calls = set(re.findall(r"ops_->(\w+)\(", code[a:b]))
        assert device_calls <= {"StreamWaitEvent", "CopyAsync", "RecordEvent", "LaunchHostFunc"}


def test_the_cuda_device_interface_synchronises_only_in_synchronize_stream():
    code = code_of(CUDA_OPS.read_text())
    lo, hi = body_of(code, "void SynchronizeStream(Stream stream) override")
    # The copy-kind mapping, a non-blocking event query (EventDone, which the pager does not
    # call), and the teardown method: nothing else.
    assert [call for _, call in offending(code)] == [
        "cudaMemcpyDeviceToHost",
        "EventDone",
        "cudaEventQuery",
        "SynchronizeStream",
        "cudaStreamSynchronize",
    ]
    assert not re.search(r"\bcudaMemcpy\(", code)
    where = [m.start() for m in re.finditer(r"\bcudaStreamSynchronize\(", code)]
    assert len(where) == 1 and lo < where[0] < hi
    assert "cudaMemcpyAsync(" in code  # CopyAsync enqueues


# ---- The module, where this build has it (no GPU needed). ------------------------------


@pytest.fixture
def cuda_module():
    from jaxoff import _ffi
    from jaxoff.aio import _cuda

    mod = _cuda.module()
    if mod is None:
        pytest.skip(_cuda.missing_reason())
    mod.bind_host_api(_ffi.host_paging_api())
    return mod


def test_the_module_exports_the_four_pager_targets(cuda_module):
    regs = cuda_module.registrations()
    assert sorted(regs) == sorted(TARGETS)
    for name, capsule in regs.items():  # one stateless execute handler each
        assert type(capsule).__name__ == "PyCapsule", name
    # no XLA FFI state types (the pager lives in the module's registry, by table name) and
    # none of the earlier exports
    for gone in ("state_types", "pager_state_types", "pager_registrations", "pinned_bytes"):
        assert not hasattr(cuda_module, gone), gone
    for fn in ("pager_open", "pager_plan", "pager_settle", "pager_close", "pager_stats"):
        assert callable(getattr(cuda_module, fn)), fn


def test_a_pager_without_a_device_or_a_table_fails_with_one_line(cuda_module, tmp_path):
    from jaxoff.aio._ffi_calls import register_file_table, unregister_file_table

    with pytest.raises(ValueError, match="no pager is open for file table 'nope'") as e:
        cuda_module.pager_plan("nope", 1, 1, [], [(0, 0, 0, 4096)], [], [])
    assert "\n" not in str(e.value)
    assert cuda_module.pager_close("nope") is False
    name = "gpu_static_table"
    reg = register_file_table(name, [str(tmp_path / "f0")])
    try:
        if cuda_module.runtime()["device_count"] > 0:
            pytest.skip("a CUDA device is visible: the pager opens (tests/test_gpu.py)")
        with pytest.raises(RuntimeError) as e:
            cuda_module.pager_open(name, device=0, version=0, crcs=[], commit=lambda v, r: None,
                                   slot_bytes=1 << 20, arena_slots=2, ring_slots=2,
                                   write_slots=2)  # fmt: skip
        msg = str(e.value)
        assert "\n" not in msg
        assert f"cannot open the pager of file table '{name}'" in msg
        assert "cuda" in msg.lower()
        assert name not in cuda_module.pager_tables()
    finally:
        unregister_file_table(name, reg)


def test_pager_steps_lower_for_cuda_with_attributes_and_tokens_only():
    """Two steps on the pager's calls (``jaxoff.aio._pager.page_*``: a write step putting
    from one site inside a scan, a read step taking from one), exported for CUDA on this CPU
    machine: each call's operands are its token (and page_out's tensor), its metadata are
    attributes, and the steps hold no host callback."""
    import jax
    import jax.numpy as jnp
    from jax import export

    from jaxoff.aio._pager import page_begin, page_commit, page_out, page_take

    n, elems = 3, 256

    def write(version, xs):
        tok = page_begin("lowering", 1, version)
        tok = jax.lax.scan(lambda t, x: (page_out("lowering", 1, 0, x, t), None), tok, xs)[0]
        return page_commit("lowering", 1, tok)

    def read(version):
        tok = page_begin("lowering", 2, version)

        def body(t, _):
            y, t = page_take("lowering", 2, 0, t, shape=(elems,), dtype=jnp.float32)
            return t, y

        tok, ys = jax.lax.scan(body, tok, None, length=n)
        return ys, page_commit("lowering", 2, tok)

    checks = [export.DisabledSafetyCheck.custom_call(t) for t in TARGETS]
    version = jax.ShapeDtypeStruct((), jnp.int32)
    text = ""
    for fn, args in ((write, (version, jax.ShapeDtypeStruct((n, elems), jnp.float32))),
                     (read, (version,))):  # fmt: skip
        exp = export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args)
        text += exp.mlir_module()
    operands: dict = {t: [] for t in TARGETS}
    attributes: dict = {t: set() for t in TARGETS}
    for m in re.finditer(r"stablehlo\.custom_call @(\w+)\(([^)]*)\)([^\n]*)", text):
        assert m.group(1) in operands, m.group(1)  # no other custom call
        operands[m.group(1)].append(len([o for o in m.group(2).split(",") if o.strip()]))
        config = re.search(r"mhlo\.backend_config = \{([^}]*)\}", m.group(3))
        attributes[m.group(1)].add(tuple(sorted(re.findall(r"(\w+) = ", config.group(1)))))
    assert operands == {
        "jaxoff_pager_begin": [1, 1],  # one per step: the token, the state's store version
        "jaxoff_pager_take": [1],  # one site inside the scan
        "jaxoff_pager_out": [2],
        "jaxoff_pager_commit": [1, 1],
    }
    site, step = {("plan", "site", "table")}, {("plan", "table")}
    assert attributes == {
        "jaxoff_pager_begin": step,
        "jaxoff_pager_take": site,
        "jaxoff_pager_out": site,
        "jaxoff_pager_commit": step,
    }
    assert text.count("callback") == 0

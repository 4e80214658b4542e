"""The GPU pager's CUDA code read as text, plus its module on a machine without a GPU.

Rule I1 of the GPU design: no paging handler waits for the GPU. The handlers of the GPU pager
(``ffi/src/cuda_pager_handlers.cc``) must not synchronise a stream, an event or the device, nor
copy with a blocking ``cudaMemcpy``; they only enqueue work on XLA's stream through the pager.
The pager itself (``ffi/engine/gpu_pager.cc``) waits for its streams only in its destructor,
and the CUDA device interface only in ``SynchronizeStream``, which is for teardown.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HANDLERS = ROOT / "ffi" / "src" / "cuda_pager_handlers.cc"
LEGACY = ROOT / "ffi" / "src" / "cuda_page_handlers.cc"
PAGER = ROOT / "ffi" / "engine" / "gpu_pager.cc"
CUDA_OPS = ROOT / "ffi" / "src" / "cuda_device_ops.cc"

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
    # The legacy handlers (device-scalar operands) still drain XLA's stream: the checker sees it.
    assert "cudaStreamSynchronize" in {call for _, call in offending(LEGACY.read_text())}


def test_gpu_pager_handlers_make_no_synchronising_call():
    text = HANDLERS.read_text()
    assert offending(text) == []
    assert offending(text, HANDLER_ONLY) == []
    code = code_of(text)
    # Every execute handler goes through the pager, and the only CUDA call on XLA's stream
    # made here is the token's memset.
    for call in ("->Begin(plan)", "pager.Take(", "pager.Put(", "pager.Commit()"):
        assert call in code, call
    assert set(re.findall(r"\bcuda[A-Z]\w*", code)) <= {
        "cudaStream_t",
        "cudaMemsetAsync",
        "cudaError_t",
        "cudaSuccess",
        "cudaGetErrorName",
    }


def test_gpu_pager_handlers_take_no_metadata_operands():
    """What a call pages comes from attributes (table, plan, site) and the host cursor: the
    only operands are the tensor written out and the ordering token."""
    code = code_of(HANDLERS.read_text(), strings=True)
    binds = dict(
        re.findall(
            r"XLA_FFI_DEFINE_HANDLER_SYMBOL\((GpuPage\w+Execute),\s*\w+,\s*(ffi::Ffi::Bind\(\).*?)\);",
            code,
            flags=re.S,
        )
    )
    assert sorted(binds) == sorted(f"GpuPage{n}Execute" for n in ("Begin", "Take", "Out", "Commit"))
    args = {name: bind.count(".Arg<") for name, bind in binds.items()}
    assert args == {
        "GpuPageBeginExecute": 1,  # token
        "GpuPageTakeExecute": 1,  # token
        "GpuPageOutExecute": 2,  # the tensor, token
        "GpuPageCommitExecute": 1,  # token
    }
    for name, bind in binds.items():
        attrs = re.findall(r'\.Attr<[^>]*>\("(\w+)"\)', bind)
        want = ["table", "plan", "site"] if ("Take" in name or "Out" in name) else ["table", "plan"]
        assert attrs == want, name


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
        "IoStatus GpuPager::Begin(StepPlan plan)",
        "IoStatus GpuPager::Commit()",
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


def test_the_module_exports_the_pager_targets_and_state(cuda_module):
    regs = cuda_module.pager_registrations()
    assert sorted(regs) == [
        "jaxoff_gpu_page_begin",
        "jaxoff_gpu_page_commit",
        "jaxoff_gpu_page_out",
        "jaxoff_gpu_page_take",
    ]
    for name, stages in regs.items():
        assert sorted(stages) == ["execute", "instantiate"], name
        assert all(type(c).__name__ == "PyCapsule" for c in stages.values()), name
    assert sorted(cuda_module.pager_state_types()) == ["jaxoff_gpu_pager_state"]
    # The legacy targets are unchanged (the Python lowering still uses them).
    assert "jaxoff_gpu_page_take" not in cuda_module.registrations()


def test_a_pager_without_a_device_or_a_table_fails_with_one_line(cuda_module, tmp_path):
    from jaxoff.aio._ffi_calls import register_file_table, unregister_file_table

    with pytest.raises(ValueError, match="no GPU pager is open for file table 'nope'"):
        cuda_module.pager_plan("nope", 1, [(0, 0, 0, 4096)], [])
    assert cuda_module.pager_close("nope") is False
    name = "gpu_static_table"
    reg = register_file_table(name, [str(tmp_path / "f0")])
    try:
        if cuda_module.runtime()["device_count"] > 0:
            pytest.skip("a CUDA device is visible: the pager opens (tests/test_gpu.py)")
        with pytest.raises(RuntimeError) as e:
            cuda_module.pager_open(name, device=0, slot_bytes=1 << 20)
        msg = str(e.value)
        assert "\n" not in msg
        assert f"cannot open the GPU pager of file table '{name}' on CUDA device 0" in msg
        assert "cuda" in msg.lower()
    finally:
        unregister_file_table(name, reg)


def test_the_probe_steps_lower_for_cuda_with_attributes_and_tokens_only():
    """bench/gpu/pager_probe.py's steps on the pager's targets, exported for CUDA on this CPU
    machine: each call's operands are its token (and page_out's tensor), its metadata
    attributes, and the steps hold no host callback."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "pager_probe", ROOT / "bench" / "gpu" / "pager_probe.py"
    )
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    low = probe.pager_lowering(elems=256, n=3)
    assert low["operands"] == {
        "jaxoff_gpu_page_begin": [1, 1],  # one per step, the token
        "jaxoff_gpu_page_take": [1],  # one site inside the scan
        "jaxoff_gpu_page_out": [2],
        "jaxoff_gpu_page_commit": [1, 1],
    }
    site = [("plan", "site", "table")]
    step = [("plan", "table")]
    assert low["attributes"] == {
        "jaxoff_gpu_page_begin": step,
        "jaxoff_gpu_page_take": site,
        "jaxoff_gpu_page_out": site,
        "jaxoff_gpu_page_commit": step,
    }
    assert low["callbacks"] == 0

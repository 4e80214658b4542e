"""The page store's one-line errors recovered from the runtime errors of the pager's calls
inside a jitted step (issue 46): a checksum mismatch (DATA_LOSS, at the take that needs the
chunk), a truncated page, an I/O error of a write or sync behind a step (at the next
``jaxoff_pager_begin``). The texts are the pager's and the engine's (ffi/src/pager_registry.cc,
ffi/engine/gpu_pager.cc, ffi/engine/error.cc)."""

import jax

from jaxoff.aio import PageStoreCorruptError, PageStoreError, store_error_from

CHECKSUM = (
    "DATA_LOSS: jaxoff_pager_take: checksum mismatch in /r/store/data/opt.0.mu.w.A.page at "
    "offset 8192 (4096 bytes): expected crc32c 0x00000001, read 0x00000002. The page file is "
    "corrupt or was written by a crashed run; restore the store from the last checkpoint "
    "(resume), or delete it to start over"
)


def test_a_checksum_mismatch_inside_the_step_is_the_stores_corrupt_error():
    e = store_error_from(jax.errors.JaxRuntimeError(CHECKSUM))
    assert isinstance(e, PageStoreCorruptError)
    line = str(e)
    assert "\n" not in line
    assert "/r/store/data/opt.0.mu.w.A.page" in line and "offset 8192" in line
    assert "fails its checksum" in line
    assert "`resume=True`" in line  # the next step to take (jaxoff train: --resume)


def test_a_truncated_page_and_an_io_error_name_the_file_and_what_to_do():
    short = jax.errors.JaxRuntimeError(
        "INTERNAL: jaxoff_pager_take: read /r/s/x.B.page at offset 4096 (4096 bytes) failed: "
        "read past the end of the file (the file is shorter than offset + size: it was "
        "truncated or never fully written) [engine.cc:302]"
    )
    e = store_error_from(short)
    assert isinstance(e, PageStoreCorruptError) and "/r/s/x.B.page" in str(e)
    assert "truncated" in str(e) and "`resume=True`" in str(e)
    # a write behind a step failed: the next step's page_begin reports it
    eio = jax.errors.JaxRuntimeError(
        "INTERNAL: jaxoff_pager_begin: write /r/s/x.A.page at offset 0 (4096 bytes) failed: "
        "Input/output error (EIO, errno 5): the device reported an I/O error; check dmesg "
        "[engine.cc:302]"
    )
    e = store_error_from(eio)
    assert isinstance(e, PageStoreError) and "/r/s/x.A.page" in str(e) and "EIO" in str(e)
    assert "dmesg" in str(e) and "`resume=True`" in str(e)
    assert "\n" not in str(e)


def test_a_failed_sync_before_a_commit_names_the_file():
    """The pager makes a step's writes durable before it commits: an fsync that fails is
    reported by the next step's page_begin, inside the pager's own sentence."""
    sync = jax.errors.JaxRuntimeError(
        "INTERNAL: jaxoff_pager_begin: making the step's writes durable (sync of page files "
        "3) before committing version 5 failed: fsync /r/s/x.A.page at offset 0 failed: "
        "Input/output error (EIO, errno 5): the device reported an I/O error; check dmesg "
        "[file_handle.cc:98]; the step is not committed (the store stays at version 4)"
    )
    e = store_error_from(sync)
    assert type(e) is PageStoreError
    assert "fsync" in str(e) and "/r/s/x.A.page" in str(e) and "EIO" in str(e)
    assert "`resume=True`" in str(e) and "\n" not in str(e)


def test_other_runtime_errors_are_not_the_stores():
    assert store_error_from(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory")) is None

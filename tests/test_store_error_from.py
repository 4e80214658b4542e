"""The page store's one-line errors recovered from the runtime errors of FFI calls inside a
jitted step (issue 46): a checksum mismatch (DATA_LOSS), a truncated page, an I/O error."""

import jax

from jaxoff.aio import PageStoreCorruptError, PageStoreError, store_error_from

CHECKSUM = (
    "DATA_LOSS: jaxoff_page_in (table 'paged-0'): checksum mismatch in /r/store/data/"
    "opt.0.mu.w.A.page at offset 8192 (4096 bytes): expected crc32c 0x00000001, read "
    "0x00000002. The page file is corrupt or was written by a crashed run; restore ..."
)


def test_a_checksum_mismatch_inside_the_step_is_the_stores_corrupt_error():
    e = store_error_from(jax.errors.JaxRuntimeError(CHECKSUM))
    assert isinstance(e, PageStoreCorruptError)
    line = str(e)
    assert "\n" not in line
    assert "/r/store/data/opt.0.mu.w.A.page" in line and "offset 8192" in line
    assert "--resume" in line  # the next step to take


def test_a_truncated_page_and_an_io_error_name_the_file_and_what_to_do():
    short = jax.errors.JaxRuntimeError(
        "INTERNAL: jaxoff_page_in: read /r/s/x.B.page at offset 4096 (4096 bytes) failed: "
        "read past the end of the file (the file is shorter than offset + size) [io.cc:10]"
    )
    e = store_error_from(short)
    assert isinstance(e, PageStoreCorruptError) and "/r/s/x.B.page" in str(e)
    assert "truncated" in str(e) and "--resume" in str(e)
    eio = jax.errors.JaxRuntimeError(
        "INTERNAL: jaxoff_page_out: write /r/s/x.A.page at offset 0 (4096 bytes) failed: "
        "Input/output error (EIO, errno 5): check the disk [io.cc:20]"
    )
    e = store_error_from(eio)
    assert isinstance(e, PageStoreError) and "/r/s/x.A.page" in str(e) and "EIO" in str(e)
    assert "dmesg" in str(e) and "--resume" in str(e)


def test_other_runtime_errors_are_not_the_stores():
    assert store_error_from(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory")) is None

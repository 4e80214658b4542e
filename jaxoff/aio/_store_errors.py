"""Errors of the page store: each message says what happened and what to do."""

from __future__ import annotations

from jaxoff._errors import JaxoffError

# What to do when committed optimizer state is damaged: the page store is only as durable as
# the disk, so the recovery path is the training checkpoint.
RESTORE_HINT = (
    "restore from the last checkpoint with `resume=True` (or delete the store directory to "
    "start the optimizer state afresh)"
)


class PageStoreError(JaxoffError):
    """Base class of every error the page store raises."""


class PageStoreNotFoundError(PageStoreError, FileNotFoundError):
    """The store directory or its ``manifest.json`` does not exist."""


class PageStoreFormatError(PageStoreError):
    """``manifest.json`` is unreadable, not a page store manifest, or of another format version."""


class PageStoreCorruptError(PageStoreError):
    """Committed data fails its checksum, or a page file is missing or too short."""


class PageStoreManifestError(PageStoreFormatError, PageStoreCorruptError):
    """``manifest.json`` fails its own checksum (edited or damaged), or its version does not
    match the pages it describes."""


class PageStoreTornError(PageStoreCorruptError):
    """A single-slot store was left mid-update: its committed version is partly overwritten."""


class PageStoreLockedError(PageStoreError):
    """Another process (or another ``PageStore`` of this process) holds the store's lock."""


class PageStoreLayoutError(PageStoreError, ValueError):
    """Bad layout arguments, an unknown entry, or a layout that differs from the store's."""


class PageStoreFullError(PageStoreError):
    """A write failed with ENOSPC or EFBIG (disk full or file size limit).

    Attributes:
      path: the file that could not be written.
      needed_bytes: how many bytes the failed operation needed.
      errno: the OS error number.
    """

    def __init__(self, message: str, *, path: str, needed_bytes: int, errno: int):
        super().__init__(message)
        self.path = path
        self.needed_bytes = needed_bytes
        self.errno = errno

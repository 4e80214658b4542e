"""Async I/O: the C++ engine, the page store and the XLA FFI paging calls."""

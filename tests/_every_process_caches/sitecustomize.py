"""Test-only, put on ``PYTHONPATH`` of multi-process runs: every process writes the programs it
compiles to the persistent compilation cache.

jax writes cache entries from process 0 only (``jax._src.compiler._cache_write``), and on CPU
the cache key of a program differs between processes (the key hashes the compile options,
whose device assignment jax strips on GPU only), so without this every process but 0
compiles each of its programs again in every run: 15-25 s per ``jaxoff launch`` of the tiny
model on a loaded 2-core machine, long enough for gloo's 30 s handshake to time out. With
it, process ``i`` reads back the executable it compiled itself in an earlier run, under its
own key, as process 0 does. Nothing else changes: once ``jax._src.compiler`` is imported,
the hook swaps in a copy of ``_cache_write`` that sees process id 0; no other module is
touched.
"""

import importlib.abc
import importlib.machinery
import sys
import types

_MODULE = "jax._src.compiler"


def _patch(compiler: types.ModuleType) -> None:
    write = compiler._cache_write
    scope = dict(compiler.__dict__)
    scope["distributed"] = types.SimpleNamespace(global_state=types.SimpleNamespace(process_id=0))
    compiler._cache_write = types.FunctionType(
        write.__code__, scope, write.__name__, write.__defaults__, write.__closure__
    )


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())

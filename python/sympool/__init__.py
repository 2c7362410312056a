"""sympool: a CUDA caching allocator with PyTorch's semantics, MemPools, and symmetric MemPools
for mpirun-launched jobs, from Python (ctypes over libsympool.so).

    import sympool
    p = sympool.malloc(1 << 20)
    print(sympool.memory_stats()["allocated_bytes.all.current"])
    sympool.free(p)

Names and shapes follow torch.cuda's memory API and CuPy's MemoryPool. The library is found at
$SYMPOOL_LIBRARY, else next to this package, else through the loader's search path; it is loaded
on the first call. `import sympool` never imports torch (that is `import sympool.torch`) nor
mpi4py (imported by World(comm) when needed).
"""

from ._lib import InvalidArgumentError, OutOfMemoryError, SympoolError
from ._lib import path as library_path
from .history import (
    _get_memory_metadata, _record_annotation, _record_memory_history, _set_memory_metadata,
    record_function, record_memory_history)
from .memory import (
    MemPool, Stream, _dump_snapshot, _snapshot, backend, caching_allocator_alloc,
    caching_allocator_delete, device_count, device_usage, dump_snapshot, empty_cache, free,
    get_default_memory_pool, get_memory_info,
    get_per_process_memory_fraction, init, malloc, max_memory_allocated,
    max_memory_reserved, mem_get_info, memory_allocated, memory_reserved, memory_snapshot,
    memory_stats, memory_summary, record_stream, reset_accumulated_memory_stats,
    reset_peak_memory_stats, set_per_process_memory_fraction, snapshot, stats_keys, use_mem_pool)
from .world import World


def __getattr__(name):
    # The version is the library's (sp_version), not a copy here: read when first asked for, so
    # that `import sympool` still loads nothing.
    if name == "__version__":
        from . import _lib
        return _lib.lib().sp_version().decode()
    raise AttributeError(f"module 'sympool' has no attribute {name!r}")


__all__ = [
    "InvalidArgumentError", "MemPool", "OutOfMemoryError", "Stream", "SympoolError", "World",
    "backend", "caching_allocator_alloc", "caching_allocator_delete", "device_count",
    "device_usage",
    "dump_snapshot", "empty_cache", "free", "get_default_memory_pool", "get_memory_info",
    "get_per_process_memory_fraction", "init",
    "library_path", "malloc",
    "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated",
    "memory_reserved", "memory_snapshot", "memory_stats", "memory_summary",
    "record_function", "record_memory_history", "record_stream", "reset_accumulated_memory_stats",
    "reset_peak_memory_stats", "set_per_process_memory_fraction", "snapshot", "stats_keys",
    "use_mem_pool",
]

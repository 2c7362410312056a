"""sympool_ctypes.py: a small ctypes binding of libsympool.so for the Python examples.

It binds only what the examples use: the PyTorch entry points (sp_torch_malloc/sp_torch_free),
statistics (sp_memory_stats and friends) and MemPools (create, begin/end, queries, destroy).
The declarations mirror include/sympool/*.h; keep them in step when those change.

Loading the library by the same path PyTorch's CUDAPluggableAllocator was given returns the same
handle (dlopen reference-counts by path), so these functions see the same allocator state as the
tensors PyTorch allocated through it.
"""

import ctypes
import ctypes.util
import glob
import os

STATS_MAX = 160  # SP_STATS_MAX in include/sympool/stats.h


class Stats(ctypes.Structure):
    """sp_stats_t: one int64 per key, in sp_stats_key(i) order."""

    _fields_ = [("value", ctypes.c_int64 * STATS_MAX)]


class MemPoolId(ctypes.Structure):
    """sp_mempool_id_t: {0,0} is the default pool, user pools are {0,n}."""

    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]


# sp_allocator_t's callbacks: a segment allocator, like CUDAPluggableAllocator's alloc/free plus
# a context pointer. alloc returns NULL (None) for out of memory.
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                            ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                           ctypes.c_void_p)


class Allocator(ctypes.Structure):
    """sp_allocator_t. Keep the object (and its callbacks) alive while the pool exists."""

    _fields_ = [("alloc", ALLOC_FN), ("free", FREE_FN), ("ctx", ctypes.c_void_p)]


class MemPoolParams(ctypes.Structure):
    """sp_mempool_params_t (fill with sp_mempool_params_init before changing fields)."""

    _fields_ = [
        ("allocator", ctypes.c_void_p),  # const sp_allocator_t *; NULL = the device backend
        ("use_on_oom", ctypes.c_bool),
        ("no_split", ctypes.c_bool),
        ("device", ctypes.c_int),
        ("name", ctypes.c_char_p),
    ]


def find_library(explicit=None):
    """Path of libsympool.so: the argument, $SYMPOOL_LIB, a build folder of this checkout, or
    the system's library path. Returns None if none is found."""
    if explicit:
        return explicit
    if os.environ.get("SYMPOOL_LIB"):
        return os.environ["SYMPOOL_LIB"]
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    for pattern in ("build/libsympool.so", "build*/libsympool.so"):
        hits = sorted(glob.glob(os.path.join(root, pattern)))
        if hits:
            return hits[0]
    return ctypes.util.find_library("sympool")


def load(path):
    """Load libsympool.so at path and declare the prototypes the examples use."""
    lib = ctypes.CDLL(path)
    c_size, c_int, c_vp, c_char_p = ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    status = ctypes.c_int  # sp_status_t; 0 = SP_SUCCESS
    pool_p = ctypes.c_void_p  # sp_mempool_t *
    protos = {
        # torch.h: exactly CUDAPluggableAllocator's alloc/free signatures.
        "sp_torch_malloc": (c_vp, [c_size, c_int, c_vp]),
        "sp_torch_free": (None, [c_vp, c_size, c_int, c_vp]),
        # status.h, pool.h
        "sp_status_name": (c_char_p, [status]),
        "sp_last_error": (c_char_p, []),
        "sp_backend_name": (c_char_p, []),
        "sp_device_count": (c_int, []),
        "sp_empty_cache": (status, []),
        "sp_shutdown": (status, []),
        # stats.h
        "sp_memory_stats": (status, [c_int, ctypes.POINTER(Stats)]),
        "sp_stats_count": (c_size, []),
        "sp_stats_key": (c_char_p, [c_size]),
        "sp_stats_get": (status, [ctypes.POINTER(Stats), c_char_p, ctypes.POINTER(ctypes.c_int64)]),
        "sp_memory_allocated": (c_size, [c_int]),
        "sp_memory_reserved": (c_size, [c_int]),
        # mempool.h
        "sp_mempool_params_init": (None, [ctypes.POINTER(MemPoolParams)]),
        "sp_mempool_create": (status, [ctypes.POINTER(MemPoolParams), ctypes.POINTER(pool_p)]),
        "sp_mempool_destroy": (status, [pool_p]),
        "sp_default_mempool": (pool_p, [c_int]),
        "sp_mempool_id": (MemPoolId, [pool_p]),
        "sp_mempool_use_count": (c_int, [pool_p]),
        "sp_mempool_begin": (status, [pool_p]),
        "sp_mempool_end": (status, [pool_p]),
        "sp_mempool_used_bytes": (c_size, [pool_p]),
        "sp_mempool_total_bytes": (c_size, [pool_p]),
        "sp_mempool_free_bytes": (c_size, [pool_p]),
        "sp_mempool_n_free_blocks": (c_size, [pool_p]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)  # AttributeError here means the symbol is not exported
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


class SympoolError(RuntimeError):
    pass


def check(lib, status, what):
    """Raise SympoolError with the status name and sp_last_error() unless status is SP_SUCCESS."""
    if status != 0:
        name = lib.sp_status_name(status).decode()
        raise SympoolError(f"{what}: {name}: {lib.sp_last_error().decode()}")


def stats(lib, device=0):
    """The device's statistics as a dict {key: value}, PyTorch's memory_stats() key for key."""
    st = Stats()
    check(lib, lib.sp_memory_stats(device, ctypes.byref(st)), "sp_memory_stats")
    return {lib.sp_stats_key(i).decode(): st.value[i] for i in range(lib.sp_stats_count())}


def create_pool(lib, name, device=0, use_on_oom=False, no_split=False, allocator=None):
    """A sympool MemPool (sp_mempool_create) on device; returns its handle. allocator: an
    Allocator whose callbacks give the pool its segments (sympool copies the struct, but the
    Python callback objects must outlive the pool)."""
    params = MemPoolParams()
    lib.sp_mempool_params_init(ctypes.byref(params))
    if allocator is not None:
        params.allocator = ctypes.cast(ctypes.pointer(allocator), ctypes.c_void_p)
    params.name = name.encode()
    params.device = device
    params.use_on_oom = use_on_oom
    params.no_split = no_split
    pool = ctypes.c_void_p()
    check(lib, lib.sp_mempool_create(ctypes.byref(params), ctypes.byref(pool)), "sp_mempool_create")
    return pool

"""_lib: finding and loading libsympool.so, its C declarations, and turning statuses into errors.

Everything else in the package goes through lib() and check(). The declarations mirror
include/sympool/*.h; keep them in step when those change. Functions that only some builds export
(MPI, the summary, the torch hooks) are declared when present and looked up with has().

Lookup order (API.md): $SYMPOOL_LIBRARY, else a libsympool.so next to this package (cmake --install
puts a link there), else the loader's search path (LD_LIBRARY_PATH, ldconfig).
"""

import ctypes
import ctypes.util
import operator
import os
import threading

STATS_MAX = 160  # SP_STATS_MAX in include/sympool/stats.h
SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1

_lock = threading.Lock()
_lib = None
_path = None
_keys = None


class SympoolError(RuntimeError):
    """A sympool call failed. .status is the status name ("SP_ERR_MISMATCH"); the message is the
    library's detail (sp_last_error) for that failure."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}" if message else status)
        self.status = status
        self.detail = message

    def __reduce__(self):
        # Pickle rebuilds an exception as cls(*self.args), and args holds the one formatted
        # text, not (status, message): without this, unpickling fails with a TypeError, so an
        # OutOfMemoryError could not cross a multiprocessing or concurrent.futures pipe.
        return (type(self), (self.status, self.detail), self.__dict__)


class OutOfMemoryError(SympoolError):
    """SP_ERR_OUT_OF_MEMORY: the device (or the pool's limit) is exhausted after freeing the
    cache and retrying, as torch.cuda.OutOfMemoryError."""


class InvalidArgumentError(SympoolError, ValueError):
    """SP_ERR_INVALID_ARGUMENT, or an argument the binding refused before calling the library.
    Both a SympoolError and a ValueError, so either kind of handler catches it."""


# importlib.reload runs this file again: new classes would no longer be the ones the package
# exports (sympool.SympoolError, bound at the first import), so `except sympool.SympoolError`
# missed every error raised after the reload. The first import's classes stay.
if "_error_classes" in globals():
    SympoolError, OutOfMemoryError, InvalidArgumentError = globals()["_error_classes"]
_error_classes = (SympoolError, OutOfMemoryError, InvalidArgumentError)

_ERROR_CLASSES = {"SP_ERR_OUT_OF_MEMORY": OutOfMemoryError,
                  "SP_ERR_INVALID_ARGUMENT": InvalidArgumentError}


class Stats(ctypes.Structure):
    _fields_ = [("value", ctypes.c_int64 * STATS_MAX)]


class StatsSummary(ctypes.Structure):
    _fields_ = [("min", ctypes.c_int64 * STATS_MAX), ("max", ctypes.c_int64 * STATS_MAX),
                ("sum", ctypes.c_int64 * STATS_MAX), ("min_rank", ctypes.c_int * STATS_MAX),
                ("max_rank", ctypes.c_int * STATS_MAX), ("nranks", ctypes.c_int)]


class DeviceUsage(ctypes.Structure):
    _fields_ = [("total", ctypes.c_size_t), ("used", ctypes.c_size_t),
                ("reserved", ctypes.c_size_t), ("untracked", ctypes.c_size_t)]


class MemPoolId(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]


ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                            ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                           ctypes.c_void_p)


class Allocator(ctypes.Structure):
    _fields_ = [("alloc", ALLOC_FN), ("free", FREE_FN), ("ctx", ctypes.c_void_p)]


class MemPoolParams(ctypes.Structure):
    _fields_ = [("allocator", ctypes.POINTER(Allocator)), ("use_on_oom", ctypes.c_bool),
                ("no_split", ctypes.c_bool), ("device", ctypes.c_int), ("name", ctypes.c_char_p)]


class HistoryParams(ctypes.Structure):
    _fields_ = [("enabled", ctypes.c_int), ("context", ctypes.c_int),
                ("max_entries", ctypes.c_size_t), ("c_stacks", ctypes.c_bool),
                ("skip_actions", ctypes.c_char_p)]


class HistoryFrame(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("filename", ctypes.c_char_p), ("line", ctypes.c_int)]


FRAMES_FN = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.POINTER(HistoryFrame), ctypes.c_size_t,
                             ctypes.c_void_p)


class PythonFramesArg(ctypes.Structure):
    """sp_history_python_frames_arg_t: the UTF-8 prefix of file names left out, and the dict
    (str -> bytes) that keeps the 'surrogatepass' form of names CPython cannot give as UTF-8."""
    _fields_ = [("skip_prefix", ctypes.c_char_p), ("encoded", ctypes.py_object)]


_st, _sz, _i = ctypes.c_int, ctypes.c_size_t, ctypes.c_int
_vp, _cp = ctypes.c_void_p, ctypes.c_char_p
_P = ctypes.POINTER
_PROTOS = {
    "sp_status_name": (_cp, [_st]),
    "sp_last_error": (_cp, []),
    "sp_version": (_cp, []),
    "sp_init": (_st, []),
    "sp_backend_name": (_cp, []),
    "sp_device_count": (_i, []),
    "sp_malloc": (_st, [_sz, _i, _vp, _P(_vp)]),
    "sp_free": (_st, [_vp]),
    "sp_record_stream": (_st, [_vp, _vp]),
    "sp_empty_cache": (_st, []),
    "sp_set_memory_fraction": (_st, [ctypes.c_double, _i]),
    "sp_get_memory_fraction": (_st, [_i, ctypes.POINTER(ctypes.c_double)]),
    "sp_get_memory_info": (_st, [_i, _P(_sz), _P(_sz)]),
    "sp_device_usage": (_st, [_i, _P(DeviceUsage)]),
    "sp_memory_stats": (_st, [_i, _P(Stats)]),
    "sp_stats_count": (_sz, []),
    "sp_stats_key": (_cp, [_sz]),
    "sp_reset_peak_memory_stats": (_st, [_i]),
    "sp_reset_accumulated_memory_stats": (_st, [_i]),
    "sp_memory_allocated": (_sz, [_i]),
    "sp_max_memory_allocated": (_sz, [_i]),
    "sp_memory_reserved": (_sz, [_i]),
    "sp_max_memory_reserved": (_sz, [_i]),
    "sp_memory_summary": (_st, [_i, _cp, _sz]),
    "sp_mempool_params_init": (None, [_P(MemPoolParams)]),
    "sp_mempool_create": (_st, [_P(MemPoolParams), _P(_vp)]),
    "sp_mempool_destroy": (_st, [_vp]),
    "sp_default_mempool": (_vp, [_i]),
    "sp_mempool_id": (MemPoolId, [_vp]),
    "sp_mempool_use_count": (_i, [_vp]),
    "sp_mempool_is_symmetric": (ctypes.c_bool, [_vp]),
    "sp_mempool_begin": (_st, [_vp]),
    "sp_mempool_end": (_st, [_vp]),
    "sp_mempool_malloc": (_st, [_vp, _sz, _vp, _P(_vp)]),
    "sp_mempool_used_bytes": (_sz, [_vp]),
    "sp_mempool_total_bytes": (_sz, [_vp]),
    "sp_mempool_free_bytes": (_sz, [_vp]),
    "sp_mempool_n_free_blocks": (_sz, [_vp]),
    "sp_mempool_free_all_blocks": (_st, [_vp, _vp]),
    "sp_mempool_set_limit": (_st, [_vp, _sz]),
    "sp_mempool_get_limit": (_sz, [_vp]),
    "sp_history_params_init": (None, [_P(HistoryParams)]),
    "sp_record_memory_history": (_st, [_P(HistoryParams)]),
    "sp_dump_snapshot": (_st, [_cp]),
    "sp_mempool_dump_snapshot": (_st, [_vp, _cp]),
    "sp_history_set_frames_hook": (None, [FRAMES_FN, _vp]),
    "sp_history_python_frames": (_sz, [_P(HistoryFrame), _sz, _vp]),
    "sp_history_python_frames_supported": (ctypes.c_bool, []),
    "sp_history_set_user_metadata": (_st, [_i, _cp]),
    "sp_history_record_annotation": (_st, [_i, _cp, _cp]),
    "sp_history_get_user_metadata": (_st, [_i, _cp, _sz, _P(_sz)]),
    "sp_stream_create": (_st, [_i, _P(_vp)]),
    "sp_stream_destroy": (_st, [_vp]),
    "sp_stream_synchronize": (_st, [_vp]),
    "sp_torch_malloc": (_vp, [_sz, _i, _vp]),
    "sp_torch_free": (None, [_vp, _sz, _i, _vp]),
}
# Experimental ones the package uses (sympool/experimental.h: not the package's contract, so
# test_abi leaves them out); required, as _PROTOS.
_EXPERIMENTAL = {
    "sp_x_session": (ctypes.c_uint64, []),  # Stream.__del__: a handle of this session only
    "sp_x_stream_count": (_sz, []),  # tests: streams made and not destroyed
    "sp_x_stream_live": (_i, [_vp]),  # Stream.__del__: destroyed by other means?
    "sp_x_history_clear": (_st, []),  # record_memory_history(clear_history=True)
    "sp_x_mempool_released": (_i, [_vp]),  # _release_allocators: a destroyed pool's last segment
}
# Present only in some builds or versions: declared when exported.
_OPTIONAL = {
    "sp_torch_record_stream": (None, [_vp, _vp]),
    "sp_torch_empty_cache": (None, []),
    "sp_torch_malloc_status": (_st, [_sz, _i, _vp, _P(_vp)]),
    "sp_torch_set_memory_fraction": (None, [ctypes.c_double, _i]),
    "sp_torch_segment_malloc": (_vp, [_sz, _i, _vp]),
    "sp_torch_segment_free": (None, [_vp, _sz, _i, _vp]),
    # world.h / symmetric.h / collectives.h (MPI builds). sp_world_from_comm's MPI_Comm is
    # declared in world.py, where mpi4py tells its size.
    "sp_world_init": (_st, [_vp, _vp, _P(_vp)]),
    "sp_world_finalize": (_st, [_vp]),
    "sp_world_rank": (_i, [_vp]),
    "sp_world_size": (_i, [_vp]),
    "sp_world_local_rank": (_i, [_vp]),
    "sp_world_device": (_i, [_vp]),
    "sp_world_local_size": (_i, [_vp]),
    "sp_world_node_count": (_i, [_vp]),
    "sp_world_node": (_i, [_vp, _i]),
    "sp_world_node_name": (_cp, [_vp, _i]),
    "sp_symmetric_mempool_create": (_st, [_vp, _P(MemPoolParams), _P(_vp)]),
    "sp_symmetric_mempool_destroy": (_st, [_vp]),
    "sp_symmetric_malloc": (_st, [_vp, _sz, _vp, _P(_vp)]),
    "sp_symmetric_empty_cache": (_st, [_vp]),
    "sp_allreduce": (_st, [_vp, _vp, _vp, _sz, _i, _i, _vp]),
    "sp_allgather": (_st, [_vp, _vp, _vp, _sz, _i, _vp]),
    "sp_reduce_scatter": (_st, [_vp, _vp, _vp, _sz, _i, _i, _vp]),
    "sp_broadcast": (_st, [_vp, _vp, _vp, _sz, _i, _i, _vp]),
    "sp_stats_summary_count": (_sz, []),
    "sp_stats_summary_key": (_cp, [_sz]),
    "sp_stats_aggregate": (_st, [_vp, _i, _P(StatsSummary)]),
    "sp_stats_report": (_st, [_vp, _i, _vp, _i]),
}


def _candidates():
    env = os.environ.get("SYMPOOL_LIBRARY")
    if env:
        # An explicit choice: no fallback that would hide a wrong path. A relative path is taken
        # from the current folder now, so that library_path() (which child processes and
        # torch's CUDAPluggableAllocator are given) still names it after a chdir.
        return [os.path.abspath(env) if os.sep in env else env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, name) for name in ("libsympool.so", "libsympool.so.0")]
    out = [p for p in out if os.path.exists(p)]
    found = ctypes.util.find_library("sympool")
    out.append(found or "libsympool.so")
    return out


def _load():
    errors = []
    for path in _candidates():
        try:
            # RTLD_GLOBAL: Open MPI's plugins, loaded later by MPI_Init, resolve libmpi's symbols
            # globally; a library pulled in with RTLD_LOCAL can leave them unresolved.
            handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        return handle, path
    raise ImportError("sympool: cannot load libsympool.so (" + "; ".join(errors) + "). Set "
                      "SYMPOOL_LIBRARY to its path, install with `cmake --install build --prefix "
                      "P` (puts a link next to the package), or add its folder to LD_LIBRARY_PATH.")


def _declare(handle, path):
    for name, (restype, argtypes) in (*_PROTOS.items(), *_EXPERIMENTAL.items()):
        fn = getattr(handle, name, None)
        if fn is None:  # not a sympool library, or an older one than this package
            raise ImportError(f"sympool: {path} is not a sympool library, or is older than this "
                              f"package: it has no {name}. Set SYMPOOL_LIBRARY to the "
                              "libsympool.so built with this package.")
        fn.restype, fn.argtypes = restype, argtypes
    for name, (restype, argtypes) in _OPTIONAL.items():
        fn = getattr(handle, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = restype, argtypes


def _after_fork_in_child():
    """A fork while another thread was loading the library (declaring its functions under
    _lock, where the GIL may switch threads) gave the child a _lock no thread of it releases:
    its first sympool call waited for ever. The child, one thread now, starts with it free."""
    global _lock
    _lock = threading.Lock()


if "_forks_handled" not in globals():  # once, reloads included
    _forks_handled = True
    os.register_at_fork(after_in_child=_after_fork_in_child)


def lib():
    """The loaded library (loaded and declared on first use)."""
    global _lib, _path
    if _lib is None:
        with _lock:
            if _lib is None:
                handle, path = _load()
                _declare(handle, path)
                _path = path
                _lib = handle
    return _lib


class _Functions:
    """c.sp_xxx: the library's function, looked up once (attribute access on this object is
    cheaper than on the CDLL, which matters on the malloc/free path)."""

    def __getattr__(self, name):
        fn = getattr(lib(), name)
        setattr(self, name, fn)
        return fn


c = _Functions()


def path():
    """The path the library was loaded from (what torch's CUDAPluggableAllocator is given)."""
    lib()
    return _path


def has(name):
    """Whether this build of the library exports name."""
    return getattr(lib(), name, None) is not None


def stats_keys():
    """The stats keys, PyTorch's flat names in PyTorch's (sorted) order."""
    global _keys
    if _keys is None:
        L = lib()  # before _lock: the first lib() takes it
        with _lock:
            if _keys is None:
                _keys = tuple(L.sp_stats_key(i).decode() for i in range(L.sp_stats_count()))
    return _keys


def status_name(status):
    return lib().sp_status_name(status).decode(errors="replace")


def last_error():
    return lib().sp_last_error().decode(errors="replace")


def check(status):
    """Raise the SympoolError subclass for status unless it is SP_SUCCESS (0). The message is read
    right away, on the failing thread, before anything else can overwrite it."""
    if status != 0:
        name = status_name(status)
        raise _ERROR_CLASSES.get(name, SympoolError)(name, last_error())


def bad_value(message):
    """The error for a Python argument refused before reaching C."""
    return InvalidArgumentError("SP_ERR_INVALID_ARGUMENT", message)


class Handle:
    """Base of the classes whose objects stand for a live sympool object of this process (MemPool,
    Stream, World). They cannot be pickled or copied, as torch.cuda.MemPool and CuPy's pools
    cannot: a copy would be a second owner (destroying one would leave the other naming a
    destroyed pool, or destroy it twice), and the handle means nothing in another process."""

    __slots__ = ()

    def __reduce_ex__(self, protocol):
        raise TypeError(f"cannot pickle or copy a sympool.{type(self).__name__}: it stands for a "
                        "live object of this process (share the object itself instead)")


# ---- argument conversion: TypeError for a wrong type, ValueError for a wrong value ----------

def as_int(value, what):
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


def as_size(value, what="size"):
    v = as_int(value, what)
    if v < 0:
        raise bad_value(f"{what} must be >= 0, got {v}")
    if v > SIZE_MAX:
        raise bad_value(f"{what} {v} does not fit in size_t")
    return v


def as_device(device):
    """A device index: an int, "cuda" / "cuda:N", a torch.device or a torch.cuda.device (torch's
    _get_device_index takes both); None is device 0."""
    if device is None:
        return 0
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        # ASCII digits only (str.isdigit() takes every script's), as torch.device reads them.
        if kind != "cuda" or (index and not (index.isascii() and index.isdigit())):
            raise TypeError(f"device must be an int, a torch.device or 'cuda:N', not {device!r}")
        d = int(index) if index else 0
    elif type(device).__name__ == "device" and hasattr(device, "type"):  # torch.device
        if device.type != "cuda":
            raise bad_value(f"device {device} is not a CUDA device")
        d = device.index if device.index is not None else 0
    elif type(device).__name__ == "device" and hasattr(device, "idx"):
        d = as_int(device.idx, "device")  # torch.cuda.device (a context manager): its idx
    else:
        d = as_int(device, "device")
    # The range of the C int it becomes: a larger N would be cut to its low bits (device 0 for
    # 'cuda:4294967296').
    if d < 0 or d >= 1 << 31:
        raise bad_value(f"device must be in [0, device_count()), got {d}")
    return d


def as_ptr(value, what="ptr"):
    """An address: an int, or an object with data_ptr() (a tensor). None and 0 are NULL."""
    if value is None:
        return None
    if hasattr(value, "data_ptr") and callable(value.data_ptr):
        value = value.data_ptr()
    elif isinstance(value, ctypes.c_void_p):
        value = value.value or 0
    v = as_int(value, what)
    if v < 0 or v > SIZE_MAX:
        raise bad_value(f"{what} {v:#x} is not an address")
    return v or None


def as_stream(stream):
    """A stream handle: None (the default stream), an int, or an object with .cuda_stream
    (torch.cuda.Stream) or .ptr (cupy.cuda.Stream)."""
    if stream is None:
        return None
    for attr in ("cuda_stream", "ptr"):
        if not isinstance(stream, int) and hasattr(stream, attr):
            handle = getattr(stream, attr)
            if handle is None:  # sympool.Stream after destroy()
                raise SympoolError("SP_ERR_INVALID_USAGE",
                                   f"stream {stream!r} was destroyed (its .{attr} is None)")
            stream = handle
            break
    v = as_int(stream, "stream")
    if v < 0 or v > SIZE_MAX:
        raise bad_value(f"stream {v:#x} is not a stream handle")
    return v or None

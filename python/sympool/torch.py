"""sympool.torch: sympool under PyTorch. Imported only on request (`import sympool.torch`);
`import sympool` never imports torch.

Two modes:
- enable(): the whole process's CUDA allocations go to sympool's caching allocator
  (torch.cuda.memory.change_current_allocator). Must run before CUDA is initialized, on the cuda
  backend. PyTorch's pluggable layer takes whatever the allocation function returns, NULL
  included, so enable() builds (once, cached) a small C++ shim against the running torch that
  raises torch.OutOfMemoryError when sympool is out of memory; without a C++ compiler and torch's
  headers, enable() refuses with the compiler's message rather than let an OOM become an
  illegal-address fault. Under enable(), CUDA graph capture raises a RuntimeError when it begins
  (sympool gives it no private pool; `with torch.cuda.graph(g)` then leaves the thread's current
  stream on the capture stream, as torch/cuda/graphs.py enters its stream context before
  capture_begin and its __exit__ never runs), and torch.cuda.MemPool() (so mem_pool() too)
  raises at construction: PyTorch's pluggable allocator has no createOrIncrefPool;
  torch.cuda.set_per_process_memory_fraction sets sympool's cap. Tensor.record_stream raises
  where sympool cannot record the use (another device's stream, cudaStreamPerThread), rather
  than leave the memory reusable under that stream's work. torch.cuda's statistics
  (memory_stats, memory_allocated, memory_summary, memory_snapshot, reset_peak_memory_stats,
  _record_memory_history) and get_per_process_memory_fraction raise under any pluggable
  allocator (CUDAPluggableAllocator.cpp "does not yet support ..."): use this module's
  memory_stats() and sympool's own functions of the same names. So does sending a CUDA tensor
  to another process (torch.multiprocessing: StorageSharing.cpp asks the allocator's
  shareIpcHandle, which the pluggable allocator does not have).
- mem_pool(**kw): one torch.cuda.MemPool whose segments come from sympool's non-caching segment
  entry points (one device allocation per PyTorch segment, given back at once when PyTorch frees
  it); the rest of the process stays on PyTorch's allocator. PyTorch caches inside the pool:
  torch.cuda.empty_cache() does not free a live pool's cached segments (release_cached_blocks in
  c10/cuda/CUDACachingAllocator.cpp frees only the default pools and pools no MemPool holds any
  more); deleting the pool does (~MemPool empties its cache; segments with live tensors follow at
  the next empty_cache() after those are freed). An OOM there is PyTorch's own
  torch.OutOfMemoryError (its MemPool path checks for NULL).
memory_stats() reads the right statistics in either mode.

Not run in this repository's CI (no torch, no GPU there): the GPU validation runs it.
"""

import ctypes
import hashlib
import os
import subprocess
import tempfile

from . import _lib
from . import memory as _memory

_enabled = False
_allocator = None  # the torch allocator object enable() installs (one per process)
_segment_allocator = None  # the one behind mem_pool()'s MemPools
_shim_lib = None  # the C++ shim, once built and loaded


def _torch():
    try:
        import torch
    except ImportError as e:
        raise RuntimeError("sympool.torch needs PyTorch (import torch failed: %s)" % e) from None
    if not _compiled_with_cuda(torch):
        raise RuntimeError(f"sympool.torch: this torch ({torch.__version__}) has no CUDA support")
    if not torch.cuda.is_available():  # does not initialize CUDA
        raise RuntimeError("sympool.torch: torch sees no CUDA device")
    if not hasattr(torch.cuda, "memory") or \
            not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        raise RuntimeError(f"sympool.torch: torch {torch.__version__} has no "
                           "CUDAPluggableAllocator (needs torch >= 2.0)")
    return torch


def _compiled_with_cuda(torch):
    return getattr(torch.version, "cuda", None) is not None


def _check_backend():
    b = _memory.backend()
    if b != "cuda":
        raise RuntimeError(
            f"sympool.torch: sympool's backend is {b!r}, not 'cuda': PyTorch would get "
            "pointers it cannot use. Set SYMPOOL_DEVICE=cuda (or auto on a GPU machine) before "
            f"the first sympool call; the library says: {_lib.last_error() or 'no detail'}")


def _fn_addr(name):
    return ctypes.cast(getattr(_lib.lib(), name), ctypes.c_void_p).value


def _cache_dir():
    d = os.environ.get("SYMPOOL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "sympool")
    os.makedirs(d, exist_ok=True)
    return d


def _build_shim(src, tdir, abi, tmp):
    """Compile the shim into tmp, or raise RuntimeError with each standard's failure."""
    cxx = os.environ.get("CXX", "c++")
    # C++20 first: PyTorch moved c10 and cpp_extension to it (pytorch#177311, #176659), and
    # newer releases' headers stop an older standard with an #error; C++17 for a compiler
    # without C++20, which the torch releases before that move accept. When both fail, both
    # errors are shown: the C++17 one alone is often just that #error, hiding why C++20 failed.
    failures, r = [], None
    for std in ("-std=c++20", "-std=c++17"):
        cmd = [cxx, "-O2", std, "-shared", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi,
               "-I", os.path.join(tdir, "include"), src, "-o", tmp, "-L",
               os.path.join(tdir, "lib"), "-lc10", "-Wl,-rpath," + os.path.join(tdir, "lib")]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            failures.append("Command: %s\n%s" % (" ".join(cmd), e))
            r = None
            break
        if r.returncode == 0:
            break
        failures.append("Command: %s\n%s" % (" ".join(cmd),
                                              (r.stderr or r.stdout).strip()[-1500:]))
    if r is None or r.returncode != 0:
        raise RuntimeError(
            "sympool.torch.enable() needs a small C++ shim built against this torch, so that "
            "an out-of-memory reaches you as torch.OutOfMemoryError (PyTorch's pluggable "
            "allocator would otherwise use a NULL pointer and fault on an illegal address); "
            "building it failed. Install a C++ compiler (or set CXX), or use "
            "sympool.torch.mem_pool() instead.\n" + "\n".join(failures))


def _shim(torch):
    """The C++ shim (_torch_shim.cpp) built for this torch, loaded and pointed at the library.
    Built once per torch installation into $SYMPOOL_CACHE_DIR (default ~/.cache/sympool); ranks
    that build it at the same time each write their own file and rename it into place."""
    global _shim_lib
    if _shim_lib is not None:
        return _shim_lib
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_shim.cpp")
    tdir = os.path.dirname(os.path.abspath(torch.__file__))
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    with open(src, "rb") as f:
        key = hashlib.sha256(f.read() + repr((torch.__version__, tdir, abi)).encode()).hexdigest()
    out = os.path.join(_cache_dir(), "torch_shim-%s.so" % key[:16])
    if not os.path.exists(out):
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(out))
        os.close(fd)
        # Whatever ends the build (a failure, Ctrl-C while the compiler runs), the temporary
        # goes: it used to stay in the cache, one per interrupted run.
        try:
            _build_shim(src, tdir, abi, tmp)
            os.replace(tmp, out)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    shim = ctypes.CDLL(out)
    shim.sympool_shim_init.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2
    shim.sympool_shim_init(_fn_addr("sp_torch_malloc_status"), _fn_addr("sp_torch_free"),
                           _fn_addr("sp_record_stream"), _fn_addr("sp_last_error"),
                           _status("SP_ERR_OUT_OF_MEMORY"), _status("SP_ERR_INVALID_USAGE"))
    _shim_lib = shim
    return shim


def _status(name):
    # The status codes are an enum in sympool/status.h; its names are the stable part.
    return next(i for i in range(64) if _lib.status_name(i) == name)


def _shim_addr(shim, name):
    return ctypes.cast(getattr(shim, name), ctypes.c_void_p).value


def _torch_allocator(torch):
    """torch's allocator object for enable(): the shim's alloc, free and record_stream (which
    call the library the sympool package loaded, so sympool's Python functions see the same
    state; record_stream raises where sympool cannot record the use), empty_cache and memory
    fraction wired to the library, and the private-pool hooks to the shim, which refuses them."""
    global _allocator
    if _allocator is None:
        shim = _shim(torch)
        alloc = torch._C._cuda_customAllocator(_shim_addr(shim, "sympool_shim_malloc"),
                                               _shim_addr(shim, "sympool_shim_free"))
        missing = [n for n in ("set_record_stream_fn", "set_begin_allocate_to_pool",
                               "set_end_allocate_to_pool_fn", "set_release_pool")
                   if not hasattr(alloc, n)]
        if missing:
            raise RuntimeError(
                f"sympool.torch.enable(): torch {torch.__version__}'s pluggable allocator has no "
                f"{', '.join(missing)}: Tensor.record_stream and CUDA graphs could not be "
                "handled safely (needs torch >= 2.3); use sympool.torch.mem_pool() instead")
        alloc.set_record_stream_fn(_shim_addr(shim, "sympool_shim_record_stream"))
        alloc.set_reset_fn(_fn_addr("sp_torch_empty_cache"))
        if hasattr(alloc, "set_memory_fraction_fn"):
            alloc.set_memory_fraction_fn(_fn_addr("sp_torch_set_memory_fraction"))
        alloc.set_begin_allocate_to_pool(_shim_addr(shim, "sympool_shim_begin_allocate_to_pool"))
        alloc.set_end_allocate_to_pool_fn(_shim_addr(shim, "sympool_shim_end_allocate_to_pool"))
        alloc.set_release_pool(_shim_addr(shim, "sympool_shim_release_pool"))
        _allocator = alloc
    return _allocator


def _segment_allocator_for(torch):
    """torch's allocator object for mem_pool(): sympool's non-caching segment entry points
    (PyTorch caches inside the segments; a second cache would hide memory from empty_cache)."""
    global _segment_allocator
    if _segment_allocator is None:
        _segment_allocator = torch._C._cuda_customAllocator(_fn_addr("sp_torch_segment_malloc"),
                                                            _fn_addr("sp_torch_segment_free"))
    return _segment_allocator


class _Pluggable(object):
    """What change_current_allocator takes: an object whose allocator() is torch's allocator."""

    def __init__(self, alloc):
        self._allocator = alloc

    def allocator(self):
        return self._allocator


def enable():
    """Make sympool PyTorch's CUDA allocator for this process. Call it before anything touches
    CUDA (PyTorch cannot swap an allocator it has used)."""
    global _enabled
    if _enabled:
        return
    torch = _torch()
    if torch.cuda.is_initialized():
        raise RuntimeError("sympool.torch.enable(): CUDA is already initialized in this process; "
                           "call it before the first CUDA tensor, stream or device query")
    _check_backend()
    alloc = _torch_allocator(torch)
    torch.cuda.memory.change_current_allocator(_Pluggable(alloc))
    _enabled = True


def is_enabled():
    return _enabled


def mem_pool(**kw):
    """A torch.cuda.MemPool whose segments come from sympool's non-caching segment entry points
    (kw: MemPool's other arguments, such as use_on_oom). Use with torch.cuda.use_mem_pool(pool).
    Keep the pool no longer than this module (PyTorch before pytorch#171962 crashes at exit when
    a MemPool outlives its allocator): delete it, and the tensors from it, when done."""
    torch = _torch()
    if not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError(f"sympool.torch.mem_pool: torch {torch.__version__} has no "
                           "torch.cuda.MemPool (needs torch >= 2.5)")
    if "allocator" in kw:
        raise TypeError("mem_pool: the allocator is sympool's; do not pass allocator=")
    if _enabled:
        # torch.cuda.MemPool's constructor (aten/src/ATen/cuda/MemPool.cpp, MemPool::MemPool)
        # calls createOrIncrefPool on the current allocator, which after enable() is the
        # pluggable one: CUDAPluggableAllocator does not override it
        # (torch/csrc/cuda/CUDAPluggableAllocator.h @ 011c9ee) and the default in
        # c10/cuda/CUDACachingAllocator.h throws "pluggable does not yet support
        # createOrIncrefPool", whatever allocator the pool is given. Say why instead.
        raise RuntimeError(
            "sympool.torch.mem_pool(): sympool.torch.enable() made sympool PyTorch's allocator, "
            "and PyTorch's pluggable allocator cannot hold a torch.cuda.MemPool. Use one or the "
            "other: sympool.MemPool / sympool.use_mem_pool route allocations under enable()")
    _check_backend()
    return torch.cuda.MemPool(_segment_allocator_for(torch), **kw)


def memory_stats(device=None):
    """The 122 memory_stats keys: sympool's own when enable() made it the allocator (torch's
    memory_stats is not available through a pluggable allocator), else torch's."""
    torch = _torch()
    if _enabled:
        return _memory.memory_stats(_device_index(torch, device))
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    return torch.cuda.memory_stats(device)


def _device_index(torch, device):
    """The device index torch.cuda.memory_stats(device) reads: torch/cuda/memory.py
    (memory_stats_as_nested_dict) takes _get_device_index(device, optional=True), for which
    None, "cuda" and torch.device("cuda") are the current device (sympool's own as_device
    reads them as device 0, the C API's default)."""
    unindexed = device is None or device == "cuda" or (
        type(device).__name__ == "device" and getattr(device, "type", None) == "cuda"
        and getattr(device, "index", 0) is None)
    if unindexed:
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    return _lib.as_device(device)

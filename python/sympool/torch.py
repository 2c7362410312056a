"""sympool.torch: sympool under PyTorch. Imported only on request (`import sympool.torch`);
`import sympool` never imports torch.

Two modes:
- enable(): the whole process's CUDA allocations go to sympool's caching allocator
  (torch.cuda.memory.change_current_allocator with sympool's entry points). Must run before CUDA
  is initialized, on the cuda backend.
- mem_pool(**kw): one torch.cuda.MemPool whose segments come from sympool; the rest of the process
  stays on PyTorch's allocator.
memory_stats() reads the right statistics in either mode.

Not run in this repository's CI (no torch, no GPU there): the GPU validation runs it.
"""

import ctypes

from . import _lib
from . import memory as _memory

_enabled = False
_allocator = None  # the torch allocator object made for sympool (one per process)


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


def _torch_allocator(torch):
    """torch's allocator object over sympool's entry points, from the library already loaded
    (the same handle sympool's Python functions use, so they see the same state)."""
    global _allocator
    if _allocator is None:
        alloc = torch._C._cuda_customAllocator(_fn_addr("sp_torch_malloc"),
                                               _fn_addr("sp_torch_free"))
        # record_stream and empty_cache hooks, when this library and torch both have them.
        if _lib.has("sp_torch_record_stream") and hasattr(alloc, "set_record_stream_fn"):
            alloc.set_record_stream_fn(_fn_addr("sp_torch_record_stream"))
        if _lib.has("sp_torch_empty_cache") and hasattr(alloc, "set_reset_fn"):
            alloc.set_reset_fn(_fn_addr("sp_torch_empty_cache"))
        _allocator = alloc
    return _allocator


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
    """A torch.cuda.MemPool whose segments come from sympool (kw: MemPool's other arguments,
    such as use_on_oom). Use with torch.cuda.use_mem_pool(pool)."""
    torch = _torch()
    if not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError(f"sympool.torch.mem_pool: torch {torch.__version__} has no "
                           "torch.cuda.MemPool (needs torch >= 2.5)")
    if "allocator" in kw:
        raise TypeError("mem_pool: the allocator is sympool's; do not pass allocator=")
    _check_backend()
    return torch.cuda.MemPool(_torch_allocator(torch), **kw)


def memory_stats(device=None):
    """The 122 memory_stats keys: sympool's own when enable() made it the allocator (torch's
    memory_stats is not available through a pluggable allocator), else torch's."""
    torch = _torch()
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if _enabled:
        return _memory.memory_stats(device)
    return torch.cuda.memory_stats(device)

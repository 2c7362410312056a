"""_sympool_common.py: the start the Python examples share (ctypes_smoke.py, mempool.py,
pluggable_allocator.py), on the `sympool` package.

load_sympool() imports the package (from this checkout's python/ when it is not installed) with
the library at the script's first argument (it becomes $SYMPOOL_LIBRARY), else the package's own
lookup ($SYMPOOL_LIBRARY, next to the package, the loader's path). start() also checks for torch
and a CUDA GPU and wants the cuda backend: sympool must drive the GPU there, as its host backend
would hand PyTorch host pointers. Whatever is missing is printed with the script's name and ends
the script through Stop: exit 0 when torch, a GPU or a torch feature is missing (nothing to
show), 1 otherwise.
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class Stop(Exception):
    """The script cannot go on; main() returns .code (0: skipped, 1: failed)."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


def load_sympool(name):
    """(sympool, path, lib): the package, its library's absolute path and the loaded library (the
    package's declarations of the C entry points)."""
    if len(sys.argv) > 1:
        os.environ["SYMPOOL_LIBRARY"] = sys.argv[1]
    try:
        import sympool
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import sympool
    try:
        lib = sympool._lib.lib()
    except ImportError as e:
        print(f"{name}: {e}")
        raise Stop(1)
    return sympool, sympool.library_path(), lib


def start(name, torch_needs=()):
    """(torch, sympool, path, lib): torch with a visible GPU, the package, the absolute library
    path and the library, on sympool's cuda backend. torch_needs: (attribute of torch.cuda,
    why) pairs the script needs; a torch without one of them skips. Prints why and raises Stop
    otherwise."""
    try:
        import torch
    except ImportError:
        print(f"{name}: torch is not installed; nothing to do (skipped)")
        raise Stop(0)
    if not torch.cuda.is_available():
        print(f"{name}: no CUDA GPU is visible to torch; nothing to do (skipped)")
        raise Stop(0)
    for attr, why in torch_needs:
        if not hasattr(torch.cuda, attr):
            print(f"{name}: torch {torch.__version__} has no torch.cuda.{attr} ({why}); skipped")
            raise Stop(0)
    os.environ["SYMPOOL_DEVICE"] = "cuda"
    sympool, path, lib = load_sympool(name)
    if sympool.backend() != "cuda":
        print(f"{name}: sympool did not start its cuda backend: {lib.sp_last_error().decode()}")
        raise Stop(1)
    return torch, sympool, path, lib


def pluggable_allocator(torch, path, lib):
    """torch.cuda.memory.CUDAPluggableAllocator over libsympool.so with all four entry points:
    sp_torch_malloc/sp_torch_free, and sp_torch_record_stream / sp_torch_empty_cache wired with
    set_record_stream_fn / set_reset_fn, so Tensor.record_stream delays reuse and
    torch.cuda.empty_cache() reaches sympool. A torch without those setters still works, but
    record_stream is then dropped: that is printed."""
    import ctypes

    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "sp_torch_malloc", "sp_torch_free")
    native = allocator.allocator()
    for setter, symbol in (("set_record_stream_fn", "sp_torch_record_stream"),
                           ("set_reset_fn", "sp_torch_empty_cache")):
        fn = getattr(native, setter, None)
        if fn is None:
            print(f"  note: torch {torch.__version__} has no {setter}; {symbol} is not wired")
            continue
        fn(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
    return allocator

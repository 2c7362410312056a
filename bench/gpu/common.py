"""common.py: what the GPU check's Python steps share: finding libsympool.so and writing one
JSON result per step (scripts/gpu-check.sh collects them into one report)."""

import ctypes
import json
import os
import sys


def library():
    """libsympool.so from $SYMPOOL_LIBRARY, the variable the sympool package reads (gpu-check.sh
    sets it to its CUDA build)."""
    path = os.environ.get("SYMPOOL_LIBRARY")
    if not path or not os.path.exists(path):
        sys.exit(f"{sys.argv[0]}: set SYMPOOL_LIBRARY to libsympool.so (got {path!r})")
    return os.path.abspath(path)


def load(path):
    lib = ctypes.CDLL(path)
    lib.sp_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_void_p)]
    lib.sp_malloc.restype = ctypes.c_int
    lib.sp_free.argtypes = [ctypes.c_void_p]
    lib.sp_free.restype = ctypes.c_int
    lib.sp_stream_create.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.sp_stream_create.restype = ctypes.c_int
    lib.sp_backend_name.restype = ctypes.c_char_p
    lib.sp_last_error.restype = ctypes.c_char_p
    for name in ("sp_max_memory_reserved", "sp_memory_reserved", "sp_max_memory_allocated"):
        getattr(lib, name).argtypes = [ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_size_t
    return lib


def write(result, path=None):
    """Print the result and write it to --out (the last argument after --out)."""
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if "--out" in sys.argv:
        out = sys.argv[sys.argv.index("--out") + 1]
        with open(out, "w") as f:
            f.write(text + "\n")

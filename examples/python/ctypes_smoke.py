#!/usr/bin/env python3
"""ctypes_smoke.py: call libsympool.so the way PyTorch's CUDAPluggableAllocator does, without torch.

PyTorch resolves "sp_torch_malloc" and "sp_torch_free" in the shared library and calls them as
    void *alloc(size_t size, int device, cudaStream_t stream)
    void  free(void *ptr, size_t size, int device, cudaStream_t stream)
This script does the same through ctypes on the host backend (no GPU, no torch needed). On the
host backend the entry points refuse (NULL and a message: PyTorch would take host memory for
device memory), so the script checks that refusal, that all four entry points are exported
(sp_torch_record_stream and sp_torch_empty_cache too), and runs the rest through sp_malloc /
sp_free, which the entry points wrap: an allocation shows up in sp_memory_stats with PyTorch's
rounding, a free returns it, sp_mempool_begin routes it into a MemPool, failures leave a message.

    SYMPOOL_DEVICE=host python3 ctypes_smoke.py [path/to/libsympool.so]

Registered as a CTest (tests/cmake/python.cmake). Exits 0 on success, 1 with a message otherwise.
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sympool_ctypes as spc  # noqa: E402

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def main():
    path = spc.find_library(sys.argv[1] if len(sys.argv) > 1 else None)
    if not path:
        print("ctypes_smoke: libsympool.so not found; pass its path or set SYMPOOL_LIB")
        return 1
    os.environ.setdefault("SYMPOOL_DEVICE", "host")
    lib = spc.load(path)
    backend = lib.sp_backend_name().decode()
    print(f"ctypes_smoke: {path}, backend {backend}, {lib.sp_device_count()} device(s)")
    if backend != "host":
        print("ctypes_smoke: this script checks the host backend; set SYMPOOL_DEVICE=host")
        return 1

    keys = [lib.sp_stats_key(i).decode() for i in range(lib.sp_stats_count())]
    expect(len(keys) == 122, f"122 stats keys, got {len(keys)}")
    expect(keys == sorted(keys), "stats keys are sorted as PyTorch sorts them")
    expect("allocated_bytes.all.current" in keys, "allocated_bytes.all.current is a key")

    # The PyTorch entry points refuse the host backend: NULL with a message, nothing allocated.
    for name in ("sp_torch_record_stream", "sp_torch_empty_cache"):
        expect(hasattr(lib, name), f"{name} is exported")
    lib.sp_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.sp_torch_record_stream.restype = None
    lib.sp_torch_empty_cache.restype = None
    print("ctypes_smoke: sp_torch_malloc must refuse the host backend; the WARN below is expected")
    expect(lib.sp_torch_malloc(1000, 0, None) is None, "sp_torch_malloc refuses the host backend")
    expect("host" in lib.sp_last_error().decode(), "the refusal names the host backend")

    # What the entry points wrap: sp_malloc / sp_free on the default stream (NULL).
    lib.sp_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_void_p)]
    lib.sp_malloc.restype = ctypes.c_int
    lib.sp_free.argtypes = [ctypes.c_void_p]
    lib.sp_free.restype = ctypes.c_int

    def sp_malloc(size, device=0):
        out = ctypes.c_void_p()
        status = lib.sp_malloc(size, device, None, ctypes.byref(out))
        return out.value if status == 0 else None

    def sp_free(ptr, size=0, device=0, stream=None):
        spc.check(lib, lib.sp_free(ptr), "sp_free")

    p = sp_malloc(1000)
    expect(p is not None, f"sp_malloc(1000) -> {p}: {lib.sp_last_error().decode()}")
    st = spc.stats(lib)
    expect(st["allocated_bytes.all.current"] == 1024, f"1000 B rounds to 1024: {st['allocated_bytes.all.current']}")
    expect(st["requested_bytes.all.current"] == 1000, "requested_bytes counts the request")
    expect(st["segment.all.current"] == 1, "one 2 MiB segment")
    expect(st["reserved_bytes.all.current"] == 2 << 20, "reserved 2 MiB")
    ctypes.memset(p, 0x5A, 1000)  # the host backend's memory is ordinary host memory
    sp_free(p)
    st = spc.stats(lib)
    expect(st["allocation.all.current"] == 0, "the free returned the block")
    expect(st["reserved_bytes.all.current"] == 2 << 20, "the segment stays cached")

    # torch.cuda.use_mem_pool over sympool: begin/end on this thread routes the entry point.
    pool = spc.create_pool(lib, "ctypes-pool")
    pid = lib.sp_mempool_id(pool)
    expect(pid.first == 0 and pid.second >= 1, f"user pool id is {{0,n}}: {{{pid.first},{pid.second}}}")
    expect(lib.sp_mempool_use_count(pool) == 1, "use count 1 after create")
    spc.check(lib, lib.sp_mempool_begin(pool), "sp_mempool_begin")
    expect(lib.sp_mempool_use_count(pool) == 2, "use count 2 inside begin")
    q = sp_malloc(3000)
    spc.check(lib, lib.sp_mempool_end(pool), "sp_mempool_end")
    expect(q is not None, "routed sp_malloc")
    expect(lib.sp_mempool_used_bytes(pool) == 3072, f"pool used 3072: {lib.sp_mempool_used_bytes(pool)}")
    default = lib.sp_default_mempool(0)
    expect(lib.sp_mempool_used_bytes(default) == 0, "default pool untouched")
    sp_free(q)
    expect(lib.sp_mempool_used_bytes(pool) == 0, "block back in its pool")
    expect(lib.sp_mempool_n_free_blocks(pool) == 1, "one free block in the pool")
    spc.check(lib, lib.sp_mempool_destroy(pool), "sp_mempool_destroy")

    # A segment allocator written in Python (sp_allocator_t through ctypes callbacks): the pool
    # asks it for PyTorch's segment sizes and hands each segment back with the same size.
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    calls = {"alloc": [], "free": []}

    def seg_alloc(size, device, stream, ctx):
        ptr = libc.aligned_alloc(4096, size)
        calls["alloc"].append((ptr, size, device))
        return ptr

    def seg_free(ptr, size, device, stream, ctx):
        calls["free"].append((ptr, size, device))
        libc.free(ptr)

    segs = spc.Allocator(spc.ALLOC_FN(seg_alloc), spc.FREE_FN(seg_free), None)
    ppool = spc.create_pool(lib, "python-segments", allocator=segs)
    spc.check(lib, lib.sp_mempool_begin(ppool), "sp_mempool_begin")
    small = sp_malloc(100_000)
    huge = sp_malloc((11 << 20) + 1)  # fills a 12 MiB segment exactly
    large = sp_malloc(3 << 20)
    spc.check(lib, lib.sp_mempool_end(ppool), "sp_mempool_end")
    sizes = [c[1] for c in calls["alloc"]]
    expect(sizes == [2 << 20, 12 << 20, 20 << 20], f"segment sizes 2, 12, 20 MiB: {sizes}")
    for ptr, size in ((small, 100_000), (large, 3 << 20), (huge, (11 << 20) + 1)):
        sp_free(ptr)
    expect(calls["free"] == [], "freed blocks stay cached in the pool")
    spc.check(lib, lib.sp_mempool_destroy(ppool), "sp_mempool_destroy")
    expect(sorted(calls["free"]) == sorted(calls["alloc"]),
           "destroy hands every segment back with its size and device")

    # Size 0 is NULL without an error; a failure is NULL with a message (and one WARN line).
    expect(lib.sp_torch_malloc(0, 0, None) is None, "size 0 gives NULL")
    print("ctypes_smoke: an unknown device must fail; the WARN line below is expected")
    bad = sp_malloc(4096, 99)
    expect(bad is None, "device 99 gives NULL")
    expect(lib.sp_last_error().decode() != "", "the failure left a message in sp_last_error")

    lib.sp_torch_empty_cache()  # what torch.cuda.empty_cache() calls through set_reset_fn
    expect(lib.sp_memory_reserved(0) == 0, "sp_torch_empty_cache released everything")
    spc.check(lib, lib.sp_shutdown(), "sp_shutdown")

    if failures:
        print(f"ctypes_smoke: {len(failures)} check(s) failed")
        return 1
    print("ctypes_smoke: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

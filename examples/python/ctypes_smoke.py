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

The library is the `sympool` package's (its first argument becomes $SYMPOOL_LIBRARY, else the
package's own lookup); the raw entry points are called through the package's declarations
(sympool._lib.lib()), the pools and statistics through the package's API.

Registered as a CTest (tests/cmake/python.cmake). Exits 0 on success, 1 with a message otherwise.
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sympool_common as common  # noqa: E402

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def main():
    os.environ.setdefault("SYMPOOL_DEVICE", "host")
    try:
        sympool, path, lib = common.load_sympool("ctypes_smoke")
    except common.Stop as stop:
        return stop.code
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
    print("ctypes_smoke: sp_torch_malloc must refuse the host backend; the WARN below is expected")
    expect(lib.sp_torch_malloc(1000, 0, None) is None, "sp_torch_malloc refuses the host backend")
    expect("host" in lib.sp_last_error().decode(), "the refusal names the host backend")

    # What the entry points wrap: sp_malloc / sp_free on the default stream (NULL).
    def sp_malloc(size, device=0):
        out = ctypes.c_void_p()
        status = lib.sp_malloc(size, device, None, ctypes.byref(out))
        return out.value if status == 0 else None

    def sp_free(ptr, size=0, device=0, stream=None):
        sympool._lib.check(lib.sp_free(ptr))

    p = sp_malloc(1000)
    expect(p is not None, f"sp_malloc(1000) -> {p}: {lib.sp_last_error().decode()}")
    st = sympool.memory_stats()
    expect(st["allocated_bytes.all.current"] == 1024, f"1000 B rounds to 1024: {st['allocated_bytes.all.current']}")
    expect(st["requested_bytes.all.current"] == 1000, "requested_bytes counts the request")
    expect(st["segment.all.current"] == 1, "one 2 MiB segment")
    expect(st["reserved_bytes.all.current"] == 2 << 20, "reserved 2 MiB")
    ctypes.memset(p, 0x5A, 1000)  # the host backend's memory is ordinary host memory
    sp_free(p)
    st = sympool.memory_stats()
    expect(st["allocation.all.current"] == 0, "the free returned the block")
    expect(st["reserved_bytes.all.current"] == 2 << 20, "the segment stays cached")

    # torch.cuda.use_mem_pool over sympool: begin/end on this thread routes the entry point.
    pool = sympool.MemPool(name="ctypes-pool")
    first, second = pool.id
    expect(first == 0 and second >= 1, f"user pool id is (0, n): {pool.id}")
    expect(pool.use_count() == 1, "use count 1 after create")
    with sympool.use_mem_pool(pool):  # sp_mempool_begin / sp_mempool_end
        expect(pool.use_count() == 2, "use count 2 inside begin")
        q = sp_malloc(3000)
    expect(q is not None, "routed sp_malloc")
    expect(pool.used_bytes() == 3072, f"pool used 3072: {pool.used_bytes()}")
    expect(sympool.get_default_memory_pool(0).used_bytes() == 0, "default pool untouched")
    sp_free(q)
    expect(pool.used_bytes() == 0, "block back in its pool")
    expect(pool.n_free_blocks() == 1, "one free block in the pool")
    pool.destroy()

    # A segment allocator written in Python (sp_allocator_t through ctypes callbacks): the pool
    # asks it for PyTorch's segment sizes and hands each segment back with the same size.
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    calls = {"alloc": [], "free": []}

    def seg_alloc(size, device, stream):
        ptr = libc.aligned_alloc(4096, size)
        calls["alloc"].append((ptr, size, device))
        return ptr

    def seg_free(ptr, size, device, stream):
        calls["free"].append((ptr, size, device))
        libc.free(ptr)

    ppool = sympool.MemPool((seg_alloc, seg_free), name="python-segments")
    with sympool.use_mem_pool(ppool):
        small = sp_malloc(100_000)
        huge = sp_malloc((11 << 20) + 1)  # fills a 12 MiB segment exactly
        large = sp_malloc(3 << 20)
    sizes = [c[1] for c in calls["alloc"]]
    expect(sizes == [2 << 20, 12 << 20, 20 << 20], f"segment sizes 2, 12, 20 MiB: {sizes}")
    for ptr, size in ((small, 100_000), (large, 3 << 20), (huge, (11 << 20) + 1)):
        sp_free(ptr)
    expect(calls["free"] == [], "freed blocks stay cached in the pool")
    ppool.destroy()
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
    lib.sp_shutdown.restype = ctypes.c_int  # the package never shuts the library down itself
    sympool._lib.check(lib.sp_shutdown())

    if failures:
        print(f"ctypes_smoke: {len(failures)} check(s) failed")
        return 1
    print("ctypes_smoke: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""mempool.py: a torch.cuda.MemPool whose segments come from sympool, PyTorch's allocator unchanged.

    python3 mempool.py [path/to/libsympool.so]

This is how PyTorch uses ProcessGroupNCCL.mem_allocator: the process keeps PyTorch's own caching
allocator, and one MemPool takes its *segments* from a pluggable allocator:

    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib, "sp_torch_malloc", "sp_torch_free")
    pool = torch.cuda.MemPool(allocator.allocator())
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(...)          # PyTorch asks sp_torch_malloc for a 2 / 20 MiB segment

PyTorch still splits, caches and frees blocks inside those segments; sympool sees one allocation
per PyTorch segment (and, being a caching allocator itself, rounds it by the same rules). When
the MemPool dies and the cache is emptied, PyTorch hands the segments back through sp_torch_free.

Exits 0 with a message when torch or a CUDA GPU is missing; 1 when a check fails.
"""

import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sympool_common as common  # noqa: E402

MiB = 1 << 20


def main():
    try:
        torch, sympool, path, lib = common.start("mempool", torch_needs=[("MemPool", "needs 2.5+")])
    except common.Stop as stop:
        return stop.code

    dev = torch.cuda.current_device()
    allocator = common.pluggable_allocator(torch, path, lib)  # + record_stream, empty_cache
    pool = torch.cuda.MemPool(allocator.allocator())
    print(f"mempool: torch {torch.__version__}, {torch.cuda.get_device_name(dev)}, pool id {pool.id}, "
          f"use_count {pool.use_count()}")

    ok = True
    with torch.cuda.use_mem_pool(pool):
        print(f"  inside use_mem_pool: use_count {pool.use_count()}")
        small = torch.empty(100_000, dtype=torch.uint8, device="cuda")  # a 2 MiB PyTorch segment
        large = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")  # a 20 MiB PyTorch segment
    outside = torch.empty(100_000, dtype=torch.uint8, device="cuda")  # PyTorch's default pool

    segs = pool.snapshot()
    sizes = sorted(s["total_size"] for s in segs)
    st = sympool.memory_stats(dev)
    print(f"  PyTorch's pool segments: {sizes}")
    print(f"  sympool: {st['allocation.all.current']} live allocations, "
          f"{st['requested_bytes.all.current']} B requested by PyTorch, "
          f"{st['reserved_bytes.all.current']} B reserved on the GPU")
    if sizes != [2 * MiB, 20 * MiB]:
        print("  FAIL: expected one 2 MiB and one 20 MiB segment in the pool")
        ok = False
    if st["requested_bytes.all.current"] != sum(sizes):
        print("  FAIL: sympool should hold exactly the pool's segments")
        ok = False

    small.fill_(1)
    large.fill_(2)
    torch.cuda.synchronize()
    del small, large, outside
    gc.collect()
    del pool
    gc.collect()
    torch.cuda.empty_cache()  # releases the dead pool's segments through sp_torch_free
    torch.cuda.synchronize()
    st = sympool.memory_stats(dev)
    print(f"  after the pool is gone and empty_cache: sympool holds {st['allocation.all.current']} "
          f"allocations")
    if st["allocation.all.current"] != 0:
        print("  FAIL: PyTorch did not hand the segments back")
        ok = False
    sympool.empty_cache()
    print("mempool: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

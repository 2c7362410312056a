#!/usr/bin/env python3
"""pluggable_allocator.py: make sympool PyTorch's CUDA allocator for the whole process.

    python3 pluggable_allocator.py [path/to/libsympool.so]

1. torch.cuda.memory.CUDAPluggableAllocator(lib, "sp_torch_malloc", "sp_torch_free") and
   torch.cuda.memory.change_current_allocator(...): every CUDA tensor now comes from sympool's
   caching allocator (PyTorch's semantics: rounding, 2/20 MiB segments, per-stream reuse).
2. sympool's own statistics (sp_memory_stats, the same 122 keys as torch.cuda.memory_stats) are
   read through ctypes from the same library handle.
3. sympool MemPools under PyTorch: between sp_mempool_begin(pool) and sp_mempool_end(pool) the
   tensors this thread allocates land in that pool (the pluggable layer calls sp_torch_malloc on
   the allocating thread), and freed, they return to it.

Exits 0 with a message when torch or a CUDA GPU is missing; 1 when a check fails.
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sympool_common as common  # noqa: E402

MiB = 1 << 20


def main():
    try:
        torch, sympool, path, lib = common.start("pluggable_allocator")
    except common.Stop as stop:
        return stop.code

    # Must come before the first CUDA allocation of the process.
    allocator = common.pluggable_allocator(torch, path, lib)  # + record_stream, empty_cache
    torch.cuda.memory.change_current_allocator(allocator)
    dev = torch.cuda.current_device()
    print(f"pluggable_allocator: torch {torch.__version__}, {torch.cuda.get_device_name(dev)}, "
          f"sympool at {path}")

    ok = True
    x = torch.randn(1024, 1024, device="cuda")  # 4 MiB: a large block in a 20 MiB segment
    y = x @ x
    torch.cuda.synchronize()
    st = sympool.memory_stats(dev)
    print(f"  after x, y = x @ x: allocated {st['allocated_bytes.all.current']} B in "
          f"{st['allocation.all.current']} blocks, reserved {st['reserved_bytes.all.current']} B "
          f"in {st['segment.all.current']} segments")
    if st["allocated_bytes.all.current"] < 2 * 4 * MiB:
        print("  FAIL: the two 4 MiB tensors are not in sympool's statistics")
        ok = False
    check = float((y - x @ x).abs().max())
    print(f"  matmul through sympool memory: max |difference| = {check}")
    del x, y
    torch.cuda.synchronize()
    st = sympool.memory_stats(dev)
    print(f"  after del: allocated {st['allocated_bytes.all.current']} B, reserved "
          f"{st['reserved_bytes.all.current']} B (cached, as PyTorch caches)")

    # A sympool MemPool receives this thread's tensors between begin and end.
    pool = sympool.MemPool(name="torch-activations", device=dev)
    with sympool.use_mem_pool(pool):
        acts = [torch.empty(3 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]
    used = pool.used_bytes()
    print(f"  sympool pool 'torch-activations': used {used} B, total "
          f"{pool.total_bytes()} B, use count {pool.use_count()}")
    if used != 4 * 3 * MiB:
        print(f"  FAIL: expected {4 * 3 * MiB} B in the pool")
        ok = False
    del acts
    torch.cuda.synchronize()
    print(f"  after del: pool used {pool.used_bytes()} B, "
          f"{pool.n_free_blocks()} free block(s)")
    pool.destroy()
    torch.cuda.empty_cache()  # PyTorch's pluggable layer has no cache of its own
    sympool.empty_cache()
    print(f"  after empty_cache: reserved {sympool.memory_reserved(dev)} B")
    print("pluggable_allocator: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

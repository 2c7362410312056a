#!/usr/bin/env python3
"""gpu_torch_check.py: what only a GPU with PyTorch can decide about sympool.torch, in two
processes of its own (enable() and mem_pool() cannot share one: the first changes PyTorch's
allocator for good, the second initializes CUDA).

    SYMPOOL_LIBRARY=build/libsympool.so python3 tests/torch_shim/gpu_torch_check.py

Prints PASS/FAIL per check; exit 1 if any failed, 0 with "skipped" without torch or a GPU. Not a
CTest (no torch, no GPU in CI): the GPU session runs it. One line per check says what it expects
and where that comes from.
"""

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MiB = 1 << 20
failed = []


def check(name, fn):
    try:
        fn()
        print(f"PASS {name}", flush=True)
    except Exception as e:  # noqa: BLE001 (every failure is reported, none stops the run)
        failed.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)


def expect_raises(exc, fn, text=None):
    try:
        fn()
    except exc as e:
        if text is not None and text not in str(e):
            raise AssertionError(f"{exc.__name__} without {text!r}: {e}") from None
        return e
    raise AssertionError(f"no {exc.__name__}")


def enable_mode(torch, sympool, st):
    os.environ.setdefault("SYMPOOL_DEVICE", "cuda")
    check("enable: shim builds against this torch's headers and enable() succeeds", st.enable)
    if not st.is_enabled():
        return
    dev = torch.cuda.current_device()

    def alloc_counts():
        x = torch.randn(MiB, device="cuda")  # 4 MiB
        assert st.memory_stats()["allocated_bytes.all.current"] >= 4 * MiB
        del x
    check("enable: tensors come from sympool (its memory_stats count them)", alloc_counts)

    def oom():
        free, total = torch.cuda.mem_get_info()
        # CUDAPluggableAllocator::malloc keeps what alloc returns: only the shim's throw makes
        # this torch.OutOfMemoryError (c10::OutOfMemoryError crossing libc10's typeinfo).
        expect_raises(torch.OutOfMemoryError,
                      lambda: torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda"),
                      "CUDA out of memory in sympool")
        y = torch.ones(16, device="cuda")
        assert float(y.sum()) == 16.0
    check("enable: OOM is torch.OutOfMemoryError and the process goes on", oom)

    def graph():
        g = torch.cuda.CUDAGraph()
        before = torch.cuda.current_stream()
        # CUDAGraph::capture_begin calls beginAllocateToPool before cudaStreamBeginCapture.
        expect_raises(RuntimeError, lambda: torch.cuda.graph(g).__enter__(),
                      "does not give CUDA graphs")
        left_on = torch.cuda.current_stream()
        torch.cuda.set_stream(before)
        assert not torch.cuda.is_current_stream_capturing()
        # Documented: torch/cuda/graphs.py enters the capture stream before capture_begin.
        print(f"  note: after the refused capture the current stream was "
              f"{'the capture stream' if left_on != before else 'unchanged'}")
    check("enable: graph capture refused when it begins, no capture left open", graph)

    check("enable: torch.cuda.MemPool() refused (no createOrIncrefPool)",
          lambda: expect_raises(RuntimeError, torch.cuda.MemPool, "createOrIncrefPool"))

    def record_stream():
        s = torch.cuda.Stream()
        x = torch.empty(MiB, device="cuda")
        x.record_stream(s)  # recorded
        # cudaStreamPerThread ((cudaStream_t)0x2): sympool refuses it, the shim raises.
        expect_raises(RuntimeError, lambda: x.record_stream(torch.cuda.ExternalStream(2)),
                      "cannot keep the block")
    check("enable: record_stream records, and raises where sympool cannot", record_stream)

    def empty_cache():
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del x
        before = sympool.memory_reserved(dev)
        torch.cuda.empty_cache()  # set_reset_fn -> sp_torch_empty_cache
        after = sympool.memory_reserved(dev)
        assert after <= before - 64 * MiB, (before, after)
    check("enable: torch.cuda.empty_cache() empties sympool's cache", empty_cache)

    def fraction():
        torch.cuda.set_per_process_memory_fraction(0.25, dev)  # set_memory_fraction_fn
        assert abs(sympool.get_per_process_memory_fraction(dev) - 0.25) < 1e-9
        total = torch.cuda.get_device_properties(dev).total_memory
        expect_raises(torch.OutOfMemoryError,
                      lambda: torch.empty(total // 2, dtype=torch.uint8, device="cuda"))
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
    check("enable: set_per_process_memory_fraction caps sympool", fraction)

    def stats_raise():
        # CUDAPluggableAllocator::getDeviceStats: "does not yet support getDeviceStats".
        expect_raises(RuntimeError, torch.cuda.memory_allocated, "does not yet support")
    check("enable: torch.cuda.memory_allocated raises, as documented", stats_raise)


def mempool_mode(torch, sympool, st):
    os.environ.setdefault("SYMPOOL_DEVICE", "cuda")
    pool = st.mem_pool()
    base = torch.cuda.memory_reserved()

    def routed():
        with torch.cuda.use_mem_pool(pool):
            x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        assert torch.cuda.memory_reserved() >= base + 64 * MiB
        del x
        torch.cuda.empty_cache()
        # release_cached_blocks frees only the default pools and pools no MemPool holds.
        assert torch.cuda.memory_reserved() >= base + 64 * MiB, "a live pool's cache was freed"
    check("mem_pool: allocations land in the pool; empty_cache keeps a live pool's cache", routed)

    def capture():
        x = torch.ones(MiB, device="cuda")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = x * 2  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g, pool=pool.id):
            y = x * 3  # a segment from sp_torch_segment_malloc while capturing (relaxed mode)
        g.replay()
        torch.cuda.synchronize()
        assert float(y[0]) == 3.0
        del g, y
    check("mem_pool: graph capture into the pool, replayed", capture)

    def oom():
        total = torch.cuda.get_device_properties(0).total_memory
        with torch.cuda.use_mem_pool(pool):
            expect_raises(torch.OutOfMemoryError,
                          lambda: torch.empty(total + (1 << 30), dtype=torch.uint8,
                                              device="cuda"))
    check("mem_pool: OOM in the pool is torch.OutOfMemoryError", oom)

    def delete():
        nonlocal pool
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        pool = None  # ~MemPool: releasePool, then emptyCache(its id)
        torch.cuda.empty_cache()
        after = torch.cuda.memory_reserved()
        assert after <= before - 64 * MiB, (before, after)
    check("mem_pool: deleting the pool gives its segments back", delete)


def main():
    try:
        import torch
    except ImportError:
        print("gpu_torch_check: torch is not installed (skipped)")
        return 0
    if not torch.cuda.is_available():
        print("gpu_torch_check: no CUDA GPU visible to torch (skipped)")
        return 0
    if len(sys.argv) < 2:
        rc = 0
        for mode in ("enable", "mempool"):
            print(f"== {mode} (torch {torch.__version__})", flush=True)
            rc |= subprocess.call([sys.executable, os.path.abspath(__file__), mode])
        return rc
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import sympool
    import sympool.torch as st
    {"enable": enable_mode, "mempool": mempool_mode}[sys.argv[1]](torch, sympool, st)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

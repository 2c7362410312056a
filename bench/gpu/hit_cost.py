#!/usr/bin/env python3
"""hit_cost.py --out FILE: the cost of a cached malloc+free pair (the allocator's hit path) on
the GPU, each loop in C++ (a small extension built with torch.utils.cpp_extension), so no Python
runs per call:

  sympool          sp_malloc + sp_free on the default stream (cuda backend, dlopen'ed)
  c10              c10::cuda::CUDACachingAllocator::raw_alloc + raw_delete (PyTorch's allocator)
  cudaMallocAsync  cudaMallocAsync + cudaFreeAsync on a stream, the device's default pool with
                   its release threshold at UINT64_MAX (a retaining pool)

and CuPy's MemoryPool (malloc + release of the MemoryPointer), whose API is Python only: its loop
is Python, so the Python cost of an empty call loop is reported beside it. Each figure is the
median of 5 runs of N pairs after a warm-up, in nanoseconds per pair."""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SIZES = [512, 1 << 20, 16 << 20]
N = 200_000
RUNS = 5

CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

static double now_ns() {
  return (double)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}

double c10_pair_ns(int64_t size, int64_t n) {
  void* p = c10::cuda::CUDACachingAllocator::raw_alloc(size);
  c10::cuda::CUDACachingAllocator::raw_delete(p);
  double t0 = now_ns();
  for (int64_t i = 0; i < n; i++) {
    p = c10::cuda::CUDACachingAllocator::raw_alloc(size);
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  }
  return (now_ns() - t0) / (double)n;
}

typedef int (*sp_malloc_t)(size_t, int, void*, void**);
typedef int (*sp_free_t)(void*);

double sympool_pair_ns(const std::string& lib, int64_t size, int64_t n) {
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) throw std::runtime_error(std::string("dlopen: ") + dlerror());
  auto m = (sp_malloc_t)dlsym(h, "sp_malloc");
  auto f = (sp_free_t)dlsym(h, "sp_free");
  if (!m || !f) throw std::runtime_error("sp_malloc/sp_free not exported");
  void* p = nullptr;
  if (m((size_t)size, 0, nullptr, &p) != 0) throw std::runtime_error("sp_malloc failed");
  f(p);
  double t0 = now_ns();
  for (int64_t i = 0; i < n; i++) {
    m((size_t)size, 0, nullptr, &p);
    f(p);
  }
  return (now_ns() - t0) / (double)n;
}

double async_pair_ns(int64_t size, int64_t n) {
  int dev = 0;
  cudaGetDevice(&dev);
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess)
    throw std::runtime_error("cudaDeviceGetDefaultMemPool");
  uint64_t keep = UINT64_MAX;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  void* p = nullptr;
  if (cudaMallocAsync(&p, size, s) != cudaSuccess) throw std::runtime_error("cudaMallocAsync");
  cudaFreeAsync(p, s);
  cudaStreamSynchronize(s);
  double t0 = now_ns();
  for (int64_t i = 0; i < n; i++) {
    cudaMallocAsync(&p, size, s);
    cudaFreeAsync(p, s);
  }
  double t = (now_ns() - t0) / (double)n;
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  return t;
}
"""


def median_of(fn):
    return statistics.median(fn() for _ in range(RUNS))


def main():
    os.environ["SYMPOOL_DEVICE"] = "cuda"
    lib = common.library()
    import torch
    from torch.utils.cpp_extension import load_inline

    torch.cuda.init()
    ext = load_inline("sympool_hit_cost", cpp_sources=[CPP],
                      functions=["c10_pair_ns", "sympool_pair_ns", "async_pair_ns"],
                      with_cuda=True, extra_cflags=["-O2"], extra_ldflags=["-ldl"],
                      verbose=False)
    res = {"pairs_per_run": N, "runs": RUNS, "ns_per_pair": {}}
    for size in SIZES:
        row = {
            "sympool": median_of(lambda: ext.sympool_pair_ns(lib, size, N)),
            "c10_raw_alloc": median_of(lambda: ext.c10_pair_ns(size, N)),
            "cudaMallocAsync_retaining": median_of(lambda: ext.async_pair_ns(size, N)),
        }
        try:
            import cupy

            pool = cupy.cuda.MemoryPool()
            n = N // 10

            def cupy_loop():
                mem = pool.malloc(size)
                del mem
                t0 = time.perf_counter_ns()
                for _ in range(n):
                    mem = pool.malloc(size)
                    del mem
                return (time.perf_counter_ns() - t0) / n

            def python_loop():
                f = int
                t0 = time.perf_counter_ns()
                for _ in range(n):
                    mem = f(size)
                    del mem
                return (time.perf_counter_ns() - t0) / n

            row["cupy_MemoryPool_python_loop"] = median_of(cupy_loop)
            row["python_empty_loop"] = median_of(python_loop)
        except ImportError:
            row["cupy_MemoryPool_python_loop"] = None
        res["ns_per_pair"][str(size)] = row
    common.write(res)


if __name__ == "__main__":
    main()

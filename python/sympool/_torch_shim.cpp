// _torch_shim.cpp: the allocator functions sympool.torch.enable() gives PyTorch, built at first
// use against the running torch (sympool/torch.py, _shim()) and linked to its libc10.
//
// Why C++: torch.cuda.memory.change_current_allocator's CUDAPluggableAllocator keeps whatever its
// alloc function returns, NULL included, and hands it to the tensor, so a C function cannot
// report an out-of-memory: the first kernel then faults on an illegal address. Thrown from here,
// c10::OutOfMemoryError crosses PyTorch's C++ frames (which hold no lock across the call) and
// reaches Python as torch.OutOfMemoryError, as PyTorch's own allocator's does. The same goes for
// CUDA graphs and torch.cuda.use_mem_pool: their private pools are begun through
// beginAllocateToPool, which sympool does not implement, and refusing there by an exception is the
// only way to stop the capture before memory is handed out wrongly.
//
// Everything else stays in libsympool.so: this file only translates statuses into exceptions.
#include <c10/util/Exception.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>

struct CUstream_st;

namespace {

using stream_t = CUstream_st *;
// PyTorch's c10::cuda::MempoolId_t (a pair of CaptureId_t, unsigned long long).
using pool_id_t = std::pair<unsigned long long, unsigned long long>;
using malloc_status_fn = int (*)(size_t, int, void *, void **);
using free_fn = void (*)(void *, size_t, int, void *);
using record_stream_fn = int (*)(void *, void *);
using last_error_fn = const char *(*)();

malloc_status_fn g_malloc;
free_fn g_free;
record_stream_fn g_record_stream;
last_error_fn g_last_error;
int g_oom_status = -1;
int g_usage_status = -1;

std::string last_error() {
    const char *e = g_last_error ? g_last_error() : nullptr;
    return e && *e ? std::string(e) : std::string("no detail from sympool");
}

} // namespace

extern "C" {

// The library's entry points (passed from Python, so that the shim uses the very library the
// sympool package loaded: sp_torch_malloc_status, sp_torch_free, sp_record_stream, sp_last_error)
// and its SP_ERR_OUT_OF_MEMORY and SP_ERR_INVALID_USAGE values.
void sympool_shim_init(void *malloc_status, void *free, void *record_stream, void *last_error_text,
                       int oom_status, int usage_status) {
    g_malloc = reinterpret_cast<malloc_status_fn>(malloc_status);
    g_free = reinterpret_cast<free_fn>(free);
    g_record_stream = reinterpret_cast<record_stream_fn>(record_stream);
    g_last_error = reinterpret_cast<last_error_fn>(last_error_text);
    g_oom_status = oom_status;
    g_usage_status = usage_status;
}

void *sympool_shim_malloc(size_t size, int device, stream_t stream) {
    TORCH_CHECK(g_malloc != nullptr, "sympool's torch shim was not initialized");
    void *ptr = nullptr;
    int s = g_malloc(size, device, stream, &ptr);
    if (s == 0)
        return ptr;
    TORCH_CHECK_WITH(OutOfMemoryError, s != g_oom_status,
                     "CUDA out of memory in sympool: tried to "
                     "allocate ",
                     size, " bytes on device ", device, ". sympool says: ", last_error(),
                     " (sympool.torch.memory_stats() and "
                     "sympool.memory_summary() show what it holds)");
    TORCH_CHECK(false, "sympool could not allocate ", size, " bytes on device ", device, ": ",
                last_error());
    return nullptr;
}

void sympool_shim_free(void *ptr, size_t size, int device, stream_t stream) {
    g_free(ptr, size, device, stream);
}

// Tensor.record_stream (CUDAPluggableAllocator::recordStream hands over the storage's pointer and
// the stream). A pointer sympool does not hold is skipped, as PyTorch's own allocator skips one it
// did not allocate (from_blob, IPC); NULL is an empty tensor's storage. Any other refusal (a
// stream on another device than the block's, cudaStreamPerThread, no host memory) would leave the
// block reusable while that stream may still use it, which PyTorch's own allocator would not (its
// insert_events, c10/cuda/CUDACachingAllocator.cpp, records each use's event on that stream's own
// device): Tensor.record_stream raises instead of returning as if the use were recorded.
void sympool_shim_record_stream(void *ptr, stream_t stream) {
    if (ptr == nullptr)
        return;
    TORCH_CHECK(g_record_stream != nullptr, "sympool's torch shim was not initialized");
    int s = g_record_stream(ptr, stream);
    if (s == 0 || s == g_usage_status)
        return;
    TORCH_CHECK(false, "record_stream: sympool cannot keep the block at ", ptr,
                " from being reused before the work queued on stream ", static_cast<void *>(stream),
                " completes: ", last_error());
}

void sympool_shim_begin_allocate_to_pool(int device, pool_id_t id,
                                         std::function<bool(stream_t)> filter) {
    (void)filter;
    TORCH_CHECK(false,
                "sympool.torch.enable() does not give CUDA graphs or "
                "torch.cuda.use_mem_pool a private pool (pool (",
                id.first, ", ", id.second, ") on device ", device,
                "): memory captured into a graph would be reused by "
                "other work. Capture graphs, or use MemPools, without enable() "
                "(sympool.torch.mem_pool() gives a MemPool backed by sympool)");
}

// Never reached for a pool begun above (that begin threw); PyTorch still calls them for pools
// of its own bookkeeping, which hold nothing of sympool's.
void sympool_shim_end_allocate_to_pool(int device, pool_id_t id) {
    (void)device;
    (void)id;
}

void sympool_shim_release_pool(int device, pool_id_t id) {
    (void)device;
    (void)id;
}

} // extern "C"

// test_gpu_ready.cc: what a first run on a GPU would hit, shown where the host backend
// or a GPU-less cuda build can show it: auto's fallback WARN, device set-up without touching
// devices, CUDA's pseudo stream handles, stream destroy with queued work, and the messages.
#include "sp_test.hpp"

#include <cstdint>
#include <string>

extern "C" {
#include "pool/device/device.h"
#include "pool/pool.h"
}

#include <atomic>

namespace {

using sp::MiB;
using sp::stat;

class GpuReady : public sp::Test {
  protected:
    void TearDown() override {
        sp__device_set_driver_marker(nullptr);
        sp::Test::TearDown();
    }
};

// ---- item 2: auto falling back to host says so, at WARN, once ------------------------------

TEST_F(GpuReady, AutoFallbackWarnsOnceWhenAnNvidiaDriverIsPresent) {
    if (sp__device_cuda_ops() == nullptr)
        GTEST_SKIP() << "built without CUDA: auto has nothing to fall back from";
    if (sp__device_cuda_available())
        GTEST_SKIP() << "a GPU answers here: auto picks cuda";
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "auto"}});
    sp__device_set_driver_marker("/proc/self/status"); // "a driver is loaded"
    const sp_device_ops_t *ops = nullptr;
    sp_device_caps_t caps{};
    for (int round = 0; round < 3; round++) {
        sp__device_reset();
        ASSERT_SP_OK(sp__device_select(&ops, &caps));
        EXPECT_STREQ(ops->name, "host");
    }
    EXPECT_EQ(warnings("falling back to the host backend"), 1u) << "once per process, not per init";
    EXPECT_EQ(warnings("SYMPOOL_DEVICE=auto"), 1u);
    sp__device_reset();
}

TEST_F(GpuReady, AutoFallbackIsInfoWithoutAnNvidiaDriver) {
    if (sp__device_cuda_available())
        GTEST_SKIP() << "a GPU answers here: auto picks cuda";
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "auto"}});
    sp__device_set_driver_marker("/nonexistent/sympool-test/nvidia");
    const sp_device_ops_t *ops = nullptr;
    sp_device_caps_t caps{};
    sp__device_reset();
    ASSERT_SP_OK(sp__device_select(&ops, &caps));
    EXPECT_STREQ(ops->name, "host");
    EXPECT_EQ(warnings(), 0u) << "a machine without a GPU is the normal case for host";
    sp__device_reset();
}

// ---- item 1: total memory without setting the device up ------------------------------------

TEST_F(GpuReady, TotalMemoryComesFromMemTotalOnEveryDevice) {
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "host"},
                       {"SYMPOOL_HOST_DEVICES", "3"},
                       {"SYMPOOL_HOST_CAPACITY", "1GiB"}});
    SP_SKIP_UNLESS_HOST();
    const sp_device_ops_t *ops = nullptr;
    sp_device_caps_t caps{};
    ASSERT_SP_OK(sp__device_select(&ops, &caps));
    ASSERT_NE(ops->mem_total, nullptr) << "every backend has mem_total";
    for (int d = 0; d < 3; d++) {
        size_t total = 0;
        ASSERT_SP_OK(ops->mem_total(d, &total));
        EXPECT_EQ(total, size_t(1) << 30);
    }
    size_t total = 0;
    EXPECT_SP_STATUS(ops->mem_total(3, &total), SP_ERR_INVALID_ARGUMENT);
    expect_warnings();
    // The allocator sees the same totals (it reads mem_total at init, not mem_get_info): a request
    // above the device is PyTorch's out-of-memory error naming that total.
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_malloc((size_t(1) << 30) + 1, 2, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(sp_last_error()).find("GPU 2 has a total capacity of 1024.00 MiB"),
              std::string::npos)
        << sp_last_error();
}

TEST_F(GpuReady, CudaOpsRefuseBeforeInitWithoutTouchingAnything) {
    const sp_device_ops_t *cuda = sp__device_cuda_ops();
    if (cuda == nullptr)
        GTEST_SKIP() << "built without CUDA";
    if (sp__device_cuda_available())
        GTEST_SKIP() << "a GPU answers here";
    expect_warnings();
    size_t total = 0;
    // Not initialized: device 0 does not exist for it, and it says so instead of crashing.
    EXPECT_SP_STATUS(cuda->mem_total(0, &total), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(cuda->stream_sync(0, nullptr), SP_ERR_INVALID_ARGUMENT);
}

#if __has_include(<cuda.h>) && __has_include(<cuda_runtime.h>)
#include <cuda.h>
#include <cuda_runtime.h>

// Whether the process holds the primary context of `device`, asked without making one.
int primary_context_active(int device) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return -1;
    void *get = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &get, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return -1;
    CUdevice dev;
    if (reinterpret_cast<CUresult (*)(CUdevice *, int)>(get)(&dev, device) != CUDA_SUCCESS)
        return -1;
    unsigned int flags = 0;
    int active = 0;
    if (reinterpret_cast<CUresult (*)(CUdevice, unsigned int *, int *)>(fn)(dev, &flags, &active) !=
        CUDA_SUCCESS)
        return -1;
    return active;
}

// On a GPU: start-up makes no CUDA context; the first allocation makes one on its device only.
TEST_F(GpuReady, DevicesAreSetUpOnFirstUseOnly) {
    if (!sp__device_cuda_available())
        GTEST_SKIP() << "needs a GPU";
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "cuda"}});
    ASSERT_SP_OK(sp_init());
    int n = sp_device_count();
    ASSERT_GE(n, 1);
    if (primary_context_active(0) < 0)
        GTEST_SKIP() << "the driver does not answer cuDevicePrimaryCtxGetState";
    for (int d = 0; d < n; d++)
        EXPECT_EQ(primary_context_active(d), 0) << "sp_init made a context on device " << d;
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &p));
    EXPECT_EQ(primary_context_active(0), 1);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_stream_synchronize(nullptr));
    size_t total = 0, free_b = 0;
    ASSERT_SP_OK(sp_get_memory_info(0, &free_b, &total));
    for (int d = 1; d < n; d++)
        EXPECT_EQ(primary_context_active(d), 0) << "device " << d << " was touched";
}
#endif

// ---- item 8: CUDA's pseudo stream handles ---------------------------------------------------

TEST_F(GpuReady, CudaStreamLegacyIsTheDefaultStream) {
    void *const legacy = reinterpret_cast<void *>(uintptr_t(1)); // cudaStreamLegacy
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, legacy, &p));
    sp_block_info_t info;
    ASSERT_SP_OK(sp__pool_lookup(p, &info));
    EXPECT_EQ(info.stream, nullptr) << "cudaStreamLegacy keys the cache as NULL does";
    ASSERT_SP_OK(sp_free(p));
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &q));
    EXPECT_EQ(q, p) << "a block freed on cudaStreamLegacy is reused on NULL";
    ASSERT_SP_OK(sp_record_stream(q, legacy)); // the allocation stream: no event
    ASSERT_SP_OK(sp_free(q));
    void *r = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &r));
    EXPECT_EQ(r, q) << "recording on the allocation stream must not delay the free";
    ASSERT_SP_OK(sp_free(r));
}

TEST_F(GpuReady, CudaStreamPerThreadIsRefused) {
    expect_warnings();
    void *const per_thread = reinterpret_cast<void *>(uintptr_t(2)); // cudaStreamPerThread
    void *p = reinterpret_cast<void *>(uintptr_t(0xdead));
    EXPECT_SP_STATUS(sp_malloc(4096, 0, per_thread, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("cudaStreamPerThread"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(p, reinterpret_cast<void *>(uintptr_t(0xdead))) << "output untouched on failure";
    EXPECT_EQ(stat("allocation.all.current"), 0);
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    EXPECT_SP_STATUS(sp_record_stream(q, per_thread), SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(sp_free(q));
}

// ---- item 8: destroying a stream with queued work -------------------------------------------

TEST_F(GpuReady, StreamDestroyCompletesItsQueuedWorkBeforeTheHandleIsReused) {
    SP_SKIP_UNLESS_HOST(); // host: events complete at a synchronize (or destroy) of their stream
    sp_stream_t side;
    ASSERT_SP_OK(sp_stream_create(0, &side));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_record_stream(p, side));
    ASSERT_SP_OK(sp_free(p)); // pending on side's work
    EXPECT_EQ(stat("active_bytes.all.current"), int64_t(1 * MiB)) << "still pending";
    ASSERT_SP_OK(sp_stream_destroy(side));
    // Another stream may now get the same handle (the cache key): the old work must be done.
    sp_stream_t next;
    ASSERT_SP_OK(sp_stream_create(0, &next));
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &q));
    EXPECT_EQ(q, p) << "the destroyed stream's work completed, so its block is free";
    ASSERT_SP_OK(sp_free(q));
    // Blocks cached under a destroyed stream's handle are not lost: empty_cache releases them.
    void *r = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, next, &r));
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_stream_destroy(next));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_memory_reserved(0), 0u);
}

// ---- item 7: a free during CUDA graph capture defers its event ------------------------------

// The host backend with the cuda backend's capture answer: while `capturing`, recording an event
// on `captured` is refused with SP_ERR_NOT_SUPPORTED (quiet), as cudaEventRecord on a capturing
// stream is by the cuda backend.
std::atomic<bool> g_capturing{false};
sp_stream_t g_captured = nullptr;
sp_status_t capturing_record(int device, sp_dev_event_t event, sp_dev_stream_t stream) {
    if (g_capturing.load() && stream == g_captured)
        return sp__error_quiet(SP_ERR_NOT_SUPPORTED, SP_SUB_DEVICE, "stream is capturing");
    return sp__device_host_ops.event_record(device, event, stream);
}
sp_status_t capturing_sync(int device, sp_dev_stream_t stream) {
    if (g_capturing.load() && stream == g_captured)
        return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_DEVICE, "synchronize of a capturing stream");
    return sp__device_host_ops.stream_sync(device, stream);
}

TEST_F(GpuReady, FreeOfABlockUsedOnACapturingStreamWaitsForTheCaptureToEnd) {
    SP_SKIP_UNLESS_HOST();
    ASSERT_SP_OK(sp_init());
    sp_stream_t side;
    ASSERT_SP_OK(sp_stream_create(0, &side));
    sp_device_ops_t fake = sp__device_host_ops;
    fake.event_record = capturing_record;
    fake.stream_sync = capturing_sync;
    const void *real = sp__pool_swap_device_ops(&fake);
    g_captured = side;
    void *p = nullptr, *q = nullptr, *r = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_record_stream(p, side)); // a kernel of the graph reads p on `side`
    g_capturing = true;
    ASSERT_SP_OK(sp_free(p)); // during capture: no event, no synchronize (both would fail)
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &q));
    EXPECT_NE(q, p) << "freed into the cache while its stream's (captured) work is unordered";
    EXPECT_EQ(warnings(), 0u) << "the deferral is the allocator's business, not a warning";
    g_capturing = false; // capture ended; the next malloc records the deferred event
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &r));
    EXPECT_NE(r, p) << "the event was recorded after the capture, and `side` has not run since";
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_stream_synchronize(side));
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &r));
    EXPECT_EQ(r, p) << "once `side` completed, the block is free again";
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_free(q));
    sp__pool_swap_device_ops(real);
    ASSERT_SP_OK(sp_stream_destroy(side));
}

// ---- item 10: messages ----------------------------------------------------------------------

TEST_F(GpuReady, AnInvalidStreamIsNamedAsInvalidNotAsForeign) {
    SP_SKIP_ON_GPU("a handle that is not a live CUDA stream is undefined behaviour on the cuda "
                   "backend (CUDA dereferences it)");
    expect_warnings();
    int not_a_stream = 0;
    EXPECT_SP_STATUS(sp_stream_synchronize(&not_a_stream), SP_ERR_INVALID_ARGUMENT);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("not a valid stream"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("made by sp_stream_create"), std::string::npos)
        << "any CUDA stream is accepted on cuda (PyTorch's too): " << msg;
}

} // namespace

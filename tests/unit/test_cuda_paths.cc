// test_cuda_paths.cc: the cuda backend's device guard, VMM and capture paths, shown on the
// CUDA/NCCL test doubles (tests/cuda_double: label cuda_double), which count primary contexts,
// refuse shareable handles, inject failures and model stream capture as the documentation
// describes. Everywhere else (host backend, or a real GPU, where the doubles' hooks are absent)
// these tests skip: what they check needs a machine the test can set up and look into.
#include "sp_test.hpp"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

extern "C" {
#include "pool/pool.h"
#include "sympool/torch.h"
}

namespace {

using sp::MiB;
using sp::stat;

template <class F> F hook(const char *name) {
    return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

// The doubles' test hooks (tests/cuda_double/dbl.h), found at run time: NULL on a real driver.
int primary_contexts(int dev) {
    return hook<int (*)(int)>("cuda_double_primary_contexts")(dev);
}
void inject(const char *fn, int code, int skip) {
    hook<void (*)(const char *, int, int)>("cuda_double_inject")(fn, code, skip);
}
int live_vmm_handles() {
    return hook<int (*)()>("cuda_double_live_vmm_handles")();
}
size_t memory_used(int dev) {
    return hook<size_t (*)(int)>("cuda_double_memory_used")(dev);
}

// A global-mode capture on a new blocking stream of the current device, for the tests of what
// sympool must not do while one is under way.
class GlobalCapture {
  public:
    GlobalCapture() {
        began_ = cudaStreamCreate(&s_) == cudaSuccess &&
                 cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal) == cudaSuccess;
    }
    ~GlobalCapture() {
        if (s_)
            (void)cudaStreamDestroy(s_);
    }
    bool began() const { return began_; }
    // Ends the capture: whether it survived to give a graph.
    bool end() {
        cudaGraph_t g = nullptr;
        bool ok = cudaStreamEndCapture(s_, &g) == cudaSuccess;
        if (g)
            (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return ok;
    }

  private:
    cudaStream_t s_ = nullptr;
    bool began_ = false;
};

class CudaPaths : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        const char *dev = getenv("SYMPOOL_DEVICE");
        if (!hook<void *>("cuda_double_primary_contexts") || !dev || std::string(dev) != "cuda")
            GTEST_SKIP() << "needs the CUDA/NCCL test doubles (label cuda_double)";
    }
    // Allocate and free one MiB on device 0 in `pool` (NULL: the default pool) on `stream`, so
    // that a segment is cached: the bytes reserved then (0 when that failed).
    int64_t cache_a_block(sp_mempool_t *pool = nullptr, sp_stream_t stream = nullptr) {
        void *p = nullptr;
        sp_status_t s =
            pool ? sp_mempool_malloc(pool, MiB, stream, &p) : sp_malloc(MiB, 0, stream, &p);
        EXPECT_SP_OK(s);
        if (s != SP_SUCCESS || sp_free(p) != SP_SUCCESS)
            return 0;
        return stat("reserved_bytes.all.current");
    }
    // Two streams on device 0, with 4 MiB of expandable pages free and mapped on s1 (what
    // RECYCLE may unmap when s2 grows); *frees_p: the device frees counted so far.
    void free_pages_on_one_of_two_streams(sp_stream_t *s1, sp_stream_t *s2, int64_t *frees_p) {
        ASSERT_SP_OK(sp_stream_create(0, s1));
        ASSERT_SP_OK(sp_stream_create(0, s2));
        void *a = nullptr;
        ASSERT_SP_OK(sp_malloc(4 * MiB, 0, *s1, &a));
        ASSERT_SP_OK(sp_free(a));
        *frees_p = stat("num_device_free");
    }
    // Everything given back, then both streams destroyed.
    void release_two_streams(sp_stream_t s1, sp_stream_t s2) {
        ASSERT_SP_OK(sp_empty_cache());
        EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
        ASSERT_SP_OK(sp_stream_destroy(s1));
        ASSERT_SP_OK(sp_stream_destroy(s2));
    }
};

// PyTorch's MaybeExchangeDevice: after work on device 1, a caller that never chose a device (it
// reads 0) is not switched back to 0, which would make a context there.
TEST_F(CudaPaths, GuardMakesNoContextOnTheCallersUnchosenDevice) {
    sp::ScopedEnv env({{"CUDA_DOUBLE_GPUS", "2"}}); // read at the doubles' first call
    ASSERT_EQ(sp_device_count(), 2) << sp_last_error();
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(MiB, 1, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(primary_contexts(1), 1);
    EXPECT_EQ(primary_contexts(0), 0) << "the guard switched back to a device without a context";
}

// A caller whose device has a context gets it back.
TEST_F(CudaPaths, GuardGivesBackACallersDevice) {
    sp::ScopedEnv env({{"CUDA_DOUBLE_GPUS", "2"}});
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess); // makes device 0's context
    ASSERT_EQ(sp_device_count(), 2);
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(MiB, 1, nullptr, &p));
    int cur = -1;
    ASSERT_EQ(cudaGetDevice(&cur), cudaSuccess);
    EXPECT_EQ(cur, 0);
    ASSERT_SP_OK(sp_free(p));
}

// cuMemCreate answers CUDA_ERROR_NOT_PERMITTED for shareable handles where the container lacks
// the capability: expandable segments go on with plain pages.
TEST_F(CudaPaths, ExpandableSegmentsFallBackWhenHandlesAreNotPermitted) {
    sp::ScopedEnv env(
        {{"CUDA_DOUBLE_NO_POSIX_FD", "1"}, {"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(MiB, 0, nullptr, &p));
    EXPECT_GT(live_vmm_handles(), 0) << "not an expandable (VMM) segment";
    sp::touch(p, MiB);
    ASSERT_SP_OK(sp_free(p));
}

// cuMemUnmap does not wait for the GPU: when the device cannot be synchronized, no page is
// unmapped (it stays cached), and a later release that can synchronize unmaps it.
TEST_F(CudaPaths, NoUnmapAfterAFailedDeviceSynchronize) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    int64_t reserved = stat("reserved_bytes.all.current");
    int handles = live_vmm_handles();
    ASSERT_GT(reserved, 0);
    inject("cudaDeviceSynchronize", (int)cudaErrorUnknown, 0);
    (void)sp_empty_cache();
    EXPECT_EQ(live_vmm_handles(), handles) << "pages were unmapped after a failed synchronize";
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// While a blocking stream captures a graph (global mode), empty_cache releases nothing (as
// PyTorch releases no cached block while a capture is under way): synchronizing the device or
// freeing memory would invalidate the capture.
TEST_F(CudaPaths, NothingIsReleasedWhileACaptureIsUnderWay) {
    int64_t reserved = cache_a_block();
    ASSERT_GT(reserved, 0);
    GlobalCapture capture;
    ASSERT_TRUE(capture.began());
    (void)sp_empty_cache();
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    EXPECT_TRUE(capture.end()) << "the release broke the capture";
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// Destroying a private pool while a capture is under way releases nothing either (its segments
// go with a later empty_cache, as a destroyed pool's always may): its release would synchronize
// and free, which invalidates a global-mode capture, and the graph may use the memory.
TEST_F(CudaPaths, ADestroyedPoolKeepsItsSegmentsUntilTheCaptureEnds) {
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
    int64_t reserved = cache_a_block(pool);
    ASSERT_GT(reserved, 0);
    GlobalCapture capture;
    ASSERT_TRUE(capture.began());
    EXPECT_SP_OK(sp_mempool_destroy(pool));
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    EXPECT_TRUE(capture.end()) << "the destroy broke the capture";
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// Destroying a stream releases the segments cached under it (a later stream may get its handle),
// which would break a capture under way on the device: the destroy is refused until it ends.
TEST_F(CudaPaths, AStreamIsNotDestroyedWhileACaptureIsUnderWay) {
    expect_warnings();
    sp_stream_t other = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &other));
    int64_t reserved = cache_a_block(nullptr, other);
    ASSERT_GT(reserved, 0);
    GlobalCapture capture;
    ASSERT_TRUE(capture.began());
    EXPECT_SP_STATUS(sp_stream_destroy(other), SP_ERR_BUSY);
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    EXPECT_TRUE(capture.end()) << "the destroy broke the capture";
    ASSERT_SP_OK(sp_stream_destroy(other));
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// sp_shutdown releases every segment: while a capture is under way it is refused, nothing
// released, as it is while a block is live.
TEST_F(CudaPaths, ShutdownIsRefusedWhileACaptureIsUnderWay) {
    expect_warnings();
    int64_t reserved = cache_a_block();
    ASSERT_GT(reserved, 0);
    GlobalCapture capture;
    ASSERT_TRUE(capture.began());
    EXPECT_SP_STATUS(sp_shutdown(), SP_ERR_BUSY);
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    EXPECT_TRUE(capture.end()) << "the shutdown broke the capture";
    ASSERT_SP_OK(sp_shutdown());
    EXPECT_EQ(memory_used(0), 0u) << "the shutdown after the capture released nothing";
}

// An OOM while a capture is under way: PyTorch's malloc skips its last step (release_cached_blocks
// and the retry, which counts in num_alloc_retries) when captures_underway is not empty
// (c10/cuda/CUDACachingAllocator.cpp, malloc), so the OOM comes with no retry counted.
TEST_F(CudaPaths, AnOomDuringACaptureCountsNoRetry) {
    expect_warnings();
    int64_t reserved = cache_a_block();
    ASSERT_GT(reserved, 0);
    ASSERT_SP_OK(sp_set_memory_fraction(0.0, 0)); // every growth refused, no device call
    int64_t retries = stat("num_alloc_retries"), ooms = stat("num_ooms");
    GlobalCapture capture;
    ASSERT_TRUE(capture.began());
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_malloc(30 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(stat("num_alloc_retries"), retries) << "a retry was counted during the capture";
    EXPECT_EQ(stat("num_ooms"), ooms + 1);
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    EXPECT_TRUE(capture.end()) << "the OOM broke the capture";
    ASSERT_SP_OK(sp_set_memory_fraction(1.0, 0));
}

// A pool at its limit releases its own cached segments before its retry (CuPy's rule); while a
// capture is under way that release (a wait and a cudaFree) would break it, as empty_cache's
// would: nothing is released, and the request fails as an OOM.
TEST_F(CudaPaths, APoolAtItsLimitReleasesNothingDuringACapture) {
    expect_warnings();
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
    int64_t reserved = cache_a_block(pool);
    ASSERT_GT(reserved, 0);
    ASSERT_SP_OK(sp_mempool_set_limit(pool, (size_t)reserved));
    GlobalCapture capture;
    ASSERT_TRUE(capture.began());
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 4 * MiB, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    EXPECT_TRUE(capture.end()) << "the pool's release broke the capture";
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache());
}

// sp_mempool_free_all_blocks releases like empty_cache: not while a capture is under way.
TEST_F(CudaPaths, FreeAllBlocksReleasesNothingDuringACapture) {
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
    int64_t reserved = cache_a_block(pool);
    ASSERT_GT(reserved, 0);
    GlobalCapture capture;
    ASSERT_TRUE(capture.began());
    (void)sp_mempool_free_all_blocks(pool, nullptr);
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    EXPECT_TRUE(capture.end()) << "free_all_blocks broke the capture";
    ASSERT_SP_OK(sp_mempool_free_all_blocks(pool, nullptr));
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

// Behind torch.cuda.MemPool, PyTorch caches: sympool's segment entry points take exactly what
// PyTorch asks from the device and give it back at once (sympool.torch.mem_pool()).
TEST_F(CudaPaths, TorchSegmentsAreExactAndGivenBackAtOnce) {
    void *a = sp_torch_segment_malloc(2 * MiB, 0, nullptr);
    ASSERT_NE(a, nullptr) << sp_last_error();
    EXPECT_EQ(memory_used(0), 2 * MiB) << "not one 2 MiB device allocation";
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0) << "in sympool's cache";
    sp_torch_segment_free(a, 2 * MiB, 0, nullptr);
    EXPECT_EQ(memory_used(0), 0u) << "not given back to the device";
}

} // namespace

// SYMPOOL_EXPANDABLE_RECYCLE (ours) unmaps another stream's free pages before a growth, after
// synchronizing the device. While a blocking stream captures a graph (global mode) that
// synchronize is prohibited and invalidates the capture, and PyTorch never waits there (it
// unmaps only in release_cached_blocks, which malloc skips while captures_underway is not
// empty): a growth on a stream that is not capturing maps new pages and leaves the capture and
// the other stream's pages alone.
TEST_F(CudaPaths, RecycleLeavesAGraphCaptureAlone) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    sp_stream_t s1 = nullptr, s2 = nullptr;
    int64_t frees = 0;
    ASSERT_NO_FATAL_FAILURE(free_pages_on_one_of_two_streams(&s1, &s2, &frees));
    void *b = nullptr;
    {
        GlobalCapture capture;
        ASSERT_TRUE(capture.began());
        sp_status_t s = sp_malloc(4 * MiB, 0, s2, &b);
        EXPECT_EQ(stat("num_device_free"), frees) << "s1's pages were unmapped during a capture";
        EXPECT_TRUE(capture.end()) << "the growth broke the capture";
        if (s == SP_SUCCESS)
            EXPECT_SP_OK(sp_free(b));
    }
    release_two_streams(s1, s2);
}

// The same when the synchronize fails outright: RECYCLE unmaps nothing after a failed wait
// (cuMemUnmap does not wait for the GPU), and the growth maps new pages instead.
TEST_F(CudaPaths, RecycleUnmapsNothingAfterAFailedDeviceSynchronize) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    sp_stream_t s1 = nullptr, s2 = nullptr;
    int64_t frees = 0;
    ASSERT_NO_FATAL_FAILURE(free_pages_on_one_of_two_streams(&s1, &s2, &frees));
    void *b = nullptr;
    inject("cudaDeviceSynchronize", (int)cudaErrorUnknown, 0);
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, s2, &b));
    EXPECT_EQ(stat("num_device_free"), frees) << "pages were unmapped after a failed synchronize";
    ASSERT_SP_OK(sp_free(b));
    release_two_streams(s1, s2);
}

namespace {

// A fork child of a process whose sympool uses CUDA has sympool turned off (a CUDA context does
// not survive fork()): every call fails with SP_ERR_DEVICE and says so. The pool calls said
// instead that the handle "is stale: its pool was released by sp_shutdown" (SP_ERR_INVALID_USAGE)
// and sp_record_stream that the block was "not a live sympool block": no shutdown happened, and
// the block is live in the parent. sp_torch_free said "sympool is not initialized, so this is not
// its pointer", and sp_torch_malloc "could not start a device backend".
TEST_F(CudaPaths, AForkChildOfACudaParentSaysWhyEveryCallFails) {
    expect_warnings();
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    fflush(nullptr);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        // Exit status: a bit per call that did not say why it failed.
        int bad = 0;
        auto said_fork = [](sp_status_t s) {
            return s == SP_ERR_DEVICE &&
                   std::string(sp_last_error()).find("forked") != std::string::npos;
        };
        void *q = nullptr;
        bad |= said_fork(sp_malloc(4096, 0, nullptr, &q)) ? 0 : 1;
        bad |= said_fork(sp_mempool_malloc(pool, 4096, nullptr, &q)) ? 0 : 2;
        bad |= said_fork(sp_mempool_begin(pool)) ? 0 : 4;
        bad |= said_fork(sp_mempool_destroy(pool)) ? 0 : 8;
        bad |= said_fork(sp_record_stream(p, nullptr)) ? 0 : 16;
        bad |= said_fork(sp_free(p)) ? 0 : 32;
        // The PyTorch entry points return no status: their last error says it. A failure of
        // another kind first, so that a stale text does not pass.
        auto torch_said_fork = [](auto call) {
            (void)sp_malloc(16, 0, nullptr, nullptr); // "ptr_p is NULL"
            call();
            return std::string(sp_last_error()).find("forked") != std::string::npos;
        };
        bad |= torch_said_fork([&] { sp_torch_free(p, 4096, 0, nullptr); }) ? 0 : 64;
        bad |= torch_said_fork([] { (void)sp_torch_malloc(4096, 0, nullptr); }) ? 0 : 128;
        _exit(bad);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 0) << "bits: 1 sp_malloc, 2 sp_mempool_malloc, 4 begin, "
                                     "8 destroy, 16 sp_record_stream, 32 sp_free, "
                                     "64 sp_torch_free, 128 sp_torch_malloc";
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache());
}

// The same for a torch.cuda.MemPool segment (sp_torch_segment_malloc) the child inherited: its
// free said "not a live segment of sp_torch_segment_malloc", set no last error, and took the
// segment out of the child's registry; it is live in the parent.
TEST_F(CudaPaths, AForkChildOfACudaParentSaysWhyATorchSegmentFreeFails) {
    expect_warnings();
    void *seg = sp_torch_segment_malloc(2 * MiB, 0, nullptr);
    ASSERT_NE(seg, nullptr) << sp_last_error();
    fflush(nullptr);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        (void)sp_malloc(16, 0, nullptr, nullptr); // another failure first: "ptr_p is NULL"
        sp_torch_segment_free(seg, 2 * MiB, 0, nullptr);
        _exit(std::string(sp_last_error()).find("forked") != std::string::npos ? 0 : 1);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 0) << "the child's sp_torch_segment_free did not say why";
    sp_torch_segment_free(seg, 2 * MiB, 0, nullptr);
}

} // namespace

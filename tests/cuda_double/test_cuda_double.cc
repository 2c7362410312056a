// test_cuda_double.cc: the rules the CUDA/NCCL doubles enforce (each as a GPU does), and
// sympool's cuda path held to them. Runs only under the doubles (ctest label cuda_double, with
// CUDA_DOUBLE_GPUS=2); each test runs in its own process there, so contexts and the machine
// start fresh. The hooks (cuda_double_*) are looked up in the loaded libcuda.so.1.
#include "sp_test.hpp"

#include <sympool/experimental.h>

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

extern "C" {
#include "pool/device/device.h"
}

namespace {

template <typename F> F hook(const char *name) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *p = lib ? dlsym(lib, name) : nullptr;
    return reinterpret_cast<F>(p);
}

bool under_double() {
    return hook<int (*)(int)>("cuda_double_primary_contexts") != nullptr;
}

#define NEED_DOUBLE()                                                                              \
    do {                                                                                           \
        if (!under_double())                                                                       \
            GTEST_SKIP()                                                                           \
                << "runs under the CUDA doubles only (LD_LIBRARY_PATH=<build>/cuda-double)";       \
    } while (0)

int contexts(int dev) {
    return hook<int (*)(int)>("cuda_double_primary_contexts")(dev);
}
void inject(const char *fn, int code, int skip = 0) {
    hook<void (*)(const char *, int, int)>("cuda_double_inject")(fn, code, skip);
}
size_t used(int dev) {
    return hook<size_t (*)(int)>("cuda_double_memory_used")(dev);
}

template <typename F> F drv(const char *name) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return nullptr;
    return reinterpret_cast<F>(fn);
}

// ---- the doubles' rules ----------------------------------------------------------------------

TEST(CudaDoubleRules, DeviceMemoryFaultsOnHostAccess) {
    NEED_DOUBLE();
    void *p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
    EXPECT_EXIT({ *static_cast<volatile char *>(p) = 1; }, ::testing::KilledBySignal(SIGSEGV), "");
    char b[16] = {1, 2, 3};
    ASSERT_EQ(cudaMemcpy(p, b, sizeof b, cudaMemcpyHostToDevice), cudaSuccess);
    char c[16] = {};
    ASSERT_EQ(cudaMemcpy(c, p, sizeof c, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(b, c, sizeof b), 0);
    EXPECT_EQ(cudaMemcpy(c, b, sizeof b, cudaMemcpyHostToDevice), cudaErrorInvalidValue)
        << "the kind says device but dst is host memory";
    (void)cudaGetLastError();
    EXPECT_EQ(cudaFree(p), cudaSuccess);
    EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue) << "double free";
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a non-sticky error is reset by reading it";
}

TEST(CudaDoubleRules, ContextsOnlyFromCallsThatMakeThem) {
    NEED_DOUBLE();
    int n = 0, d = -1;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    ASSERT_GE(n, 2);
    ASSERT_EQ(cudaGetDevice(&d), cudaSuccess);
    EXPECT_EQ(d, 0);
    EXPECT_EQ(contexts(0), 0) << "counting and asking make no context";
    EXPECT_EQ(contexts(1), 0);
    auto state = drv<CUresult (*)(CUdevice, unsigned *, int *)>("cuDevicePrimaryCtxGetState");
    ASSERT_NE(state, nullptr);
    unsigned flags = 0;
    int active = -1;
    ASSERT_EQ(state(1, &flags, &active), CUDA_SUCCESS);
    EXPECT_EQ(active, 0) << "asking does not make one";
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_EQ(contexts(1), 1) << "cudaSetDevice makes the primary context (CUDA 12+)";
    ASSERT_EQ(state(1, &flags, &active), CUDA_SUCCESS);
    EXPECT_EQ(active, 1);
}

TEST(CudaDoubleRules, AskingTheLegacyStreamAboutCaptureMakesAContext) {
    NEED_DOUBLE();
    ASSERT_EQ(contexts(0), 0);
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    ASSERT_EQ(cudaStreamIsCapturing(nullptr, &st), cudaSuccess);
    EXPECT_EQ(st, cudaStreamCaptureStatusNone);
    EXPECT_EQ(contexts(0), 1) << "as on an H200 (bench/results/2026-11-29-s21-gpu-probe.json)";
    EXPECT_EQ(contexts(1), 0) << "only the current device's";
}

TEST(CudaDoubleRules, CurrentDeviceIsPerThread) {
    NEED_DOUBLE();
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    int other = -1;
    std::thread([&] { cudaGetDevice(&other); }).join();
    EXPECT_EQ(other, 0) << "a new thread starts on device 0";
    int mine = -1;
    cudaGetDevice(&mine);
    EXPECT_EQ(mine, 1);
}

TEST(CudaDoubleRules, EventsCompleteOnlyWhenTheirStreamDid) {
    NEED_DOUBLE();
    cudaStream_t s;
    cudaEvent_t e;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(e), cudaSuccess) << "never recorded";
    ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not ready is an answer, not an error";
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
    // An event of device 0 cannot be recorded on a stream of device 1.
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    cudaStream_t s1;
    ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(e, s1), cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    int dev = -1;
    ASSERT_EQ(cudaStreamGetDevice(s, &dev), cudaSuccess);
    EXPECT_EQ(dev, 0);
    EXPECT_EQ(cudaStreamDestroy(s1), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    // A destroyed stream, like one never made, is undefined behaviour (a GPU dereferences the
    // handle): the double stops the process instead of answering an error code.
    EXPECT_DEATH(cudaStreamDestroy(s), "is not a CUDA stream of this process");
    int not_a_stream = 0;
    EXPECT_DEATH(cudaStreamGetDevice((cudaStream_t)&not_a_stream, &dev),
                 "is not a CUDA stream of this process");
    (void)cudaGetLastError();
    EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

TEST(CudaDoubleRules, GlobalCaptureForbidsUnsafeCallsOnEveryThread) {
    NEED_DOUBLE();
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    cudaError_t other = cudaSuccess, relaxed = cudaErrorUnknown;
    std::thread([&] {
        void *p = nullptr;
        other = cudaMalloc(&p, 1 << 20);
        (void)cudaGetLastError();
        cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&m);
        relaxed = cudaMalloc(&p, 1 << 20);
        cudaThreadExchangeStreamCaptureMode(&m);
        EXPECT_EQ(m, cudaStreamCaptureModeRelaxed) << "the exchange hands back the mode";
        cudaFree(p); // refused again (global mode back): leaks in the double, fine
        (void)cudaGetLastError();
    }).join();
    EXPECT_EQ(other, cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(relaxed, cudaSuccess);
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated)
        << "the refused call invalidated the capture";
    EXPECT_EQ(g, nullptr);
    (void)cudaGetLastError();
    cudaStreamDestroy(s);
}

TEST(CudaDoubleRules, ThreadLocalAndRelaxedCaptures) {
    NEED_DOUBLE();
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaError_t other = cudaErrorUnknown;
    void *q = nullptr;
    std::thread([&] { other = cudaMalloc(&q, 4096); }).join();
    EXPECT_EQ(other, cudaSuccess) << "a thread-local capture does not concern other threads";
    void *p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, 4096), cudaErrorStreamCaptureUnsupported) << "but its own thread";
    (void)cudaGetLastError();
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();

    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&p, 4096), cudaSuccess) << "relaxed capture allows it";
    cudaStreamCaptureStatus st{};
    ASSERT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
    EXPECT_EQ(st, cudaStreamCaptureStatusActive);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported)
        << "a capturing stream cannot be synchronized, in any mode";
    (void)cudaGetLastError();
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    EXPECT_EQ(cudaFree(p), cudaSuccess);
    EXPECT_EQ(cudaFree(q), cudaSuccess);
    cudaStreamDestroy(s);
}

TEST(CudaDoubleRules, LegacyStreamWhileABlockingStreamCaptures) {
    NEED_DOUBLE();
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess); // blocking
    EXPECT_EQ(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal),
              cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cudaStreamCaptureStatus st{};
    EXPECT_EQ(cudaStreamIsCapturing(nullptr, &st), cudaErrorStreamCaptureImplicit);
    (void)cudaGetLastError();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(s, &g);
    (void)cudaGetLastError();
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
}

TEST(CudaDoubleRules, StickyErrorsStay) {
    NEED_DOUBLE();
    hook<void (*)(int, int)>("cuda_double_make_sticky")(0, cudaErrorIllegalAddress);
    void *p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorIllegalAddress);
    EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
    EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress) << "a sticky error is never reset";
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&p, 16), cudaSuccess) << "another device's context is fine";
    EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// Which errors are sticky is driver_types.h's word ("inconsistent state ... any further CUDA work
// will return the same error"), not a numeric range: 704 (peer access already enabled) is read
// and gone, 226 (an error contained by the GPU) stays.
TEST(CudaDoubleRules, OnlyTheDocumentedErrorsAreSticky) {
    NEED_DOUBLE();
    void *p = nullptr;
    inject("cudaMalloc", cudaErrorPeerAccessAlreadyEnabled);
    EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorPeerAccessAlreadyEnabled);
    EXPECT_EQ(cudaGetLastError(), cudaErrorPeerAccessAlreadyEnabled);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "704 is not sticky";
    inject("cudaMalloc", cudaErrorContained);
    EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorContained);
    EXPECT_EQ(cudaGetLastError(), cudaErrorContained);
    EXPECT_EQ(cudaGetLastError(), cudaErrorContained) << "226 is sticky";
}

TEST(CudaDoubleRules, VmmOrdersGranularityAndCapacity) {
    NEED_DOUBLE();
    auto gran =
        drv<CUresult (*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)>(
            "cuMemGetAllocationGranularity");
    auto create = drv<CUresult (*)(CUmemGenericAllocationHandle *, size_t,
                                   const CUmemAllocationProp *, unsigned long long)>("cuMemCreate");
    auto reserve =
        drv<CUresult (*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)>(
            "cuMemAddressReserve");
    auto map = drv<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                unsigned long long)>("cuMemMap");
    auto access =
        drv<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)>("cuMemSetAccess");
    auto unmap = drv<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
    auto release = drv<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
    auto afree = drv<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
    ASSERT_TRUE(gran && create && reserve && map && access && unmap && release && afree);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    ASSERT_EQ(gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    ASSERT_GT(g, 0u);
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    EXPECT_EQ(create(&h, g + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE) << "not a multiple";
    ASSERT_EQ(create(&h, 2 * g, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 2 * g);
    CUdeviceptr va = 0;
    ASSERT_EQ(reserve(&va, 4 * g, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(map(va + 4096, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "unaligned";
    EXPECT_EQ(map(va + 3 * g, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "past the reservation";
    ASSERT_EQ(map(va, 2 * g, 0, h, 0), CUDA_SUCCESS);
    ASSERT_EQ(create(&h2, g, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(map(va + g, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE) << "overlaps a mapping";
    ASSERT_EQ(map(va + 2 * g, g, 0, h2, 0), CUDA_SUCCESS);
    // Mapped but no access granted yet: the GPU faults there (a sticky error), so the test
    // checks it in a child process.
    EXPECT_EXIT(
        {
            char b = 0;
            _exit(cudaMemcpy(&b, reinterpret_cast<void *>(va), 1, cudaMemcpyDeviceToHost) ==
                          cudaErrorIllegalAddress
                      ? 0
                      : 1);
        },
        ::testing::ExitedWithCode(0), "");
    CUmemAccessDesc d{};
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(access(va, 3 * g, &d, 1), CUDA_SUCCESS);
    EXPECT_EQ(access(va, 4 * g, &d, 1), CUDA_ERROR_INVALID_VALUE) << "the last page is unmapped";
    char b = 5, c = 0;
    ASSERT_EQ(cudaMemcpy(reinterpret_cast<void *>(va + 2 * g), &b, 1, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&c, reinterpret_cast<void *>(va + 2 * g), 1, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(c, 5);
    EXPECT_EQ(unmap(va, g), CUDA_ERROR_INVALID_VALUE) << "a sub-range of one mapping";
    EXPECT_EQ(afree(va, 4 * g), CUDA_ERROR_INVALID_VALUE) << "mappings still there";
    ASSERT_EQ(release(h), CUDA_SUCCESS);
    EXPECT_EQ(release(h), CUDA_ERROR_INVALID_VALUE) << "released twice";
    EXPECT_EQ(used(0), 3 * g) << "a released handle lives while mapped";
    ASSERT_EQ(unmap(va, 3 * g), CUDA_SUCCESS) << "two whole mappings at once";
    EXPECT_EQ(used(0), g) << "h2 is not released yet";
    ASSERT_EQ(release(h2), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0u);
    ASSERT_EQ(afree(va, 4 * g), CUDA_SUCCESS);
    // Capacity: the device has CUDA_DOUBLE_MEMORY bytes.
    size_t fr = 0, tot = 0;
    ASSERT_EQ(cudaMemGetInfo(&fr, &tot), cudaSuccess);
    EXPECT_EQ(create(&h, (tot / g + 1) * g, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
}

// ---- NCCL across processes --------------------------------------------------------------------

// Runs body(rank) in `n` child processes (rank r on device dev_of(r)); true when all exit 0.
template <typename F> bool ranks(int n, F body) {
    std::vector<pid_t> kids;
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(body(r) ? 0 : 1);
        kids.push_back(pid);
    }
    bool ok = true;
    for (pid_t p : kids) {
        int st = 0;
        waitpid(p, &st, 0);
        ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    return ok;
}

// body(rank, comm) on two ranks, rank r on device r in a communicator from `id`; a rank whose
// communicator cannot be made fails.
template <typename F> bool comm_ranks(const ncclUniqueId &id, F body) {
    return ranks(2, [&](int r) {
        cudaSetDevice(r);
        ncclComm_t c = nullptr;
        if (ncclCommInitRank(&c, 2, id, r) != ncclSuccess)
            return false;
        return body(r, c);
    });
}

TEST(CudaDoubleNccl, AvgPremultipliesFloatsAndDividesIntegers) {
    NEED_DOUBLE();
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    int v = 0;
    ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
    EXPECT_EQ(v, NCCL_VERSION_CODE);
    EXPECT_TRUE(ranks(2, [&](int r) {
        if (cudaSetDevice(r) != cudaSuccess)
            return false;
        ncclComm_t c = nullptr;
        if (ncclCommInitRank(&c, 2, id, r) != ncclSuccess)
            return false;
        // fp16: 65504 (the largest half) on both ranks. Summed first, it would overflow to inf;
        // NCCL pre-multiplies each by 1/2 in half precision, so the average is 65504.
        uint16_t h[2] = {0x7bff, 0x3c00}, out[2] = {};
        int32_t i[1] = {3 + r}, io[1] = {};
        void *dh = nullptr, *di = nullptr;
        bool ok = cudaMalloc(&dh, sizeof h) == cudaSuccess && cudaMalloc(&di, 4) == cudaSuccess &&
                  cudaMemcpy(dh, h, sizeof h, cudaMemcpyHostToDevice) == cudaSuccess &&
                  cudaMemcpy(di, i, 4, cudaMemcpyHostToDevice) == cudaSuccess &&
                  ncclAllReduce(dh, dh, 2, ncclFloat16, ncclAvg, c, nullptr) == ncclSuccess &&
                  ncclAllReduce(di, di, 1, ncclInt32, ncclAvg, c, nullptr) == ncclSuccess &&
                  cudaMemcpy(out, dh, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess &&
                  cudaMemcpy(io, di, 4, cudaMemcpyDeviceToHost) == cudaSuccess;
        ok = ok && out[0] == 0x7bff && out[1] == 0x3c00 && io[0] == 3; // (3 + 4) / 2
        if (!ok)
            fprintf(stderr, "rank %d: %#x %#x %d\n", r, out[0], out[1], io[0]);
        // Host memory is not a collective's buffer.
        ok = ok && ncclAllReduce(i, io, 1, ncclInt32, ncclSum, c, nullptr) == ncclInvalidArgument;
        return ncclCommDestroy(c) == ncclSuccess && ok;
    }));
}

// The outcome of a nonblocking call on c: its async state once no longer ncclInProgress (NCCL's
// way to learn it; the wait is the one the API offers).
ncclResult_t settle(ncclComm_t c) {
    ncclResult_t r = ncclInProgress;
    while (ncclCommGetAsyncError(c, &r) == ncclSuccess && r == ncclInProgress)
        std::this_thread::yield();
    return r;
}

// A nonblocking init (ncclConfig_t.blocking = 0) returns ncclInProgress with the communicator
// already handed out, and says its outcome through ncclCommGetAsyncError; nothing but a split
// and its end runs on it in the double. Its split with blocking = 1 is nonblocking too (the job
// runs on the parent), and the child, set only once complete, is blocking: collectives run.
TEST(CudaDoubleNccl, NonblockingInitAndItsBlockingSplit) {
    NEED_DOUBLE();
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT_TRUE(ranks(2, [&](int r) {
        cudaSetDevice(r);
        ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
        nb.blocking = 0;
        ncclComm_t p = nullptr, c = nullptr;
        bool ok = ncclCommInitRankConfig(&p, 2, id, r, &nb) == ncclInProgress && p != nullptr &&
                  settle(p) == ncclSuccess;
        void *m = nullptr;
        ok = ok && cudaMalloc(&m, 256) == cudaSuccess;
        ok = ok && ncclAllReduce(m, m, 16, ncclFloat32, ncclSum, p, nullptr) == ncclInvalidUsage;
        ncclConfig_t bl = NCCL_CONFIG_INITIALIZER;
        bl.blocking = 1;
        ok = ok && ncclCommSplit(p, 0, r, &c, &bl) == ncclInProgress && settle(p) == ncclSuccess &&
             c != nullptr;
        ok = ok && ncclAllReduce(m, m, 16, ncclFloat32, ncclSum, c, nullptr) == ncclSuccess;
        ok = ok && ncclCommDestroy(p) == ncclSuccess && ncclCommDestroy(c) == ncclSuccess;
        nb.magic = 0; // not from NCCL_CONFIG_INITIALIZER
        ncclComm_t bad = nullptr;
        ok = ok && ncclCommInitRankConfig(&bad, 2, id, r, &nb) == ncclInvalidArgument && !bad;
        return cudaFree(m) == cudaSuccess && ok;
    }));
}

// A nonblocking init whose peer never comes stays in progress: it cannot be destroyed (NCCL's
// ncclCommEnsureReady refuses a communicator in use), and ncclCommAbort stops and frees it.
TEST(CudaDoubleNccl, AbortStopsANonblockingInitWaitingForAPeer) {
    NEED_DOUBLE();
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    cudaSetDevice(0);
    ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
    nb.blocking = 0;
    ncclComm_t p = nullptr;
    ASSERT_EQ(ncclCommInitRankConfig(&p, 2, id, 0, &nb), ncclInProgress);
    ASSERT_NE(p, nullptr);
    ncclResult_t r = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(p, &r), ncclSuccess);
    EXPECT_EQ(r, ncclInProgress); // rank 1 never comes
    EXPECT_EQ(ncclCommDestroy(p), ncclInvalidArgument);
    EXPECT_EQ(ncclCommAbort(p), ncclSuccess);
}

TEST(CudaDoubleNccl, DuplicateGpuIsRefusedOnEveryRank) {
    NEED_DOUBLE();
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT_TRUE(ranks(2, [&](int r) {
        cudaSetDevice(0);
        ncclComm_t c = nullptr;
        ncclResult_t res = ncclCommInitRank(&c, 2, id, r);
        return res == ncclInvalidUsage && c == nullptr &&
               std::string(ncclGetLastError(nullptr)).find("Duplicate GPU") != std::string::npos;
    }));
}

// A rank's node is NCCL's host hash (host name and boot id, or NCCL_HOSTID): one GPU index on two
// hosts is two GPUs, and the communicator then spans two nodes, where 2.28 runs no symmetric
// kernel; on one host two GPUs run them (the double counts the calls).
TEST(CudaDoubleNccl, NodesAreHostHashesAndSymmetricKernelsStayOnOne) {
    NEED_DOUBLE();
    auto kernels = [] {
        void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
        auto f =
            lib ? reinterpret_cast<long (*)()>(dlsym(lib, "cuda_double_nccl_symmetric_kernels"))
                : nullptr;
        return f ? f() : -1L;
    };
    for (bool two_hosts : {true, false}) {
        ncclUniqueId id;
        ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
        EXPECT_TRUE(ranks(2, [&](int r) {
            if (two_hosts)
                setenv("NCCL_HOSTID", r == 0 ? "host-a" : "host-b", 1);
            if (cudaSetDevice(two_hosts ? 0 : r) != cudaSuccess)
                return false;
            ncclComm_t c = nullptr;
            if (ncclCommInitRank(&c, 2, id, r) != ncclSuccess)
                return false; // on two hosts device 0 twice is no duplicate
            void *m = nullptr;
            ncclWindow_t w = nullptr;
            bool ok =
                ncclMemAlloc(&m, 2 << 20) == ncclSuccess &&
                ncclCommWindowRegister(c, m, 2 << 20, &w, NCCL_WIN_COLL_SYMMETRIC) == ncclSuccess;
            long k0 = kernels();
            ok = ok && ncclAllReduce(m, m, 64, ncclFloat32, ncclSum, c, nullptr) == ncclSuccess &&
                 ncclAllReduce(m, m, 64, ncclFloat64, ncclSum, c, nullptr) == ncclSuccess;
            long k = kernels() - k0;
            ok = ok && k == (two_hosts ? 0 : 1);
            if (!ok)
                fprintf(stderr, "rank %d (two hosts %d): %ld symmetric kernels\n", r, two_hosts, k);
            ok = ncclCommWindowDeregister(c, w) == ncclSuccess && ncclMemFree(m) == ncclSuccess &&
                 ok;
            return ncclCommDestroy(c) == ncclSuccess && ok;
        })) << (two_hosts ? "two hosts" : "one host");
    }
}

// A communicator's own device memory (CUDA_DOUBLE_NCCL_MEMORY) is taken at init and returned with
// it; a rank that cannot take it fails the init on every rank.
TEST(CudaDoubleNccl, CommunicatorMemoryIsTakenAndReturned) {
    NEED_DOUBLE();
    for (const char *want : {"16M", "1000G"}) {
        ncclUniqueId id;
        ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
        const bool fits = std::string(want) == "16M";
        EXPECT_TRUE(ranks(2, [&](int r) {
            setenv("CUDA_DOUBLE_NCCL_MEMORY", want, 1);
            if (cudaSetDevice(r) != cudaSuccess)
                return false;
            size_t before = used(r);
            ncclComm_t c = nullptr;
            ncclResult_t res = ncclCommInitRank(&c, 2, id, r);
            if (!fits)
                return res != ncclSuccess && c == nullptr && used(r) == before;
            bool ok = res == ncclSuccess && used(r) == before + (16u << 20);
            return ncclCommDestroy(c) == ncclSuccess && used(r) == before && ok;
        })) << want;
    }
}

TEST(CudaDoubleNccl, WindowRules) {
    NEED_DOUBLE();
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT_TRUE(comm_ranks(id, [&](int r, ncclComm_t c) {
        bool ok = true;
        void *m = nullptr, *plain = nullptr;
        ok = ok && ncclMemAlloc(&m, 3 << 20) == ncclSuccess && m != nullptr;
        ok = ok && cudaMalloc(&plain, 4 << 20) == cudaSuccess;
        ncclWindow_t w = nullptr;
        // 2.28: NULL or size 0 returns success and leaves *win alone.
        ok = ok && ncclCommWindowRegister(c, nullptr, 0, &w, 0) == ncclSuccess && w == nullptr;
        // Not VMM memory: refused (every rank gets an error, the call is collective).
        ok = ok &&
             ncclCommWindowRegister(c, plain, 4 << 20, &w, NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess;
        // Offsets must be 4096-aligned.
        ok = ok &&
             ncclCommWindowRegister(c, static_cast<char *>(m) + 100, 4096, &w, 0) != ncclSuccess;
        // Sizes must be equal on every rank.
        ok = ok &&
             ncclCommWindowRegister(c, m, r == 0 ? 1 << 20 : 2 << 20, &w, 0) == ncclInvalidUsage;
        ok = ok &&
             ncclCommWindowRegister(c, m, 2 << 20, &w, NCCL_WIN_COLL_SYMMETRIC) == ncclSuccess &&
             w != nullptr;
        // Deregister before free.
        ok = ok && ncclMemFree(m) == ncclInvalidUsage;
        ok = ok && ncclCommWindowDeregister(c, w) == ncclSuccess;
        ok = ok && ncclMemFree(m) == ncclSuccess;
        ok = ok && cudaFree(plain) == cudaSuccess;
        if (!ok)
            fprintf(stderr, "rank %d failed\n", r);
        return ncclCommDestroy(c) == ncclSuccess && ok;
    }));
}

TEST(CudaDoubleNccl, AnAbortReachesThePeers) {
    NEED_DOUBLE();
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT_TRUE(comm_ranks(id, [&](int r, ncclComm_t c) {
        if (r == 1)
            return ncclCommAbort(c) == ncclSuccess;
        void *b = nullptr;
        cudaMalloc(&b, 64);
        ncclResult_t res = ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, c, nullptr);
        ncclCommAbort(c);
        return res == ncclRemoteError;
    }));
}

// ---- sympool's cuda path under the doubles ---------------------------------------------------

class CudaDoubleSympool : public sp::Test {};

TEST_F(CudaDoubleSympool, OnlyTheDevicesUsedGetAContext) {
    NEED_DOUBLE();
    ASSERT_STREQ(sp_backend_name(), "cuda");
    ASSERT_EQ(sp_device_count(), 2);
    int before0 = contexts(0);
    EXPECT_EQ(before0, 0) << "sympool's start-up made a context";
    void *p = nullptr;
    std::thread([&] {
        // A thread that never set a device allocates on device 1.
        EXPECT_SP_OK(sp_malloc(1 << 20, 1, nullptr, &p));
        EXPECT_SP_OK(sp_free(p));
    }).join();
    EXPECT_EQ(contexts(1), 1);
    EXPECT_EQ(contexts(0), before0) << "sympool made a context on device 0, which it never used";
    std::thread([&] { EXPECT_SP_OK(sp_empty_cache()); }).join();
    EXPECT_EQ(used(1), 0u);
}

TEST_F(CudaDoubleSympool, FreshThreadOnDeviceOneLeavesDeviceZeroAlone) {
    NEED_DOUBLE();
    int c0 = -1;
    std::thread([&] {
        // Everything on a thread whose runtime state is untouched: device 0 must stay bare.
        int before = contexts(0);
        void *p = nullptr;
        sp_stream_t s = nullptr;
        EXPECT_SP_OK(sp_stream_create(1, &s));
        EXPECT_SP_OK(sp_malloc(4096, 1, s, &p));
        EXPECT_SP_OK(sp_free(p));
        EXPECT_SP_OK(sp_stream_synchronize(s));
        EXPECT_SP_OK(sp_stream_destroy(s));
        c0 = contexts(0) - before;
    }).join();
    EXPECT_EQ(c0, 0);
    EXPECT_SP_OK(sp_empty_cache());
}

TEST_F(CudaDoubleSympool, EmptyCacheAndOomReleaseLeaveUnusedDevicesBare) {
    NEED_DOUBLE();
    // Everything on device 0, the device this thread set: releasing the cache (empty_cache, and
    // the OOM path that releases it before retrying) must not visit device 1, which has no
    // context and therefore nothing cached and no capture under way.
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    size_t fr = 0, tot = 0;
    ASSERT_SP_OK(sp_get_memory_info(0, &fr, &tot));
    void *q = nullptr;
    expect_warnings();
    EXPECT_SP_STATUS(sp_malloc(tot + (1 << 20), 0, nullptr, &q), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(contexts(1), 0) << "device 1 was set up by a release on device 0 "
                                 "(CUDA_DOUBLE_TRACE_CONTEXTS=1 says where)";
}

TEST_F(CudaDoubleSympool, HostDereferenceOfSympoolMemoryFaults) {
    NEED_DOUBLE();
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    EXPECT_EXIT({ (void)*static_cast<volatile int *>(p); }, ::testing::KilledBySignal(SIGSEGV), "");
    sp::touch(p, 4096); // the shim's way (a copy) works
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(CudaDoubleSympool, StickyErrorSaysTheProcessMustRestart) {
    NEED_DOUBLE();
    expect_warnings();
    skip_leak_check();
    hook<void (*)(int, int)>("cuda_double_make_sticky")(0, cudaErrorIllegalAddress);
    void *p = nullptr;
    sp_status_t s = sp_malloc(1 << 20, 0, nullptr, &p);
    EXPECT_EQ(s, SP_ERR_DEVICE);
    EXPECT_NE(std::string(sp_last_error()).find("sticky"), std::string::npos) << sp_last_error();
}

// Every code driver_types.h (CUDA 13.0) documents as leaving the process in an inconsistent
// state, not only the 7xx kernel faults: each is said to need a restart. One per device, since a
// context's sticky error is its first.
TEST_F(CudaDoubleSympool, EveryDocumentedStickyErrorSaysSo) {
    NEED_DOUBLE();
    expect_warnings();
    skip_leak_check();
    ASSERT_EQ(sp_device_count(), 2);
    const cudaError_t codes[2] = {cudaErrorContained, cudaErrorTensorMemoryLeak};
    for (int d = 0; d < 2; d++) {
        hook<void (*)(int, int)>("cuda_double_make_sticky")(d, codes[d]);
        void *p = nullptr;
        EXPECT_EQ(sp_malloc(1 << 20, d, nullptr, &p), SP_ERR_DEVICE);
        EXPECT_NE(std::string(sp_last_error()).find("sticky"), std::string::npos)
            << sp_last_error();
    }
}

TEST_F(CudaDoubleSympool, AllocatingDuringAnotherThreadsGlobalCaptureKeepsItValid) {
    NEED_DOUBLE();
    cudaStream_t cs;
    ASSERT_EQ(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal), cudaSuccess);
    std::thread([&] {
        void *p = nullptr;
        EXPECT_SP_OK(sp_malloc(3 << 20, 0, nullptr, &p)); // a new segment: cudaMalloc
        EXPECT_SP_OK(sp_free(p));
    }).join();
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(cs, &g), cudaSuccess) << "sympool invalidated the capture";
    cudaGraphDestroy(g);
    cudaStreamDestroy(cs);
    EXPECT_SP_OK(sp_empty_cache());
}

// sympool's own streams are non-blocking (cuda_stream_create), so a global-mode capture on one
// does not make the legacy stream count as capturing, yet cudaDeviceSynchronize during it is
// invalid and breaks it ("invalid to ... synchronize a broader handle which encompasses an active
// stream capture, such as a device", Programming Guide, Prohibited and Unhandled Operations).
// sp_empty_cache promises to release nothing while a capture is under way on the device: with
// expandable segments it used to unmap after a cudaDeviceSynchronize (the capture invalidated),
// without them it cudaFree'd the cached segment the graph may use; sp_stream_destroy synchronized
// the capturing stream (invalid: the capture invalidated) instead of answering SP_ERR_BUSY.
void empty_cache_during_capture_on_a_sympool_stream() {
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(5 << 20, 0, s, &p));
    ASSERT_SP_OK(sp_free(p));
    size_t reserved = sp_memory_reserved(0);
    ASSERT_GT(reserved, 0u);
    ASSERT_EQ(cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_memory_reserved(0), reserved) << "released during a capture";
    EXPECT_EQ(sp_stream_destroy(s), SP_ERR_BUSY) << "destroyed (synchronized) during a capture";
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture((cudaStream_t)s, &g), cudaSuccess)
        << "sympool invalidated the capture";
    cudaGraphDestroy(g);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    ASSERT_SP_OK(sp_stream_destroy(s));
}

TEST_F(CudaDoubleSympool, EmptyCacheDuringACaptureOnASympoolStreamReleasesNothing) {
    NEED_DOUBLE();
    expect_warnings();
    empty_cache_during_capture_on_a_sympool_stream();
}

TEST_F(CudaDoubleSympool, ExpandableEmptyCacheDuringACaptureOnASympoolStreamReleasesNothing) {
    NEED_DOUBLE();
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    empty_cache_during_capture_on_a_sympool_stream();
}

// sp_stream_destroy takes any CUDA stream, the application's own too. A non-blocking stream of the
// application's that captures a graph is not seen by the device-wide check (cuda_device_capturing
// knows sympool's streams and the legacy stream only), yet here it is the very stream named:
// synchronizing a capturing stream is invalid and invalidates the capture ("It is invalid to
// synchronize or query the execution status of a stream which is being captured", Programming
// Guide, CUDA Graphs, "Prohibited and Unhandled Operations"), and its cached segment may hold
// memory the graph uses. The destroy used to release that segment, synchronize the stream (the
// capture invalidated) and fail; it must refuse first and change nothing.
TEST_F(CudaDoubleSympool, DestroyOfTheApplicationsCapturingStreamChangesNothing) {
    NEED_DOUBLE();
    expect_warnings();
    cudaStream_t cs;
    ASSERT_EQ(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(5 << 20, 0, (sp_stream_t)cs, &p));
    ASSERT_SP_OK(sp_free(p));
    size_t reserved = sp_memory_reserved(0);
    ASSERT_GT(reserved, 0u);
    ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(sp_stream_destroy((sp_stream_t)cs), SP_ERR_BUSY)
        << "destroyed (synchronized) during its own capture";
    EXPECT_EQ(sp_memory_reserved(0), reserved) << "its segment was released during the capture";
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(cs, &g), cudaSuccess) << "sympool invalidated the capture";
    cudaGraphDestroy(g);
    ASSERT_SP_OK(sp_stream_destroy((sp_stream_t)cs));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_memory_reserved(0), 0u);
}

// sp_shutdown releases everything (API.md), and the backend's fini releases the streams it made
// (device.h); the host backend's streams are gone after it, and the Python Stream leaves a stream
// from before an sp_shutdown alone (docs/API.md). cuda's fini forgot its streams without
// destroying them: every stream not destroyed before sp_shutdown leaked for the process's life.
TEST_F(CudaDoubleSympool, ShutdownDestroysTheStreamsSympoolMade) {
    NEED_DOUBLE();
    auto live = reinterpret_cast<int (*)(int)>(dlsym(RTLD_DEFAULT, "cuda_double_live_streams"));
    ASSERT_NE(live, nullptr);
    cudaStream_t mine;
    ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
    sp_stream_t s0 = nullptr, s1 = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s0));
    ASSERT_SP_OK(sp_stream_create(1, &s1));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, s0, &p));
    ASSERT_SP_OK(sp_free(p));
    // A stream capturing a graph on a device without segments does not stop the shutdown, and
    // cannot be destroyed now: it stays, its capture intact.
    sp_stream_t c1 = nullptr;
    ASSERT_SP_OK(sp_stream_create(1, &c1));
    ASSERT_EQ(cudaStreamBeginCapture((cudaStream_t)c1, cudaStreamCaptureModeRelaxed), cudaSuccess);
    ASSERT_EQ(live(0), 2);
    ASSERT_EQ(live(1), 2);
    expect_warnings();
    ASSERT_SP_OK(sp_shutdown());
    EXPECT_EQ(live(0), 1) << "sympool's stream on device 0 outlived sp_shutdown";
    EXPECT_EQ(live(1), 1) << "sympool's stream on device 1 outlived sp_shutdown";
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture((cudaStream_t)c1, &g), cudaSuccess);
    cudaGraphDestroy(g);
    EXPECT_EQ(cudaStreamDestroy((cudaStream_t)c1), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(mine), cudaSuccess) << "the application's own stream is its own";
}

// sp_x_stream_live is what a holder of a stream asks before destroying it, in case the stream was
// destroyed by other means (the Python Stream after an sp_stream_destroy through ctypes). On cuda
// it asked cudaStreamGetDevice about the destroyed handle: "Use of the handle after this call is
// undefined behavior" (cudaStreamDestroy, CUDA Runtime API), and the double stops the process
// there as a GPU may crash. A handle sympool destroyed answers 0 without asking, until
// sp_stream_create makes a stream at it again.
TEST_F(CudaDoubleSympool, AStreamSympoolDestroyedIsNotLiveAndCudaIsNotAsked) {
    NEED_DOUBLE();
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    EXPECT_EQ(sp_x_stream_live(s), 1);
    ASSERT_SP_OK(sp_stream_destroy(s));
    EXPECT_EQ(sp_x_stream_live(s), 0);
    EXPECT_NE(std::string(sp_last_error()).find("destroyed"), std::string::npos) << sp_last_error();
}

// SP_ERR_OUT_OF_MEMORY means the device was exhausted after the cache was freed and the
// allocation retried (API.md), and only mem_alloc's out-of-memory is the quiet one the allocator
// retries (device.h). A call that allocates nothing sympool can free for it (a stream, a memory
// query) and is refused with cudaErrorMemoryAllocation is a device error, as the release path and
// cudaStreamGetDevice already report it; it used to come back as a quiet SP_ERR_OUT_OF_MEMORY.
TEST_F(CudaDoubleSympool, OutOfMemoryOutsideAnAllocationIsADeviceError) {
    NEED_DOUBLE();
    expect_warnings();
    sp_stream_t s = nullptr;
    inject("cudaStreamCreateWithFlags", cudaErrorMemoryAllocation);
    EXPECT_SP_STATUS(sp_stream_create(0, &s), SP_ERR_DEVICE);
    EXPECT_NE(std::string(sp_last_error()).find("cudaStreamCreateWithFlags"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "sympool took its own error out of the slot";
    size_t fr = 0, tot = 0;
    inject("cudaMemGetInfo", cudaErrorMemoryAllocation);
    EXPECT_SP_STATUS(sp_get_memory_info(0, &fr, &tot), SP_ERR_DEVICE);
    ASSERT_SP_OK(sp_stream_create(0, &s));
    inject("cudaStreamSynchronize", cudaErrorMemoryAllocation);
    EXPECT_SP_STATUS(sp_stream_synchronize(s), SP_ERR_DEVICE);
    // cudaMalloc's out of memory stays the allocator's: freed cache, retry, and the OOM report.
    void *p = nullptr;
    inject("cudaMalloc", cudaErrorMemoryAllocation);
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, s, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

// A free of a block recorded on a side stream makes an event there; when no event can be made
// (cudaEventCreateWithFlags fails) and waiting for the stream fails too, the block used to go
// back to the cache at once, and the next malloc handed it out while the side stream's work on
// it was still queued. It must stay pending until that work is known done.
TEST_F(CudaDoubleSympool, AFreeWhoseEventAndWaitBothFailStaysPending) {
    NEED_DOUBLE();
    expect_warnings();
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    ASSERT_EQ(cudaMemsetAsync(p, 0, 1 << 20, (cudaStream_t)s), cudaSuccess); // queued on s
    ASSERT_SP_OK(sp_record_stream(p, s));
    inject("cudaEventCreateWithFlags", cudaErrorMemoryAllocation);
    inject("cudaStreamSynchronize", cudaErrorLaunchOutOfResources);
    ASSERT_SP_OK(sp_free(p));
    (void)cudaGetLastError();
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &q));
    EXPECT_NE(q, p) << "handed out again while the side stream's work may still use it";
    ASSERT_EQ(cudaStreamSynchronize((cudaStream_t)s), cudaSuccess);
    void *r = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &r));
    EXPECT_EQ(r, p) << "once the side stream is done, the block is reused";
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

// A runtime that keeps a query's cudaErrorNotReady as the last error (the one PyTorch's allocator
// clears after its event queries: pytorch#18584, #61554) must not see sympool leave it there: the
// application's next cudaGetLastError (PyTorch's check after every kernel launch) would read
// "device not ready" for work of sympool's.
TEST_F(CudaDoubleSympool, AnEventNotReadyIsNotLeftInTheApplicationsErrorSlot) {
    NEED_DOUBLE();
    struct Kept { // the double's mode for this test only, whatever assertion ends it
        Kept() { setenv("CUDA_DOUBLE_NOT_READY_KEPT", "1", 1); }
        ~Kept() { unsetenv("CUDA_DOUBLE_NOT_READY_KEPT"); }
    } kept;
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    ASSERT_EQ(cudaMemsetAsync(p, 0, 1 << 20, (cudaStream_t)s), cudaSuccess); // queued on s
    ASSERT_SP_OK(sp_record_stream(p, s));
    ASSERT_SP_OK(sp_free(p)); // an event on s, not done while s's work is queued
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &q)); // asks the event: not ready
    EXPECT_NE(q, p) << "the block is still in use on s";
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "sympool's query left NotReady in the slot";
    ASSERT_EQ(cudaStreamSynchronize((cudaStream_t)s), cudaSuccess);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

// The legacy stream (NULL) is the current device's ("Stream synchronization behavior", CUDA
// Runtime API): whether it counts as capturing must be asked on the device the op works on, not on
// whatever device the calling thread has current. A capture on device 1 must refuse device 1's
// default-stream sync and event record (SP_ERR_NOT_SUPPORTED, as the file comment of cuda.c
// promises), and a capture on the caller's device 0 must not refuse them on device 1.
TEST_F(CudaDoubleSympool, DefaultStreamCaptureIsAskedOnItsOwnDevice) {
    NEED_DOUBLE();
    expect_warnings();
    ASSERT_STREQ(sp_backend_name(), "cuda");
    ASSERT_EQ(sp_device_count(), 2);
    const sp_device_ops_t *ops = sp__device_cuda_ops();
    sp_dev_event_t ev = nullptr;
    ASSERT_SP_OK(ops->event_create(1, &ev));
    cudaStream_t cs[2] = {nullptr, nullptr};
    for (int capturing_dev = 1; capturing_dev >= 0; capturing_dev--) {
        SCOPED_TRACE(capturing_dev);
        ASSERT_EQ(cudaSetDevice(capturing_dev), cudaSuccess);
        ASSERT_EQ(cudaStreamCreate(&cs[capturing_dev]), cudaSuccess); // a blocking stream
        ASSERT_EQ(cudaStreamBeginCapture(cs[capturing_dev], cudaStreamCaptureModeRelaxed),
                  cudaSuccess);
        ASSERT_EQ(cudaSetDevice(0), cudaSuccess); // the caller's device
        sp_status_t want = capturing_dev == 1 ? SP_ERR_NOT_SUPPORTED : SP_SUCCESS;
        EXPECT_EQ(ops->stream_sync(1, nullptr), want) << sp_last_error();
        EXPECT_EQ(ops->event_record(1, ev, nullptr), want) << sp_last_error();
        cudaGraph_t g = nullptr;
        EXPECT_EQ(cudaStreamEndCapture(cs[capturing_dev], &g), cudaSuccess)
            << "sympool invalidated the capture";
        cudaGraphDestroy(g);
        cudaStreamDestroy(cs[capturing_dev]);
    }
    EXPECT_SP_OK(ops->stream_sync(1, nullptr));
    EXPECT_SP_OK(ops->event_destroy(1, ev));
    (void)cudaGetLastError();
}

TEST_F(CudaDoubleSympool, ExpandableSegmentsFollowTheVmmRules) {
    NEED_DOUBLE();
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    std::vector<void *> ps;
    for (int i = 0; i < 8; i++) {
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(size_t(5 + i) << 20, 0, nullptr, &p));
        sp::touch(p, 4096);
        ps.push_back(p);
    }
    for (void *p : ps)
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(used(0), 0u) << "every page unmapped and released";
    EXPECT_EQ(hook<int (*)()>("cuda_double_live_vmm_handles")(), 0);
}

// RECYCLE's unmaps that the growth asking for them maps again stay mapped on the device (issue
// 25): 4 MiB at 0 and at 4 MiB, the second freed; 6 MiB maps [4, 10) MiB, whose first two pages
// RECYCLE unmapped in the books. Made call by call that is two cuMemUnmap + cuMemRelease and three
// cuMemCreate + cuMemMap; kept, one cuMemCreate, so a failure injected into the second
// cuMemCreate from there is never reached (no OOM retry), and the five pages are five handles.
TEST_F(CudaDoubleSympool, RecycledPagesMappedAgainKeepTheirHandles) {
    NEED_DOUBLE();
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    void *a = nullptr, *b = nullptr, *c = nullptr;
    ASSERT_SP_OK(sp_malloc(4 << 20, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(4 << 20, 0, nullptr, &b));
    ASSERT_EQ((uintptr_t)b, (uintptr_t)a + (4 << 20));
    ASSERT_SP_OK(sp_free(b));
    auto handles = hook<int (*)()>("cuda_double_live_vmm_handles");
    EXPECT_EQ(handles(), 4);
    sp_stats_t st;
    ASSERT_SP_OK(sp_memory_stats(0, &st));
    int64_t retries = -1, after = -1;
    ASSERT_SP_OK(sp_stats_get(&st, "num_alloc_retries", &retries));
    inject("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 1);
    sp_status_t s = sp_malloc(6 << 20, 0, nullptr, &c);
    inject("cuMemCreate", 0);
    ASSERT_SP_OK(s);
    EXPECT_EQ((uintptr_t)c, (uintptr_t)a + (4 << 20));
    ASSERT_SP_OK(sp_memory_stats(0, &st));
    ASSERT_SP_OK(sp_stats_get(&st, "num_alloc_retries", &after));
    EXPECT_EQ(after, retries) << "a page was created again";
    EXPECT_EQ(handles(), 5);
    EXPECT_EQ(used(0), size_t(10) << 20);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(c));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(handles(), 0);
    EXPECT_EQ(used(0), 0u);
}

TEST_F(CudaDoubleSympool, ExpandableSegmentsWithoutShareableHandles) {
    NEED_DOUBLE();
    // Containers without the capability refuse POSIX-FD handles; pages are made without them.
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    setenv("CUDA_DOUBLE_NO_POSIX_FD", "1", 1);
    void *p = nullptr;
    sp_status_t s = sp_malloc(8 << 20, 0, nullptr, &p);
    unsetenv("CUDA_DOUBLE_NO_POSIX_FD");
    ASSERT_SP_OK(s);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(used(0), 0u);
}

TEST_F(CudaDoubleSympool, FailedMapIsUndone) {
    NEED_DOUBLE();
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    void *p = nullptr;
    inject("cuMemMap", CUDA_ERROR_INVALID_VALUE, 1); // the second page's map fails
    EXPECT_NE(sp_malloc(40 << 20, 0, nullptr, &p), SP_SUCCESS);
    inject("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE);
    EXPECT_NE(sp_malloc(40 << 20, 0, nullptr, &p), SP_SUCCESS);
    ASSERT_SP_OK(sp_malloc(40 << 20, 0, nullptr, &p)); // nothing half-mapped was left
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(used(0), 0u);
    EXPECT_EQ(hook<int (*)()>("cuda_double_live_vmm_handles")(), 0);
}

TEST_F(CudaDoubleSympool, DeviceFailuresBecomeStatuses) {
    NEED_DOUBLE();
    expect_warnings();
    void *p = nullptr;
    inject("cudaMalloc", cudaErrorMemoryAllocation);
    // One OOM: the allocator frees its cache and retries.
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    inject("cudaMalloc", cudaErrorInvalidValue);
    EXPECT_SP_STATUS(sp_malloc(64 << 20, 0, nullptr, &p), SP_ERR_DEVICE);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "sympool took its own error out of the slot";
    sp_stream_t s = nullptr;
    inject("cudaStreamCreateWithFlags", cudaErrorInvalidValue);
    EXPECT_SP_STATUS(sp_stream_create(0, &s), SP_ERR_DEVICE);
    ASSERT_SP_OK(sp_stream_create(0, &s));
    inject("cudaStreamSynchronize", cudaErrorInvalidValue);
    EXPECT_SP_STATUS(sp_stream_synchronize(s), SP_ERR_DEVICE);
    inject("cudaStreamSynchronize", cudaErrorInvalidValue);
    EXPECT_SP_STATUS(sp_stream_destroy(s), SP_ERR_DEVICE);
    ASSERT_SP_OK(sp_stream_destroy(s));
    // A pending error of the application stays for it to read.
    void *bad = nullptr;
    EXPECT_EQ(cudaMalloc(&bad, size_t(1) << 62), cudaErrorMemoryAllocation);
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    ASSERT_SP_OK(sp_empty_cache());
}

TEST_F(CudaDoubleSympool, RefusedCudaFreeKeepsTheSegment) {
    NEED_DOUBLE();
    expect_warnings();
    // A segment cudaFree refused is still on the device: it stays in the books (reserved, cached)
    // and the next release gives it back, instead of being forgotten there and leaked.
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_EQ(used(0), size_t(2) << 20);
    inject("cudaFree", cudaErrorInvalidValue);
    EXPECT_SP_STATUS(sp_empty_cache(), SP_ERR_DEVICE);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(2) << 20);
    EXPECT_EQ(sp::stat("segment.all.current"), 1);
    EXPECT_EQ(used(0), size_t(2) << 20);
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p)); // the kept segment serves again
    EXPECT_EQ(used(0), size_t(2) << 20);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(used(0), 0u);
}

TEST_F(CudaDoubleSympool, EmptyCacheReportsARefusedCudaFreeAfterReleasingTheRest) {
    NEED_DOUBLE();
    expect_warnings();
    // PyTorch's emptyCache throws when cudaFree fails (release_block's C10_CUDA_CHECK). sympool
    // releases everything else first, keeps the refused segment cached and on the books, and
    // then returns the refusal, naming cudaFree; so do the one-device and one-pool releases.
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_malloc(3 << 20, 0, nullptr, &a)); // a 20 MiB large segment
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &b));     // a 2 MiB small segment
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_EQ(used(0), size_t(22) << 20);
    inject("cudaFree", cudaErrorInvalidValue); // the first: the large one (large pool first)
    EXPECT_SP_STATUS(sp_empty_cache(), SP_ERR_DEVICE);
    EXPECT_NE(std::string(sp_last_error()).find("cudaFree"), std::string::npos) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("sp_empty_cache"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(used(0), size_t(20) << 20) << "the small segment was released all the same";
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(20) << 20);
    EXPECT_EQ(sp::stat("segment.all.current"), 1);
    // A refusal the runtime calls out of memory is still a device error here: nothing was asked.
    inject("cudaFree", cudaErrorMemoryAllocation);
    EXPECT_SP_STATUS(sp_x_empty_cache_device(0), SP_ERR_DEVICE);
    EXPECT_NE(std::string(sp_last_error()).find("cudaFree"), std::string::npos) << sp_last_error();
    EXPECT_EQ(used(0), size_t(20) << 20);
    // A private pool's release reports it the same way.
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &pool));
    void *c = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 1 << 20, nullptr, &c));
    ASSERT_SP_OK(sp_free(c));
    inject("cudaFree", cudaErrorInvalidValue);
    EXPECT_SP_STATUS(sp_mempool_free_all_blocks(pool, nullptr), SP_ERR_DEVICE);
    EXPECT_NE(std::string(sp_last_error()).find("cudaFree"), std::string::npos) << sp_last_error();
    EXPECT_EQ(sp_mempool_total_bytes(pool), size_t(2) << 20);
    ASSERT_SP_OK(sp_mempool_free_all_blocks(pool, nullptr));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache()); // nothing refused now: success, and the device is empty
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(used(0), 0u);
}

TEST_F(CudaDoubleSympool, AStreamQueryTheDeviceCannotAnswerIsNotABadStream) {
    NEED_DOUBLE();
    expect_warnings();
    // cudaStreamGetDevice refused for a reason that is not the handle's (out of memory here; a
    // sticky error likewise) was reported as SP_ERR_INVALID_ARGUMENT, "not a valid CUDA stream":
    // the caller looked for a bug in its own code. Only the handle's refusals (invalid value,
    // invalid handle, context destroyed) are a bad argument; the rest is the device's failure.
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *p = nullptr;
    inject("cudaStreamGetDevice", cudaErrorMemoryAllocation);
    EXPECT_SP_STATUS(sp_malloc(1 << 20, 0, s, &p), SP_ERR_DEVICE);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("cudaStreamGetDevice"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("not a"), std::string::npos) << msg;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "sympool took its own error out of the slot";
    inject("cudaStreamGetDevice", cudaErrorMemoryAllocation);
    EXPECT_SP_STATUS(sp_x_stream_label(s, 7), SP_ERR_DEVICE);
    msg = sp_last_error();
    EXPECT_NE(msg.find("cudaStreamGetDevice"), std::string::npos) << msg;
    inject("cudaStreamGetDevice", cudaErrorMemoryAllocation);
    EXPECT_EQ(sp_x_stream_live(s), -1) << "the device could not answer: cannot tell";
    // The handle's own refusals stay a bad argument, naming the call.
    for (int code : {int(cudaErrorInvalidValue), int(cudaErrorInvalidResourceHandle),
                     int(cudaErrorContextIsDestroyed)}) {
        inject("cudaStreamGetDevice", code);
        EXPECT_SP_STATUS(sp_malloc(1 << 20, 0, s, &p), SP_ERR_INVALID_ARGUMENT);
        msg = sp_last_error();
        EXPECT_NE(msg.find("cudaStreamGetDevice"), std::string::npos) << code << ": " << msg;
    }
    inject("cudaStreamGetDevice", 0);
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, s, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

// The VMM refusal tests' start: an 8 MiB expandable segment, freed, its four 2 MiB pages mapped
// and cached.
void cache_four_mapped_pages(int (*handles)()) {
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(8 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_EQ(handles(), 4);
}

// Their end: 8 MiB serves again, written whole, and every page goes back to the device.
void serves_then_releases_everything(int (*handles)()) {
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(8 << 20, 0, nullptr, &p));
    sp::touch(p, 8 << 20);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(used(0), 0u);
    EXPECT_EQ(handles(), 0);
}

TEST_F(CudaDoubleSympool, RefusedUnmapKeepsThePagesMapped) {
    NEED_DOUBLE();
    expect_warnings();
    // cuMemUnmap refused on the second page of a release: vmm_unmap is all or nothing, so every
    // page of the range stays mapped and known (the allocator keeps them cached, as it does when
    // vmm_unmap fails), and the next release gives them all back.
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    auto handles = hook<int (*)()>("cuda_double_live_vmm_handles");
    ASSERT_NO_FATAL_FAILURE(cache_four_mapped_pages(handles));
    inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, 1);
    // The refusal is the call's error (PyTorch's emptyCache throws on one), the pages kept.
    EXPECT_SP_STATUS(sp_empty_cache(), SP_ERR_DEVICE);
    inject("cuMemUnmap", 0);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(used(0)));
    EXPECT_EQ(used(0), size_t(8) << 20);
    EXPECT_EQ(handles(), 4);
    serves_then_releases_everything(handles); // the cached pages serve again
}

TEST_F(CudaDoubleSympool, AnUnmapThatCannotBeUndoneIsFinished) {
    NEED_DOUBLE();
    expect_warnings();
    // cuMemUnmap refused on the second page of a release, and the first page's map back refused
    // too: that page was gone from the device while vmm_unmap reported "nothing changed", so the
    // allocator kept counting it (reserved 8 MiB, the device 6 MiB) and would hand it out again.
    // The backend finishes the unmap instead (every page of the range off the device), and the
    // books say what the device holds.
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    auto handles = hook<int (*)()>("cuda_double_live_vmm_handles");
    ASSERT_NO_FATAL_FAILURE(cache_four_mapped_pages(handles));
    inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, 1);
    inject("cuMemMap", CUDA_ERROR_INVALID_VALUE);
    // Finished, the unmap did what was asked: nothing is left on the device to report.
    EXPECT_SP_OK(sp_empty_cache());
    inject("cuMemUnmap", 0);
    inject("cuMemMap", 0);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(used(0)))
        << "the books and the device disagree";
    EXPECT_EQ(used(0), 0u);
    EXPECT_EQ(handles(), 0);
    serves_then_releases_everything(handles); // mapped afresh, every page there
}

TEST_F(CudaDoubleSympool, RefusedReleaseOfAPageIsTriedAgain) {
    NEED_DOUBLE();
    expect_warnings();
    // cuMemRelease refused for an unmapped page: the handle still holds the page's memory, so the
    // backend keeps it and releases it at its next release (or at sp_shutdown) instead of
    // forgetting it.
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    auto handles = hook<int (*)()>("cuda_double_live_vmm_handles");
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(8 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    inject("cuMemRelease", CUDA_ERROR_INVALID_VALUE, 1);
    (void)sp_empty_cache();
    inject("cuMemRelease", 0);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
    ASSERT_SP_OK(sp_malloc(4 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(handles(), 0) << "the refused page's handle was released by the next release";
    EXPECT_EQ(used(0), 0u);
    ASSERT_SP_OK(sp_malloc(8 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    inject("cuMemRelease", CUDA_ERROR_INVALID_VALUE, 1);
    (void)sp_empty_cache();
    inject("cuMemRelease", 0);
    ASSERT_SP_OK(sp_shutdown());
    EXPECT_EQ(handles(), 0) << "sp_shutdown released it";
    EXPECT_EQ(used(0), 0u);
}

// vmm_release of a reservation with a page still mapped on the device (the allocator's books
// say unmapped after a refused deferred unmap, expandable.c's pend_flush): cuMemUnmap refused
// there left the page mapped while its handle was released and the reservation forgotten, so
// nothing could ever unmap it, and cuMemRelease frees a page's memory only "when all outstanding
// mappings to the memory are unmapped" (CUDA driver API, cuMemRelease). The backend keeps such a
// page (mapped, its handle held) and the reservation, and finishes the release at its next vmm
// call or at sp_shutdown.
TEST_F(CudaDoubleSympool, RefusedUnmapInAReleaseIsTriedAgain) {
    NEED_DOUBLE();
    expect_warnings();
    auto handles = hook<int (*)()>("cuda_double_live_vmm_handles");
    ASSERT_SP_OK(sp_init());
    const sp_device_ops_t *ops = sp__device_cuda_ops();
    size_t page = size_t(2) << 20;
    void *base = nullptr;
    ASSERT_SP_OK(ops->vmm_reserve(0, 4 * page, page, &base));
    ASSERT_SP_OK(ops->vmm_map(0, base, 2 * page));
    ASSERT_EQ(used(0), 2 * page);
    inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, 1); // the second page's unmap
    EXPECT_SP_STATUS(ops->vmm_release(0, base, 4 * page), SP_ERR_DEVICE);
    inject("cuMemUnmap", 0);
    EXPECT_EQ(used(0), page) << "the refused page is still on the device";
    // The next vmm call finishes the release.
    void *other = nullptr;
    ASSERT_SP_OK(ops->vmm_reserve(0, 4 * page, page, &other));
    EXPECT_EQ(used(0), 0u) << "the refused page was unmapped and released by the next vmm call";
    EXPECT_EQ(handles(), 0);
    ASSERT_SP_OK(ops->vmm_release(0, other, 4 * page));
    // Still refused at the next call: sp_shutdown releases it.
    ASSERT_SP_OK(ops->vmm_reserve(0, 4 * page, page, &base));
    ASSERT_SP_OK(ops->vmm_map(0, base, page));
    inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
    EXPECT_SP_STATUS(ops->vmm_release(0, base, 4 * page), SP_ERR_DEVICE);
    EXPECT_EQ(used(0), page);
    ASSERT_SP_OK(sp_shutdown());
    EXPECT_EQ(used(0), 0u) << "sp_shutdown unmapped and released it";
    EXPECT_EQ(handles(), 0);
}

// The undo of a failed map (cuMemSetAccess refused after every page was mapped) whose cuMemUnmap
// the driver refuses too: the page's handle was released with the page still mapped and the
// backend then counted it unmapped, so the segment's release skipped it and cuMemAddressFree was
// refused: the page's memory and the range stayed held for the life of the process. The page
// keeps its handle, and the segment's release unmaps it.
TEST_F(CudaDoubleSympool, RefusedUnmapInTheUndoOfAMapIsNotLeaked) {
    NEED_DOUBLE();
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    auto handles = hook<int (*)()>("cuda_double_live_vmm_handles");
    void *p = nullptr;
    inject("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE);
    inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
    sp_status_t s = sp_malloc(8 << 20, 0, nullptr, &p);
    inject("cuMemSetAccess", 0);
    inject("cuMemUnmap", 0);
    EXPECT_SP_STATUS(s, SP_ERR_DEVICE);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
    ASSERT_SP_OK(sp_empty_cache()); // the segment, unmapped in the books, is released
    EXPECT_EQ(used(0), 0u) << "the page the undo could not unmap is still held";
    EXPECT_EQ(handles(), 0);
}

// The same refusal, the segment kept: the page the undo could not unmap stayed mapped in the
// backend while the allocator counted it unmapped, so every later growth into it failed
// ("vmm_map: page 0 is already mapped", SP_ERR_INVALID_USAGE, for a call that did nothing
// wrong) until the segment was released. The backend keeps such a page apart: the next vmm call
// tries its unmap again, and a growth into it takes it over while it is still refused.
TEST_F(CudaDoubleSympool, PageARefusedUndoKeptMappedIsGrownIntoAgain) {
    NEED_DOUBLE();
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    auto handles = hook<int (*)()>("cuda_double_live_vmm_handles");
    const size_t mib = size_t(1) << 20;
    auto refused_undo = [&]() {
        void *p = nullptr;
        inject("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE);
        inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
        sp_status_t s = sp_malloc(8 * mib, 0, nullptr, &p);
        inject("cuMemSetAccess", 0);
        EXPECT_SP_STATUS(s, SP_ERR_DEVICE);
        EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
    };
    // Still refused at the next growth: the growth takes the page over.
    refused_undo();
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(8 * mib, 0, nullptr, &p));
    inject("cuMemUnmap", 0);
    sp::touch(p, 8 * mib);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(used(0)));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(used(0), 0u);
    EXPECT_EQ(handles(), 0);
    // Accepted again by the next growth: the page is unmapped first, then mapped anew.
    refused_undo();
    inject("cuMemUnmap", 0);
    ASSERT_SP_OK(sp_malloc(8 * mib, 0, nullptr, &p));
    sp::touch(p, 8 * mib);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(used(0)));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(used(0), 0u);
    EXPECT_EQ(handles(), 0);
}

// A growth's deferred unmaps (RECYCLE's, expandable.c's pend_flush) refused by the driver: the
// books already count those pages unmapped while the device still maps them. They were forgotten
// there, so every later growth into them failed ("vmm_map: page 0 is already mapped",
// SP_ERR_INVALID_USAGE, for a call that did nothing wrong) for as long as their segment lived,
// and the device held more than reserved_bytes, empty_cache or not. The pool keeps them: a
// growth there takes the still-mapped pages over, and a release unmaps them.
TEST_F(CudaDoubleSympool, RefusedDeferredUnmapIsTakenOverOrTriedAgain) {
    NEED_DOUBLE();
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    auto handles = hook<int (*)()>("cuda_double_live_vmm_handles");
    const size_t mib = size_t(1) << 20;
    // 4 MiB at 0 and at 4 MiB, the first freed; 6 MiB grows at 8 MiB, RECYCLE having unmapped
    // [0, 4) MiB in the books, and the device refuses that unmap.
    auto refuse_recycled_unmap = [&](void **a, void **b, void **c) {
        ASSERT_SP_OK(sp_malloc(4 * mib, 0, nullptr, a));
        ASSERT_SP_OK(sp_malloc(4 * mib, 0, nullptr, b));
        ASSERT_SP_OK(sp_free(*a));
        inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
        sp_status_t s = sp_malloc(6 * mib, 0, nullptr, c);
        inject("cuMemUnmap", 0);
        ASSERT_SP_OK(s);
        ASSERT_EQ((uintptr_t)*c, (uintptr_t)*a + 8 * mib);
        ASSERT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(10 * mib));
        ASSERT_EQ(used(0), 14 * mib) << "the refused pages are still mapped";
    };
    void *a = nullptr, *b = nullptr, *c = nullptr, *e = nullptr;
    ASSERT_NO_FATAL_FAILURE(refuse_recycled_unmap(&a, &b, &c));
    // A growth there takes the pages over.
    ASSERT_SP_OK(sp_malloc(4 * mib, 0, nullptr, &e));
    EXPECT_EQ(e, a);
    sp::touch(e, 4 * mib);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(used(0)));
    EXPECT_EQ(used(0), 14 * mib);
    for (void *p : {b, c, e})
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(used(0), 0u);
    EXPECT_EQ(handles(), 0);
    // A release unmaps them while their segment lives on.
    ASSERT_NO_FATAL_FAILURE(refuse_recycled_unmap(&a, &b, &c));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), int64_t(used(0)));
    EXPECT_EQ(used(0), 10 * mib);
    ASSERT_SP_OK(sp_malloc(4 * mib, 0, nullptr, &e));
    EXPECT_EQ(e, a);
    for (void *p : {b, c, e})
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(used(0), 0u);
    EXPECT_EQ(handles(), 0);
}

// ---- a fault-injection sweep of the cuda backend -----------------------------------------------

// Every CUDA runtime and driver entry point sympool's pool reaches, each failed once at its 1st,
// 2nd, ... call (skip 0..kSweepSkips-1) while a fixed workload runs: mixed sizes, a block used on
// a second stream and freed there (events), reuse, empty_cache, a snapshot, the stream's
// destruction and sp_shutdown; with and without expandable segments. After every step: a failed
// call said what failed (a message naming the call), the books match the device (reserved bytes
// == the double's device memory in use, live blocks == what the test holds), and the step done
// again without the failure succeeds. At the end nothing is left on the device.
const char *const kSweepFns[] = {
    "cudaMalloc",
    "cudaFree",
    "cudaMemGetInfo",
    "cudaStreamCreateWithFlags",
    "cudaStreamDestroy",
    "cudaStreamSynchronize",
    "cudaStreamIsCapturing",
    "cudaStreamGetDevice",
    "cudaEventCreateWithFlags",
    "cudaEventDestroy",
    "cudaEventRecord",
    "cudaEventQuery",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cudaSetDevice",
    "cudaGetDevice",
    "cudaThreadExchangeStreamCaptureMode",
    "cudaGetDeviceCount",
    "cudaGetDriverEntryPointByVersion",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem",
    "cuDevicePrimaryCtxGetState",
};
constexpr int kSweepSkips = 12;

struct Sweep {
    std::vector<std::string> bad;
    std::string where;
    size_t steps_failed = 0;
    size_t base = 0; // device bytes an earlier workload left (reported there)
    int base_handles = 0;
    bool device_may_hold_more = false; // see run_sweep

    void note(const std::string &what) { bad.push_back(where + ": " + what); }
    // The books against the device after a step (nothing held: `live` blocks of the test's).
    void check(int live) {
        int64_t reserved = sp::stat("reserved_bytes.all.current");
        int64_t allocs = sp::stat("allocation.all.current");
        if (reserved != (int64_t)(used(0) - base) &&
            !(device_may_hold_more && reserved < (int64_t)(used(0) - base)))
            note("reserved_bytes " + std::to_string(reserved) + " but the device holds " +
                 std::to_string(used(0) - base));
        if (allocs != live)
            note("allocation.all.current " + std::to_string(allocs) + " but " +
                 std::to_string(live) + " blocks are live");
    }
    // Run a step; on failure check the message, clear the injection, run it again.
    void step(const char *name, const char *fn, const std::function<sp_status_t()> &f,
              const std::function<int()> &live) {
        std::string at = where;
        where = at + " step " + name;
        sp_status_t s = f();
        if (s != SP_SUCCESS) {
            steps_failed++;
            std::string msg = sp_last_error();
            if (getenv("SP_SWEEP_VERBOSE"))
                printf("sweep: %s: %s: %s\n", where.c_str(), sp_status_name(s), msg.c_str());
            if (msg.empty())
                note(std::string(sp_status_name(s)) + " with no message");
            else if (msg.find(fn) == std::string::npos)
                note(std::string(sp_status_name(s)) + " not naming " + fn + ": " + msg);
            check(live());
            inject(fn, 0);
            s = f();
            if (s != SP_SUCCESS)
                note(std::string("the retry failed: ") + sp_status_name(s) + ": " +
                     sp_last_error());
        }
        if (strcmp(name, "shutdown") != 0)
            check(live());
        where = at;
    }
};

void sweep_workload(Sweep &w, const char *fn) {
    sp_stream_t s = nullptr;
    void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr, *e = nullptr;
    auto live = [&] {
        return (a != nullptr) + (b != nullptr) + (c != nullptr) + (d != nullptr) + (e != nullptr);
    };
    auto alloc = [&](void **p, size_t n, sp_stream_t st) {
        return [p, n, st, &s] {
            (void)s;
            return sp_malloc(n, 0, st, p);
        };
    };
    auto release = [](void **p) {
        return [p] {
            sp_status_t r = sp_free(*p);
            if (r == SP_SUCCESS)
                *p = nullptr;
            return r;
        };
    };
    w.step(
        "stream_create", fn, [&] { return sp_stream_create(0, &s); }, live);
    w.step("malloc small", fn, alloc(&a, 512, nullptr), live);
    w.step("malloc 3M", fn, alloc(&b, 3 << 20, nullptr), live);
    w.step(
        "malloc 30M on s", fn, [&] { return sp_malloc(30 << 20, 0, s, &c); }, live);
    w.step(
        "record_stream", fn, [&] { return sp_record_stream(b, s); }, live);
    w.step("free recorded", fn, release(&b), live);
    w.step("free small", fn, release(&a), live);
    w.step("malloc 3M again", fn, alloc(&d, 3 << 20, nullptr), live);
    w.step("free 30M", fn, release(&c), live);
    w.step("free 3M", fn, release(&d), live);
    w.step(
        "malloc 50M on s", fn, [&] { return sp_malloc(50 << 20, 0, s, &e); }, live);
    w.step(
        "record_stream 50M", fn, [&] { return sp_record_stream(e, nullptr); }, live);
    w.step("free 50M", fn, release(&e), live);
    w.step(
        "empty_cache", fn, [] { return sp_empty_cache(); }, live);
    char path[] = "/tmp/sp-fault-sweep-XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0)
        close(fd);
    w.step(
        "snapshot", fn, [&] { return sp_dump_snapshot(path); }, live);
    unlink(path);
    w.step(
        "stream_destroy", fn, [&] { return sp_stream_destroy(s); }, live);
    w.step(
        "shutdown", fn, [] { return sp_shutdown(); }, live);
    inject(fn, 0);
    int handles = hook<int (*)()>("cuda_double_live_vmm_handles")();
    if (used(0) != w.base || handles != w.base_handles)
        w.note("after sp_shutdown the device holds " + std::to_string(used(0) - w.base) +
               " bytes, " + std::to_string(handles - w.base_handles) + " VMM handles");
    w.base = used(0);
    w.base_handles = handles;
}

void run_sweep(int code) {
    Sweep w;
    w.base = used(0);
    w.base_handles = hook<int (*)()>("cuda_double_live_vmm_handles")();
    for (const char *fn : kSweepFns)
        for (int k = 0; k < kSweepSkips; k++) {
            // A refused unmap of pages a growth had put off unmapping (expandable.c, pend_flush)
            // leaves them on the device while the books say unmapped, until the next release:
            // documented there. The device then holds more than reserved_bytes, never less.
            // So does a page handle whose release was refused, until the backend's next vmm
            // call releases it (pool/device/cuda.c, vmm_release_handle).
            w.device_may_hold_more =
                strcmp(fn, "cuMemUnmap") == 0 || strcmp(fn, "cuMemRelease") == 0;
            w.where =
                std::string(fn) + " code " + std::to_string(code) + " skip " + std::to_string(k);
            inject(fn, code, k);
            sweep_workload(w, fn);
        }
    for (const std::string &b : w.bad)
        ADD_FAILURE() << b;
    printf("fault sweep (code %d): %zu functions x %d skips, %zu steps failed and were retried, "
           "%zu findings\n",
           code, sizeof kSweepFns / sizeof *kSweepFns, kSweepSkips, w.steps_failed, w.bad.size());
}

TEST_F(CudaDoubleSympool, FaultSweepCachingAllocator) {
    NEED_DOUBLE();
    expect_warnings();
    sp::Watchdog dog;
    run_sweep(1); // cudaErrorInvalidValue / CUDA_ERROR_INVALID_VALUE
    run_sweep(2); // cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
}

TEST_F(CudaDoubleSympool, FaultSweepExpandableSegments) {
    NEED_DOUBLE();
    expect_warnings();
    sp::Watchdog dog;
    sp::ScopedEnv env({{"SYMPOOL_EXPANDABLE_SEGMENTS", "1"}});
    run_sweep(1);
    run_sweep(2);
}

} // namespace

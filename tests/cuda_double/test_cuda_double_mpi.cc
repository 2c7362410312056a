// test_cuda_double_mpi.cc: the NCCL paths of sympool (symmetric/reg_nccl.c,
// collectives/coll_nccl.c, the world's communicator) under the CUDA/NCCL doubles, where a GPU
// cannot be made to fail on purpose: failures injected into the doubles on every rank (so no rank
// waits inside NCCL for a peer that already left), out of memory on small double GPUs, and an
// abort. Every rank must get an error, none may hang. Runs under mpirun, each rank on its own
// double GPU (CUDA_DOUBLE_GPUS=4, CUDA_DOUBLE_MEMORY=256MiB).
#include "mpi_util.hpp"

#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

extern "C" {
#include "world/world.h"
#include <sympool/collectives.h>
}

namespace {

template <typename F> F hook(const char *name) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return reinterpret_cast<F>(lib ? dlsym(lib, name) : nullptr);
}

void inject(const char *fn, int code, int skip = 0) {
    hook<void (*)(const char *, int, int)>("cuda_double_inject")(fn, code, skip);
}

#define NEED_DOUBLE()                                                                              \
    do {                                                                                           \
        if (!hook<void *>("cuda_double_inject") || !sp::on_gpu())                                  \
            GTEST_SKIP() << "runs on the cuda backend under the CUDA doubles only";                \
    } while (0)

class CudaDoubleMpi : public SymPoolTest {};

// Copy a host vector into sympool memory and back (device memory is not host memory).
template <typename T> void put(void *dst, const std::vector<T> &v) {
    ASSERT_EQ(cudaMemcpy(dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T> std::vector<T> get(const void *src, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

TEST_F(CudaDoubleMpi, CollectivesOnWindowsAndOffThemWithTheReasonLogged) {
    NEED_DOUBLE();
    sp::ScopedEnv env({{"SYMPOOL_DEBUG", "INFO"}, {"SYMPOOL_DEBUG_SUBSYS", "COLL"}});
    make_pool(false, false, "colls");
    const int n = mpi_size(), r = mpi_rank();
    const size_t count = 1024;
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4 * n, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4 * n, nullptr, &b));
    std::vector<float> f(count * n, float(r + 1));
    put(a, f);
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr));
    EXPECT_EQ(get<float>(b, 1)[0], float(n * (n + 1) / 2));
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_AVG, nullptr));
    EXPECT_FLOAT_EQ(get<float>(b, 1)[0], float(n + 1) / 2);
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT64, SP_MAX, nullptr));
    ASSERT_SP_OK(sp_allgather(world_, a, b, count, SP_FLOAT32, nullptr));
    std::vector<float> g = get<float>(b, count * n);
    for (int q = 0; q < n; q++)
        EXPECT_EQ(g[q * count], float(q + 1)) << "allgather block of rank " << q;
    ASSERT_SP_OK(sp_reduce_scatter(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_broadcast(world_, a, b, count, SP_INT32, 0, nullptr));
    // Off the windows: plain sp_malloc memory.
    void *c = nullptr;
    ASSERT_SP_OK(sp_malloc(count * 4, sp_world_device(world_), nullptr, &c));
    put(c, std::vector<int32_t>(count, r));
    ASSERT_SP_OK(sp_allreduce(world_, c, c, count, SP_INT32, SP_PROD, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, a, c, count, SP_FLOAT32, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, c, a, count, SP_FLOAT32, SP_SUM, nullptr));
    EXPECT_GT(log_.count(SP_LOG_INFO, "not symmetric kernels"), 0u);
    EXPECT_SP_OK(sp_free(c));
    EXPECT_SP_OK(sp_free(a));
    EXPECT_SP_OK(sp_free(b));
}

TEST_F(CudaDoubleMpi, AFailedCollectiveFailsOnEveryRank) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "collfail");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    inject("ncclAllReduce", ncclInternalError); // on every rank, before any rank waits
    sp_status_t s = sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr);
    EXPECT_EQ(s, SP_ERR_NCCL) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("internal error"), std::string::npos)
        << sp_last_error();
    ASSERT_SP_OK(sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr)); // it recovers
    EXPECT_SP_OK(sp_free(a));
}

TEST_F(CudaDoubleMpi, CollectiveAfterAnAbortSaysWhy) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "aborted");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    MPI_Barrier(MPI_COMM_WORLD);
    sp__world_nccl_abort(world_, "the test aborted it");
    EXPECT_EQ(sp__world_nccl_comm(world_), nullptr);
    sp_status_t s = sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr);
    EXPECT_NE(s, SP_SUCCESS);
    EXPECT_NE(std::string(sp_last_error()).find("the test aborted it"), std::string::npos)
        << sp_last_error();
    // The window went with the communicator: releasing the segment must still work.
    EXPECT_SP_OK(sp_free(a));
    EXPECT_SP_OK(sp_symmetric_empty_cache(pool_));
    void *b = nullptr;
    EXPECT_NE(sp_symmetric_malloc(pool_, 4096, nullptr, &b), SP_SUCCESS)
        << "no communicator, no new window";
}

TEST_F(CudaDoubleMpi, RegistrationFailureOnEveryRankAbortsAndFrees) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "regfail");
    inject("ncclCommWindowRegister", ncclInvalidUsage);
    void *a = nullptr;
    sp_status_t s = sp_symmetric_malloc(pool_, 4096, nullptr, &a);
    EXPECT_EQ(s, SP_ERR_NCCL) << sp_last_error();
    EXPECT_EQ(a, nullptr);
    EXPECT_EQ(sp__world_nccl_comm(world_), nullptr) << "aborted so that no rank waits in NCCL";
    EXPECT_EQ(hook<int (*)()>("cuda_double_live_vmm_handles")(), 0) << "the memory was freed";
}

TEST_F(CudaDoubleMpi, SymmetricOutOfMemoryRetriesThenNamesTheRanks) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "oom");
    // Two 200 MiB blocks on a 256 MiB double GPU: the second fails on every rank, after one
    // cache release and retry, with the figures.
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, size_t(200) << 20, nullptr, &a));
    sp_status_t s = sp_symmetric_malloc(pool_, size_t(200) << 20, nullptr, &b);
    EXPECT_EQ(s, SP_ERR_OUT_OF_MEMORY) << sp_last_error();
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("total capacity"), std::string::npos) << msg;
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_symmetric_empty_cache(pool_));
    // One rank's allocation fails once: it releases its cache, retries, and all go on.
    void *plain = nullptr;
    ASSERT_SP_OK(sp_malloc(8 << 20, sp_world_device(world_), nullptr, &plain));
    ASSERT_SP_OK(sp_free(plain)); // cached, to be released by the retry
    if (mpi_rank() == mpi_size() - 1)
        inject("ncclMemAlloc", ncclUnhandledCudaError);
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    EXPECT_SP_OK(sp_free(a));
}

TEST_F(CudaDoubleMpi, ReleaseFailuresAreReportedAndNothingLeaks) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "relfail");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    inject("ncclCommWindowDeregister", ncclInvalidArgument);
    inject("ncclMemFree", ncclUnhandledCudaError);
    sp_status_t s = sp_symmetric_empty_cache(pool_);
    EXPECT_NE(s, SP_SUCCESS) << "a failed deregistration is reported";
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    // The nccl registrar synchronizes the device before deregistering (the segment's stream may
    // have been destroyed by then).
    inject("cudaDeviceSynchronize", cudaErrorInvalidValue);
    EXPECT_NE(sp_symmetric_empty_cache(pool_), SP_SUCCESS);
}

TEST_F(CudaDoubleMpi, NcclVersionIsLoggedOnce) {
    NEED_DOUBLE();
    // Under CUDA_DOUBLE_NCCL_VERSION (another registration of this binary), the library loaded
    // differs from the headers and the first collective says so at WARN.
    const char *v = std::getenv("CUDA_DOUBLE_NCCL_VERSION");
    if (v)
        expect_warnings();
    make_pool(false, false, "version");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr));
    if (v) {
        EXPECT_GT(warnings("NCCL"), 0u);
    }
    EXPECT_SP_OK(sp_free(a));
}

} // namespace

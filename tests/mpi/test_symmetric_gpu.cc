// test_symmetric_gpu.cc: the nccl registrar on a real GPU (skips on the host backend). NCCL
// refuses two ranks of one communicator on one GPU, so rank 0 alone builds a one-rank world on
// MPI_COMM_SELF: NCCL communicator from a broadcast id, a symmetric pool whose segment is an
// ncclMemAlloc registered as an NCCL_WIN_COLL_SYMMETRIC window, a symmetric allocation, an
// ncclAllReduce on it, and the collective release (deregister before ncclMemFree). With one
// rank NCCL takes its one-rank path (no symmetric kernels); multi-rank runs need several GPUs.
// Run with SYMPOOL_TEST_DEVICE=cuda on a GPU machine.
#include <mpi.h>

#include <vector>

#include "mpi_util.hpp"

// Keyed on how the library was built, not on whether nccl.h happens to be on this file's include
// path: a library built with NCCL from elsewhere (PyTorch's wheel) must run this test, never
// compile it into a skip that ctest reports as passed.
#if defined(SP_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#define SP_TEST_HAVE_NCCL 1
#endif

extern "C" {
#include "world/world.h"
}

namespace {

// Every test here needs NCCL and the GPU, driven by rank 0 alone.
class SymmetricGpu : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
#if !defined(SP_TEST_HAVE_NCCL)
        GTEST_SKIP() << "sympool built without NCCL";
#else
        if (!sp::on_gpu())
            GTEST_SKIP() << "no GPU: the host backend uses the mpi registrar (other tests)";
        if (mpi_rank() != 0)
            GTEST_SKIP() << "rank 0 alone drives the GPU (NCCL refuses shared GPUs in one comm)";
#endif
    }
};

TEST_F(SymmetricGpu, NcclWindowAllocationAndAllReduceOnOneRank) {
#if defined(SP_TEST_HAVE_NCCL)
    sp_world_t *w = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_SELF, &w));
    ASSERT_NE(sp__world_nccl_comm(w), nullptr);
    sp_sym_counters_t c0;
    sp__symmetric_counters(-1, &c0);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_symmetric_mempool_create(w, nullptr, &pool));
    const size_t n = 1 << 18;
    float *buf = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool, n * sizeof(float), nullptr, (void **)&buf));
    sp_window_info_t wi;
    ASSERT_SP_OK(sp_symmetric_window(buf, &wi));
    EXPECT_EQ(wi.offset, 0u);
    EXPECT_EQ(wi.segment_seq, 0u);
    // NCCL gives a window when symmetric support is on (one rank: cuMem is enough); record it.
    RecordProperty("nccl_window", wi.window ? "yes" : "no");
    // This rank's own byte is reachable whatever NCCL maps for the others: the pointer itself.
    void *peer = nullptr;
    ASSERT_SP_OK(sp_symmetric_peer_ptr(buf, 0, &peer));
    EXPECT_EQ(peer, (void *)buf);

    std::vector<float> host(n);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)(i % 1000);
    ASSERT_EQ(cudaMemcpy(buf, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ncclComm_t comm = (ncclComm_t)sp__world_nccl_comm(w);
    ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    std::vector<float> back(n);
    ASSERT_EQ(cudaMemcpy(back.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host) << "a one-rank sum is the identity";

    ASSERT_SP_OK(sp_free(buf));
    ASSERT_SP_OK(sp_symmetric_empty_cache(pool));
    sp_sym_counters_t c1;
    sp__symmetric_counters(-1, &c1);
    EXPECT_EQ(c1.registrations - c0.registrations, 1);
    EXPECT_EQ(c1.deregistrations - c0.deregistrations, 1);
    ASSERT_SP_OK(sp_symmetric_mempool_destroy(pool));
    ASSERT_SP_OK(sp_world_finalize(w));
#endif
}

// NCCL 2.28 registers a "window" even without symmetric support (then a local buffer
// registration); sympool infers the support from NCCL's own rule and says so instead of claiming
// symmetric kernels apply. NCCL_WIN_ENABLE=0, set before the communicator exists, turns it off.
TEST_F(SymmetricGpu, WindowWithoutSymmetricSupportIsSaidToBeLocal) {
#if defined(SP_TEST_HAVE_NCCL)
    sp::ScopedEnv env({{"NCCL_WIN_ENABLE", "0"}});
    sp_world_t *w = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_SELF, &w));
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_symmetric_mempool_create(w, nullptr, &pool));
    expect_warnings();
    void *buf = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool, 4096, nullptr, &buf));
    sp_window_info_t wi;
    ASSERT_SP_OK(sp_symmetric_window(buf, &wi));
    if (wi.window) // 2.28: a local registration; 2.29 and later give no window at all
        EXPECT_EQ(warnings("no symmetric support in this world (NCCL_WIN_ENABLE=0)"), 1u);
    else
        EXPECT_EQ(warnings("no symmetric support"), 0u);
    ASSERT_SP_OK(sp_free(buf));
    ASSERT_SP_OK(sp_symmetric_mempool_destroy(pool));
    ASSERT_SP_OK(sp_world_finalize(w));
#endif
}

} // namespace

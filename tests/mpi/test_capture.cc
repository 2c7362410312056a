// test_capture.cc: what the cuda backend does differently, shown with the host backend's ops table
// wrapped: symmetric pools refuse to grow during CUDA graph capture, on every rank
// together (item 7: the wrapper answers "capturing" for one rank's stream, as cudaStreamIsCapturing
// would); and collectives on the cuda backend never take the host (MPI) path, so without an NCCL
// communicator they answer SP_ERR_NOT_SUPPORTED instead of reading device memory from the CPU
// (item 3: the wrapper is named "cuda").
#include "mpi_util.hpp"

#include <cstring>
#include <string>

extern "C" {
#include "pool/device/device.h"
#include <sympool/collectives.h>
#include "pool/pool.h"
}

namespace {

sp_stream_t g_captured = nullptr;
sp_status_t capturing(int device, sp_dev_stream_t stream, bool *capturing_p) {
    (void)device;
    *capturing_p = stream == g_captured;
    return SP_SUCCESS;
}

class Capture : public SymPoolTest {};

TEST_F(Capture, SymmetricGrowthDuringCaptureFailsOnEveryRank) {
    if (sp::on_gpu())
        GTEST_SKIP() << "wraps the host backend's ops";
    expect_warnings();
    make_pool(/*world_init=*/false, /*use_on_oom=*/false, "capture");
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(sp_world_device(world_), &s));
    sp_device_ops_t fake = sp__device_host_ops;
    fake.stream_capturing = capturing;
    const void *real = sp__pool_swap_device_ops(&fake);
    g_captured = mpi_rank() == 0 ? s : nullptr; // only rank 0 captures
    void *p = nullptr;
    sp_status_t st = sp_symmetric_malloc(pool_, 1 << 20, s, &p);
    std::string msg = sp_last_error();
    g_captured = nullptr;
    sp__pool_swap_device_ops(real);
    EXPECT_EQ(p, nullptr);
    if (mpi_rank() == 0) {
        EXPECT_EQ(st, SP_ERR_NOT_SUPPORTED) << msg;
        EXPECT_NE(msg.find("capturing a CUDA graph"), std::string::npos) << msg;
    } else {
        EXPECT_NE(st, SP_SUCCESS) << "a rank grew while rank 0 could not";
    }
    // Nothing half-done: after the capture the same call succeeds everywhere.
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 1 << 20, s, &p));
    ASSERT_SP_OK(sp_free(p));
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_SP_OK(sp_stream_synchronize(s));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

TEST_F(Capture, CollectivesOnCudaNeverRunTheHostPath) {
    if (sp::on_gpu())
        GTEST_SKIP() << "wraps the host backend's ops";
    expect_warnings();
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &world_));
    void *buf = nullptr;
    ASSERT_SP_OK(sp_malloc(64, sp_world_device(world_), nullptr, &buf));
    std::memset(buf, 0x11, 64);
    sp_device_ops_t fake = sp__device_host_ops;
    fake.name = "cuda"; // what the collectives and the torch entry points look at
    const void *real = sp__pool_swap_device_ops(&fake);
    EXPECT_STREQ(sp_backend_name(), "cuda");
    sp_status_t st = sp_allreduce(world_, buf, buf, 16, SP_INT32, SP_SUM, nullptr);
    std::string msg = sp_last_error();
    sp__pool_swap_device_ops(real);
    EXPECT_EQ(st, SP_ERR_NOT_SUPPORTED) << msg;
    EXPECT_NE(msg.find("NCCL"), std::string::npos) << msg;
    unsigned char want[64];
    std::memset(want, 0x11, sizeof want);
    EXPECT_EQ(std::memcmp(buf, want, sizeof want), 0) << "the host path ran on 'device' memory";
    ASSERT_SP_OK(sp_free(buf));
}

} // namespace

// test_capture.cc: symmetric pools refuse to grow during CUDA graph capture (issue 11 item 7),
// on every rank together. The host backend has no graphs, so its ops table is wrapped to answer
// "capturing" for one rank's stream, as the cuda backend's cudaStreamIsCapturing would.
#include "mpi_util.hpp"

#include <string>

extern "C" {
#include "pool/device/device.h"
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

} // namespace

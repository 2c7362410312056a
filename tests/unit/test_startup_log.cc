// test_startup_log.cc: what the first call logs: the INFO line says
// "unlimited" for an unlimited max_split_size rather than SIZE_MAX in bytes, and
// SYMPOOL_DEVICE=cuda on a machine without a usable GPU warns once per process, however often it is
// retried.
#include "sp_test.hpp"

#include <string>

extern "C" {
#include "core/core.h"
#include "pool/device/device.h"
}

namespace {

class StartupLog : public sp::Test {};

TEST_F(StartupLog, UnlimitedMaxSplitSizeSaysUnlimited) {
    {
        sp::ScopedEnv env({{"SYMPOOL_DEBUG", "INFO"},
                           {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                           {"SYMPOOL_ALLOC_CONF", nullptr}});
        ASSERT_SP_OK(sp_shutdown());
        ASSERT_SP_OK(sp_init());
        EXPECT_EQ(log_.count(SP_LOG_INFO, "max_split_size unlimited"), 1u);
        EXPECT_EQ(log_.count(SP_LOG_INFO, "18446744073709551615"), 0u);
        ASSERT_SP_OK(sp_shutdown());
    }
    sp::ScopedEnv env({{"SYMPOOL_DEBUG", "INFO"}, {"SYMPOOL_MAX_SPLIT_SIZE", "64MiB"}});
    ASSERT_SP_OK(sp_init());
    EXPECT_EQ(log_.count(SP_LOG_INFO, "max_split_size 67108864"), 1u);
    ASSERT_SP_OK(sp_shutdown());
}

TEST_F(StartupLog, CudaWithoutGpuWarnsOnce) {
    if (sp__device_cuda_available())
        GTEST_SKIP() << "a GPU answers here";
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "cuda"}});
    ASSERT_SP_OK(sp_shutdown());
    for (int i = 0; i < 3; i++) {
        sp_status_t s = sp_init();
        EXPECT_TRUE(s == SP_ERR_DEVICE || s == SP_ERR_NOT_SUPPORTED) << sp::describe(s);
        EXPECT_NE(std::string(sp_last_error()).find("cuda"), std::string::npos)
            << "every failed call keeps the explanation: " << sp_last_error();
    }
    void *p = nullptr;
    EXPECT_NE(sp_malloc(512, 0, nullptr, &p), SP_SUCCESS);
    const char *what = sp__device_cuda_ops() ? "cuda backend unavailable" : "built without CUDA";
    // ctest runs each test in its own process, so the one warning is this test's.
    EXPECT_EQ(warnings(what), 1u) << "the same warning repeated";
}

} // namespace

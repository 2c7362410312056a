// test_alloc_badinput.cc: bad input gets a status and a message and changes no statistic: a
// pointer sympool never returned, an interior pointer, a double free, an unknown device, a size
// that overflows the rounding, a NULL output pointer, a stream sympool did not make or of another
// device.
#include "alloc_test_util.hpp"

#include <string>

using namespace sp;

class AllocBadInput : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings();
    }
};

TEST_F(AllocBadInput, FreeOfForeignInteriorAndFreedPointers) {
    void *p;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    sp_stats_t before = snap();
    int local = 0;
    EXPECT_SP_STATUS(sp_free(&local), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("not a pointer sympool returned"),
              std::string::npos)
        << sp_last_error();
    EXPECT_SP_STATUS(sp_free((char *)p + 512), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("inside"), std::string::npos) << sp_last_error();
    EXPECT_EQ(diff(before, snap()), "");
    ASSERT_SP_OK(sp_free(p));
    sp_stats_t after_free = snap();
    EXPECT_SP_STATUS(sp_free(p), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("double free"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(diff(after_free, snap()), "");
    EXPECT_SP_OK(sp_free(nullptr));
}

TEST_F(AllocBadInput, UnknownDeviceSizeAboveDeviceNullOutput) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "1GiB"}});
    void *p = &p;
    sp_stats_t before = snap();
    EXPECT_SP_STATUS(sp_malloc(512, 5, nullptr, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_malloc(512, -1, nullptr, &p), SP_ERR_INVALID_ARGUMENT);
    // A size above the device is an OOM (test_oom_semantics.cc), and 1 EB or more, SIZE_MAX
    // included, PyTorch's uncounted "more than 1EB" OOM.
    EXPECT_SP_STATUS(sp_malloc(SIZE_MAX, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_SP_STATUS(sp_malloc((size_t)1 << 62, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, (void *)&p) << "the output is written only on success";
    EXPECT_SP_STATUS(sp_malloc(512, 0, nullptr, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(diff(before, snap()), "") << "no stat changes, num_ooms included";
    EXPECT_SP_STATUS(sp_malloc(2 * GiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(sp_last_error()).find("Tried to allocate 2.00 GiB"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(diff(before, snap()), "num_alloc_retries num_ooms num_sync_all_streams ");
    size_t f, t;
    EXPECT_SP_STATUS(sp_get_memory_info(4, &f, &t), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_get_memory_info(0, nullptr, &t), SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(sp_get_memory_info(0, &f, &t));
    EXPECT_EQ(t, GiB);
}

TEST_F(AllocBadInput, ShutdownWithLiveBlocksIsBusyAndReleasesNothing) {
    void *p;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    const std::string backend = sp_backend_name();
    EXPECT_SP_STATUS(sp_shutdown(), SP_ERR_BUSY);
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(2 * MiB));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_shutdown());
    EXPECT_EQ(sp_backend_name(), backend) << "the next call initializes again";
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(AllocBadInput, FreeBeforeInitIsRejected) {
    ASSERT_SP_OK(sp_shutdown());
    int x;
    EXPECT_SP_STATUS(sp_free(&x), SP_ERR_INVALID_USAGE);
}

TEST_F(AllocBadInput, ForeignStreamOrStreamOfAnotherDevice) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}});
    SP_SKIP_UNLESS_HOST();
    sp_stream_t other_dev;
    ASSERT_SP_OK(sp_stream_create(1, &other_dev));
    sp_stats_t before = snap();
    int not_a_stream = 0;
    void *p = &p;
    EXPECT_SP_STATUS(sp_malloc(4096, 0, (sp_stream_t)&not_a_stream, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_malloc(4096, 0, other_dev, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("belongs to device 1"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(p, (void *)&p) << "the output is written only on success";
    EXPECT_EQ(diff(before, snap()), "") << "no segment, no stat change";
    EXPECT_EQ(std::string(sp_last_error()).rfind("sp_malloc: ", 0), 0u) << sp_last_error();
    // A MemPool's allocation names its own call (it shares sp_malloc's path).
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &pool));
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 4096, other_dev, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(sp_last_error()).rfind("sp_mempool_malloc: stream ", 0), 0u)
        << sp_last_error();
    EXPECT_EQ(p, (void *)&p) << "the output is written only on success";
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    // The same stream on its own device is fine.
    ASSERT_SP_OK(sp_malloc(4096, 1, other_dev, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_stream_destroy(other_dev));
}

// A destroyed stream is refused even when a cached block keyed by it exists: the hit path never
// asks the backend about the stream, so destroying one releases its free cached segments. Fixed
// and expandable segments both: the setting is pinned for each run, so that a
// SYMPOOL_ALLOC_CONF in the environment (the suite run with expandable segments) decides neither.
TEST_F(AllocBadInput, DestroyedStreamIsRefusedAlsoOnACacheHit) {
    SP_SKIP_UNLESS_HOST(); // a host stream's pointer is invalid once destroyed; CUDA's may be
                           // reused
    for (const char *conf : {(const char *)nullptr, "expandable_segments:True"}) {
        SCOPED_TRACE(conf ? conf : "default settings");
        ASSERT_SP_OK(sp_shutdown()); // the setting is read when the allocator starts
        sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", conf}});
        sp_stream_t s;
        ASSERT_SP_OK(sp_stream_create(0, &s));
        void *p = nullptr, *q = nullptr;
        ASSERT_SP_OK(sp_malloc(4096, 0, s, &p));
        ASSERT_SP_OK(sp_malloc(3 * sp::MiB, 0, s, &q));
        const int64_t reserved = stat("reserved_bytes.all.current");
        ASSERT_SP_OK(sp_free(p)); // both cached under s
        ASSERT_SP_OK(sp_free(q));
        EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
        EXPECT_GT(reserved, 0);
        EXPECT_EQ(stat("reserved_bytes.all.current"), reserved) << "the frees kept them cached";
        if (conf == nullptr) { // PyTorch's figures: a 2 MiB small segment and a 20 MiB large one
            EXPECT_EQ(reserved, (int64_t)(2 * sp::MiB + 20 * sp::MiB));
        }
        ASSERT_SP_OK(sp_stream_destroy(s));
        EXPECT_EQ(stat("reserved_bytes.all.current"), 0) << "its free segments went with it";
        void *r = &r;
        EXPECT_SP_STATUS(sp_malloc(4096, 0, s, &r), SP_ERR_INVALID_ARGUMENT);
        EXPECT_SP_STATUS(sp_malloc(3 * sp::MiB, 0, s, &r), SP_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(r, (void *)&r);
        ASSERT_SP_OK(sp_shutdown()); // the allocator does not outlive the setting
    }
}

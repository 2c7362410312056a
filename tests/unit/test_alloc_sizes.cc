// test_alloc_sizes.cc: PyTorch's size rules on the host backend: 512-byte rounding and
// roundup_power2_divisions, the small/large pool boundary at 1 MiB, and segment sizes
// (2 MiB / large_segment_size / 2 MiB-rounded).
#include "alloc_test_util.hpp"

extern "C" {
#include "pool/pool.h"
}

extern "C" size_t sp__round_size(size_t size);
extern "C" size_t sp__roundup_power2_next_division(size_t size, size_t divisions);

using namespace sp;

class AllocSizes : public sp::Test {};

TEST_F(AllocSizes, RoundingTable) {
    ASSERT_SP_OK(sp_init());
    EXPECT_EQ(sp__round_size(1), 512u);
    EXPECT_EQ(sp__round_size(511), 512u);
    EXPECT_EQ(sp__round_size(512), 512u);
    EXPECT_EQ(sp__round_size(513), 1024u);
    EXPECT_EQ(sp__round_size(1200), 1536u);
    EXPECT_EQ(sp__round_size(MiB + 1), MiB + 512);
    EXPECT_EQ(sp__round_size(100 * MiB + 3), 100 * MiB + 512);
}

TEST_F(AllocSizes, RoundupPower2Divisions) {
    // The division step itself: 1200 with 4 divisions goes to the next 256 = 1280.
    EXPECT_EQ(sp__roundup_power2_next_division(1200, 4), 1280u);
    EXPECT_EQ(sp__roundup_power2_next_division(1024, 4), 1024u); // powers of two stay
    EXPECT_EQ(sp__roundup_power2_next_division(MiB + 1, 4), MiB + 256 * KiB);
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "roundup_power2_divisions:4"}});
    ASSERT_SP_OK(sp_init());
    // round_size applies divisions only above 512 * divisions (2048 here), as PyTorch does.
    EXPECT_EQ(sp__round_size(1200), 1536u);
    EXPECT_EQ(sp__round_size(2049), 2560u);
    EXPECT_EQ(sp__round_size(3000), 3072u);
    EXPECT_EQ(sp__round_size(MiB + 1), MiB + 256 * KiB);
    EXPECT_EQ(sp__round_size(5 * MiB), 5 * MiB);
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(MiB + 1, 0, nullptr, &p));
    EXPECT_EQ(stat("allocated_bytes.all.current"), (int64_t)(MiB + 256 * KiB));
    EXPECT_EQ(stat("requested_bytes.all.current"), (int64_t)(MiB + 1));
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(AllocSizes, PoolChoiceAtOneMiB) {
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_malloc(MiB, 0, nullptr, &a));
    EXPECT_EQ(stat("allocation.small_pool.current"), 1);
    EXPECT_EQ(stat("allocation.large_pool.current"), 0);
    ASSERT_SP_OK(sp_malloc(MiB + 1, 0, nullptr, &b));
    EXPECT_EQ(stat("allocation.small_pool.current"), 1);
    EXPECT_EQ(stat("allocation.large_pool.current"), 1);
    EXPECT_EQ(stat("allocation.all.current"), 2);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(AllocSizes, SegmentSizes) {
    struct {
        size_t req, seg;
        const char *type;
    } cases[] = {{1, 2 * MiB, "small_pool"},         {MiB, 2 * MiB, "small_pool"},
                 {MiB + 1, 20 * MiB, "large_pool"},  {10 * MiB - 513, 20 * MiB, "large_pool"},
                 {10 * MiB, 10 * MiB, "large_pool"}, {11 * MiB + 1, 12 * MiB, "large_pool"},
                 {33 * MiB, 34 * MiB, "large_pool"}};
    for (auto &c : cases) {
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(c.req, 0, nullptr, &p));
        std::string key = std::string("reserved_bytes.") + c.type + ".current";
        EXPECT_EQ(stat(key.c_str()), (int64_t)c.seg) << "request " << c.req;
        EXPECT_EQ(stat("segment.all.current"), 1) << "request " << c.req;
        ASSERT_SP_OK(sp_free(p));
        ASSERT_SP_OK(sp_empty_cache());
        EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    }
}

TEST_F(AllocSizes, LargeSegmentSizeOption) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "large_segment_size_mb:64"}});
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(2 * MiB, 0, nullptr, &p));
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(64 * MiB));
    ASSERT_SP_OK(sp_free(p));
}

// The large segment serves every request below 10 MiB, so it is validated: below 10 MiB, above
// 1 TiB or not a multiple of 2 MiB is refused (a warning, the default stays); every value in
// force serves the largest such request and frees it. Below 10 MiB used to be accepted, then
// segments were smaller than requests and frees failed.
TEST_F(AllocSizes, LargeSegmentSizeWholeRange) {
    expect_warnings();
    struct Case {
        const char *env, *conf;
        size_t want; // in force afterwards; 20 MiB = the default (refused)
    };
    const Case cases[] = {
        {"0", nullptr, 20 * MiB},
        {"1", nullptr, 20 * MiB},
        {"1MiB", nullptr, 20 * MiB},
        {"9MiB", nullptr, 20 * MiB},
        {"10485760", nullptr, 10 * MiB},
        {"10485761", nullptr, 20 * MiB},
        {"11MiB", nullptr, 20 * MiB},
        {"12MiB", nullptr, 12 * MiB},
        {"64MiB", nullptr, 64 * MiB},
        {"1TiB", nullptr, (size_t)1 << 40},
        {"1026GiB", nullptr, 20 * MiB},
        {"8EiB", nullptr, 20 * MiB},
        {"-1", nullptr, 20 * MiB},
        {nullptr, "large_segment_size_mb:0", 20 * MiB},
        {nullptr, "large_segment_size_mb:1", 20 * MiB},
        {nullptr, "large_segment_size_mb:9", 20 * MiB},
        {nullptr, "large_segment_size_mb:10", 10 * MiB},
        {nullptr, "large_segment_size_mb:11", 20 * MiB},
        {nullptr, "large_segment_size_mb:22", 22 * MiB},
        {nullptr, "large_segment_size_mb:1048576", (size_t)1 << 40},
        {nullptr, "large_segment_size_mb:1048578", 20 * MiB},
        {nullptr, "large_segment_size_mb:18446744073709551615", 20 * MiB},
    };
    for (const Case &c : cases) {
        std::string what = c.env ? std::string("SYMPOOL_LARGE_SEGMENT_SIZE=") + c.env
                                 : std::string("SYMPOOL_ALLOC_CONF=") + c.conf;
        sp::ScopedEnv env({{"SYMPOOL_LARGE_SEGMENT_SIZE", c.env},
                           {"SYMPOOL_ALLOC_CONF", c.conf},
                           {"SYMPOOL_HOST_CAPACITY", "64MiB"}});
        EXPECT_EQ((size_t)sp__option_int(SP_OPT_LARGE_SEGMENT_SIZE), c.want) << what;
        SCOPED_TRACE(what);
        void *p = nullptr, *q = nullptr;
        sp_status_t s = sp_malloc(10 * MiB - 512, 0, nullptr, &p); // the largest it serves
        if (c.want > 64 * MiB) {
            EXPECT_EQ(s, SP_ERR_OUT_OF_MEMORY) << what; // a segment larger than the device
        } else {
            ASSERT_SP_OK(s);
            ASSERT_SP_OK(sp_malloc(MiB + 512, 0, nullptr, &q));
            sp_block_info_t bi;
            ASSERT_SP_OK(sp__pool_lookup(p, &bi));
            EXPECT_GE(bi.segment_size, 10 * MiB - 512) << what;
            ASSERT_SP_OK(sp_free(q));
            ASSERT_SP_OK(sp_free(p));
        }
        ASSERT_SP_OK(sp_shutdown()); // the next case initializes with its own settings
    }
}

TEST_F(AllocSizes, ZeroSizeGivesNull) {
    void *p = &p;
    ASSERT_SP_OK(sp_malloc(0, 0, nullptr, &p));
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(stat("num_device_alloc"), 0);
}

// test_alloc_split.cc: the split rule at its boundaries (large pool: remaining > 1 MiB strictly,
// and only below max_split_size; small pool: remaining >= 512), low-address placement, merging
// with both neighbours and the inactive_split stats, and the oversize rules of max_split_size_mb
// and max_non_split_rounding_mb.
#include "alloc_test_util.hpp"

using namespace sp;

class AllocSplit : public sp::Test {};

TEST_F(AllocSplit, LargeRemainingExactlyOneMiBIsNotSplit) {
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(19 * MiB, 0, nullptr, &p)); // 20 MiB segment, 1 MiB would remain
    EXPECT_EQ(stat("allocated_bytes.large_pool.current"), (int64_t)(20 * MiB));
    EXPECT_EQ(stat("requested_bytes.large_pool.current"), (int64_t)(19 * MiB));
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    EXPECT_EQ(sp_mempool_n_free_blocks(sp_default_mempool(0)), 0u);
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(AllocSplit, LargeRemainingAboveOneMiBIsSplit) {
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(19 * MiB - 512, 0, nullptr, &p)); // 1 MiB + 512 remains
    EXPECT_EQ(stat("allocated_bytes.large_pool.current"), (int64_t)(19 * MiB - 512));
    EXPECT_EQ(stat("inactive_split.large_pool.current"), 1);
    EXPECT_EQ(stat("inactive_split_bytes.large_pool.current"), (int64_t)(MiB + 512));
    EXPECT_EQ(sp_mempool_n_free_blocks(sp_default_mempool(0)), 1u);
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("inactive_split.large_pool.current"), 0);
    EXPECT_EQ(stat("inactive_split_bytes.large_pool.current"), 0);
    EXPECT_EQ(sp_mempool_n_free_blocks(sp_default_mempool(0)), 1u);
}

TEST_F(AllocSplit, SmallPoolSplitsDownTo512) {
    void *a = nullptr, *b = nullptr, *c = nullptr;
    ASSERT_SP_OK(sp_malloc(MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(MiB - 512, 0, nullptr, &b)); // leaves exactly 512: still split
    EXPECT_EQ((char *)b, (char *)a + MiB) << "the allocation takes the low addresses";
    EXPECT_EQ(stat("inactive_split.small_pool.current"), 1);
    EXPECT_EQ(stat("inactive_split_bytes.small_pool.current"), 512);
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &c)); // takes the last 512, no split
    EXPECT_EQ((char *)c, (char *)a + 2 * MiB - 512);
    EXPECT_EQ(stat("inactive_split.small_pool.current"), 0);
    EXPECT_EQ(stat("inactive_split_bytes.small_pool.current"), 0);
    EXPECT_EQ(stat("segment.all.current"), 1);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_free(c));
}

TEST_F(AllocSplit, MergeOnBothSides) {
    void *a, *b, *c;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &b));
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &c));
    EXPECT_EQ((char *)b, (char *)a + 512);
    EXPECT_EQ((char *)c, (char *)a + 1024);
    EXPECT_EQ(stat("inactive_split.all.current"), 1); // the tail after c
    ASSERT_SP_OK(sp_free(a));
    EXPECT_EQ(stat("inactive_split.all.current"), 2);
    EXPECT_EQ(stat("inactive_split_bytes.all.current"), (int64_t)(2 * MiB - 1024));
    ASSERT_SP_OK(sp_free(c)); // merges with the tail
    EXPECT_EQ(stat("inactive_split.all.current"), 2);
    EXPECT_EQ(sp_mempool_n_free_blocks(sp_default_mempool(0)), 2u);
    ASSERT_SP_OK(sp_free(b)); // merges with a and with c+tail: one whole block
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    EXPECT_EQ(stat("inactive_split_bytes.all.current"), 0);
    EXPECT_EQ(sp_mempool_n_free_blocks(sp_default_mempool(0)), 1u);
    EXPECT_EQ(stat("active.all.current"), 0);
    // The whole segment is free again: empty_cache releases it.
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("segment.all.current"), 0);
    EXPECT_EQ(stat("num_device_free"), 1);
}

TEST_F(AllocSplit, BestFitIsSmallestLargeEnoughBlock) {
    void *big, *sep1, *small, *sep2, *p;
    ASSERT_SP_OK(sp_malloc(8192, 0, nullptr, &big));
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &sep1));
    ASSERT_SP_OK(sp_malloc(2048, 0, nullptr, &small));
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &sep2));
    ASSERT_SP_OK(sp_free(big));
    ASSERT_SP_OK(sp_free(small));
    ASSERT_SP_OK(sp_malloc(1500, 0, nullptr, &p));
    EXPECT_EQ(p, small) << "1536 bytes fit best in the 2048-byte hole";
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    EXPECT_EQ(p, big);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(sep1));
    ASSERT_SP_OK(sp_free(sep2));
}

TEST_F(AllocSplit, FreeBlocksAreReusedOnlyOnTheirStream) {
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_malloc(4096, 0, s, &b));
    EXPECT_NE(a, b);
    EXPECT_EQ(stat("segment.all.current"), 2);
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

TEST_F(AllocSplit, MaxSplitSizeOversizeRules) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:20"}});
    EXPECT_EQ(stat("max_split_size"), (int64_t)(20 * MiB));
    void *a, *b, *c;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &a));
    EXPECT_EQ(stat("oversize_allocations.current"), 1);
    EXPECT_EQ(stat("oversize_segments.current"), 1);
    ASSERT_SP_OK(sp_free(a));
    EXPECT_EQ(stat("oversize_allocations.current"), 0);
    EXPECT_EQ(stat("oversize_segments.current"), 1);
    // A request below max_split_size never takes an oversize block: it gets a new segment.
    ASSERT_SP_OK(sp_malloc(5 * MiB, 0, nullptr, &b));
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(50 * MiB));
    // An oversize request takes the 30 MiB block whole (no split), within 20 MiB of rounding.
    ASSERT_SP_OK(sp_malloc(25 * MiB, 0, nullptr, &c));
    EXPECT_EQ(c, a);
    EXPECT_EQ(stat("allocated_bytes.all.current"), (int64_t)(5 * MiB + 30 * MiB));
    EXPECT_EQ(stat("inactive_split.large_pool.current"), 1); // only b's segment is split
    ASSERT_SP_OK(sp_free(c));
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(AllocSplit, MaxNonSplitRounding) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:20"}});
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(50 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    // 50 MiB >= 22 MiB + 20 MiB: too wasteful, a new 22 MiB segment is made instead.
    ASSERT_SP_OK(sp_malloc(22 * MiB, 0, nullptr, &b));
    EXPECT_NE(a, b);
    EXPECT_EQ(stat("segment.all.current"), 2);
    ASSERT_SP_OK(sp_free(b));
    // 50 MiB < 31 MiB + 20 MiB: taken whole.
    ASSERT_SP_OK(sp_malloc(31 * MiB, 0, nullptr, &b));
    EXPECT_EQ(a, b);
    EXPECT_EQ(stat("allocated_bytes.all.current"), (int64_t)(50 * MiB));
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(AllocSplit, DefaultMaxSplitSizeIsMinusOne) {
    EXPECT_EQ(stat("max_split_size"), -1);
    void *a;
    ASSERT_SP_OK(sp_malloc(100 * MiB, 0, nullptr, &a));
    EXPECT_EQ(stat("oversize_allocations.current"), 0);
    EXPECT_EQ(stat("oversize_segments.current"), 0);
    ASSERT_SP_OK(sp_free(a));
}

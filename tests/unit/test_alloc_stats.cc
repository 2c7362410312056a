// test_alloc_stats.cc: the 122 memory_stats keys (names exact, sorted as Python sorts them), the
// deltas of every key for malloc, free and empty_cache, and the two resets.
#include "alloc_test_util.hpp"

#include <cstring>
#include <map>
#include <set>

using namespace sp;

class AllocStats : public sp::Test {};

TEST_F(AllocStats, KeysAreExactAndSorted) {
    ASSERT_EQ(sp_stats_count(), 122u);
    std::set<std::string> names;
    for (size_t i = 0; i < sp_stats_count(); i++) {
        ASSERT_NE(sp_stats_key(i), nullptr);
        names.insert(sp_stats_key(i));
        if (i > 0) {
            EXPECT_LT(std::strcmp(sp_stats_key(i - 1), sp_stats_key(i)), 0) << i;
        }
    }
    EXPECT_EQ(names.size(), 122u);
    EXPECT_EQ(sp_stats_key(122), nullptr);
    EXPECT_STREQ(sp_stats_key(0), "active.all.allocated");
    EXPECT_STREQ(sp_stats_key(121), "segment.small_pool.peak");
    for (const char *k : {"allocation.large_pool.peak", "max_split_size", "num_sync_all_streams",
                          "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                          "oversize_segments.peak", "oversize_allocations.freed",
                          "requested_bytes.small_pool.current", "inactive_split_bytes.all.freed"})
        EXPECT_EQ(names.count(k), 1u) << k;
    EXPECT_EQ(names.count("allocated.all.current"), 0u) << "the real key is allocation.*";
    sp_stats_t st = snap();
    int64_t v;
    EXPECT_SP_STATUS(sp_stats_get(&st, "allocated.all.current", &v), SP_ERR_INVALID_ARGUMENT);
    expect_warnings();
}

TEST_F(AllocStats, DeltasOfMallocFreeAndEmptyCache) {
    sp_stats_t s0 = snap();
    void *p;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
    sp_stats_t s1 = snap();
    std::map<std::string, int64_t> want = {
        {"allocation.all.current", 1},
        {"allocation.small_pool.current", 1},
        {"allocation.all.allocated", 1},
        {"allocation.all.peak", 1},
        {"allocated_bytes.all.current", 1024},
        {"allocated_bytes.small_pool.allocated", 1024},
        {"active.all.current", 1},
        {"active_bytes.all.current", 1024},
        {"requested_bytes.all.current", 1000},
        {"requested_bytes.small_pool.peak", 1000},
        {"segment.all.current", 1},
        {"segment.small_pool.allocated", 1},
        {"reserved_bytes.all.current", (int64_t)(2 * MiB)},
        {"inactive_split.all.current", 1},
        {"inactive_split_bytes.all.current", (int64_t)(2 * MiB - 1024)},
        {"num_device_alloc", 1},
        {"allocation.large_pool.current", 0},
        {"reserved_bytes.large_pool.current", 0},
        {"num_device_free", 0}};
    for (auto &kv : want) {
        int64_t a, b;
        ASSERT_SP_OK(sp_stats_get(&s0, kv.first.c_str(), &a));
        ASSERT_SP_OK(sp_stats_get(&s1, kv.first.c_str(), &b));
        EXPECT_EQ(b - a, kv.second) << kv.first;
    }
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("allocation.all.freed"), 1);
    EXPECT_EQ(stat("allocated_bytes.all.freed"), 1024);
    EXPECT_EQ(stat("active_bytes.all.freed"), 1024);
    EXPECT_EQ(stat("requested_bytes.all.freed"), 1000);
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    EXPECT_EQ(stat("inactive_split.all.freed"), 1);
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(2 * MiB)) << "cached, not released";
    EXPECT_EQ(stat("allocated_bytes.all.peak"), 1024);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(stat("reserved_bytes.all.freed"), (int64_t)(2 * MiB));
    EXPECT_EQ(stat("segment.all.freed"), 1);
    EXPECT_EQ(stat("num_device_free"), 1);
    EXPECT_EQ(stat("num_sync_all_streams"), 1);
    EXPECT_EQ(sp_memory_allocated(0), 0u);
    EXPECT_EQ(sp_max_memory_allocated(0), 1024u);
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    EXPECT_EQ(sp_max_memory_reserved(0), 2 * MiB);
}

TEST_F(AllocStats, CacheHitChangesNoSegmentStat) {
    void *p;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    sp_stats_t a = snap();
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    sp_stats_t b = snap();
    std::string changed = diff(a, b);
    EXPECT_EQ(changed.find("segment"), std::string::npos) << changed;
    EXPECT_EQ(changed.find("num_device_alloc"), std::string::npos) << changed;
    EXPECT_NE(changed.find("allocation.all.current"), std::string::npos) << changed;
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(AllocStats, ResetPeakAndAccumulated) {
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(8 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &b));
    ASSERT_SP_OK(sp_free(a));
    EXPECT_EQ(stat("allocated_bytes.all.peak"), (int64_t)(8 * MiB + 512));
    ASSERT_SP_OK(sp_reset_peak_memory_stats(0));
    EXPECT_EQ(stat("allocated_bytes.all.peak"), 512);
    EXPECT_EQ(stat("allocated_bytes.large_pool.peak"), 0);
    EXPECT_EQ(stat("reserved_bytes.all.peak"), (int64_t)(22 * MiB));
    EXPECT_EQ(stat("allocation.all.allocated"), 2) << "peak reset keeps accumulated counts";
    ASSERT_SP_OK(sp_empty_cache());
    ASSERT_SP_OK(sp_reset_accumulated_memory_stats(0));
    EXPECT_EQ(stat("allocation.all.allocated"), 0);
    EXPECT_EQ(stat("allocation.all.freed"), 0);
    EXPECT_EQ(stat("allocation.all.current"), 1) << "current is not reset";
    EXPECT_EQ(stat("num_device_alloc"), 0);
    EXPECT_EQ(stat("num_device_free"), 0);
    EXPECT_EQ(stat("num_sync_all_streams"), 0);
    EXPECT_EQ(stat("max_split_size"), -1) << "kept";
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(AllocStats, BadDeviceAndNullArguments) {
    expect_warnings();
    sp_stats_t st;
    EXPECT_SP_STATUS(sp_memory_stats(7, &st), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_memory_stats(-1, &st), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_memory_stats(0, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_reset_peak_memory_stats(9), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp_memory_allocated(9), 0u);
    EXPECT_EQ(sp_stats_value(nullptr, 0), 0);
}

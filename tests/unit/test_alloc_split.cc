// test_alloc_split.cc: the split rule at its boundaries (large pool: remaining > 1 MiB strictly,
// and only below max_split_size; small pool: remaining >= 512), low-address placement, merging
// with both neighbours and the inactive_split stats, and the oversize rules of max_split_size_mb
// and max_non_split_rounding_mb.
#include "alloc_test_util.hpp"

#include <array>
#include <random>
#include <vector>

extern "C" {
#include "pool/pool.h"
}

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

// sp_malloc and sp_free try a call-free form of the cache hit and of the free first and fall back
// to the whole path for anything else; with memory history on they always take the whole path.
// Seeded random runs (sizes of both pools, two streams, frees in random order) must give the
// same block for every malloc (segment sequence number, offset, size) and the same 122 stats in
// both modes. The host arena gives both runs the same order of segment addresses, which breaks
// best fit's ties (lowest address) the same way; with an mmap per segment the kernel may place
// the second run's segments in another order (seen under ASan). The stats are compared every
// 250 calls, not only at the end, so that a wrong step the later ones undo (a current value
// back where it was) is still seen, in its peak or in the value between.
//
// `steps`: training-like traffic instead of independent random calls: the same sequence of
// sizes every step, most of it freed in a shuffled order, so that after the first step most
// mallocs find a cached block of exactly their size (handed out whole: HIT_WHOLE) and many
// frees find no free neighbour (FREE_ALONE), beside the split hits and one-neighbour merges.
namespace {
struct RunResult {
    std::vector<std::array<uint64_t, 3>> blocks;
    std::vector<int64_t> stats;
};

void add_stats(RunResult *r) {
    sp_stats_t st;
    EXPECT_EQ(sp_memory_stats(0, &st), SP_SUCCESS);
    for (size_t i = 0; i < sp_stats_count(); i++)
        r->stats.push_back(sp_stats_value(&st, i));
}

RunResult random_run(bool history, uint64_t seed, bool steps = false) {
    if (history) {
        sp_history_params_t hp;
        sp_history_params_init(&hp);
        hp.enabled = SP_HISTORY_STATE;
        EXPECT_EQ(sp_record_memory_history(&hp), SP_SUCCESS);
    }
    sp_stream_t s2;
    EXPECT_EQ(sp_stream_create(0, &s2), SP_SUCCESS);
    std::mt19937_64 rng(seed);
    std::vector<void *> live;
    RunResult r;
    const size_t sizes[] = {1,     512,     700,           1024,    1536,    4096,
                            65536, 1 << 20, (1 << 20) + 1, 3 << 20, 12 << 20};
    const size_t nsizes = sizeof sizes / sizeof sizes[0];
    std::vector<std::pair<size_t, bool>> step; // (size, on s2) of each malloc of a step
    for (int i = 0; steps && i < 48; i++)
        step.push_back({sizes[rng() % nsizes] + rng() % 3 * 512, rng() % 8 == 0});
    size_t at = 0, to_free = 0; // the next malloc of the step; the frees left before it
    for (int i = 0; i < 4000; i++) {
        if (i % 250 == 0)
            add_stats(&r);
        bool alloc = live.empty() || rng() % 100 < 55;
        if (steps) {
            // Once a step's mallocs are done, all but a sixth of the live blocks are freed
            // (random picks below), then the next step starts.
            if (at == step.size() && to_free == 0) {
                at = 0;
                to_free = live.size() * 5 / 6;
            }
            alloc = to_free == 0;
            if (!alloc)
                to_free--;
        }
        if (alloc) {
            size_t size = steps ? step[at].first : sizes[rng() % nsizes] + rng() % 3 * 512;
            sp_stream_t s = (steps ? step[at].second : rng() % 4 == 0) ? s2 : nullptr;
            at++;
            void *p = nullptr;
            EXPECT_EQ(sp_malloc(size, 0, s, &p), SP_SUCCESS);
            sp_block_info_t bi;
            EXPECT_EQ(sp__pool_lookup(p, &bi), SP_SUCCESS);
            r.blocks.push_back({bi.segment_seq | (uint64_t)bi.segment_size << 20,
                                (uint64_t)((char *)p - (char *)bi.segment_base), bi.block_size});
            live.push_back(p);
        } else {
            size_t k = rng() % live.size();
            EXPECT_EQ(sp_free(live[k]), SP_SUCCESS);
            live[k] = live.back();
            live.pop_back();
        }
    }
    for (void *p : live)
        EXPECT_EQ(sp_free(p), SP_SUCCESS);
    add_stats(&r);
    EXPECT_EQ(sp_stream_destroy(s2), SP_SUCCESS);
    if (history) {
        sp_history_params_t hp;
        sp_history_params_init(&hp);
        hp.enabled = SP_HISTORY_OFF;
        EXPECT_EQ(sp_record_memory_history(&hp), SP_SUCCESS);
    }
    return r;
}
} // namespace

TEST_F(AllocSplit, FastHitAndFreeMatchTheWholePath) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    for (uint64_t seed = 1; seed <= 6; seed++) {
        bool steps = seed > 3;
        RunResult fast = random_run(false, seed, steps);
        ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
        RunResult whole = random_run(true, seed, steps);
        ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
        ASSERT_EQ(fast.blocks.size(), whole.blocks.size());
        for (size_t i = 0; i < fast.blocks.size(); i++)
            ASSERT_EQ(fast.blocks[i], whole.blocks[i]) << "seed " << seed << ", malloc " << i;
        for (size_t i = 0; i < fast.stats.size(); i++)
            ASSERT_EQ(fast.stats[i], whole.stats[i])
                << "seed " << seed << ", " << sp_stats_key(i % sp_stats_count()) << " (check "
                << i / sp_stats_count() << ")";
    }
}

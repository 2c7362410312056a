// test_alloc_mempool.cc: the MemPool semantics the allocator implements, as far as the allocator
// needs to be sure of them (the full MemPool suite is test_mempool*.cc): ids, use counts and
// nested routing, the pluggable allocator's calls and sizes, use_on_oom lending and the lent
// block's return, limits, and destroy with live blocks.
#include "alloc_test_util.hpp"

#include <cstdlib>
#include <string>
#include <vector>

using namespace sp;

class AllocMemPool : public sp::Test {};

TEST_F(AllocMemPool, IdsUseCountsAndNestedRouting) {
    sp_mempool_t *a, *b;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &a));
    ASSERT_SP_OK(sp_mempool_create(nullptr, &b));
    EXPECT_EQ(sp_mempool_id(a).first, 0u);
    EXPECT_EQ(sp_mempool_id(b).second, sp_mempool_id(a).second + 1);
    EXPECT_EQ(sp_mempool_id(sp_default_mempool(0)).second, 0u);
    EXPECT_EQ(sp_mempool_use_count(a), 1);
    ASSERT_SP_OK(sp_mempool_begin(a));
    ASSERT_SP_OK(sp_mempool_begin(b));
    EXPECT_EQ(sp_mempool_use_count(a), 2);
    void *pb, *pa, *pd;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &pb));
    expect_warnings();
    EXPECT_SP_STATUS(sp_mempool_end(a), SP_ERR_INVALID_USAGE);     // "a is not innermost"
    EXPECT_SP_STATUS(sp_mempool_begin(a), SP_ERR_INVALID_USAGE);   // "already routed"
    EXPECT_SP_STATUS(sp_mempool_destroy(a), SP_ERR_INVALID_USAGE); // "still routed"
    ASSERT_SP_OK(sp_mempool_end(b));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &pa));
    ASSERT_SP_OK(sp_mempool_end(a));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &pd));
    EXPECT_EQ(sp_mempool_use_count(a), 1);
    EXPECT_EQ(sp_mempool_used_bytes(a), 4096u);
    EXPECT_EQ(sp_mempool_used_bytes(b), 4096u);
    EXPECT_EQ(sp_mempool_used_bytes(sp_default_mempool(0)), 4096u);
    EXPECT_EQ(stat("allocation.all.current"), 3) << "all pools count in the device stats";
    // A block returns to its pool whoever frees it, and is reused there.
    ASSERT_SP_OK(sp_free(pa));
    void *again;
    ASSERT_SP_OK(sp_mempool_malloc(a, 4096, nullptr, &again));
    EXPECT_EQ(again, pa);
    ASSERT_SP_OK(sp_free(again));
    ASSERT_SP_OK(sp_free(pb));
    ASSERT_SP_OK(sp_free(pd));
    ASSERT_SP_OK(sp_mempool_destroy(a));
    ASSERT_SP_OK(sp_mempool_destroy(b));
    EXPECT_EQ(stat("segment.all.current"), 1) << "only the default pool's cache is left";
}

struct Recorder {
    std::vector<size_t> allocs, frees;
};

static void *rec_alloc(size_t size, int, sp_stream_t, void *ctx) {
    static_cast<Recorder *>(ctx)->allocs.push_back(size);
    return aligned_alloc(4096, size);
}
static void rec_free(void *p, size_t size, int, sp_stream_t, void *ctx) {
    static_cast<Recorder *>(ctx)->frees.push_back(size);
    free(p);
}

TEST_F(AllocMemPool, PluggableAllocatorGetsPyTorchSegmentSizes) {
    Recorder rec;
    sp_allocator_t al = {rec_alloc, rec_free, &rec};
    sp_mempool_params_t prm;
    sp_mempool_params_init(&prm);
    prm.allocator = &al;
    prm.name = "plug";
    sp_mempool_t *pool;
    ASSERT_SP_OK(sp_mempool_create(&prm, &pool));
    void *a, *b, *c;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 100, nullptr, &a));
    ASSERT_SP_OK(sp_mempool_malloc(pool, 3 * MiB, nullptr, &b));
    ASSERT_SP_OK(sp_mempool_malloc(pool, 18 * MiB, nullptr, &c));
    EXPECT_EQ(rec.allocs, (std::vector<size_t>{2 * MiB, 20 * MiB, 18 * MiB}));
    EXPECT_EQ(stat("num_device_alloc"), 3);
    EXPECT_EQ(sp_mempool_total_bytes(pool), 40 * MiB);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    EXPECT_EQ(sp_mempool_free_bytes(pool), 22 * MiB);
    ASSERT_SP_OK(sp_mempool_destroy(pool)); // frees the two whole free segments now
    EXPECT_EQ(rec.frees, (std::vector<size_t>{2 * MiB, 20 * MiB}));
    ASSERT_SP_OK(sp_free(c)); // the pool lingers, freeable, until the cache is emptied
    EXPECT_EQ(rec.frees.size(), 2u);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(rec.frees, (std::vector<size_t>{2 * MiB, 20 * MiB, 18 * MiB}));
    expect_warnings();
    EXPECT_SP_STATUS(sp_mempool_destroy(pool), SP_ERR_INVALID_USAGE); // "destroyed twice"
    EXPECT_SP_STATUS(sp_mempool_destroy(sp_default_mempool(0)), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_destroy(nullptr), SP_ERR_INVALID_ARGUMENT);
}

TEST_F(AllocMemPool, UseOnOomLendsAndTheBlockReturns) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    sp_mempool_params_t prm;
    sp_mempool_params_init(&prm);
    prm.use_on_oom = true;
    sp_mempool_t *lender;
    ASSERT_SP_OK(sp_mempool_create(&prm, &lender));
    void *x, *live, *p;
    ASSERT_SP_OK(sp_mempool_malloc(lender, 30 * MiB, nullptr, &x));
    ASSERT_SP_OK(sp_free(x)); // 30 MiB cached in the lender
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &live));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &p)); // device has 4 MiB: borrowed
    EXPECT_EQ(p, x);
    EXPECT_EQ(sp_mempool_used_bytes(lender), 20 * MiB) << "split by the lender's rules";
    EXPECT_EQ(sp_mempool_used_bytes(sp_default_mempool(0)), 30 * MiB);
    EXPECT_EQ(stat("num_alloc_retries"), 0) << "tried before the releases";
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp_mempool_used_bytes(lender), 0u);
    EXPECT_EQ(sp_mempool_n_free_blocks(lender), 1u) << "it went back to the lender";
    ASSERT_SP_OK(sp_free(live));
    ASSERT_SP_OK(sp_mempool_destroy(lender));
}

TEST_F(AllocMemPool, LimitFailsWithOomNamingThePool) {
    expect_warnings();
    sp_mempool_params_t prm;
    sp_mempool_params_init(&prm);
    prm.name = "capped";
    sp_mempool_t *pool;
    ASSERT_SP_OK(sp_mempool_create(&prm, &pool));
    ASSERT_SP_OK(sp_mempool_set_limit(pool, 24 * MiB));
    EXPECT_EQ(sp_mempool_get_limit(pool), 24 * MiB);
    void *a, *b = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 5 * MiB, nullptr, &a)); // 20 MiB segment
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 16 * MiB, nullptr, &b), SP_ERR_OUT_OF_MEMORY);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("\"capped\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("24.00 MiB"), std::string::npos) << msg;
    EXPECT_EQ(sp_mempool_total_bytes(pool), 20 * MiB);
    ASSERT_SP_OK(sp_mempool_malloc(pool, 10 * MiB, nullptr, &b)); // fits the cached segment
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_free_all_blocks(pool, nullptr));
    EXPECT_EQ(sp_mempool_total_bytes(pool), 0u);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

TEST_F(AllocMemPool, NoSplitPoolHandsOutWholeSegments) {
    sp_mempool_params_t prm;
    sp_mempool_params_init(&prm);
    prm.no_split = true;
    sp_mempool_t *pool;
    ASSERT_SP_OK(sp_mempool_create(&prm, &pool));
    void *a, *b;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 512, nullptr, &a));
    ASSERT_SP_OK(sp_mempool_malloc(pool, 512, nullptr, &b));
    EXPECT_EQ(stat("allocated_bytes.small_pool.current"), (int64_t)(4 * MiB));
    EXPECT_EQ(stat("segment.all.current"), 2);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    EXPECT_EQ(stat("segment.all.current"), 0);
}

// test_mempool_oom.cc: acceptance tests for the MemPool rules that involve where memory comes
// from and when it goes back (reference/pytorch-allocator.md sections 1.12, 1.14, 4.3, 4.4):
// pluggable segment allocators (sizes, streams, NULL = OOM), OOM with and without use_on_oom
// pools on a small emulated device, the order in which use_on_oom pools lend, and destroy with
// and without live blocks.
//
// The OOM tests run the host backend with SYMPOOL_HOST_CAPACITY=64MiB, so "the device is full"
// is exact: a 40 MiB segment plus a 30 MiB request does not fit, either alone does.
#include "sp_test.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

extern "C" {
#include "pool/pool.h"
}

namespace {

using sp::KiB;
using sp::MiB;
using sp::stat;
using sp::touch;

sp_block_info_t info_of(void *p) {
    sp_block_info_t info;
    std::memset(&info, 0, sizeof info);
    sp_status_t s = sp__pool_lookup(p, &info);
    EXPECT_EQ(s, SP_SUCCESS) << sp::describe(s);
    return info;
}

sp_mempool_t *owner(void *p) {
    sp_block_info_t info;
    return sp__pool_lookup(p, &info) == SP_SUCCESS ? info.pool : nullptr;
}

sp_mempool_t *make_pool(const char *name, bool use_on_oom = false,
                        const sp_allocator_t *allocator = nullptr) {
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.name = name;
    params.use_on_oom = use_on_oom;
    params.allocator = allocator;
    sp_mempool_t *pool = nullptr;
    sp_status_t s = sp_mempool_create(&params, &pool);
    EXPECT_EQ(s, SP_SUCCESS) << sp::describe(s);
    return pool;
}

sp_mempool_t *dflt() {
    return sp_default_mempool(0);
}

// Allocate `size` in `pool` and free it again, leaving one cached free segment there.
void cache_in(sp_mempool_t *pool, size_t size) {
    void *p = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, size, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

// ---- a counting pluggable allocator -----------------------------------------------------------

struct Call {
    void *ptr;
    size_t size;
    int device;
    sp_stream_t stream;
};

struct Counting {
    std::mutex mu;
    std::vector<Call> allocs; // successful alloc calls
    std::vector<Call> frees;
    size_t refused = 0; // alloc calls answered with NULL
    bool fail = false;  // answer every alloc with NULL
    sp_allocator_t ops;
};

void *counting_alloc(size_t size, int device, sp_stream_t stream, void *ctx) {
    auto *c = static_cast<Counting *>(ctx);
    std::lock_guard<std::mutex> g(c->mu);
    if (c->fail) {
        c->refused++;
        return nullptr;
    }
    void *p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    if (p)
        c->allocs.push_back({p, size, device, stream});
    return p;
}

void counting_free(void *ptr, size_t size, int device, sp_stream_t stream, void *ctx) {
    auto *c = static_cast<Counting *>(ctx);
    std::lock_guard<std::mutex> g(c->mu);
    c->frees.push_back({ptr, size, device, stream});
    std::free(ptr);
}

void counting_init(Counting &c) {
    c.ops.alloc = counting_alloc;
    c.ops.free = counting_free;
    c.ops.ctx = &c;
}

class MemPoolOom : public sp::Test {};

// ---- pluggable allocator -----------------------------------------------------------------------

TEST_F(MemPoolOom, PluggableAllocatorGetsPyTorchSegmentSizes) {
    Counting c;
    counting_init(c);
    sp_mempool_t *a = make_pool("plugged", false, &c.ops);
    ASSERT_NE(a, nullptr);
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    size_t dev_free0 = 0, dev_total = 0;
    ASSERT_SP_OK(sp_get_memory_info(0, &dev_free0, &dev_total));

    struct Want {
        size_t request, segment;
    };
    const Want wants[] = {
        {512, 2 * MiB},             // small
        {1 * MiB, 2 * MiB},         // the largest small request
        {1 * MiB + 1, 20 * MiB},    // rounded to 1 MiB + 512: large, below 10 MiB
        {10 * MiB - 512, 20 * MiB}, // still below 10 MiB
        {10 * MiB, 10 * MiB},       // from 10 MiB: rounded up to 2 MiB
        {11 * MiB + 1, 12 * MiB},
        {20 * MiB, 20 * MiB},
    };
    for (const Want &w : wants) {
        SCOPED_TRACE(w.request);
        size_t before = c.allocs.size();
        void *p = nullptr;
        ASSERT_SP_OK(sp_mempool_malloc(a, w.request, s, &p));
        ASSERT_EQ(c.allocs.size(), before + 1) << "one new segment per request";
        const Call &call = c.allocs.back();
        EXPECT_EQ(call.size, w.segment);
        EXPECT_EQ(call.device, 0);
        EXPECT_EQ(call.stream, s);
        sp_block_info_t info = info_of(p);
        EXPECT_EQ(info.segment_base, call.ptr) << "the segment is the callback's memory";
        EXPECT_EQ(info.segment_size, w.segment);
        EXPECT_EQ(p, call.ptr) << "the first block starts at the segment's start";
        std::memset(p, 0x11, w.request);
        ASSERT_SP_OK(sp_free(p));
        EXPECT_EQ(c.frees.size(), before) << "a freed block is cached, not handed back";
        ASSERT_SP_OK(sp_mempool_free_all_blocks(a, nullptr));
        ASSERT_EQ(c.frees.size(), before + 1);
        const Call &back = c.frees.back();
        EXPECT_EQ(back.ptr, call.ptr);
        EXPECT_EQ(back.size, call.size) << "frees come back with the size they were allocated with";
        EXPECT_EQ(back.device, 0);
        EXPECT_EQ(back.stream, s) << "frees come back with their allocation stream";
    }
    // The device backend was never asked for memory (checked on host only: a GPU's free memory
    // moves with every other process on it).
    size_t dev_free1 = 0;
    ASSERT_SP_OK(sp_get_memory_info(0, &dev_free1, &dev_total));
    if (!sp::on_gpu()) {
        EXPECT_EQ(dev_free1, dev_free0);
    }
    ASSERT_SP_OK(sp_mempool_destroy(a));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

TEST_F(MemPoolOom, PluggableAllocatorServesRoutedRequestsAndCountsAsReserved) {
    Counting c;
    counting_init(c);
    sp_mempool_t *a = make_pool("plugged", false, &c.ops);
    ASSERT_NE(a, nullptr);
    void *p, *q;
    ASSERT_SP_OK(sp_mempool_begin(a));
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &q)); // fits the same 20 MiB segment
    ASSERT_SP_OK(sp_mempool_end(a));
    ASSERT_EQ(c.allocs.size(), 1u);
    EXPECT_EQ(c.allocs[0].size, 20 * MiB);
    EXPECT_EQ(owner(p), a);
    EXPECT_EQ(sp_memory_reserved(0), 20 * MiB) << "custom segments count in the device's stats";
    EXPECT_EQ(stat("segment.all.current"), 1);
    EXPECT_EQ(stat("num_device_alloc"), 1);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(q));
    // Destroy hands the free segment back through the callback at once.
    ASSERT_SP_OK(sp_mempool_destroy(a));
    ASSERT_EQ(c.frees.size(), 1u);
    EXPECT_EQ(c.frees[0].ptr, c.allocs[0].ptr);
    EXPECT_EQ(c.frees[0].size, 20 * MiB);
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    EXPECT_EQ(stat("num_device_free"), 1);
}

TEST_F(MemPoolOom, NullFromThePluggableAllocatorIsOutOfMemory) {
    expect_warnings();
    Counting c;
    counting_init(c);
    c.fail = true;
    sp_mempool_t *a = make_pool("refusing", false, &c.ops);
    ASSERT_NE(a, nullptr);
    void *p = &p;
    sp__error_clear();
    EXPECT_SP_STATUS(sp_mempool_malloc(a, 4096, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, &p) << "outputs are written only on success";
    EXPECT_STRNE(sp_last_error(), "");
    // The normal OOM path: the first attempt, then release_cached_blocks and one retry.
    EXPECT_EQ(c.refused, 2u);
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    EXPECT_EQ(stat("num_ooms"), 1);
    EXPECT_EQ(stat("segment.all.current"), 0);
    EXPECT_EQ(sp_mempool_total_bytes(a), 0u);
    // Routed requests take the same path.
    ASSERT_SP_OK(sp_mempool_begin(a));
    EXPECT_SP_STATUS(sp_malloc(4096, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    ASSERT_SP_OK(sp_mempool_end(a));
    EXPECT_EQ(stat("num_ooms"), 2);
    // Once the callback gives memory again, so does the pool.
    c.fail = false;
    ASSERT_SP_OK(sp_mempool_malloc(a, 4096, nullptr, &p));
    EXPECT_EQ(owner(p), a);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_mempool_destroy(a));
    EXPECT_EQ(c.frees.size(), c.allocs.size());
}

// ---- OOM and use_on_oom ------------------------------------------------------------------------

TEST_F(MemPoolOom, LivePlainPoolKeepsItsCacheAndTheRequestFails) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *plain = make_pool("plain");
    ASSERT_NE(plain, nullptr);
    cache_in(plain, 40 * MiB);
    EXPECT_EQ(sp_mempool_total_bytes(plain), 40 * MiB);
    // As in PyTorch: the OOM retry empties the default pool and freeable pools only; a live
    // private pool's cache is not released (pytorch/pytorch#159674).
    void *p = nullptr;
    sp__error_clear();
    EXPECT_SP_STATUS(sp_malloc(30 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, nullptr);
    EXPECT_STRNE(sp_last_error(), "");
    EXPECT_EQ(stat("num_ooms"), 1);
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    EXPECT_EQ(sp_mempool_total_bytes(plain), 40 * MiB);
    EXPECT_EQ(sp_mempool_n_free_blocks(plain), 1u);
    // Destroying the pool releases its cache; now the request fits.
    ASSERT_SP_OK(sp_mempool_destroy(plain));
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

// PyTorch's try_mempool_fallback searches with expandable segments inactive, and get_free_block
// then passes over expandable blocks: a use_on_oom pool of expandable segments lends nothing, and
// the request fails (the live pool keeps its cache).
TEST_F(MemPoolOom, AnExpandablePoolLendsNothing) {
    expect_warnings();
    sp::ScopedEnv env(
        {{"SYMPOOL_HOST_CAPACITY", "64MiB"}, {"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *lender = make_pool("lender", true);
    ASSERT_NE(lender, nullptr);
    cache_in(lender, 40 * MiB);
    ASSERT_EQ(sp_mempool_total_bytes(lender), 40 * MiB);
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_malloc(30 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(sp_mempool_used_bytes(lender), 0u) << "nothing lent";
    if (p) // lent after all: given back, so the pool's destroy below is whole
        ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp_mempool_total_bytes(lender), 40 * MiB);
    EXPECT_EQ(stat("num_ooms"), 1);
    ASSERT_SP_OK(sp_mempool_destroy(lender));
}

// With expandable segments on, a pool with an allocator of its own keeps fixed segments, and
// PyTorch's malloc passes should_split is_expandable_segments_active = false for it: a large block
// is split only when more than 1 MiB remains (not down to 512 bytes, the expandable rule).
TEST_F(MemPoolOom, APoolWithAnAllocatorSplitsByTheFixedRule) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    Counting c;
    counting_init(c);
    sp_mempool_t *a = make_pool("plugged", false, &c.ops);
    ASSERT_NE(a, nullptr);
    void *p = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(a, 20 * MiB - 512 * KiB, nullptr, &p)); // a 20 MiB segment
    sp_block_info_t info = info_of(p);
    EXPECT_EQ(info.segment_size, 20 * MiB);
    EXPECT_EQ(info.block_size, 20 * MiB) << "0.5 MiB left: not split";
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_mempool_destroy(a));
}

TEST_F(MemPoolOom, UseOnOomPoolLendsItsCachedBlock) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *lender = make_pool("lender", true);
    ASSERT_NE(lender, nullptr);
    cache_in(lender, 40 * MiB);
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &p));
    sp_block_info_t info = info_of(p);
    EXPECT_EQ(info.pool, lender) << "the lent block stays its pool's";
    EXPECT_EQ(info.segment_size, 40 * MiB);
    EXPECT_EQ(info.block_size, 30 * MiB);
    EXPECT_EQ(sp_mempool_used_bytes(lender), 30 * MiB);
    EXPECT_EQ(sp_mempool_total_bytes(lender), 40 * MiB) << "no new segment in the lending pool";
    EXPECT_EQ(sp_mempool_total_bytes(dflt()), 0u);
    EXPECT_EQ(sp_memory_reserved(0), 40 * MiB);
    EXPECT_EQ(stat("num_ooms"), 0);
    EXPECT_EQ(stat("allocation.all.current"), 1);
    touch(p, 30 * MiB);
    // Freed, the block goes back to the lender, not to the default pool.
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp_mempool_used_bytes(lender), 0u);
    EXPECT_EQ(sp_mempool_n_free_blocks(lender), 1u);
    EXPECT_EQ(sp_mempool_free_bytes(lender), 40 * MiB);
    EXPECT_EQ(sp_mempool_n_free_blocks(dflt()), 0u);
    EXPECT_EQ(sp_mempool_total_bytes(dflt()), 0u);
    ASSERT_SP_OK(sp_mempool_destroy(lender));
}

TEST_F(MemPoolOom, FallbackComesBeforeTheCacheIsReleased) {
    // Recent PyTorch tries the use_on_oom pools right after the first failed device allocation,
    // before release_cached_blocks and the retry (2.8 did it after): the default pool keeps its
    // cache and no retry is counted.
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *lender = make_pool("lender", true);
    ASSERT_NE(lender, nullptr);
    cache_in(lender, 40 * MiB);
    void *d;
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &d));
    ASSERT_SP_OK(sp_free(d));
    EXPECT_EQ(sp_memory_reserved(0), 60 * MiB);
    void *p;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &p));
    EXPECT_EQ(owner(p), lender);
    EXPECT_EQ(sp_mempool_total_bytes(dflt()), 20 * MiB) << "the default cache was not emptied";
    EXPECT_EQ(stat("num_alloc_retries"), 0);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_mempool_destroy(lender));
}

TEST_F(MemPoolOom, UseOnOomPoolsLendInCreationOrder) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *first = make_pool("first", true);
    sp_mempool_t *second = make_pool("second", true);
    ASSERT_NE(first, nullptr);
    ASSERT_NE(second, nullptr);
    // The second pool's segment is made first, so neither address nor segment age favours
    // the first pool: only creation order does.
    cache_in(second, 24 * MiB);
    cache_in(first, 24 * MiB);
    void *p, *q;
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &p));
    EXPECT_EQ(owner(p), first);
    // The first pool has only 4 MiB left: the next request is lent by the second.
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &q));
    EXPECT_EQ(owner(q), second);
    EXPECT_EQ(sp_mempool_total_bytes(dflt()), 0u);
    EXPECT_EQ(sp_memory_reserved(0), 48 * MiB);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(q));
    EXPECT_EQ(sp_mempool_free_bytes(first), 24 * MiB);
    EXPECT_EQ(sp_mempool_free_bytes(second), 24 * MiB);
    ASSERT_SP_OK(sp_mempool_destroy(first));
    ASSERT_SP_OK(sp_mempool_destroy(second));
}

TEST_F(MemPoolOom, FallbackNeverGrowsTheLendingPool) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *lender = make_pool("small-lender", true);
    ASSERT_NE(lender, nullptr);
    cache_in(lender, 10 * MiB);
    void *live, *p = nullptr;
    ASSERT_SP_OK(sp_malloc(40 * MiB, 0, nullptr, &live));
    // 14 MiB left on the device, 10 MiB cached in the lender: 20 MiB fits nowhere.
    EXPECT_SP_STATUS(sp_malloc(20 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(sp_mempool_total_bytes(lender), 10 * MiB);
    EXPECT_EQ(sp_mempool_used_bytes(lender), 0u);
    EXPECT_EQ(stat("num_ooms"), 1);
    ASSERT_SP_OK(sp_free(live));
    ASSERT_SP_OK(sp_mempool_destroy(lender));
}

TEST_F(MemPoolOom, RequestsRoutedToAPoolNeverBorrow) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *lender = make_pool("lender", true);
    sp_mempool_t *acts = make_pool("acts");
    ASSERT_NE(lender, nullptr);
    ASSERT_NE(acts, nullptr);
    cache_in(lender, 40 * MiB);
    void *p = nullptr;
    ASSERT_SP_OK(sp_mempool_begin(acts));
    EXPECT_SP_STATUS(sp_malloc(30 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    ASSERT_SP_OK(sp_mempool_end(acts));
    EXPECT_SP_STATUS(sp_mempool_malloc(acts, 30 * MiB, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(sp_mempool_used_bytes(lender), 0u);
    EXPECT_EQ(sp_mempool_total_bytes(lender), 40 * MiB);
    EXPECT_EQ(stat("num_ooms"), 2);
    EXPECT_GE(warnings("acts"), 1u) << "the OOM report names the pool the request was routed to";
    ASSERT_SP_OK(sp_mempool_destroy(acts));
    ASSERT_SP_OK(sp_mempool_destroy(lender));
}

TEST_F(MemPoolOom, SmallRequestsBorrowFromTheSmallSet) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *lender = make_pool("lender", true);
    ASSERT_NE(lender, nullptr);
    cache_in(lender, 4096); // one free 2 MiB small segment
    void *live, *p;
    ASSERT_SP_OK(sp_malloc(62 * MiB, 0, nullptr, &live)); // the device is now full
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
    EXPECT_EQ(owner(p), lender);
    EXPECT_EQ(info_of(p).block_size, 1024u);
    EXPECT_EQ(stat("allocation.small_pool.current"), 1);
    EXPECT_EQ(sp_mempool_use_count(lender), 1) << "lending takes no lasting use";
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp_mempool_used_bytes(lender), 0u);
    ASSERT_SP_OK(sp_free(live));
    ASSERT_SP_OK(sp_mempool_destroy(lender));
}

TEST_F(MemPoolOom, LendingRespectsStreams) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_stream_t s1;
    ASSERT_SP_OK(sp_stream_create(0, &s1));
    sp_mempool_t *lender = make_pool("lender", true);
    ASSERT_NE(lender, nullptr);
    void *c;
    ASSERT_SP_OK(sp_mempool_malloc(lender, 40 * MiB, s1, &c));
    ASSERT_SP_OK(sp_free(c));
    // A free block is only reused by its own stream, lent or not.
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_malloc(30 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, s1, &p));
    EXPECT_EQ(owner(p), lender);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_mempool_destroy(lender));
    ASSERT_SP_OK(sp_stream_destroy(s1));
}

TEST_F(MemPoolOom, DestroyedPoolNoLongerLends) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *lender = make_pool("lender", true);
    ASSERT_NE(lender, nullptr);
    // One 40 MiB segment: a live 10 MiB block and a free 30 MiB remainder.
    void *big, *keep;
    ASSERT_SP_OK(sp_mempool_malloc(lender, 40 * MiB, nullptr, &big));
    ASSERT_SP_OK(sp_free(big));
    ASSERT_SP_OK(sp_mempool_malloc(lender, 10 * MiB, nullptr, &keep));
    EXPECT_EQ(sp_mempool_total_bytes(lender), 40 * MiB);
    // PyTorch's destructor clears use_on_oom first; the segment stays for the live block.
    ASSERT_SP_OK(sp_mempool_destroy(lender));
    EXPECT_EQ(sp_memory_reserved(0), 40 * MiB);
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_malloc(30 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, nullptr);
    ASSERT_SP_OK(sp_free(keep));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_memory_reserved(0), 0u);
}

// ---- destroy -----------------------------------------------------------------------------------

TEST_F(MemPoolOom, DestroyWithLiveBlocksDefersTheirSegments) {
    sp_mempool_t *a = make_pool("doomed");
    ASSERT_NE(a, nullptr);
    void *p;
    ASSERT_SP_OK(sp_mempool_malloc(a, 1 * MiB, nullptr, &p));
    cache_in(a, 4 * MiB);
    EXPECT_EQ(sp_memory_reserved(0), 22 * MiB);
    ASSERT_SP_OK(sp_mempool_destroy(a));
    // The free 20 MiB segment went back at once; the one holding p stays.
    EXPECT_EQ(sp_memory_reserved(0), 2 * MiB);
    EXPECT_EQ(stat("num_device_free"), 1);
    touch(p, 1 * MiB);
    EXPECT_EQ(info_of(p).pool, a);
    ASSERT_SP_OK(sp_free(p));
    // As in PyTorch, the now-free segment waits for the next empty_cache.
    EXPECT_EQ(sp_memory_reserved(0), 2 * MiB);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    EXPECT_EQ(stat("segment.all.current"), 0);
    EXPECT_EQ(stat("num_device_free"), 2);
}

TEST_F(MemPoolOom, EmptyCacheSparesLivePools) {
    // torch.cuda.empty_cache() releases the default pools and the *freeable* private pools
    // (use count 0) only; a live MemPool keeps its cache.
    sp_mempool_t *a = make_pool("alive");
    ASSERT_NE(a, nullptr);
    cache_in(a, 4 * MiB);
    void *d;
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &d));
    ASSERT_SP_OK(sp_free(d));
    EXPECT_EQ(sp_memory_reserved(0), 40 * MiB);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_mempool_total_bytes(dflt()), 0u);
    EXPECT_EQ(sp_mempool_total_bytes(a), 20 * MiB);
    EXPECT_EQ(sp_memory_reserved(0), 20 * MiB);
    ASSERT_SP_OK(sp_mempool_destroy(a));
    EXPECT_EQ(sp_memory_reserved(0), 0u);
}

TEST_F(MemPoolOom, ADestroyedPoolTakesNoNewBlocks) {
    expect_warnings();
    sp_mempool_t *a = make_pool("gone");
    ASSERT_NE(a, nullptr);
    void *p;
    ASSERT_SP_OK(sp_mempool_malloc(a, 1 * MiB, nullptr, &p));
    ASSERT_SP_OK(sp_mempool_destroy(a));
    // PyTorch's releasePool drops the creator's use: nothing holds the pool any more.
    EXPECT_EQ(sp_mempool_use_count(a), 0);
    void *q = &q;
    sp__error_clear();
    EXPECT_SP_STATUS(sp_mempool_malloc(a, 4096, nullptr, &q), SP_ERR_INVALID_USAGE);
    EXPECT_STRNE(sp_last_error(), "");
    EXPECT_EQ(q, &q);
    EXPECT_EQ(sp_mempool_used_bytes(a), 1 * MiB);
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp_mempool_used_bytes(a), 0u);
}

TEST_F(MemPoolOom, DestroyedPoolsCacheIsReleasedByTheOomRetry) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *a = make_pool("doomed");
    ASSERT_NE(a, nullptr);
    void *p, *q;
    ASSERT_SP_OK(sp_mempool_malloc(a, 40 * MiB, nullptr, &p));
    ASSERT_SP_OK(sp_mempool_destroy(a));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp_memory_reserved(0), 40 * MiB);
    // The destroyed pool is freeable: the OOM path's release_cached_blocks empties it.
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &q));
    EXPECT_EQ(owner(q), dflt());
    EXPECT_EQ(sp_memory_reserved(0), 30 * MiB);
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    EXPECT_EQ(stat("num_ooms"), 0);
    ASSERT_SP_OK(sp_free(q));
}

TEST_F(MemPoolOom, DestroyCompletesPendingFreesThenReleases) {
    // PyTorch's MemPool destructor runs emptyCache(id): it synchronizes that pool's events
    // (one synchronize_and_free_events, counted in num_sync_all_streams), so a block freed while
    // still in use on another stream no longer pins its segment.
    sp_stream_t s1;
    ASSERT_SP_OK(sp_stream_create(0, &s1));
    sp_mempool_t *a = make_pool("pending");
    ASSERT_NE(a, nullptr);
    void *p;
    ASSERT_SP_OK(sp_mempool_malloc(a, 12 * MiB, nullptr, &p));
    ASSERT_SP_OK(sp_record_stream(p, s1));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("active.all.current"), 1) << "the free waits for s1";
    EXPECT_EQ(sp_mempool_n_free_blocks(a), 0u);
    int64_t syncs = stat("num_sync_all_streams");
    ASSERT_SP_OK(sp_mempool_destroy(a));
    EXPECT_EQ(stat("num_sync_all_streams"), syncs + 1);
    EXPECT_EQ(stat("active.all.current"), 0);
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    ASSERT_SP_OK(sp_stream_destroy(s1));
}

TEST_F(MemPoolOom, DestroyReleasesFreeSegmentsAtOnce) {
    sp_mempool_t *a = make_pool("tidy");
    ASSERT_NE(a, nullptr);
    cache_in(a, 512 * KiB);
    cache_in(a, 12 * MiB);
    EXPECT_EQ(sp_memory_reserved(0), 14 * MiB);
    ASSERT_SP_OK(sp_mempool_destroy(a));
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    EXPECT_EQ(stat("segment.all.current"), 0);
    EXPECT_EQ(stat("num_device_free"), 2);
}

} // namespace

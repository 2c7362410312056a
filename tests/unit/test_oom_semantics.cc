// test_oom_semantics.cc: where sympool's out-of-memory answers follow PyTorch and CuPy:
//  - a request larger than the device is an OOM that went through the release-and-retry path
//    (num_alloc_retries, num_ooms), reported as PyTorch does ("Tried to allocate 800000000.00
//    GiB"), also with max_split_size_mb and through sp_mempool_malloc; at or above 1 EB it is
//    PyTorch's "Tried to allocate more than 1EB memory", and only a size whose rounding would
//    overflow is SP_ERR_INVALID_ARGUMENT;
//  - a MemPool at its own limit first releases its own free cached segments and retries once
//    (CuPy's rule), counted in num_alloc_retries, unless the request alone is past the limit;
//  - sp_mempool_free_all_blocks rejects a stream sympool did not make.
#include "alloc_test_util.hpp"
#include "pool/torch.h"

#include <cstdint>
#include <string>

using namespace sp;

namespace {

constexpr size_t kOneEB = (size_t)1 << 60;

bool has(const std::string &hay, const char *needle) {
    return hay.find(needle) != std::string::npos;
}

} // namespace

class OomSemantics : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings(); // every OOM here is reported at WARN on purpose
    }
    // The sizes below are those of fixed segments (expandable ones map 20 MiB pages instead).
    sp::ScopedEnv fixed_{{"SYMPOOL_ALLOC_CONF", "expandable_segments:False"}};
};

// PyTorch's test_out_of_memory: 800000000 GiB is an OOM, not a bad argument, and a later
// allocation still works.
TEST_F(OomSemantics, RequestAboveTheDeviceIsOomAfterTheRetry) {
    void *keep = nullptr, *p = &p;
    ASSERT_SP_OK(sp_malloc(1024, 0, nullptr, &keep));
    sp_stats_t before = snap();
    EXPECT_SP_STATUS(sp_malloc((size_t)800000000 * GiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, (void *)&p) << "the output is written only on success";
    std::string msg = sp_last_error();
    EXPECT_TRUE(has(msg, "Tried to allocate 800000000.00 GiB")) << msg;
    EXPECT_EQ(stat("num_ooms"), 1);
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    EXPECT_EQ(diff(before, snap()), "num_alloc_retries num_ooms num_sync_all_streams ");
    // Nothing is disturbed: the small block is still there and a new one can be had.
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(1024, 0, nullptr, &q));
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_free(keep));
}

TEST_F(OomSemantics, AboveOneExabyteIsPyTorchsOneEbOom) {
    void *p = &p;
    sp_stats_t before = snap();
    EXPECT_SP_STATUS(sp_malloc((size_t)8000000000 * GiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_TRUE(has(sp_last_error(), "Tried to allocate more than 1EB memory")) << sp_last_error();
    EXPECT_SP_STATUS(sp_malloc(kOneEB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_SP_STATUS(sp_malloc((size_t)1 << 62, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    // PyTorch refuses these in allocate(), before its allocator: no retry, no num_ooms.
    EXPECT_EQ(diff(before, snap()), "");
    EXPECT_EQ(p, (void *)&p);
}

// PyTorch's allocate() checks the 1 EB cap before anything else, so every size_t from there up
// to SIZE_MAX is the same uncounted OOM (these were SP_ERR_INVALID_ARGUMENT from 2^63 up, where
// a caller catching PyTorch's OOM missed them).
TEST_F(OomSemantics, EverySizeUpToSizeMaxIsTheOneEbOom) {
    void *p = &p;
    sp_stats_t before = snap();
    for (size_t size : {SIZE_MAX, SIZE_MAX - 4096, ((size_t)1 << 63) + 1, (size_t)1 << 63}) {
        sp__error_clear();
        EXPECT_SP_STATUS(sp_malloc(size, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
        EXPECT_TRUE(has(sp_last_error(), "Tried to allocate more than 1EB memory"))
            << sp_last_error();
    }
    EXPECT_EQ(diff(before, snap()), "");
    EXPECT_EQ(p, (void *)&p);
}

TEST_F(OomSemantics, AboveTheDeviceWithMaxSplitSize) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:20,expandable_segments:False"}});
    void *p = &p;
    EXPECT_SP_STATUS(sp_malloc((size_t)800000000 * GiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_TRUE(has(sp_last_error(), "Tried to allocate 800000000.00 GiB")) << sp_last_error();
    EXPECT_EQ(stat("num_ooms"), 1);
    EXPECT_EQ(stat("num_alloc_retries"), 1);
}

TEST_F(OomSemantics, AboveTheDeviceThroughMempoolMallocAndRouting) {
    sp_mempool_t *pool = sp::make_named_pool("big");
    ASSERT_NE(pool, nullptr);
    void *p = &p;
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, (size_t)800000000 * GiB, nullptr, &p),
                     SP_ERR_OUT_OF_MEMORY);
    EXPECT_TRUE(has(sp_last_error(), "Tried to allocate 800000000.00 GiB")) << sp_last_error();
    EXPECT_EQ(stat("num_ooms"), 1);
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, (size_t)8000000000 * GiB, nullptr, &p),
                     SP_ERR_OUT_OF_MEMORY);
    EXPECT_TRUE(has(sp_last_error(), "more than 1EB")) << sp_last_error();
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, SIZE_MAX, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_TRUE(has(sp_last_error(), "more than 1EB")) << sp_last_error();
    ASSERT_SP_OK(sp_mempool_begin(pool));
    EXPECT_SP_STATUS(sp_malloc((size_t)800000000 * GiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    ASSERT_SP_OK(sp_mempool_end(pool));
    EXPECT_EQ(stat("num_ooms"), 2);
    EXPECT_EQ(p, (void *)&p);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

TEST_F(OomSemantics, TorchEntryPointAnswersNullForAboveTheDevice) {
    sp__torch_allow_host(true); // the entry points serve only cuda unless a test lifts that
    EXPECT_EQ(sp_torch_malloc((size_t)800000000 * GiB, 0, nullptr), nullptr);
    sp__torch_allow_host(false);
    EXPECT_EQ(stat("num_ooms"), 1);
}

// CuPy: a pool at its limit frees its own free blocks and retries before failing.
TEST_F(OomSemantics, PoolAtItsLimitReleasesItsOwnCacheAndRetries) {
    sp_mempool_t *pool = sp::make_named_pool("limited");
    sp_mempool_t *other = sp::make_named_pool("other");
    ASSERT_NE(pool, nullptr);
    ASSERT_NE(other, nullptr);
    ASSERT_SP_OK(sp_mempool_set_limit(pool, 50 * MiB));
    void *a = nullptr, *b = nullptr, *o = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 30 * MiB, nullptr, &a));
    ASSERT_SP_OK(sp_free(a)); // 30 MiB cached in the pool
    ASSERT_SP_OK(sp_mempool_malloc(other, 30 * MiB, nullptr, &o));
    ASSERT_SP_OK(sp_free(o)); // 30 MiB cached in another live pool
    EXPECT_EQ(sp_mempool_total_bytes(pool), 30 * MiB);
    // 30 + 40 > 50: only releasing the cached 30 MiB makes room under the limit.
    ASSERT_SP_OK(sp_mempool_malloc(pool, 40 * MiB, nullptr, &b));
    EXPECT_EQ(sp_mempool_total_bytes(pool), 40 * MiB);
    EXPECT_EQ(sp_mempool_total_bytes(other), 30 * MiB) << "another pool's cache is not touched";
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    EXPECT_EQ(stat("num_ooms"), 0);
    EXPECT_EQ(stat("num_device_free"), 1);
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_mempool_destroy(other));
}

// CuPy's _try_block_total_bytes raises at once when the size alone is past the limit (no
// free_all_blocks): no release can make such a request fit, so the pool keeps its cache. With
// expandable segments the pages under the block alone (20 MiB pages here, the host backend's)
// are what the limit is compared with.
static void request_alone_past_the_limit(bool expandable) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF",
                        expandable ? "expandable_segments:True" : "expandable_segments:False"}});
    sp_mempool_t *pool = sp::make_named_pool("limited");
    ASSERT_NE(pool, nullptr);
    ASSERT_SP_OK(sp_mempool_set_limit(pool, 50 * MiB));
    void *a = nullptr, *c = &c;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 30 * MiB, nullptr, &a));
    ASSERT_SP_OK(sp_free(a)); // 30 MiB cached
    size_t cached = sp_mempool_total_bytes(pool);
    EXPECT_EQ(cached, 30 * MiB);
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 60 * MiB, nullptr, &c), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(c, (void *)&c);
    std::string msg = sp_last_error();
    EXPECT_TRUE(has(msg, "which this request alone is past")) << msg;
    EXPECT_TRUE(has(msg, "(30.00 MiB reserved)")) << msg;
    EXPECT_EQ(sp_mempool_total_bytes(pool), cached) << "the cache is kept";
    EXPECT_EQ(stat("num_ooms"), 1);
    EXPECT_EQ(stat("num_alloc_retries"), 0);
    EXPECT_EQ(stat("num_device_free"), 0);
    // A request that fits the limit alone still fits: fixed segments release the cache and
    // retry, an expandable one maps the 10 MiB more it needs (40 <= 50).
    void *d = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 40 * MiB, nullptr, &d));
    EXPECT_EQ(stat("num_alloc_retries"), expandable ? 0 : 1);
    ASSERT_SP_OK(sp_free(d));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

TEST_F(OomSemantics, RequestAlonePastThePoolLimitKeepsTheCache) {
    request_alone_past_the_limit(false);
}

TEST_F(OomSemantics, RequestAlonePastThePoolLimitKeepsTheCacheExpandable) {
    request_alone_past_the_limit(true);
}

// The limit refused first, its release made room, and then the device refused: the message
// names the device's refusal, not the limit (raising the limit would not help).
TEST_F(OomSemantics, DeviceRefusalAfterTheLimitsReleaseIsNotBlamedOnTheLimit) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    sp_mempool_t *pool = sp::make_named_pool("limited");
    ASSERT_NE(pool, nullptr);
    ASSERT_SP_OK(sp_mempool_set_limit(pool, 100 * MiB));
    void *a = nullptr, *keep = nullptr, *c = &c;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &keep)); // the device has 64 MiB
    ASSERT_SP_OK(sp_mempool_malloc(pool, 30 * MiB, nullptr, &a));
    ASSERT_SP_OK(sp_free(a)); // 30 MiB cached: 30 + 80 > 100
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 80 * MiB, nullptr, &c), SP_ERR_OUT_OF_MEMORY);
    std::string msg = sp_last_error();
    EXPECT_FALSE(has(msg, "is at its limit")) << msg;
    EXPECT_TRUE(has(msg, "the request went to pool \"limited\"")) << msg;
    EXPECT_EQ(sp_mempool_total_bytes(pool), 0u) << "the limit's release ran";
    ASSERT_SP_OK(sp_free(keep));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

TEST_F(OomSemantics, PoolLimitRetryReleasesBlocksOfEveryStream) {
    sp_mempool_t *pool = sp::make_named_pool("limited");
    ASSERT_NE(pool, nullptr);
    sp_stream_t s1;
    ASSERT_SP_OK(sp_stream_create(0, &s1));
    ASSERT_SP_OK(sp_mempool_set_limit(pool, 50 * MiB));
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 30 * MiB, s1, &a));
    ASSERT_SP_OK(sp_free(a)); // cached on s1; the request below is on the default stream
    ASSERT_SP_OK(sp_mempool_malloc(pool, 40 * MiB, nullptr, &b));
    EXPECT_EQ(sp_mempool_total_bytes(pool), 40 * MiB);
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_stream_destroy(s1));
}

TEST_F(OomSemantics, FreeAllBlocksRejectsUnknownStreams) {
    sp_mempool_t *pool = sp::make_named_pool("p");
    ASSERT_NE(pool, nullptr);
    void *a = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 4 * MiB, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    int not_a_stream = 0;
    if (!sp::on_gpu()) { // on cuda a non-stream is undefined behaviour (CUDA dereferences it)
        EXPECT_SP_STATUS(sp_mempool_free_all_blocks(pool, (sp_stream_t)&not_a_stream),
                         SP_ERR_INVALID_ARGUMENT);
    }
    EXPECT_EQ(sp_mempool_total_bytes(pool), 20 * MiB) << "nothing was released";
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    ASSERT_SP_OK(sp_mempool_free_all_blocks(pool, s)); // a real stream with nothing cached
    EXPECT_EQ(sp_mempool_total_bytes(pool), 20 * MiB);
    ASSERT_SP_OK(sp_mempool_free_all_blocks(pool, nullptr));
    EXPECT_EQ(sp_mempool_total_bytes(pool), 0u);
    ASSERT_SP_OK(sp_stream_destroy(s));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

TEST_F(OomSemantics, FreeAllBlocksRejectsAStreamOfAnotherDevice) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_t *pool = sp::make_named_pool("p");
    ASSERT_NE(pool, nullptr);
    sp_stream_t s1;
    ASSERT_SP_OK(sp_stream_create(1, &s1));
    EXPECT_SP_STATUS(sp_mempool_free_all_blocks(pool, s1), SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(sp_stream_destroy(s1));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

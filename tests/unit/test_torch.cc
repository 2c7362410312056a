// test_torch.cc: the CUDAPluggableAllocator entry points (include/sympool/torch.h, pool/torch.c).
// PyTorch calls them as alloc(size, device, stream) / free(ptr, size, device, stream) and can
// learn of a failure only through a NULL from alloc, so these tests check the round trip, that
// routing (sp_mempool_begin, i.e. torch.cuda.use_mem_pool over our allocator) applies, that the
// stream is the block's allocation stream, and that every failure leaves a message and a WARN.
// The exported-symbol check on libsympool.so is the ctypes test (examples/python/ctypes_smoke.py).
#include "sp_test.hpp"

#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "pool/device/device.h"
#include "pool/pool.h"
#include "pool/torch.h"
}

namespace {

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

// The exact types PyTorch casts the two symbols to (cudaStream_t is a pointer).
using torch_alloc_fn = void *(*)(size_t, int, void *);
using torch_free_fn = void (*)(void *, size_t, int, void *);

// The entry points refuse the host backend (PyTorch would take host memory for device memory);
// these fixtures lift that for their tests, which check the logic behind the refusal.
class Torch : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        sp__torch_allow_host(true);
    }
    void TearDown() override {
        sp__torch_allow_host(false);
        sp::Test::TearDown();
    }
};
class ThreadsTorch : public Torch {};
// The product behaviour: no lift.
class TorchBackend : public sp::Test {};

TEST_F(TorchBackend, HostBackendIsRefusedWithNullAndAMessage) {
    if (sp::on_gpu())
        GTEST_SKIP() << "checks the refusal on the host backend";
    expect_warnings();
    void *p = sp_torch_malloc(4096, 0, nullptr);
    EXPECT_EQ(p, nullptr) << "host memory must never reach PyTorch as device memory";
    EXPECT_NE(std::strstr(sp_last_error(), "host"), nullptr) << sp_last_error();
    EXPECT_NE(std::strstr(sp_last_error(), "SYMPOOL_DEVICE=cuda"), nullptr) << sp_last_error();
    EXPECT_GE(warnings("sp_torch_malloc"), 1u);
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("segment.all.current"), 0) << "nothing was allocated on the host backend";
    // record_stream of a real host block is refused as well (PyTorch never saw host memory).
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    sp_torch_record_stream(q, nullptr);
    EXPECT_GE(warnings("sp_torch_record_stream"), 1u);
    ASSERT_SP_OK(sp_free(q));
    // Size 0 stays a quiet NULL whatever the backend.
    sp__error_clear();
    EXPECT_EQ(sp_torch_malloc(0, 0, nullptr), nullptr);
    EXPECT_STREQ(sp_last_error(), "");
}

TEST_F(TorchBackend, EmptyCacheEntryPointReleasesTheCache) {
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp_memory_reserved(0), 2 * MiB);
    using reset_fn = void (*)(void); // CUDAPluggableAllocator.set_reset_fn's type
    reset_fn f = &sp_torch_empty_cache;
    f();
    EXPECT_EQ(sp_memory_reserved(0), 0u);
}

TEST_F(Torch, RecordStreamDelaysReuseUntilTheSideStreamIsDone) {
    if (sp::on_gpu())
        GTEST_SKIP() << "the host backend completes a stream's events at its synchronize";
    using record_fn = void (*)(void *, void *); // set_record_stream_fn's type
    record_fn rec = &sp_torch_record_stream;
    sp_stream_t side;
    ASSERT_SP_OK(sp_stream_create(0, &side));
    void *p = sp_torch_malloc(1 << 20, 0, nullptr);
    ASSERT_NE(p, nullptr) << sp_last_error();
    rec(p, side); // the tensor is read on `side`
    sp_torch_free(p, 1 << 20, 0, nullptr);
    void *q = sp_torch_malloc(1 << 20, 0, nullptr);
    ASSERT_NE(q, nullptr);
    EXPECT_NE(q, p) << "reused while the side stream's work may still read it";
    ASSERT_SP_OK(sp_stream_synchronize(side));
    void *r = sp_torch_malloc(1 << 20, 0, nullptr);
    EXPECT_EQ(r, p) << "once the side stream is done, the block is free again";
    sp_torch_free(q, 1 << 20, 0, nullptr);
    sp_torch_free(r, 1 << 20, 0, nullptr);
    // Without a record_stream the free is immediate (the control for the check above).
    void *a = sp_torch_malloc(1 << 20, 0, nullptr);
    sp_torch_free(a, 1 << 20, 0, nullptr);
    void *b = sp_torch_malloc(1 << 20, 0, nullptr);
    EXPECT_EQ(b, a);
    sp_torch_free(b, 1 << 20, 0, nullptr);
    ASSERT_SP_OK(sp_stream_destroy(side));
}

TEST_F(Torch, RecordStreamOfAForeignPointerIsLoggedAndIgnored) {
    expect_warnings();
    int not_ours = 0;
    sp_torch_record_stream(&not_ours, nullptr);
    sp_torch_record_stream(nullptr, nullptr); // a no-op
    EXPECT_GE(warnings("sp_record_stream"), 1u);
}

TEST_F(Torch, SignaturesMatchCudaPluggableAllocator) {
    torch_alloc_fn a = &sp_torch_malloc;
    torch_free_fn f = &sp_torch_free;
    void *p = a(256, 0, nullptr);
    ASSERT_NE(p, nullptr) << sp_last_error();
    f(p, 256, 0, nullptr);
    EXPECT_EQ(stat("allocation.all.current"), 0);
}

TEST_F(Torch, RoundTripGoesThroughTheCachingAllocator) {
    void *p = sp_torch_malloc(1000, 0, nullptr);
    ASSERT_NE(p, nullptr) << sp_last_error();
    sp_block_info_t info = info_of(p);
    EXPECT_EQ(info.requested_size, 1000u);
    EXPECT_EQ(info.block_size, 1024u);
    EXPECT_EQ(info.pool, sp_default_mempool(0));
    EXPECT_EQ(stat("allocated_bytes.all.current"), 1024);
    EXPECT_EQ(stat("requested_bytes.all.current"), 1000);
    touch(p, 1000);
    sp_torch_free(p, 1000, 0, nullptr);
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
    // Cached, as PyTorch's own allocator would: the next request reuses the block.
    EXPECT_EQ(sp_memory_reserved(0), 2 * MiB);
    void *q = sp_torch_malloc(1000, 0, nullptr);
    EXPECT_EQ(q, p);
    sp_torch_free(q, 1000, 0, nullptr);
}

TEST_F(Torch, TheStreamIsTheBlocksAllocationStream) {
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *p = sp_torch_malloc(4096, 0, s);
    ASSERT_NE(p, nullptr) << sp_last_error();
    EXPECT_EQ(info_of(p).stream, s);
    sp_torch_free(p, 4096, 0, s);
    // A block cached on s is not reused on the default stream.
    void *q = sp_torch_malloc(4096, 0, nullptr);
    ASSERT_NE(q, nullptr);
    EXPECT_NE(q, p);
    sp_torch_free(q, 4096, 0, nullptr);
    ASSERT_SP_OK(sp_stream_destroy(s));
}

TEST_F(Torch, RoutingThroughBeginApplies) {
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.name = "torch-pool";
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &pool));
    ASSERT_SP_OK(sp_mempool_begin(pool));
    void *in = sp_torch_malloc(1000, 0, nullptr);
    ASSERT_SP_OK(sp_mempool_end(pool));
    void *out = sp_torch_malloc(1000, 0, nullptr);
    ASSERT_NE(in, nullptr);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(info_of(in).pool, pool);
    EXPECT_EQ(info_of(out).pool, sp_default_mempool(0));
    EXPECT_EQ(sp_mempool_used_bytes(pool), 1024u);
    sp_torch_free(in, 1000, 0, nullptr);
    EXPECT_EQ(sp_mempool_used_bytes(pool), 0u);
    EXPECT_EQ(sp_mempool_n_free_blocks(pool), 1u) << "the block went back to its pool";
    sp_torch_free(out, 1000, 0, nullptr);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

TEST_F(Torch, ZeroSizeIsNullWithoutAnError) {
    sp__error_clear();
    EXPECT_EQ(sp_torch_malloc(0, 0, nullptr), nullptr);
    EXPECT_STREQ(sp_last_error(), "");
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("num_ooms"), 0);
    sp_torch_free(nullptr, 0, 0, nullptr); // PyTorch may free a NULL: a no-op
    EXPECT_EQ(warnings(), 0u);
}

TEST_F(Torch, OutOfMemoryIsNullWithAMessage) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *live = sp_torch_malloc(40 * MiB, 0, nullptr);
    ASSERT_NE(live, nullptr) << sp_last_error();
    sp__error_clear();
    EXPECT_EQ(sp_torch_malloc(30 * MiB, 0, nullptr), nullptr);
    EXPECT_STRNE(sp_last_error(), "");
    EXPECT_GE(warnings(), 1u);
    EXPECT_EQ(stat("num_ooms"), 1);
    sp_torch_free(live, 40 * MiB, 0, nullptr);
    EXPECT_EQ(stat("allocation.all.current"), 0);
}

// The shim behind sympool.torch.enable() raises torch.OutOfMemoryError only for an OOM: the
// status must tell it apart from other failures (a NULL alone cannot).
TEST_F(Torch, MallocStatusTellsAnOutOfMemoryFromOtherFailures) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *live = nullptr;
    ASSERT_EQ(sp_torch_malloc_status(40 * MiB, 0, nullptr, &live), SP_SUCCESS) << sp_last_error();
    void *p = &live;
    EXPECT_EQ(sp_torch_malloc_status(30 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(sp_torch_malloc_status(4096, sp_device_count() + 3, nullptr, &p),
              SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp_torch_malloc_status(0, 0, nullptr, &p), SP_SUCCESS);
    EXPECT_EQ(p, nullptr);
    // No place for the pointer is a bad argument (it was a store through NULL), for size 0 too.
    EXPECT_EQ(sp_torch_malloc_status(4096, 0, nullptr, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("ptr_p is NULL"), std::string::npos);
    EXPECT_EQ(sp_torch_malloc_status(0, 0, nullptr, nullptr), SP_ERR_INVALID_ARGUMENT);
    sp_torch_free(live, 40 * MiB, 0, nullptr);
}

// torch.cuda.set_per_process_memory_fraction reaches sympool's cap through set_memory_fraction_fn.
TEST_F(Torch, MemoryFractionEntryPointCapsTheDevice) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_torch_set_memory_fraction(0.25, 0);
    EXPECT_EQ(sp_torch_malloc(30 * MiB, 0, nullptr), nullptr) << "16 MiB cap";
    sp_torch_set_memory_fraction(1.0, 0);
    void *p = sp_torch_malloc(30 * MiB, 0, nullptr);
    EXPECT_NE(p, nullptr) << sp_last_error();
    sp_torch_free(p, 30 * MiB, 0, nullptr);
}

// Behind torch.cuda.MemPool, PyTorch caches: each segment call is one device allocation of exactly
// the size asked for, and its free gives the memory back at once (nothing stays reserved).
TEST_F(Torch, SegmentEntryPointsDoNotCache) {
    SP_SKIP_UNLESS_HOST();
    ASSERT_EQ(sp_init(), SP_SUCCESS);
    size_t live0 = sp__host_live_bytes(0);
    void *a = sp_torch_segment_malloc(2 * MiB, 0, nullptr);
    ASSERT_NE(a, nullptr) << sp_last_error();
    touch(a, 2 * MiB);
    EXPECT_EQ(sp__host_live_bytes(0) - live0, 2 * MiB) << "not rounded up to a 20 MiB segment";
    EXPECT_EQ(sp__torch_live_segments(), 1);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0) << "not in sympool's cache";
    sp_torch_segment_free(a, 2 * MiB, 0, nullptr);
    EXPECT_EQ(sp__host_live_bytes(0), live0) << "given back to the device at once";
    EXPECT_EQ(sp__torch_live_segments(), 0);
}

TEST_F(Torch, SegmentOutOfMemoryIsNull) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *a = sp_torch_segment_malloc(40 * MiB, 0, nullptr);
    ASSERT_NE(a, nullptr) << sp_last_error();
    EXPECT_EQ(sp_torch_segment_malloc(40 * MiB, 0, nullptr), nullptr);
    EXPECT_EQ(sp_torch_segment_malloc(4096, sp_device_count() + 3, nullptr), nullptr);
    sp_torch_segment_free(a, 40 * MiB, 0, nullptr);
}

TEST_F(TorchBackend, SegmentEntryPointsRefuseTheHostBackend) {
    if (sp::on_gpu())
        GTEST_SKIP() << "checks the refusal on the host backend";
    expect_warnings();
    EXPECT_EQ(sp_torch_segment_malloc(2 * MiB, 0, nullptr), nullptr);
    EXPECT_STRNE(sp_last_error(), "");
}

TEST_F(Torch, UnknownDeviceIsNullWithAMessage) {
    expect_warnings();
    sp__error_clear();
    EXPECT_EQ(sp_torch_malloc(4096, sp_device_count() + 3, nullptr), nullptr);
    EXPECT_STRNE(sp_last_error(), "");
    EXPECT_GE(warnings(), 1u);
}

TEST_F(Torch, BadFreesAreLoggedAndIgnored) {
    expect_warnings();
    int not_ours = 0;
    sp__error_clear();
    sp_torch_free(&not_ours, sizeof not_ours, 0, nullptr);
    EXPECT_STRNE(sp_last_error(), "");
    size_t w = warnings();
    EXPECT_GE(w, 1u);
    void *p = sp_torch_malloc(1000, 0, nullptr);
    ASSERT_NE(p, nullptr);
    sp_torch_free(p, 1000, 0, nullptr);
    EXPECT_EQ(warnings(), w) << "a good free does not warn";
    sp__error_clear();
    sp_torch_free(p, 1000, 0, nullptr); // double free
    EXPECT_STRNE(sp_last_error(), "");
    EXPECT_GT(warnings(), w);
    EXPECT_EQ(stat("allocation.all.current"), 0);
}

TEST_F(Torch, SizeMismatchWarnsButFrees) {
    expect_warnings();
    void *p = sp_torch_malloc(1000, 0, nullptr);
    ASSERT_NE(p, nullptr);
    sp_torch_free(p, 2000, 0, nullptr);
    EXPECT_GE(warnings("2000"), 1u) << "the WARN names the size PyTorch passed";
    EXPECT_EQ(stat("allocation.all.current"), 0) << "the block is freed anyway";
}

TEST_F(ThreadsTorch, ConcurrentCallersOnTheirOwnStreams) {
    // PyTorch calls the entry points from any thread (autograd's worker threads included), each
    // with its current stream.
    constexpr int kThreads = 4, kIters = 200;
    sp_stream_t streams[kThreads];
    for (auto &st : streams)
        ASSERT_SP_OK(sp_stream_create(0, &st));
    int bad[kThreads] = {};
    std::vector<std::thread> ts;
    for (int i = 0; i < kThreads; i++)
        ts.emplace_back([&, i] {
            std::vector<std::pair<void *, size_t>> live;
            for (int k = 0; k < kIters; k++) {
                size_t size = size_t(1 + (k * 13 + i * 7) % 97) * 1000;
                void *p = sp_torch_malloc(size, 0, streams[i]);
                if (!p) {
                    bad[i]++;
                    continue;
                }
                live.emplace_back(p, size);
                if (k % 3 == 2) { // free two of every three, out of order
                    sp_torch_free(live.front().first, live.front().second, 0, streams[i]);
                    live.erase(live.begin());
                    sp_torch_free(live.back().first, live.back().second, 0, streams[i]);
                    live.pop_back();
                }
            }
            for (auto &b : live)
                sp_torch_free(b.first, b.second, 0, streams[i]);
        });
    for (auto &t : ts)
        t.join();
    for (int i = 0; i < kThreads; i++)
        EXPECT_EQ(bad[i], 0) << "thread " << i;
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
    EXPECT_EQ(warnings(), 0u);
    for (auto &st : streams)
        ASSERT_SP_OK(sp_stream_destroy(st));
}

} // namespace

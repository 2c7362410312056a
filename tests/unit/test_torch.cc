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
#include "pool/pool.h"
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

class Torch : public sp::Test {};
class ThreadsTorch : public sp::Test {};

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
